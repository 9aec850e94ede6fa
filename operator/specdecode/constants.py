"""Names every part of the operator agrees on: API group, labels, annotations, reasons.

DESIGN.md makes these binding; nothing else in the package spells them out as literals.
"""

GROUP = "serving.specdecode.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SpecDecodeService"
PLURAL = "specdecodeservices"
SINGULAR = "specdecodeservice"
SHORT_NAMES = ["sds"]
CRD_NAME = f"{PLURAL}.{GROUP}"

FIELD_MANAGER = "specdecode-operator"
OPERATOR_NAME = "specdecode-operator"

# Labels on every child object. The Deployment selector uses only the stable ones
# (selectors are immutable); the config hash lives on the pod template alone.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_NAME_VALUE = "vllm"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_MANAGED_BY_VALUE = OPERATOR_NAME
LABEL_SERVICE = f"{GROUP}/service"
LABEL_CONFIG_HASH = f"{GROUP}/config-hash"
# Pods of a canary experiment; the main Deployment's pods never carry it.
LABEL_CANARY = f"{GROUP}/canary"
CANARY_SUFFIX = "-canary"

# Prometheus label names the PodMonitor relabels the pod labels to; all PromQL groups by these.
PROM_LABEL_SERVICE = "specdecode_service"
PROM_LABEL_CONFIG_HASH = "specdecode_config_hash"

# Annotations.
ANNOTATION_PREFIX = GROUP
ANNOTATION_APPLIED_HASH = f"{GROUP}/applied-hash"
ANNOTATION_SPECULATION = f"{GROUP}/speculation"
KOPF_FINALIZER = f"{GROUP}/finalizer"

# The GPU taint the NVIDIA device plugin documentation recommends for GPU nodes.
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"

VLLM_PORT = 8000
VLLM_PORT_NAME = "http"
VLLM_CONTAINER_NAME = "vllm"
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai"
DEFAULT_VLLM_VERSION = "0.33.0"

# Phases.
PHASE_PENDING = "Pending"
PHASE_PROGRESSING = "Progressing"
PHASE_SERVING = "Serving"
PHASE_DEGRADED = "Degraded"

# Condition types.
COND_READY = "Ready"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_SPECULATION_EFFECTIVE = "SpeculationEffective"
COND_METRICS_AVAILABLE = "MetricsAvailable"
COND_DRAFT_COMPATIBLE = "DraftCompatible"
COND_MODEL_CACHE_EPHEMERAL = "ModelCacheEphemeral"
# True while a canary experiment runs; neutral for GitOps health (the main Deployment serves).
COND_EXPERIMENTING = "Experimenting"
# True (a warning, like ModelCacheEphemeral) while the spec lets autotune roll a change out
# below what carries the load: spec.autotune.allowOutages with too few replicas left serving.
COND_OUTAGE_RISK = "OutageRisk"
# False while the window's P95 breaks a latency SLO (spec.autotune.slo); unset without an SLO.
COND_SLO_MET = "SLOMet"

# Condition reasons (CamelCase, as Kubernetes conventions ask).
REASON_INVALID_SPEC = "InvalidSpec"
REASON_ROLLING_OUT = "RollingOut"
REASON_ROLLOUT_COMPLETE = "RolloutComplete"
REASON_SCALING = "Scaling"
REASON_DEPLOYMENT_MISSING = "DeploymentMissing"
REASON_UNAVAILABLE = "ReplicasUnavailable"
REASON_AVAILABLE = "ReplicasAvailable"
REASON_APPLY_FAILED = "ApplyFailed"
REASON_SPECULATION_ON = "SpeculationOn"
REASON_SPECULATION_OFF = "SpeculationOff"
REASON_ACCEPTANCE_BELOW_FLOOR = "AcceptanceBelowFloor"
REASON_DISABLED_BY_USER = "DisabledByUser"
REASON_STARTUP_FAILURE = "StartupFailure"
REASON_METRICS_OK = "MetricsFresh"
REASON_SLO_MET = "WithinObjectives"
REASON_SLO_BREACHED = "ObjectiveBreached"
REASON_METRICS_MISSING = "MetricsMissing"
REASON_CACHE_EMPTY_DIR = "EmptyDirCache"
REASON_CACHE_PERSISTENT = "PersistentCache"
REASON_AUTOTUNE_OFF = "AutotuneOff"
REASON_METRICS_STALE = "MetricsStale"
# spec.metrics.prometheusUrl is outside the operator's allowedPrometheusUrls: never contacted.
REASON_PROMETHEUS_URL_NOT_ALLOWED = "PrometheusURLNotAllowed"
# A Secret named in spec.metrics.auth cannot be read from the service's namespace.
REASON_PROMETHEUS_CREDENTIALS_UNAVAILABLE = "PrometheusCredentialsUnavailable"
REASON_NOT_ENOUGH_SAMPLES = "NotEnoughSamples"
REASON_CANARY_RUNNING = "CanaryRunning"

# Event reasons.
EVENT_APPLIED = "Applied"
EVENT_SPECULATION_CHANGED = "SpeculationChanged"
EVENT_RECOMMENDATION = "Recommendation"
EVENT_INVALID_SPEC = "InvalidSpec"
# A foreign edit made our apply impossible; the operator took its fields back (or recreated
# the object) and says so.
EVENT_TOOK_BACK = "TookBackFields"
EVENT_RECREATED = "Recreated"
# Canary experiments (issue #15): one Event when one starts and one when it ends.
EVENT_EXPERIMENT_STARTED = "ExperimentStarted"
EVENT_EXPERIMENT_PROMOTED = "ExperimentPromoted"
EVENT_EXPERIMENT_ABORTED = "ExperimentAborted"
EVENT_EXPERIMENT_CANCELLED = "ExperimentCancelled"
EVENT_EXPERIMENT_MEASURED = "ExperimentMeasured"

# Status history is bounded so the object stays small (etcd objects are capped at 1.5 MiB).
MAX_DECISION_HISTORY = 20
# Canary experiments kept in status.experiments (the running one is the last).
MAX_EXPERIMENTS = 8
