"""Scenario files: parsing, carry-over, errors, time, compression and the shipped suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdecode.control.perfmodel import OFF, best_config
from specdecode.tools.scenario import (
    Scenario,
    ScenarioError,
    benchmark_suite,
    builtin_scenario_names,
    format_duration,
    load_scenario,
    parse_duration,
    parse_scenario,
    phase_at,
    true_conditions,
)

MINIMAL = {
    "name": "t",
    "duration": "1h",
    "seed": 3,
    "method": "draft_model",
    "phases": [
        {"at": 0, "request_rate": 4, "prompt_tokens": 800, "output_tokens": 200, "acceptance": 0.8},
        {"at": "20m", "acceptance": 0.2},
        {"at": "40m", "request_rate": 30, "temperature": 0.7},
    ],
}


def load_scenario_text(text: str) -> Scenario:
    import yaml

    return parse_scenario(yaml.safe_load(text), "test.yaml")


def scenario(**changes) -> Scenario:
    return parse_scenario({**MINIMAL, **changes}, "test.yaml")


def error_of(**changes) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario(**changes)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("test.yaml: ")
    return message


@pytest.mark.parametrize(
    "text, seconds",
    [(90, 90.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("6h", 21600.0),
     ("1h30m", 5400.0), ("250ms", 0.25), ("1d", 86400.0)],
)
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1hh", "m5", "-3", "abc", True, None, "5 parsecs"])
def test_parse_duration_rejects(text) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@given(st.floats(min_value=0.001, max_value=1e6))
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-5, abs=1e-3)


def test_phases_carry_over_unset_keys() -> None:
    sc = scenario()
    first, second, third = sc.phases
    assert (second.at, second.request_rate, second.prompt_tokens, second.acceptance) == (
        1200.0, 4, 800, 0.2)
    assert (third.request_rate, third.acceptance, third.temperature, third.output_tokens) == (
        30, 0.2, 0.7, 200)
    assert first.temperature == 0.0


def test_first_phase_defaults_tokens_and_temperature() -> None:
    sc = scenario(phases=[{"at": 0, "request_rate": 1, "acceptance": 0.5}])
    assert (sc.phases[0].prompt_tokens, sc.phases[0].output_tokens) == (1000, 300)


def test_phase_at_holds_each_phase_until_the_next() -> None:
    sc = scenario()
    assert phase_at(sc, 0).acceptance == 0.8
    assert phase_at(sc, 1199.9).acceptance == 0.8
    assert phase_at(sc, 1200).acceptance == 0.2
    assert phase_at(sc, 3599).request_rate == 30
    assert phase_at(sc, -5).acceptance == 0.8 and phase_at(sc, 1e9).request_rate == 30
    spans = list(sc.phase_spans())
    assert [(a, b) for a, b, _ in spans] == [(0, 1200), (1200, 2400), (2400, 3600)]


def test_compression_shrinks_time_only() -> None:
    sc = scenario(
        noise={"acceptance_sd": 0.05, "period": "30s"},
        metrics_outage=[{"at": "10m", "duration": "5m"}],
        model={"rollout_s": "3m"},
    )
    fast = sc.compressed(60)
    assert fast.duration == 60
    assert [p.at for p in fast.phases] == [0, 20, 40]
    assert (fast.metrics_outage[0].at, fast.metrics_outage[0].duration) == (10, 5)
    assert fast.noise is not None and fast.noise.period == 0.5
    assert [p.request_rate for p in fast.phases] == [p.request_rate for p in sc.phases]
    assert fast.params.rollout_s == 180
    assert phase_at(fast, 21).acceptance == phase_at(sc, 21 * 60).acceptance
    with pytest.raises(ScenarioError):
        sc.compressed(0)


def test_noise_is_deterministic_and_keeps_the_mean() -> None:
    sc = scenario(noise={"acceptance_sd": 0.05, "request_rate_cv": 0.3, "period": "10s"})
    a = [true_conditions(sc, t).workload for t in range(0, 1200, 10)]
    b = [true_conditions(sc, t).workload for t in reversed(range(0, 1200, 10))][::-1]
    assert a == b
    rates = [w.request_rate for w in a]
    assert len(set(rates)) > 100
    assert sum(rates) / len(rates) == pytest.approx(4, rel=0.1)
    alphas = [w.acceptance for w in a]
    assert sum(alphas) / len(alphas) == pytest.approx(0.8, abs=0.02)
    other_seed = parse_scenario({**MINIMAL, "seed": 4, "noise": sc.noise.model_dump()}, "x")
    assert true_conditions(other_seed, 0).workload != a[0]


def test_noise_off_means_the_phase_exactly() -> None:
    sc = scenario(noise=False, metrics_outage=[{"at": "10m", "duration": "1m"}])
    c = true_conditions(sc, 605)
    assert c.workload == sc.phases[0].workload() and c.metrics_outage
    assert not true_conditions(sc, 660).metrics_outage
    assert sc.noise.request_acceptance_sd > 0  # requests still differ from one another


def test_the_truth_wanders_by_default() -> None:
    sc = scenario()
    draws = {true_conditions(sc, t).workload for t in range(0, 1200, 60)}
    assert len(draws) == 20
    assert all(abs(w.acceptance - 0.8) < 0.12 for w in draws)
    yaml_off = load_scenario_text("name: t\nduration: 1h\nmethod: draft_model\nnoise: off\n"
                                  "phases:\n  - {at: 0, request_rate: 4, acceptance: 0.8}\n")
    assert not yaml_off.noise.wanders


def test_model_overrides_reach_the_engine_params() -> None:
    sc = scenario(method="eagle", model={"replicas": 3, "rollout_s": "2m"})
    assert sc.params.replicas == 3 and sc.params.rollout_s == 120
    assert sc.params.draft_cost_ratio == pytest.approx(0.08)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"method": "medusa"}, "method: 'medusa' is not a method; use one of draft_model"),
        ({"duration": "1hh"}, "duration: '1hh' is not a duration; write it like 90s"),
        ({"model": {"step_fixed": 1}}, "model.step_fixed: unknown parameter; valid keys are"),
        ({"model": {"min_k": 4, "max_k": 2}}, "model.min_k/max_k"),
        ({"slo": {"p95_e2e": 3}}, "slo.p95_e2e: unknown key 'p95_e2e'; valid keys here: p95_e2e_s"),
        ({"colour": "red"}, "colour: unknown key 'colour'; valid keys here: name"),
        ({"phases": []}, "phases: list at least one phase"),
        ({"phases": [{"at": "5m", "request_rate": 1, "acceptance": 0.5}]},
         "phases[0].at: the first phase must start at 0"),
        ({"phases": [{"at": 0, "request_rate": 1}]}, "the first phase must set acceptance"),
        ({"phases": [{"at": 0, "request_rate": 1, "acceptance": 1.5}]},
         "phases[0].acceptance: Input should be less than or equal to 1"),
        ({"phases": [{"at": 0, "request_rate": 1, "acceptance": 0.5, "acceptence": 0.4}]},
         "phases[0].acceptence: unknown key 'acceptence'; valid keys here: at, request_rate"),
        ({"phases": MINIMAL["phases"] + [{"at": "10m", "acceptance": 0.3}]},
         "phases[3].at: 10m is not after phases[2].at 40m; list phases in time order"),
        ({"phases": MINIMAL["phases"] + [{"at": "2h", "acceptance": 0.3}]},
         "phases[3].at: 2h is not within duration 1h"),
        ({"metrics_outage": [{"at": "3h", "duration": "1m"}]}, "metrics_outage[0].at: 3h is past"),
    ],
)
def test_errors_name_the_field_and_the_fix(changes, expected) -> None:
    assert expected in error_of(**changes)


def test_load_from_any_path_and_report_yaml_errors(tmp_path: Path) -> None:
    good = tmp_path / "mine.yaml"
    good.write_text(
        "name: mine\nduration: 10m\nmethod: ngram\n"
        "phases:\n  - {at: 0, request_rate: 2, acceptance: 0.6}\n"
    )
    assert load_scenario(good).method == "ngram"
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_scenario(broken)
    with pytest.raises(ScenarioError, match="no such file; give a path or a built-in scenario"):
        load_scenario(tmp_path / "absent.yaml")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ScenarioError, match="expected a mapping"):
        load_scenario(listed)


# --- the shipped suite ----------------------------------------------------------------------

SUITE_TOPICS = {
    "steady-good-draft", "steady-poor-draft", "collapse-recovery", "diurnal-load",
    "high-temperature", "bursty-ngram", "noisy-metrics", "metrics-outage", "slow-drift",
    "large-target", "costly-draft", "gpu-slow",
}


def test_every_shipped_scenario_loads() -> None:
    names = builtin_scenario_names()
    assert SUITE_TOPICS | {"demo"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name
        assert sc.slo.p95_e2e_s and sc.slo.p95_tpot_s
    assert "demo" not in {p.stem for p in benchmark_suite()}


def test_some_shipped_scenarios_have_true_costs_unlike_the_defaults() -> None:
    differing = [n for n in SUITE_TOPICS if load_scenario(n).model]
    assert {"large-target", "costly-draft", "gpu-slow"} <= set(differing)


def test_the_suite_makes_the_choice_matter() -> None:
    """Across the suite the phase-best config varies: off somewhere, several K elsewhere."""
    bests: set[int] = set()
    for name in SUITE_TOPICS:
        sc = load_scenario(name)
        for _, _, phase in sc.phase_spans():
            bests.add(best_config(sc.params, phase.workload()))
    assert OFF in bests and len(bests - {OFF}) >= 3


def test_diurnal_load_crosses_where_speculation_stops_paying() -> None:
    sc = load_scenario("diurnal-load")
    per_phase = [best_config(sc.params, p.workload()) for p in sc.phases]
    assert per_phase[0] != OFF and OFF in per_phase
    peak = max(sc.phases, key=lambda p: p.request_rate)
    assert peak.request_rate / sc.params.replicas >= 15


def test_demo_tells_its_story() -> None:
    sc = load_scenario("demo")
    alphas = [p.acceptance for p in sc.phases]
    rates = [p.request_rate for p in sc.phases]
    assert alphas[0] >= 0.75 and min(alphas) <= 0.25 and alphas[-1] >= 0.75
    assert max(rates) >= 30 and rates[-1] < 10
    assert sc.duration <= 20 * 60


def test_a_scenario_file_that_is_not_utf8_or_repeats_a_key_is_one_clear_error(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: x\n\xff\n")
    with pytest.raises(ScenarioError, match=r"binary.yaml: not UTF-8: byte 0xff at line 2"):
        load_scenario(binary)
    repeated = tmp_path / "repeated.yaml"
    repeated.write_text("name: x\nname: y\n")
    with pytest.raises(ScenarioError, match=r"repeated.yaml.*'name'"):
        load_scenario(repeated)
