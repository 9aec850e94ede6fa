"""Per-batch-size K schedules chosen by the control step (`control.schedules`): adoption when
it pays, no restart on load swings under a schedule, revert of a schedule that measures worse
than the plain K it replaced, plain K with the reason where vLLM lacks tables, and the status
round trip. Pure: simulated time, observations from the true performance model."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings as hsettings
from hypothesis import strategies as st

from specdecode import api, timestamps
from specdecode.control import evaluation, perfmodel, schedule_support, schedules
from specdecode.control import state as cs
from specdecode.control.decision import Action, Held, Rule
from specdecode.control.estimates import PolicyObservations, estimate, scaled_params
from specdecode.control.experiments import Experiment, Outcome, Purpose, Verdict
from specdecode.control.metrics import ConfigKey, Observation, SpeculationCounts
from specdecode.control.perfmodel import EngineParams, Schedule, Workload
from specdecode.control.settings import PolicySettings
from specdecode.control.state import ControlState
from specdecode.control.rules import decide
from specdecode.control.step import step
from specdecode.render import workload as render_workload
from specdecode.shell import experiments as experiment_shell

NOW = 1_800_000_000.0
TRUTH = EngineParams.for_method("draft_model")
KEY = ConfigKey("ns", "llama", "hash")
SCHEDULE = Schedule(((1, 64, 3), (65, 1024, 0)))
"""Speculate at K 3 up to a batch of 64, not above: the shape a load swing past the crossover
calls for."""


def observe(workload: Workload, config: perfmodel.Config, window: float, *,
            params: EngineParams = TRUTH, now: float = NOW) -> Observation:
    """What the reader would report for a steady state of the true model (plain K or a
    schedule: the per-position counters mix the Ks the batch visits)."""
    state = perfmodel.steady_state(params, workload, config)
    steps = state.batch * state.replicas / state.step_time_s * window
    drafts = draft_tokens = accepted = 0.0
    per_pos: list[float] = [0.0] * perfmodel.config_max_k(config)
    for k, share in state.step_shares():
        if k <= 0:
            continue
        probs = perfmodel.position_acceptance(state.alpha, k, params.acceptance_decay)
        drafts += steps * share
        draft_tokens += steps * share * k
        accepted += steps * share * sum(probs)
        for i, p in enumerate(probs):
            per_pos[i] += steps * share * p
    spec = SpeculationCounts(drafts, draft_tokens, accepted, tuple(per_pos)) if drafts > 0 else None
    return Observation(
        key=KEY, window_s=window, evaluated_at=now, newest_sample_at=now - 5.0,
        pods=state.replicas, speculation=spec, requests=workload.request_rate * window,
        e2e_p95_s=state.e2e_p95_s, e2e_mean_s=state.e2e_s, tpot_p95_s=state.tpot_p95_s,
        tpot_mean_s=state.tpot_s, step_time_mean_s=state.step_time_s, steps=steps,
        running=state.batch * state.replicas, waiting=0.0, kv_cache_usage=state.kv_usage,
        preemption_rate=state.preemptions_per_s,
        generation_tps=workload.request_rate * workload.output_tokens,
        prompt_tps=workload.request_rate * workload.prompt_tokens,
        peak_running=state.batch * 1.6,
    )


def both(workload: Workload, config: perfmodel.Config, **kw) -> PolicyObservations:
    return PolicyObservations.of(observe(workload, config, 300, **kw), observe(workload, config, 75, **kw))


def auto(**kw) -> PolicySettings:
    base = dict(replicas=2, slo_e2e_s=15.0, slo_tpot_s=0.05, max_surge=1, max_unavailable=0, schedules=True)
    base.update(kw)
    return PolicySettings(**base)


def under_schedule(schedule: Schedule = SCHEDULE, replaced_k: int = 3, **kw) -> ControlState:
    base = dict(
        enabled=True, k=schedule.max_k, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
        schedule=schedule, schedule_replaced_k=replaced_k, schedule_step_scale=1.0,
    )
    base.update(kw)
    return ControlState(**base)


def workload(rate: float, alpha: float = 0.8) -> Workload:
    return Workload(rate, 1000, 300, 0, alpha)


# --- the step model agrees with itself -----------------------------------------------------------


def test_a_schedule_in_effect_whose_measurements_match_the_model_is_kept():
    settings, state = auto(), under_schedule()
    decision, after = step(settings, state, both(workload(8), SCHEDULE), NOW)
    assert not decision.changes
    assert after.schedule == SCHEDULE
    assert after.schedule_overhead_s is not None
    # The calibrated overhead is the truth's (0.5 ms) within the model's rounding.
    assert abs(after.schedule_overhead_s - TRUTH.schedule_overhead_s) < 0.3e-3


# --- load swings under a schedule: no restart ---------------------------------------------------


def test_a_surge_past_the_crossover_and_back_under_a_schedule_makes_no_change():
    """6 -> 36 -> 6 req/s, one evaluation a minute: every rule that would react to the load
    (tuning, SLO guard, fast fallback, hedge) is the schedule's job now."""
    settings, state = auto(), under_schedule()
    rates = [6] * 10 + [12, 20, 28, 36] + [36] * 20 + [28, 20, 12] + [6] * 10
    for i, rate in enumerate(rates):
        now = NOW + 60.0 * i
        decision, state = step(settings, state, both(workload(rate), SCHEDULE, now=now), now)
        assert not decision.changes, (rate, decision.rule, decision.reason)
    assert state.schedule == SCHEDULE
    assert state.since == NOW - 7200


def test_past_the_crossover_a_schedule_that_drafts_nothing_there_says_so_instead_of_missing_samples():
    """At 36 req/s the replicas run batches past 64, where SCHEDULE drafts nothing: the
    window has no drafted tokens by design. The hold says so (the range, the batch, when
    acceptance is measured again), not only that samples are missing; below the crossover
    (6 req/s) a window short of drafts is just short of them."""
    settings = auto()
    decision, _ = step(settings, under_schedule(), both(workload(36), SCHEDULE), NOW)
    assert not decision.changes and decision.rule is Rule.SAMPLES, decision.reason
    batch = perfmodel.steady_state(TRUTH, workload(36), SCHEDULE).batch
    assert batch > 64
    assert decision.reason.startswith("not enough samples in 5.0min: 0 drafted tokens < 2000 (schedule "
                                      "1-64:K3,65+:off drafts nothing from batch 65 on, and the replicas run "
                                      f"batches of {batch:.0f}: acceptance is measured again once the batch "
                                      "falls below 65; the schedule holds)"), decision.reason
    quiet = replace(observe(workload(6), SCHEDULE, 300), speculation=None)
    decision, _ = step(settings, under_schedule(), PolicyObservations.of(quiet, observe(workload(6), SCHEDULE, 75)), NOW)
    assert decision.rule is Rule.SAMPLES and decision.reason == (
        "not enough samples in 5.0min: 0 drafted tokens < 2000"), decision.reason


TWO_KS = Schedule(((1, 16, 4), (17, 1024, 2)))
"""Drafts of two lengths: vLLM counts accepted tokens per position, not drafted ones, so past
position 0 a position's trials are unknown once the batch runs in both ranges."""


def test_a_schedule_drafting_two_ks_reads_the_same_acceptance_at_every_load():
    """6 -> 30 -> 6 req/s under K 4 up to a batch of 16 and K 2 above, acceptance 0.8 all
    along. Read as if every draft were 4 tokens long, positions 3 and 4 (drafted only by the
    calm's few steps) looked rejected: acceptance read 0.3 at the peak, under the floor, and
    speculation went off on every replica."""
    settings, state = auto(), under_schedule(TWO_KS)
    for i, rate in enumerate([6, 12, 20, 30, 30, 20, 12, 6]):
        now = NOW + 60.0 * i
        observed = both(workload(rate), TWO_KS, now=now)
        decision, state = step(settings, state, observed, now)
        assert not decision.changes, (rate, decision.rule, decision.reason)
        assert abs(decision.alpha - 0.8) < 0.01, (rate, decision.alpha)
        positions = observed.window.speculation.alpha_per_position
        assert positions[0] == pytest.approx(0.8)
        if observed.window.speculation.draft_tokens < 4 * observed.window.speculation.drafts * 0.99:
            assert positions[1:] == (None, None, None), "past position 0 the counters do not say"
    assert state.schedule == TWO_KS


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(1.0, 40.0), min_size=1, max_size=12))
def test_load_swings_alone_never_restart_a_schedule(rates):
    """Whatever the load does, with acceptance unchanged a running schedule stays."""
    settings, state = auto(), under_schedule()
    for i, rate in enumerate(rates):
        now = NOW + 60.0 * i
        decision, state = step(settings, state, both(workload(rate), SCHEDULE, now=now), now)
        assert not decision.changes, (rate, decision.rule, decision.reason)


