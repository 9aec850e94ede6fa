"""Canary experiments in the control loop: what a user sees in status, in Events and in the
running config when a predicted move is measured on a canary before it reaches every
replica. Pure: every evaluation gets its time and its metrics passed in."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Optional

from specdecode import api, constants as C, timestamps
from specdecode.control import evaluation
from specdecode.control import state as cs
from specdecode.control.decision import Action, Held, Rule
from specdecode.control.estimates import PolicyObservations
from specdecode.control.experiments import CanaryPlan, Experiment, Purpose, running_record
from specdecode.control.perfmodel import OFF, Workload
from specdecode.control.settings import PolicySettings
from specdecode.control.step import step
from specdecode.render.workload import SpeculationChoice, config_hash

from .test_policy import NOW, TRUTH, both, observe

LOW = Workload(4, 1000, 300, 0, 0.8)
COLLAPSED = Workload(6, 1000, 300, 0, 0.2)
ROLLOUT_S = 180.0
MINUTE = 60.0


def make_spec(replicas: int = 3, autotune: Optional[dict] = None, **extra: Any) -> api.SpecDecodeServiceSpec:
    return api.parse_spec({
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                        "numSpeculativeTokens": 3, "minK": 1, "maxK": 8},
        "replicas": replicas,
        "autotune": autotune or {},
        **extra,
    })


SPEC = make_spec()  # three replicas, maxSurge 0: a capacity-neutral canary borrows one


def hash_of(spec: api.SpecDecodeServiceSpec, k: Optional[int]) -> str:
    return config_hash(spec, SpeculationChoice(k=k))


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def live_status(spec: api.SpecDecodeServiceSpec, k: Optional[int], since: float = NOW - 7200,
                experiments: tuple = ()) -> api.SpecDecodeServiceStatus:
    """A service running ``k`` (None: speculation off) on every replica for a while."""
    return api.SpecDecodeServiceStatus(
        ready_replicas=spec.replicas,
        speculation=api.EffectiveSpeculation(
            enabled=k is not None, method="draft_model", k=k, since=timestamps.rfc3339(since),
            live_since=timestamps.rfc3339(since + 200), live=True, config_hash=hash_of(spec, k), cause="Policy",
            spec_hash=cs.declared_speculation_hash(spec)),
        experiments=list(experiments),
    )


def canary_arm(incumbent: PolicyObservations, factor: float, minute: int):
    """The canary's long window: the incumbent's, its time per token ``factor`` times as long
    (with a little window-to-window noise, as measured)."""
    wobble = 1.0 + 0.01 * ((minute % 3) - 1)
    return replace(incumbent.window, tpot_mean_s=incumbent.window.tpot_mean_s * factor * wobble)


def drive(spec: api.SpecDecodeServiceSpec, status: api.SpecDecodeServiceStatus, minutes: int, factor: float,
          workload: Workload = LOW, restart: bool = False, start: float = NOW, step_factor: float = 1.0,
          canary_of=None, arriving: Optional[float] = None):
    """One evaluation a minute through `evaluation.evaluate`, the reconcile's part simulated (a
    change rendered at once, live after a rollout). ``restart``: an operator restarted before
    every evaluation, reading back only what the apiserver stored (the status's wire form).
    ``step_factor``: the running config's step time over the true model's; ``canary_of``: the
    canary's window from the running record (default: the incumbent's, ``factor`` slower);
    ``arriving``: requests per second arriving at the main Deployment while ``workload``'s
    finish, with requests waiting (its replicas past their capacity)."""
    settings = PolicySettings.from_spec(spec, restart_s=ROLLOUT_S)
    results, live_at = [], None
    for minute in range(minutes):
        now = start + MINUTE * minute
        if live_at is not None and now >= live_at:
            effective = status.speculation.model_copy(update={"live": True, "live_since": timestamps.rfc3339(live_at)})
            status, live_at = status.model_copy(update={"speculation": effective}), None
        config = cs.from_status(status, spec, _dt(now)).config
        observed = both(workload, config, step_factor=step_factor)
        if arriving is not None:
            observed = replace(observed, window=_past_capacity(observed.window, arriving),
                               guard=_past_capacity(observed.guard, arriving))
        record = running_record(status)
        canary = None
        if record is not None:
            canary = canary_of(record) if canary_of is not None else canary_arm(observed, factor, minute)
        result = evaluation.evaluate(status, spec, settings, observed, None, _dt(now), canary=canary)
        status = result.status
        if result.rerender:
            k = result.decision.k if result.decision.enabled else None
            effective = status.speculation.model_copy(update={"config_hash": hash_of(spec, k)})
            status, live_at = status.model_copy(update={"speculation": effective}), now + ROLLOUT_S
        if restart:
            status = api.SpecDecodeServiceStatus.model_validate(status.to_wire())
        results.append((now, result))
    return results, status


def _past_capacity(window, arriving: float):
    """``window`` with ``arriving`` requests per second coming in and the difference to what
    finished waiting: 10 requests a replica."""
    gained = (arriving - window.request_rate) * window.window_s
    return replace(window, queue_change=gained, waiting=10.0 * window.pods)


def condition(status: api.SpecDecodeServiceStatus, type_: str) -> Optional[api.Condition]:
    return next((c for c in status.conditions if c.type == type_), None)


def event_reasons(results) -> list[str]:
    return [reason for _, r in results for _, reason, _ in r.events]


# --- starting ------------------------------------------------------------------------------------


def test_a_reprobe_while_off_becomes_an_experiment_not_a_restart():
    results, status = drive(SPEC, live_status(SPEC, None), 1, factor=0.9)
    (_, result), = results
    decision = result.decision
    assert (decision.action, decision.rule, decision.held, decision.wanted) == (
        Action.HOLD, Rule.EXPERIMENT, Held.EXPERIMENT, Rule.REPROBE)
    assert not result.rerender and result.children_changed  # the canary is created, no replica restarts
    record = running_record(status)
    assert record is not None and record.purpose == "Reprobe" and record.candidate_enabled
    assert record.candidate_hash == hash_of(SPEC, record.candidate_k) != record.incumbent_hash == hash_of(SPEC, None)
    assert status.speculation.enabled is False  # the main Deployment still runs speculation off
    assert CanaryPlan.from_spec(SPEC).main_replicas(SPEC) == 2
    experimenting = condition(status, C.COND_EXPERIMENTING)
    assert (experimenting.status, experimenting.reason) == ("True", "Reprobe")
    assert C.EVENT_EXPERIMENT_STARTED in event_reasons(results)
    assert "canary experiment (Reprobe) started" in status.recommendation.reason


def test_a_tune_move_starts_a_change_experiment_for_the_predicted_k():
    # From K=8 the model prefers K=3, and K=2 within 2 %: the move's K is the shorter one
    # (`rules.shortest_near_best`), and the canary tests that.
    results, status = drive(SPEC, live_status(SPEC, 8), 1, factor=0.9)
    record = running_record(status)
    assert record.purpose == "Change" and record.candidate_k == 2 and record.candidate == "draft_model K=2"
    assert results[0][1].decision.wanted is Rule.TUNE and status.speculation.k == 8


def test_no_canary_starts_while_the_collapse_guard_weighs_a_short_window_below_the_floor():
    # It would be cancelled at the next evaluation if the guard confirms a collapse.
    from specdecode.control import canary
    from specdecode.control.rules import decide

    settings = PolicySettings.from_spec(SPEC, restart_s=ROLLOUT_S)
    state = cs.from_status(live_status(SPEC, 8), SPEC, _dt(NOW))
    observed = both(LOW, 8)
    tune = decide(settings, state, observed, state.history, NOW)
    assert tune.changes and tune.rule is Rule.TUNE
    decision, after = canary.run(settings, state, replace(tune, below_floor=True), observed, None, NOW)
    assert (decision.action, decision.held, decision.wanted) == (Action.HOLD, Held.EXPERIMENT, Rule.TUNE)
    assert after.experiment is None and "the collapse guard decides first" in decision.reason


# --- verdicts ------------------------------------------------------------------------------------


def test_a_better_candidate_is_promoted_and_the_main_deployment_changes_once():
    results, status = drive(SPEC, live_status(SPEC, None), 30, factor=0.9)
    rerendered = [(now, r) for now, r in results if r.rerender]
    assert len(rerendered) == 1
    promoted_at, promotion = rerendered[0]
    started = next(r for _, r in results if r.experiments_started).experiments_started[0]
    assert (promotion.decision.action, promotion.decision.rule, promotion.decision.applied) == (
        Action.ENABLE, Rule.EXPERIMENT, True)
    assert promotion.decision.k == started.candidate_k and "promoted" in promotion.decision.reason
    assert [r.verdict for r in promotion.experiments_ended] == ["Promote"]
    assert {C.EVENT_EXPERIMENT_PROMOTED, C.EVENT_SPECULATION_CHANGED} <= {e[1] for e in promotion.events}
    after = promotion.status
    assert after.speculation.enabled and after.speculation.k == started.candidate_k
    assert after.history[-1].action == "enable" and after.history[-1].applied
    assert after.experiments[-1].verdict == "Promote" and after.experiments[-1].effect < 0
    assert running_record(after) is None
    assert condition(after, C.COND_EXPERIMENTING).reason == "Promote"
    # The verdict came from measured windows, not at once: three paired windows at least.
    assert after.experiments[-1].paired_windows >= 3 and promoted_at - NOW >= 15 * MINUTE


def test_a_worse_candidate_is_aborted_with_no_change_and_not_retried_before_the_backoff():
    settings = PolicySettings.from_spec(SPEC)
    results, status = drive(SPEC, live_status(SPEC, None), 150, factor=1.15)
    assert not any(r.rerender for _, r in results)
    assert status.speculation.enabled is False and status.history == []
    ends = [(now, rec) for now, r in results for rec in r.experiments_ended]
    starts = [(now, rec) for now, r in results for rec in r.experiments_started]
    assert [rec.verdict for _, rec in ends][:2] == ["AbortWorse", "AbortWorse"]
    assert C.EVENT_EXPERIMENT_ABORTED in event_reasons(results)
    # The same candidate again only after reprobeInterval, then after twice that.
    (first_end, _), (second_end, _) = ends[:2]
    assert starts[1][0] - first_end >= settings.reprobe_interval_s
    assert starts[2][0] - second_end >= 2 * settings.reprobe_interval_s
    waiting = [r.decision for now, r in results if first_end < now < starts[1][0]]
    assert waiting and all(d.rule is Rule.EXPERIMENT and "not tried again" in d.reason for d in waiting)


def test_a_promotion_waits_while_its_rollout_would_overload_the_replicas_left_serving():
    """maxSurge 0: a promotion rolls the main Deployment and the canary's replica comes back at
    once, so each round serves on two replicas of three. With the load risen in mid-experiment
    to 32 req/s on the main Deployment's two replicas (48 req/s for the service's three, 114 %
    of what two carry) the canary keeps serving the candidate, the record says why in the
    service's figures, and the promotion comes once the load allows it."""
    _, calm = drive(SPEC, live_status(SPEC, None), 8, factor=0.9)
    assert running_record(calm) is not None
    peak, busy = drive(SPEC, calm, 40, factor=0.9, workload=Workload(32, 1000, 300, 0, 0.8), start=NOW + 8 * MINUTE)
    assert not any(r.rerender for _, r in peak) and busy.speculation.enabled is False
    record = running_record(busy)
    assert record is not None and record.verdict == "Running"
    assert ("faster per token; the promotion waits: at 48.00 req/s the rollout would load the replicas left serving "
            "to 114% of the 42.2 req/s they carry") in record.reason
    assert any("would promote draft_model K=1 over off" in r.decision.reason for _, r in peak)
    after, promoted = drive(SPEC, busy, 15, factor=0.9, start=NOW + 48 * MINUTE)
    (promotion,) = [r for _, r in after if r.rerender]
    assert promotion.decision.rule is Rule.EXPERIMENT and [e.verdict for e in promotion.experiments_ended] == ["Promote"]
    assert promoted.speculation.enabled and promoted.speculation.k == 1


