"""Drift is a difference of content: what the operator would apply is missing from the live
object, whoever changed it and whatever managedFields say."""

from __future__ import annotations

import copy

import pytest

from specdecode import api
from specdecode.render import workload as render
from specdecode.shell.kube import content_drift

from ..spec_corpus import spec_with


@pytest.fixture
def rendered() -> list[dict]:
    service = api.parse_service({
        "apiVersion": "serving.specdecode.io/v1alpha1", "kind": "SpecDecodeService",
        "metadata": {"name": "svc", "namespace": "team-a"},
        "spec": spec_with({"replicas": 2, "resources": {"gpus": 1, "cpu": "8"}}),
    })
    return render.render_all(service, render.initial_choice(service.spec), owner_uid="u-1", pod_monitor_served=True)


def live_of(obj: dict) -> dict:
    """The object as the apiserver returns it: defaults filled in, quantities as strings,
    managedFields and a resourceVersion, a foreign annotation beside ours."""
    live = copy.deepcopy(obj)
    live["metadata"].update(resourceVersion="7", uid="x", managedFields=[{"manager": "kubectl", "operation": "Update"}])
    live["metadata"]["annotations"]["team.example/owner"] = "someone"
    if obj["kind"] == "Deployment":
        pod = live["spec"]["template"]["spec"]
        pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
        container = pod["containers"][0]
        container.update(terminationMessagePath="/dev/termination-log")
        limits = container["resources"]["limits"]
        limits.update({k: str(v) for k, v in limits.items()})
        pod["tolerations"].append({"key": "extra", "operator": "Exists"})
        pod["containers"][0]["env"].insert(0, {"name": "FOREIGN", "value": "1"})
    if obj["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.7", sessionAffinity="None")
    return live


def test_defaults_foreign_annotations_and_foreign_list_items_are_not_drift(rendered):
    for obj in rendered:
        live = live_of(obj)
        if obj["kind"] == "Deployment":
            # An atomic list (tolerations) is ours whole: an added item is drift, ...
            assert content_drift(obj, live) == ".spec.template.spec.tolerations"
            live["spec"]["template"]["spec"]["tolerations"].pop()
        # ... an env var someone added beside ours (merged by name) is not.
        assert content_drift(obj, live) is None, obj["kind"]


def test_scale_of_the_deployment_is_drift(rendered):
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    live = live_of(deployment)
    live["spec"]["template"]["spec"]["tolerations"].pop()
    live["spec"]["replicas"] = 5
    assert content_drift(deployment, live) == ".spec.replicas"


def test_hand_edited_service_port_is_drift(rendered):
    service = next(o for o in rendered if o["kind"] == "Service")
    live = live_of(service)
    live["spec"]["ports"][0]["port"] = 8080
    assert content_drift(service, live) == ".spec.ports[8000/TCP]"


def test_changed_value_and_missing_field_are_drift(rendered):
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    live = live_of(deployment)
    live["spec"]["template"]["spec"]["tolerations"].pop()
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "hand-edited"
    assert content_drift(deployment, live) == ".spec.template.spec.containers[vllm].image"
    live = live_of(deployment)
    del live["spec"]["template"]["spec"]["enableServiceLinks"]
    assert content_drift(deployment, live) == ".spec.template.spec.enableServiceLinks"
    live = live_of(deployment)
    live["spec"]["template"]["spec"]["volumes"][1].pop("emptyDir", None)
    live["spec"]["template"]["spec"]["volumes"][1].pop("persistentVolumeClaim", None)
    assert content_drift(deployment, live) is not None
