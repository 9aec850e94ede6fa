"""Pure rendering: (SpecDecodeService, speculation choice) -> Kubernetes objects.

No I/O, no clock, no global configuration: the same input always gives the same objects, so
GitOps users can render in CI (`specdecode render`) and the operator can tell, by a hash,
whether anything it would apply differs from what it applied last.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from .. import api
from .. import constants as C
from . import vllm_args as vllm
from . import features as support

PODMONITOR_API_VERSION = "monitoring.coreos.com/v1"

# Probe cadence. The startup probe's failure budget is derived from rollout.startupTimeout.
STARTUP_PROBE_PERIOD_S = 10
READINESS_PROBE_PERIOD_S = 5
LIVENESS_PROBE_PERIOD_S = 10


class RenderError(ValueError):
    """The spec is valid on its own but cannot be rendered (for example a method the declared
    vLLM version does not have). Reported as Degraded/InvalidSpec, exit 2 in the CLI."""


@dataclass(frozen=True)
class SpeculationChoice:
    """What the operator runs: K speculative tokens, or speculation off (k is None)."""

    k: Optional[int]
    per_batch_size: Optional[tuple[tuple[int, int, int], ...]] = None
    """The operator's per-batch-size K table (`control.schedules`); a declared
    speculation.perBatchSizeK takes precedence."""

    @property
    def enabled(self) -> bool:
        return self.k is not None

    @classmethod
    def off(cls) -> "SpeculationChoice":
        return cls(k=None)

    def describe(self, method: str) -> str:
        return f"{method} K={self.k}" if self.enabled else "off"


def initial_choice(spec: api.SpecDecodeServiceSpec) -> SpeculationChoice:
    """The speculation a new service starts with: the spec's numSpeculativeTokens."""
    return SpeculationChoice(k=spec.speculation.num_speculative_tokens)


# ---------------------------------------------------------------------------------------------
# Names, labels, hashes
# ---------------------------------------------------------------------------------------------


def selector_labels(service_name: str) -> dict[str, str]:
    """The Deployment selector: stable labels only (a selector is immutable)."""
    return {C.LABEL_NAME: C.LABEL_NAME_VALUE, C.LABEL_SERVICE: service_name}


def main_pod_selector(service_name: str) -> dict[str, Any]:
    """A label selector for the main Deployment's pods alone. The Deployment's own selector
    (immutable, from before canaries) also matches a canary's pods; the PDB uses this one, so
    it protects the serving replicas and a canary (starting, or crash-looping) neither uses
    up nor blocks their disruption budget."""
    return {"matchLabels": selector_labels(service_name),
            "matchExpressions": [{"key": C.LABEL_CANARY, "operator": "DoesNotExist"}]}


def child_labels(service_name: str) -> dict[str, str]:
    return {**selector_labels(service_name), C.LABEL_MANAGED_BY: C.LABEL_MANAGED_BY_VALUE}


def selector_string(service_name: str) -> str:
    """The selector as `kubectl get -l` and the scale subresource want it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(service_name).items()))


def stable_hash(obj: Any, length: int = 10) -> str:
    """A short content hash of a JSON-able object (key order does not matter)."""
    encoded = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:length]


def object_hash(obj: dict[str, Any]) -> str:
    """Hash of what we apply for an object, the applied-hash annotation left out."""
    meta = dict(obj.get("metadata", {}))
    annotations = {k: v for k, v in meta.get("annotations", {}).items() if k != C.ANNOTATION_APPLIED_HASH}
    meta["annotations"] = annotations
    return stable_hash({**obj, "metadata": meta}, length=16)


def with_applied_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with its own content hash as an annotation, so a later reconcile can tell
    whether what it renders differs from what it applied without diffing server-side fields."""
    digest = object_hash(obj)
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), C.ANNOTATION_APPLIED_HASH: digest}
    return {**obj, "metadata": meta}


# ---------------------------------------------------------------------------------------------
# The vLLM command line
# ---------------------------------------------------------------------------------------------


