"""Pods of a speculative config that cannot start, on the real control plane.

vLLM refuses a draft whose vocabulary differs from the target's: the container exits with
that error. Here kwok plays the container: a fault injector in the test marks every pod that
runs a speculative config (the annotation the operator renders on the pod template) with
kwok's start-up failure annotation carrying vLLM's exact error text, so those pods crash-loop
with it as their termination message while pods without speculation start normally.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from specdecode import constants as C
from specdecode.tools.localstack import FAIL_STARTUP_ANNOTATION

from .conftest import poll_until
from .operator_harness import holds_for, kubectl

pytestmark = pytest.mark.e2e

VOCAB_ERROR = (
    "ValueError: Target and draft model should have the same vocabulary size. Target model "
    "vocab_size=152064. Draft model vocab_size=151936. Using models with different tokenizers can "
    "cause out-of-bounds errors during speculative decoding."
)
LIBCUDA_ERROR = "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"


def qwen(namespace: str, **speculation) -> dict:
    return {
        "apiVersion": C.API_VERSION, "kind": C.KIND,
        "metadata": {"name": "qwen", "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
            "speculation": {"method": "draft_model", "draftModel": "Qwen/Qwen2.5-0.5B-Instruct",
                            "numSpeculativeTokens": 3, **speculation},
            "replicas": 2,
            "autotune": {"evaluationInterval": "5s", "reprobeInterval": "20s", "cooldown": "5s"},
            "metrics": {"prometheusUrl": "http://127.0.0.1:9"},
        },
    }


@contextmanager
def failing_pods(kube_api, namespace: str, message: str, speculative_only: bool = True) -> Iterator[threading.Event]:
    """Mark pods (those running speculation, or all) to fail at start-up with `message`."""
    core = client.CoreV1Api(kube_api)
    stop = threading.Event()

    def inject() -> None:
        while not stop.wait(0.2):
            for pod in core.list_namespaced_pod(namespace).items:
                annotations = pod.metadata.annotations or {}
                speculative = annotations.get(C.ANNOTATION_SPECULATION, "off") != "off"
                if FAIL_STARTUP_ANNOTATION in annotations or (speculative_only and not speculative):
                    continue
                try:
                    core.patch_namespaced_pod(pod.metadata.name, namespace,
                                              {"metadata": {"annotations": {FAIL_STARTUP_ANNOTATION: message}}})
                except client.ApiException as err:
                    if err.status != 404:
                        raise

    thread = threading.Thread(target=inject, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=10)


def sds(kube_api, namespace: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL, "qwen")


def condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def args(kube_api, namespace: str) -> list[str]:
    return client.AppsV1Api(kube_api).read_namespaced_deployment("qwen", namespace).spec.template.spec.containers[0].args


def test_vocabulary_mismatch_falls_back_is_remembered_and_a_fixed_spec_clears_it(cluster, kube_api, operator, namespace):
    with failing_pods(kube_api, namespace, VOCAB_ERROR) as injector:
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(qwen(namespace)))

        def fell_back():
            obj = sds(kube_api, namespace)
            cond = condition(obj, C.COND_SPECULATION_EFFECTIVE)
            return obj if cond.get("reason") == C.REASON_STARTUP_FAILURE else None

        obj = poll_until(fell_back, 120, "the fallback after the start-up failure")
        message = condition(obj, C.COND_SPECULATION_EFFECTIVE)["message"]
        assert "VocabMismatch" in message and "vocab_size=152064" in message
        assert "useHeterogeneousVocab" in message  # the fix
        (failed,) = obj["status"]["failedConfigs"]
        assert failed["cause"] == "VocabMismatch"

        # The service comes up without speculation and is Ready.
        poll_until(lambda: "--speculative-config" not in args(kube_api, namespace), 30, "a render without speculation")
        serving = poll_until(lambda: (o := sds(kube_api, namespace))["status"].get("phase") == C.PHASE_SERVING and o,
                             90, "Serving without speculation")
        assert condition(serving, C.COND_READY)["status"] == "True"
        events = kubectl(cluster, "get", "events", "-n", namespace, "-o", "json").stdout
        assert any(e["reason"] == C.REASON_STARTUP_FAILURE for e in yaml.safe_load(events)["items"])

        # Nothing flaps: past the re-probe interval (20s) the failed draft is not tried again.
        apps = client.AppsV1Api(kube_api)
        generation = apps.read_namespaced_deployment("qwen", namespace).metadata.generation
        holds_for(lambda: not sds(kube_api, namespace)["status"]["speculation"]["enabled"]
                  and [h["action"] for h in sds(kube_api, namespace)["status"]["history"]] == ["fallback"]
                  and apps.read_namespaced_deployment("qwen", namespace).metadata.generation == generation,
                  30, "speculation stays off, no second attempt, no new rollout")

        # The user fixes the spec: the memory is cleared and speculation comes back.
        injector.set()
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(qwen(namespace, useHeterogeneousVocab=True)))
    fixed = poll_until(lambda: (o := sds(kube_api, namespace))["status"].get("speculation", {}).get("enabled") and o,
                       60, "speculation back on after the spec was fixed")
    assert fixed["status"]["failedConfigs"] == []
    config = args(kube_api, namespace)
    assert '"use_heterogeneous_vocab":true' in config[config.index("--speculative-config") + 1]


def test_pods_that_crash_without_speculation_degrade_without_toggling(cluster, kube_api, operator, namespace):
    with failing_pods(kube_api, namespace, LIBCUDA_ERROR, speculative_only=False):
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(qwen(namespace)))
        # An unknown failure of speculative pods first gives the benefit of the doubt to
        # speculation (fall back); when the pods without speculation crash as well, the
        # service is Degraded and nothing is toggled back and forth.
        degraded = poll_until(lambda: (o := sds(kube_api, namespace)) and
                              condition(o, C.COND_DEGRADED).get("reason") == C.REASON_STARTUP_FAILURE
                              and not o["status"]["speculation"]["enabled"] and o, 120, "Degraded/StartupFailure")
        assert "libcuda" in condition(degraded, C.COND_DEGRADED)["message"]
        history = [h["action"] for h in degraded["status"]["history"]]
        assert history == ["fallback"]
        assert degraded["status"]["phase"] != C.PHASE_SERVING


def test_preflight_catches_a_vocabulary_mismatch_before_any_pod_starts(cluster, kube_api, operator, namespace):
    """Configs on the model cache (as the pods mount it at /root/.cache/huggingface) show a
    vocabulary mismatch: the draft is never rolled out, DraftCompatible says why and how to
    fix it; with useHeterogeneousVocab the preflight passes and speculation rolls out."""
    import json

    mount = "/root/.cache/huggingface"
    for name, vocab in (("acme-target-7b", 152064), ("acme-draft-0.5b", 151936)):
        folder = operator.model_cache_root / namespace / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": vocab, "hidden_size": 896}))
    doc = qwen(namespace)
    doc["spec"]["model"]["name"] = f"{mount}/{namespace}/acme-target-7b"
    doc["spec"]["speculation"]["draftModel"] = f"{mount}/{namespace}/acme-draft-0.5b"
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))

    obj = poll_until(lambda: (o := sds(kube_api, namespace)).get("status", {}).get("phase") == C.PHASE_SERVING and o,
                     90, "Serving")
    draft = condition(obj, C.COND_DRAFT_COMPATIBLE)
    assert draft["status"] == "False", draft
    assert "152064" in draft["message"] and "useHeterogeneousVocab" in draft["message"]
    assert obj["status"]["speculation"]["enabled"] is False
    assert "--speculative-config" not in args(kube_api, namespace)

    doc["spec"]["speculation"]["useHeterogeneousVocab"] = True
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))
    fixed = poll_until(lambda: (o := sds(kube_api, namespace))["status"]["speculation"]["enabled"] and o, 60,
                       "speculation rolled out once the preflight passes")
    assert condition(fixed, C.COND_DRAFT_COMPATIBLE)["status"] == "True"
    assert "--speculative-config" in args(kube_api, namespace)