def test_the_acceptance_floor_still_leaves_a_schedule():
    settings, state = auto(), under_schedule()
    decision, after = step(settings, state, both(workload(6, alpha=0.15), SCHEDULE), NOW)
    assert decision.changes and decision.rule in (Rule.FLOOR, Rule.COLLAPSE)
    assert decision.schedule is None and after.schedule is None


# --- a truth-only penalty: reverted --------------------------------------------------------------


def test_a_truth_only_schedule_penalty_is_reverted_within_a_few_evaluations():
    """The truth's steps are 40 % slower under any schedule (the reported CUDA-graph
    fallback); the policy's prior does not know it. Rolled out at t0, live 3 minutes later:
    reverted within three evaluations after its first full window, and remembered."""
    truth = replace(TRUTH, schedule_penalty=0.4)
    settings = auto()
    t0 = NOW
    state = under_schedule(since=t0, live_since=t0 + 180.0)
    first_full = t0 + 180.0 + settings.warmup_s + settings.window_s
    reverted_at = None
    for i in range(20):
        now = t0 + 60.0 * (i + 1)
        decision, state = step(settings, state, both(workload(8), SCHEDULE, params=truth, now=now), now)
        if decision.changes:
            assert decision.rule is Rule.SCHEDULE_REVERT, decision.reason
            assert decision.k == 3 and decision.schedule is None
            reverted_at = now
            break
    assert reverted_at is not None
    assert reverted_at <= first_full + 3 * settings.evaluation_interval_s
    assert state.schedule is None and state.k == 3
    assert SCHEDULE.label in state.rejected_schedules
    assert "reverted" in (state.schedule_note or "")


SLOW_TRUTH = schedules.scaled_params(TRUTH, 3.0, None)
"""A GPU three times slower than the prior's fit."""
CLAMPED_SCALE = 5.0
"""What the step scale read when measured in a surge (the clamp; e2e run of #14 part 6)."""


def measured_baseline(params: EngineParams, rate: float, k: int = 3, alpha: float = 0.8) -> cs.PlainBaseline:
    """What a plain K measured on a full window at ``rate`` and acceptance ``alpha``: the
    baseline a schedule replacing it is checked against."""
    obs = observe(workload(rate, alpha), k, 300, params=params)
    alpha = estimate(obs, PolicySettings().tuning).alpha
    return cs.PlainBaseline(k=k, points=(cs.PlainPoint(obs.batch_per_pod, schedules._measured_per_token(obs), alpha),))


def first_revert(
    settings: PolicySettings, state: ControlState, params: EngineParams, rate: float, alpha: float = 0.8,
) -> float | None:
    """When the after-rollout check reverts the schedule of ``state`` (None: not in 20 minutes)."""
    for i in range(20):
        now = NOW + 60.0 * (i + 1)
        decision, state = step(settings, state, both(workload(rate, alpha), SCHEDULE, params=params, now=now), now)
        if decision.changes:
            assert decision.rule is Rule.SCHEDULE_REVERT, decision.reason
            return now
    return None


def test_a_penalty_hidden_by_a_step_scale_measured_mid_surge_is_reverted_against_the_plain_k_measured_before():
    """The e2e failure of #14 part 6: the schedule adopted in a surge, where the plain K's step
    scale read 5x (the clamp) against a true 3x; predicted with that scale, plain K=3 looked so
    slow that a 40 % penalty hid under the margin. What K=3 measured before the rollout, at
    the same batch, shows it."""
    truth = replace(SLOW_TRUTH, schedule_penalty=0.4)
    settings = auto()
    state = under_schedule(since=NOW, live_since=NOW + 180.0, schedule_step_scale=CLAMPED_SCALE,
                           plain_baseline=measured_baseline(SLOW_TRUTH, 8))
    reverted_at = first_revert(settings, state, truth, 8)
    first_full = NOW + 180.0 + settings.warmup_s + settings.window_s
    assert reverted_at is not None and reverted_at <= first_full + 3 * settings.evaluation_interval_s
    decision, _ = step(settings, under_schedule(live_since=NOW - 400.0 - settings.window_s, schedule_step_scale=CLAMPED_SCALE,
                                                plain_baseline=measured_baseline(SLOW_TRUTH, 8)),
                       both(workload(8), SCHEDULE, params=truth), NOW)
    assert "above K=3 measured before the schedule" in decision.reason, decision.reason


def test_a_schedule_without_penalty_is_kept_whatever_the_step_scale_read():
    """The other way round: a scale read too low (the prior's 1x on a 3x GPU) made plain K
    look cheap and would revert a schedule that costs nothing; the measured baseline keeps it."""
    settings = auto()
    for scale in (1.0, CLAMPED_SCALE):
        state = under_schedule(since=NOW, live_since=NOW + 180.0, schedule_step_scale=scale,
                               plain_baseline=measured_baseline(SLOW_TRUTH, 8))
        assert first_revert(settings, state, SLOW_TRUTH, 8) is None, scale


def test_the_baseline_measured_at_another_batch_is_moved_along_the_models_curve():
    """Measured at 4 req/s, the check at 12 req/s: the model's scale (5x, wrong) cancels in
    the ratio; the plain K's time per token at the new batch is the truth's within 5 %."""
    baseline = measured_baseline(SLOW_TRUTH, 4)
    obs = observe(workload(12), 3, 300, params=SLOW_TRUTH)

    est = estimate(obs, auto().tuning)
    params = schedules.scaled_params(auto().prior_params(), CLAMPED_SCALE, est.decay)
    moved, basis = schedules.plain_baseline_at(baseline, 3, params, est, obs.batch_per_pod)
    truth = schedules._measured_per_token(obs)
    assert abs(moved / truth - 1.0) < 0.05, (moved, truth)
    assert baseline.points[0][0] < obs.batch_per_pod / 1.5, "the batches must differ"
    assert schedules.plain_baseline_at(baseline, 2, params, est, obs.batch_per_pod) is None, "another K's baseline"


def test_the_baseline_is_moved_to_the_acceptance_of_the_window_checked():
    """Measured at acceptance 0.84, checked at 0.76 at the same load: K=3 makes fewer tokens
    per step, and its time per token rises with that. Moved to 0.76 the baseline is the
    truth's within 2 %; left at its own acceptance (a status from an older operator, which
    kept none) it is more than 5 % under the truth, as much as a schedule's overhead."""
    baseline = measured_baseline(TRUTH, 8, alpha=0.84)
    obs = observe(workload(8, alpha=0.76), 3, 300, params=TRUTH)
    est = estimate(obs, auto().tuning)
    params = schedules.scaled_params(auto().prior_params(), 1.0, est.decay)
    truth = schedules._measured_per_token(obs)
    moved, basis = schedules.plain_baseline_at(baseline, 3, params, est, obs.batch_per_pod)
    assert abs(moved / truth - 1.0) < 0.02, (moved, truth)
    assert "acceptance 0.84" in basis and "acceptance 0.76" in basis, basis
    older = cs.PlainBaseline(3, (baseline.points[0]._replace(acceptance=None),))
    unmoved, basis = schedules.plain_baseline_at(older, 3, params, est, obs.batch_per_pod)
    assert unmoved / truth - 1.0 < -0.05, (unmoved, truth)
    assert "acceptance" not in basis, basis


def test_a_schedule_checked_at_a_lower_acceptance_than_its_baseline_is_kept():
    """A schedule that costs its small overhead (the truth's 0.5 ms a step) rolled out after a
    window of acceptance 0.84, and checked in windows at 0.76: per token it is some 10 % slower
    than that baseline, all of it the acceptance's doing, which slows plain K=3 as much. Kept;
    a penalty at the same acceptances is still reverted (the check still sees one)."""
    settings = auto()
    state = under_schedule(since=NOW, live_since=NOW + 180.0, plain_baseline=measured_baseline(TRUTH, 8, alpha=0.84))
    assert first_revert(settings, state, TRUTH, 8, alpha=0.76) is None
    older = replace(state, plain_baseline=cs.PlainBaseline(3, (state.plain_baseline.points[0]._replace(acceptance=None),)))
    assert first_revert(settings, older, TRUTH, 8, alpha=0.76) is not None, "without the acceptance it reverts"
    assert first_revert(settings, state, replace(TRUTH, schedule_penalty=0.4), 8, alpha=0.76) is not None


def promoted_by_canary(state: ControlState, effect: float) -> ControlState:
    """``state`` with the schedule in effect promoted from a canary that measured it ``effect``
    slower per token than the plain K (3 paired windows)."""
    outcome = Outcome(Verdict.PROMOTE, "within 3% of the prediction", 3, 900.0, 900.0, effect=effect)
    record = Experiment(purpose=Purpose.CHANGE, candidate=f"draft_model {state.schedule.label}", candidate_hash="s",
                        incumbent_hash="k3", started_at=state.since - 1800, outcome=outcome, ended_at=state.since,
                        candidate_k=state.schedule.max_k, candidate_schedule=state.schedule, predicted_effect=0.04)
    return replace(state, experiments=(record,))


