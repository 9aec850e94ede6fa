"""The performance model: formulas, monotonicities and the field numbers of REFERENCE.md."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode.control.perfmodel import (
    OFF,
    EngineParams,
    EngineParamsError,
    Workload,
    acceptance_rate,
    best_config,
    capacity,
    compare_configs,
    effective_alpha,
    evaluate_phase,
    expected_tokens_per_step,
    kv_capacity,
    mean_accepted_length,
    param_names,
    position_acceptance,
    speedup,
    steady_state,
    step_time,
)

H100 = EngineParams()
LOW_LOAD = dict(request_rate=0.2, prompt_tokens=1000, output_tokens=300)

alphas = st.floats(min_value=0.0, max_value=0.99)
ks = st.integers(min_value=1, max_value=10)


def low(alpha: float, temperature: float = 0.0) -> Workload:
    return Workload(**LOW_LOAD, acceptance=alpha, temperature=temperature)


def tpot_gain(params: EngineParams, w: Workload, k: int) -> float:
    return steady_state(params, w, OFF).tpot_s / steady_state(params, w, k).tpot_s


# --- acceptance formulas -------------------------------------------------------------------


@given(alphas, ks)
def test_expected_tokens_matches_closed_form(alpha: float, k: int) -> None:
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens_per_step(alpha, k) == pytest.approx(closed, rel=1e-9)


@given(alphas, ks)
def test_acceptance_rate_matches_design_formula(alpha: float, k: int) -> None:
    if alpha == 0:
        assert acceptance_rate(alpha, k) == 0
        return
    closed = alpha * (1 - alpha**k) / ((1 - alpha) * k)
    assert acceptance_rate(alpha, k) == pytest.approx(closed, rel=1e-9)
    assert mean_accepted_length(alpha, k) == pytest.approx(closed * k, rel=1e-9)


@given(alphas, ks)
def test_emission_rises_with_alpha_and_k(alpha: float, k: int) -> None:
    e = expected_tokens_per_step(alpha, k)
    assert expected_tokens_per_step(min(0.999, alpha + 0.01), k) >= e
    assert expected_tokens_per_step(alpha, k + 1) >= e
    assert 1.0 <= e <= k + 1


@given(alphas, ks, st.floats(min_value=0.5, max_value=1.0))
def test_position_acceptance_decays(alpha: float, k: int, decay: float) -> None:
    probs = position_acceptance(alpha, k, decay)
    assert len(probs) == k
    assert all(a >= b for a, b in zip(probs, probs[1:]))
    if decay < 0.99 and alpha > 0.05 and k > 1:
        assert expected_tokens_per_step(alpha, k, decay) < expected_tokens_per_step(alpha, k)


def test_off_emits_one_token_per_step() -> None:
    assert expected_tokens_per_step(0.9, 0) == 1.0
    assert acceptance_rate(0.9, 0) == 0.0


def test_temperature_lowers_acceptance_and_clips() -> None:
    assert effective_alpha(0.8, 0.0, H100) == 0.8
    assert effective_alpha(0.8, 0.7, H100) < 0.8
    assert effective_alpha(0.8, 100.0, EngineParams(temperature_sensitivity=1.0)) == 0.0


# --- step cost ------------------------------------------------------------------------------


def test_step_time_follows_the_published_fit() -> None:
    # Plain decode at batch 1 with 1000 tokens of context: 5.9 + 0.021 + 0.039 + 1.2 ms.
    assert step_time(H100, OFF, 1, 1000) == pytest.approx(7.16e-3, rel=1e-6)
    # Verification of K+1 tokens per sequence and K draft steps cost more per step.
    assert step_time(H100, 5, 64, 1000) > step_time(H100, OFF, 64, 1000)


@given(st.integers(0, 8), st.floats(1, 500), st.floats(1, 8000))
def test_step_time_rises_with_batch_and_k(k: int, batch: float, ctx: float) -> None:
    assert step_time(H100, k, batch + 1, ctx) > step_time(H100, k, batch, ctx)
    assert step_time(H100, k + 1, batch, ctx) > step_time(H100, k, batch, ctx)


def test_draft_model_memory_shrinks_the_kv_cache_but_ngram_does_not() -> None:
    assert kv_capacity(H100, 5) < kv_capacity(H100, OFF)
    ngram = EngineParams.for_method("ngram")
    assert kv_capacity(ngram, 5) == kv_capacity(ngram, OFF)


# --- REFERENCE.md field numbers -------------------------------------------------------------


def test_matched_draft_at_low_load_gives_about_1_6x_with_k_3_to_5() -> None:
    for alpha in (0.8, 0.85):
        gains = {k: tpot_gain(H100, low(alpha), k) for k in range(1, 9)}
        best = max(gains, key=gains.get)
        assert 3 <= best <= 5
        assert 1.45 <= gains[best] <= 1.8


def test_k5_best_among_3_5_7_10_for_a_greedy_matched_draft() -> None:
    w = low(0.9)
    assert best_config(H100, w, ks=(3, 5, 7, 10)) == 5


def test_cheap_eagle_heads_favour_longer_drafts() -> None:
    eagle = EngineParams.for_method("eagle")
    best = best_config(eagle, low(0.8))
    assert 5 <= best <= 8


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3])
def test_low_acceptance_is_a_net_loss_for_a_draft_model(alpha: float) -> None:
    for rate in (0.2, 5, 20, 40):
        w = Workload(rate, 1000, 300, acceptance=alpha)
        assert best_config(H100, w) == OFF, (alpha, rate)


def test_break_even_acceptance_of_a_draft_model_lies_between_0_3_and_0_4() -> None:
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if max(tpot_gain(H100, low(mid), k) for k in range(1, 9)) < 1:
            lo = mid
        else:
            hi = mid
    assert 0.3 <= lo <= 0.4


def test_poorly_matched_draft_is_roughly_break_even() -> None:
    gains = [tpot_gain(H100, low(0.45), k) for k in (1, 2)]
    assert all(0.85 <= g <= 1.1 for g in gains)


def test_temperature_0_7_costs_20_to_30_percent_of_the_gain() -> None:
    def best_gain(w: Workload) -> float:
        return max(tpot_gain(H100, w, k) for k in range(1, 9)) - 1

    for alpha in (0.7, 0.8):
        lost = 1 - best_gain(low(alpha, 0.7)) / best_gain(low(alpha))
        assert 0.2 <= lost <= 0.3, (alpha, lost)


def test_high_load_off_beats_k5_on_latency_and_capacity() -> None:
    # Tens of requests per second per replica on an H100 8B: batches of hundreds.
    w = Workload(request_rate=80, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    off, k5 = steady_state(H100, w, OFF), steady_state(H100, w, 5)
    assert off.capacity_rps > k5.capacity_rps
    assert speedup(H100, w, 5) < 1
    assert off.batch >= 100
    mid = Workload(request_rate=36, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    assert best_config(H100, mid) == OFF
    assert steady_state(H100, mid, OFF).batch >= 100


def test_speculation_helps_at_low_load_and_stops_paying_with_load() -> None:
    gains = [speedup(H100, Workload(r, 1000, 300, acceptance=0.8), 5) for r in (1, 20, 30, 36)]
    assert gains[0] > 1.3
    assert all(a > b for a, b in zip(gains, gains[1:]))
    assert gains[-1] < 1


def test_draft_squeezing_a_tight_kv_cache_costs_20_to_30_percent_of_capacity() -> None:
    # A 40-48 GB GPU leaves ~60k KV tokens for an 8B target; the 1B draft takes a third.
    tight = EngineParams(kv_capacity_tokens=60_000)
    w = Workload(1, 1000, 300, acceptance=0.8)
    ratio = capacity(tight, w, 5) / capacity(tight, w, OFF)
    assert 0.7 <= ratio <= 0.85


# --- queueing and monotonicity --------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.floats(0.5, 60), st.integers(0, 8), st.floats(0.3, 0.95))
def test_latency_rises_with_load(rate: float, k: int, alpha: float) -> None:
    lo = evaluate_phase(H100, Workload(rate, 1000, 300, acceptance=alpha), k, 300)
    hi = evaluate_phase(H100, Workload(rate * 1.2, 1000, 300, acceptance=alpha), k, 300)
    assert hi.e2e_mean_s >= lo.e2e_mean_s * (1 - 1e-9)
    assert hi.steady.batch >= lo.steady.batch * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.5, 30), st.integers(1, 8), st.floats(0.3, 0.9))
def test_faster_configs_hold_smaller_batches(rate: float, k: int, alpha: float) -> None:
    lo = steady_state(H100, Workload(rate, 1000, 300, acceptance=alpha), k)
    hi = steady_state(H100, Workload(rate, 1000, 300, acceptance=min(0.99, alpha + 0.05)), k)
    if not (lo.saturated or hi.saturated):
        assert hi.batch <= lo.batch * (1 + 1e-9)
        assert hi.e2e_s <= lo.e2e_s * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 40), st.integers(0, 8), st.floats(0.0, 0.95))
def test_steady_state_is_a_littles_law_fixed_point(rate: float, k: int, alpha: float) -> None:
    w = Workload(rate, 1000, 300, acceptance=alpha)
    s = steady_state(H100, w, k)
    assert 0 <= s.kv_usage <= 1
    assert s.batch <= s.batch_cap + 1e-9
    assert s.tpot_p95_s >= s.tpot_s
    if not s.saturated:
        per_replica = rate / s.replicas
        steps = 1 + (w.output_tokens - 1) / s.tokens_per_step
        assert s.batch == pytest.approx(per_replica * steps * s.step_time_s, rel=1e-6)
        assert s.e2e_p95_s >= s.e2e_s


def test_queue_grows_past_capacity_and_latency_blows_up() -> None:
    w = Workload(request_rate=60, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    short = evaluate_phase(H100, w, 5, 60)
    long = evaluate_phase(H100, w, 5, 600)
    mu = short.steady.capacity_rps
    assert short.queue_end == pytest.approx((60 - mu) * 60)
    assert long.e2e_mean_s > 5 * short.e2e_mean_s
    assert long.e2e_p95_s > long.e2e_mean_s


def test_a_backlog_drains_when_capacity_returns() -> None:
    w = Workload(request_rate=10, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    fresh = evaluate_phase(H100, w, OFF, 300)
    loaded = evaluate_phase(H100, w, OFF, 300, initial_queue=500)
    assert loaded.queue_end == 0
    assert 0 < loaded.saturated_s < 300
    assert loaded.e2e_mean_s > fresh.e2e_mean_s


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 20.0), st.floats(0.0, 20000.0), st.floats(10.0, 1800.0), st.floats(0.05, 0.95))
def test_a_backlog_carries_over_a_cut_phase_as_over_a_whole_one(rate, backlog, duration, cut) -> None:
    """A phase cut in two leaves the queue the whole phase does: a backlog longer than the
    first part carries into the second (the benchmark cuts every scenario into minutes, and a
    rollout's queue into its rounds). It vanished at the cut: a queue of 2,000 requests on two
    replicas at 94 % of their capacity was gone one minute into the calm."""
    w = Workload(request_rate=rate, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    whole = evaluate_phase(H100, w, 3, duration, initial_queue=backlog)
    first = evaluate_phase(H100, w, 3, duration * cut, initial_queue=backlog)
    second = evaluate_phase(H100, w, 3, duration * (1 - cut), initial_queue=first.queue_end)
    assert second.queue_end == pytest.approx(whole.queue_end, rel=1e-9, abs=1e-6)
    mu = whole.steady.capacity_rps
    if rate < mu:
        assert whole.queue_end == pytest.approx(max(0.0, backlog - (mu - rate) * duration), abs=1e-6)


def test_a_backlog_longer_than_the_phase_is_left_and_waited_for() -> None:
    w = Workload(request_rate=10, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    mu = evaluate_phase(H100, w, OFF, 60).steady.capacity_rps
    backlog = (mu - 10) * 600
    minute = evaluate_phase(H100, w, OFF, 60, initial_queue=backlog)
    assert minute.queue_end == pytest.approx(backlog - (mu - 10) * 60)
    assert minute.saturated_s == 60
    # Every request of that minute waits behind at least the backlog the minute leaves.
    assert minute.e2e_mean_s > minute.queue_end / mu


def test_fewer_replicas_means_less_capacity() -> None:
    w = Workload(request_rate=10, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    assert steady_state(H100, w, 3, replicas=1).capacity_rps < steady_state(H100, w, 3).capacity_rps
    none = evaluate_phase(H100, w, 3, 60, replicas=0)
    assert none.queue_end == pytest.approx(600) and math.isinf(none.e2e_mean_s)


def test_slo_sets_goodput() -> None:
    w = Workload(request_rate=10, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    loose = evaluate_phase(H100, w, 3, 300, slo_e2e_s=60, slo_tpot_s=1)
    tight = evaluate_phase(H100, w, 3, 300, slo_e2e_s=1.0, slo_tpot_s=0.005)
    assert loose.good_fraction > 0.99
    assert loose.goodput_tokens_per_s == pytest.approx(10 * 300, rel=0.02)
    assert tight.good_fraction < 0.5


def test_compare_configs_covers_off_and_the_bounds() -> None:
    results = compare_configs(H100, low(0.8))
    assert list(results) == [0, 1, 2, 3, 4, 5, 6, 7, 8]


# --- parameters -----------------------------------------------------------------------------


def test_for_method_applies_proposer_defaults_then_overrides() -> None:
    eagle = EngineParams.for_method("eagle", {"step_fixed_s": 0.01})
    assert eagle.draft_cost_ratio == pytest.approx(0.08)
    assert eagle.step_fixed_s == 0.01
    assert EngineParams.for_method("draft_model", {"max_num_seqs": 256.0}).max_num_seqs == 256


def test_unknown_parameter_names_the_key_and_valid_ones() -> None:
    with pytest.raises(EngineParamsError, match=r"model\.step_fixed: unknown parameter.*step_fixed_s"):
        EngineParams.for_method("eagle", {"step_fixed": 0.01})


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"draft_cost_ratio": -1}, "draft_cost_ratio"),
        ({"kv_capacity_tokens": 0}, "kv_capacity_tokens"),
        ({"min_k": 5, "max_k": 2}, "min_k"),
        ({"acceptance_decay": 1.5}, "acceptance_decay"),
    ],
)
def test_bad_values_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(EngineParamsError, match=f"model.{field}"):
        EngineParams.for_method("draft_model", overrides)


def test_param_names_lists_every_field() -> None:
    assert "rollout_s" in param_names() and "method" in param_names()
    assert H100.configs() == (0, 1, 2, 3, 4, 5, 6, 7, 8)


@pytest.mark.parametrize("params", [
    EngineParams.for_method("draft_model"),
    EngineParams.for_method("ngram", {"max_k": 6}),
    EngineParams(step_table="h200-llama8b-1b"),  # a measured, piecewise-linear step
], ids=["draft_model", "ngram", "step-table"])
def test_the_capacity_grid_scan_finds_what_max_over_the_grid_finds(params):
    """`_peak` scans its grid with rate_for's expression inlined (issue #18: half of all
    rate_for calls): the peak must be exactly max(grid, key=rate_for), tie-break included."""
    from specdecode.control import perfmodel

    for k in (0, 1, 3):
        for prompt, out, alpha in ((200.0, 100.0, 0.5), (1000.0, 300.0, 0.8), (8000.0, 900.0, 0.95)):
            e = perfmodel.expected_tokens_per_step(alpha, k, params.acceptance_decay)
            n = max(1.0, prompt / params.max_num_batched_tokens) + (out - 1.0) / e
            context = prompt + out / 2.0
            kv_per_seq, kv_cap = context + k, perfmodel.kv_capacity(params, k)
            # A cache small enough that preemptions start inside the grid, and the real one.
            for cap in (kv_cap, kv_per_seq * 20):
                batch_cap = max(1.0, min(float(params.max_num_seqs), cap / kv_per_seq))
                rate_for, _, _ = perfmodel._rate_function(params, k, prompt, n, context, kv_per_seq, cap)
                onset = params.preemption_onset * cap / kv_per_seq
                expected = batch_cap
                if onset < batch_cap:
                    grid = [onset + (batch_cap - onset) * i / perfmodel._CAPACITY_GRID
                            for i in range(perfmodel._CAPACITY_GRID + 1)]
                    expected = max(grid, key=rate_for)
                got = perfmodel._peak.__wrapped__(params, k, prompt, n, context, kv_per_seq, batch_cap, cap)
                assert got == (expected, rate_for(expected))
