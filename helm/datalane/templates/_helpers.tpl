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

{{- define "datalane.leaseName" -}}
{{- printf "%s-leader" (include "datalane.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The common part of one webhook: (list $root POLICY SCOPE). POLICY names the entry of
.Values.webhook (pods, datapipelines, pytorchjobs, scale, trainjobs) with its failurePolicy and
timeoutSeconds. SCOPE is "optedIn" (only namespaces labelled datalane.io/inject=enabled),
"notOptedIn" (only namespaces without it) or "all"; each is ANDed with webhook.namespaceSelector
(or, without one, operator.watchNamespaces).
*/}}
{{- define "datalane.webhookCommon" -}}
{{- $root := index . 0 -}}
{{- $policy := index $root.Values.webhook (index . 1) -}}
{{- $scope := index . 2 -}}
{{- $labels := dict -}}
{{- $exprs := list -}}
{{- with $root.Values.webhook.namespaceSelector }}
{{- $labels = merge $labels (deepCopy (.matchLabels | default dict)) -}}
{{- $exprs = concat $exprs (.matchExpressions | default list) -}}
{{- else }}
{{- with $root.Values.operator.watchNamespaces }}
{{- $exprs = append $exprs (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .) -}}
{{- end }}
{{- end }}
{{- if eq $scope "optedIn" }}
{{- $_ := set $labels "datalane.io/inject" "enabled" -}}
{{- else if eq $scope "notOptedIn" }}
{{- $exprs = append $exprs (dict "key" "datalane.io/inject" "operator" "NotIn" "values" (list "enabled")) -}}
{{- end -}}
admissionReviewVersions: ["v1"]
{{- /* the pod webhook creates the ConfigMap of the recipe it injects, except on a dry run */}}
sideEffects: {{ ternary "NoneOnDryRun" "None" (eq (index . 1) "pods") }}
matchPolicy: Equivalent
failurePolicy: {{ $policy.failurePolicy }}
timeoutSeconds: {{ $policy.timeoutSeconds }}
{{- if or $labels $exprs }}
namespaceSelector:
  {{- with $labels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $exprs }}
  matchExpressions:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "datalane.webhookAnnotations" -}}
{{- if eq .Values.tls.mode "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "datalane.fullname" .) }}
{{- end }}
{{- end -}}
