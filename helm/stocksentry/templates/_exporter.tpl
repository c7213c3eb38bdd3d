{{/*
The exporter container, shared by the prober's Deployment and the sidecar.

Call with the chart's own scope (the root context in this chart, `.Subcharts.stocksentry`
from an application chart). Everything comes from that scope's values: image, port,
resources, probes, security context, the database and Redis Secrets, the web config.
In mode: sidecar the container also mounts the application's multiprocess directory,
read-only: the exporter only reads the workers' files.
*/}}
{{- define "stocksentry.exporter.container" -}}
{{- $sidecar := eq .Values.mode "sidecar" -}}
{{- $portName := ternary .Values.sidecar.portName "metrics" $sidecar -}}
- name: {{ ternary "stocksentry" "exporter" $sidecar }}
  image: {{ include "stocksentry.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - stocksentry
  args:
    - exporter
    - --config=/etc/stocksentry/config/config.yaml
    {{- if .Values.webConfig.existingSecret }}
    - --web.config.file=/etc/stocksentry/web/{{ .Values.webConfig.fileKey }}
    {{- end }}
  ports:
    - name: {{ $portName }}
      containerPort: {{ .Values.port }}
      protocol: TCP
  {{- if or .Values.database.enabled .Values.redis.enabled }}
  env:
    {{- if .Values.database.enabled }}
    - name: {{ .Values.database.envName }}
      valueFrom:
        secretKeyRef:
          name: {{ include "stocksentry.databaseSecret" . }}
          key: {{ .Values.database.secretKey }}
    {{- end }}
    {{- if .Values.redis.enabled }}
    - name: {{ .Values.redis.envName }}
      valueFrom:
        secretKeyRef:
          name: {{ include "stocksentry.redisSecret" . }}
          key: {{ .Values.redis.secretKey }}
    {{- end }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ $portName }}
      scheme: {{ include "stocksentry.scheme" . | upper }}
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ $portName }}
      scheme: {{ include "stocksentry.scheme" . | upper }}
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: stocksentry-config
      mountPath: /etc/stocksentry/config
      readOnly: true
    {{- if .Values.webConfig.existingSecret }}
    - name: stocksentry-web-config
      mountPath: /etc/stocksentry/web
      readOnly: true
    {{- end }}
    {{- if $sidecar }}
    - name: stocksentry-multiproc
      mountPath: {{ .Values.sidecar.multiprocessDir }}
      {{- /* Compaction renames and writes files in the directory. */}}
      readOnly: {{ not .Values.sidecar.compactDeadWorkers }}
    {{- end }}
    - name: stocksentry-tmp
      mountPath: /tmp
{{- end -}}

{{/*
The volumes of the exporter container: its config, the web config Secret, a small /tmp
(the root filesystem is read-only) and, in mode: sidecar, the multiprocess directory the
application writes and the sidecar reads.
*/}}
{{- define "stocksentry.exporter.volumes" -}}
- name: stocksentry-config
  configMap:
    name: {{ include "stocksentry.fullname" . }}
{{- if .Values.webConfig.existingSecret }}
- name: stocksentry-web-config
  secret:
    secretName: {{ .Values.webConfig.existingSecret }}
{{- end }}
{{- if eq .Values.mode "sidecar" }}
- name: stocksentry-multiproc
  emptyDir:
    {{- with .Values.sidecar.multiprocessSizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- end }}
- name: stocksentry-tmp
  emptyDir:
    sizeLimit: 16Mi
{{- end -}}

{{/* The hash of the exporter's ConfigMap: a pod annotation with it restarts the pods on change. */}}
{{- define "stocksentry.exporter.configChecksum" -}}
{{- include (print .Template.BasePath "/configmap.yaml") . | sha256sum -}}
{{- end -}}
