"""Pure rendering of everything the local cluster is configured with.

- the kwokctl configuration (which binaries, bound to 127.0.0.1, audit policy, TLS + RBAC);
- the kwok Stages that simulate a vLLM pod's life on a fake GPU node: running but not Ready
  while the model "loads" (a configurable delay), Ready afterwards, or a start-up crash loop
  for pods that ask for one;
- the kube-apiserver audit policy (tests count the operator's writes in the audit log);
- the fake GPU Node objects.

No I/O here: `cluster.py` writes these to files and runs the processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdecode.tools.localstack.build import Binaries

# Annotations that steer the simulated pod life. They belong to the simulator, not the
# operator, so they live under their own prefix.
SIM_PREFIX = "sim.specdecode.io"
# Value: the message the container "prints" when it dies; the container exits 1 with it and
# restarts in a loop, like a vLLM that cannot load its model.
FAIL_STARTUP_ANNOTATION = f"{SIM_PREFIX}/fail-startup"
# Optional, with fail-startup: which container fails (default: the first one).
FAIL_CONTAINER_ANNOTATION = f"{SIM_PREFIX}/fail-container"
# Optional per-pod overrides of the cluster-wide delays (Go durations such as "30s").
READY_DELAY_ANNOTATION = f"{SIM_PREFIX}/ready-delay"
FAIL_AFTER_ANNOTATION = f"{SIM_PREFIX}/fail-after"
CRASH_BACKOFF_ANNOTATION = f"{SIM_PREFIX}/crash-backoff"

GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class ClusterSpec:
    """What a local cluster looks like; two `up` calls with equal specs share one cluster."""

    nodes: int = 4
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    node_cpu: str = "96"
    node_memory: str = "1Ti"
    node_pods: int = 110
    ready_delay: str = "2s"
    fail_after: str = "1s"
    crash_backoff: str = "1s"
    kubernetes_version: str = ""
    kwok_version: str = ""
    etcd_version: str = ""

    def validate(self) -> None:
        if not 1 <= self.nodes <= 200:
            raise ValueError(f"nodes must be between 1 and 200, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 64:
            raise ValueError(f"gpus_per_node must be between 0 and 64, got {self.gpus_per_node}")
        for name in ("ready_delay", "fail_after", "crash_backoff"):
            duration_ms(getattr(self, name), what=name.replace("_", "-"))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def duration_ms(text: str, what: str = "duration") -> int:
    """Milliseconds in a Go duration string ("2s", "1m30s", "500ms", "0s")."""
    text = text.strip()
    if text == "0":
        return 0
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"{what} {text!r} is not a duration such as 2s, 500ms or 1m30s")
    return int(round(total))


# --------------------------------------------------------------------------------------------
# Audit policy
# --------------------------------------------------------------------------------------------

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def audit_policy() -> dict:
    """Log every write once, with its body; skip reads.

    Reads (get/list/watch) would be most of the log and no test needs them. Writes are logged
    at Request so a test can see what the operator sent, except where the body is a
    credential (Secrets, TokenRequests) or churn (leases, events), which get Metadata: still
    one entry per request with verb, user and object, enough to count. Not RequestResponse:
    nothing reads the answers, and serializing every one (a whole object with its
    managedFields) made the log 100 MB in five minutes of `bench fleet --services 500` and
    took the API server's CPU from everything it measures.
    `RequestReceived` is omitted so each request appears exactly once (at ResponseComplete).
    """
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "verbs": ["get", "list", "watch"]},
            {"level": "Metadata", "resources": [
                {"group": "", "resources": ["secrets", "serviceaccounts/token", "events"]},
                {"group": "events.k8s.io", "resources": ["events"]},
                {"group": "coordination.k8s.io", "resources": ["leases"]},
                {"group": "authentication.k8s.io", "resources": ["tokenreviews"]},
            ]},
            {"level": "Request", "verbs": list(WRITE_VERBS)},
            {"level": "Metadata"},
        ],
    }


# --------------------------------------------------------------------------------------------
# kwokctl configuration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ports:
    """The 127.0.0.1 ports of one cluster's components, chosen before kwokctl runs.

    kwokctl's own choice probes ports downwards from 32767 and then starts the components;
    two clusters created at the same moment (two test sessions, two people) pick the same
    ports and one of them dies on "address already in use". The caller picks them instead.
    """

    kube_apiserver: int
    etcd: int
    etcd_peer: int
    kwok_controller: int
    kube_controller_manager: int
    kube_scheduler: int

    def kwokctl_options(self) -> dict[str, int]:
        return {
            "kubeApiserverPort": self.kube_apiserver,
            "etcdPort": self.etcd,
            "etcdPeerPort": self.etcd_peer,
            "kwokControllerPort": self.kwok_controller,
            "kubeControllerManagerPort": self.kube_controller_manager,
            "kubeSchedulerPort": self.kube_scheduler,
        }


def kwokctl_configuration(binaries: Binaries, audit_policy_path: Path, ports: Ports) -> dict:
    """kwokctl's options: our binaries, loopback only, TLS + RBAC + admission, audit on.

    `securePort`/`kubeAuthorization` make kwokctl generate a CA and an admin certificate and
    give kube-apiserver a service-account signing key, so TokenRequest works; admission keeps
    the defaults a real cluster has (ServiceAccount, NamespaceLifecycle, ...).
    """
    options: dict = {
        "runtime": "binary",
        "kubeVersion": binaries.kubernetes_version,
        "etcdVersion": binaries.etcd_version.removeprefix("v"),
        "bindAddress": "127.0.0.1",
        "securePort": True,
        "kubeAuthorization": True,
        "kubeAdmission": True,
        "kubeAuditPolicy": str(audit_policy_path),
        "kubeApiserverBinary": str(binaries.kube_apiserver),
        "kubeControllerManagerBinary": str(binaries.kube_controller_manager),
        "kubeSchedulerBinary": str(binaries.kube_scheduler),
        "kubectlBinary": str(binaries.kubectl),
        "etcdBinary": str(binaries.etcd),
        "kwokControllerBinary": str(binaries.kwok),
        "quietPull": True,
        "components": ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                       "kwok-controller"],
    }
    options.update(ports.kwokctl_options())
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": options,
        "componentsPatches": [{
            # The apiserver's default Service range is a /24: 250 Services fill it (`bench
            # fleet` runs 500 services, each with its Service).
            "name": "kube-apiserver",
            "extraArgs": [{"key": "service-cluster-ip-range", "value": SERVICE_CIDR}],
        }, {
            "name": "kube-controller-manager",
            # Each controller acts as its own ServiceAccount (system:serviceaccount:kube-system:
            # deployment-controller, ...), as on kubeadm clusters, instead of all of them as
            # the admin: audit entries then tell the controllers' writes from everyone else's.
            "extraArgs": [{"key": "use-service-account-credentials", "value": "true"},
                          # One instance of each: no leader election, which exits the process
                          # when the API server is away for longer than the renew deadline.
                          {"key": "leader-elect", "value": "false"},
                          # Each controller's client is limited to 20 requests a second by
                          # default: the Deployment controller alone then needs ~2 minutes to
                          # bring 500 new Deployments to available (measured: 120 s with no
                          # operator at all), a floor under `bench fleet` that is the stack's, not
                          # the operator's. Clusters of that size raise it the same way.
                          {"key": "kube-api-qps", "value": str(CONTROLLER_API_QPS)},
                          {"key": "kube-api-burst", "value": str(2 * CONTROLLER_API_QPS)}],
        }, {
            "name": "kube-scheduler",
            "extraArgs": [{"key": "leader-elect", "value": "false"}],
        }],
    }


SERVICE_CIDR = "10.96.0.0/16"
CONTROLLER_API_QPS = 200

# --------------------------------------------------------------------------------------------
# Pod stages
# --------------------------------------------------------------------------------------------
#
# kwok applies the first Stage whose selector matches a pod, after the Stage's delay; the
# selectors below are mutually exclusive, so the walk is deterministic:
#
#   scheduled ──start──▶ Running, not Ready ──ready (after ready-delay)──▶ Running, Ready
#                              │ (fail-startup annotation)
#                              ▼
#                   crash (after fail-after): container terminated, exit 1, message
#                              ▼
#                   back-off (after crash-backoff): waiting CrashLoopBackOff, lastState
#                              ▼
#                   restart (after crash-backoff): running again, restartCount + 1 ──▶ crash …
#
# Pod deletion: a pod with a deletionTimestamp and no finalizers is removed at once, as a
# kubelet would after its containers stopped. Node stages are not given here, so kwok keeps
# its built-in node initialisation and lease heartbeat, which keep the nodes Ready.

def _annotation(key: str) -> str:
    return f'.metadata.annotations["{key}"]'


_NOT_DELETING = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
_FAILING = {"key": _annotation(FAIL_STARTUP_ANNOTATION), "operator": "Exists"}
_NOT_FAILING = {"key": _annotation(FAIL_STARTUP_ANNOTATION), "operator": "DoesNotExist"}

# jq: the state ("running", "terminated" or "waiting") of the container chosen to fail.
_FAILING_CONTAINER_STATE = (
    ". as $pod | $pod.status.containerStatuses.[]"
    f' | select(.name == ($pod.metadata.annotations["{FAIL_CONTAINER_ANNOTATION}"]'
    " // $pod.spec.containers[0].name)) | .state | keys | .[0]"
)

# Go template prelude shared by the status templates: the current statuses (possibly none)
# and the name of the container that fails (only meaningful with the fail annotation).
_TEMPLATE_PRELUDE = f"""\
{{{{ $now := Now }}}}
{{{{ $pod := . }}}}
{{{{ $annotations := or .metadata.annotations dict }}}}
{{{{ $statuses := or .status.containerStatuses list }}}}
{{{{ $failing := or (index $annotations "{FAIL_CONTAINER_ANNOTATION}") (index .spec.containers 0).name }}}}
{{{{ $message := or (index $annotations "{FAIL_STARTUP_ANNOTATION}") "simulated start-up failure" }}}}
"""

# For container $index: its current status ($origin, empty when none) and restart count.
_ORIGIN = """\
{{ $origin := dict }}
{{ if lt $index (len $statuses) }}{{ $origin = index $statuses $index }}{{ end }}
{{ $restarts := int64 (or $origin.restartCount 0) }}
"""

_NOT_READY_CONDITIONS = """\
conditions:
- type: Initialized
  status: "True"
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "False"
  reason: ContainersNotReady
  message: {{ printf "containers with unready status: [%s]" $failing | Quote }}
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "False"
  reason: ContainersNotReady
  message: {{ printf "containers with unready status: [%s]" $failing | Quote }}
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
"""

_START_TEMPLATE = _TEMPLATE_PRELUDE + """\
conditions:
- type: Initialized
  status: "True"
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "False"
  reason: ContainersNotReady
  message: containers are starting
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "False"
  reason: ContainersNotReady
  message: containers are starting
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
{{ range .spec.readinessGates }}
- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
{{ with .spec.initContainers }}
initContainerStatuses:
{{ range . }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""

_READY_TEMPLATE = _TEMPLATE_PRELUDE + """\
conditions:
- type: Ready
  status: "True"
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range $index, $container := .spec.containers }}
""" + _ORIGIN + """\
- name: {{ $container.name | Quote }}
  image: {{ $container.image | Quote }}
  ready: true
  started: true
  restartCount: {{ $restarts }}
  state:
    running:
      startedAt: {{ or (dig "state" "running" "startedAt" "" $origin) $now | Quote }}
{{ end }}
"""


def _failing_container_template(state_block: str, restarts_expr: str, keep_last_state: bool,
                                running: bool = False) -> str:
    """Status template that changes the failing container and leaves the others running."""
    last_state = (
        "{{ with $origin.lastState }}\n  lastState: {{ toJson . }}\n{{ end }}\n" if keep_last_state else ""
    )
    return _TEMPLATE_PRELUDE + _NOT_READY_CONDITIONS + """\
containerStatuses:
{{ range $index, $container := .spec.containers }}
""" + _ORIGIN + """\
{{ if eq $container.name $failing }}
- name: {{ $container.name | Quote }}
  image: {{ $container.image | Quote }}
  ready: false
  started: """ + ("true" if running else "false") + """
  restartCount: """ + restarts_expr + "\n" + state_block + last_state + """\
{{ else }}
- name: {{ $container.name | Quote }}
  image: {{ $container.image | Quote }}
  ready: false
  started: true
  restartCount: {{ $restarts }}
  state:
    running:
      startedAt: {{ or (dig "state" "running" "startedAt" "" $origin) $now | Quote }}
{{ end }}
{{ end }}
"""


_CRASH_STATE = """\
  state:
    terminated:
      exitCode: 1
      reason: Error
      message: {{ $message | Quote }}
      startedAt: {{ or (dig "state" "running" "startedAt" "" $origin) $now | Quote }}
      finishedAt: {{ $now | Quote }}
"""
# Pods that must not restart end Failed, as the kubelet would leave them.
_CRASH_PHASE = (
    '{{ if eq (or .spec.restartPolicy "Always") "Never" }}\nphase: Failed\n{{ else }}\n'
    "phase: Running\n{{ end }}\n"
)

_BACKOFF_STATE = """\
  state:
    waiting:
      reason: CrashLoopBackOff
      message: {{ printf "back-off restarting failed container %s in pod %s_%s" $container.name $pod.metadata.name $pod.metadata.namespace | Quote }}
  lastState:
    terminated: {{ dig "state" "terminated" dict $origin | toJson }}
"""

_RESTART_STATE = """\
  state:
    running:
      startedAt: {{ $now | Quote }}
"""


def _delay(default_ms: int, annotation: str) -> dict:
    return {"durationMilliseconds": default_ms, "durationFrom": {"expressionFrom": _annotation(annotation)}}


def _pod_stage(name: str, match_expressions: list[dict], status_template: str, delay: dict | None = None,
               event: dict | None = None) -> dict:
    spec: dict = {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {"matchExpressions": match_expressions},
        "next": {"statusTemplate": status_template},
    }
    if delay:
        spec["delay"] = delay
    if event:
        spec["next"]["event"] = event
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def pod_stages(spec: ClusterSpec) -> list[dict]:
    """The Stages that replace kwok's default pod life (which is Ready at once)."""
    ready_ms = duration_ms(spec.ready_delay, "ready-delay")
    fail_ms = duration_ms(spec.fail_after, "fail-after")
    backoff_ms = duration_ms(spec.crash_backoff, "crash-backoff")

    def failing_state(state: str) -> list[dict]:
        return [_NOT_DELETING, _FAILING, {"key": _FAILING_CONTAINER_STATE, "operator": "In", "values": [state]}]

    return [
        _pod_stage(
            "specdecode-pod-start",
            [_NOT_DELETING, {"key": ".status.podIP", "operator": "DoesNotExist"}],
            _START_TEMPLATE,
        ),
        _pod_stage(
            "specdecode-pod-ready",
            [
                _NOT_DELETING,
                _NOT_FAILING,
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": '.status.conditions.[] | select(.type == "Ready") | .status',
                 "operator": "In", "values": ["False"]},
            ],
            _READY_TEMPLATE,
            delay=_delay(ready_ms, READY_DELAY_ANNOTATION),
        ),
        _pod_stage(
            "specdecode-pod-crash",
            [*failing_state("running"), {"key": ".status.phase", "operator": "In", "values": ["Running"]}],
            _failing_container_template(_CRASH_STATE, "{{ $restarts }}", keep_last_state=True) + _CRASH_PHASE,
            delay=_delay(fail_ms, FAIL_AFTER_ANNOTATION),
            event={"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container"},
        ),
        _pod_stage(
            "specdecode-pod-crash-backoff",
            [*failing_state("terminated"), {"key": ".status.phase", "operator": "In", "values": ["Running"]}],
            _failing_container_template(_BACKOFF_STATE, "{{ $restarts }}", keep_last_state=False),
            delay=_delay(backoff_ms, CRASH_BACKOFF_ANNOTATION),
        ),
        _pod_stage(
            "specdecode-pod-restart",
            failing_state("waiting"),
            _failing_container_template(_RESTART_STATE, "{{ add1 $restarts }}", keep_last_state=True,
                                        running=True),
            delay=_delay(backoff_ms, CRASH_BACKOFF_ANNOTATION),
        ),
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "specdecode-pod-delete"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                "selector": {"matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                    {"key": ".metadata.finalizers", "operator": "DoesNotExist"},
                ]},
                "next": {"delete": True},
            },
        },
    ]