def test_a_promotion_waits_for_what_arrives_when_the_replicas_are_past_their_capacity():
    """Past capacity what finishes is what the replicas serve, not the load. The main
    Deployment's two replicas finish 20 req/s (30 for the service: 71 % of what two carry,
    below the 80 % a rollout may load them to) while 26 arrive and requests wait: the
    rollout would meet 39 req/s, and the promotion waits for the load, in the arrivals'
    figures. The same windows without the queue (what finishes is the load) promote."""
    _, calm = drive(SPEC, live_status(SPEC, None), 8, factor=0.9)
    assert running_record(calm) is not None
    busy = Workload(20, 1000, 300, 0, 0.8)
    peak, waiting = drive(SPEC, calm, 20, factor=0.9, workload=busy, start=NOW + 8 * MINUTE, arriving=26.0)
    assert not any(r.rerender for _, r in peak) and waiting.speculation.enabled is False
    record = running_record(waiting)
    assert record is not None and record.verdict == "Running"
    assert ("the promotion waits: at 39.00 req/s the rollout would load the replicas left serving to 92% of the "
            "42.2 req/s they carry") in record.reason
    steady, _ = drive(SPEC, calm, 20, factor=0.9, workload=busy, start=NOW + 8 * MINUTE)
    (promotion,) = [r for _, r in steady if r.rerender]
    assert [e.verdict for e in promotion.experiments_ended] == ["Promote"]


