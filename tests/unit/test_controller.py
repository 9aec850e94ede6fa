"""The reconcile shell: the operator's own ceiling on replicas, and what one pass writes to
the API (children, status, Events) for a given object, with the API replaced by an in-memory
stand-in (tests/unit/memory_kube.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

import pytest

from specdecode import api
from specdecode import constants as C
from specdecode.shell.controller import check_replicas

from ..spec_corpus import spec_with
from .memory_kube import MemoryKube


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
    from specdecode.render import workload as render
    from specdecode.shell.controller import Controller

    service = api.parse_service({"apiVersion": "serving.specdecode.io/v1alpha1", "kind": "SpecDecodeService",
                                 "metadata": {"name": "svc", "namespace": "ns"}, "spec": spec_with({"replicas": 2})})
    objects = render.render_all(service, render.initial_choice(service.spec), owner_uid="u", pod_monitor_served=True)
    kube = _OneKindFails()
    live = Controller(kube)._apply_children(objects, service, {}, datetime.now(timezone.utc))
    assert "Service" not in live.applied and {"Deployment", "PodDisruptionBudget", "PodMonitor"} <= set(live.applied)
    assert live.error is not None and "applying Service failed: 500" in live.error
    assert live.deployment is not None


# ------------------------------------------------------------------ what one reconcile writes

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
SPEC = spec_with({"replicas": 2})


def _controller(kube, max_replicas=None):
    from specdecode.shell.controller import Controller

    return Controller(kube, clock=lambda: T0, max_replicas=max_replicas)


def _reconciled(max_replicas=None):
    """A new service after its first reconcile."""
    kube = MemoryKube()
    kube.create_service(SPEC)
    controller = _controller(kube, max_replicas)
    assert controller.reconcile("team-a", "llama") == "ok"
    return kube, controller


def _writes_nothing(kube, controller, outcome="ok"):
    before = kube.writes.count()
    assert controller.reconcile("team-a", "llama") == outcome
    assert kube.writes.count() == before


def _ready(kube, replicas=2):
    """The Deployment controller's report that every replica of the rendered template is Ready."""
    deployment = kube.get("apps/v1", "Deployment", "llama", "team-a")
    kube.set_child_status("apps/v1", "Deployment", "llama", "team-a", {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": replicas,
        "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas})


def _condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_a_new_service_gets_its_children_a_progressing_status_and_one_applied_event():
    kube, _ = _reconciled()
    assert {"Deployment", "Service", "PodDisruptionBudget", "PodMonitor"} <= set(kube.writes.applied)
    [status] = kube.writes.status
    assert status["phase"] == "Progressing"
    assert status["speculation"]["enabled"] is True and status["speculation"]["live"] is False
    assert _condition(status, "Ready")["status"] == "False"
    [event] = kube.writes.events
    assert event[:2] == ("Normal", C.EVENT_APPLIED) and "Deployment" in event[2]


def test_a_pass_with_nothing_new_writes_nothing():
    _writes_nothing(*_reconciled())


def test_a_ready_rollout_turns_the_service_serving_without_applying_anything():
    kube, controller = _reconciled()
    _ready(kube)
    applied, events = len(kube.writes.applied), len(kube.writes.events)
    controller.reconcile("team-a", "llama")
    status = kube.service()["status"]
    assert status["phase"] == "Serving" and status["readyReplicas"] == 2
    assert status["speculation"]["live"] is True and status["speculation"]["liveSince"]
    assert _condition(status, "Ready")["status"] == "True"
    assert len(kube.writes.applied) == applied and len(kube.writes.events) == events
    _writes_nothing(kube, controller)


def test_a_bad_edit_is_reported_once_and_leaves_the_children_alone():
    kube, controller = _reconciled(max_replicas=4)
    _ready(kube)
    controller.reconcile("team-a", "llama")
    deployment = kube.get("apps/v1", "Deployment", "llama", "team-a")
    kube.edit_spec({"replicas": 5})
    before = len(kube.writes.events)
    assert controller.reconcile("team-a", "llama") == "invalid_spec"
    [event] = kube.writes.events[before:]
    assert event[:2] == ("Warning", C.EVENT_INVALID_SPEC) and "spec.replicas: 5" in event[2]
    status = kube.service()["status"]
    assert "spec.replicas: 5" in " ".join(c.get("message", "") for c in status["conditions"])
    assert kube.get("apps/v1", "Deployment", "llama", "team-a") == deployment
    _writes_nothing(kube, controller, "invalid_spec")


def test_a_deleted_service_loses_its_operator_metrics():
    from prometheus_client import REGISTRY

    from specdecode.shell import instrumentation

    kube, controller = _reconciled()
    instrumentation.record_decision("team-a", "llama", "disable", "Auto")
    instrumentation.record_decision("team-a", "other", "disable", "Auto")
    labels = {"namespace": "team-a", "specdecode_service": "llama"}
    assert REGISTRY.get_sample_value("specdecode_speculation_enabled", labels) == 1
    assert REGISTRY.get_sample_value("specdecode_decisions_total", {**labels, "action": "disable", "mode": "Auto"}) == 1
    del kube.objects[(C.API_VERSION, C.KIND, "team-a", "llama")]
    assert controller.reconcile("team-a", "llama") == "gone"
    assert REGISTRY.get_sample_value("specdecode_speculation_enabled", labels) is None
    assert REGISTRY.get_sample_value("specdecode_decisions_total", {**labels, "action": "disable", "mode": "Auto"}) is None
    other = {"namespace": "team-a", "specdecode_service": "other", "action": "disable", "mode": "Auto"}
    assert REGISTRY.get_sample_value("specdecode_decisions_total", other) == 1
    instrumentation.forget_service("team-a", "other")


# ------------------------------------------------------- the calls each kind of pass makes


def test_a_new_service_is_applied_without_reading_its_children():
    from specdecode.shell.controller import Children

    kube = MemoryKube()
    kube.create_service(SPEC)
    assert _controller(kube).reconcile("team-a", "llama", Children.new_service()) == "ok"
    assert kube.read_log == [("get", C.KIND)]  # no child read, no pod list, no stale check
    assert {"Deployment", "Service"} <= set(kube.writes.applied)
    assert kube.writes.status and kube.writes.events[0][1] == C.EVENT_APPLIED


def test_a_deployment_event_reads_the_deployment_alone_and_a_full_pass_everything():
    from specdecode.shell.controller import Children

    kube, controller = _reconciled()
    kube.read_log.clear()
    applied_before = len(kube.writes.applied)
    controller.reconcile("team-a", "llama", Children.deployment())
    assert [r for r in kube.read_log if r[0] == "get"] == [("get", C.KIND), ("get", "Deployment")]
    assert len(kube.writes.applied) == applied_before
    kube.read_log.clear()
    controller.reconcile("team-a", "llama")
    assert {("get", "Deployment"), ("get", "Service"), ("get", "PodDisruptionBudget")} <= set(kube.read_log)


class _Watch(Mapping):
    """kopf's view of a service: one mapping whose whole body its watch swaps as events arrive."""

    def __init__(self, body):
        self.body = body

    def __getitem__(self, key):
        return self.body[key]

    def __iter__(self):
        return iter(self.body)

    def __len__(self):
        return len(self.body)


def _followed():
    """A new service after its first reconcile, followed as kopf's handlers follow it."""
    kube, controller = _reconciled()
    watch = _Watch(kube.service())
    controller.follow(watch)
    return kube, controller, watch


def test_a_deployment_event_of_a_followed_service_turns_it_serving_without_a_read():
    from specdecode.shell.controller import Children

    kube, controller, _ = _followed()
    _ready(kube)
    event = kube.get("apps/v1", "Deployment", "llama", "team-a")
    kube.read_log.clear()
    assert controller.reconcile("team-a", "llama", Children.deployment(event)) == "ok"
    assert kube.read_log == []  # the service from kopf's view, the Deployment from its event
    assert kube.service()["status"]["phase"] == "Serving"


def test_a_deployment_event_with_counts_alone_soon_after_a_write_writes_nothing():
    """Each Deployment sends 3 to 5 events as its pods start; written one by one, 500 new
    services made 2,270 status writes instead of 1,250 and were Serving 30 s later. Counts
    alone wait (up to COUNTS_WRITE_INTERVAL_S, or the periodic pass); Serving does not."""
    from datetime import timedelta

    from specdecode.shell.controller import COUNTS_WRITE_INTERVAL_S, Children, Controller

    kube = MemoryKube()
    kube.create_service(SPEC)
    now = [T0]
    controller = Controller(kube, clock=lambda: now[0])
    assert controller.reconcile("team-a", "llama") == "ok"  # Progressing, 0/2 updated
    statuses = len(kube.writes.status)

    def event(**status) -> str:
        kube.set_child_status("apps/v1", "Deployment", "llama", "team-a", {"observedGeneration": 1, **status})
        return controller.reconcile("team-a", "llama", Children.deployment())

    now[0] = T0 + timedelta(seconds=2)
    event(replicas=2, updatedReplicas=1)
    assert len(kube.writes.status) == statuses  # counts alone, 2 s after the last write
    now[0] = T0 + timedelta(seconds=2 + COUNTS_WRITE_INTERVAL_S)
    event(replicas=2, updatedReplicas=2)
    assert len(kube.writes.status) == statuses + 1  # counts alone, but the last write is older
    assert "2/2 updated" in _condition(kube.service()["status"], C.COND_PROGRESSING)["message"]
    now[0] += timedelta(seconds=1)
    event(replicas=2, updatedReplicas=2, readyReplicas=2, availableReplicas=2)
    assert kube.service()["status"]["phase"] == "Serving"  # at once

    now[0] += timedelta(seconds=1)
    written = len(kube.writes.status)
    event(replicas=2, updatedReplicas=2, readyReplicas=1, availableReplicas=2)  # a pod not ready for now
    assert len(kube.writes.status) == written and kube.service()["status"]["readyReplicas"] == 2
    assert controller.reconcile("team-a", "llama") == "ok"  # the periodic pass writes counts at once
    assert len(kube.writes.status) == written + 1 and kube.service()["status"]["readyReplicas"] == 1


def test_a_late_deployment_event_is_not_taken_for_the_deployment_and_serving_stays():
    from specdecode.shell.controller import Children

    kube, controller, watch = _followed()
    late = kube.get("apps/v1", "Deployment", "llama", "team-a")  # before its pods were ready
    _ready(kube)
    controller.reconcile("team-a", "llama")
    watch.body = kube.service()
    assert watch.body["status"]["phase"] == "Serving"
    kube.read_log.clear()
    controller.reconcile("team-a", "llama", Children.deployment(late))
    assert ("get", "Deployment") in kube.read_log
    assert kube.service()["status"]["phase"] == "Serving"


def test_an_edit_the_watch_has_not_shown_yet_is_read_when_the_status_write_conflicts():
    from specdecode.shell.controller import Children

    kube, controller, _ = _followed()  # kopf's view stays at the first pass
    kube.edit_spec({"replicas": 3})
    _ready(kube)
    event = kube.get("apps/v1", "Deployment", "llama", "team-a")
    assert controller.reconcile("team-a", "llama", Children.deployment(event)) == "ok"
    assert kube.get("apps/v1", "Deployment", "llama", "team-a")["spec"]["replicas"] == 3
    assert kube.service()["status"]["observedGeneration"] == 2


def test_a_deployment_event_after_a_failed_apply_looks_at_every_child():
    from specdecode.shell.controller import Children

    kube = MemoryKube()
    kube.create_service(SPEC, status={"conditions": [{
        "type": "Degraded", "status": "True", "reason": C.REASON_APPLY_FAILED, "message": "x",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    _controller(kube).reconcile("team-a", "llama", Children.deployment())
    assert ("get", "Service") in kube.read_log


# ------------------------------------------------------------- a canary experiment's children

EXPERIMENT_SPEC = spec_with({"replicas": 3, "rollout": {"maxSurge": 0, "maxUnavailable": 1},
                             "speculation": {"method": "ngram", "numSpeculativeTokens": 3}})


def _running_record(spec: dict, k: int = 5, **changes) -> dict:
    """A Running experiment record as the control loop writes it: the candidate's config hash
    is the one the canary's pods carry."""
    from specdecode.render import workload as render

    parsed = api.parse_spec(spec)
    record = api.ExperimentRecord(
        purpose="Change", candidate=f"ngram K={k}", candidate_enabled=True, candidate_k=k,
        candidate_hash=render.config_hash(parsed, render.SpeculationChoice(k=k)),
        incumbent_hash=render.config_hash(parsed, render.SpeculationChoice(k=3)),
        started_at="2026-11-30T11:59:00Z")
    return {**record.to_wire(), **changes}


def _experimenting(spec: dict = EXPERIMENT_SPEC, **record_changes):
    """A serving service whose status names a running experiment, after one reconcile."""
    kube = MemoryKube()
    kube.create_service(spec)
    controller = _controller(kube)
    controller.reconcile("team-a", "llama")
    _ready(kube, replicas=3)
    controller.reconcile("team-a", "llama")
    _set_experiments(kube, [_running_record(spec, **record_changes)])
    assert controller.reconcile("team-a", "llama") == "ok"
    return kube, controller


def _set_experiments(kube, records):
    body = kube.objects[(C.API_VERSION, C.KIND, "team-a", "llama")]
    body["status"] = {**body["status"], "experiments": records}
    body["metadata"]["resourceVersion"] = kube._next_version()


def _deployment(kube, name="llama"):
    return kube.get("apps/v1", "Deployment", name, "team-a")


def test_a_running_experiment_gets_its_canary_and_the_main_deployment_lends_it_a_replica():
    kube, controller = _experimenting()
    canary, main = _deployment(kube, "llama-canary"), _deployment(kube)
    assert canary["spec"]["replicas"] == 1 and main["spec"]["replicas"] == 2  # capacity-neutral: 3 in all
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert canary["metadata"]["labels"][C.LABEL_CANARY] == "true"
    assert '"num_speculative_tokens":5' in " ".join(canary["spec"]["template"]["spec"]["containers"][0]["args"])
    assert '"num_speculative_tokens":3' in " ".join(main["spec"]["template"]["spec"]["containers"][0]["args"])
    assert kube.writes.events[-1][:2] == ("Normal", C.EVENT_APPLIED)
    # Unchanged: the next passes, full or on a Deployment event, apply nothing.
    _writes_nothing(kube, controller)
    from specdecode.shell.controller import Children
    before = kube.writes.count()
    controller.reconcile("team-a", "llama", Children.deployment())
    assert kube.writes.count() == before


def test_status_replicas_count_the_canarys_pods_and_the_phase_the_main_deployments():
    kube, controller = _experimenting()
    _ready(kube, replicas=2)
    canary = _deployment(kube, "llama-canary")
    kube.set_child_status("apps/v1", "Deployment", "llama-canary", "team-a", {
        "observedGeneration": canary["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 0, "availableReplicas": 0})
    controller.reconcile("team-a", "llama")
    status = kube.service()["status"]
    assert (status["replicas"], status["readyReplicas"]) == (3, 2)
    assert status["phase"] == "Serving"  # the main Deployment serves; the canary is still starting


def test_a_deleted_or_edited_canary_is_applied_again_on_its_deployment_event():
    from specdecode.shell.controller import Children

    kube, controller = _experimenting()
    kube.delete("apps/v1", "Deployment", "llama-canary", "team-a")
    controller.reconcile("team-a", "llama", Children.deployment())
    assert _deployment(kube, "llama-canary")["spec"]["replicas"] == 1
    kube.objects[("apps/v1", "Deployment", "team-a", "llama-canary")]["spec"]["replicas"] = 4  # kubectl scale
    controller.reconcile("team-a", "llama", Children.deployment())
    assert _deployment(kube, "llama-canary")["spec"]["replicas"] == 1


def test_the_canary_goes_and_the_main_deployment_gets_its_replicas_back_when_the_experiment_ends():
    kube, controller = _experimenting()
    ended = _running_record(EXPERIMENT_SPEC, verdict="AbortWorse", endedAt="2026-11-30T12:00:00Z",
                            reason="the canary is 9.0% slower per token")
    _set_experiments(kube, [ended])
    controller.reconcile("team-a", "llama")
    assert _deployment(kube, "llama-canary") is None and "Deployment" in kube.writes.deleted
    assert _deployment(kube)["spec"]["replicas"] == 3
    # Known gone: later passes neither read nor delete it again.
    kube.read_log.clear()
    _writes_nothing(kube, controller)
    assert ("get", "Deployment") in kube.read_log and kube.read_log.count(("get", "Deployment")) == 1


def test_a_canary_left_behind_by_a_killed_operator_is_deleted_by_the_next_one():
    kube, _ = _experimenting()
    _set_experiments(kube, [_running_record(EXPERIMENT_SPEC, verdict="Promote", endedAt="2026-11-30T12:00:00Z")])
    fresh = _controller(kube)  # a new process: nothing remembered
    fresh.reconcile("team-a", "llama")
    assert _deployment(kube, "llama-canary") is None


def _crash_looping_canary_pod(kube, spec: dict, k: int = 5):
    from specdecode.render import workload as render

    labels = {**render.child_labels("llama"), C.LABEL_CANARY: "true",
              C.LABEL_CONFIG_HASH: render.config_hash(api.parse_spec(spec), render.SpeculationChoice(k=k))}
    terminated = {"terminated": {"exitCode": 1, "reason": "OOMKilled", "message": "",
                                 "finishedAt": "2026-11-30T11:59:50Z"}}
    kube.objects[("v1", "Pod", "team-a", "llama-canary-abc")] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llama-canary-abc", "namespace": "team-a", "labels": labels,
                     "creationTimestamp": "2026-11-30T11:59:00Z"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                   "containerStatuses": [{"name": C.VLLM_CONTAINER_NAME, "ready": False, "restartCount": 4,
                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                          "lastState": terminated}]}}
    canary = _deployment(kube, "llama-canary")
    kube.set_child_status("apps/v1", "Deployment", "llama-canary", "team-a", {
        "observedGeneration": canary["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 0, "availableReplicas": 0})


def test_a_canary_whose_pods_cannot_start_cancels_the_experiment_once():
    from specdecode.shell.controller import Children

    kube, controller = _experimenting()
    _crash_looping_canary_pod(kube, EXPERIMENT_SPEC)
    events = len(kube.writes.events)
    controller.reconcile("team-a", "llama", Children.deployment())  # the canary's own event
    [record] = kube.service()["status"]["experiments"]
    assert record["verdict"] == "Cancelled" and record["endedAt"]
    assert "canary's pods cannot start" in record["reason"] and "OOMKilled" in record["reason"]
    assert [e[:2] for e in kube.writes.events[events:]].count(("Warning", C.EVENT_EXPERIMENT_CANCELLED)) == 1
    assert _deployment(kube, "llama-canary") is None and _deployment(kube)["spec"]["replicas"] == 3
    assert kube.service()["status"]["speculation"]["k"] == 3  # the main Deployment's config is untouched
    _writes_nothing(kube, controller)


def test_a_spec_that_no_longer_allows_the_experiment_cancels_it_before_anything_is_applied():
    kube, controller = _experimenting()
    kube.edit_spec({"replicas": 1})  # nothing left to lend the canary
    controller.reconcile("team-a", "llama")
    [record] = kube.service()["status"]["experiments"]
    assert record["verdict"] == "Cancelled" and "spec.replicas >= 2" in record["reason"]
    assert _deployment(kube)["spec"]["replicas"] == 1 and _deployment(kube, "llama-canary") is None


def test_a_spec_edit_that_changes_the_candidate_cancels_the_experiment():
    kube, controller = _experimenting()
    kube.edit_spec({"engine": {"maxNumSeqs": 64}})  # every config hash moves
    applied = len(kube.writes.applied)
    controller.reconcile("team-a", "llama")
    [record] = kube.service()["status"]["experiments"]
    assert record["verdict"] == "Cancelled" and "candidate" in record["reason"]
    assert "Deployment" in kube.writes.applied[applied:]  # the main, at its full replicas
    assert _deployment(kube, "llama-canary") is None

def test_a_new_service_over_the_size_bound_gets_invalid_spec_an_event_and_no_children():
    from ..spec_corpus import spec_over

    kube = MemoryKube()
    kube.create_service(spec_over(300 * 1024))
    controller = _controller(kube)
    assert controller.reconcile("team-a", "llama") == "invalid_spec"
    assert kube.writes.applied == []
    [event] = kube.writes.events
    assert event[:2] == ("Warning", C.EVENT_INVALID_SPEC) and event[2].startswith("spec.pod.volumes: ")
    degraded = _condition(kube.service()["status"], C.COND_DEGRADED)
    assert degraded["status"] == "True" and degraded["reason"] == C.REASON_INVALID_SPEC
    assert "over the 256 KiB a spec may take" in degraded["message"]
    _writes_nothing(kube, controller, "invalid_spec")