def test_a_schedule_is_judged_beyond_the_cost_its_canary_measured():
    """A schedule 10 % slower per token than K=3 at the calm: promoted after its canary
    measured 6 % (the cost it accepts for the loads it is for), the check after the rollout
    keeps it; rolled out without a canary, or with a 40 % penalty the canary never saw, it is
    reverted, and the reason names the canary's figure."""
    settings = auto()
    slower = replace(TRUTH, schedule_penalty=0.10)
    rolled = under_schedule(since=NOW, live_since=NOW + 180.0, plain_baseline=measured_baseline(TRUTH, 8))
    assert first_revert(settings, rolled, slower, 8) is not None, "without a canary the 8 % margin alone"
    canaried = promoted_by_canary(rolled, 0.06)
    assert first_revert(settings, canaried, slower, 8) is None
    # A Calibrate started under the schedule since (speculation off beside it) is no promotion.
    calibrating = Experiment(purpose=Purpose.CALIBRATE, candidate="off", candidate_hash="off", incumbent_hash="s",
                             started_at=NOW)
    assert first_revert(settings, replace(canaried, experiments=canaried.experiments + (calibrating,)), slower, 8) is None
    assert first_revert(settings, replace(rolled, experiments=(calibrating,)), slower, 8) is not None
    assert first_revert(settings, canaried, replace(TRUTH, schedule_penalty=0.4), 8) is not None
    checked = promoted_by_canary(under_schedule(since=NOW - 400.0 - settings.window_s,
                                                live_since=NOW - 400.0 - settings.window_s,
                                                plain_baseline=measured_baseline(TRUTH, 8)), 0.06)
    decision, _ = step(settings, checked, both(workload(8), SCHEDULE, params=replace(TRUTH, schedule_penalty=0.4)), NOW)
    assert decision.rule is Rule.SCHEDULE_REVERT, decision.reason
    assert "beyond the 6.0% its canary measured" in decision.reason, decision.reason


def at_capacity(offered: float, config: perfmodel.Config, params: EngineParams,
                queue_seen: bool = False) -> PolicyObservations:
    """What the reader reports of a service offered more than ``config`` serves: it finishes
    its capacity, the rest queues (the window's mean queue: half of what it grew by;
    ``queue_seen``: the reader read the queue's growth too)."""
    def saturated(window: float) -> Observation:
        state = perfmodel.steady_state(params, workload(offered), config)
        assert state.saturated, (offered, config)
        obs = observe(workload(offered), config, window, params=params)
        finished = state.capacity_rps
        return replace(obs, requests=finished * window, generation_tps=finished * workload(offered).output_tokens,
                       prompt_tps=finished * workload(offered).prompt_tokens,
                       waiting=(offered - finished) * window / 2,
                       queue_change=(offered - finished) * window if queue_seen else None)
    return PolicyObservations.of(saturated(300), saturated(75))


def test_a_schedule_that_falls_behind_a_load_plain_k_would_serve_is_reverted_long_after_its_rollout():
    """The reported MTP collapse: past a range's threshold the service's throughput falls
    far below what the plain K served. Days after the rollout (the check long over), a load
    plain K=3 is predicted to serve queues under the schedule: reverted, remembered, said why."""
    collapsing = replace(TRUTH, schedule_penalty=2.0)
    settings = auto()
    # Past the threshold the engine drafts nothing: the acceptance measured before stands in.
    state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    plain_capacity = perfmodel.capacity(TRUTH, workload(1), 3)
    offered = 0.7 * plain_capacity
    assert not schedules._checking(settings, state, NOW)
    assert perfmodel.capacity(collapsing, workload(offered), SCHEDULE) < 0.5 * plain_capacity
    decision, after = step(settings, state, at_capacity(offered, SCHEDULE, collapsing), NOW)
    assert decision.changes and decision.rule is Rule.SCHEDULE_REVERT, decision.reason
    assert decision.k == 3 and decision.schedule is None
    assert "fell behind its load" in decision.reason and "K=3 is predicted to serve" in decision.reason, decision.reason
    assert after.schedule is None and SCHEDULE.label in after.rejected_schedules
    assert "behind" in (after.schedule_note or "")


def test_a_collapse_past_a_batch_threshold_passes_the_rollout_check_and_is_reverted_when_load_crosses_it():
    """The reported MTP collapse as the truth plays it: steps three times slower under the
    schedule only from a running batch of 48 up. Rolled out in the calm (a batch of about 2),
    the check after the rollout measures exactly what the uniform truth would and keeps it;
    days later a load that crosses the threshold, which plain K=3 would serve, falls behind
    under the schedule: reverted by the throughput check."""
    collapsing = replace(TRUTH, schedule_penalty=2.0, schedule_penalty_from_batch=48)
    settings = auto()
    calm = both(workload(2), SCHEDULE, params=collapsing)
    assert calm == both(workload(2), SCHEDULE), "below the threshold the schedule costs what it always did"
    assert first_revert(settings, under_schedule(since=NOW, live_since=NOW + 180.0), collapsing, 2) is None
    uniform = replace(TRUTH, schedule_penalty=2.0)
    assert first_revert(settings, under_schedule(since=NOW, live_since=NOW + 180.0), uniform, 2) is not None

    plain_capacity = perfmodel.capacity(TRUTH, workload(1), 3)
    offered = 0.75 * plain_capacity
    assert perfmodel.capacity(collapsing, workload(offered), SCHEDULE) < 0.7 * plain_capacity
    assert perfmodel.capacity(TRUTH, workload(offered), SCHEDULE) > plain_capacity, "no collapse without the threshold"
    state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    decision, after = step(settings, state, at_capacity(offered, SCHEDULE, collapsing), NOW)
    assert decision.changes and decision.rule is Rule.SCHEDULE_REVERT, decision.reason
    assert "fell behind its load" in decision.reason, decision.reason
    assert after.schedule is None and SCHEDULE.label in after.rejected_schedules


def test_a_schedule_at_a_peak_is_judged_against_what_plain_k_measured_there_not_what_the_model_says():
    """Traced on an L40S-class GPU: the step scale measured at the calm put plain K's capacity at
    the peak a third above what it serves, and a schedule that carried the peak as well as plain K
    was reverted there, a restart into the peak. Here the GPU is three times slower than the
    prior and the scale read the prior's 1x: the model puts plain K=3 at three times what it
    serves. K=3 measured a full window near that load before the schedule; against that the
    schedule, queueing no worse than K=3 would, stays, and one that does collapse is still
    reverted, with the measurement named."""
    settings = auto()
    offered = 1.3 * perfmodel.capacity(SLOW_TRUTH, workload(1), 3)
    baseline = measured_baseline(SLOW_TRUTH, 0.9 * perfmodel.capacity(SLOW_TRUTH, workload(1), 3))

    def reverted(truth: EngineParams, plain_baseline: cs.PlainBaseline | None):
        state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8,
                               schedule_step_scale=1.0, plain_baseline=plain_baseline)
        decision, _ = step(settings, state, at_capacity(offered, SCHEDULE, truth), NOW)
        assert not decision.changes or decision.rule is Rule.SCHEDULE_REVERT, decision.reason
        return decision.reason if decision.changes else None

    assert "is predicted to serve" in (reverted(SLOW_TRUTH, None) or ""), "the model alone reverts it"
    assert reverted(SLOW_TRUTH, baseline) is None
    collapse = reverted(replace(SLOW_TRUTH, schedule_penalty=2.0), baseline)
    assert collapse is not None and "fell behind its load" in collapse, collapse
    assert "serves at this batch by what it measured before the schedule" in collapse, collapse


def test_a_queue_plain_k_could_not_serve_either_keeps_the_schedule():
    """A surge past every config's capacity queues under the schedule too; it serves more
    than plain K=3 would (off at the surge's batches), so it is no reason to go back."""
    settings = auto()
    state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    offered = 2.0 * perfmodel.capacity(TRUTH, workload(1), perfmodel.OFF)
    decision, after = step(settings, state, at_capacity(offered, SCHEDULE, TRUTH), NOW)
    assert not decision.changes, decision.reason
    assert after.schedule == SCHEDULE


DRAFTS_EVERYWHERE = Schedule(((1, 32, 5), (33, 1024, 3)))
"""A schedule chosen at the calm, before any peak: it drafts at every batch."""


