"""The canary's sequential test: verdicts a user would see in status.experiments."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdecode.control.experiments import ArmWindow, PairedWindow, ExperimentSettings, Verdict, judge

MINUTE = 60.0


def simulate(effect: float, noise: float, seed: int, settings: ExperimentSettings = ExperimentSettings(),
             windows: int = 60, requests: float = 60.0):
    """An experiment whose candidate changes time per token by ``effect`` (relative), with
    lognormal window-to-window noise on both arms; returns (verdict, windows used)."""
    rng = random.Random(seed)
    seen: list[PairedWindow] = []
    outcome = None
    for i in range(windows):
        incumbent = 0.020 * math.exp(rng.gauss(0.0, noise))
        candidate = 0.020 * (1.0 + effect) * math.exp(rng.gauss(0.0, noise))
        seen.append(PairedWindow(at=MINUTE * (i + 1), candidate=ArmWindow(requests, candidate),
                                 incumbent=ArmWindow(3 * requests, incumbent)))
        outcome = judge(seen, 0.0, MINUTE * (i + 1), settings)
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


def test_no_statistical_verdict_before_each_arm_has_the_minimum_of_requests():
    settings = ExperimentSettings(min_requests=1000)
    windows = [PairedWindow(MINUTE * i, ArmWindow(50, 0.010), ArmWindow(150, 0.020 * (1 + 0.001 * i)))
               for i in range(1, 11)]
    outcome = judge(windows, 0.0, MINUTE * 10, settings)
    assert outcome.verdict is Verdict.CONTINUE
    assert "500 of 1000 requests" in outcome.reason


def test_an_slo_breach_on_the_canary_aborts_at_once():
    settings = ExperimentSettings(tpot_p95_slo_s=0.050)
    windows = [PairedWindow(MINUTE, ArmWindow(80, 0.018, tpot_p95_s=0.070), ArmWindow(240, 0.020, tpot_p95_s=0.040))]
    outcome = judge(windows, 0.0, MINUTE, settings)
    assert outcome.verdict is Verdict.ABORT_SLO
    assert "70 ms on the canary" in outcome.reason


def test_a_breach_both_arms_share_is_the_load_not_the_candidate():
    settings = ExperimentSettings(tpot_p95_slo_s=0.050)
    windows = [PairedWindow(MINUTE, ArmWindow(80, 0.018, tpot_p95_s=0.070), ArmWindow(240, 0.020, tpot_p95_s=0.060))]
    assert judge(windows, 0.0, MINUTE, settings).verdict is Verdict.CONTINUE


def test_an_experiment_without_traffic_times_out_and_keeps_the_incumbent():
    idle = [PairedWindow(MINUTE * i, ArmWindow(0, None), ArmWindow(0, None)) for i in range(1, 31)]
    assert judge(idle, 0.0, MINUTE * 29, ExperimentSettings(max_duration_s=1800)).verdict is Verdict.CONTINUE
    outcome = judge(idle, 0.0, MINUTE * 30, ExperimentSettings(max_duration_s=1800))
    assert outcome.verdict is Verdict.ABORT_TIMEOUT


@given(st.lists(st.tuples(st.floats(0.005, 0.2), st.floats(0.005, 0.2), st.floats(0, 500)), max_size=20),
       st.floats(0, 4000))
def test_the_reported_interval_contains_the_estimate_and_promotion_needs_a_faster_canary(pairs, now):
    windows = [PairedWindow(MINUTE * i, ArmWindow(r, c), ArmWindow(r, inc)) for i, (c, inc, r) in enumerate(pairs, 1)]
    outcome = judge(windows, 0.0, now, ExperimentSettings())
    if outcome.effect is not None:
        low, high = outcome.interval
        assert low <= outcome.effect <= high
    if outcome.verdict is Verdict.PROMOTE:
        assert outcome.effect <= -ExperimentSettings().min_effect and outcome.interval[1] < 0
