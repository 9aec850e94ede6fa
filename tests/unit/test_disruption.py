"""Safe by default (issue 57): no default rolls a change out below what carries the load, and
a one-replica service is never taken fully down unless its spec says so."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from prometheus_client import REGISTRY

from specdecode import api, constants as C
from specdecode.control import disruption, evaluation, failures
from specdecode.control import state as cs
from specdecode.control import status as st
from specdecode.control.decision import Action, Held
from specdecode.control.estimates import PolicyObservations
from specdecode.control.perfmodel import Workload
from specdecode.control.settings import PolicySettings
from specdecode.control.step import step
from specdecode.shell import instrumentation
from specdecode.timestamps import rfc3339

from .test_policy import NOW, both, observe, on

COLLAPSED = Workload(6, 1000, 300, 0, 0.2)
"""Acceptance far below the draft model's floor (0.35): every policy turns speculation off."""


def _spec(**fields) -> api.SpecDecodeServiceSpec:
    """A draft-model service with the API's defaults; ``section__key=value`` sets one field
    of a section, ``section=value`` a whole one."""
    doc: dict = {"model": {"name": "m"}, "speculation": {"method": "draft_model", "draftModel": "d",
                                                          "numSpeculativeTokens": 3}}
    for path, value in fields.items():
        section, _, key = path.partition("__")
        if key:
            doc.setdefault(section, {})[key] = value
        else:
            doc[section] = value
    return api.parse_spec(doc)


def _status(spec: api.SpecDecodeServiceSpec) -> api.SpecDecodeServiceStatus:
    at = datetime.fromtimestamp(NOW - 7200, timezone.utc)
    return api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, k=3, method="draft_model", since=rfc3339(at), live_since=rfc3339(at), config_hash="abc",
        live=True, spec_hash=st.declared_speculation_hash(spec)))


def _evaluate(spec: api.SpecDecodeServiceSpec, observed: PolicyObservations) -> evaluation.EvaluationResult:
    now = datetime.fromtimestamp(NOW, timezone.utc)
    settings = PolicySettings.from_spec(spec)
    return evaluation.evaluate(_status(spec), spec, settings, observed, 1, now)


def test_the_api_default_is_a_one_replica_service_that_allows_no_outage():
    settings = PolicySettings.from_spec(_spec())
    assert (settings.replicas, settings.max_surge, settings.max_unavailable) == (1, 0, 1)
    assert settings.allow_outages is False
    assert disruption.serving_during_rollout(settings) == 0


def test_a_collapse_on_a_default_one_replica_service_is_recommended_not_rolled_out():
    result = _evaluate(_spec(), both(COLLAPSED, 3))
    decision = result.decision
    assert decision.action is Action.DISABLE and not decision.applied
    assert decision.held is Held.OUTAGE and decision.wanted in ("floor", "collapse")
    assert "fully down" in decision.reason and "allowOutages" in decision.reason and "maxSurge: 1" in decision.reason
    # Nothing restarts: the running config stays, and status says what it would do.
    assert result.rerender is False
    assert result.status.speculation.enabled is True and result.status.speculation.k == 3
    assert result.status.recommendation.action == "disable"
    assert result.events and result.events[0][1] == C.EVENT_RECOMMENDATION


def test_allow_outages_lets_the_same_collapse_turn_speculation_off():
    result = _evaluate(_spec(autotune__allowOutages=True), both(COLLAPSED, 3))
    assert result.decision.action is Action.DISABLE and result.decision.applied
    assert result.rerender is True and result.status.speculation.enabled is False


def test_a_surge_rollout_keeps_every_replica_serving_and_acts():
    spec = _spec(rollout={"maxSurge": 1, "maxUnavailable": 0})
    result = _evaluate(spec, both(COLLAPSED, 3))
    assert result.decision.applied and result.rerender


@pytest.mark.parametrize("allow_outages", [False, True])
def test_two_replicas_restart_while_one_carries_the_load_and_wait_when_it_cannot(allow_outages):
    settings = PolicySettings.from_spec(_spec(replicas=2, autotune__allowOutages=allow_outages))
    light = step(settings, on(3), both(replace(COLLAPSED, request_rate=1.0), 3), NOW)[0]
    assert light.action is Action.DISABLE and light.applied
    capacity = {p.k: p.capacity_rps for p in light.predictions}
    one_replica = min(capacity[3], capacity[0]) / 2
    # At 90 % of what the replica left serving carries, the rollout costs latency: priced, allowed.
    near = step(settings, on(3), both(replace(COLLAPSED, request_rate=0.9 * one_replica), 3), NOW)[0]
    assert near.action is Action.DISABLE and near.applied
    # At 104 % its queue would grow for the whole rollout: only allowOutages lets the floor through.
    over = step(settings, on(3), both(replace(COLLAPSED, request_rate=1.04 * one_replica), 3), NOW)[0]
    assert over.action is Action.DISABLE and over.applied is allow_outages
    if not allow_outages:
        assert over.held is Held.OUTAGE
        assert "the 1 of 2 replicas left serving during the rollout would carry 104%" in over.reason


