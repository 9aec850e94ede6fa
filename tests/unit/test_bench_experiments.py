"""The benchmark's canary experiments (issue #15): the engine serves both arms, prices the
canary, and the failed-probe cost is what the truth says probes that were not kept cost."""

from __future__ import annotations

import pytest

from specdecode.control import decision as dec
from specdecode.control.perfmodel import OFF
from specdecode.tools.bench import engine, run, telemetry
from specdecode.tools.scenario import parse_scenario

STEADY = {
    "name": "steady",
    "duration": "1h",
    "seed": 5,
    "method": "draft_model",
    "noise": "off",
    "slo": {"p95_e2e_s": 6, "p95_tpot_s": 0.02},
    "phases": [{"at": 0, "request_rate": 6, "acceptance": 0.8}],
}


def _scenario(**overrides):
    return parse_scenario({**STEADY, **overrides})


def _evaluator(scenario):
    return engine.SegmentEvaluator(scenario.params, scenario.slo.p95_e2e_s, scenario.slo.p95_tpot_s)


def test_a_capacity_neutral_canary_borrows_a_replica_until_it_is_ready_and_gives_it_back_after():
    start = engine.canary_start(600.0, 3, OFF, replicas=2, canary_replicas=1, borrowed=1, rollout_s=180.0)
    assert [(s.start, s.config, s.replicas, s.candidate, s.candidate_replicas) for s in start] == [
        (600.0, 3, 1, None, 0), (780.0, 3, 1, OFF, 1),
    ]
    end = engine.canary_end(1800.0, 3, replicas=2, borrowed=1, rollout_s=180.0)
    assert [(s.start, s.replicas) for s in end] == [(1800.0, 1), (1980.0, 2)]
    # An extra canary (surge budget) takes nothing from the main Deployment.
    extra = engine.canary_start(600.0, 3, OFF, replicas=2, canary_replicas=1, borrowed=0, rollout_s=180.0)
    assert [s.replicas for s in extra] == [2, 2] and not extra[0].rolling
    assert engine.canary_end(1800.0, 3, 2, 0, 180.0) == [engine.Serving(1800.0, 3, 2)]


def test_a_canary_of_the_same_config_serves_like_the_replica_it_replaces():
    """Traffic is shared per replica: one replica of each arm at the same config is the
    service at two replicas."""
    scenario = _scenario()
    evaluator = _evaluator(scenario)
    workload = evaluator.truth(scenario, 0.0)[1]
    plain = evaluator.evaluate(workload, 3, 600.0, 0.0, 2)
    mixed, worse = evaluator.evaluate_canary(workload, 3, 1, 3, 1, 600.0, 0.0)
    assert not worse
    assert mixed.arrivals == pytest.approx(plain.arrivals)
    assert mixed.e2e_mean_s == pytest.approx(plain.e2e_mean_s, rel=1e-6)
    assert mixed.goodput == pytest.approx(plain.goodput, rel=1e-6)


def test_a_worse_canary_costs_the_score_and_the_truth_says_it_was_worse():
    scenario = _scenario()
    evaluator = _evaluator(scenario)
    static = engine.evaluate_schedule(scenario, evaluator, [engine.Serving(0.0, 3, 2)])
    canary = [engine.Serving(0.0, 3, 2), *engine.canary_start(600.0, 3, OFF, 2, 1, 1, 180.0),
              *engine.canary_end(2400.0, 3, 2, 1, 180.0)]
    segments = engine.evaluate_schedule(scenario, evaluator, canary)
    served = [s for s in segments if s.candidate_replicas]
    assert served and all(s.candidate == OFF and s.candidate_worse for s in served)
    assert sum(s.duration for s in served) == pytest.approx(2400.0 - 780.0)
    assert engine.axes_of(segments).latency > engine.axes_of(static).latency
    # A better candidate is not "worse" (off against K=3 at acceptance 0.8 is the other way round).
    better = engine.evaluate_schedule(
        scenario, evaluator, [engine.Serving(0.0, OFF, 2), *engine.canary_start(600.0, OFF, 3, 2, 1, 1, 180.0)]
    )
    assert not any(s.candidate_worse for s in better if s.candidate_replicas)


def test_the_canary_pods_carry_the_candidates_hash_and_their_own_share_of_requests():
    scenario = _scenario()
    fleet = telemetry.Fleet("steady", "draft_model", scenario.params, 1, 900.0, 0.15)
    fleet.start(0, 3)
    fleet.start(2, OFF, "cand0ff")
    workload = scenario.phases[0].workload()
    for i in range(1, 41):
        fleet.advance(15.0, workload)
        fleet.scrape(15.0 * i)
    observations = fleet.observe(run.QueryScope.of(300.0), 600.0)
    main = telemetry.current_observation(observations, "steady", 3)
    canary = observations[run.ConfigKey(telemetry.NAMESPACE, "steady", "cand0ff")]
    assert main.requests == pytest.approx(canary.requests, rel=0.25)  # half the traffic each, own noise
    assert canary.requests != main.requests
    assert canary.speculation is None and main.speculation is not None  # the off arm drafts nothing
    assert canary.pods == main.pods == 1


