"""The policy benchmark: scoring engine, phase oracle, the policy replay and the command."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from specdecode import cli
from specdecode.bench import engine, run, suite
from specdecode.perfmodel import OFF
from specdecode.scenario import parse_scenario

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


@pytest.mark.parametrize("data", SCENARIOS, ids=lambda d: d["name"])
def test_oracle_scores_at_least_every_static_choice(data):
    scenario = parse_scenario(data)
    evaluator = _evaluator(scenario)
    configs = engine.configs_of(scenario.params)
    statics = {
        c: engine.evaluate_schedule(scenario, evaluator, engine.static_schedule(c, scenario.params.replicas))
        for c in configs
    }
    oracle = engine.phase_oracle(scenario, evaluator, configs, statics)
    oracle_fig = run.figures(list(oracle.segments), oracle.changes)
    for c, segments in statics.items():
        static_fig = run.figures(segments, 0).with_ratios(oracle_fig)
        assert engine.latency_integral(oracle.segments) <= engine.latency_integral(segments) + 1e-9
        assert static_fig.score <= 1.0 + 1e-12, (c, static_fig)


def test_oracle_switches_when_a_phase_repays_the_restart():
    scenario = parse_scenario(SHORT)
    evaluator = _evaluator(scenario)
    oracle = engine.phase_oracle(scenario, evaluator, engine.configs_of(scenario.params))
    assert oracle.configs[0] > 0 and oracle.configs[1] == OFF
    assert oracle.changes >= 1


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
    assert first.strategies[run.ORACLE].score == 1.0


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
    assert {"policy", "oracle", "off", "K=1", "K=3", "K=5", "K=8"} <= set(data["scenarios"][0]["strategies"])
    assert (out / "bench-policy.csv").read_text().startswith("scenario,strategy,score")
    assert (out / "short.png").stat().st_size > 10_000


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
    assert collapse["fallback_s"] is None and "replicas left serving" in collapse["held"]
    target = next(t for t in suite.summarize([result])["targets"] if t["name"].startswith("fallback"))
    assert not target["met"] and "the rollout would overload the replicas left serving" in target["detail"]
    assert result.strategies[run.POLICY].score > result.strategies["off"].score