# --------------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------------

def node_name(index: int) -> str:
    return f"gpu-node-{index}"


def gpu_node(index: int, spec: ClusterSpec) -> dict:
    """A fake GPU node that kwok manages: H100s behind the device plugin's usual taint."""
    resources = {
        "cpu": spec.node_cpu,
        "memory": spec.node_memory,
        "pods": str(spec.node_pods),
        "ephemeral-storage": "10Ti",
        GPU_RESOURCE: str(spec.gpus_per_node),
    }
    name = node_name(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # kwok manages every node when started by kwokctl; the annotation is what kwok's
            # docs use to mark fake nodes and keeps them recognisable to people.
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "kwok-gpu",
                "type": "kwok",
                GPU_PRODUCT_LABEL: spec.gpu_product,
                GPU_COUNT_LABEL: str(spec.gpus_per_node),
            },
        },
        "spec": {
            "taints": [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": spec.kubernetes_version or "kwok",
                "kubeProxyVersion": spec.kubernetes_version or "kwok",
                "containerRuntimeVersion": f"kwok-{spec.kwok_version}" if spec.kwok_version else "kwok",
            },
        },
    }


def gpu_nodes(spec: ClusterSpec) -> list[dict]:
    return [gpu_node(index, spec) for index in range(spec.nodes)]
