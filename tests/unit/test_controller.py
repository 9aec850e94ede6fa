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