def test_a_promotion_reached_stands_while_it_waits_for_the_load():
    """The verdict is reached at the peak (the canary 10 % faster there) and its rollout waits
    for the load. Windows after it, measured at other loads or other traffic (here 20 %
    slower), do not undo it: the evidence stays what the verdict was reached on, and the
    promotion goes ahead once the load allows it. (Traced: speculation off measured 35 %
    faster than K=1 at a peak K=1 could not carry; re-judged with the calm's windows, the
    experiment timed out, and the next day's peak met K=1 again.)"""
    peak = Workload(32, 1000, 300, 0, 0.8)
    _, calm = drive(SPEC, live_status(SPEC, None), 8, factor=0.9)
    _, busy = drive(SPEC, calm, 40, factor=0.9, workload=peak, start=NOW + 8 * MINUTE)
    reached = running_record(busy)
    assert reached is not None and reached.promotion_waits_since is not None
    assert "the promotion waits" in reached.reason
    _, still = drive(SPEC, busy, 30, factor=1.2, workload=peak, start=NOW + 48 * MINUTE)
    waiting = running_record(still)
    assert waiting is not None and "the promotion waits" in waiting.reason
    assert (waiting.paired_windows, waiting.effect) == (reached.paired_windows, reached.effect)
    assert waiting.promotion_waits_since == reached.promotion_waits_since
    after, promoted = drive(SPEC, still, 15, factor=1.2, start=NOW + 78 * MINUTE)
    (promotion,) = [r for _, r in after if r.rerender]
    assert [e.verdict for e in promotion.experiments_ended] == ["Promote"]
    assert promoted.speculation.enabled and promoted.speculation.k == 1


def test_a_canary_no_better_serves_on_while_its_end_would_overload_the_replicas_left_serving():
    """A canary's end gives its borrowed replica back, and it restarts while the main
    Deployment's two replicas carry the whole load. With the load risen in mid-experiment to
    48 req/s for the service (what two replicas carry is less), a candidate measured no better
    and no worse keeps serving: the record says why, nothing restarts, and the experiment ends
    (AbortNoGain) once the load allows it."""
    _, calm = drive(SPEC, live_status(SPEC, None), 8, factor=1.0)
    assert running_record(calm) is not None
    peak, busy = drive(SPEC, calm, 40, factor=1.0, workload=Workload(32, 1000, 300, 0, 0.8), start=NOW + 8 * MINUTE)
    assert not any(r.rerender or r.experiments_ended for _, r in peak)
    record = running_record(busy)
    assert record is not None and record.verdict == "Running"
    assert "not worth a rollout; the end waits: at 48.00 req/s its end would load the 2 replica(s)" in record.reason
    assert any("would end AbortNoGain" in r.decision.reason for _, r in peak)
    after, ended = drive(SPEC, busy, 15, factor=1.0, start=NOW + 48 * MINUTE)
    assert [rec.verdict for _, r in after for rec in r.experiments_ended] == ["AbortNoGain"]
    assert not any(r.rerender for _, r in after) and ended.speculation.enabled is False


