{{/* Names and labels shared by the templates. */}}

{{- define "datalane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "datalane.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "datalane.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "datalane.serviceAccountName" -}}
{{- default (include "datalane.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "datalane.tlsSecret" -}}
{{- default (printf "%s-webhook-tls" (include "datalane.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "datalane.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* clientConfig of one webhook: the Service, or webhook.url, plus the CA bundle if known. */}}
{{- define "datalane.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
clientConfig:
  {{- if $root.Values.webhook.url }}
  url: {{ printf "%s/%s" (trimSuffix "/" $root.Values.webhook.url) $path | quote }}
  {{- else }}
  service:
    name: {{ include "datalane.fullname" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ printf "/%s" $path | quote }}
    port: 443
  {{- end }}
  {{- with $root.Values.webhook.caBundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end -}}

{{- define "datalane.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
matchPolicy: Equivalent
failurePolicy: {{ .Values.webhook.failurePolicy }}
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
{{- if .Values.webhook.namespaceSelector }}
namespaceSelector:
  {{- toYaml .Values.webhook.namespaceSelector | nindent 2 }}
{{- else if .Values.operator.watchNamespaces }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- toYaml .Values.operator.watchNamespaces | nindent 8 }}
{{- end }}
{{- end -}}

{{- define "datalane.webhookAnnotations" -}}
{{- if eq .Values.tls.mode "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "datalane.fullname" .) }}
{{- end }}
{{- end -}}
