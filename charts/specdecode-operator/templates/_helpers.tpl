{{/* Base name of every object; "specdecode-operator" as in manifests/. */}}
{{- define "specdecode.fullname" -}}
{{- .Values.fullnameOverride | default "specdecode-operator" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the kustomize install's part-of, plus Helm's own. Never
app.kubernetes.io/instance (Argo CD tracks by it) nor managed-by=specdecode-operator (the
operator takes Deployments with it for its vLLM children). */}}
{{- define "specdecode.labels" -}}
app.kubernetes.io/part-of: specdecode-operator
app.kubernetes.io/managed-by: Helm
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "specdecode.selectorLabels" -}}
app.kubernetes.io/name: specdecode-operator
app.kubernetes.io/component: controller
{{- end -}}

{{- define "specdecode.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
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
