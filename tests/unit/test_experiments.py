"""The canary's sequential test: verdicts a user would see in status.experiments."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from collections import Counter

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from specdecode.control.experiments import ArmWindow, Evidence, ExperimentSettings, PairedWindow, Verdict, judge

MINUTE = 60.0


def judge_all(windows, started_at, now, settings):
    evidence = Evidence()
    for window in windows:
        evidence = evidence.add(window)
    return judge(evidence, windows[-1] if windows else None, started_at, now, settings)


def simulate(effect: float, noise: float, seed: int, settings: ExperimentSettings = ExperimentSettings(),
             windows: int = 60, requests: float = 60.0, predicted: float | None = None):
    """An experiment whose candidate changes time per token by ``effect`` (relative), with
    lognormal window-to-window noise on both arms; returns (verdict, windows used).
    ``predicted``: a schedule's canary, judged against the model's prediction."""
    rng = random.Random(seed)
    evidence = Evidence()
    outcome = None
    for i in range(windows):
        incumbent = 0.020 * math.exp(rng.gauss(0.0, noise))
        candidate = 0.020 * (1.0 + effect) * math.exp(rng.gauss(0.0, noise))
        window = PairedWindow(at=MINUTE * (i + 1), candidate=ArmWindow(requests, candidate),
                              incumbent=ArmWindow(3 * requests, incumbent))
        evidence = evidence.add(window)
        outcome = judge(evidence, window, 0.0, MINUTE * (i + 1), settings, predicted)
        if outcome.verdict.final:
            return outcome.verdict, i + 1
    return outcome.verdict, windows


@pytest.mark.parametrize("noise", [0.02, 0.05])
def test_a_candidate_that_is_no_faster_is_promoted_at_most_alpha_of_the_time(noise):
    verdicts = Counter(simulate(0.0, noise, seed)[0] for seed in range(300))
    assert verdicts[Verdict.PROMOTE] / 300 <= ExperimentSettings().alpha


@pytest.mark.parametrize("noise", [0.02, 0.05])
def test_a_clearly_faster_candidate_is_promoted_and_never_called_worse(noise):
    runs = [simulate(-0.10, noise, seed) for seed in range(200)]
    verdicts = Counter(v for v, _ in runs)
    assert verdicts[Verdict.PROMOTE] == 200
    assert max(n for _, n in runs) <= 15  # windows: a quarter hour at one window per minute


def test_a_clearly_slower_candidate_is_aborted_as_worse():
    verdicts = Counter(simulate(+0.08, 0.02, seed)[0] for seed in range(100))
    assert verdicts[Verdict.ABORT_WORSE] == 100


def test_no_difference_on_quiet_windows_ends_early_as_not_worth_a_rollout():
    runs = [simulate(0.0, 0.01, seed) for seed in range(100)]
    assert Counter(v for v, _ in runs)[Verdict.ABORT_NO_GAIN] >= 90
    assert sorted(n for _, n in runs)[50] <= 15


@pytest.mark.parametrize("noise", [0.01, 0.02])
def test_a_schedule_that_costs_what_the_model_predicts_where_the_canary_runs_is_promoted(noise):
    """A schedule chosen for the batches of the last hours may cost a little at today's load
    and pay at the peak the canary does not see: measured as predicted (2 % slower here), it
    is promoted within the experiment's maximum duration, where the test of a plain move
    would call it no gain. (Its margin is the minimum effect, 3 %: at 5 % window-to-window
    noise most such experiments time out undecided and the running config stays.)"""
    runs = [simulate(0.02, noise, seed, predicted=0.02) for seed in range(200)]
    assert Counter(v for v, _ in runs)[Verdict.PROMOTE] == 200
    assert max(n for _, n in runs) <= ExperimentSettings().max_duration_s / MINUTE
    plain = Counter(simulate(0.02, 0.01, seed)[0] for seed in range(100))
    assert plain[Verdict.PROMOTE] == 0


@pytest.mark.parametrize("noise", [0.02, 0.05])
def test_a_schedule_a_minimum_effect_worse_than_predicted_is_promoted_at_most_alpha_of_the_time(noise):
    settings = ExperimentSettings()
    worse = (1.0 + 0.01) * (1.0 + settings.min_effect) - 1.0
    verdicts = Counter(simulate(worse, noise, seed, predicted=0.01)[0] for seed in range(300))
    assert verdicts[Verdict.PROMOTE] / 300 <= settings.alpha


def test_a_schedule_clearly_worse_than_predicted_is_aborted_as_worse():
    verdicts = Counter(simulate(0.10, 0.02, seed, predicted=0.0)[0] for seed in range(100))
    assert verdicts[Verdict.ABORT_WORSE] == 100


def test_a_window_whose_arms_served_different_traffic_adds_no_evidence():
    """Three windows of a clearly faster canary, then one where the running config drains a
    backlog (four times the canary's requests per replica, its time per token a load's, not a
    config's): that window is not counted, and the reason says why. Counts a few apart, or
    far apart only on a handful of requests, are the same traffic."""
    from specdecode.control.experiments import Experiment, Purpose, traffic_skew
    from specdecode.control.perfmodel import Workload

    from .test_policy import observe

    load = Workload(4, 1000, 300, 0, 0.8)
    incumbent = observe(load, 3, 300)
    canary = replace(incumbent, tpot_mean_s=incumbent.tpot_mean_s * 0.8)
    draining = replace(incumbent, requests=incumbent.requests * 4)
    assert traffic_skew(canary, incumbent) is None
    assert traffic_skew(canary, replace(incumbent, requests=incumbent.requests * 1.1)) is None
    assert "its arms served different traffic" in traffic_skew(canary, draining)
    few = replace(canary, requests=6.0)
    assert traffic_skew(few, replace(incumbent, requests=12.0)) is None  # noise on a few requests
    settings = ExperimentSettings(min_requests=0)
    experiment = Experiment(Purpose.CHANGE, "K=4", "c", "i", started_at=0.0, candidate_k=4)
    for i in range(1, 3):
        experiment = experiment.observe(canary, incumbent, MINUTE * i, settings)
    before = experiment.evidence
    skipped = experiment.observe(canary, draining, MINUTE * 3, settings)
    assert skipped.evidence == before and skipped.last_window_at == MINUTE * 3
    assert "the last window is not counted: its arms served different traffic" in skipped.outcome.reason
    counted = experiment.observe(canary, incumbent, MINUTE * 3, settings)
    assert counted.evidence.paired == before.paired + 1


def test_no_statistical_verdict_before_each_arm_has_the_minimum_of_requests():
    settings = ExperimentSettings(min_requests=1000)
    windows = [PairedWindow(MINUTE * i, ArmWindow(50, 0.010), ArmWindow(150, 0.020 * (1 + 0.001 * i)))
               for i in range(1, 11)]
    outcome = judge_all(windows, 0.0, MINUTE * 10, settings)
    assert outcome.verdict is Verdict.CONTINUE
    assert "500 of 1000 requests" in outcome.reason


def test_an_slo_breach_on_the_canary_aborts_at_once():
    settings = ExperimentSettings(tpot_p95_slo_s=0.050)
    windows = [PairedWindow(MINUTE, ArmWindow(80, 0.018, tpot_p95_s=0.070), ArmWindow(240, 0.020, tpot_p95_s=0.040))]
    outcome = judge_all(windows, 0.0, MINUTE, settings)
    assert outcome.verdict is Verdict.ABORT_SLO
    assert "70 ms on the canary" in outcome.reason


def test_a_breach_both_arms_share_is_the_load_not_the_candidate():
    settings = ExperimentSettings(tpot_p95_slo_s=0.050)
    windows = [PairedWindow(MINUTE, ArmWindow(80, 0.018, tpot_p95_s=0.070), ArmWindow(240, 0.020, tpot_p95_s=0.060))]
    assert judge_all(windows, 0.0, MINUTE, settings).verdict is Verdict.CONTINUE


def test_a_canary_whose_acceptance_is_still_below_the_floor_is_aborted_at_its_first_window():
    # A re-probe after a collapse into an acceptance that has not recovered: one window of
    # one replica, not the test's minimum of windows (the collapse guard's speed).
    settings = ExperimentSettings(acceptance_floor=0.35, min_drafts=2000)
    collapsed = [PairedWindow(MINUTE, ArmWindow(80, 0.018, alpha=0.20, alpha_trials=6000), ArmWindow(240, 0.020))]
    outcome = judge_all(collapsed, 0.0, MINUTE, settings)
    assert outcome.verdict is Verdict.ABORT_WORSE
    assert "below the acceptance floor 0.35" in outcome.reason


@pytest.mark.parametrize("alpha, trials", [(0.20, 500), (0.34, 6000), (0.60, 6000)])
def test_a_canary_near_or_above_the_floor_or_with_few_drafts_is_left_to_the_test(alpha, trials):
    settings = ExperimentSettings(acceptance_floor=0.35, min_drafts=2000)
    window = [PairedWindow(MINUTE, ArmWindow(80, 0.018, alpha=alpha, alpha_trials=trials), ArmWindow(240, 0.020))]
    assert judge_all(window, 0.0, MINUTE, settings).verdict is Verdict.CONTINUE


def test_an_experiment_without_traffic_times_out_and_keeps_the_incumbent():
    idle = [PairedWindow(MINUTE * i, ArmWindow(0, None), ArmWindow(0, None)) for i in range(1, 31)]
    assert judge_all(idle, 0.0, MINUTE * 29, ExperimentSettings(max_duration_s=1800)).verdict is Verdict.CONTINUE
    outcome = judge_all(idle, 0.0, MINUTE * 30, ExperimentSettings(max_duration_s=1800))
    assert outcome.verdict is Verdict.ABORT_TIMEOUT


@given(st.lists(st.tuples(st.floats(0.005, 0.2), st.floats(0.005, 0.2), st.floats(0, 500)), max_size=20),
       st.floats(0, 4000))
# Found by hypothesis: three windows 24x apart either way overflowed the interval's bound.
@example(pairs=[(0.1875, 0.0078125, 1.0), (0.1875, 0.0078125, 1.0), (0.005859375, 0.1875, 1.0)], now=0.0)
def test_the_reported_interval_contains_the_estimate_and_promotion_needs_a_faster_canary(pairs, now):
    windows = [PairedWindow(MINUTE * i, ArmWindow(r, c), ArmWindow(r, inc)) for i, (c, inc, r) in enumerate(pairs, 1)]
    outcome = judge_all(windows, 0.0, now, ExperimentSettings())
    if outcome.effect is not None:
        low, high = outcome.interval
        assert low <= outcome.effect <= high
    if outcome.verdict is Verdict.PROMOTE:
        assert outcome.effect <= -ExperimentSettings().min_effect and outcome.interval[1] < 0


# --------------------------------------------------------------------- an experiment's life


from specdecode import api  # noqa: E402
from specdecode import constants as C  # noqa: E402
from specdecode.api import ExperimentRecord  # noqa: E402
from specdecode.control.experiments import CanaryPlan, Experiment, Purpose, settings_from_spec  # noqa: E402
from specdecode.control.metrics import ConfigKey, Observation  # noqa: E402


def observation(config_hash: str, tpot: float, requests: float, at: float, tpot_p95: float | None = None,
                pods: int = 1) -> Observation:
    return Observation(
        key=ConfigKey("team-a", "llama", config_hash), window_s=60.0, evaluated_at=at, newest_sample_at=at,
        pods=pods, speculation=None, requests=requests, e2e_p95_s=None, e2e_mean_s=None, tpot_p95_s=tpot_p95,
        tpot_mean_s=tpot, step_time_mean_s=None, steps=requests * 100, running=None, waiting=None,
        kv_cache_usage=None, preemption_rate=None, generation_tps=None, prompt_tps=None,
    )


def run_experiment(effect: float, seed: int, restart_every: int | None = None) -> Experiment:
    rng = random.Random(seed)
    settings = ExperimentSettings()
    experiment = Experiment(Purpose.CHANGE, "ngram K=5", "cand", "inc", started_at=1_000_000.0)
    now = experiment.started_at
    for i in range(60):
        now += MINUTE
        candidate = observation("cand", 0.020 * (1 + effect) * math.exp(rng.gauss(0, 0.02)), 70, now)
        incumbent = observation("inc", 0.020 * math.exp(rng.gauss(0, 0.02)), 210, now, pods=3)
        experiment = experiment.observe(candidate, incumbent, now, settings)
        if restart_every and i % restart_every == 0:
            record = ExperimentRecord.model_validate(experiment.to_record().model_dump(by_alias=True))
            experiment = Experiment.from_record(record)
        if not experiment.running:
            break
    return experiment


@pytest.mark.parametrize("effect", [-0.08, 0.0, 0.06])
def test_an_operator_restarted_every_window_reaches_the_same_verdict_at_the_same_time(effect):
    for seed in range(20):
        steady, restarted = run_experiment(effect, seed), run_experiment(effect, seed, restart_every=1)
        assert (restarted.status_verdict, restarted.evidence.windows) == (steady.status_verdict, steady.evidence.windows)
        assert restarted.ended_at == steady.ended_at


def test_the_status_record_says_how_it_ended_with_the_measured_effect():
    record = run_experiment(-0.08, seed=1).to_record()
    assert record.verdict == "Promote"
    assert record.effect_low <= record.effect <= record.effect_high < 0
    assert "faster per token" in record.reason and record.ended_at is not None


def test_a_missing_canary_arm_is_an_empty_window_not_an_error():
    experiment = Experiment(Purpose.REPROBE, "ngram K=3", "cand", "inc", started_at=0.0)
    later = experiment.observe(None, observation("inc", 0.02, 100, 60.0), 60.0, ExperimentSettings())
    assert later.running and later.evidence.windows == 1 and later.evidence.paired == 0


def test_a_cancelled_experiment_is_recorded_as_cancelled():
    experiment = Experiment(Purpose.CONTROL, "off", "cand", "inc", started_at=0.0).cancel("the spec changed", 120.0)
    record = experiment.to_record()
    assert (record.verdict, record.reason, record.ended_at) == ("Cancelled", "the spec changed", "1970-01-01T00:02:00Z")


def test_the_plan_sets_the_tests_thresholds_and_the_spec_its_slo():
    spec = api.parse_service({
        "apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
                 "autotune": {"slo": {"p95TimePerOutputToken": "50ms"}}},
    }).spec
    settings = settings_from_spec(spec, CanaryPlan(max_duration_s=3600, min_requests=500, min_effect=0.05))
    assert (settings.max_duration_s, settings.min_requests, settings.min_effect, settings.tpot_p95_slo_s) == (3600.0, 500.0, 0.05, 0.05)


# --- cancel_reason: the one check of the control step and of the reconcile ---------------------------

from specdecode.control.experiments import cancel_reason  # noqa: E402
from specdecode.render.workload import SpeculationChoice, config_hash  # noqa: E402


def cancel_spec(replicas: int = 3, **overrides) -> api.SpecDecodeServiceSpec:
    speculation = {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                   "numSpeculativeTokens": 3, "minK": 1, "maxK": 8}
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "speculation": speculation,
            "replicas": replicas}
    for key, value in overrides.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return api.parse_spec(body)


def running_on(spec: api.SpecDecodeServiceSpec, candidate_k: int | None, incumbent_k: int | None = 3) -> Experiment:
    """A running experiment of ``candidate_k`` (None: off) against ``incumbent_k`` under ``spec``."""
    candidate = "off" if candidate_k is None else f"draft_model K={candidate_k}"
    return Experiment(Purpose.CHANGE, candidate,
                      config_hash(spec, SpeculationChoice(k=candidate_k)),
                      config_hash(spec, SpeculationChoice(k=incumbent_k)), started_at=0.0, candidate_k=candidate_k)


def test_an_experiment_the_spec_still_allows_goes_on():
    spec = cancel_spec()
    running = running_on(spec, 5)
    assert cancel_reason(spec, running, running.incumbent_hash) is None
    assert cancel_reason(spec, running, None) is None  # the running config not known yet: no verdict on it


@pytest.mark.parametrize("edit, candidate_k, excluded, expected", [
    ({"autotune": {"mode": "Recommend"}}, 5, (), "spec.autotune.mode is Recommend: experiments run in Auto mode only"),
    ({"autotune": {"mode": "Off"}}, 5, (), "spec.autotune.mode is Off"),
    ({"autotune": {"experiments": {"enabled": False}}}, 5, (), "the canary cannot run: experiments are turned off"),
    ({"replicas": 1}, 5, (), "the canary cannot run: a capacity-neutral canary of 1 replica(s) needs spec.replicas >= 2"),
    ({"engine": {"maxNumSeqs": 64}}, 5, (), "the spec changed the candidate's engine config"),
    ({"speculation": {"maxK": 4}}, 5, (), "spec.speculation no longer allows draft_model K=5"),
    ({"speculation": {"allowDisable": False}}, None, (), "spec.speculation no longer allows off"),
    ({}, 5, (1, 2, 3, 4, 5, 6, 7, 8), "spec.speculation no longer allows draft_model K=5"),
])
def test_each_change_of_the_spec_that_no_longer_allows_the_experiment_says_why(edit, candidate_k, excluded, expected):
    running = running_on(cancel_spec(), candidate_k)
    edited = cancel_spec(**edit)
    # The running config as the edited spec renders it (an engine edit moves every hash alike).
    running_hash = config_hash(edited, SpeculationChoice(k=3)) if "engine" not in edit else running.incumbent_hash
    reason = cancel_reason(edited, running, running_hash, frozenset(excluded))
    assert reason is not None and reason.startswith(expected)


def test_a_running_config_other_than_the_one_compared_with_cancels():
    spec = cancel_spec()
    running = running_on(spec, 5)
    moved = config_hash(spec, SpeculationChoice(k=None))
    reason = cancel_reason(spec, running, moved)
    assert reason is not None and f"{running.incumbent_hash} -> {moved}" in reason
