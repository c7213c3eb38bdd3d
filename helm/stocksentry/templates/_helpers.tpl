{{/*
Names.

Kubernetes object names that end up in DNS (Services, and by convention everything else
here) and every label value are limited to 63 characters (RFC 1123 labels), so each
name below is cut at 63 with `trunc 63`, then `trimSuffix "-"` drops a dash the cut may
leave at the end (a name may not end with one). Names with a suffix (e.g. the dashboard
ConfigMaps, "<fullname>-dashboard-overview") cut the prefix instead, to 63 minus the
suffix and its dash, so the suffix that tells the objects apart always survives.
*/}}

{{/* The chart's name: "stocksentry", or nameOverride. */}}
{{- define "stocksentry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The fully qualified name: "<release>-<chart name>", or only the release name when it
already contains the chart name (release "stocksentry" gives "stocksentry", not
"stocksentry-stocksentry"), or fullnameOverride.
*/}}
{{- define "stocksentry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"<fullname>-<suffix>" within 63 characters: the fullname is shortened, never the suffix.
Call with (dict "context" $ "suffix" "dashboard-overview").
*/}}
{{- define "stocksentry.suffixedName" -}}
{{- $room := sub 62 (len .suffix) | int -}}
{{- printf "%s-%s" (include "stocksentry.fullname" .context | trunc $room | trimSuffix "-") .suffix -}}
{{- end -}}