def speculative_config(spec: api.SpecDecodeServiceSpec, choice: SpeculationChoice) -> Optional[vllm.SpeculativeConfig]:
    """vLLM's view of the speculation to run, or None when it is off."""
    if not choice.enabled:
        return None
    s = spec.speculation
    k = choice.k
    assert k is not None
    table = None
    if s.per_batch_size_k:
        # vLLM caps a row's K at num_speculative_tokens; render the cap so status and args agree.
        rows = sorted(s.per_batch_size_k, key=lambda r: r.min_batch_size)
        table = tuple((r.min_batch_size, r.max_batch_size, min(r.k, k)) for r in rows)
    elif choice.per_batch_size:
        table = tuple((start, end, min(row_k, k)) for start, end, row_k in choice.per_batch_size)
    return vllm.SpeculativeConfig(
        method=s.method.value,
        num_speculative_tokens=k,
        model=s.draft_model,
        revision=s.draft_revision,
        draft_tensor_parallel_size=s.draft_tensor_parallel_size,
        prompt_lookup_min=s.ngram.prompt_lookup_min if s.ngram else None,
        prompt_lookup_max=s.ngram.prompt_lookup_max if s.ngram else None,
        use_heterogeneous_vocab=s.use_heterogeneous_vocab,
        per_batch_size=table,
    )


def vllm_args(spec: api.SpecDecodeServiceSpec, choice: SpeculationChoice) -> list[str]:
    """Arguments after `vllm serve`: the model first, then flags in a fixed order."""
    m, e = spec.model, spec.engine
    args = [m.name, "--served-model-name", m.served_model_name, "--port", str(C.VLLM_PORT)]
    if m.revision:
        args += ["--revision", m.revision]
    if m.max_model_len:
        args += ["--max-model-len", str(m.max_model_len)]
    if m.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--tensor-parallel-size", str(spec.target_tensor_parallel_size)]
    if e.max_num_seqs is not None:
        args += ["--max-num-seqs", str(e.max_num_seqs)]
    if e.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if e.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", _number(e.gpu_memory_utilization)]
    args += vllm.chunked_prefill_args(e.enable_chunked_prefill, e.version)
    args += vllm.histogram_bucket_args(e.version)
    _check_draft_tensor_parallel(spec)
    config = speculative_config(spec, choice)
    try:
        args += vllm.speculative_args(config, e.version)
    except vllm.UnsupportedConfig as err:
        raise RenderError(f"{err.field}: {err}") from None
    _check_table_with_data_parallel(config, e)
    args += e.extra_args
    return args


def _check_table_with_data_parallel(config: Optional[vllm.SpeculativeConfig], e: api.Engine) -> None:
    """A per-batch-size K table with data parallelism (in extraArgs): vLLM drops it (0.26.0+)
    or its ranks may pick different K and deadlock (0.24.0, 0.25.0)."""
    dp = vllm.data_parallel_size(e.extra_args)
    release = vllm.release(e.version)
    if config is None or not config.per_batch_size or dp <= 1:
        return
    dropped = support.per_batch_size_table_dropped(config.method, str(release) if release else support.NEWEST_CHECKED, dp)
    if dropped:
        raise RenderError(
            f"spec.speculation.perBatchSizeK: it would not take effect: {dropped}; remove it, "
            "or remove --data-parallel-size from spec.engine.extraArgs"
        )


def _check_draft_tensor_parallel(spec: api.SpecDecodeServiceSpec) -> None:
    """vLLM's V1 draft-model runner needs the draft sharded like the target (0.15.0+), a
    stricter rule than the API's "1 or the target's" that holds for EAGLE heads."""
    s = spec.speculation
    tp = spec.target_tensor_parallel_size
    release = vllm.release(spec.engine.version)
    if (
        s.method == api.SpeculationMethod.DRAFT_MODEL
        and s.draft_tensor_parallel_size not in (None, tp)
        and (release is None or support.supports(support.DRAFT_TP_MUST_EQUAL_TARGET_FOR_DRAFT_MODEL, str(release)))
    ):
        raise RenderError(
            f"spec.speculation.draftTensorParallelSize: vLLM {spec.engine.version} runs a draft_model "
            f"only with the target's tensor parallel size ({tp}): set it to {tp} or leave it unset"
        )


