"""Pods from the Kubernetes API as the simulator sees them (pure conversion)."""

from __future__ import annotations

from kubernetes import client

from specdecode import constants as C
from specdecode.tools.sim.kube import LABEL_SELECTOR, pod_info


def v1pod(ready: bool = True, labels: dict | None = None, deleting: bool = False,
          restarts: int = 0) -> client.V1Pod:
    labels = {
        C.LABEL_MANAGED_BY: C.LABEL_MANAGED_BY_VALUE,
        C.LABEL_SERVICE: "llama",
        C.LABEL_CONFIG_HASH: "abc123",
    } if labels is None else labels
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="llama-7d9-x", namespace="team-a", uid="u-1", labels=labels,
            deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
        ),
        spec=client.V1PodSpec(containers=[
            client.V1Container(name="sidecar", image="busybox", args=["sleep"]),
            client.V1Container(name=C.VLLM_CONTAINER_NAME, image="vllm/vllm-openai:v0.33.0",
                               command=["vllm", "serve"], args=["org/m", "--served-model-name", "m"]),
        ]),
        status=client.V1PodStatus(
            conditions=[client.V1PodCondition(type="Ready", status="True" if ready else "False")],
            container_statuses=[client.V1ContainerStatus(
                name=C.VLLM_CONTAINER_NAME, restart_count=restarts, ready=ready, image="x",
                image_id="y")],
        ),
    )


def test_selector_is_the_operators_managed_by_label() -> None:
    assert LABEL_SELECTOR == "app.kubernetes.io/managed-by=specdecode-operator"


def test_reads_service_hash_args_readiness_and_restarts() -> None:
    info = pod_info(v1pod(restarts=2))
    assert info is not None
    assert (info.namespace, info.name, info.uid) == ("team-a", "llama-7d9-x", "u-1")
    assert (info.service, info.config_hash) == ("llama", "abc123")
    assert info.args == ("vllm", "serve", "org/m", "--served-model-name", "m")
    assert info.ready and info.serving and info.restart_count == 2


def test_not_ready_and_terminating_pods_do_not_serve() -> None:
    assert not pod_info(v1pod(ready=False)).serving
    terminating = pod_info(v1pod(deleting=True))
    assert terminating.ready and terminating.terminating and not terminating.serving


def test_pods_without_the_service_label_are_ignored() -> None:
    assert pod_info(v1pod(labels={C.LABEL_MANAGED_BY: C.LABEL_MANAGED_BY_VALUE})) is None


def test_dict_pods_from_watch_events_work_too() -> None:
    raw = client.ApiClient().sanitize_for_serialization(v1pod())
    assert pod_info(raw) == pod_info(v1pod())