{{/* "<chart>-<version>" for the helm.sh/chart label; "+" is not allowed in label values. */}}
{{- define "stocksentry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespace of every object: the release's, or namespaceOverride. */}}
{{- define "stocksentry.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels.

The selector labels never change over a release's life (a Deployment's selector is
immutable), so they hold only name, instance and component. Every object gets the full
set; version and chart go into label values, hence the 63-character cut.
*/}}
{{- define "stocksentry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stocksentry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}

{{- define "stocksentry.labels" -}}
helm.sh/chart: {{ include "stocksentry.chart" . }}
{{ include "stocksentry.selectorLabels" . }}
app.kubernetes.io/version: {{ include "stocksentry.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/part-of: stocksentry
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount the prober runs as. */}}
{{- define "stocksentry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stocksentry.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image tag: image.tag, or the chart's appVersion. */}}
{{- define "stocksentry.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given (it wins over the tag). */}}
{{- define "stocksentry.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "stocksentry.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the PostgreSQL URL: database.existingSecret or "<fullname>-database". */}}
{{- define "stocksentry.databaseSecret" -}}
{{- default (include "stocksentry.suffixedName" (dict "context" . "suffix" "database")) .Values.database.existingSecret -}}
{{- end -}}

{{/* The Secret holding the Redis URL: redis.existingSecret or "<fullname>-redis". */}}
{{- define "stocksentry.redisSecret" -}}
{{- default (include "stocksentry.suffixedName" (dict "context" . "suffix" "redis")) .Values.redis.existingSecret -}}
{{- end -}}

{{/* The scheme the exporter serves: https with a TLS web config. */}}
{{- define "stocksentry.scheme" -}}
{{- if .Values.webConfig.tls -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/*
The exporter's config file (exporter/config.example.yaml, docs/exporter-config.md),
built from .Values.config plus what the chart owns: the server section, and where the
database and Redis URLs come from (url_env naming the variables the container fills
from the Secrets). Sections whose feature is off are dropped.
*/}}
{{- define "stocksentry.exporterConfig" -}}
{{- $config := deepCopy (default dict .Values.config) -}}
{{- $server := dict "listen_address" "0.0.0.0" "port" (int .Values.port) -}}
{{- if eq .Values.mode "sidecar" -}}
{{- $_ := set $server "multiprocess_dir" .Values.sidecar.multiprocessDir -}}
{{- $_ := set $server "check_worker_pids" .Values.sidecar.checkWorkerPids -}}
{{- $_ := set $server "compact_dead_workers" .Values.sidecar.compactDeadWorkers -}}
{{- if and .Values.sidecar.compactDeadWorkers (not .Values.sidecar.checkWorkerPids) -}}
{{- fail "sidecar.compactDeadWorkers needs sidecar.checkWorkerPids: true (and shareProcessNamespace: true in the application's pod): without the application's PID namespace every worker looks dead" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $config "server" $server -}}
{{- if .Values.database.enabled -}}
{{- $database := default dict (get $config "database") -}}
{{- $_ := set $database "url_env" .Values.database.envName -}}
{{- $_ := set $config "database" $database -}}
{{- else -}}
{{- $_ := unset $config "database" -}}
{{- end -}}
{{- if .Values.redis.enabled -}}
{{- $redis := default dict (get $config "redis") -}}
{{- $_ := set $redis "url_env" .Values.redis.envName -}}
{{- $_ := set $config "redis" $redis -}}
{{- else -}}
{{- $_ := unset $config "redis" -}}
{{- end -}}
{{- /* Helm drops null values, so "" stands for "not mapped" on the optional columns. */ -}}
{{- $schema := default dict (get $config "schema") -}}
{{- range $table, $columns := dict "products" (list "allocation") "orders" (list "external_ref" "idempotency_key") -}}
{{- $section := get $schema $table -}}
{{- if kindIs "map" $section -}}
{{- range $columns -}}
{{- if and (hasKey $section .) (eq (toString (get $section .)) "") -}}
{{- $_ := set $section . nil -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
Checks of values that the schema cannot express: contradictions between options.
Rendered by templates/validate.yaml; each failure is one sentence naming the keys.
*/}}
{{- define "stocksentry.validate" -}}
{{- $mode := .Values.mode -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: Prometheus would scrape every exporter twice and double every counter; enable one of them" -}}
{{- end -}}
{{- if eq $mode "prober" -}}
{{- if not .Values.database.enabled -}}
{{- fail "mode: prober needs database.enabled: true: the prober exists to run the database probes (for a sidecar that only serves app metrics, use mode: sidecar)" -}}
{{- end -}}
{{- if .Values.sidecar.checkWorkerPids -}}
{{- fail "sidecar.checkWorkerPids applies to mode: sidecar only: the prober has no application workers" -}}
{{- end -}}
{{- if .Values.sidecar.compactDeadWorkers -}}
{{- fail "sidecar.compactDeadWorkers applies to mode: sidecar only: the prober has no application workers" -}}
{{- end -}}
{{- if .Values.podMonitor.selector -}}
{{- fail "podMonitor.selector is for mode: sidecar (it selects the application's pods); in mode: prober the PodMonitor selects the prober's own pods, leave it empty" -}}
{{- end -}}
{{- $election := true -}}
{{- if and .Values.config .Values.config.database (hasKey .Values.config.database "leader_election") -}}
{{- $election = .Values.config.database.leader_election -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $election) -}}
{{- fail (printf "replicaCount: %d with config.database.leader_election: false: every replica would run the database probes; keep leader_election true or use one replica" (int .Values.replicaCount)) -}}
{{- end -}}
{{- with .Values.podDisruptionBudget -}}
{{- if .enabled -}}
{{- if and (not (kindIs "invalid" .minAvailable)) (not (kindIs "invalid" .maxUnavailable)) -}}
{{- fail "podDisruptionBudget: give minAvailable or maxUnavailable, not both" -}}
{{- end -}}
{{- if and (not (kindIs "invalid" .minAvailable)) (not (kindIs "string" .minAvailable)) -}}
{{- if ge (int .minAvailable) (int $.Values.replicaCount) -}}
{{- fail (printf "podDisruptionBudget.minAvailable: %d with replicaCount: %d would block every node drain; lower it or raise replicaCount" (int .minAvailable) (int $.Values.replicaCount)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if .Values.serviceMonitor.enabled -}}
{{- fail "serviceMonitor.enabled in mode: sidecar: the application's Service does not expose the sidecar's port; use podMonitor.enabled with podMonitor.selector" -}}
{{- end -}}
{{- if .Values.podDisruptionBudget.enabled -}}
{{- fail "podDisruptionBudget.enabled in mode: sidecar: the pods belong to the application, whose chart owns their PodDisruptionBudget" -}}
{{- end -}}
{{- if .Values.networkPolicy.enabled -}}
{{- fail "networkPolicy.enabled in mode: sidecar: a policy selecting the application's pods would cut their other traffic; allow the sidecar's port in the application's own NetworkPolicy" -}}
{{- end -}}
{{- if and .Values.podMonitor.enabled (not .Values.podMonitor.selector) -}}
{{- fail "podMonitor.enabled in mode: sidecar needs podMonitor.selector: the labels of the application's pods that carry the sidecar" -}}
{{- end -}}
{{- if and .Values.database.enabled .Values.config .Values.config.database (hasKey .Values.config.database "leader_election") (not .Values.config.database.leader_election) -}}
{{- fail "config.database.leader_election: false in mode: sidecar: every application pod would run the database probes against the shop's database; keep it true" -}}
{{- end -}}
{{- end -}}
{{- /* StockOversold, the headline page, needs the allocation column: an install that
     forgot it would watch everything but the oversell. Opting out is explicit. */ -}}
{{- if .Values.database.enabled -}}
{{- $allocation := "" -}}
{{- $oversold := true -}}
{{- with .Values.config -}}
{{- with .schema -}}{{- with .products -}}{{- $allocation = .allocation | default "" -}}{{- end -}}{{- end -}}
{{- with .probes -}}{{- with .oversold -}}{{- if and (hasKey . "enabled") (not .enabled) -}}{{- $oversold = false -}}{{- end -}}{{- end -}}{{- end -}}
{{- end -}}
{{- if and $oversold (not $allocation) -}}
{{- fail "config.schema.products.allocation is empty: the oversold probe would be off and StockOversold could never fire. Map the column holding each SKU's units for the sale (--set config.schema.products.allocation=initial_stock), or opt out explicitly with config.probes.oversold.enabled: false" -}}
{{- end -}}
{{- end -}}
{{- /* A runbook link must lead somewhere: the project's docs live wherever the user
     publishes them, so the rules and the dashboards need that address. */ -}}
{{- range $name := list "prometheusRule" "dashboards" -}}
{{- if and (get $.Values $name).enabled (not $.Values.links.runbookBaseUrl) -}}
{{- fail (printf "links.runbookBaseUrl is required with %s.enabled: the address where your copy of docs/runbooks is published (runbook_url is <base>/<Alert>.md), e.g. --set links.runbookBaseUrl=https://git.shop.example/sre/stocksentry/blob/main/docs/runbooks" $name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.webConfig.tls (not .Values.webConfig.existingSecret) -}}
{{- fail "webConfig.tls: true needs webConfig.existingSecret: the Secret holding the web config and its certificate and key" -}}
{{- end -}}
{{- if .Values.webConfig.tls -}}
{{- range $name := list "serviceMonitor" "podMonitor" -}}
{{- $monitor := get $.Values $name -}}
{{- if and $monitor.enabled (ne (default "https" $monitor.scheme) "https") -}}
{{- fail (printf "%s.scheme: %s with webConfig.tls: true: the exporter serves HTTPS only" $name $monitor.scheme) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- range $name := list "serviceMonitor" "podMonitor" -}}
{{- $monitor := get $.Values $name -}}
{{- if and $monitor.enabled (eq (default "http" $monitor.scheme) "https") -}}
{{- fail (printf "%s.scheme: https without webConfig.tls: true: the exporter serves plain HTTP" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
