"""The policy benchmark: scoring engine, phase oracle, the policy replay and the command."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from specdecode import cli
from specdecode.tools.bench import engine, generated, run, suite
from specdecode.control import perfmodel
from specdecode.control.perfmodel import OFF
from specdecode.control.decision import Held
from specdecode.tools.scenario import benchmark_suite, builtin_scenario_path, load_scenario, parse_scenario

SHORT = {
    "name": "short",
    "duration": "40m",
    "seed": 3,
    "method": "draft_model",
    "slo": {"p95_e2e_s": 6, "p95_tpot_s": 0.02},
    "phases": [
        {"at": 0, "request_rate": 4, "acceptance": 0.8},
        {"at": "15m", "acceptance": 0.2},
        {"at": "30m", "request_rate": 30, "acceptance": 0.8},
    ],
}

SCENARIOS = [
    SHORT,
    {**SHORT, "name": "surge", "phases": [
        {"at": 0, "request_rate": 5, "acceptance": 0.8},
        {"at": "10m", "request_rate": 38},
        {"at": "25m", "request_rate": 5},
    ]},
    {**SHORT, "name": "noisy", "noise": {"acceptance_sd": 0.05, "request_rate_cv": 0.2, "period": "2m"},
     "phases": [{"at": 0, "request_rate": 12, "acceptance": 0.7}]},
    {**SHORT, "name": "one-replica", "model": {"replicas": 1, "rollout_s": 60},
     "phases": [{"at": 0, "request_rate": 3, "acceptance": 0.9}, {"at": "20m", "acceptance": 0.1}]},
]


def _evaluator(scenario):
    return engine.SegmentEvaluator(scenario.params, scenario.slo.p95_e2e_s, scenario.slo.p95_tpot_s)


def _assert_oracle_beats_every_static(scenario) -> run.Yardstick:
    """Both oracles: K only against every static K, and with the scenario's schedule family
    against every static K, every static schedule and the K-only oracle."""
    measure = run.yardstick(scenario, schedules=True)
    figures = run.scored(measure.figures())
    oracle = figures.pop(run.ORACLE)
    assert set(figures) == {run.strategy_name(c) for c in scenario.params.configs()}
    for name, static in figures.items():
        assert oracle.score >= static.score - 1e-12, (scenario.name, name, static, oracle)
    everything = run.scored({**measure.figures(), **measure.schedule_figures()})
    with_schedules = everything.pop(run.ORACLE_SCHEDULES)
    assert len(everything) == len(scenario.params.configs()) + 1 + len(measure.family)
    for name, other in everything.items():
        assert with_schedules.score >= other.score - 1e-12, (scenario.name, name, other, with_schedules)
    return measure


@pytest.mark.parametrize("data", SCENARIOS, ids=lambda d: d["name"])
def test_oracle_scores_at_least_every_static_choice(data):
    _assert_oracle_beats_every_static(parse_scenario(data))


@pytest.mark.parametrize("name", [p.stem for p in benchmark_suite()])
def test_oracle_scores_at_least_every_static_choice_in_every_shipped_scenario(name):
    _assert_oracle_beats_every_static(load_scenario(name))


def test_the_oracle_may_run_a_schedule_that_follows_the_load_without_restarts():
    """Load swinging across the crossover every 20 minutes on the H200 table at acceptance
    0.6 (speculation pays at small batches, not at hundreds): the family holds a schedule
    that speculates at small batches and turns K 0 at large ones; the oracle with it scores
    at least the oracle without and restarts no more, and a schedule static is scored."""
    scenario = parse_scenario({
        **SHORT, "name": "swing", "duration": "2h", "noise": "off",
        "model": {"step_table": "h200-llama8b-1b", "max_k": 4},
        "phases": [
            {"at": 0, "request_rate": 3, "acceptance": 0.6},
            {"at": "20m", "request_rate": 60},
            {"at": "40m", "request_rate": 3},
            {"at": "60m", "request_rate": 60},
            {"at": "80m", "request_rate": 3},
            {"at": "100m", "request_rate": 60},
        ],
    })
    measure = _assert_oracle_beats_every_static(scenario)
    assert measure.family, "no schedule proposed for a load swing across the crossover"
    schedule = measure.family[0]
    assert schedule.k_at(1) > 0 and schedule.k_at(1000) == 0
    everything = run.scored({**measure.figures(), **measure.schedule_figures()})
    assert everything[run.ORACLE_SCHEDULES].score >= everything[run.ORACLE].score
    assert measure.oracle_schedules.changes <= measure.oracle.changes


def test_oracle_switches_when_a_phase_repays_the_restart():
    measure = run.yardstick(parse_scenario({**SHORT, "duration": "2h", "phases": [
        {"at": 0, "request_rate": 4, "acceptance": 0.8},
        {"at": "30m", "acceptance": 0.1},
    ]}))
    oracle = measure.oracle
    assert oracle.configs[0] > 0 and oracle.configs[1] == OFF
    assert oracle.changes >= 1 and oracle.source.startswith("dp:")


def test_every_strategy_starts_at_the_declared_config_and_pays_to_leave_it():
    scenario = parse_scenario({**SHORT, "phases": [{"at": 0, "request_rate": 4, "acceptance": 0.9}]})
    measure = run.yardstick(scenario)
    assert measure.declared == 3
    k3, k5 = measure.statics[3], measure.statics[5]
    assert k3[0].config == 3 and not k3[0].rolling
    # K=5 switches away from the declared K=3 at the start: one replica restarts at a time.
    assert k5[0].rolling and k5[0].replicas == 1
    figures = measure.figures()
    assert figures["K=3"].changes == 0 and figures["K=5"].changes == 1
    if measure.oracle.configs[0] != 3:
        assert measure.oracle.changes == 1 and measure.oracle.segments[0].rolling


def test_the_score_is_against_the_best_of_the_oracle_and_every_static_on_each_axis():
    best = engine.best_axes([engine.Axes(100.0, 2.0), engine.Axes(120.0, 3.0)])
    assert best == engine.Axes(120.0, 2.0)
    # A strategy with the most goodput but the slower latency is scored on its latency.
    assert engine.headline(engine.Axes(120.0, 3.0), best)[0] == pytest.approx(2.0 / 3.0)


def test_rollout_takes_one_replica_at_a_time():
    pieces = engine.rollout(100.0, 3, 0, 2, 180.0)
    assert [(p.start, p.config, p.replicas, p.rolling) for p in pieces] == [
        (100.0, 3, 1, True), (280.0, 0, 1, True), (460.0, 0, 2, False),
    ]
    outage = engine.rollout(0.0, 3, 0, 1, 60.0)
    assert outage[0].replicas == 0 and outage[-1].replicas == 1


def test_queue_carries_across_segments():
    scenario = parse_scenario({**SHORT, "phases": [
        {"at": 0, "request_rate": 60, "acceptance": 0.8}, {"at": "5m", "request_rate": 2}]})
    segments = engine.evaluate_schedule(scenario, _evaluator(scenario), engine.static_schedule(3, 2))
    assert segments[0].queue_end > 0
    assert segments[1].e2e_mean_s > 10  # the backlog of the overload drains in the next phase


def test_truth_is_quantized_below_its_noise():
    scenario = parse_scenario(SCENARIOS[2])
    workload = engine.quantized(scenario.true_conditions(61.0).workload)
    assert workload.acceptance * 200 == pytest.approx(round(workload.acceptance * 200))


def test_mixture_p95_of_identical_segments_is_their_p95():
    assert run.mixture_p95([(10, 2.0, 4.0), (20, 2.0, 4.0)]) == pytest.approx(4.0, rel=1e-3)
    assert math.isinf(run.mixture_p95([(10, math.inf, math.inf), (1, 1.0, 2.0)]))


def test_policy_run_is_deterministic_and_reacts_to_the_collapse(tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(SHORT))
    first = run.run_scenario(path)
    second = run.run_scenario(path)
    assert first.strategies == second.strategies
    assert [c.time for c in first.changes] == [c.time for c in second.changes]
    collapse = first.events["collapses"][0]
    assert collapse["fallback_s"] is not None and collapse["fallback_intervals"] <= 3
    oracle = first.strategies[run.ORACLE].score
    assert all(oracle >= f.score - 1e-12 for n, f in first.strategies.items() if n != run.POLICY)


def test_summary_reports_every_target(tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(SHORT))
    summary = suite.summarize([run.run_scenario(path)])
    names = [t["name"] for t in summary["targets"]]
    assert len(names) == 6 and all(isinstance(t["met"], bool) for t in summary["targets"])


def test_bench_policy_command_writes_json_csv_and_png(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump({**SHORT, "duration": "20m", "phases": SHORT["phases"][:2]}))
    out = tmp_path / "out"
    code = cli.main(["bench", "policy", "--scenario", str(path), "--json", "--out", str(out), "--jobs", "1"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scenarios"][0]["name"] == "short"
    assert set(data["scenarios"][0]["strategies"]) == {"policy", "oracle", "off", *(f"K={k}" for k in range(1, 9))}
    summary = data["summary"]
    assert summary["best_single_static"] in data["scenarios"][0]["strategies"]
    scenario = data["scenarios"][0]
    assert scenario["best_static"] == summary["best_single_static"]
    margin = scenario["strategies"]["policy"]["score"] - scenario["strategies"][scenario["best_static"]]["score"]
    assert scenario["policy_margin_over_best_static"] == pytest.approx(margin)
    assert summary["policy_margin_over_best_single_static"] == pytest.approx(margin)
    assert (out / "bench-policy.csv").read_text().startswith("scenario,strategy,score")
    assert (out / "short.png").stat().st_size > 10_000
    # With and without schedules: the oracle with them scores at least the one without.
    view = scenario["with_schedules"]
    assert {"policy", "policy (sched Off)", "oracle", "oracle+sched", *view["family"]} <= set(view["strategies"])
    row = summary["schedules"]["scenarios"]["short"]
    assert row["oracle_schedules"] >= row["oracle"] - 1e-12
    # The policy as the API defaults it (schedules Auto) is reported beside the plain one.
    assert set(row["restarts"]) == {"policy", "policy_plain", "oracle", "oracle_schedules"}
    assert 0.0 <= row["policy_plain"] <= 1.0 + 1e-9
    assert len(row["oracle_schedules_plan"]) == len(SHORT["phases"][:2])


def test_bench_policy_refuses_a_bad_scenario(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nduration: 1h\n")
    assert cli.main(["bench", "policy", "--scenario", str(path)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_a_collapse_met_with_speculation_already_off_needs_no_fallback(tmp_path):
    data = {**SHORT, "name": "twice", "phases": [
        {"at": 0, "request_rate": 6, "acceptance": 0.8},
        {"at": "10m", "acceptance": 0.2},
        {"at": "20m", "acceptance": 0.8},  # recovered, but the re-probe is 30 minutes away
        {"at": "30m", "acceptance": 0.2},  # collapses again while speculation is still off
    ]}
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run.run_scenario(path)
    first, second = result.events["collapses"]
    assert not first["already_off"] and first["fallback_intervals"] <= 3
    assert second["already_off"] and second["fallback_s"] is None
    (recovery,) = result.events["recoveries"]
    assert recovery["already_on"] is False and recovery["reenable_s"] is None
    target = next(t for t in suite.summarize([result])["targets"] if t["name"].startswith("fallback"))
    assert target["met"] and "already off" in target["detail"]


def test_outputs_carry_the_overall_figures_and_the_policy_events(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump({**SHORT, "duration": "25m", "phases": SHORT["phases"][:2]}))
    out = tmp_path / "out"
    assert cli.main(["bench", "policy", "--scenario", str(path), "--json", "--out", str(out),
                     "--jobs", "1", "--no-plots"]) == 0
    data = json.loads(capsys.readouterr().out)
    overall = data["summary"]["overall"]
    assert set(overall["strategies"]["policy"]) == {
        "mean_score", "mean_goodput_ratio", "mean_latency_ratio", "slo_violation_min", "restarts"}
    events = data["scenarios"][0]["policy_events"]
    assert events["collapses"] == 1 and events["fallback_intervals_max"] <= 3
    assert overall["policy_events"]["stationary_changes"] == events["stationary_changes"]
    rows = (out / "bench-policy.csv").read_text().splitlines()
    assert rows[0].endswith("fallback_s_max,fallback_intervals_max,reenable_s_max,stationary_changes,exploration_changes")
    policy_row = next(r for r in rows if r.startswith("short,policy,"))
    oracle_row = next(r for r in rows if r.startswith("short,oracle,"))
    assert policy_row.split(",")[-5] != "" and oracle_row.split(",")[-5] == ""


def test_a_collapse_is_held_while_a_rollout_would_overload_and_the_report_says_why(tmp_path):
    """n-gram at 16 req/s on two replicas: a rollout would leave one replica near its
    capacity for six minutes, so the 10-minute dip below the floor is held, not chased with
    two overloading restarts; the benchmark reports the held collapse with its cause."""
    data = {**SHORT, "name": "dip", "method": "ngram", "duration": "30m", "phases": [
        {"at": 0, "request_rate": 16, "prompt_tokens": 1500, "output_tokens": 250, "acceptance": 0.7},
        {"at": "10m", "acceptance": 0.12},
        {"at": "20m", "acceptance": 0.7},
    ]}
    path = tmp_path / "dip.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run.run_scenario(path)
    assert result.changes == []
    (collapse,) = result.events["collapses"]
    assert collapse["fallback_s"] is None and collapse["held"]["by"] is Held.OVERLOAD
    target = next(t for t in suite.summarize([result])["targets"] if t["name"].startswith("fallback"))
    assert not target["met"] and "the rollout would overload the replicas left serving" in target["detail"]
    assert result.strategies[run.POLICY].score > result.strategies["off"].score


def _window_acceptance_sd(request_sd: float, windows: int = 40) -> tuple[float, float]:
    """(sd of the acceptance rate over 5-minute windows, mean requests per window) of one pod
    at K=3, alpha 0.7, 2 req/s."""
    import numpy as np

    from specdecode.tools.bench import telemetry
    from specdecode.control.perfmodel import EngineParams, Workload
    from specdecode.tools.sim import engine as sim_engine
    from specdecode.tools.sim import exposition as x

    pod = telemetry.BenchPodEngine(
        sim_engine.EngineConfig("m", "draft_model", 3), EngineParams.for_method("draft_model"),
        np.random.default_rng(5),
    )
    pod.request_acceptance_sd = request_sd
    workload = Workload(request_rate=2.0, prompt_tokens=1000, output_tokens=300, acceptance=0.7)
    rates, requests = [], []
    for _ in range(windows):
        drafted = pod.metrics.counters[x.SPEC_DRAFT_TOKENS]
        accepted = pod.metrics.counters[x.SPEC_ACCEPTED_TOKENS]
        admitted = 0
        for _ in range(20):  # 20 ticks of 15 s
            admitted += pod.advance(15.0, workload, 1).admitted
        rates.append((pod.metrics.counters[x.SPEC_ACCEPTED_TOKENS] - accepted)
                     / (pod.metrics.counters[x.SPEC_DRAFT_TOKENS] - drafted))
        requests.append(admitted)
    return float(np.std(rates, ddof=1)), float(np.mean(requests))


def test_requests_differ_so_a_window_is_as_uncertain_as_its_requests_make_it():
    """With per-request acceptance (sd 0.15, beta) a 5-minute window's acceptance rate varies
    like the mean of its ~600 requests (sd ~0.15 / sqrt(600 / 1.36) times the rate's slope in
    alpha), several times the binomial spread of its ~200k drafted tokens."""
    from specdecode.control.perfmodel import acceptance_rate

    overdispersed, n = _window_acceptance_sd(0.15)
    binomial, _ = _window_acceptance_sd(0.0)
    slope = (acceptance_rate(0.71, 3) - acceptance_rate(0.69, 3)) / 0.02
    expected = slope * 0.15 / math.sqrt(n / (1 + 0.6**2))
    assert 0.5 * expected < overdispersed < 2.0 * expected
    assert overdispersed > 3 * binomial


def test_the_suite_ships_day_long_stationary_and_measured_step_time_scenarios():
    scenarios = [load_scenario(p) for p in benchmark_suite()]
    day_long = [s.name for s in scenarios if run.is_day_long_stationary(s)]
    assert len(day_long) >= 3
    measured = [s for s in scenarios if s.params.step_table]
    assert len(measured) >= 4
    off_priors = [s.name for s in measured
                  if s.params.step_table_draft_scale >= 1.3 or s.params.step_overhead_s >= 2.3e-3]
    assert len(off_priors) >= 2
    assert all(s.noise.wanders and s.noise.request_acceptance_sd > 0 for s in scenarios)


def test_a_day_long_stationary_scenario_reports_its_changes_against_the_oracles(tmp_path, monkeypatch):
    """Smoke: a shipped day-long scenario cut to 1 h, with the day-long threshold lowered to
    match, runs and its changes land in the day-long target (the full day is the suite's)."""
    data = yaml.safe_load(builtin_scenario_path("day-break-even").read_text())
    data["duration"] = "1h"
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(run, "DAY_LONG_S", 3600.0)
    result = run.run_scenario(path)
    assert result.day_long_stationary
    summary = suite.summarize([result])
    target = next(t for t in summary["targets"] if t["name"].startswith("changes on day-long"))
    policy, oracle = result.strategies[run.POLICY].changes, result.strategies[run.ORACLE].changes
    assert f"day-break-even: {policy} vs {oracle}" in target["detail"]
    assert target["met"] == (policy <= oracle)
    assert summary["day_long_stationary_changes"] == {"day-break-even": {"policy": policy, "oracle": oracle}}


def test_the_benchmark_names_rules_by_the_policys_enum(tmp_path):
    from specdecode.control import decision as pol

    assert {r.value for r in pol.FALLBACK_RULES} == {"collapse", "floor", "fast-fallback", "slo-guard"}
    assert pol.FLOOR_RULES <= pol.FALLBACK_RULES and pol.PROBE_RULES.isdisjoint(pol.FALLBACK_RULES)
    data = yaml.safe_load(builtin_scenario_path("collapse-recovery").read_text())
    data["duration"], data["phases"] = "50m", data["phases"][:2]
    file = tmp_path / "cut.yaml"
    file.write_text(yaml.safe_dump(data))
    result = run.run_scenario(file)
    assert result.changes and all(isinstance(c.rule, pol.Rule) for c in result.changes)
    assert all(isinstance(rule, pol.Rule) for rule in result.rules)
    fallback = next(c for c in result.changes if c.time >= 30 * 60)
    assert fallback.rule in pol.FALLBACK_RULES


# --- generated scenarios ---------------------------------------------------------------------


def test_generated_scenarios_are_reproducible_valid_and_loaded_against_their_own_capacity():
    """The same seed draws the same scenarios, another seed others; every one is a valid,
    held-back scenario whose load is the stated share of what the truth itself can carry."""
    documents = generated.generate(7, 8)
    assert documents == generated.generate(7, 8)
    assert documents != generated.generate(8, 8)
    kinds = [doc["name"].rsplit("-", 1)[1] for doc in documents]
    assert kinds == ["stationary", "swing"] * 4
    for doc in documents:
        scenario = parse_scenario(doc, doc["name"])
        assert scenario.held_back and scenario.method in generated.METHODS
        first = scenario.phases[0]
        probe = perfmodel.Workload(1.0, first.prompt_tokens, first.output_tokens, 0.0, first.acceptance)
        capacity = max(perfmodel.steady_state(scenario.params, probe, k).capacity_rps for k in generated.CONFIGS)
        rates = [phase.request_rate / capacity for phase in scenario.phases]
        if doc["name"].endswith("stationary"):
            assert len(rates) == 1 and generated.STATIONARY_LOAD[0] - 0.01 <= rates[0] <= generated.STATIONARY_LOAD[1] + 0.01
        else:
            low, high, back = rates
            assert low == pytest.approx(back) and low < high <= generated.SWING_HIGH[1] + 0.01
    assert any("step_table" in doc["model"] for doc in generated.generate(1, 24))


def test_generated_swings_repeat_for_as_many_cycles_as_asked_and_draw_the_same_services():
    once, twice = generated.generate(5, 6), generated.generate(5, 6, cycles=2)
    for one, two in zip(once, twice):
        if one["name"].endswith("stationary"):
            assert two == one
            continue
        assert two["name"] == one["name"] + "-x2" and (one["duration"], two["duration"]) == ("4h", "8h")
        assert {k: v for k, v in two.items() if k not in ("name", "duration", "phases", "description")} == {
            k: v for k, v in one.items() if k not in ("name", "duration", "phases", "description")}
        scenario = parse_scenario(two, two["name"])
        low, high = one["phases"][0]["request_rate"], one["phases"][1]["request_rate"]
        assert [p.request_rate for p in scenario.phases] == [low, high, low, low, high, low]
        assert [start for start, _, _ in scenario.phase_spans()] == [0, 3600, 9000, 14400, 18000, 23400]


def test_generated_scenarios_on_the_measured_vllm_truth_keep_the_seeds_services():
    """The h100-vllm truth draws the services the default does (traffic, acceptance, the
    share of capacity), each a draft model on the measured vLLM 0.26 H100 table, loaded
    against what that truth carries; the default draws stay as they were."""
    mixed, vllm = generated.generate(9, 6, cycles=2), generated.generate(9, 6, cycles=2, truth="h100-vllm")
    assert mixed == generated.generate(9, 6, cycles=2)
    for one, two in zip(mixed, vllm):
        assert two["name"] == one["name"].replace("gen-", "gen-h100-vllm-", 1)
        assert two["method"] == "draft_model" and two["model"]["step_table"] == "h100-vllm026-llama8b-1b"
        assert two["seed"] == one["seed"]
        assert [p.get("acceptance") for p in two["phases"]] == [p.get("acceptance") for p in one["phases"]]
        scenario = parse_scenario(two, two["name"])
        first = scenario.phases[0]
        probe = perfmodel.Workload(1.0, first.prompt_tokens, first.output_tokens, 0.0, first.acceptance)
        capacity = max(perfmodel.steady_state(scenario.params, probe, k).capacity_rps for k in range(6))
        share = scenario.phases[0].request_rate / capacity
        assert share == pytest.approx(one["phases"][0]["request_rate"] / _capacity_of(one), rel=0.02)
    with pytest.raises(ValueError, match="truth must be one of mixed, h100-vllm"):
        generated.generate(9, 1, truth="h200")


def _capacity_of(doc) -> float:
    scenario = parse_scenario(doc, doc["name"])
    first = scenario.phases[0]
    probe = perfmodel.Workload(1.0, first.prompt_tokens, first.output_tokens, 0.0, first.acceptance)
    return max(perfmodel.steady_state(scenario.params, probe, k).capacity_rps for k in generated.CONFIGS)


def test_bench_policy_runs_generated_scenarios_and_keeps_them_beside_the_results(tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["bench", "policy", "--generated", "1", "--generated-seed", "3", "--json", "--no-plots",
                     "--out", str(out), "--jobs", "1"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["scenarios"]] == ["gen-3-00-stationary"]
    written = yaml.safe_load((out / "generated" / "gen-3-00-stationary.yaml").read_text())
    assert written == generated.generate(3, 1)[0]


def test_bench_policy_refuses_a_negative_number_of_generated_scenarios(capsys):
    assert cli.main(["bench", "policy", "--generated", "-2"]) == 2
    assert "--generated must be 0 or more" in capsys.readouterr().err
    assert cli.main(["bench", "policy", "--generated", "2", "--generated-cycles", "0"]) == 2
    assert "--generated-cycles must be at least 1" in capsys.readouterr().err


def test_bench_trace_prints_why_the_policy_held_and_marks_each_change(capsys):
    # steady-poor-draft: the SLO guard turns speculation off in the first minutes, then the
    # policy waits for its re-probe; a user reads both in the trace, with the reasons.
    assert cli.main(["bench", "trace", "steady-poor-draft", "--every", "15m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("steady-poor-draft: ")
    changes = [line for line in lines if line[8:9] == "*"]
    assert len(changes) == 1 and " off " in changes[0] and "slo-guard" in changes[0]
    assert any(line.lstrip().startswith("0h30m") and "re-probe in" in line for line in lines)
    assert lines[-1] == "1 change(s) of config, 0 canary experiment(s)"


def test_bench_trace_shows_a_schedule_and_the_canary_that_promoted_it(capsys):
    # flash-crowd: after the crowd the policy tries a schedule that stops drafting at the
    # crowd's batch on a canary, and the canary's verdict promotes it.
    assert cli.main(["bench", "trace", "flash-crowd", "--every", "1h"]) == 0
    out = capsys.readouterr().out
    assert "canary experiment (Change) started: draft_model 1-64:K3,65+:off" in out
    assert "* 1-64:K3,65+:off" in out
    assert "schedule: promoted from its canary: " in out


@pytest.mark.parametrize("argv, message", [
    (["nope"], "nope: no such file"),
    (["flash-crowd", "--every", "90s"], "--every 90s: the policy evaluates once a minute"),
    (["flash-crowd", "--every", "0"], "--every 0: not a positive duration"),
])
def test_bench_trace_refuses_bad_input_with_one_line(capsys, argv, message):
    assert cli.main(["bench", "trace", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
