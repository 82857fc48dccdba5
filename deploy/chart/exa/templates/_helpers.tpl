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
{{- /* The Service the InferencePool's endpointPickerRef names: this
     release's picker, or in mode gateway the picker Service a release
     named after the pool creates. */ -}}
{{- define "exa.endpointPicker" -}}
{{- if .Values.pool.endpointPicker -}}
{{- .Values.pool.endpointPicker -}}
{{- else if eq .Values.mode "picker" -}}
{{- include "exa.name" . -}}
{{- else -}}
{{- printf "%s-picker" (include "exa.poolName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
