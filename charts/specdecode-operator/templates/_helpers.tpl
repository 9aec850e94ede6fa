{{/* The chart's name: app.kubernetes.io/name ("specdecode-operator" unless nameOverride). */}}
{{- define "specdecode.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object: fullnameOverride, else the release name with the chart's name
(the release name alone when it already contains it: release "specdecode-operator" gives the
names of manifests/). At most 55 characters, so that "<fullname>-metrics" fits a DNS label. */}}
{{- define "specdecode.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "specdecode.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "specdecode.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. Never managed-by=specdecode-operator: the operator takes
Deployments with it for its vLLM children (managed-by here is Helm). */}}
{{- define "specdecode.labels" -}}
helm.sh/chart: {{ include "specdecode.chart" . }}
{{ include "specdecode.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specdecode-operator
{{- end -}}

{{/* What selectors match: name and instance only, never the version or the chart, so that a
Deployment's (immutable) selector stays the same across upgrades, and two releases never
select each other's pods or Services. */}}
{{- define "specdecode.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdecode.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ServiceAccount the operator runs as, and the RBAC bindings name. */}}
{{- define "specdecode.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specdecode.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when image.digest is set, else repository:tag (tag: appVersion). */}}
{{- define "specdecode.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The job label of the operator's scrape: its metrics Service's name (the PodMonitor
relabels to the same), which the alerts select. */}}
{{- define "specdecode.metricsJob" -}}
{{- printf "%s-metrics" (include "specdecode.fullname" .) -}}
{{- end -}}

{{/* Namespaces whose Secrets the operator may read for spec.metrics.auth. */}}
{{- define "specdecode.tenantNamespaces" -}}
{{- toJson (.Values.tenantNamespaces | default .Values.watchNamespaces) -}}
{{- end -}}

{{/* What the operator does in the namespaces it watches (operator/specdecode/shell/kube.py), verb
by verb: the same rules as manifests/base/rbac.yaml's ClusterRole, bound cluster-wide or per
namespace. */}}
{{- define "specdecode.namespacedRules" -}}
# The custom resource: kopf watches it and keeps its bookkeeping in annotations (patch);
# the operator writes status through the status subresource.
- apiGroups: ["serving.specdecode.io"]
  resources: ["specdecodeservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.specdecode.io"]
  resources: ["specdecodeservices/status"]
  verbs: ["patch"]
# Children, written by server-side apply; Deployments are watched for rollouts, and a canary
# experiment's Deployment is deleted when the experiment ends.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "create", "patch", "delete"]
# Pods of the current config and their logs: why a speculative config cannot start.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Events: the operator's decisions and kopf's warnings.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/* kopf's cluster-scoped needs: peering (cluster-wide installs only) and discovery. */}}
{{- define "specdecode.clusterRules" -}}
{{- if not .Values.watchNamespaces }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end -}}
