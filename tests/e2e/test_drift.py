"""Drift on the owned objects, whatever path changed it, as a platform team meets it: a
`kubectl scale` of the Deployment, a hand edit of the Service port that makes every later
apply fail, a PDB edited at the same time, a foreign annotation that must not cause an apply
loop, a replica count above the operator's limit, and the client under kopf's threads."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client

from specdecode import constants as C
from specdecode.shell.kube import Kube

from .conftest import poll_until
from .operator_harness import OPERATOR_USER, RECONCILE_INTERVAL_S, audit_writes, kubectl
from .test_operator import apply, condition, get_deployment, get_sds, sample_in, wait_serving

pytestmark = pytest.mark.e2e


def events(cluster, namespace: str, reason: str) -> list[dict]:
    done = kubectl(cluster, "get", "events", "-n", namespace, "--field-selector",
                   f"involvedObject.kind=SpecDecodeService,reason={reason}", "-o", "json")
    return json.loads(done.stdout)["items"]


def test_kubectl_scale_of_the_deployment_is_taken_back(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace, replicas=2))
    wait_serving(kube_api, namespace, "llama")
    kubectl(cluster, "scale", "deployment/llama", "-n", namespace, "--replicas=5")
    poll_until(lambda: get_deployment(kube_api, namespace, "llama").spec.replicas == 2,
               3 * RECONCILE_INTERVAL_S + 10, "the Deployment to be scaled back to the spec's 2")


def test_a_hand_edited_service_port_is_taken_back_and_the_pdb_still_repaired(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace, replicas=2))
    wait_serving(kube_api, namespace, "llama")
    core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)

    # The edit that made every later apply fail: `422 Duplicate value: "http"`.
    kubectl(cluster, "patch", "service", "llama", "-n", namespace, "--type=json",
            "-p", '[{"op": "replace", "path": "/spec/ports/0/port", "value": 8080}]')
    kubectl(cluster, "patch", "pdb", "llama", "-n", namespace, "--type=merge", "-p", '{"spec": {"maxUnavailable": 2}}')

    def service_restored():
        ports = core.read_namespaced_service("llama", namespace).spec.ports
        return [(p.name, p.port) for p in ports] == [("http", C.VLLM_PORT)]

    poll_until(service_restored, 3 * RECONCILE_INTERVAL_S + 20, "the Service port to be taken back")
    poll_until(lambda: policy.read_namespaced_pod_disruption_budget("llama", namespace).spec.max_unavailable == 1,
               3 * RECONCILE_INTERVAL_S + 20, "the PDB edit to be repaired too")
    took_back = poll_until(lambda: events(cluster, namespace, C.EVENT_TOOK_BACK), 20, "a TookBackFields event")
    assert "Service llama" in took_back[0]["message"] and "Duplicate value" in took_back[0]["message"]
    sds = wait_serving(kube_api, namespace, "llama")
    assert condition(sds, C.COND_DEGRADED).get("status") != "True"


def test_a_foreign_annotation_on_the_deployment_causes_no_apply_loop(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    wait_serving(kube_api, namespace, "llama")
    poll_until(lambda: get_sds(kube_api, namespace, "llama")["status"]["speculation"]["live"], 30, "a live config")
    kubectl(cluster, "annotate", "deployment/llama", "-n", namespace, "team.example/owner=platform")
    applied_before = len(events(cluster, namespace, C.EVENT_APPLIED))
    _, mark = audit_writes(cluster, OPERATOR_USER, namespace)
    reconciles = operator.total("specdecode_reconciles_total")
    poll_until(lambda: operator.total("specdecode_reconciles_total") >= reconciles + 10,
               30 * RECONCILE_INTERVAL_S, "ten more reconciles")
    writes, _ = audit_writes(cluster, OPERATOR_USER, namespace, since=mark)
    deployment_writes = [w for w in writes if (w.get("objectRef") or {}).get("resource") == "deployments"]
    assert deployment_writes == [], [(w["verb"], w["objectRef"]) for w in deployment_writes]
    assert len(events(cluster, namespace, C.EVENT_APPLIED)) == applied_before
    assert get_deployment(kube_api, namespace, "llama").metadata.annotations["team.example/owner"] == "platform"


def test_replicas_above_the_operator_limit_degrade_without_touching_the_deployment(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace, replicas=2))
    wait_serving(kube_api, namespace, "llama")
    kubectl(cluster, "scale", "sds/llama", "-n", namespace, "--replicas=40")

    def degraded():
        sds = get_sds(kube_api, namespace, "llama")
        cond = condition(sds, C.COND_DEGRADED)
        fresh = sds["status"].get("observedGeneration") == sds["metadata"]["generation"]
        return sds if fresh and cond.get("reason") == C.REASON_INVALID_SPEC else None

    sds = poll_until(degraded, 30, "Degraded/InvalidSpec for 40 replicas")
    assert "SPECDECODE_MAX_REPLICAS" in condition(sds, C.COND_DEGRADED)["message"]
    assert poll_until(lambda: events(cluster, namespace, C.EVENT_INVALID_SPEC), 20, "an InvalidSpec event")
    assert get_deployment(kube_api, namespace, "llama").spec.replicas == 2


def test_the_client_is_safe_under_concurrent_discovery(kube_api, operator):
    """kopf runs handlers in threads; a kind that is not served makes every check rediscover.
    This raised KeyError 'apis' / 'resources' when the discovery cache was shared unguarded."""
    kube = Kube(kube_api)
    failures: list[BaseException] = []

    def hammer(worker: int) -> None:
        try:
            for i in range(15):
                assert kube.is_served("example.invalid/v1", f"Missing{worker}", now=float(i * 1000)) is False
                assert kube.is_served("apps/v1", "Deployment", now=float(i * 1000)) is True
                kube.list("v1", "Namespace", None)
        except BaseException as err:  # noqa: BLE001 - any failure of a thread is the finding
            failures.append(err)

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
