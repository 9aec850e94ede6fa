"""Start-up: every service gets its phase within seconds, whether fifty arrive at once or
several were created while the operator was down (killed, so its peering record stayed).

Before: a discovery cache shared by kopf's threads raised KeyError and kopf retried the
failed handlers a minute later (5 of 50 new services without a phase for 64 s), and a
restarted operator paused for its killed predecessor's peering record (6 of 7 services blank
for 60 s)."""

from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client

from specdecode import constants as C

from ..spec_corpus import document, spec_with
from .conftest import poll_until
from .operator_harness import kubectl

pytestmark = pytest.mark.e2e

# Generous for a shared 2-core machine; the old failure took a minute.
FIFTY_WITHIN_S = 40
SEVEN_WITHIN_S = 20


def _apply_all(cluster, docs: list[dict]) -> None:
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))


def _without_phase(kube_api, namespace: str) -> list[str]:
    items = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL)["items"]
    return [i["metadata"]["name"] for i in items if not (i.get("status") or {}).get("phase")]


def _services(namespace: str, count: int, prefix: str) -> list[dict]:
    # No replicas: the test is about the operator's start, not the scheduler's.
    return [document(spec_with({"replicas": 0}), f"{prefix}{i}", namespace) for i in range(count)]


def test_fifty_new_services_at_once_get_a_phase_within_seconds(cluster, kube_api, operator, namespace):
    started = time.monotonic()
    _apply_all(cluster, _services(namespace, 50, "s"))
    poll_until(lambda: not _without_phase(kube_api, namespace), FIFTY_WITHIN_S,
               "all 50 services to have a phase", interval=0.5)
    print(f"50 new services: all with a phase {time.monotonic() - started:.1f}s after kubectl apply")


def test_services_created_while_the_operator_was_killed_get_a_phase_soon_after_its_restart(
        cluster, kube_api, operator, namespace):
    operator.process.managed.process.kill()  # SIGKILL: its peering record stays behind
    operator.process.managed.process.wait(timeout=10)
    _apply_all(cluster, _services(namespace, 7, "p"))
    operator.restart()  # returns once the new process answers /healthz
    started = time.monotonic()
    poll_until(lambda: not _without_phase(kube_api, namespace), SEVEN_WITHIN_S,
               "the 7 services present at start to have a phase", interval=0.5)
    print(f"7 services present at start: all with a phase {time.monotonic() - started:.1f}s after the operator started")
