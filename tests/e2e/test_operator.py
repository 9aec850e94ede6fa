"""The operator on a real control plane, driven the way a platform team drives it: kubectl.

Each test works in its own namespace; the operator runs once per session as a separate
process under the shipped RBAC.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from kubernetes import client

from specdecode import constants as C

from .conftest import poll_until
from .operator_harness import (
    OPERATOR_USER,
    REPO,
    RECONCILE_INTERVAL_S,
    audit_writes,
    kubectl,
)

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "manifests" / "samples" / "llama-3.1-8b-draft-model.yaml"
ROLLOUT_TIMEOUT = 90


def sample_in(namespace: str, name: str = "llama", **spec_changes) -> dict:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    # The sample mounts the claim its kustomization makes (test_samples covers that path);
    # here the weights "download" into an emptyDir, so no PersistentVolume is needed.
    doc["spec"]["modelCache"]["type"] = "EmptyDir"
    doc["spec"].update(copy.deepcopy(spec_changes))
    return doc


def apply(cluster, doc: dict, check: bool = True):
    return kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc), check=check)


def get_sds(kube_api, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL, name)


def get_deployment(kube_api, namespace: str, name: str):
    try:
        return client.AppsV1Api(kube_api).read_namespaced_deployment(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def condition(sds: dict, type_: str) -> dict:
    return next((c for c in (sds.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def wait_serving(kube_api, namespace: str, name: str, timeout: float = ROLLOUT_TIMEOUT) -> dict:
    def serving():
        sds = get_sds(kube_api, namespace, name)
        status = sds.get("status") or {}
        fresh = status.get("observedGeneration") == sds["metadata"]["generation"]
        return sds if fresh and status.get("phase") == C.PHASE_SERVING else None

    return poll_until(serving, timeout, f"{namespace}/{name} to be Serving")


def test_crd_passes_kubectl_client_dry_run(cluster, operator):
    done = kubectl(cluster, "apply", "--dry-run=client", "-f", str(REPO / "crds"))
    assert "specdecodeservices.serving.specdecode.io" in done.stdout


def test_sample_becomes_serving_on_fake_gpu_nodes(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    sds = wait_serving(kube_api, namespace, "llama")

    deployment = get_deployment(kube_api, namespace, "llama")
    assert deployment.status.available_replicas == 2
    assert deployment.metadata.owner_references[0].uid == sds["metadata"]["uid"]
    assert client.CoreV1Api(kube_api).read_namespaced_service("llama", namespace).spec.ports[0].port == 8000
    assert client.PolicyV1Api(kube_api).read_namespaced_pod_disruption_budget("llama", namespace)

    pods = client.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector=f"{C.LABEL_SERVICE}=llama").items
    assert len(pods) == 2
    nodes = {n.metadata.name: n for n in client.CoreV1Api(kube_api).list_node().items}
    for pod in pods:
        assert pod.status.phase == "Running"
        assert int(nodes[pod.spec.node_name].status.allocatable["nvidia.com/gpu"]) == 8

    effective = sds["status"]["speculation"]
    assert (effective["enabled"], effective["k"], effective["live"]) == (True, 4, True)
    assert condition(sds, C.COND_READY)["status"] == "True"
    assert condition(sds, C.COND_PROGRESSING)["reason"] == C.REASON_ROLLOUT_COMPLETE

    table = kubectl(cluster, "get", "sds", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "METHOD", "K", "SCHEDULE", "ACCEPTANCE", "P95", "AGE"]
    assert table[1].split()[:4] == ["llama", "Serving", "draft_model", "4"]

    events = kubectl(cluster, "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=SpecDecodeService", "-o", "json").stdout
    assert any(e["reason"] == C.EVENT_APPLIED for e in json.loads(events)["items"])


@pytest.mark.parametrize(
    "change,message",
    [
        ({"speculation": {"method": "eagle3"}}, "draftModel is required"),
        ({"speculation": {"method": "ngram", "draftModel": "x"}}, "draftModel is not used"),
        ({"speculation": {"method": "ngram", "minK": 6, "maxK": 2, "numSpeculativeTokens": 3}}, "minK must not exceed maxK"),
        ({"engine": {"extraArgs": ["--speculative-config={}"]}}, "must not carry speculative flags"),
        ({"speculation": {"method": "ngram", "perBatchSizeK": [{"minBatchSize": 2, "maxBatchSize": 4, "k": 1}]}}, "starting at minBatchSize 1"),
    ],
)
def test_apiserver_rejects_invalid_specs_with_the_cel_message(cluster, operator, namespace, change, message):
    done = apply(cluster, sample_in(namespace, **change), check=False)
    assert done.returncode != 0
    assert message in done.stderr


def test_spec_edits_roll_the_deployment_and_gc_follows_deletion(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    wait_serving(kube_api, namespace, "llama")
    before = get_deployment(kube_api, namespace, "llama")
    old_hash = before.spec.template.metadata.labels[C.LABEL_CONFIG_HASH]

    # A new image and tighter K bounds: K 4 is clamped to maxK 3 and the pods roll.
    spec = sample_in(namespace)["spec"]
    spec["engine"] = {"image": "vllm/vllm-openai:v0.33.0-cu130"}
    spec["speculation"] = {**spec["speculation"], "maxK": 3, "numSpeculativeTokens": 3}
    apply(cluster, sample_in(namespace, **spec))
    sds = wait_serving(kube_api, namespace, "llama")
    after = get_deployment(kube_api, namespace, "llama")
    container = after.spec.template.spec.containers[0]
    assert container.image == "vllm/vllm-openai:v0.33.0-cu130"
    assert json.loads(container.args[container.args.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert after.spec.template.metadata.labels[C.LABEL_CONFIG_HASH] != old_hash
    assert sds["status"]["speculation"]["k"] == 3

    # Scale through the SpecDecodeService's scale subresource, as an HPA would: one replica
    # needs no PodDisruptionBudget, which is then removed.
    kubectl(cluster, "scale", "sds/llama", "-n", namespace, "--replicas=1")
    poll_until(lambda: get_deployment(kube_api, namespace, "llama").spec.replicas == 1, 30, "the Deployment to scale to 1")

    def pdb_gone():
        try:
            client.PolicyV1Api(kube_api).read_namespaced_pod_disruption_budget("llama", namespace)
            return False
        except client.ApiException as err:
            return err.status == 404

    poll_until(pdb_gone, 30, "the PDB to be deleted at one replica")
    # A replica count that alone moves keeps the service Serving (GitOps stays Healthy), so
    # Serving says nothing of the count: wait for status to report the one replica left.
    sds = poll_until(lambda: (s := get_sds(kube_api, namespace, "llama")).get("status", {}).get("replicas") == 1 and s,
                     60, "status.replicas to report the one replica left")
    assert sds["status"]["phase"] == C.PHASE_SERVING

    kubectl(cluster, "delete", "sds", "llama", "-n", namespace, "--wait=false")
    poll_until(lambda: get_deployment(kube_api, namespace, "llama") is None, 60, "garbage collection of the Deployment")


def test_deleted_or_hand_edited_deployment_is_restored(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    wait_serving(kube_api, namespace, "llama")
    first = get_deployment(kube_api, namespace, "llama")

    kubectl(cluster, "delete", "deployment", "llama", "-n", namespace, "--wait=false")
    poll_until(
        lambda: (d := get_deployment(kube_api, namespace, "llama")) is not None and d.metadata.uid != first.metadata.uid,
        30, "the Deployment to be recreated",
    )

    kubectl(cluster, "set", "image", "deployment/llama", "-n", namespace, "vllm=vllm/vllm-openai:hand-edited")
    poll_until(
        lambda: get_deployment(kube_api, namespace, "llama").spec.template.spec.containers[0].image == "vllm/vllm-openai:v0.33.0",
        30, "the hand-edited image to be restored",
    )
    wait_serving(kube_api, namespace, "llama")


def test_steady_state_causes_no_writes(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    wait_serving(kube_api, namespace, "llama")
    # Let the rollout's last events settle: Serving with a live config and no rollout running.
    poll_until(lambda: get_sds(kube_api, namespace, "llama")["status"]["speculation"]["live"], 30, "a live config")

    # Other tests' namespaces are deleted in the background; their cleanup is not steady state.
    core = client.CoreV1Api(kube_api)
    poll_until(lambda: not [n for n in core.list_namespace().items
                            if n.metadata.name.startswith("e2e-") and n.metadata.name != namespace],
               120, "other test namespaces to be gone")

    reconciles_before = operator.total("specdecode_reconciles_total")
    writes_before = operator.total("specdecode_api_writes_total")
    _, audit_mark = audit_writes(cluster, OPERATOR_USER, namespace)
    # Several level-triggered passes over every service (the timer fires each interval).
    poll_until(lambda: operator.total("specdecode_reconciles_total") >= reconciles_before + 10,
             30 * RECONCILE_INTERVAL_S, "ten more reconciles")
    assert operator.total("specdecode_api_writes_total") == writes_before
    writes, _ = audit_writes(cluster, OPERATOR_USER, namespace, since=audit_mark)
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]


def test_spec_the_crd_cannot_catch_degrades_without_touching_children(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace))
    wait_serving(kube_api, namespace, "llama")
    before = get_deployment(kube_api, namespace, "llama")

    # EAGLE-3 exists only from vLLM 0.8.5: valid for the schema, impossible for this image.
    spec = sample_in(namespace)["spec"]
    spec["speculation"] = {"method": "eagle3", "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 3}
    spec["engine"] = {"version": "0.7.3"}
    apply(cluster, sample_in(namespace, **spec))

    def degraded():
        sds = get_sds(kube_api, namespace, "llama")
        cond = condition(sds, C.COND_DEGRADED)
        return sds if cond.get("reason") == C.REASON_INVALID_SPEC and sds["status"]["observedGeneration"] == sds["metadata"]["generation"] else None

    sds = poll_until(degraded, 30, "Degraded/InvalidSpec")
    assert sds["status"]["phase"] == C.PHASE_DEGRADED
    assert "vLLM 0.7.3" in condition(sds, C.COND_DEGRADED)["message"]
    after = get_deployment(kube_api, namespace, "llama")
    assert after.metadata.generation == before.metadata.generation
    assert after.spec.template.spec.containers[0].args == before.spec.template.spec.containers[0].args
