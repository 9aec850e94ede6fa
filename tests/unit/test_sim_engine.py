"""The simulator's pure core: command lines read back, and engines that follow perfmodel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdecode.render import vllm_args as vllm
from specdecode.control.perfmodel import EngineParams, Workload, acceptance_from_counters, acceptance_rate, steady_state
from specdecode.tools.sim import exposition as x
from specdecode.tools.sim.engine import (
    EngineConfig,
    PodEngine,
    engine_config_from_args,
    engine_state,
    perf_method,
    pod_params,
)

PARAMS = EngineParams()


def spec_args(k: int, method: str = "draft_model", **extra) -> list[str]:
    config = vllm.SpeculativeConfig(method=method, num_speculative_tokens=k,
                                    model="draft" if method == "draft_model" else None, **extra)
    return ["vllm", "serve", "org/target", "--served-model-name", "target",
            "--max-num-seqs", "256"] + vllm.speculative_args(config, "0.33.0")


def run(engine: PodEngine, seconds: float, workload: Workload, replicas: int = 1, dt: float = 0.5):
    ticks = []
    for _ in range(int(seconds / dt)):
        ticks.append(engine.advance(dt, workload, replicas))
    return ticks


def test_reads_model_name_k_method_and_limits_from_the_command_line() -> None:
    config = engine_config_from_args(spec_args(4, "eagle3"))
    assert (config.model_name, config.method, config.num_speculative_tokens) == ("target", "eagle3", 4)
    assert config.max_num_seqs == 256 and config.speculative
    off = engine_config_from_args(["vllm", "serve", "org/target"])
    assert (off.model_name, off.method, off.num_speculative_tokens, off.speculative) == (
        "org/target", None, 0, False)
    assert engine_config_from_args(["org/m", "--port", "8000"]).model_name == "org/m"


def test_malformed_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError):
        engine_config_from_args(["m", "--speculative-config", "{not json"])
    with pytest.raises(ValueError, match="--custom-histogram-buckets"):
        engine_config_from_args(["m", "--custom-histogram-buckets", "[1"])
    with pytest.raises(ValueError, match="--max-num-seqs"):
        engine_config_from_args(["m", "--max-num-seqs", "many"])


def test_per_batch_size_table_follows_vllms_dense_schedule() -> None:
    config = EngineConfig("m", "draft_model", 5, per_batch_size=((1, 8, 5), (9, 32, 2), (64, 128, 0)))
    assert [config.k_at_batch(b) for b in (1, 8, 9, 32, 40, 64, 500)] == [5, 5, 2, 2, 2, 0, 0]
    capped = EngineConfig("m", "draft_model", 3, per_batch_size=((1, 4, 7),))
    assert capped.k_at_batch(2) == 3 and capped.k_at_batch(100) == 3
    assert EngineConfig("m", None, 0).k_at_batch(1) == 0


def test_engine_runs_the_table_k_at_its_batch() -> None:
    table = EngineConfig("m", "draft_model", 5, per_batch_size=((1, 16, 5), (17, 1024, 0)))
    heavy = Workload(request_rate=30, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    light = Workload(request_rate=0.5, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    assert dict(engine_state(table, PARAMS, heavy, 1).step_shares()).get(0, 0.0) > 0.99
    assert dict(engine_state(table, PARAMS, light, 1).step_shares()).get(5, 0.0) > 0.99


def test_an_engine_that_ignores_its_table_drafts_the_largest_k_at_every_batch() -> None:
    """vllm#51510 played by the simulator (`schedule_ignored`): where the table says K 0 the
    pod still drafts K 5 on every step, and its counters show it."""
    from dataclasses import replace

    table = EngineConfig("m", "draft_model", 5, per_batch_size=((1, 16, 5), (17, 1024, 0)))
    ignoring = replace(PARAMS, schedule_ignored=True)
    heavy = Workload(request_rate=30, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    assert engine_state(table, ignoring, heavy, 1).batch > 16
    assert dict(engine_state(table, ignoring, heavy, 1).step_shares()) == {5: 1.0}
    engine = PodEngine(table, ignoring, np.random.default_rng(3))
    run(engine, 300, heavy)
    m = engine.metrics
    assert m.counters[x.SPEC_DRAFT_TOKENS] / m.counters[x.SPEC_DRAFTS] == pytest.approx(5.0)


def test_table_read_from_the_rendered_speculative_config_mixes_the_per_position_counters() -> None:
    """A pod whose batch straddles the table's edge drafts K 4 on some steps and K 1 on the
    others: position 0 counts every drafting step, positions 1-3 only the K 4 steps."""
    args = spec_args(4, per_batch_size=((1, 12, 4), (13, 1024, 1)))
    config = engine_config_from_args(args)
    assert config.per_batch_size == ((1, 12, 4), (13, 1024, 1))
    alpha = 0.8
    # The rate whose mean batch sits on the edge, so both ranges see many steps.
    load = Workload(request_rate=5.0, prompt_tokens=1000, output_tokens=300, acceptance=alpha)
    state = engine_state(config, PARAMS, load, 1)
    shares = dict(state.step_shares())
    assert 0.2 < shares[4] < 0.8 and abs(shares[4] + shares[1] - 1.0) < 1e-9
    engine = PodEngine(config, PARAMS, np.random.default_rng(7))
    run(engine, 600, load)
    m = engine.metrics
    drafts, tokens = m.counters[x.SPEC_DRAFTS], m.counters[x.SPEC_DRAFT_TOKENS]
    # Draft tokens per draft: the mix of K 4 and K 1 steps.
    expected = 4 * shares[4] + 1 * shares[1]
    assert tokens / drafts == pytest.approx(expected, rel=0.05)
    pos = m.accepted_per_pos
    # Position 0 is drafted on every step: alpha of all drafts.
    assert pos[0] / drafts == pytest.approx(alpha, rel=0.03)
    # Position 1 only on K 4 steps: alpha^2 of those, so alpha^2 * share of all drafts.
    assert pos[1] / drafts == pytest.approx(alpha**2 * shares[4], rel=0.08)
    assert pos[1] / drafts < 0.9 * alpha**2
    # What a policy reads back: the counters de-biased by the step mix give alpha everywhere.
    recovered = acceptance_from_counters(drafts, pos, state.step_shares())
    assert recovered[:4] == pytest.approx([alpha] * 4, rel=0.05)
    naive = pos[1] / pos[0]
    assert naive < 0.9 * alpha


def test_pod_method_and_limits_shape_its_true_engine() -> None:
    eagle = engine_config_from_args(spec_args(3, "eagle"))
    params = pod_params(PARAMS, eagle, {"step_fixed_s": 0.006})
    assert params.method == "eagle" and params.draft_cost_ratio == pytest.approx(0.08)
    assert params.step_fixed_s == 0.006 and params.max_num_seqs == 256
    assert perf_method("ngram_gpu", "eagle") == "ngram"
    assert perf_method("dflash", "eagle") == "eagle"


def test_same_seed_same_metrics() -> None:
    w = Workload(request_rate=6, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    config = engine_config_from_args(spec_args(3))
    a = PodEngine(config, PARAMS, np.random.default_rng(7))
    b = PodEngine(config, PARAMS, np.random.default_rng(7))
    run(a, 20, w)
    run(b, 20, w)
    assert a.metrics.counters == b.metrics.counters
    assert a.metrics.accepted_per_pos == b.metrics.accepted_per_pos
    assert a.metrics.histograms[x.E2E].counts == b.metrics.histograms[x.E2E].counts


@pytest.mark.parametrize("alpha, k", [(0.8, 3), (0.55, 5), (0.2, 1)])
def test_counters_give_the_models_acceptance_within_noise(alpha: float, k: int) -> None:
    w = Workload(request_rate=8, prompt_tokens=1000, output_tokens=300, acceptance=alpha)
    e = PodEngine(engine_config_from_args(spec_args(k)), PARAMS, np.random.default_rng(3))
    run(e, 60, w)
    c = e.metrics.counters
    drafts = c[x.SPEC_DRAFTS]
    assert c[x.SPEC_DRAFT_TOKENS] == drafts * k
    assert c[x.SPEC_ACCEPTED_TOKENS] / c[x.SPEC_DRAFT_TOKENS] == pytest.approx(
        acceptance_rate(alpha, k), abs=0.02)
    assert e.metrics.accepted_per_pos[0] / drafts == pytest.approx(alpha, abs=0.02)
    per_pos = e.metrics.accepted_per_pos
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
    assert c[x.GENERATION_TOKENS] == drafts + c[x.SPEC_ACCEPTED_TOKENS]


def test_means_follow_the_performance_model() -> None:
    w = Workload(request_rate=10, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    e = PodEngine(engine_config_from_args(spec_args(3)), PARAMS, np.random.default_rng(5))
    run(e, 120, w, replicas=2)
    state = steady_state(PARAMS, w, 3, replicas=2)
    h = e.metrics.histograms
    itl = h[x.INTER_TOKEN_LATENCY]
    assert itl.total / itl.count == pytest.approx(state.step_time_s, rel=0.03)
    tpot = h[x.REQUEST_TPOT]
    assert tpot.total / tpot.count == pytest.approx(state.tpot_s, rel=0.08)
    e2e = h[x.E2E]
    assert e2e.count == pytest.approx(5 * 120, rel=0.1)
    assert e2e.total / e2e.count == pytest.approx(state.e2e_s, rel=0.15)
    generated = e.metrics.counters[x.GENERATION_TOKENS]
    assert generated / 120 == pytest.approx(5 * 300, rel=0.1)


def test_load_splits_across_ready_replicas() -> None:
    w = Workload(request_rate=12, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    config = engine_config_from_args(spec_args(3))
    for replicas in (1, 3):
        e = PodEngine(config, PARAMS, np.random.default_rng(11))
        run(e, 60, w, replicas=replicas)
        expected = 12 / replicas * 60
        # Poisson arrivals: within 4 standard deviations.
        assert abs(e.metrics.histograms[x.E2E].count - expected) < 4 * expected**0.5


def test_overload_grows_the_queue_and_the_latency() -> None:
    w = Workload(request_rate=40, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    e = PodEngine(engine_config_from_args(spec_args(5)), PARAMS, np.random.default_rng(2))
    ticks = run(e, 60, w, replicas=1)
    assert ticks[-1].state.saturated
    assert ticks[-1].queue > ticks[10].queue > 0
    assert e.metrics.gauges[x.WAITING] == round(ticks[-1].queue)
    queue_time = e.metrics.histograms[x.QUEUE_TIME]
    assert queue_time.total / queue_time.count > 5


def test_speculation_off_emits_no_spec_counters_and_one_token_per_step() -> None:
    w = Workload(request_rate=8, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    e = PodEngine(engine_config_from_args(["vllm", "serve", "m"]), PARAMS, np.random.default_rng(4))
    run(e, 10, w)
    assert x.SPEC_DRAFTS not in e.metrics.counters
    itl = e.metrics.histograms[x.INTER_TOKEN_LATENCY]
    assert e.metrics.counters[x.GENERATION_TOKENS] == itl.count


def test_dt_must_be_positive() -> None:
    e = PodEngine(engine_config_from_args(["m"]), PARAMS, np.random.default_rng(0))
    with pytest.raises(ValueError):
        e.advance(0, Workload(1, 100, 100), 1)


def test_bucket_json_round_trips() -> None:
    args = ["m", "--custom-histogram-buckets", json.dumps({"request_latency": [1, 2]})]
    assert dict(engine_config_from_args(args).custom_buckets) == {"request_latency": (1.0, 2.0)}


def test_a_scenarios_true_schedule_penalty_slows_only_pods_that_run_a_table() -> None:
    """`model.schedule_penalty` is a truth of the scenario: a pod rendered with a table
    steps slower by it; the same pod without a table does not."""
    from specdecode.tools.scenario import parse_scenario

    scenario = parse_scenario({
        "name": "penalty", "duration": "10m", "method": "draft_model",
        "model": {"schedule_penalty": 0.3},
        "phases": [{"at": 0, "request_rate": 2, "acceptance": 0.8}],
    })
    truth = scenario.params
    assert truth.schedule_penalty == 0.3
    table = engine_config_from_args(spec_args(3, per_batch_size=((1, 64, 3), (65, 1024, 0))))
    plain = engine_config_from_args(spec_args(3))
    light = Workload(request_rate=2, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    slow = engine_state(table, pod_params(truth, table, {}), light, 1)
    fine = engine_state(table, pod_params(PARAMS, table, {}), light, 1)
    assert slow.step_time_s > 1.25 * fine.step_time_s
    assert engine_state(plain, pod_params(truth, plain, {}), light, 1) == engine_state(
        plain, pod_params(PARAMS, plain, {}), light, 1)


def test_the_simulator_runs_the_schedule_the_operator_renders(minimal_spec) -> None:
    """spec.speculation.perBatchSizeK -> rendered --speculative-config -> the pod's engine:
    the same ranges, as a schedule, drafting K 4 at small batches and nothing at large."""
    from specdecode import api
    from specdecode.render import workload as render
    from specdecode.control.perfmodel import Schedule

    from .conftest import service_doc

    spec = {**minimal_spec, "speculation": {"method": "draft_model", "draftModel": "org/draft",
                                            "numSpeculativeTokens": 4, "perBatchSizeK": [
        {"minBatchSize": 1, "maxBatchSize": 16, "k": 4}, {"minBatchSize": 17, "maxBatchSize": 1024, "k": 0}]}}
    objects = render.render_all(api.parse_service(service_doc(spec)), render.SpeculationChoice(k=4))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config = engine_config_from_args(args)
    assert config.perf_config == Schedule(((1, 16, 4), (17, 1024, 0)))
    light = Workload(request_rate=1, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    heavy = Workload(request_rate=60, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    assert dict(engine_state(config, PARAMS, light, 1).step_shares())[4] > 0.99
    assert dict(engine_state(config, PARAMS, heavy, 1).step_shares())[0] > 0.99
