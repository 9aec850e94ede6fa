"""Pure status logic: conditions that only move when they should, rollout reading, the
speculation carried across passes through status alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from specdecode import api, constants as C
from specdecode.control import state as cs
from specdecode.control import status as st
from specdecode.render.workload import SpeculationChoice
from specdecode.timestamps import rfc3339

from .conftest import service_doc

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def _spec(**speculation) -> api.SpecDecodeServiceSpec:
    return api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram", **speculation}})


def test_condition_transition_time_moves_only_on_a_flip():
    conds = st.set_condition([], "Ready", True, "A", "one", T0, 1)
    later = st.set_condition(conds, "Ready", True, "B", "two", T0 + timedelta(minutes=5), 2)
    assert later[0].last_transition_time == rfc3339(T0)
    assert later[0].reason == "B" and later[0].observed_generation == 2
    flipped = st.set_condition(later, "Ready", False, "C", "three", T0 + timedelta(minutes=9), 2)
    assert flipped[0].last_transition_time == rfc3339(T0 + timedelta(minutes=9))


def _deployment(replicas=2, updated=2, available=2, ready=2, total=2, generation=3, observed=3, config="abc"):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {C.LABEL_CONFIG_HASH: config}}}},
        "status": {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated,
                   "availableReplicas": available, "readyReplicas": ready},
    }


@pytest.mark.parametrize(
    "kwargs,live",
    [
        ({}, True),
        ({"updated": 1}, False),
        ({"available": 1}, False),
        ({"total": 3}, False),  # an old pod still runs
        ({"observed": 2}, False),  # the controller has not seen the new template
        ({"config": "old"}, False),
    ],
)
def test_rollout_is_live_only_when_every_replica_runs_the_rendered_config(kwargs, live):
    assert st.rollout_state(_deployment(**kwargs), "abc").live is live


def test_missing_deployment_is_not_live():
    assert st.rollout_state(None, "abc") == st.RolloutState(exists=False)


def _choice(spec, status):
    choice, _cause, reason = cs.choose(spec, status)
    return choice, reason


def test_choice_starts_at_the_declared_k_and_then_follows_status():
    spec = _spec(numSpeculativeTokens=4)
    choice, reason = _choice(spec, None)
    assert choice == SpeculationChoice(k=4) and reason == "declared in spec"
    earlier = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=False, reason="alpha 0.2 < floor", spec_hash=st.declared_speculation_hash(spec)))
    assert _choice(spec, earlier) == (SpeculationChoice.off(), "alpha 0.2 < floor")


def test_a_new_declaration_restarts_from_the_declared_k():
    old = _spec(numSpeculativeTokens=4)
    earlier = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, k=2, spec_hash=st.declared_speculation_hash(old)))
    assert _choice(_spec(numSpeculativeTokens=5), earlier)[0] == SpeculationChoice(k=5)


def test_new_bounds_clamp_the_operators_choice():
    spec = _spec(numSpeculativeTokens=4, minK=3, maxK=6)
    earlier = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, k=8, spec_hash=st.declared_speculation_hash(spec)))
    choice, reason = _choice(spec, earlier)
    assert choice == SpeculationChoice(k=6) and "bounds" in reason


def test_off_is_not_kept_when_the_user_forbids_it():
    """Off while allowDisable is false turns on at the declared K within the bounds (not minK):
    the reconcile renders the K the policy's bounds rule enables at (`state.bounded`)."""
    spec = _spec(numSpeculativeTokens=4, minK=2, allowDisable=False)
    earlier = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=False, spec_hash=st.declared_speculation_hash(spec)))
    choice, cause, _ = cs.choose(spec, earlier)
    assert choice == SpeculationChoice(k=4) and cause is cs.Cause.BOUNDS


def test_autotune_off_runs_what_is_declared():
    spec = api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
                           "autotune": {"mode": "Off"}})
    earlier = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(enabled=False))
    assert _choice(spec, earlier)[0] == SpeculationChoice(k=4)


def _outcome(**rollout):
    return st.ReconcileOutcome(rollout=st.rollout_state(_deployment(**rollout), "abc"), choice=SpeculationChoice(k=3),
                               choice_reason="declared in spec", config_hash="abc", method="ngram", selector="x=y")