def _number(value: float) -> str:
    return f"{value:g}"


def config_hash(spec: api.SpecDecodeServiceSpec, choice: SpeculationChoice) -> str:
    """Hash of everything that shapes the engine: pods of different configs can be told apart
    in metrics, and any change of it rolls the pods."""
    e = spec.engine
    engine = {
        "image": e.image_ref(),
        "args": vllm_args(spec, choice),
        "env": [v.to_wire() for v in e.env],
        "gpus": spec.resources.gpus,
        "gpuResource": spec.resources.gpu_resource_name,
    }
    return stable_hash(engine)


# ---------------------------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------------------------


def owner_reference(service: api.SpecDecodeService, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": C.API_VERSION,
        "kind": C.KIND,
        "name": service.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(service: api.SpecDecodeService, owner_uid: Optional[str], name: Optional[str] = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name or service.name,
        "namespace": service.namespace,
        "labels": child_labels(service.name),
    }
    if owner_uid:
        meta["ownerReferences"] = [owner_reference(service, owner_uid)]
    return meta


def _gpu_toleration(gpu_resource_name: str) -> dict[str, Any]:
    # Device plugins taint GPU nodes `<vendor>/gpu`, also for MIG resources like nvidia.com/mig-3g.40gb.
    vendor = gpu_resource_name.split("/", 1)[0]
    return {"key": f"{vendor}/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _env(spec: api.SpecDecodeServiceSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": spec.model_cache.mount_path}]
    token = spec.model_cache.hf_token_secret
    if token:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    if spec.pod.run_as_user is not None:
        env += [
            {"name": "HOME", "value": NON_ROOT_HOME},
            {"name": "XDG_CACHE_HOME", "value": f"{NON_ROOT_HOME}/.cache"},
            {"name": "VLLM_CACHE_ROOT", "value": f"{NON_ROOT_HOME}/.cache/vllm"},
            {"name": "TRITON_CACHE_DIR", "value": f"{NON_ROOT_HOME}/.triton"},
        ]
    ours = {v["name"] for v in env}
    env += [v.to_wire() for v in spec.engine.env if v.name not in ours]
    return env


NON_ROOT_HOME = "/home/vllm"


def _volumes(spec: api.SpecDecodeServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cache = spec.model_cache
    if cache.effective_type == "PersistentVolumeClaim":
        cache_volume: dict[str, Any] = {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}
    else:
        empty: dict[str, Any] = {}
        if cache.size_limit:
            empty["sizeLimit"] = cache.size_limit
        cache_volume = {"name": "model-cache", "emptyDir": empty}
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        cache_volume,
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": cache.mount_path},
    ]
    if spec.pod.run_as_user is not None:
        volumes.append({"name": "home", "emptyDir": {}})
        mounts.append({"name": "home", "mountPath": NON_ROOT_HOME})
    return volumes + list(spec.pod.volumes), mounts + list(spec.pod.volume_mounts)


def _resources(spec: api.SpecDecodeServiceSpec) -> dict[str, Any]:
    r = spec.resources
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if r.gpus:
        limits[r.gpu_resource_name] = r.gpus
    for key, value in (("cpu", r.cpu), ("memory", r.memory)):
        if value:
            limits[key] = value
            requests[key] = value
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _probes(spec: api.SpecDecodeServiceSpec) -> dict[str, Any]:
    startup_budget = api.parse_duration(spec.rollout.startup_timeout)
    def health() -> dict[str, Any]:
        return {"path": "/health", "port": C.VLLM_PORT_NAME}

    return {
        # Loading weights takes minutes: the startup probe holds liveness off until then.
        "startupProbe": {
            "httpGet": health(),
            "periodSeconds": STARTUP_PROBE_PERIOD_S,
            "failureThreshold": max(1, math.ceil(startup_budget / STARTUP_PROBE_PERIOD_S)),
        },
        "readinessProbe": {"httpGet": health(), "periodSeconds": READINESS_PROBE_PERIOD_S, "failureThreshold": 3},
        "livenessProbe": {"httpGet": health(), "periodSeconds": LIVENESS_PROBE_PERIOD_S, "failureThreshold": 3},
    }