def test_a_bounds_fix_the_user_asked_for_is_not_held():
    spec = _spec(speculation={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2, "maxK": 2})
    decision = step(PolicySettings.from_spec(spec), on(3), both(Workload(2, 1000, 300, 0, 0.8), 3), NOW)[0]
    assert decision.rule == "bounds" and decision.applied


@pytest.mark.parametrize("fields, status, reason", [
    ({}, False, "ChangesAreRecommendations"),
    ({"autotune__allowOutages": True}, True, "OutagesAllowed"),
    ({"replicas": 2, "autotune__allowOutages": True}, True, "OverloadAllowed"),
    ({"replicas": 2}, False, "ChangesWaitForCapacity"),
    ({"rollout": {"maxSurge": 1, "maxUnavailable": 0}, "autotune__allowOutages": True}, False, "RolloutKeepsCapacity"),
    ({"autotune__mode": "Recommend", "autotune__allowOutages": True}, False, "AutotuneNotActing"),
])
def test_the_outage_risk_condition_follows_the_spec(fields, status, reason):
    spec = _spec(**fields)
    risk = disruption.outage_risk(PolicySettings.from_spec(spec), spec.autotune.mode == api.AutotuneMode.AUTO)
    assert (risk.status, risk.reason) == (status, reason)
    if status:
        assert "maxSurge: 1" in risk.message


@pytest.mark.parametrize("allow_outages", [False, True])
def test_a_control_canary_that_borrows_a_replica_waits_for_a_load_the_other_carries(allow_outages):
    settings = PolicySettings.from_spec(_spec(replicas=2, autotune__allowOutages=allow_outages))
    unchanged_for_a_week = replace(on(3, since=NOW - 200 * 3600, live=NOW - 199 * 3600), config_hash="abc")
    good = Workload(1, 1000, 300, 0, 0.9)
    quiet = step(settings, unchanged_for_a_week, both(replace(good, request_rate=2.0), 3), NOW)[1]
    assert [x.purpose.value for x in quiet.experiments] == ["Control"]
    # At 20.5 req/s the replica left serving while the canary starts would carry 104 % of its capacity.
    decision, busy = step(settings, unchanged_for_a_week, both(replace(good, request_rate=20.5), 3), NOW)
    if allow_outages:
        assert [x.purpose.value for x in busy.experiments] == ["Control"]
    else:
        assert busy.experiments == ()
        assert "no canary experiment with off now: at 20.50 req/s the 1 replica(s) left serving" in decision.reason


def test_the_slo_condition_reports_a_breach_and_whether_the_operator_acts():
    spec = _spec(autotune__slo={"p95EndToEnd": "1s"}, autotune__allowOutages=True)
    slow = PolicyObservations.of(observe(COLLAPSED, 3, 300, p95_e2e=30.0), observe(COLLAPSED, 3, 75, p95_e2e=30.0))
    result = _evaluate(spec, slow)
    slo = st.get_condition(result.status.conditions, C.COND_SLO_MET)
    assert slo.status == "False" and slo.reason == C.REASON_SLO_BREACHED
    assert "end-to-end latency is over its 1.00s objective" in slo.message and "changing speculation" in slo.message
    quick = PolicyObservations.of(observe(COLLAPSED, 3, 300, p95_e2e=0.5), None)
    ok = _evaluate(spec, quick)
    assert st.get_condition(ok.status.conditions, C.COND_SLO_MET).status == "True"


def test_without_an_slo_there_is_no_slo_condition():
    result = _evaluate(_spec(), both(COLLAPSED, 3))
    assert st.get_condition(result.status.conditions, C.COND_SLO_MET) is None


def _pod(name: str, **status) -> dict:
    return {"metadata": {"name": name, "labels": {}}, "status": status}