def test_a_canary_far_slower_at_a_peak_ends_there_whatever_the_load():
    """The wait is for a candidate serving about as well as the running config: one whose
    windows read twice as slow per token at the peak ends there (AbortWorse), its replica's
    restart and all."""
    _, calm = drive(SPEC, live_status(SPEC, None), 8, factor=2.0)
    assert running_record(calm) is not None
    peak, busy = drive(SPEC, calm, 40, factor=2.0, workload=Workload(32, 1000, 300, 0, 0.8), start=NOW + 8 * MINUTE)
    assert [rec.verdict for _, r in peak for rec in r.experiments_ended] == ["AbortWorse"]
    assert running_record(busy) is None and not any("the end waits" in r.decision.reason for _, r in peak)


def test_a_candidate_within_the_minimum_effect_is_not_worth_a_rollout():
    results, status = drive(SPEC, live_status(SPEC, None), 30, factor=1.0)
    verdicts = [rec.verdict for _, r in results for rec in r.experiments_ended]
    assert verdicts[:1] == ["AbortNoGain"] and not any(r.rerender for _, r in results)


# --- safety and cancels --------------------------------------------------------------------------


def running_change(spec: api.SpecDecodeServiceSpec, incumbent_k: int, candidate_k: Optional[int],
                   started: float = NOW - 300) -> api.ExperimentRecord:
    return Experiment(Purpose.CHANGE, f"draft_model K={candidate_k}", hash_of(spec, candidate_k),
                      hash_of(spec, incumbent_k), started_at=started, candidate_k=candidate_k).to_record()


def evaluate_once(spec, status, observed, canary=None, now: float = NOW):
    return evaluation.evaluate(status, spec, PolicySettings.from_spec(spec, restart_s=ROLLOUT_S), observed, None,
                               _dt(now), canary=canary)


def test_a_collapse_turns_speculation_off_at_once_even_with_experiments_enabled():
    result = evaluate_once(SPEC, live_status(SPEC, 3), both(COLLAPSED, 3))
    assert (result.decision.action, result.decision.rule, result.rerender) == (Action.DISABLE, Rule.COLLAPSE, True)
    assert result.status.experiments == []


def test_a_collapse_during_an_experiment_cancels_it_and_turns_speculation_off_at_once():
    status = live_status(SPEC, 3, experiments=(running_change(SPEC, 3, 5),))
    result = evaluate_once(SPEC, status, both(COLLAPSED, 3))
    assert (result.decision.action, result.decision.rule, result.rerender) == (Action.DISABLE, Rule.COLLAPSE, True)
    ended = result.status.experiments[-1]
    assert ended.verdict == "Cancelled" and "collapse" in ended.reason
    assert [r.verdict for r in result.experiments_ended] == ["Cancelled"]
    assert C.EVENT_EXPERIMENT_CANCELLED in [e[1] for e in result.events]
    assert condition(result.status, C.COND_EXPERIMENTING).status == "False"


def test_autotune_leaving_auto_cancels_the_running_experiment():
    recommend = make_spec(autotune={"mode": "Recommend"})
    status = live_status(recommend, 3, experiments=(running_change(recommend, 3, 5),))
    result = evaluate_once(recommend, status, both(LOW, 3))
    assert result.status.experiments[-1].verdict == "Cancelled"
    assert "autotune.mode is Recommend" in result.status.experiments[-1].reason
    assert running_record(result.status) is None and not result.rerender


def test_a_spec_change_of_the_candidate_cancels_the_experiment_and_tests_the_new_one():
    status = live_status(SPEC, None)
    status = status.model_copy(update={"experiments": [Experiment(
        Purpose.REPROBE, "draft_model K=1", hash_of(SPEC, 1), hash_of(SPEC, None), started_at=NOW - 300,
        candidate_k=1).to_record()]})
    edited = make_spec(engine={"maxNumSeqs": 128})  # every engine config hash changes
    result = evaluate_once(edited, status, both(LOW, OFF))
    cancelled, started = result.status.experiments[-2:]
    assert cancelled.verdict == "Cancelled" and "candidate's engine config" in cancelled.reason
    assert started.running and started.candidate_hash == hash_of(edited, started.candidate_k)


def test_a_plan_that_becomes_blocked_cancels_and_the_move_applies_at_once():
    single = make_spec(replicas=1)
    status = live_status(single, None, experiments=(Experiment(
        Purpose.REPROBE, "draft_model K=1", hash_of(single, 1), hash_of(single, None), started_at=NOW - 300,
        candidate_k=1).to_record(),))
    result = evaluate_once(single, status, both(LOW, OFF))
    assert result.status.experiments[-1].verdict == "Cancelled"
    assert "spec.replicas >= 2" in result.status.experiments[-1].reason
    assert running_record(result.status) is None and "no canary" in result.decision.reason


# --- modes and plans -----------------------------------------------------------------------------


def test_recommend_mode_runs_none_but_says_what_it_would_test():
    recommend = make_spec(autotune={"mode": "Recommend"})
    results, status = drive(recommend, live_status(recommend, None), 3, factor=0.9)
    assert status.experiments == [] and condition(status, C.COND_EXPERIMENTING) is None
    decision = results[0][1].decision
    assert decision.action is Action.ENABLE and not decision.applied
    assert "in Auto mode it would first run as a canary experiment (Reprobe)" in status.recommendation.reason


def test_off_mode_runs_none():
    off_mode = make_spec(autotune={"mode": "Off"})
    results, status = drive(off_mode, live_status(off_mode, 3), 3, factor=0.9)
    assert status.experiments == [] and not any(r.children_changed for _, r in results)