@pytest.mark.parametrize("queue_seen", [True, False])
def test_a_schedule_past_its_capacity_at_a_peak_it_drafts_through_gives_way_to_the_move_to_off(queue_seen):
    """Traced in a generated swing (n-gram on the H200's measured steps): a schedule promoted at
    the calm drafted K=3 at every batch above 64, and the peak came at once: 108 req/s arrived,
    86 finished, the queue grew by the rest for 90 minutes while the fast fallback to off was
    held as the schedule's job. Past its capacity, with the queues' growth read, the schedule
    does not follow the load: the rules' move to off applies and the schedule is not chosen
    again. Its own queue alone (the reader without the growth) cannot tell a peak past every
    config, and the move stays held as the schedule's job."""
    settings = auto()
    state = under_schedule(DRAFTS_EVERYWHERE, since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    offered = 0.97 * perfmodel.capacity(TRUTH, workload(1), perfmodel.OFF)
    assert offered > 1.1 * perfmodel.capacity(TRUTH, workload(offered), DRAFTS_EVERYWHERE)
    decision, after = step(settings, state, at_capacity(offered, DRAFTS_EVERYWHERE, TRUTH, queue_seen), NOW)
    if queue_seen:
        assert decision.changes and decision.rule is Rule.TUNE and decision.config == perfmodel.OFF, decision.reason
        assert f"schedule {DRAFTS_EVERYWHERE.label} is past its capacity" in decision.reason, decision.reason
        assert after.schedule is None and DRAFTS_EVERYWHERE.label in after.rejected_schedules
        assert "left past its capacity" in (after.schedule_note or "")
    else:
        assert not decision.changes and decision.held is Held.SETTLED, decision.reason
        assert after.schedule == DRAFTS_EVERYWHERE


LONG_AT_THE_CALM = Schedule(((1, 32, 8), (33, 64, 6), (65, 1024, 3)))
"""The shape a canary promoted in `gen-9-05-swing-x2`: long drafts at the calm, K=3 above 64."""


def test_the_rules_price_a_schedule_as_it_runs_at_the_peak_not_as_its_largest_k():
    """The rules name a schedule by its largest K. Priced as that K, the schedule drafting
    K=3 at a peak's batch was modelled as K=8: its measured step, taken for K=8's, scaled
    every config's step down, and the move it left for was a plain K=2 that does not carry
    the peak. Modelled as it runs, the move is to speculation off, the one config that
    carries the peak, and the reason names the schedule it compares."""
    settings = auto()
    state = under_schedule(LONG_AT_THE_CALM, since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180,
                           last_alpha=0.8)
    offered = 0.97 * perfmodel.capacity(TRUTH, workload(1), perfmodel.OFF)
    assert perfmodel.capacity(TRUTH, workload(offered), 2) < offered
    decision, after = step(settings, state, at_capacity(offered, LONG_AT_THE_CALM, TRUTH, queue_seen=True), NOW)
    assert decision.changes and decision.config == perfmodel.OFF, decision.reason
    assert f"{LONG_AT_THE_CALM.label} 1.00x" in decision.reason, decision.reason
    assert after.schedule is None


def test_a_schedule_that_drafts_nothing_at_a_peak_past_every_config_stays_whatever_the_queue():
    """Past even speculation off's capacity, a schedule already off at the peak's batch has
    nothing a restart would add: it stays, the queue read or not."""
    settings = auto(max_surge=0, max_unavailable=1)
    state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    offered = 2.0 * perfmodel.capacity(TRUTH, workload(1), perfmodel.OFF)
    decision, after = step(settings, state, at_capacity(offered, SCHEDULE, TRUTH, queue_seen=True), NOW)
    assert not decision.changes, decision.reason
    assert after.schedule == SCHEDULE


def test_a_backlog_draining_into_the_calm_is_not_taken_for_a_schedule_falling_behind():
    """The e2e penalty story found it: the rollout's own backlog drained into the calm, and the
    long window (4.7 waiting per replica on average, 1.79 req/s finished a replica) looked
    66 % behind plain K=3. A drain mixes loads (its peak batch far above the mean), and once it
    is over the guard window has no queue: neither is a schedule falling behind."""
    settings = auto()
    state = under_schedule(since=NOW - 3 * 86400, live_since=NOW - 3 * 86400 + 180, last_alpha=0.8)
    collapsing = replace(TRUTH, schedule_penalty=2.0)
    behind = at_capacity(0.7 * perfmodel.capacity(TRUTH, workload(1), 3), SCHEDULE, collapsing)
    calm = both(workload(2), SCHEDULE)
    drain = replace(behind.window, peak_running=behind.window.batch_per_pod * 10)
    for observed in (PolicyObservations.of(drain, behind.guard), PolicyObservations.of(behind.window, calm.guard)):
        decision, after = step(settings, state, observed, NOW)
        assert not decision.changes, decision.reason
        assert after.schedule == SCHEDULE


def test_the_plain_k_baseline_is_kept_through_adoption_and_dropped_by_a_move_to_another_k():
    """Full windows of plain K=3 fill the baseline one per factor-2 band (the latest); a
    schedule replacing K=3 keeps it; a plain move to K=2 leaves it behind."""
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
    update = schedules.ScheduleUpdate(plain_point=cs.PlainPoint(5.0, 0.02, 0.8), at=NOW)
    from specdecode.control.decision import Decision

    hold = Decision(action=Action.HOLD, enabled=True, k=3, reason="", rule=Rule.HOLD, applied=False,
                    metrics_available=True, metrics_reason="", metrics_message="", speculation_effective=True,
                    effective_reason="", effective_message="")
    after = schedules.advance(state, state, hold, update)
    assert after.plain_baseline == cs.PlainBaseline(3, (cs.PlainPoint(5.0, 0.02, 0.8),))
    after = schedules.advance(after, after, hold, replace(update, plain_point=cs.PlainPoint(6.0, 0.021, 0.79)))
    after = schedules.advance(after, after, hold, replace(update, plain_point=cs.PlainPoint(40.0, 0.005, 0.81)))
    assert after.plain_baseline.points == (cs.PlainPoint(6.0, 0.021, 0.79), cs.PlainPoint(40.0, 0.005, 0.81))
    adopt = replace(hold, action=Action.SET_K, rule=Rule.SCHEDULE, schedule=SCHEDULE, applied=True)
    adopted = schedules.advance(replace(after, schedule=SCHEDULE), after, adopt,
                                schedules.ScheduleUpdate(replaced_k=3, replaced_scale=1.0, at=NOW))
    assert adopted.schedule == SCHEDULE and adopted.plain_baseline == after.plain_baseline
    tune = replace(hold, action=Action.SET_K, k=2, rule=Rule.TUNE, applied=True)
    moved = schedules.advance(replace(after, k=2), after, tune, schedules.ScheduleUpdate(at=NOW))
    assert moved.plain_baseline is None


def test_a_window_that_mixed_loads_is_no_baseline_nor_a_verdict():
    """A backlog draining into the calm (e2e: mean batch 15, peak 315): its time per token
    belongs to no one batch. Not recorded as the plain K's baseline, and a schedule's window
    like it reverts nothing."""
    settings = auto()
    plain = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
    steady = both(workload(8), 3)
    _, after = step(settings, plain, steady, NOW)
    assert after.plain_baseline is not None
    mixed = observe(workload(8), 3, 300)
    mixed = replace(mixed, peak_running=mixed.batch_per_pod * 10)
    _, after = step(settings, plain, PolicyObservations.of(mixed, observe(workload(8), 3, 75)), NOW)
    assert after.plain_baseline is None
    truth = replace(SLOW_TRUTH, schedule_penalty=0.4)
    state = under_schedule(live_since=NOW - settings.warmup_s - settings.window_s - 1.0,
                           plain_baseline=measured_baseline(SLOW_TRUTH, 8))
    window = observe(workload(8), SCHEDULE, 300, params=truth)
    decision, _ = step(settings, state, PolicyObservations.of(
        replace(window, peak_running=window.batch_per_pod * 10), observe(workload(8), SCHEDULE, 75, params=truth)), NOW)
    assert not decision.changes, decision.reason
    decision, _ = step(settings, state, both(workload(8), SCHEDULE, params=truth), NOW)
    assert decision.rule is Rule.SCHEDULE_REVERT, decision.reason


def test_a_plain_k_evaluation_records_its_window_and_the_baseline_survives_the_status():
    """A step on plain K=3 records the window it measured; written to status.observations and
    read back (a restarted operator keeps it)."""
    spec = _spec(replicas=2)
    status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, method="draft_model", k=3, since=timestamps.rfc3339(NOW - 7200),
        cause="Policy", config_hash="hash", live=True, live_since=timestamps.rfc3339(NOW - 7000),
        spec_hash=cs.declared_speculation_hash(spec),
    ))
    settings = replace(PolicySettings.from_spec(spec), slo_e2e_s=15.0)
    result = evaluation.evaluate(status, spec, settings, both(workload(2), 3), None,
                                 datetime.fromtimestamp(NOW, timezone.utc))
    stored = result.status.observations.plain_baseline
    assert stored is not None and stored.k == 3 and len(stored.points) == 1, result.status.observations
    again = cs.from_status(result.status, spec, datetime.fromtimestamp(NOW + 60, timezone.utc))
    assert again.plain_baseline is not None and again.plain_baseline.k == 3
    (point,) = again.plain_baseline.points
    assert point.batch > 0 and point.seconds_per_token > 0
    assert point.acceptance == pytest.approx(0.8, abs=0.03), "the window's acceptance is kept with it"


