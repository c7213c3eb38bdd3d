{{/*
The sidecar: named templates an application chart includes to run the exporter beside
its checkout app, in the same pod (docs/helm.md, helm/stocksentry/examples/app-with-sidecar).

The application chart depends on this chart with `stocksentry.mode: sidecar` and calls
each template with this chart's scope, `.Subcharts.stocksentry` (Helm 3.7 or later; use
the alias as the key if the dependency has one):

  spec:
    template:
      metadata:
        annotations:
          {{- include "stocksentry.sidecar.podAnnotations" .Subcharts.stocksentry | nindent 8 }}
      spec:
        containers:
          - name: app
            env:
              {{- include "stocksentry.sidecar.appEnv" .Subcharts.stocksentry | nindent 14 }}
            volumeMounts:
              {{- include "stocksentry.sidecar.appVolumeMounts" .Subcharts.stocksentry | nindent 14 }}
          {{- include "stocksentry.sidecar.container" .Subcharts.stocksentry | nindent 10 }}
        volumes:
          {{- include "stocksentry.sidecar.volumes" .Subcharts.stocksentry | nindent 10 }}

This chart, in mode: sidecar, renders the exporter's ConfigMap the sidecar mounts (and,
when enabled, the PodMonitor, PrometheusRule and dashboards); the application's chart
keeps its pods, Service, PodDisruptionBudget and NetworkPolicy.
*/}}

{{- define "stocksentry.sidecar.requireMode" -}}
{{- if ne .Values.mode "sidecar" -}}
{{- fail "the stocksentry.sidecar.* templates need the stocksentry chart in mode: sidecar (set stocksentry.mode: sidecar in the application's values)" -}}
{{- end -}}
{{- end -}}

{{/* The exporter container, a list item for the pod's `containers:`. */}}
{{- define "stocksentry.sidecar.container" -}}
{{- include "stocksentry.sidecar.requireMode" . -}}
{{- include "stocksentry.exporter.container" . -}}
{{- end -}}

{{/* The pod's volumes for the sidecar (list items for `volumes:`), including the shared
multiprocess emptyDir. */}}
{{- define "stocksentry.sidecar.volumes" -}}
{{- include "stocksentry.sidecar.requireMode" . -}}
{{- include "stocksentry.exporter.volumes" . -}}
{{- end -}}

{{/* For the application container's `env:`: where prometheus_client writes its
multiprocess files. */}}
{{- define "stocksentry.sidecar.appEnv" -}}
{{- include "stocksentry.sidecar.requireMode" . -}}
- name: PROMETHEUS_MULTIPROC_DIR
  value: {{ .Values.sidecar.multiprocessDir | quote }}
{{- end -}}

{{/* For the application container's `volumeMounts:`: the multiprocess directory,
writable. */}}
{{- define "stocksentry.sidecar.appVolumeMounts" -}}
{{- include "stocksentry.sidecar.requireMode" . -}}
- name: stocksentry-multiproc
  mountPath: {{ .Values.sidecar.multiprocessDir }}
{{- end -}}

{{/* For the pod template's `annotations:`: restarts the pods when the exporter config
changes. */}}
{{- define "stocksentry.sidecar.podAnnotations" -}}
{{- include "stocksentry.sidecar.requireMode" . -}}
checksum/stocksentry-config: {{ include "stocksentry.exporter.configChecksum" . }}
{{- end -}}