def test_a_blocked_plan_keeps_todays_behaviour_and_names_the_blocker():
    for replicas, rollout in ((1, {}), (1, {"maxSurge": 1, "maxUnavailable": 0})):
        # maxSurge 0: no replica to borrow, no room for an extra one; with surge, no budget for one
        blocked = make_spec(replicas=replicas, rollout=rollout)
        today = make_spec(replicas=replicas, rollout=rollout, autotune={"experiments": {"enabled": False}})
        results, status = drive(blocked, live_status(blocked, None), 20, factor=0.9)
        before, _ = drive(today, live_status(today, None), 20, factor=0.9)
        assert [(r.decision.action, r.decision.k, r.decision.rule, r.decision.held, r.rerender) for _, r in results] == [
            (r.decision.action, r.decision.k, r.decision.rule, r.decision.held, r.rerender) for _, r in before]
        assert status.experiments == []
        decision = results[0][1].decision
        assert decision.rule is Rule.REPROBE or decision.wanted is Rule.REPROBE
        assert "no canary" in decision.reason and "spec.replicas >= 2" in decision.reason
        assert "maxExtraReplicas" in decision.reason


def test_a_blocked_plan_reprobes_every_replica_at_once_and_says_why():
    surge = make_spec(replicas=1, rollout={"maxSurge": 1, "maxUnavailable": 0})
    results, status = drive(surge, live_status(surge, None), 1, factor=0.9)
    decision = results[0][1].decision
    assert decision.action is Action.ENABLE and decision.rule is Rule.REPROBE and results[0][1].rerender
    assert "every replica changes at once, no canary" in decision.reason
    assert "no canary" in status.history[-1].reason


def test_a_surge_budget_runs_the_canary_beside_a_single_replica():
    surge = make_spec(replicas=1, rollout={"maxSurge": 1, "maxUnavailable": 0},
                      autotune={"experiments": {"maxExtraReplicas": 1}})
    _, status = drive(surge, live_status(surge, None), 1, factor=0.9)
    assert running_record(status) is not None and CanaryPlan.from_spec(surge).main_replicas(surge) == 1


def test_experiments_turned_off_apply_moves_at_once_as_before():
    plain = make_spec(autotune={"experiments": {"enabled": False}})
    results, status = drive(plain, live_status(plain, None), 1, factor=0.9)
    decision = results[0][1].decision
    assert decision.rule is Rule.REPROBE and results[0][1].rerender and "canary" not in decision.reason


# --- the control experiment ----------------------------------------------------------------------


def test_a_long_running_config_is_checked_against_speculation_off():
    week_old = live_status(SPEC, 3, since=NOW - 8 * 86400)
    results, status = drive(SPEC, week_old, 30, factor=1.2)  # the canary (off) is slower
    first = results[0][1]
    assert first.experiments_started and first.experiments_started[0].purpose == "Control"
    assert first.experiments_started[0].candidate == "off" and not first.experiments_started[0].candidate_enabled
    ended = [rec for _, r in results for rec in r.experiments_ended]
    assert [rec.verdict for rec in ended] == ["AbortWorse"]  # speculation still pays
    assert not any(r.rerender for _, r in results) and status.speculation.k == 3
    # Not asked again within controlInterval.
    assert sum(len(r.experiments_started) for _, r in results) == 1


def test_no_control_experiment_when_the_spec_turns_it_off():
    no_control = make_spec(autotune={"experiments": {"control": False}})
    _, status = drive(no_control, live_status(no_control, 3, since=NOW - 8 * 86400), 3, factor=1.2)
    assert status.experiments == []
    # Nor the early Calibrate one: it runs speculation off on the canary too.
    _, status = drive(no_control, live_status(no_control, 3), 3, factor=1.0, step_factor=1.3)
    assert status.experiments == []


# --- the calibration experiment ------------------------------------------------------------------

COSTLY = 1.3  # the running config's step time over the prior's: a draft far costlier than expected


def off_canary(record: api.ExperimentRecord):
    """A canary replica running speculation off at the prior's cost, on its share (1 of 3
    replicas) of the service's traffic."""
    assert not record.candidate_enabled
    return observe(LOW, OFF, 300, params=replace(TRUTH, replicas=1), rate_factor=1 / 2)


def test_a_step_time_well_above_the_prior_is_calibrated_by_one_window_of_speculation_off():
    """A draft costlier than the prior says and a target slower than it says look the same on
    the running config alone; one window of speculation off on a canary tells them apart,
    and the model then prices speculation off at what it measured, with no restart."""
    results, status = drive(SPEC, live_status(SPEC, 3), 40, factor=1.0, step_factor=COSTLY, canary_of=off_canary)
    started = [(now, rec) for now, r in results for rec in r.experiments_started]
    ended = [(now, rec) for now, r in results for rec in r.experiments_ended]
    assert [(rec.purpose, rec.candidate) for _, rec in started] == [("Calibrate", "off")]
    assert re.search(r"K=3 runs at 1\.3\dx the step time of the model's prior", results[0][1].decision.reason)
    (ended_at, record), = ended
    assert record.verdict == "Measured" and ended_at - started[0][0] <= ROLLOUT_S + 120 + 300 + MINUTE
    assert abs(record.candidate_step_scale - 1.0) < 0.05 and abs(record.incumbent_step_scale - COSTLY) < 0.05
    assert "the draft costs more than the prior says" in record.reason
    assert C.EVENT_EXPERIMENT_MEASURED in event_reasons(results)
    assert not any(r.rerender for _, r in results) and status.speculation.k == 3
    experimenting = condition(status, C.COND_EXPERIMENTING)
    assert experimenting.status == "False" and "ended Measured" in experimenting.message
    # The model now prices speculation off at the prior's cost, not the running config's.
    before = {p.k: p for p in results[0][1].decision.predictions}[OFF].tpot_mean_s
    after = {p.k: p for p in results[-1][1].decision.predictions}[OFF].tpot_mean_s
    assert after < before / 1.2