def test_the_revert_is_written_to_status_and_read_back():
    truth = replace(TRUTH, schedule_penalty=0.4)
    spec = _spec(replicas=2)
    status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, method="draft_model", k=3, since=timestamps.rfc3339(NOW - 600),
        cause="Policy", config_hash="hash", live=True, live_since=timestamps.rfc3339(NOW - 420),
        spec_hash=cs.declared_speculation_hash(spec), schedule=SCHEDULE.label, schedule_replaced_k=3,
        schedule_step_scale=1.0,
    ))
    state = cs.from_status(status, spec, datetime.fromtimestamp(NOW, timezone.utc))
    assert state.schedule.label == SCHEDULE.label
    settings = replace(PolicySettings.from_spec(spec), slo_e2e_s=15.0)
    result = evaluation.evaluate(status, spec, settings, both(workload(8), SCHEDULE, params=truth),
                                 None, datetime.fromtimestamp(NOW, timezone.utc))
    assert result.rerender and result.decision.rule is Rule.SCHEDULE_REVERT
    new = result.status
    assert new.speculation.schedule is None and new.speculation.k == 3
    assert [r.schedule for r in new.rejected_schedules] == [SCHEDULE.label]
    assert new.history[-1].from_schedule == SCHEDULE.label and new.history[-1].to_schedule is None
    again = cs.from_status(new, spec, datetime.fromtimestamp(NOW + 60, timezone.utc))
    assert SCHEDULE.label in again.rejected_schedules
    choice, _, _ = cs.choose(spec, new)
    assert choice.per_batch_size is None and choice.k == 3



def test_a_reconcile_keeps_the_schedule_the_loop_adopted():
    """The reconcile renders the schedule status holds and rewrites status.speculation when
    the rollout completes: it must carry the schedule over, or the next reconcile renders
    plain K (a restart) and the loop forgets what it adopted (found by the e2e test)."""
    from specdecode.control import status as cstatus

    spec = _spec(replicas=2)
    adopted = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, method="draft_model", k=3, since=timestamps.rfc3339(NOW), cause="Policy",
        spec_hash=cs.declared_speculation_hash(spec), schedule=SCHEDULE.label, schedule_replaced_k=3,
        schedule_step_scale=1.2, schedule_reason="chosen from batches 2, 300",
    ))
    at = datetime.fromtimestamp(NOW + 30, timezone.utc)
    for current in (adopted, None):
        current = current or reconciled
        choice, cause, reason = cs.choose(spec, current)
        assert choice.per_batch_size == SCHEDULE.rows()
        live = cstatus.RolloutState(exists=True, desired=2, replicas=2, updated=2, ready=2, available=2,
                                    observed=True, config_matches=True)
        outcome = cstatus.ReconcileOutcome(rollout=live, choice=choice, choice_cause=cause, choice_reason=reason,
                                           config_hash="h", method="draft_model", selector="x=y")
        reconciled = cstatus.next_status(current, outcome, spec, 1, at)
        effective = reconciled.speculation
        assert effective.live and effective.schedule == SCHEDULE.label
        assert (effective.schedule_replaced_k, effective.schedule_step_scale) == (3, 1.2)
        assert effective.schedule_reason == "chosen from batches 2, 300"
    assert cs.from_status(reconciled, spec, at).schedule == SCHEDULE

# --- support ---------------------------------------------------------------------------------------


def _spec(version: str | None = None, method: str = "draft_model", *, replicas: int | None = None,
          engine_args: list[str] | None = None, schedules: str = "Auto", **speculation) -> api.SpecDecodeServiceSpec:
    """K=3 with schedules on Auto; `version`, `replicas`, `engine_args`: the spec's, when given."""
    engine = {**({"version": version} if version is not None else {}),
              **({"extraArgs": engine_args} if engine_args else {})}
    return api.parse_spec({
        "model": {"name": "m"},
        "speculation": {"method": method, **({"draftModel": "d"} if method == "draft_model" else {}),
                        "numSpeculativeTokens": 3, **speculation},
        **({"engine": engine} if engine else {}),
        **({"replicas": replicas} if replicas is not None else {}),
        "autotune": {"schedules": schedules},
    })


def test_a_version_without_tables_keeps_plain_k_and_says_why():
    settings = replace(PolicySettings.from_spec(_spec("0.23.0")), replicas=2, slo_e2e_s=15.0)
    assert "0.23.0" in settings.schedules_unsupported
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
    decision, after = step(settings, state, both(workload(20), 3), NOW)
    assert decision.schedule is None and after.schedule is None
    assert "0.23.0" in after.schedule_note and "plain K" in after.schedule_note


def test_suffix_on_033_and_a_declared_table_keep_plain_k():
    assert "suffix" in schedule_support.unsupported_reason(_spec("0.33.0", "suffix"))
    declared = _spec("0.33.0", perBatchSizeK=[{"minBatchSize": 1, "maxBatchSize": 8, "k": 3}])
    assert "perBatchSizeK" in schedule_support.unsupported_reason(declared)
    assert schedule_support.unsupported_reason(_spec("0.33.0")) is None
    assert schedule_support.unsupported_reason(_spec("nightly")) is None


def test_a_schedule_in_effect_gives_way_to_the_plain_k_it_replaced_when_the_spec_can_no_longer_run_one():
    """A user who moves the engine to a vLLM without tables (a rollback in an incident), onto
    a data-parallel layout that drops them, or turns schedules Off, gets the plain K the
    schedule replaced, rendered, with the reason; not a render error asking them to remove a
    perBatchSizeK they never declared, which kept every child as it was."""
    from specdecode import constants as C
    from specdecode.control import status as cstatus
    from specdecode.render.workload import render_all

    schedule = Schedule(((1, 32, 6), (33, 1024, 2)))
    cases = (
        (_spec("0.23.0", replicas=2), "0.23.0"),
        (_spec("0.33.0", replicas=2, engine_args=["--data-parallel-size", "2"]), "ignored"),
        (_spec("0.33.0", replicas=2, schedules="Off"), "autotune.schedules is Off"),
    )
    for spec, why in cases:
        status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
            enabled=True, method="draft_model", k=schedule.max_k, since=timestamps.rfc3339(NOW - 600),
            cause="Policy", config_hash="hash", live=True, live_since=timestamps.rfc3339(NOW - 420),
            spec_hash=cs.declared_speculation_hash(spec), schedule=schedule.label, schedule_replaced_k=4,
            schedule_step_scale=1.0, reason="schedule adopted",
        ))
        choice, cause, reason = cs.choose(spec, status)
        assert choice.per_batch_size is None and choice.k == 4, why
        assert schedule.label in reason and why in reason and "K=4" in reason
        service = api.parse_service({"apiVersion": C.API_VERSION, "kind": C.KIND,
                                     "metadata": {"name": "llama", "namespace": "team-a"},
                                     "spec": spec.model_dump(by_alias=True, exclude_none=True)})
        render_all(service, choice)
        live = cstatus.RolloutState(exists=True, desired=2, replicas=2, updated=2, ready=2, available=2,
                                    observed=True, config_matches=True)
        outcome = cstatus.ReconcileOutcome(rollout=live, choice=choice, choice_cause=cause, choice_reason=reason,
                                           config_hash="h", method="draft_model", selector="x=y")
        reconciled = cstatus.next_status(status, outcome, spec, 1, datetime.fromtimestamp(NOW, timezone.utc))
        assert reconciled.speculation.schedule is None and reconciled.speculation.k == 4
        assert reconciled.speculation.reason == reason
        state = cs.from_status(reconciled, spec, datetime.fromtimestamp(NOW + 60, timezone.utc))
        assert state.schedule is None and state.config == 4


def test_schedules_off_change_nothing():
    settings = replace(auto(), schedules=False)
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
    for rate in (4, 20, 30):
        decision, after = step(settings, state, both(workload(rate), 3), NOW)
        assert decision.schedule is None and after.schedule is None and after.schedule_note is None


# --- adoption ----------------------------------------------------------------------------------------


def test_a_schedule_is_adopted_only_when_it_pays_and_renders_as_a_table():
    """Across loads, a plain K=3 service with schedules Auto: whatever is adopted must be a
    few-band schedule whose predicted saving met the threshold; the render carries it."""
    settings = auto()
    adopted = []
    for rate in (2, 6, 12, 20, 26, 30):
        state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
        decision, after = step(settings, state, both(workload(rate), 3), NOW)
        if decision.schedule is not None:
            assert decision.rule is Rule.SCHEDULE and decision.action is Action.SET_K
            assert 2 <= len(decision.schedule.bands) <= perfmodel.SCHEDULE_MAX_BANDS
            assert after.schedule == decision.schedule and after.schedule_replaced_k == 3
            assert after.since == NOW and after.live_since is None
            adopted.append(rate)
        else:
            assert after.schedule is None
    spec = _spec("0.33.0")
    choice = render_workload.SpeculationChoice(k=3, per_batch_size=SCHEDULE.rows())
    args = render_workload.vllm_args(spec, choice)
    assert any("num_speculative_tokens_per_batch_size" in a for a in args)


