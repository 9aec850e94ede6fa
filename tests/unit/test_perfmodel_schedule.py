"""Per-batch-size K schedules in the performance model: the steady state of a schedule as
the batch moves across its ranges, its own cost, and `propose_schedule`."""

from __future__ import annotations

import math

import pytest

from specdecode.control.perfmodel import (
    OFF,
    EngineParams,
    EngineParamsError,
    Schedule,
    ScheduleError,
    Workload,
    capacity,
    config_label,
    expected_tokens_per_step,
    kv_capacity,
    propose_schedule,
    steady_state,
    step_time,
)

H100 = EngineParams()
H200 = EngineParams(step_table="h200-llama8b-1b")
CONTEXT = 1000 + 300 / 2


def load(rate: float, alpha: float = 0.8) -> Workload:
    return Workload(request_rate=rate, prompt_tokens=1000, output_tokens=300, acceptance=alpha)


def test_schedule_ranges_start_at_one_and_follow_each_other() -> None:
    s = Schedule(((1, 16, 4), (17, 64, 2), (65, 1024, 0)))
    assert [s.k_at(b) for b in (1, 16, 17, 64, 65, 5000)] == [4, 4, 2, 2, 0, 0]
    assert s.max_k == 4 and s.label == "1-16:K4,17-64:K2,65+:off"
    assert config_label(s) == "sched[1-16:K4,17-64:K2,65+:off]" and config_label(OFF) == "off"
    with pytest.raises(ScheduleError, match="start at batch size 1"):
        Schedule(((2, 8, 3),))
    with pytest.raises(ScheduleError, match="start at batch size 9"):
        Schedule(((1, 8, 3), (10, 20, 1)))
    with pytest.raises(ScheduleError, match="speculation off"):
        Schedule(((1, 8, 0),))


def test_a_rendered_table_reads_as_vllm_reads_it() -> None:
    """Gaps and the end carry the previous row's K forward; K is capped at the maximum."""
    s = Schedule.from_table([(1, 8, 5), (9, 32, 2), (64, 128, 0)], 4)
    assert s.bands == ((1, 8, 4), (9, 63, 2), (64, 128, 0))


def test_one_range_costs_its_plain_k_plus_the_schedule_overhead() -> None:
    free = EngineParams(schedule_overhead_s=0.0)
    for rate in (1.0, 10.0, 20.0):
        plain = steady_state(free, load(rate), 3)
        sched = steady_state(free, load(rate), Schedule(((1, 1024, 3),)))
        assert sched.tpot_s == pytest.approx(plain.tpot_s, rel=1e-3)
        assert sched.capacity_rps == pytest.approx(plain.capacity_rps, rel=0.02)
    paid = steady_state(H100, load(1.0), Schedule(((1, 1024, 3),)))
    plain = steady_state(H100, load(1.0), 3)
    assert paid.step_time_s - plain.step_time_s == pytest.approx(H100.schedule_overhead_s, rel=0.1)


def test_k0_range_keeps_the_drafts_memory_and_costs_more_than_off() -> None:
    s = Schedule(((1, 4, 3), (5, 1024, 0)))
    assert kv_capacity(H100, s) == kv_capacity(H100, 3) < kv_capacity(H100, OFF)
    heavy = load(30.0)
    under = steady_state(H100, heavy, s)
    off = steady_state(H100, heavy, OFF)
    assert dict(under.step_shares())[0] > 0.999
    assert under.tpot_s > off.tpot_s
    assert under.capacity_rps < off.capacity_rps
    assert step_time(H100, s, 100, CONTEXT) > step_time(H100, OFF, 100, CONTEXT)


def test_batch_moving_across_an_edge_mixes_the_ranges() -> None:
    """At a mean batch on the edge, steps fall on both sides: the TPOT lies between the two
    Ks' and the per-step K mix follows the batch (more K 4 at lower load)."""
    s = Schedule(((1, 12, 4), (13, 1024, 1)))
    # Two replicas share the load: 10 req/s puts ~10 sequences on each.
    shares = {rate: dict(steady_state(H100, load(rate), s).step_shares()) for rate in (8.0, 10.0, 12.0)}
    assert shares[8.0][4] > shares[10.0][4] > shares[12.0][4]
    assert 0.2 < shares[10.0][4] < 0.8
    mid = steady_state(H100, load(10.0), s)
    k4 = steady_state(H100, load(10.0), Schedule(((1, 1024, 4),)))
    k1 = steady_state(H100, load(10.0), Schedule(((1, 1024, 1),)))
    assert min(k4.tpot_s, k1.tpot_s) < mid.tpot_s < max(k4.tpot_s, k1.tpot_s) * 1.01
    e = 4 * shares[10.0][4] + 1 * shares[10.0][1]
    assert mid.acceptance_rate * e == pytest.approx(mid.tokens_per_step - 1, rel=1e-6)


@pytest.mark.parametrize("rate", [2.0, 10.0, 25.0])
def test_schedule_steady_state_is_a_littles_law_fixed_point(rate: float) -> None:
    s = Schedule(((1, 16, 3), (17, 1024, 1)))
    st = steady_state(H100, load(rate), s)
    steps_in_batch = 1 + 299 / st.tokens_per_step
    assert st.batch == pytest.approx(rate / 2 * steps_in_batch * st.step_time_s, rel=0.05)
    assert not st.saturated and st.throughput_rps == pytest.approx(rate)