def test_a_step_time_near_or_below_the_prior_starts_no_calibration():
    for step_factor in (1.05, 0.7):  # within noise; faster hardware (off scaled alike is its worst case)
        results, status = drive(SPEC, live_status(SPEC, 3), 15, factor=1.0, step_factor=step_factor,
                                canary_of=off_canary)
        assert status.experiments == [], step_factor


def test_no_calibration_at_a_load_the_replicas_left_serving_could_not_carry():
    # 22 req/s: a plain hold on three replicas, but above 80 % of what the two left while the
    # canary borrows one carry (4 to 20 req/s start it).
    busy = replace(LOW, request_rate=22.0)
    results, status = drive(SPEC, live_status(SPEC, 3), 5, factor=1.0, workload=busy, step_factor=COSTLY)
    assert status.experiments == []
    assert {r.decision.rule for _, r in results} == {Rule.HOLD}
    # The user learns that the model's ranking of speculation against off is unmeasured, why,
    # and what lets the measurement run (an extra replica instead of a borrowed one).
    reason = status.recommendation.reason
    assert re.search(r"a Calibrate experiment is due but waits: K=3 runs at 1\.3\dx the step time", reason), reason
    assert re.search(r"would carry \d+% of the [\d.]+ req/s they can", reason), reason
    assert "spec.rollout.maxSurge >= 1 and spec.autotune.experiments.maxExtraReplicas >= 1" in reason
    # At a load they carry, it starts instead of waiting.
    started, _ = drive(SPEC, live_status(SPEC, 3), 1, factor=1.0, step_factor=COSTLY)
    assert "waits" not in started[0][1].decision.reason and started[0][1].experiments_started


def test_a_calibration_is_measured_once_and_kept_across_operator_restarts():
    start = live_status(SPEC, 3)
    steady, steady_status = drive(SPEC, start, 70, factor=1.0, step_factor=COSTLY, canary_of=off_canary)
    restarted, restarted_status = drive(SPEC, start, 70, factor=1.0, step_factor=COSTLY, canary_of=off_canary,
                                        restart=True)
    assert _decisions(restarted) == _decisions(steady)
    assert restarted_status.to_wire() == steady_status.to_wire()
    assert [r.purpose for r in steady_status.experiments] == ["Calibrate"]


def test_a_window_whose_arms_served_different_traffic_calibrates_nothing():
    """A window where the running config finished four times the canary's requests per
    replica (draining a backlog the canary never had) compares two loads, not two configs:
    the Calibrate does not end on it, and its step scales are not taken. Once the arms serve
    the same traffic again, the next window measures, as it would have at once."""
    windows = []

    def skewed_then_even(record: api.ExperimentRecord):
        windows.append(record)
        share = 1 / 8 if len(windows) <= 11 else 1 / 2  # the first window due is skewed
        return observe(LOW, OFF, 300, params=replace(TRUTH, replicas=1), rate_factor=share)

    even, _ = drive(SPEC, live_status(SPEC, 3), 40, factor=1.0, step_factor=COSTLY, canary_of=off_canary)
    results, status = drive(SPEC, live_status(SPEC, 3), 40, factor=1.0, step_factor=COSTLY,
                            canary_of=skewed_then_even)
    (even_end, _), = [(now, rec) for now, r in even for rec in r.experiments_ended]
    (ended_at, record), = [(now, rec) for now, r in results for rec in r.experiments_ended]
    assert record.verdict == "Measured" and ended_at > even_end
    assert abs(record.candidate_step_scale - 1.0) < 0.05 and abs(record.incumbent_step_scale - COSTLY) < 0.05
    waiting = [r.decision.reason for now, r in results if even_end <= now < ended_at]
    assert waiting and all("its arms served different traffic" in reason for reason in waiting), waiting


def test_the_newest_side_by_side_measurement_calibrates_speculation_off():
    from specdecode.control.memory import off_per_on

    def measured(purpose, candidate_k, candidate, incumbent, at):
        return replace(Experiment(purpose, "x", "c", "i", started_at=at - 600, candidate_k=candidate_k),
                       last_window_at=at, ended_at=at, candidate_step_scale=candidate, incumbent_step_scale=incumbent)

    control = measured(Purpose.CONTROL, None, 1.0, 1.25, NOW - 7200)
    reprobe = measured(Purpose.REPROBE, 3, 1.2, 1.0, NOW - 3600)  # a draft beside speculation off
    change = measured(Purpose.CHANGE, 2, 1.1, 1.3, NOW)  # both run the draft: nothing of off
    assert off_per_on((control,)) == 0.8
    assert abs(off_per_on((control, reprobe, change)) - 1 / 1.2) < 1e-9
    assert off_per_on((change,)) is None and off_per_on(()) is None


# --- restarts ------------------------------------------------------------------------------------


def _decisions(results) -> list[tuple]:
    return [(now, r.decision.action, r.decision.k, r.decision.rule, r.decision.held, r.decision.reason)
            for now, r in results]