def test_a_surge_that_would_turn_speculation_off_adopts_a_schedule_and_the_calm_needs_no_restart():
    """Where a schedule is nearly free (a draft without memory of its own, no per-step cost),
    the tuning move to off at a surge becomes a schedule instead: the same one restart, and
    none when the load falls back (the plain policy restarts again)."""
    free = replace(TRUTH, draft_weight_tokens=0, draft_kv_ratio=0.0, schedule_overhead_s=0.0, spec_overhead_s=0.0)
    settings = auto(prior=free)
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                         batch_low=2.0, batch_high=3.0, observed_at=NOW - 60)
    decision, state = step(settings, state, both(workload(36), 3, params=free), NOW)
    assert decision.rule is Rule.SCHEDULE and decision.schedule is not None, decision.reason
    assert decision.reason.startswith("instead of off")
    schedule = decision.schedule
    assert schedule.k_at(2) == 3 and schedule.k_at(300) == 0
    live = NOW + 360.0
    state = replace(state, live_since=live)
    for i, rate in enumerate([36] * 10 + [20, 10, 6] + [6] * 10):
        now = live + 60.0 * (i + 1)
        decision, state = step(settings, state, both(workload(rate), schedule, params=free, now=now), now)
        assert not decision.changes, (rate, decision.rule, decision.reason)
    assert state.schedule == schedule


def test_a_schedule_that_drafts_at_every_batch_must_leave_the_acceptance_floor_a_way_out():
    """n-gram at K=1, acceptance 0.8, 2 replicas, maxSurge 0: the schedule on offer drafts in
    its top range too (K=8 up to 64, K=4 above), so should acceptance fall to the floor it
    carries less than K=1, and the rollout to off would have to run on one replica. At 12
    req/s that replica carries it (71 % of its capacity at the floor) and the schedule is
    adopted; at 14 req/s it would not (83 %, over the 80 % a restart may load), and the
    service stays on plain K, saying why, as the tuning rule does for a longer plain K."""
    prior = EngineParams.for_method("ngram")
    settings = auto(prior=prior, max_surge=0, method="ngram")
    adopted = {}
    for rate in (12, 14):
        state = ControlState(enabled=True, k=1, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                             batch_low=2.0, batch_high=300.0, observed_at=NOW - 60)
        decision, after = step(settings, state, both(workload(rate), 1, params=prior), NOW)
        adopted[rate] = decision.schedule
        if rate == 14:
            assert decision.schedule is None and after.schedule is None
            assert "it would shut the acceptance floor's way out" in after.schedule_note, after.schedule_note
            assert "a rollout to off would load the replicas left serving to 83%" in after.schedule_note
    assert adopted[12] is not None and adopted[12].bands[-1][2] > 0, "the schedule drafts in its top range"


def test_a_schedule_waits_for_a_load_its_restart_would_not_overload():
    """maxSurge 0, two replicas, K=4 at acceptance 0.6, the batch range of the last hours
    1-300: at 14 req/s the schedule that pays is adopted; at 18 req/s the rules hold their own
    move to K=1 (its restart, one replica carrying the load for minutes, would not repay
    itself), and the schedule, whose adoption restarts the pods (or borrows a replica for its
    canary) just the same, waits too, saying why. Before, it was adopted there at 119 % of
    what that replica carries."""
    free = replace(TRUTH, draft_weight_tokens=0, draft_kv_ratio=0.0, schedule_overhead_s=0.0, spec_overhead_s=0.0)
    settings = auto(prior=free, max_surge=0)
    outcomes = {}
    for rate in (14, 18):
        state = ControlState(enabled=True, k=4, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                             batch_low=1.0, batch_high=300.0, observed_at=NOW - 60)
        decision, after = step(settings, state, both(workload(rate, alpha=0.6), 4, params=free), NOW)
        outcomes[rate] = (decision, after)
    adopted, _ = outcomes[14]
    assert adopted.rule is Rule.SCHEDULE and adopted.applied and adopted.schedule is not None, adopted.reason
    held, after = outcomes[18]
    assert not held.changes and held.held is Held.PRICE and held.wanted is Rule.TUNE, held.reason
    assert after.schedule is None and "its restart would load the replicas left serving to 119%" in after.schedule_note


def _at_calm_remembering(peak: float | None, rate: float, max_surge: int = 0, **tuning) -> tuple:
    """A draft model at K=1 (acceptance 0.4, two replicas, maxSurge 0: it carries 33 req/s,
    speculation off 42) at the calm of ``rate``, whose batch range of the last hours has
    faded to the calm's (a real day's peak is 20 hours back), with ``peak`` the load of the
    last day (`memory.recent_peak`); ``tuning``: `PolicyTuning` fields changed."""
    prior = replace(TRUTH, schedule_overhead_s=0.2e-3)
    settings = auto(prior=prior, max_surge=max_surge)
    settings = replace(settings, tuning=replace(settings.tuning, **tuning))
    state = ControlState(enabled=True, k=1, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                         batch_low=2.0, batch_high=6.0, observed_at=NOW - 60,
                         recent_peak_rate=peak, recent_peak_at=None if peak is None else NOW - 3600)
    return step(settings, state, both(workload(rate, alpha=0.4), 1, params=prior), NOW)


def test_a_plain_k_that_cannot_carry_the_last_days_peak_gives_way_to_a_schedule_that_does():
    """At the calm K=1 is the best plain K and no schedule pays for its restart. Should the
    load of 36 req/s the service saw within the last day come back, K=1 (33 req/s) would be
    overloaded and, with maxSurge 0, locked there: its restart to off would overload the
    replica left serving. A schedule drafting K=1 at the calm's batches and nothing at the
    peak's carries it, for 2 % of the calm's e2e latency: it is adopted now, at the calm.
    No peak, one K=1 carries, or one past what the schedule carries (45: it carries 39.7,
    speculation off 42) changes nothing."""
    outcomes = {peak: _at_calm_remembering(peak, 6.0) for peak in (None, 30.0, 36.0, 45.0)}
    for peak in (None, 30.0, 45.0):
        decision, after = outcomes[peak]
        assert not decision.changes and after.schedule is None, (peak, decision.reason)
    decision, after = outcomes[36.0]
    assert decision.rule is Rule.SCHEDULE and decision.applied and decision.schedule is not None, after.schedule_note
    schedule = decision.schedule
    assert schedule.k_at(7) == 1 and schedule.k_at(142) == 0
    assert "the load reached 36.0 req/s within the last day and K=1 carries 33.2" in decision.reason
    assert after.schedule == schedule and after.schedule_replaced_k == 1
    carried = perfmodel.steady_state(replace(TRUTH, schedule_overhead_s=0.2e-3), workload(36.0, alpha=0.4), schedule)
    assert not carried.saturated
    surge, after = _at_calm_remembering(36.0, 6.0, max_surge=1)
    assert not surge.changes and after.schedule is None, "with maxSurge 1 a restart at the peak is no lock"


def test_a_schedule_that_would_carry_the_peak_for_too_much_of_the_calm_is_not_adopted():
    """At 12 req/s the calm's batch (18) already falls in the schedule's undrafted range: it
    would carry the peak for 6.9 % more time per token at today's batch, past the 5 % a
    schedule may cost to carry it (and near the 8 % at which the after-rollout check reverts
    it), and status says why. Speculation off, 5 % faster than K=1 there (inside the
    hysteresis), carries the peak too: the rules move to it, for the peak's sake (`rules`,
    readiness for the last day's peak). Where that move may cost nothing over the next hour,
    K=1 stays."""
    decision, after = _at_calm_remembering(36.0, 12.0)
    assert decision.action is Action.DISABLE and decision.rule is Rule.PEAK_READINESS and after.schedule is None
    assert decision.reason.startswith("ready for the peak: K=1 carries 33.2 req/s and the load reached 36.0")
    decision, after = _at_calm_remembering(36.0, 12.0, peak_readiness_price=0.0)
    assert not decision.changes and after.schedule is None, decision.reason
    assert "carries 39.7 req/s of the 36.0 that K=1 cannot" in after.schedule_note
    assert "+6.9% per token now (at most 5%)" in after.schedule_note


def test_a_schedule_that_carries_less_of_an_overloading_peak_than_the_plain_k_is_not_adopted():
    """n-gram K=3 at acceptance 0.75 (maxSurge 0) at 12 req/s, batches of the last hours 2-300:
    `1-32:K8,33+:K3` saves 5.5 % per token and is adopted with no peak remembered or one of 30
    req/s that both carry. A peak of 60 overloads K=3 (50.1 req/s) and the schedule alike,
    and the schedule's own cost carries 0.3 req/s less of it: at an overloaded peak every
    request a second less adds to the queue (on the H200's measured steps such a schedule,
    0.2 % short, made the peak's e2e 70 % longer). K=3 stays, and status says why."""
    prior = EngineParams.for_method("ngram")
    settings = auto(prior=prior, max_surge=0, method="ngram")
    outcomes = {}
    for peak in (None, 30.0, 60.0):
        state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                             batch_low=2.0, batch_high=300.0, observed_at=NOW - 60, recent_peak_rate=peak,
                             recent_peak_at=None if peak is None else NOW - 3600)
        outcomes[peak] = step(settings, state, both(workload(12, alpha=0.75), 3, params=prior), NOW)
    for peak in (None, 30.0):
        decision, _ = outcomes[peak]
        assert decision.rule is Rule.SCHEDULE and decision.schedule is not None, (peak, decision.reason)
        assert decision.schedule.label == "1-32:K8,33+:K3"
    held, after = outcomes[60.0]
    assert not held.changes and after.schedule is None, held.reason
    assert ("1-32:K8,33+:K3: saves 5.5% per token against K=3 but carries 49.8 req/s of the 60.0 the load "
            "reached within the last day, K=3 50.1") in after.schedule_note


