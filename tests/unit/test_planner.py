"""The receding-horizon planner: its transitions, its search and its objective; the forecast
from a service's own load history; and the policy's plan on the calibrated model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from specdecode.control import forecast as fc
from specdecode.control import planner
from specdecode.control.perfmodel import OFF, EngineParams, Workload, evaluate_phase, steady_state
from specdecode.control.planner import Piece, RolloutShape, SlotRun, rollout_pieces


# --- transitions -------------------------------------------------------------------------------


def test_one_replica_without_surge_is_an_outage_for_a_restart():
    pieces = rollout_pieces(3, OFF, RolloutShape(1, 0, 1, 180.0))
    assert pieces == (Piece(0.0, OFF, 0), Piece(180.0, OFF, 1))


def test_two_replicas_roll_one_at_a_time_and_serve_the_majority_config():
    pieces = rollout_pieces(3, OFF, RolloutShape(2, 0, 1, 180.0))
    assert [(p.offset, p.config, p.serving) for p in pieces] == [(0.0, 3, 1), (180.0, OFF, 1), (360.0, OFF, 2)]


def test_a_surge_keeps_every_replica_serving():
    pieces = rollout_pieces(3, OFF, RolloutShape(2, 1, 0, 180.0))
    assert all(p.serving == 2 for p in pieces)
    assert pieces[-1] == Piece(360.0, OFF, 2)
    assert planner.serving_during_rollout(RolloutShape(2, 1, 0, 180.0)) == 2


def test_max_unavailable_two_takes_two_down_per_round():
    shape = RolloutShape(4, 0, 2, 100.0)
    assert planner.serving_during_rollout(shape) == 2
    assert planner.rollout_s(shape) == 200.0


@given(replicas=st.integers(1, 8), surge=st.integers(0, 3), unavailable=st.integers(0, 3))
@hsettings(max_examples=60, deadline=None)
def test_every_rollout_ends_on_the_new_config_on_every_replica(replicas, surge, unavailable):
    if surge == 0 and unavailable == 0:
        unavailable = 1  # the API refuses a rollout that can make no progress
    pieces = rollout_pieces(3, OFF, RolloutShape(replicas, surge, unavailable, 60.0))
    assert pieces[-1].config == OFF and pieces[-1].serving == replicas
    assert [p.offset for p in pieces] == sorted(p.offset for p in pieces)
    assert all(0 <= p.serving <= replicas for p in pieces)


# --- the search ----------------------------------------------------------------------------------


def _toy(loads, capacity, latency, restart=0.5):
    """A toy world: slot i has load loads[i]; config c serves up to capacity[c] at latency[c];
    above its capacity the queue grows and every queued request costs a second per slot;
    a change costs ``restart`` of latency for that slot."""

    def run_slot(i, prev, c, queue):
        over = max(0.0, loads[i] - capacity[c])
        queue_end = queue + over
        lat = latency[c] + queue_end + (restart if prev != c else 0.0)
        good = min(loads[i], capacity[c]) if queue_end == 0 else 0.0
        return SlotRun(lat, good, queue_end)

    return run_slot


def test_the_plan_leaves_a_config_that_cannot_carry_a_steady_load():
    loads = [10.0] * 6
    run = _toy(loads, {3: 8.0, OFF: 12.0}, {3: 1.0, OFF: 1.2})
    plan = planner.plan([1.0] * 6, [OFF, 3], 3, run)
    assert plan.first == OFF
    assert plan.gain > 1.0  # a queue that grows for ever costs more than any restart


def test_the_plan_keeps_a_config_whose_gain_does_not_repay_the_restart():
    loads = [5.0] * 3
    run = _toy(loads, {3: 8.0, OFF: 12.0}, {3: 1.0, OFF: 0.95}, restart=2.0)
    assert planner.plan([1.0] * 3, [OFF, 3], 3, run).first == 3


def test_the_plan_moves_at_the_calm_before_a_forecast_peak():
    # K=3 is faster at the calm but cannot carry the peak in slot 3; a move at the peak
    # itself pays the restart under load: the plan moves before it.
    loads = [4.0, 4.0, 4.0, 10.0, 10.0, 10.0]

    def run_slot(i, prev, c, queue):
        capacity = {3: 8.0, OFF: 12.0}[c]
        restart = 0.2 if loads[i] < 8 else 20.0  # a restart at the peak overloads the replicas left
        over = max(0.0, loads[i] - capacity)
        lat = {3: 1.0, OFF: 1.1}[c] + queue + over + (restart if prev != c else 0.0)
        return SlotRun(lat, min(loads[i], capacity), queue + over)

    plan = planner.plan([1.0] * 6, [OFF, 3], 3, run_slot)
    assert plan.chosen.configs.index(OFF) <= 2


def test_the_plan_scores_at_least_every_static_choice():
    loads = [4.0, 10.0, 4.0, 10.0]
    run = _toy(loads, {3: 8.0, 2: 9.0, OFF: 12.0}, {3: 1.0, 2: 1.05, OFF: 1.2})
    plan = planner.plan([1.0] * 4, [OFF, 2, 3], 3, run)
    statics = [score for path, score in plan.candidates if path.source.startswith("static:")]
    assert plan.score >= max(statics) - 1e-12


def test_headline_is_the_lower_of_the_two_ratios():
    best = planner.best_axes([planner.Axes(100.0, 2.0), planner.Axes(120.0, 3.0)])
    assert best == planner.Axes(120.0, 2.0)
    assert planner.headline(planner.Axes(120.0, 3.0), best)[0] == pytest.approx(2.0 / 3.0)


# --- the forecast --------------------------------------------------------------------------------


def _history(rates, start=0.0):
    history = fc.LoadHistory()
    for i, rate in enumerate(rates):
        history = history.record(rate, start + i * fc.BUCKET_S + 1.0)
    return history


def test_the_history_keeps_one_rate_per_bucket_and_stays_bounded():
    history = fc.LoadHistory().record(5.0, 30.0).record(9.0, 60.0)
    assert history.rates == (5.0,)  # the bucket has its value
    history = history.record(7.0, 3 * fc.BUCKET_S + 1)
    assert history.rates == (5.0, None, None, 7.0)
    long = _history([1.0] * (fc.MAX_BUCKETS + 10))
    assert len(long.rates) == fc.MAX_BUCKETS
    assert long.start == 10 * fc.BUCKET_S


def test_a_flat_history_forecasts_the_present():
    history = _history([5.0, 5.1, 4.9, 5.0] * 10)
    now = len(history.rates) * fc.BUCKET_S
    forecast = fc.forecast(history, now, 5.0, 5.0, (900.0, 900.0, 1800.0))
    assert forecast.method == "present"
    assert forecast.rates == (5.0, 5.0, 5.0)


def test_a_repeating_cycle_is_forecast_back_no_later_than_it_comes():
    # A 4-hour cycle (24 buckets): calm 6 buckets, peak 9, calm 9; seen once, then 4 calm
    # buckets: the peak returns 30 minutes from now (slot 2 of 15, 15, 30, 60, 60 minutes).
    # One peak does not tell the period: every lag from 22 buckets on fits what was seen,
    # and the forecast takes the earliest return that fits (prepared early, never late).
    cycle = [4.0] * 6 + [20.0] * 9 + [4.0] * 9
    seen = cycle + [4.0] * 4
    history = _history(seen)
    now = (len(seen) - 1) * fc.BUCKET_S + 1.0
    forecast = fc.forecast(history, now, 4.0, 4.0, (900.0, 900.0, 1800.0, 3600.0, 3600.0))
    assert forecast.method == "seasonal"
    first_peak = next(i for i, r in enumerate(forecast.rates) if r >= 12.0)
    assert first_peak <= 2
    assert forecast.rates[-1] <= 12.0  # and it passes


def test_a_rising_load_is_carried_on_and_a_drift_is_not():
    history = fc.LoadHistory()
    rising = fc.forecast(history, 0.0, 12.0, 8.0, (900.0, 900.0, 1800.0))
    assert rising.method == "trend" and rising.rates[-1] > rising.rates[0] > 12.0
    drift = fc.forecast(history, 0.0, 8.4, 8.0, (900.0, 900.0))
    assert drift.method == "present"


# --- the policy's plan on the calibrated model ----------------------------------------------------


def test_the_policy_plan_on_the_model_moves_off_an_overloaded_draft():
    from specdecode.control.estimates import Calibration, Estimate
    from specdecode.control.planning import plan_now
    from specdecode.control.settings import PolicySettings

    params = EngineParams(replicas=2)
    settings = PolicySettings(replicas=2, max_k=4, restart_s=180.0)
    probe = Workload(1.0, 1000.0, 300.0, 0.0, 0.7)
    k3 = steady_state(params, probe, 3, 2).capacity_rps
    off = steady_state(params, probe, OFF, 2).capacity_rps
    assert off > k3
    rate = (k3 + off) / 2.0  # K=3 cannot carry it, off can
    est = Estimate(
        window_s=300.0, requests=rate * 300, request_rate=rate, rate_rel_stderr=0.01,
        prompt_tokens=1000.0, output_tokens=300.0, waiting=0.0, batch_per_replica=None,
        step_time_s=None, alpha=0.7, alpha_pooled=0.7, alpha_stderr=0.01, decay=1.0,
        draft_tokens=1e6, e2e_p95_s=None, tpot_p95_s=None,
    )
    calibration = Calibration(params, params, None)
    forecast = fc.Forecast((rate,) * 5, "present")
    planned = plan_now(calibration, est, settings, 3, (OFF, 1, 2, 3, 4), forecast)
    assert planned.first != 3
    assert steady_state(params, probe, planned.first, 2).capacity_rps > rate
    phase = evaluate_phase(params, Workload(rate, 1000.0, 300.0, 0.0, 0.7), 3, 3600.0, 0.0, 2)
    assert phase.queue_end > 0 and not math.isinf(phase.queue_end)


# --- planner mode through the production evaluation ----------------------------------------------


def test_planner_mode_shows_its_plan_and_keeps_the_load_history_for_a_restart():
    from dataclasses import replace as dc_replace
    from datetime import datetime, timedelta, timezone

    from specdecode import api
    from specdecode.control import evaluation
    from specdecode.control import state as cs
    from specdecode.control.estimates import PolicyObservations
    from specdecode.control.settings import PolicySettings, PolicyTuning

    from .test_policy import observe

    t0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
    spec = api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
                           "autotune": {"mode": "Auto"}})
    settings = dc_replace(PolicySettings.from_spec(spec), tuning=PolicyTuning(planner=True))
    status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, k=3, method="ngram", since=(t0 - timedelta(hours=2)).isoformat(),
        live_since=(t0 - timedelta(hours=2)).isoformat(), config_hash="", live=True,
        spec_hash=cs.declared_speculation_hash(spec)))
    workload = Workload(2.0, 1000.0, 300.0, 0.0, 0.7)
    for minute in range(0, 31, 10):
        now = t0 + timedelta(minutes=minute)
        window = observe(workload, 3, settings.window_s)
        observed = PolicyObservations.of(window, observe(workload, 3, settings.guard_window_s), 2.0)
        result = evaluation.evaluate(status, spec, settings, observed, 1, now)
        status = result.status
    plan = status.plan
    assert plan is not None and len(plan.configs) == len(plan.slot_seconds) == len(plan.forecast_request_rate)
    assert plan.forecast_method == "present"
    assert plan.forecast_request_rate[0] == pytest.approx(2.0, rel=0.05)
    assert status.load_history is not None and len(status.load_history.rates) == 4
    # A restarted operator reads the same history back from status.
    restored = cs.from_status(status, spec, t0 + timedelta(minutes=31), 1)
    assert restored.load_history.rates == tuple(status.load_history.rates)


@pytest.mark.parametrize("peak, history_hours, moves", [
    (None, 25, True),  # a day of history and no peak in it: the longer draft's gain is taken
    (38.0, 25, False),  # K=4 (37.5 req/s) cannot carry the day's peak; K=1 (38.1) can
    (20.0, 25, True),  # both carry the peak
    (None, 0, True),  # a young service: a doubling (8 req/s) is the peak it guards against
])
def test_planner_mode_keeps_the_capacity_the_days_peak_needs(peak, history_hours, moves):
    """At the calm (4 req/s, draft model at acceptance 0.85, maxSurge 0) the plan prefers K=4,
    18 % faster per token than the running K=1. A move that gives capacity away must also be
    worth its restart should the recent peak return: at 38 req/s K=4 runs into the next peak
    overloaded, with no restart affordable then, so the move waits, and says why."""
    from specdecode.control import rules
    from specdecode.control.decision import Action
    from specdecode.control.forecast import LoadHistory
    from specdecode.control.settings import PolicyTuning

    from .test_policy import NIGHT, NOW, _capacity, auto, both, on

    settings = replace(auto(max_surge=0, slo_tpot_s=None, slo_e2e_s=None), tuning=PolicyTuning(planner=True))
    history = LoadHistory(NOW - history_hours * 3600, (4.0,) * (history_hours * 6)) if history_hours else LoadHistory()
    state = replace(on(1), recent_peak_rate=peak, load_history=history)
    decision = rules.decide(settings, state, both(NIGHT, 1), (), NOW)
    assert _capacity(decision, 4) < 38.0 < _capacity(decision, 1)
    if moves:
        assert decision.action is Action.SET_K and decision.k == 4 and decision.rule == "plan"
    else:
        assert decision.action is Action.HOLD and decision.k == 1
        assert "should the recent peak of 38 req/s return it gains: -" in decision.reason
        assert "(worth -" in decision.reason and "keeping K=1 at 4.00 req/s" in decision.reason