def _in_memory(spec, status, minutes: int, factor: float) -> list[tuple]:
    """The state kept in memory between steps (`step`), only the reconcile's part from outside."""
    settings = PolicySettings.from_spec(spec, restart_s=ROLLOUT_S)
    state = cs.from_status(status, spec, _dt(NOW))
    out, live_at = [], None
    for minute in range(minutes):
        now = NOW + MINUTE * minute
        if live_at is not None and now >= live_at:
            state, live_at = replace(state, live_since=live_at), None
        observed = both(LOW, state.config)
        canary = canary_arm(observed, factor, minute) if state.experiment is not None else None
        decision, state = step(settings, state, observed, now, canary)
        if decision.applied and decision.changes:
            state, live_at = replace(state, config_hash=hash_of(spec, decision.k)), now + ROLLOUT_S
        out.append((now, decision.action, decision.k, decision.rule, decision.held, decision.reason))
    return out


def test_an_operator_restarted_between_any_two_evaluations_decides_the_same():
    for factor in (0.9, 1.15):  # promoted, and aborted then retried after the back-off
        start = live_status(SPEC, None)
        steady, steady_status = drive(SPEC, start, 90, factor)
        restarted, restarted_status = drive(SPEC, start, 90, factor, restart=True)
        assert _decisions(restarted) == _decisions(steady) == _in_memory(SPEC, start, 90, factor)
        assert restarted_status.to_wire() == steady_status.to_wire()
        assert any(r.experiments_ended for _, r in steady)


def test_the_state_stores_its_experiments_in_status_and_reads_them_back():
    _, status = drive(SPEC, live_status(SPEC, None), 70, factor=1.15)  # an abort, a retry running
    assert len(status.experiments) >= 2 and running_record(status) is not None
    state = cs.from_status(status, SPEC, _dt(NOW))
    again = cs.to_status(state, status, SPEC, max_history=C.MAX_DECISION_HISTORY)
    assert again.to_wire() == status.to_wire()
    assert [e.to_record() for e in state.experiments] == status.experiments


# --- the rules during and after an experiment -------------------------------------------------


def test_while_a_canary_borrows_a_replica_the_rules_judge_the_main_by_its_own_replicas():
    from specdecode.control.canary import serving_settings

    settings = PolicySettings.from_spec(SPEC)
    running = cs.from_status(live_status(SPEC, 3, experiments=(running_change(SPEC, 3, 5),)), SPEC, _dt(NOW))
    idle = cs.from_status(live_status(SPEC, 3), SPEC, _dt(NOW))
    assert serving_settings(settings, running).replicas == 2 and serving_settings(settings, idle).replicas == 3
    surge = make_spec(rollout={"maxSurge": 1, "maxUnavailable": 0}, autotune={"experiments": {"maxExtraReplicas": 1}})
    extra = cs.from_status(live_status(surge, 3, experiments=(running_change(surge, 3, 5),)), surge, _dt(NOW))
    assert serving_settings(PolicySettings.from_spec(surge), extra).replicas == 3  # the canary is extra


def test_a_canary_starting_does_not_make_the_fast_fallback_restart_every_replica():
    """While a capacity-neutral canary's pod starts, the main Deployment's two replicas carry
    what three served: a short window that reads the load of a noisy minute there is no surge.
    Without a canary the same windows leave K=3; during the start-up the fast fallback used
    to turn speculation off on every replica (cancelling the experiment). A load that would
    make it act at the service's three replicas still does."""
    spec = make_spec(rollout={"maxSurge": 1, "maxUnavailable": 0})  # no extra replicas: the canary borrows one
    settings = PolicySettings.from_spec(spec, restart_s=ROLLOUT_S)
    assert settings.experiments.plan.main_replicas(spec) == 2
    change = Experiment(Purpose.CHANGE, "draft_model K=2", hash_of(spec, 2), hash_of(spec, 3),
                        started_at=NOW - MINUTE, candidate_k=2)

    def decide_at(short_rate: float, experiments: tuple = (change,), at: float = NOW):
        state = cs.from_status(live_status(spec, 3, experiments=tuple(e.to_record() for e in experiments)),
                               spec, _dt(at))
        observed = PolicyObservations.of(observe(Workload(20, 1000, 300, 0, 0.8), 3, 300),
                                         observe(Workload(short_rate, 1000, 300, 0, 0.8), 3, 75))
        return step(settings, state, observed, at)

    for rate in (36, 42):
        quiet, _ = decide_at(rate, experiments=())
        assert not quiet.changes
        decision, after = decide_at(rate)
        assert decision.rule is Rule.EXPERIMENT and not decision.changes, decision.reason
        assert after.experiment is not None and after.enabled and after.k == 3
    # Once the start-up and a guard window are over, the main's own replicas are the reading.
    later, _ = decide_at(42, at=NOW + ROLLOUT_S + settings.guard_window_s)
    assert later.rule is Rule.FAST_FALLBACK and later.changes
    surge, after = decide_at(60)
    assert surge.rule is Rule.FAST_FALLBACK and surge.applied and not surge.enabled
    assert after.experiment is None and after.experiments[-1].outcome.verdict.value == "Cancelled"


def test_a_promoted_reprobe_is_measured_not_on_trial():
    from specdecode.control.canary import promoted_lately

    results, status = drive(SPEC, live_status(SPEC, None), 30, factor=0.9)
    promoted_at = next(now for now, r in results if r.rerender)
    state = cs.from_status(status, SPEC, _dt(promoted_at + 600))
    assert state.enabled and promoted_lately(state)
    assert not promoted_lately(cs.from_status(live_status(SPEC, 3), SPEC, _dt(NOW)))