def test_a_pod_deleted_on_the_data_of_its_last_scrape_leaves_the_pod_count():
    """The policy decides on a scrape's data and the rollout deletes a pod at that instant:
    Prometheus marks its series stale after that last sample (at its next scrape), so it is
    no longer one of the config's pods. A marker at the very instant of the last sample hid
    nothing, and the main Deployment read two pods for five minutes while one served."""
    scenario = _scenario()
    fleet = telemetry.Fleet("steady", "draft_model", scenario.params, 1, 900.0, 0.15)
    fleet.start(0, 3)
    fleet.start(1, 3)
    workload = scenario.phases[0].workload()
    for i in range(1, 21):
        fleet.advance(15.0, workload)
        fleet.scrape(15.0 * i)
    fleet.stop(1, 300.0)
    for i in range(21, 25):
        fleet.advance(15.0, workload)
        fleet.scrape(15.0 * i)
    main = telemetry.current_observation(fleet.observe(run.QueryScope.of(300.0), 360.0), "steady", 3)
    assert main.pods == 1


def _run(changes=(), spans=()) -> run.PolicyRun:
    return run.PolicyRun(schedule=[], changes=list(changes), experiments=list(spans))


def test_failed_probe_cost_counts_a_reverted_reprobe_on_every_replica_and_not_a_kept_one():
    scenario = _scenario(phases=[{"at": 0, "request_rate": 6, "acceptance": 0.2}])
    evaluator = _evaluator(scenario)
    probe = run.Change(600.0, OFF, 3, dec.Rule.REPROBE, "re-probe")
    back = run.Change(1200.0, 3, OFF, dec.Rule.COLLAPSE, "collapse")
    schedule = [engine.Serving(0.0, OFF, 2), *engine.rollout(600.0, OFF, 3, 2, 180.0),
                *engine.rollout(1200.0, 3, OFF, 2, 180.0)]
    segments = engine.evaluate_schedule(scenario, evaluator, schedule)
    cost = run.probe_cost(_run([probe, back]), segments, evaluator, 180.0, 1800.0)
    assert (cost.probes, cost.failed) == (1, 1)
    assert cost.startup_s == pytest.approx(4 * 180.0)  # two replicas restarted there and back
    # K=3 served on one replica 780-960, on two 960-1200 and on one 1200-1380 (the majority config).
    assert cost.served_worse_s == pytest.approx(180.0 + 2 * 240.0 + 180.0)
    kept = run.probe_cost(_run([probe]), segments, evaluator, 180.0, 1800.0)
    assert (kept.probes, kept.failed, kept.replica_minutes) == (1, 0, 0.0)


def test_failed_probe_cost_of_an_aborted_canary_is_its_replica_and_the_borrowed_starts():
    scenario = _scenario(phases=[{"at": 0, "request_rate": 6, "acceptance": 0.2}])
    evaluator = _evaluator(scenario)
    span = run.ExperimentSpan("Reprobe", 3, OFF, 600.0, 780.0, borrowed=1, replicas=1, ended=1500.0,
                              verdict="AbortWorse")
    schedule = [engine.Serving(0.0, OFF, 2), *engine.canary_start(600.0, OFF, 3, 2, 1, 1, 180.0),
                *engine.canary_end(1500.0, OFF, 2, 1, 180.0)]
    segments = engine.evaluate_schedule(scenario, evaluator, schedule)
    cost = run.probe_cost(_run(spans=[span]), segments, evaluator, 180.0, 1800.0)
    assert (cost.probes, cost.failed) == (1, 1)
    assert cost.served_worse_s == pytest.approx(1500.0 - 780.0)
    assert cost.startup_s == pytest.approx(2 * 180.0)
    promoted = run.ExperimentSpan("Reprobe", 3, OFF, 600.0, 780.0, 1, 1, ended=1500.0, verdict="Promote")
    assert run.probe_cost(_run(spans=[promoted]), segments, evaluator, 180.0, 1800.0).failed == 0


COLLAPSED = {**STEADY, "name": "collapsed", "duration": "40m",
             "phases": [{"at": 0, "request_rate": 6, "acceptance": 0.2}]}