def test_pods_waiting_name_the_scheduler_and_the_kubelet_in_their_own_words():
    unschedulable = _pod("svc-1", phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": '0/3 nodes are available: persistentvolumeclaim "models" not found.'}])
    pulling = _pod("svc-2", phase="Pending", containerStatuses=[{
        "name": "vllm", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}])
    starting = _pod("svc-0", phase="Pending", containerStatuses=[{
        "name": "vllm", "state": {"waiting": {"reason": "ContainerCreating"}}}])
    assert failures.pods_waiting([starting]) is None
    assert failures.pods_waiting([pulling, unschedulable, starting]) == (
        "Unschedulable", 'pod svc-1: 0/3 nodes are available: persistentvolumeclaim "models" not found.')
    assert failures.pods_waiting([pulling]) == ("ImagePullBackOff", "pod svc-2: Back-off pulling image")


def test_ready_says_why_pods_wait():
    spec = _spec()
    outcome = st.ReconcileOutcome(
        rollout=st.RolloutState(exists=True, desired=1, replicas=1, updated=1, ready=0, available=0,
                                observed=True, config_matches=True),
        choice=cs.choose(spec, api.SpecDecodeServiceStatus())[0], config_hash="abc", method="draft_model",
        pods_waiting=("Unschedulable", 'pod svc-1: persistentvolumeclaim "models" not found'),
    )
    new = st.next_status(api.SpecDecodeServiceStatus(), outcome, spec, 1, datetime.fromtimestamp(NOW, timezone.utc))
    ready = st.get_condition(new.conditions, C.COND_READY)
    assert ready.status == "False" and ready.reason == "Unschedulable"
    assert ready.message == '0/1 replicas available: pod svc-1: persistentvolumeclaim "models" not found'
    risk = st.get_condition(new.conditions, C.COND_OUTAGE_RISK)
    assert risk.status == "False" and risk.reason == "ChangesAreRecommendations"


def _sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_phase_and_condition_metrics_follow_status_and_drop_an_old_reason():
    instrumentation.record_status("ns-m", "svc-m", "Degraded", [("Degraded", "True", "InvalidSpec")])
    labels = {"namespace": "ns-m", C.PROM_LABEL_SERVICE: "svc-m"}
    assert _sample("specdecode_service_phase", **labels, phase="Degraded") == 1
    assert _sample("specdecode_service_phase", **labels, phase="Serving") == 0
    assert _sample("specdecode_service_condition", **labels, type="Degraded", status="True", reason="InvalidSpec") == 1
    instrumentation.record_status("ns-m", "svc-m", "Serving", [("Degraded", "False", "AsExpected")])
    assert _sample("specdecode_service_condition", **labels, type="Degraded", status="True", reason="InvalidSpec") is None
    assert _sample("specdecode_service_condition", **labels, type="Degraded", status="False", reason="AsExpected") == 1
    instrumentation.forget_service("ns-m", "svc-m")
    assert _sample("specdecode_service_phase", **labels, phase="Serving") is None
    assert _sample("specdecode_service_condition", **labels, type="Degraded", status="False", reason="AsExpected") is None


def _service_file(tmp_path, **spec_fields) -> str:
    import yaml

    spec = {"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 3}, **spec_fields}
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": f"{C.GROUP}/{C.VERSION}", "kind": C.KIND,
                                    "metadata": {"name": "a", "namespace": "b"}, "spec": spec}))
    return str(path)


@pytest.mark.parametrize("spec_fields, warned, field", [
    ({}, "autotune will only recommend changes", "spec.rollout"),
    ({"autotune": {"allowOutages": True}}, "autotune may take the service down", "spec.autotune.allowOutages"),
    ({"rollout": {"maxSurge": 1, "maxUnavailable": 0}}, None, None),
    ({"replicas": 2}, None, None),
])
def test_validate_warns_before_apply_what_autotune_may_do_to_the_service(tmp_path, capsys, spec_fields, warned, field):
    import json

    from specdecode.cli import main

    path = _service_file(tmp_path, **spec_fields)
    assert main(["validate", "-f", path]) == 0  # a warning is not an error
    err = capsys.readouterr().err
    if warned is None:
        assert "warning:" not in err
        return
    assert f"warning: {path}: {field}: {warned}" in err and "maxSurge: 1 and maxUnavailable: 0" in err
    assert main(["validate", "-f", path, "-o", "json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["documents"][0]["warnings"]
    assert warning["field"] == field and warning["fix"].startswith(("set spec.rollout", "to let autotune act"))