def _records():
    from hypothesis import strategies as st

    verdicts = st.sampled_from(["Promote", "AbortWorse", "AbortNoGain", "AbortSLO", "AbortTimeout", "Cancelled",
                                "Measured"])
    scales = st.one_of(st.none(), st.floats(0.2, 5.0).map(lambda x: round(x, 4)))
    times = st.integers(1_700_000_000, 1_900_000_000)

    @st.composite
    def record(draw, verdicts):
        verdict = draw(verdicts)
        k = draw(st.one_of(st.none(), st.integers(1, 8)))
        started = draw(times)
        effect = draw(st.one_of(st.none(), st.floats(-0.5, 0.5).map(lambda e: round(e, 4))))
        return api.ExperimentRecord(
            purpose=draw(st.sampled_from(["Reprobe", "Change", "Control", "Calibrate"])),
            candidate_step_scale=draw(scales), incumbent_step_scale=draw(scales),
            candidate=f"draft_model K={k}" if k else "off", candidate_enabled=k is not None, candidate_k=k,
            candidate_hash=draw(st.sampled_from(["c1", "c2"])), incumbent_hash="i",
            started_at=timestamps.rfc3339(started),
            ended_at=None if verdict == "Running" else timestamps.rfc3339(started + draw(st.integers(0, 3600))),
            verdict=verdict, reason=draw(st.text(max_size=30)),
            effect=effect, effect_low=None if effect is None else round(effect - 0.01, 4),
            effect_high=None if effect is None else round(effect + 0.01, 4),
            windows=draw(st.integers(0, 9)), paired_windows=draw(st.integers(0, 9)),
            requests=draw(st.floats(0, 1e5).map(lambda r: round(r, 1))),
            incumbent_requests=draw(st.floats(0, 1e5).map(lambda r: round(r, 1))),
            log_ratio_sum=draw(st.floats(-3, 3)), log_ratio_sum_squares=draw(st.floats(0, 9)),
            last_window_at=draw(st.one_of(st.none(), times.map(timestamps.rfc3339))),
        )

    return st.tuples(st.lists(record(verdicts), max_size=7), st.one_of(st.none(), record(st.just("Running"))))


def test_any_stored_experiments_read_back_as_written():
    from hypothesis import given, settings

    @settings(max_examples=150, deadline=None)
    @given(_records())
    def check(drawn):
        ended, running = drawn
        records = ended + ([running] if running is not None else [])
        status = live_status(SPEC, 3).model_copy(update={"experiments": records})
        state = cs.from_status(status, SPEC, _dt(NOW))
        assert (state.experiment is not None) == (running is not None)
        again = cs.to_status(state, status, SPEC, max_history=C.MAX_DECISION_HISTORY)
        assert [r.to_wire() for r in again.experiments] == [r.to_wire() for r in records]
        assert [e.to_record().to_wire() for e in state.experiments] == [r.to_wire() for r in records]

    check()


def test_a_reprobe_into_an_acceptance_still_below_the_floor_is_aborted_at_once_not_after_its_windows():
    """The canary's acceptance needs no warm-up and no paired window: a re-probe while the
    draft still does not pay ends at the first evaluation that sees the canary's drafts, as
    the collapse guard would end it on the running config, and backs off like any loss."""
    reprobe = Experiment(Purpose.REPROBE, "draft_model K=3", hash_of(SPEC, 3), hash_of(SPEC, None),
                         started_at=NOW - 240, candidate_k=3).to_record()
    status = live_status(SPEC, None, experiments=(reprobe,))
    canary = observe(COLLAPSED, 3, 300)
    result = evaluate_once(SPEC, status, both(COLLAPSED, 0), canary=canary)
    ended = result.status.experiments[-1]
    assert ended.verdict == "AbortWorse" and "below the acceptance floor" in ended.reason
    assert not result.rerender and result.status.speculation.enabled is False
    assert C.EVENT_EXPERIMENT_ABORTED in [e[1] for e in result.events]
    # The same evaluation with a canary that pays again is left to the test's windows.
    recovered = evaluate_once(SPEC, status, both(COLLAPSED, 0), canary=observe(LOW, 3, 300))
    assert recovered.status.experiments[-1].verdict == "Running"


def test_readiness_for_the_days_peak_applies_at_once_not_on_a_canary():
    """Experiments on (the API's default), two replicas, maxSurge 0, K=1 at the calm with a
    poor draft, and a peak of 38 req/s within the last day that only speculation off carries:
    the move to off is made at once. Its canary could only measure the calm, where off is
    no faster, and would end without a clear difference; the move is for the peak."""
    spec = make_spec(replicas=2)
    settings = PolicySettings.from_spec(spec, restart_s=ROLLOUT_S)
    assert settings.experiments is not None
    state = replace(cs.from_status(live_status(spec, 1), spec, _dt(NOW)), recent_peak_rate=38.0)
    decision, after = step(settings, state, both(Workload(8, 1000, 300, 0, 0.40), 1), NOW)
    assert decision.rule is Rule.PEAK_READINESS and decision.action is Action.DISABLE and decision.applied
    assert decision.reason.startswith("ready for the peak: K=1 carries")
    assert after.experiments == () and not after.enabled


def test_after_the_shorter_drafts_canary_finds_no_gain_the_models_favourite_is_tried():
    """From K=8 the model prefers K=3 and K=2 within 2 %: the move tries the shorter draft
    first (`rules.shortest_near_best`). Its canary measures no difference worth a rollout; while
    K=2 backs off, the next canary tries K=3, the model's favourite, instead of holding K=8
    until K=2 may run again."""
    results, status = drive(SPEC, live_status(SPEC, 8), 60, factor=1.0)
    started = [rec.candidate for _, r in results for rec in r.experiments_started]
    ended = [rec.verdict for _, r in results for rec in r.experiments_ended]
    assert started[:2] == ["draft_model K=2", "draft_model K=3"], started
    assert ended[:1] == ["AbortNoGain"], ended
