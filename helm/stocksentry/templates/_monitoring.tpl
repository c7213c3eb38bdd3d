{{/*
What a ServiceMonitor endpoint and a PodMonitor podMetricsEndpoint share. Call with
(dict "context" $ "monitor" .Values.serviceMonitor); the port line is the caller's.
*/}}
{{- define "stocksentry.monitor.endpoint" -}}
{{- $m := .monitor -}}
path: /metrics
scheme: {{ default (include "stocksentry.scheme" .context) $m.scheme }}
{{- with $m.interval }}
interval: {{ . }}
{{- end }}
{{- with $m.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
honorLabels: {{ $m.honorLabels }}
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  {{- with $m.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- /* Last, after the operator's own relabelings and the user's: every target's job is
  scrapeJob, the job the health alerts select (docs/helm.md, "Job and labels"). */}}
  - action: replace
    targetLabel: job
    replacement: {{ .context.Values.scrapeJob | quote }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* metadata shared by the prometheus-operator objects; call with (dict "context" $ "spec" .Values.x "suffix" ""). */}}
{{- define "stocksentry.monitoring.metadata" -}}
name: {{ include "stocksentry.fullname" .context }}
namespace: {{ default (include "stocksentry.namespace" .context) .spec.namespace }}
labels:
  {{- include "stocksentry.labels" .context | nindent 2 }}
  {{- with .spec.additionalLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .spec.annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