def _pod_security(spec: api.SpecDecodeServiceSpec) -> dict[str, Any]:
    # The vLLM image runs as root by default; forcing a UID breaks its caches unless the user
    # asks for one (then HOME and the caches move to writable volumes, see _env/_volumes).
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    uid = spec.pod.run_as_user
    if uid is not None:
        context.update({"runAsUser": uid, "runAsGroup": uid, "fsGroup": uid, "runAsNonRoot": True})
    return context


def render_deployment(
    service: api.SpecDecodeService,
    choice: SpeculationChoice,
    owner_uid: Optional[str] = None,
    replicas: Optional[int] = None,
) -> dict[str, Any]:
    """The main vLLM Deployment; ``replicas`` overrides the spec's while a capacity-neutral
    canary experiment borrows replicas from it."""
    spec = service.spec
    args = vllm_args(spec, choice)
    digest = config_hash(spec, choice)
    volumes, mounts = _volumes(spec)
    pod_labels = {**spec.pod.labels, **child_labels(service.name), C.LABEL_CONFIG_HASH: digest}
    method = spec.speculation.method.value
    pod_annotations = {**spec.pod.annotations, C.ANNOTATION_SPECULATION: choice.describe(method)}

    container: dict[str, Any] = {
        "name": C.VLLM_CONTAINER_NAME,
        "image": spec.engine.image_ref(),
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"name": C.VLLM_PORT_NAME, "containerPort": C.VLLM_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        **_probes(spec),
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod_spec: dict[str, Any] = {
        # A Service named like `vllm` would inject VLLM_PORT=tcp://..., which vLLM refuses.
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
        "tolerations": [_gpu_toleration(spec.resources.gpu_resource_name)]
        + [t.to_wire() for t in spec.scheduling.tolerations],
        "securityContext": _pod_security(spec),
        "terminationGracePeriodSeconds": 60,
    }
    optional_pod_fields = {
        "nodeSelector": spec.scheduling.node_selector or None,
        "affinity": spec.scheduling.affinity,
        "priorityClassName": spec.scheduling.priority_class_name,
        "runtimeClassName": spec.scheduling.runtime_class_name,
        "serviceAccountName": spec.pod.service_account_name,
        "imagePullSecrets": [{"name": n} for n in spec.pod.image_pull_secrets] or None,
    }
    pod_spec.update({k: v for k, v in optional_pod_fields.items() if v is not None})

    startup_budget = api.parse_duration(spec.rollout.startup_timeout)
    meta = _metadata(service, owner_uid)
    meta["annotations"] = {C.ANNOTATION_SPECULATION: choice.describe(method)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": spec.replicas if replicas is None else replicas,
            "selector": {"matchLabels": selector_labels(service.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
            },
            # A rollout that outlives model loading by this much is stuck, not slow.
            "progressDeadlineSeconds": int(startup_budget) + 600,
            "revisionHistoryLimit": 3,
            "template": {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": pod_spec},
        },
    }


def canary_name(service_name: str) -> str:
    return f"{service_name}{C.CANARY_SUFFIX}"


def render_canary(
    service: api.SpecDecodeService, candidate: SpeculationChoice, owner_uid: Optional[str] = None, replicas: int = 1
) -> dict[str, Any]:
    """The canary Deployment of an experiment: the candidate config on its own replicas.

    Its pods carry the service's selector labels, so the Service sends them their share of the
    same traffic and the PodMonitor scrapes them; their config-hash label keeps their metrics
    apart. Its own selector adds the canary label, which the main Deployment's pods never carry,
    so neither Deployment counts or adopts the other's pods.
    """
    deployment = render_deployment(service, candidate, owner_uid, replicas=replicas)
    deployment["metadata"]["name"] = canary_name(service.name)
    deployment["metadata"]["labels"] = {**deployment["metadata"]["labels"], C.LABEL_CANARY: "true"}
    body = deployment["spec"]
    body["selector"] = {"matchLabels": {**selector_labels(service.name), C.LABEL_CANARY: "true"}}
    body["template"]["metadata"]["labels"][C.LABEL_CANARY] = "true"
    # One replica cannot roll: replace it (a canary is never the only server of the traffic).
    body["strategy"] = {"type": "Recreate"}
    body["revisionHistoryLimit"] = 1
    return with_applied_hash(deployment)


def render_service(service: api.SpecDecodeService, owner_uid: Optional[str] = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service, owner_uid),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(service.name),
            "ports": [{"name": C.VLLM_PORT_NAME, "port": C.VLLM_PORT, "targetPort": C.VLLM_PORT_NAME, "protocol": "TCP"}],
        },
    }


