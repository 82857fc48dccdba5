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
{{- /* The routing configuration mounted as --config, as JSON ("" for
     none): .Values.routing, and with gateway.peers each model of .Values.models
     given the peers Service as its peer list (cache_aware when the model
     is not in .Values.routing, as a discovered model is): dns+http, or
     dns+https with gateway.tlsSecret (the peers then serve HTTPS; each
     address must present a certificate for the Service's name, checked
     against --peer-ca). */ -}}
{{- define "exa.routing" -}}
{{- $r := deepCopy (default (dict) .Values.routing) -}}
{{- if .Values.gateway.peers -}}
{{- $_ := set $r "version" (default 1 (get $r "version")) -}}
{{- $models := default (dict) (get $r "models") -}}
{{- $scheme := ternary "dns+https" "dns+http" (not (empty .Values.gateway.tlsSecret)) -}}
{{- $peer := printf "%s://%s.%s.svc:%v" $scheme (include "exa.peersName" .) .Release.Namespace .Values.gateway.port -}}
{{- range .Values.models -}}
{{- $m := default (dict "mode" "cache_aware") (get $models .) -}}
{{- $_ := set $m "peers" (append (without (default (list) (get $m "peers")) $peer) $peer) -}}
{{- $_ := set $models . $m -}}
{{- end -}}
{{- $_ := set $r "models" $models -}}
{{- end -}}
{{- if $r -}}
{{- toJson $r -}}
{{- end -}}
{{- end -}}
{{- /* The headless Service naming the gateway's pods to each other. */ -}}
{{- define "exa.peersName" -}}
{{- printf "%s-peers" (include "exa.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- /* --rate-limit and its companions from a rateLimit value
     (perSecond, burst, key), nothing when perSecond is 0 or unset. */ -}}
{{- define "exa.rateLimitArgs" -}}
{{- with . }}
{{- if .perSecond }}
            - --rate-limit={{ .perSecond }}
            - --rate-limit-burst={{ .burst | default 0 | int64 }}
            - {{ printf "--rate-limit-key=%s" (.key | default "ip") | quote }}
{{- end }}
{{- end }}
{{- end -}}