def _off_remembering(peak: float, schedules_on: bool = True) -> tuple:
    """Speculation off for four hours (a re-probe is due) at a calm of 6 req/s, a draft model
    at acceptance 0.8, two replicas, maxSurge 0, and ``peak`` the load of the last day."""
    settings = auto(max_surge=0, schedules=schedules_on)
    state = ControlState(enabled=False, k=None, since=NOW - 4 * 3600, live_since=NOW - 4 * 3600 + 300,
                         ready_replicas=2, observed_at=NOW - 60, recent_peak_rate=peak, recent_peak_at=NOW - 3600)
    return step(settings, state, both(workload(6, alpha=0.8), 0), NOW)


def test_a_reprobe_no_plain_k_could_make_for_the_peak_runs_a_schedule_that_stops_drafting_there():
    """The re-probe's K=1 carries 35 req/s at the acceptance it assumes; the load reached 38
    within the last day, and with maxSurge 0 its restart back to off at that load would
    overload the replica left serving, so plain K stays off (rule 6). A schedule drafting at
    the calm's batches and not at the peak's carries 39.4 (speculation off: 42): the re-probe
    runs it, and speculation off is what it replaced (a revert returns there). With
    schedules Off the service stays off, as before; a peak K=1 carries re-probes plain K=1;
    one past what the schedule carries keeps the service off."""
    decision, after = _off_remembering(38.0)
    assert decision.rule is Rule.REPROBE and decision.action is Action.ENABLE and decision.applied, decision.reason
    schedule = decision.schedule
    assert schedule is not None and schedule.k_at(6) >= 1 and schedule.k_at(200) == 0
    assert decision.reason.startswith(f"re-probe with per-batch-size schedule {schedule.label}")
    assert "of the last day's peak of 38.0" in decision.reason
    assert after.enabled and after.schedule == schedule and after.schedule_replaced_k == perfmodel.OFF
    held, after = _off_remembering(38.0, schedules_on=False)
    assert not held.changes and not after.enabled and "staying off" in held.reason
    held, after = _off_remembering(40.0)
    assert not held.changes and not after.enabled, held.reason
    assert "short of the peak's 40.0" in after.schedule_note
    plain, after = _off_remembering(30.0)
    assert plain.rule is Rule.REPROBE and plain.schedule is None and after.k == 1, plain.reason


def test_a_schedule_a_reprobe_chose_is_reverted_to_speculation_off():
    """A schedule the re-probe chose from speculation off, under the truth's 40 % schedule
    penalty, is reverted to off, not to its largest K, and remembered as rejected."""
    truth = replace(TRUTH, schedule_penalty=0.4)
    settings = auto()
    state = under_schedule(replaced_k=perfmodel.OFF, since=NOW, live_since=NOW + 180.0)
    for i in range(20):
        now = NOW + 60.0 * (i + 1)
        decision, state = step(settings, state, both(workload(8), SCHEDULE, params=truth, now=now), now)
        if decision.changes:
            break
    assert decision.rule is Rule.SCHEDULE_REVERT and decision.action is Action.DISABLE, decision.reason
    assert not state.enabled and state.k is None and state.schedule is None
    assert SCHEDULE.label in state.rejected_schedules


def test_a_schedule_waits_for_the_verdict_of_a_running_canary():
    """A canary is testing K=2 against the running K=3: a schedule that would save more than
    3 % against K=3 is not adopted meanwhile (its restart would cancel the experiment, and
    K=3 is what the experiment may replace). Without the experiment it is."""
    free = replace(TRUTH, draft_weight_tokens=0, draft_kv_ratio=0.0, schedule_overhead_s=0.0, spec_overhead_s=0.0)
    settings = auto(prior=free)
    observed = both(workload(2, alpha=0.7), 3, params=free)
    calm = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                        batch_low=2.0, batch_high=300.0, observed_at=NOW - 60)
    hold = decide(settings, calm, observed, calm.history, NOW)
    assert not hold.changes, hold.reason
    adopted, _ = schedules.consider(settings, calm, observed, hold, NOW)
    assert adopted.rule is Rule.SCHEDULE and adopted.schedule is not None, adopted.reason
    testing = replace(calm, experiments=(Experiment(
        purpose=Purpose.CHANGE, candidate="draft_model K=2", candidate_hash="k2", incumbent_hash="k3",
        started_at=NOW - 600, candidate_k=2),))
    decision, update = schedules.consider(settings, testing, observed, hold, NOW)
    assert decision == hold
    assert "canary experiment (Change) runs" in update.note


def _canaried(replicas: int = 3) -> tuple[api.SpecDecodeServiceSpec, PolicySettings, ControlState]:
    """The calm of the test above with canary experiments on (the spec's default): three
    replicas, K=3 running with its config hash known, a schedule that pays on offer."""
    free = replace(TRUTH, draft_weight_tokens=0, draft_kv_ratio=0.0, schedule_overhead_s=0.0, spec_overhead_s=0.0)
    spec = _spec(replicas=replicas)
    settings = replace(PolicySettings.from_spec(spec, prior=free), slo_e2e_s=15.0, slo_tpot_s=0.05)
    assert settings.experiments is not None and settings.experiments.runs
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=replicas,
                         batch_low=2.0, batch_high=300.0, observed_at=NOW - 60,
                         config_hash=render_workload.config_hash(spec, render_workload.SpeculationChoice(k=3)))
    return spec, settings, state


def _run_canary(settings: PolicySettings, state: ControlState, factor: float, minutes: int):
    """One evaluation a minute at the calm's load; the canary's window is the running
    config's with its time per token ``factor`` times as long. Returns every decision, the
    scheduleReason after each, and the last state."""
    observed = both(workload(2, alpha=0.7), 3, params=settings.prior)
    decisions, notes = [], []
    for minute in range(1, minutes + 1):
        now = NOW + 60.0 * minute
        running = state.experiment
        canary = None
        if running is not None:
            wobble = 1.0 + 0.01 * ((minute % 3) - 1)
            window = observed.window  # one of its replicas' share of the traffic, on one pod
            canary = replace(window, tpot_mean_s=window.tpot_mean_s * factor * wobble, pods=1,
                             requests=window.requests / window.pods)
        decision, state = step(settings, state, observed, now, canary=canary)
        decisions.append(decision)
        notes.append(state.schedule_note or "")
        if decision.applied and decision.changes:
            break
    return decisions, notes, state


def test_a_schedule_the_operator_would_adopt_first_runs_on_a_canary_and_rolls_out_once_measured_better():
    """Experiments on: the schedule that pays is not rolled out on the model's word. It runs on
    one canary replica (its table rendered there), the running K=3 keeps every other replica,
    and it reaches them only when its windows measure it faster; then it replaces K=3 as an
    adoption would (a revert returns to K=3)."""
    spec, settings, state = _canaried()
    decision, state = step(settings, state, both(workload(2, alpha=0.7), 3, params=settings.prior), NOW)
    trial = state.experiment
    assert (decision.action, decision.rule, decision.wanted, decision.applied) == (
        Action.HOLD, Rule.EXPERIMENT, Rule.SCHEDULE, False), decision.reason
    assert trial is not None and trial.candidate_schedule is not None and trial.purpose is Purpose.CHANGE
    schedule = trial.candidate_schedule
    assert state.schedule is None and state.k == 3 and state.since == NOW - 7200, "no replica restarted"
    assert f"draft_model {schedule.label} on 1 canary replica(s) against K=3" in decision.reason
    # What status keeps is what the canary renders: its table, under its own config hash.
    record = trial.to_record()
    assert record.candidate_schedule == schedule.label and record.candidate_k == schedule.max_k
    assert Experiment.from_record(api.ExperimentRecord.model_validate(record.to_wire()), spec) == trial
    canary = experiment_shell.canary_for(spec, record)
    assert canary.candidate.per_batch_size == schedule.rows()
    assert render_workload.config_hash(spec, canary.candidate) == trial.candidate_hash != state.config_hash
    assert "on trial" in state.schedule_note

    decisions, _, after = _run_canary(settings, state, factor=0.9, minutes=40)
    promotion = decisions[-1]
    assert (promotion.rule, promotion.applied, promotion.schedule) == (Rule.EXPERIMENT, True, schedule), promotion.reason
    assert "promoted" in promotion.reason and after.experiments[-1].outcome.verdict.value == "Promote"
    assert not any(d.changes for d in decisions[:-1]), "nothing restarted before the verdict"
    assert after.schedule == schedule and after.schedule_replaced_k == 3
    assert after.schedule_step_scale is not None
    assert after.schedule_note.startswith("promoted from its canary: the canary is"), after.schedule_note
    assert after.history[-1].to_schedule == schedule.label