def _prometheus_label(k8s_label: str) -> str:
    """How Prometheus' Kubernetes discovery names a pod label: non-alphanumerics become `_`."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in k8s_label)


def render_pod_monitor(service: api.SpecDecodeService, owner_uid: Optional[str] = None) -> dict[str, Any]:
    protocols = service.spec.metrics.scrape_protocols
    return {
        "apiVersion": PODMONITOR_API_VERSION,
        "kind": "PodMonitor",
        "metadata": _metadata(service, owner_uid),
        "spec": {
            **({"scrapeProtocols": list(protocols)} if protocols else {}),
            "selector": {"matchLabels": selector_labels(service.name)},
            "podMetricsEndpoints": [
                {
                    "port": C.VLLM_PORT_NAME,
                    "path": "/metrics",
                    "interval": service.spec.metrics.scrape_interval,
                    "relabelings": [
                        {"sourceLabels": [_prometheus_label(C.LABEL_SERVICE)], "targetLabel": C.PROM_LABEL_SERVICE},
                        {"sourceLabels": [_prometheus_label(C.LABEL_CONFIG_HASH)], "targetLabel": C.PROM_LABEL_CONFIG_HASH},
                    ],
                }
            ],
        },
    }


def render_pdb(service: api.SpecDecodeService, owner_uid: Optional[str] = None) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(service, owner_uid),
        "spec": {
            "maxUnavailable": max(1, service.spec.rollout.max_unavailable),
            "selector": main_pod_selector(service.name),
        },
    }


@dataclass(frozen=True)
class Canary:
    """A running experiment's share of the children: the candidate on `replicas` of its own
    (the `<name>-canary` Deployment) and the main Deployment at `main_replicas` (fewer than
    spec.replicas when the canary borrows them: capacity-neutral)."""

    candidate: SpeculationChoice
    replicas: int
    main_replicas: int


def render_all(
    service: api.SpecDecodeService,
    choice: SpeculationChoice,
    owner_uid: Optional[str] = None,
    pod_monitor_served: bool = True,
    canary: Optional[Canary] = None,
) -> list[dict[str, Any]]:
    """Every child object the service should have now, in apply order.

    The canary Deployment exists only while an experiment runs (`canary`); the PDB only with
    more than one replica (with one, it would block node drains for good); the PodMonitor only
    when enabled and where its CRD is served.
    """
    main_replicas = canary.main_replicas if canary is not None else None
    objects = [render_deployment(service, choice, owner_uid, replicas=main_replicas)]
    if canary is not None:
        objects.append(render_canary(service, canary.candidate, owner_uid, replicas=canary.replicas))
    objects.append(render_service(service, owner_uid))
    if service.spec.replicas > 1:
        objects.append(render_pdb(service, owner_uid))
    if service.spec.metrics.pod_monitor and pod_monitor_served:
        objects.append(render_pod_monitor(service, owner_uid))
    return [with_applied_hash(obj) for obj in objects]
