{{/* Resource name prefix: release name + chart name, or the release name if it contains the chart name. */}}
{{- define "gpu-steward.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-steward.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; pass (dict "root" $ "component" "webhook"). */}}
{{- define "gpu-steward.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "gpu-steward.selectorLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpu-steward.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-steward.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* The image; global.imageRegistry (a mirror) replaces the registry of image.repository: its first path
component when that names a host (has a "." or ":", or is localhost), else it is put in front. */}}
{{- define "gpu-steward.image" -}}
{{- $image := .Values.image -}}
{{- $repository := $image.repository -}}
{{- with (.Values.global | default dict).imageRegistry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets: global.imagePullSecrets then imagePullSecrets, each a name or {name: ...}, once each. */}}
{{- define "gpu-steward.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- if kindIs "map" . }}{{ $names = append $names .name }}{{ else }}{{ $names = append $names . }}{{ end -}}
{{- end -}}
{{- with ($names | uniq) }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Names shared between templates. */}}
{{- define "gpu-steward.configName" -}}{{ include "gpu-steward.fullname" . }}-config{{- end -}}
{{- define "gpu-steward.webhookName" -}}{{ include "gpu-steward.fullname" . }}-webhook{{- end -}}
{{- define "gpu-steward.tlsSecretName" -}}{{ include "gpu-steward.fullname" . }}-webhook-tls{{- end -}}
{{- define "gpu-steward.deschedulerName" -}}{{ include "gpu-steward.fullname" . }}-descheduler{{- end -}}
{{- define "gpu-steward.labelerName" -}}{{ include "gpu-steward.fullname" . }}-labeler{{- end -}}
{{- define "gpu-steward.releaseGatesName" -}}{{ include "gpu-steward.fullname" . }}-release-gates{{- end -}}

{{/* Namespaces never sent to the webhook: kube-system, the release namespace, settings' list. */}}
{{- define "gpu-steward.excludedNamespaces" -}}
{{- $list := concat (list "kube-system" .Release.Namespace) .Values.settings.admission.excluded_namespaces -}}
{{- toJson ($list | uniq) -}}
{{- end -}}

{{/* The settings file every component reads; changes roll the pods through this checksum. */}}
{{- define "gpu-steward.configEnv" -}}
- name: GPU_STEWARD_CONFIG
  value: /etc/gpu-steward/config/config.yaml
{{ include "gpu-steward.logFormatEnv" . }}
{{- end -}}

{{- define "gpu-steward.logFormatEnv" -}}
- name: GPU_STEWARD_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- end -}}

{{- define "gpu-steward.configVolumeMount" -}}
- name: config
  mountPath: /etc/gpu-steward/config
  readOnly: true
{{- end -}}

{{- define "gpu-steward.configVolume" -}}
- name: config
  configMap:
    name: {{ include "gpu-steward.configName" . }}
{{- end -}}

{{- define "gpu-steward.configChecksum" -}}
checksum/config: {{ toYaml .Values.settings | sha256sum }}
{{- end -}}

{{/* A component's ServiceAccount; pass (dict "root" $ "component" "webhook" "name" $name "values" .Values.webhook),
plus "annotations" for the chart's own (hooks). */}}
{{- define "gpu-steward.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "gpu-steward.labels" (dict "root" .root "component" .component) | nindent 4 }}
  {{- with merge (dict) (.annotations | default dict) .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: true
{{- end -}}

{{/* A component's extraEnv / extraVolumeMounts / extraVolumes, appended to the chart's own lists. */}}
{{- define "gpu-steward.extraEnv" -}}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpu-steward.extraVolumeMounts" -}}
{{- with .extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpu-steward.extraVolumes" -}}
{{- with .extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Only pods that request GPUs, ask devices through resource claims (DRA: whether they are GPUs is the webhook's
to say, snapshot.gpu_requests), or declare a gang reach the webhook (gpu.pod_request and gangs.identify read
the same fields); everything else is admitted without a call. */}}
{{- define "gpu-steward.matchConditions" -}}
{{- $names := .Values.settings.names.prefix -}}
- name: gpu-or-gang
  expression: >-
    object.spec.containers.exists(c, has(c.resources) &&
    ((has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/'))) ||
    (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/'))))) ||
    (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) &&
    ((has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/'))) ||
    (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/')))))) ||
    (has(object.metadata.labels) && ['{{ $names }}gang-name', 'kueue.x-k8s.io/pod-group-name', 'scheduling.x-k8s.io/pod-group'].exists(k, k in object.metadata.labels)) ||
    (has(object.metadata.annotations) && ['{{ $names }}gang-name', 'scheduling.k8s.io/group-name'].exists(k, k in object.metadata.annotations)) ||
    has(object.spec.schedulingGroup) ||
    (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)
{{- end -}}

{{/* Pods the webhook would gate for their gang, and only those (admission/gating.py): a gang named by our
label/annotation or by Kueue's pod group with its total count (the conventions whose size admission knows),
scheduled by the default scheduler (another scheduler holds its own gangs), not bound at creation (gates are
refused there), in no native PodGroup (kube-scheduler's own gang), not opted out by annotation. The second
webhook entry fails closed for these; the first never sees them, so no pod is mutated by both. */}}
{{- define "gpu-steward.gangGatedExpression" -}}
{{- $p := .Values.settings.names.prefix -}}
(!has(object.spec.nodeName) || object.spec.nodeName == '') &&
(!has(object.spec.schedulerName) || object.spec.schedulerName == '' || object.spec.schedulerName == 'default-scheduler') &&
!has(object.spec.schedulingGroup) &&
!(has(object.metadata.annotations) && '{{ $p }}skip' in object.metadata.annotations &&
object.metadata.annotations['{{ $p }}skip'] in {{ toJson .Values.webhook.skipLabelValues | replace "\"" "'" }}) &&
((has(object.metadata.labels) && '{{ $p }}gang-name' in object.metadata.labels) ||
(has(object.metadata.annotations) && '{{ $p }}gang-name' in object.metadata.annotations) ||
(has(object.metadata.labels) && 'kueue.x-k8s.io/pod-group-name' in object.metadata.labels &&
has(object.metadata.annotations) && 'kueue.x-k8s.io/pod-group-total-count' in object.metadata.annotations))
{{- end -}}

{{/* What both webhook entries share; pass (dict "root" $ "service" $webhookServiceName). */}}
{{- define "gpu-steward.webhookEntry" -}}
{{- $v := .root.Values.webhook -}}
admissionReviewVersions: [v1]
sideEffects: None
timeoutSeconds: {{ $v.timeoutSeconds }}
reinvocationPolicy: {{ $v.reinvocationPolicy }}
matchPolicy: Equivalent
clientConfig:
  {{- if $v.url }}
  url: {{ $v.url }}
  {{- else }}
  service:
    name: {{ .service }}
    namespace: {{ .root.Release.Namespace }}
    path: /mutate
    port: {{ $v.service.port }}
  {{- end }}
rules:
  - operations: [CREATE]
    apiGroups: [""]
    apiVersions: [v1]
    resources: [pods]
    scope: Namespaced
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "gpu-steward.excludedNamespaces" .root }}
    {{- with $v.namespaceSelectorExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
objectSelector:
  matchExpressions:
    - key: {{ printf "%sskip" .root.Values.settings.names.prefix }}
      operator: NotIn
      values: {{ toJson $v.skipLabelValues }}
    {{- with $v.objectSelectorExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
