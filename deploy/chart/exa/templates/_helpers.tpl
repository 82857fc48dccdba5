{{- define "exa.name" -}}
{{- printf "%s-%s" .Release.Name .Values.mode | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "exa.poolName" -}}
{{- default .Release.Name .Values.pool.name -}}
{{- end -}}
{{- define "exa.labels" -}}
app.kubernetes.io/name: exa
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "exa.selectorLabels" -}}
app.kubernetes.io/name: exa
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}
