"""The controller's pure checks: the operator's own ceiling on replicas."""

from __future__ import annotations

import pytest

from specdecode import api
from specdecode.shell.controller import check_replicas

from ..spec_corpus import spec_with


def test_replicas_above_the_operator_limit_name_the_setting():
    check_replicas(api.parse_spec(spec_with({"replicas": 32})), 32)
    with pytest.raises(api.SpecError, match=r"spec.replicas: 33 is above this operator's limit of 32.*SPECDECODE_MAX_REPLICAS"):
        check_replicas(api.parse_spec(spec_with({"replicas": 33})), 32)
    check_replicas(api.parse_spec(spec_with({"replicas": 200})), None)


class _OneKindFails:
    """The narrowest stand-in for the API: every child is missing, and applying a Service
    fails (a real apiserver does not fail one kind on demand)."""

    def __init__(self):
        self.applied: list[str] = []

    def get(self, api_version, kind, name, namespace):
        return None

    def apply(self, obj):
        from kubernetes.client.exceptions import ApiException

        if obj["kind"] == "Service":
            raise ApiException(status=500, reason="Internal Server Error")
        self.applied.append(obj["kind"])
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}

    def is_served(self, api_version, kind):
        return True


def test_one_failing_child_does_not_stop_the_others():
    from datetime import datetime, timezone

    from specdecode.render import workload as render
    from specdecode.shell.controller import Controller

    service = api.parse_service({"apiVersion": "serving.specdecode.io/v1alpha1", "kind": "SpecDecodeService",
                                 "metadata": {"name": "svc", "namespace": "ns"}, "spec": spec_with({"replicas": 2})})
    objects = render.render_all(service, render.initial_choice(service.spec), owner_uid="u", pod_monitor_served=True)
    kube = _OneKindFails()
    deployment, applied, error = Controller(kube)._apply_children(objects, service, {}, datetime.now(timezone.utc))
    assert "Service" not in applied and {"Deployment", "PodDisruptionBudget", "PodMonitor"} <= set(applied)
    assert error is not None and "applying Service failed: 500" in error
    assert deployment is not None


class _RecordingKube:
    """Records the calls a pass makes; the Deployment and Service exist as last applied (a
    narrow stand-in: the point is which calls a pass makes, not what the apiserver answers)."""

    def __init__(self, body, degraded_apply=False):
        self.calls: list[tuple[str, str]] = []
        self.live: dict[str, dict] = {}
        self.body = body
        if degraded_apply:
            body["status"] = {"conditions": [{"type": "Degraded", "status": "True", "reason": "ApplyFailed",
                                              "message": "x", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}

    def get(self, api_version, kind, name, namespace):
        self.calls.append(("get", kind))
        if kind == "SpecDecodeService":
            return self.body
        return self.live.get(kind)

    def apply(self, obj):
        self.calls.append(("apply", obj["kind"]))
        self.live[obj["kind"]] = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}
        return self.live[obj["kind"]]

    def list(self, api_version, kind, namespace, label_selector=""):
        self.calls.append(("list", kind))
        return []

    def is_served(self, api_version, kind):
        return kind != "PodMonitor"

    def replace_status(self, obj, status):
        self.calls.append(("status", ""))
        self.body = {**self.body, "status": status}

    def post_event(self, owner, type_, reason, message, now):
        self.calls.append(("event", reason))

    def delete(self, api_version, kind, name, namespace):
        self.calls.append(("delete", kind))


def _service_body():
    return {"apiVersion": "serving.specdecode.io/v1alpha1", "kind": "SpecDecodeService",
            "metadata": {"name": "svc", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "5"},
            "spec": spec_with({"replicas": 1})}


def test_a_new_service_is_applied_without_reading_its_children():
    from specdecode.shell.controller import Children, Controller

    kube = _RecordingKube(_service_body())
    assert Controller(kube).reconcile("ns", "svc", Children.new_service()) == "ok"
    reads = [c for c in kube.calls if c[0] in ("get", "list")]
    assert reads == [("get", "SpecDecodeService")]  # no child read, no pod list, no stale check
    assert ("apply", "Deployment") in kube.calls and ("apply", "Service") in kube.calls
    assert ("status", "") in kube.calls and ("event", "Applied") in kube.calls


def test_a_deployment_event_reads_the_deployment_alone_and_a_full_pass_everything():
    from specdecode.shell.controller import Children, Controller

    kube = _RecordingKube(_service_body())
    controller = Controller(kube)
    controller.reconcile("ns", "svc", Children.new_service())
    kube.calls.clear()
    controller.reconcile("ns", "svc", Children.deployment())
    assert [c for c in kube.calls if c[0] == "get"] == [("get", "SpecDecodeService"), ("get", "Deployment")]
    assert not [c for c in kube.calls if c[0] == "apply"]
    kube.calls.clear()
    controller.reconcile("ns", "svc")
    # Every child, and the PDB no longer rendered for one replica (stale check).
    assert {("get", "Deployment"), ("get", "Service"), ("get", "PodDisruptionBudget")} <= set(kube.calls)


def test_a_deployment_event_after_a_failed_apply_looks_at_every_child():
    from specdecode.shell.controller import Children, Controller

    kube = _RecordingKube(_service_body(), degraded_apply=True)
    Controller(kube).reconcile("ns", "svc", Children.deployment())
    assert ("get", "Service") in kube.calls