def test_serving_when_live_progressing_while_rolling():
    spec = _spec(numSpeculativeTokens=3)
    serving = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    assert serving.phase == C.PHASE_SERVING
    assert st.get_condition(serving.conditions, C.COND_READY).status == "True"
    assert st.get_condition(serving.conditions, C.COND_PROGRESSING).status == "False"
    rolling = st.next_status(serving, _outcome(updated=1, available=1), spec, 3, T0)
    assert rolling.phase == C.PHASE_PROGRESSING
    assert "1/2 updated" in st.get_condition(rolling.conditions, C.COND_PROGRESSING).message
    assert st.get_condition(rolling.conditions, C.COND_READY).status == "True"


def test_a_rollouts_counts_alone_are_told_from_a_change_a_user_or_the_loop_acts_on():
    """The Deployment events of a rollout bring new counts (0/2, then 1/2 updated) with the
    service still Progressing; the step to Serving, a Ready that flips or a failed rollout
    is another kind of change."""
    spec = _spec(numSpeculativeTokens=3)
    started = st.next_status(api.SpecDecodeServiceStatus(), _outcome(updated=0, available=0, ready=0, total=0),
                             spec, 3, T0)
    one_updated = st.next_status(started, _outcome(updated=1, available=0, ready=0, total=1), spec, 3,
                                 T0 + timedelta(seconds=3))
    assert st.only_rollout_counts_changed(started, one_updated)
    assert not st.only_rollout_counts_changed(one_updated, one_updated)  # nothing changed
    one_ready = st.next_status(one_updated, _outcome(updated=1, available=1, ready=1, total=1), spec, 3, T0)
    assert not st.only_rollout_counts_changed(one_updated, one_ready)  # Ready flips to True
    serving = st.next_status(one_ready, _outcome(), spec, 3, T0)
    assert not st.only_rollout_counts_changed(one_ready, serving)  # Serving
    scaled = st.next_status(serving, _outcome(replicas=3, updated=2, available=2, total=2), spec, 3, T0)
    assert not st.only_rollout_counts_changed(serving, scaled)  # Progressing's reason: Scaling
    stuck = st.next_status(one_updated, st.ReconcileOutcome(**{**_outcome().__dict__, "apply_error": "422"}),
                           spec, 3, T0)
    assert not st.only_rollout_counts_changed(one_updated, stuck)  # Degraded


def test_speculation_effective_says_running_once_the_rollout_is_done_and_keeps_the_loops_words():
    """Seen at 500 services: every Serving service still read "ngram K=3 rolling out" until the
    loop's next decision, which in a steady fleet never comes."""
    spec = _spec(numSpeculativeTokens=3)
    rolling = st.next_status(api.SpecDecodeServiceStatus(), _outcome(updated=0, available=0), spec, 1, T0)
    assert st.get_condition(rolling.conditions, C.COND_SPECULATION_EFFECTIVE).message.endswith("rolling out")
    serving = st.next_status(rolling, _outcome(), spec, 1, T0 + timedelta(minutes=1))
    effective = st.get_condition(serving.conditions, C.COND_SPECULATION_EFFECTIVE)
    assert effective.message.endswith("running") and effective.status == "True"
    loops = st.set_condition(serving.conditions, C.COND_SPECULATION_EFFECTIVE, True, "Paying",
                             "K=3 pays 1.8x over no speculation", T0 + timedelta(minutes=2), 1)
    later = st.next_status(serving.model_copy(update={"conditions": loops}), _outcome(), spec, 1,
                           T0 + timedelta(minutes=3))
    assert st.get_condition(later.conditions, C.COND_SPECULATION_EFFECTIVE).message == "K=3 pays 1.8x over no speculation"


