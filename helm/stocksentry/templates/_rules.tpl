{{/*
The rule groups of the PrometheusRule, as YAML. files/stocksentry.rules.yml is a copy of
alert_rules/source/stocksentry.rules.yml (helm/sync.py), read as a file, never as a
template, so the rules' own {{ $labels }} stay as they are. Its placeholders are replaced
as plain text, exactly as alert_rules/render.py does (tests/integration/test_helm.py
checks both agree):
  $location       locationLabels joined by ", " (every aggregation and join keeps them)
  $where          the summaries' " in cluster a, namespace shop", a template of the
                  alert's labels or else Prometheus's external labels
  $job            scrapeJob, the job label the ServiceMonitor/PodMonitor set
  $runbook_base   links.runbookBaseUrl
  $dashboard_base links.dashboardBaseUrl (empty: dashboard_url annotations are left out)
Then, per rule, kube-prometheus-stack style: prometheusRule.disabled drops an alert,
additionalRuleLabels/Annotations go on every alert, customRules.<Alert> sets labels,
annotations, severity or `for` of one, and prometheusRule.settings.<name> replaces the
expression of the stocksentry-settings record whose name ends in ":<name>" (a number
becomes vector(<number>), a string is taken as PromQL).
*/}}
{{- define "stocksentry.rules.groups" -}}
{{- $p := .Values.prometheusRule -}}
{{- $location := .Values.locationLabels -}}
{{- $where := `{{ $locsep := " in " }}` -}}
{{- range $label := $location -}}
{{- $where = printf `%s{{ with or $labels.%s $externalLabels.%s }}{{ $locsep }}%s {{ . }}{{ $locsep = ", " }}{{ end }}` $where $label $label $label -}}
{{- end -}}
{{- $text := .Files.Get "files/stocksentry.rules.yml" -}}
{{- $text = $text | replace "$location" (join ", " $location) | replace "$where" $where -}}
{{- $text = $text | replace "$job" .Values.scrapeJob -}}
{{- $text = $text | replace "$runbook_base" (trimSuffix "/" .Values.links.runbookBaseUrl) -}}
{{- $text = $text | replace "$dashboard_base" (trimSuffix "/" .Values.links.dashboardBaseUrl) -}}
{{- $source := fromYaml $text -}}
{{- $alerts := dict -}}
{{- $settings := dict -}}
{{- $groups := list -}}
{{- range $group := $source.groups -}}
{{- $rules := list -}}
{{- range $rule := $group.rules -}}
{{- if hasKey $rule "alert" -}}
{{- $_ := set $alerts $rule.alert true -}}
{{- if not (index $p.disabled $rule.alert) -}}
{{- $custom := index $p.customRules $rule.alert | default dict -}}
{{- /* merge: the first map's keys win. customRules, then the alert's own, then additional. */ -}}
{{- $labels := merge (dict) (deepCopy ($custom.labels | default dict)) (deepCopy $rule.labels) (deepCopy $p.additionalRuleLabels) -}}
{{- with $custom.severity -}}{{- $_ := set $labels "severity" . -}}{{- end -}}
{{- $annotations := merge (dict) (deepCopy ($custom.annotations | default dict)) (deepCopy $rule.annotations) (deepCopy $p.additionalRuleAnnotations) -}}
{{- if not $.Values.links.dashboardBaseUrl -}}{{- $annotations = omit $annotations "dashboard_url" -}}{{- end -}}
{{- $out := dict "alert" $rule.alert "expr" $rule.expr "labels" $labels "annotations" $annotations -}}
{{- with ($custom.for | default $rule.for) -}}{{- $_ := set $out "for" . -}}{{- end -}}
{{- $rules = append $rules $out -}}
{{- end -}}
{{- else -}}
{{- $out := deepCopy $rule -}}
{{- if eq $group.name "stocksentry-settings" -}}
{{- $key := last (splitList ":" $rule.record) -}}
{{- $_ := set $settings $key true -}}
{{- if hasKey $p.settings $key -}}
{{- $value := index $p.settings $key -}}
{{- $_ := set $out "expr" (ternary $value (printf "vector(%v)" $value) (kindIs "string" $value)) -}}
{{- end -}}
{{- end -}}
{{- $rules = append $rules $out -}}
{{- end -}}
{{- end -}}
{{- if $rules -}}
{{- $groups = append $groups (dict "name" $group.name "rules" $rules) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := $p.disabled -}}
{{- if not (hasKey $alerts $name) -}}
{{- fail (printf "prometheusRule.disabled.%s: the rules have no such alert" $name) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := $p.customRules -}}
{{- if not (hasKey $alerts $name) -}}
{{- fail (printf "prometheusRule.customRules.%s: the rules have no such alert" $name) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := $p.settings -}}
{{- if not (hasKey $settings $name) -}}
{{- fail (printf "prometheusRule.settings.%s: the stocksentry-settings group has no record ending in :%s" $name $name) -}}
{{- end -}}
{{- end -}}
{{- toYaml $groups -}}
{{- end -}}
