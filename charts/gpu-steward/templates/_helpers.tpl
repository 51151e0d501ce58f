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

{{- define "gpu-steward.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
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

{{/* Only pods that request GPUs or declare a gang reach the webhook (gpu.pod_request and gangs.identify read
the same fields); everything else is admitted without a call. */}}
{{- define "gpu-steward.matchConditions" -}}
{{- $names := .Values.settings.names.prefix -}}
- name: gpu-or-gang
  expression: >-
    object.spec.containers.exists(c, has(c.resources) &&
    ((has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-'))) ||
    (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-'))))) ||
    (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) &&
    ((has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-'))) ||
    (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r.startsWith('nvidia.com/mig-')))))) ||
    (has(object.metadata.labels) && ['{{ $names }}gang-name', 'kueue.x-k8s.io/pod-group-name', 'scheduling.x-k8s.io/pod-group'].exists(k, k in object.metadata.labels)) ||
    (has(object.metadata.annotations) && ['{{ $names }}gang-name', 'scheduling.k8s.io/group-name'].exists(k, k in object.metadata.annotations)) ||
    has(object.spec.schedulingGroup)
{{- end -}}