@pytest.mark.parametrize("scale", [
    {"replicas": 3, "total": 3, "updated": 3, "available": 2, "ready": 2},  # a replica given back, starting
    {"replicas": 1, "total": 2, "updated": 2, "available": 2, "ready": 2},  # a replica lent to a canary
    {"replicas": 3, "total": 2, "updated": 2, "available": 2, "ready": 2, "generation": 4},  # not yet observed
])
def test_a_live_config_whose_replica_count_moves_stays_serving_and_keeps_its_warm_up(scale):
    """A canary experiment scales the main Deployment down and back up: GitOps health stays
    Healthy (phase Serving, Progressing False) and the warm-up does not start again."""
    spec = _spec(numSpeculativeTokens=3)
    serving = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    scaled = st.next_status(serving, _outcome(**scale), spec, 3, T0 + timedelta(minutes=5))
    assert scaled.phase == C.PHASE_SERVING
    progressing = st.get_condition(scaled.conditions, C.COND_PROGRESSING)
    assert (progressing.status, progressing.reason) == ("False", C.REASON_SCALING)
    assert scaled.speculation.live_since == serving.speculation.live_since
    # A new config is a rollout, whatever the replica count does.
    changed = st.next_status(serving, st.ReconcileOutcome(
        rollout=st.rollout_state(_deployment(config="new", **scale), "new"), choice=SpeculationChoice(k=4),
        choice_reason="policy", config_hash="new", method="ngram", selector="x=y"), spec, 3, T0)
    assert changed.phase == C.PHASE_PROGRESSING and changed.speculation.live_since is None


def test_an_unchanged_world_gives_an_identical_status():
    spec = _spec(numSpeculativeTokens=3)
    first = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    again = st.next_status(first, _outcome(), spec, 3, T0 + timedelta(hours=1))
    assert again.to_wire() == first.to_wire()


def test_a_reconcile_keeps_the_collapse_guards_evidence_for_the_running_config():
    """belowFloorSince is the control loop's: a reconcile of the same config carries it over
    (dropping it restarted the guard's confirmation at every pass, end to end, and a
    collapse was never confirmed); a new config starts without it."""
    spec = _spec(numSpeculativeTokens=3)
    serving = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    low = serving.model_copy(update={"speculation": serving.speculation.model_copy(
        update={"below_floor_since": rfc3339(T0 + timedelta(seconds=30))})})
    again = st.next_status(low, _outcome(), spec, 3, T0 + timedelta(seconds=31))
    assert again.speculation.below_floor_since == rfc3339(T0 + timedelta(seconds=30))
    changed = st.next_status(low, st.ReconcileOutcome(
        rollout=st.rollout_state(_deployment(config="new"), "new"), choice=SpeculationChoice(k=4),
        choice_reason="policy", config_hash="new", method="ngram", selector="x=y"), spec, 3, T0)
    assert changed.speculation.below_floor_since is None


def test_invalid_spec_keeps_everything_else():
    spec = _spec(numSpeculativeTokens=3)
    good = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    bad = st.next_status(good, st.ReconcileOutcome(invalid_spec="spec.engine.version: nope"), None, 4, T0)
    degraded = st.get_condition(bad.conditions, C.COND_DEGRADED)
    assert bad.phase == C.PHASE_DEGRADED and degraded.reason == C.REASON_INVALID_SPEC
    assert bad.speculation == good.speculation


@pytest.mark.parametrize("cache, mode, status, reason", [
    ({}, "Auto", "True", C.REASON_CACHE_EMPTY_DIR),
    ({}, "Recommend", "True", C.REASON_CACHE_EMPTY_DIR),
    ({}, "Off", "False", C.REASON_AUTOTUNE_OFF),
    ({"claimName": "hf-model-cache"}, "Auto", "False", C.REASON_CACHE_PERSISTENT),
    ({"type": "EmptyDir", "claimName": "ignored"}, "Auto", "True", C.REASON_CACHE_EMPTY_DIR),
])
def test_model_cache_ephemeral_warns_while_autotune_may_restart_pods(cache, mode, status, reason):
    spec = api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram"}, "modelCache": cache,
                           "autotune": {"mode": mode}})
    new = st.next_status(api.SpecDecodeServiceStatus(), _outcome(), spec, 3, T0)
    condition = st.get_condition(new.conditions, C.COND_MODEL_CACHE_EPHEMERAL)
    assert (condition.status, condition.reason) == (status, reason)
    if status == "True":
        assert "spec.modelCache.claimName" in condition.message