def test_a_true_schedule_penalty_slows_every_step() -> None:
    s = Schedule(((1, 32, 3), (33, 1024, 0)))
    slow = EngineParams(schedule_penalty=0.2)
    for rate in (1.0, 20.0):
        assert steady_state(slow, load(rate), s).tpot_s > 1.15 * steady_state(H100, load(rate), s).tpot_s


def test_a_true_schedule_penalty_from_a_batch_slows_only_the_steps_past_it() -> None:
    """The reported MTP collapse: below the threshold a step costs what it did; from it up,
    the whole step, prompt chunks included, is the penalty slower."""
    s = Schedule(((1, 64, 3), (65, 1024, 0)))
    past = EngineParams(schedule_penalty=2.0, schedule_penalty_from_batch=48)
    for batch in (1.0, 20.0, 47.9):
        assert step_time(past, s, batch, CONTEXT, 512) == step_time(H100, s, batch, CONTEXT, 512)
    for batch in (48.0, 100.0):
        assert step_time(past, s, batch, CONTEXT, 512) == pytest.approx(3 * step_time(H100, s, batch, CONTEXT, 512))
    assert steady_state(past, load(1.0), s).tpot_s == steady_state(H100, load(1.0), s).tpot_s
    assert capacity(past, load(1.0), s) < 0.8 * capacity(H100, load(1.0), s)
    with pytest.raises(EngineParamsError, match="schedule_penalty_from_batch"):
        EngineParams(schedule_penalty_from_batch=-1.0)


def test_proposal_at_low_load_is_the_best_static_k() -> None:
    """Batches of 1-3: the range holding them gets the K that is best there as a plain K."""
    for params, alpha in ((H100, 0.8), (H100, 0.6), (H200, 0.8)):
        p = propose_schedule(params, [alpha] * 8, [(1, 1.0), (2, 1.0), (3, 1.0)], CONTEXT)
        best = min(params.configs(), key=lambda k: sum(
            step_time(params, k, b, CONTEXT) / expected_tokens_per_step(alpha, k) for b in (1, 2, 3)))
        assert p.schedule.k_at(2) == best or abs(p.schedule.k_at(2) - best) == 1
        assert p.static_k == best
        # Under the schedule's own overhead it is slower than that plain K: the policy keeps K.
        assert p.gain < 0


def test_proposal_at_high_load_turns_speculation_off_above_the_crossover() -> None:
    """On the H200 table at acceptance 0.6 speculation stops paying above ~100 sequences:
    batches of 300-500 get K 0, the small batches keep speculating, and the edge to K 0
    sits on the grid step where the best K becomes 0 (with K bounded to 0 or 2), or between
    the first crossover and that one (with every K: fewer ranges win unless they gain 1 %)."""
    seen = [(300, 1.0), (400, 1.0), (500, 1.0)]
    for ks in ((0, 2), None):
        p = propose_schedule(H200, [0.6] * 8, seen, CONTEXT, ks=ks)
        assert p.schedule.k_at(400) == 0 and p.schedule.k_at(1) > 0
        assert p.static_k == OFF
        edge = next(start for start, _end, k in p.schedule.bands if k == 0)
        off_from = next(b for b, k in p.crossover_batches if k == 0)
        first = p.crossover_batches[1][0]
        assert first / 2 < edge <= off_from
        if ks == (0, 2):
            assert off_from / 2 < edge


def test_proposal_over_a_wide_load_swing_follows_the_batch() -> None:
    """A day from batch 2 to batch 400: the schedule speculates at the small batches, K 0
    at the large ones, and beats every static config on time per token."""
    seen = [(2, 1.0), (8, 1.0), (150, 1.0), (400, 1.0)]
    p = propose_schedule(H200, [0.6] * 8, seen, CONTEXT)
    assert p.schedule.k_at(2) >= 1 and p.schedule.k_at(400) == 0
    assert len(p.schedule.bands) <= 3
    assert all(end in (4, 8, 16, 32, 64, 128, 256) for _s, end, _k in p.schedule.bands[:-1])
    assert p.tpot_s < p.static_tpot_s


def test_proposal_is_deterministic_and_needs_a_speculating_k() -> None:
    seen = [(5, 2.0), (50, 1.0)]
    assert propose_schedule(H100, [0.7] * 8, seen, CONTEXT) == propose_schedule(H100, [0.7] * 8, seen, CONTEXT)
    with pytest.raises(ScheduleError, match="K > 0"):
        propose_schedule(H100, [0.7] * 8, seen, CONTEXT, ks=(0,))
    assert math.isfinite(propose_schedule(H100, [0.7], [], CONTEXT).tpot_s)


def test_prefill_share_moves_the_crossover_for_long_prompts() -> None:
    """H100 model, 1000-token prompts: per decode step K 2-3 stays better at every batch, but
    the draft also prefills every prompt, so with the requests' lengths the proposal turns
    K 0 at the large batches of a peak and keeps speculating at the small ones."""
    seen = [(3, 1.0), (200, 1.0)]
    decode_only = propose_schedule(H100, [0.8] * 8, seen, CONTEXT)
    assert decode_only.schedule.k_at(200) > 0
    with_prefill = propose_schedule(H100, [0.8] * 8, seen, CONTEXT, prompt_tokens=1000, output_tokens=300)
    assert with_prefill.schedule.k_at(3) > 0 and with_prefill.schedule.k_at(200) == 0
    assert with_prefill.tpot_s > decode_only.tpot_s