def test_a_schedule_measured_as_predicted_where_its_canary_runs_is_promoted_without_a_gain_there():
    """The schedule is chosen for the batches of the last hours (2 to 300 here): at the
    calm's batch the model predicts it about 2 % faster than K=3, below the 3 % a plain move
    must show. Its canary is judged against that prediction: measured 1.6 % faster (the
    model's word, within 3 %), it is promoted; a plain move measured so would be no gain."""
    spec, settings, state = _canaried()
    _, state = step(settings, state, both(workload(2, alpha=0.7), 3, params=settings.prior), NOW)
    predicted = state.experiment.predicted_effect
    assert predicted is not None and -0.03 < predicted < 0.0
    assert state.experiment.to_record().predicted_effect == predicted
    decisions, _, after = _run_canary(settings, state, factor=1.0 + predicted + 0.005, minutes=40)
    assert decisions[-1].rule is Rule.EXPERIMENT and decisions[-1].applied, decisions[-1].reason
    assert "where the model predicts" in decisions[-1].reason and "within 3% of the prediction" in decisions[-1].reason
    assert after.schedule is not None and -0.03 < after.experiments[-1].outcome.effect < 0.0


def test_a_schedule_measured_slower_on_its_canary_never_reaches_the_replicas_and_waits_out_a_backoff():
    """The same schedule, its canary 10 % slower per token than K=3 where the model predicts
    about the same (a cost the model does not know): aborted, K=3 keeps running untouched, and
    the schedule is not offered again before reprobeInterval (scheduleReason says why, and
    the rules' own moves go on meanwhile)."""
    spec, settings, state = _canaried()
    decisions, notes, after = _run_canary(settings, state, factor=1.1, minutes=60)
    trials = [x for x in after.experiments if x.candidate_schedule is not None]
    assert trials and trials[0].outcome.verdict.value == "AbortWorse", [x.outcome for x in trials]
    assert abs(trials[0].predicted_effect) < 0.03 and "worse than predicted" in trials[0].outcome.reason
    assert not any(d.changes for d in decisions) and after.schedule is None and after.k == 3
    ended, retry = trials[0].ended_at, trials[0].ended_at + settings.reprobe_interval_s
    at_verdict = notes[int(round((ended - NOW) / 60.0)) - 1]
    assert at_verdict.startswith(f"{trials[0].candidate_schedule.label} ended AbortWorse on its canary"), at_verdict
    waiting = [(d, n) for i, (d, n) in enumerate(zip(decisions, notes)) if ended < NOW + 60.0 * (i + 1) < retry]
    assert waiting and all("lost 1 canary experiment(s) in a row" in n and "not tried again" in n
                           for _, n in waiting), waiting[0][1]
    assert all(d.rule is not Rule.EXPERIMENT for d, _ in waiting), "no canary holds the rules meanwhile"
    assert len(trials) == 2 and trials[1].started_at >= retry, "tried again once the back-off is over"


def test_recommend_mode_advises_the_schedule_auto_mode_would_adopt_and_changes_nothing():
    """The surge of the test above in Recommend mode: the advice is the schedule (its label
    in status.recommendation, a history line once), the service keeps running plain K=3."""
    free = replace(TRUTH, draft_weight_tokens=0, draft_kv_ratio=0.0, schedule_overhead_s=0.0, spec_overhead_s=0.0)
    settings = auto(prior=free, mode=api.AutotuneMode.RECOMMEND)
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2,
                         batch_low=2.0, batch_high=3.0, observed_at=NOW - 60)
    decision, after = step(settings, state, both(workload(36), 3, params=free), NOW)
    assert decision.rule is Rule.SCHEDULE and decision.schedule is not None and not decision.applied, decision.reason
    assert after.schedule is None and after.k == 3 and after.since == state.since
    advice = decision.recommendation_status(NOW)
    assert advice["schedule"] == decision.schedule.label and advice["k"] == decision.schedule.max_k
    assert [e.to_schedule for e in after.history] == [decision.schedule.label]
    assert after.schedule_note.endswith("(Recommend mode)")
    # The same advice on the next evaluation adds no second history line.
    again, later = step(settings, after, both(workload(36), 3, params=free, now=NOW + 60), NOW + 60)
    assert again.schedule == decision.schedule and len(later.history) == 1


def test_off_mode_chooses_no_schedule_and_says_so():
    settings = auto(mode=api.AutotuneMode.OFF)
    state = ControlState(enabled=True, k=3, since=NOW - 7200, live_since=NOW - 7000, ready_replicas=2)
    decision, after = step(settings, state, both(workload(30), 3), NOW)
    assert decision.schedule is None and after.schedule is None
    assert after.schedule_note == "autotune mode Off: no schedule is chosen"


# --- robustness ---------------------------------------------------------------------------------


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=st.sampled_from((perfmodel.OFF, 1, 3, 6, SCHEDULE, TWO_KS)),
    method=st.sampled_from(("draft_model", "eagle", "ngram")),
    rates=st.tuples(st.floats(0.2, 90.0), st.floats(0.2, 90.0)),
    alphas=st.tuples(st.floats(0.02, 0.97), st.floats(0.02, 0.97)),
    scale=st.floats(0.4, 3.0),
    replicas=st.sampled_from((1, 2, 4)),
    max_surge=st.sampled_from((0, 1)),
    slo_tpot=st.sampled_from((0.01, 0.05, 0.5)),
    recent_low=st.none() | st.floats(0.02, 0.97),
)
def test_the_control_step_decides_whatever_the_windows_read(
    config, method, rates, alphas, scale, replicas, max_surge, slo_tpot, recent_low,
):
    """Any load, any acceptance on either window (a shift, a collapse, a surge past every
    config's capacity), any engine speed against the prior, any replicas, rollout surge and
    SLO, under plain K, off or a schedule: the step decides, within the bounds, and says why.
    (An acceptance shift at a load the chosen config could not serve once failed the
    evaluation with a division by its score.)"""
    settings = auto(method=method, replicas=replicas, max_surge=max_surge, slo_tpot_s=slo_tpot)
    truth = replace(scaled_params(EngineParams.for_method(method), scale, None), replicas=replicas)
    if isinstance(config, Schedule):
        state = under_schedule(config, ready_replicas=replicas, recent_low_alpha=recent_low)
    else:
        state = ControlState(enabled=config > 0, k=config or None, since=NOW - 7200, live_since=NOW - 7000,
                             ready_replicas=replicas, recent_low_alpha=recent_low)
    observed = PolicyObservations.of(
        observe(workload(rates[0], alphas[0]), config, 300, params=truth),
        observe(workload(rates[1], alphas[1]), config, 75, params=truth),
    )
    decision, after = step(settings, state, observed, NOW)
    assert decision.reason
    if decision.enabled:
        assert settings.min_k <= decision.k <= settings.max_k, decision.reason
    assert after.enabled == decision.enabled


def test_a_table_the_engine_ignores_is_reverted_once_the_batch_leaves_its_longest_range():
    """vllm#51510 as the truth plays it: the runner drafts the table's largest K at every
    batch. At the calm the batch sits in the K 3 range, where an ignored table is the table:
    kept. Once the load puts the batch in the K 0 range, the requests still draft 3 tokens a
    step: reverted to the plain K it replaced, remembered as rejected, the reason naming the
    drafts and the batch."""
    ignoring = replace(TRUTH, schedule_ignored=True)
    settings = auto()
    assert first_revert(settings, under_schedule(since=NOW, live_since=NOW + 180.0), ignoring, 2) is None
    offered = 0.8 * perfmodel.capacity(TRUTH, workload(1), 3)
    honoured = observe(workload(offered), SCHEDULE, 300)
    ignored = observe(workload(offered), SCHEDULE, 300, params=ignoring)
    assert ignored.batch_per_pod > 64 and not perfmodel.steady_state(ignoring, workload(offered), SCHEDULE).saturated
    assert schedules._table_ignored(SCHEDULE, honoured) is None
    state = under_schedule(since=NOW - 86400, live_since=NOW - 86400 + 180, last_alpha=0.8)
    decision, after = step(settings, state, both(workload(offered), SCHEDULE, params=ignoring), NOW)
    assert decision.changes and decision.rule is Rule.SCHEDULE_REVERT, decision.reason
    assert decision.k == 3 and decision.schedule is None
    assert "the engine ignores the table" in decision.reason and "vllm#51510" in decision.reason, decision.reason
    assert after.schedule is None and SCHEDULE.label in after.rejected_schedules
    assert "ignores the table" in (after.schedule_note or "")