def test_the_engine_runs_a_canary_from_a_status_record_and_gives_the_replica_back(monkeypatch, tmp_path):
    """A status with a running experiment record (constructed here, not by the loop): one
    replica of two runs the candidate beside the incumbent, read through its own hash;
    the abort deletes it and the main Deployment gets its replica back after a start-up."""
    from specdecode import api
    from specdecode.control import evaluation

    real = evaluation.evaluate
    seen = []

    def evaluate(status, spec, settings, observed, generation, now, canary=None):
        t = now.timestamp()
        seen.append((t, canary))
        result = real(status, spec, settings, observed, generation, now)
        record = None
        if t >= 600:
            record = api.ExperimentRecord(
                purpose="Change", candidate="draft_model K=1", candidate_enabled=True, candidate_k=1,
                candidate_hash="cand-k1", incumbent_hash="k3", started_at="1970-01-01T00:10:00Z",
                **({"verdict": "AbortNoGain", "reason": "no gain", "ended_at": "1970-01-01T00:25:00Z"}
                   if t >= 1500 else {}),
            )
        status = result.status.model_copy(update={"experiments": [record] if record else []})
        return evaluation.EvaluationResult(status, result.decision, result.events, False)

    monkeypatch.setattr(run.evaluation, "evaluate", evaluate)
    scenario = parse_scenario({**STEADY, "duration": "40m"})
    policy = run.run_policy(scenario, experiments=True)
    [span] = policy.experiments
    assert (span.started, span.ready_at, span.ended, span.verdict) == (600.0, 780.0, 1500.0, "AbortNoGain")
    assert (span.candidate, span.incumbent, span.borrowed) == (1, 3, 1)
    canary_windows = [c for t, c in seen if c is not None]
    assert canary_windows and all(c.key.config_hash == "cand-k1" for c in canary_windows)
    assert all(c is None for t, c in seen if t < 780.0 or t > 1500.0)
    shape = [(s.start, s.config, s.replicas, s.candidate, s.candidate_replicas) for s in policy.schedule]
    assert shape == [(0.0, 3, 2, None, 0), (600.0, 3, 1, None, 0), (780.0, 3, 1, 1, 1),
                     (1500.0, 3, 1, None, 0), (1680.0, 3, 2, None, 0)]
    assert policy.changes == []


SMOKE = {
    "name": "smoke-collapse",
    "duration": "45m",
    "seed": 9,
    "method": "draft_model",
    "slo": {"p95_e2e_s": 6, "p95_tpot_s": 0.02},
    "phases": [{"at": 0, "request_rate": 6, "acceptance": 0.8}, {"at": "5m", "acceptance": 0.2}],
}


def test_bench_policy_with_experiments_prints_the_experiment_table_with_sane_counts(tmp_path, capsys):
    """The CLI as a user runs it, on one small collapse: the experiments table has its
    columns, and the counts add up (every experiment ended or still runs, at most one per
    re-probe interval after the fallback)."""
    import json

    import yaml

    from specdecode import cli

    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(SMOKE))
    out = tmp_path / "out"
    code = cli.main(["bench", "policy", "--scenario", str(path), "--experiments", "compare", "--jobs", "1",
                     "--no-plots", "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    title = next(i for i, line in enumerate(table) if "Canary experiments (issue #15)" in line)
    header = table[title + 2]
    assert all(column in header for column in ("scenario", "score", "experiments", "restarts", "failed-probe cost"))
    row = next(line for line in table[title:] if "smoke-collapse (collapse)" in line)
    assert row.count(" / ") == 4  # score, restarts (with the oracle's) and cost, on / off side by side
    data = json.loads((out / "bench-policy.json").read_text())
    row = data["summary"]["experiments"]["scenarios"]["smoke-collapse"]
    on, off = row["on"], row["off"]
    assert row["collapse"] is True and off["experiments"] == 0
    assert 1 <= on["experiments"] <= 2  # the re-probe after the fallback runs on a canary
    assert on["promotions"] + on["aborts"] + on["cancelled"] <= on["experiments"]
    assert on["failed_probes"] <= on["probes"] and on["failed_probe_cost_replica_min"] >= 0
    assert on["restarts"] >= 1  # the fallback from the collapse is immediate, never canaried
    names = [t["name"] for t in data["summary"]["experiments"]["targets"]]
    assert len(names) == 2 and "restarts" in names[0] and "failed-probe cost" in names[1]


def test_the_suite_holds_back_scenarios_written_for_experiments_and_later():
    """Held back (never used to tune the policy when written): a collapse on a stale memory,
    n-gram phases, a draft that stops paying for the Control experiment to find (its control
    interval set as a user would, under autotune), and an EAGLE head whose traffic shifts."""
    from specdecode.tools.scenario import benchmark_suite, load_scenario

    held = {s.name: s for s in map(load_scenario, benchmark_suite()) if s.held_back}
    assert set(held) >= {"heldback-stale-memory-collapse", "heldback-ngram-phases", "heldback-draft-stopped-paying",
                         "heldback-eagle-topic-shift"}
    spec = run.service_spec(held["heldback-draft-stopped-paying"])
    assert spec.autotune.experiments.control_interval == "2h" and spec.autotune.experiments.enabled
    assert run.service_spec(held["heldback-ngram-phases"], experiments=False).autotune.experiments.enabled is False


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"])
def test_every_method_a_scenario_may_name_runs_as_a_service_a_user_could_apply(method):
    """The bench declares the scenario's service as a user would; methods that load a draft
    (a draft model or an EAGLE head) name one, or the API refuses the spec (an EAGLE scenario
    failed so until session 15)."""
    spec = run.service_spec(parse_scenario({**STEADY, "method": method}))
    assert spec.speculation.method.value == method
    assert (spec.speculation.draft_model is not None) == (method in ("draft_model", "eagle", "eagle3"))


def test_a_scenario_autotune_override_is_checked_against_the_api_with_the_field_named():
    from specdecode.tools.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"autotune\.experiments\.replicas"):
        parse_scenario({**STEADY, "autotune": {"experiments": {"replicas": 0}}})
