"""Real vLLM 0.26.0 on an H100 (issue 55): the committed measurement, the truth table derived
from it, the scenarios on it and the prior's error table (its real /metrics against the
simulator's exposition: test_sim_exposition.py). Every expectation is read from the committed
CSVs."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from specdecode.control import perfmodel, steptable
from specdecode.control.perfmodel import EngineParams, Schedule
from specdecode.tools.gpu import prior_error, vllm026
from specdecode.tools.scenario import benchmark_suite, load_scenario

DATA = resources.files("specdecode.control") / "data"


def _scenarios():
    return [s for s in map(load_scenario, benchmark_suite()) if s.params.step_table == vllm026.TABLE]


def test_the_truth_table_is_derived_from_the_committed_measurement():
    committed = (DATA / f"{vllm026.TABLE}-steptime.csv").read_text(encoding="utf-8")
    assert committed == vllm026.truth_table(vllm026.measured_steps())
    assert vllm026.TABLE in steptable.table_names()


def test_the_table_reproduces_every_measured_whole_step_at_every_k_0_to_5():
    """With the host overheads at 0 (they are inside the measured steps), the truth's step at
    a measured (config, batch) is the measured step_ms, for every K 0..5 (K 2 and K 4 are
    measured too, not interpolated between their neighbours)."""
    params = EngineParams.for_method("draft_model", {
        "step_table": vllm026.TABLE, "step_overhead_s": 0, "spec_overhead_s": 0, "max_k": 5})
    rows = [r for r in vllm026.measured_steps() if r["config"] in vllm026.TABLE_CONFIGS]
    assert sorted(vllm026.TABLE_CONFIGS.values()) == [1, 2, 3, 4, 5, 6]
    assert len(rows) == 36
    for r in rows:
        k = vllm026.TABLE_CONFIGS[r["config"]] - 1
        got = perfmodel.step_time(params, k, float(r["running_batch"]), 1100) * 1000
        assert got == pytest.approx(float(r["step_ms"]), rel=1e-9)
    steps = vllm026.step_ms(vllm026.measured_steps())
    # at batch 1 the measured K 2 is far from the old midway interpolation (draft-k3's odd point)
    k2 = perfmodel.step_time(params, 2, 1, 1100) * 1000
    assert k2 == pytest.approx(steps[("draft-k2", 1)])
    assert k2 < 0.8 * (steps[("draft-k1", 1)] + steps[("draft-k3", 1)]) / 2
    with pytest.raises(perfmodel.EngineParamsError, match="max_k"):
        EngineParams.for_method("draft_model", {"step_table": vllm026.TABLE, "max_k": 6})


def test_a_prefill_price_replaces_the_tables_token_slope_and_adds_the_draft_when_speculating():
    base = {"step_table": vllm026.TABLE, "step_overhead_s": 0, "spec_overhead_s": 0, "max_k": 5,
            "step_table_prefill_s": 20e-6, "step_table_draft_prefill_s": 5e-6}
    for method, draft in (("draft_model", 5e-6), ("ngram", 0.0)):
        params = EngineParams.for_method(method, base)
        for k, extra in ((0, 0.0), (3, draft)):
            decode = perfmodel.step_time(params, k, 64, 1100)
            assert perfmodel.step_time(params, k, 64, 1100, 1000) == pytest.approx(decode + 1000 * (20e-6 + extra))
    # unset: the table's own marginal token time, as before
    plain = EngineParams.for_method("draft_model", {k: v for k, v in base.items() if "prefill" not in k})
    assert perfmodel.step_time(plain, 0, 64, 1100, 1000) - perfmodel.step_time(plain, 0, 64, 1100) > 1000 * 40e-6


def test_the_shipped_h100_scenarios_take_the_measured_memory_prefill_and_restart():
    scenarios = _scenarios()
    assert len(scenarios) >= 3
    startup = {r["config"]: r for r in vllm026.read_csv(vllm026.STARTUP)}
    prefill, draft_prefill = vllm026.prefill_figures(vllm026.measured_steps())
    cold = max(float(startup[c]["seconds_to_ready"]) for c in ("off", "draft-k3", "table-k3-0", "draft-k1"))
    for s in scenarios:
        p = s.params
        assert perfmodel.kv_capacity(p, 0) == float(startup["off"]["kv_cache_tokens"])
        assert perfmodel.kv_capacity(p, 3) == pytest.approx(float(startup["draft-k3"]["kv_cache_tokens"]), rel=1e-6)
        assert p.step_overhead_s == 0 and p.spec_overhead_s == 0 and p.max_k == 5
        assert p.step_table_prefill_s == pytest.approx(prefill, rel=0.01)
        assert p.step_table_draft_prefill_s == pytest.approx(draft_prefill, rel=0.01)
        assert cold <= p.rollout_s < cold + 1
        assert all(ph.prompt_tokens == vllm026.PROMPT_TOKENS and ph.output_tokens == vllm026.OUTPUT_TOKENS
                   for ph in s.phases)
    # the schedule's truth is the measured table's median slow-down over the plain configs
    ratios = sorted(r for _, _, r in vllm026.schedule_ratios(vllm026.measured_steps()))
    median = (ratios[2] + ratios[3]) / 2
    penalised = [s for s in scenarios if s.params.schedule_penalty > 0]
    assert penalised and all(s.params.schedule_penalty == pytest.approx(median - 1, abs=0.01) for s in penalised)


def test_the_prior_error_table_is_computed_from_the_csv(tmp_path, capsys):
    rows = vllm026.measured_steps()
    pts = prior_error.points(rows)
    assert [(p.config, p.measured_ms) for p in pts] == [(r["config"], float(r["step_ms"])) for r in rows]
    prior = EngineParams.for_method("draft_model")
    off = next(p for p in pts if p.config == "off" and p.batch == 64)
    assert off.predicted_ms == pytest.approx(perfmodel.step_time(prior, 0, 64, 1096) * 1000)
    table = next(p for p in pts if p.config == "table-k3-0" and p.batch == 4)
    assert table.predicted_ms == pytest.approx(
        perfmodel.step_time(prior, Schedule(((1, 16, 3), (17, 1024, 0))), 4, 1098) * 1000)
    assert off.error == pytest.approx(off.predicted_ms / off.measured_ms - 1)
    # another CSV gives another table: doubling a measured step halves 1 + its error
    path = tmp_path / "m.csv"
    changed = [dict(r, step_ms=str(2 * float(r["step_ms"]))) if r["config"] == "off" else r for r in rows]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(changed)
    assert prior_error.main(["--csv", str(path), "-o", "csv"]) == 0
    out = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    doubled = next(r for r in out if r["config"] == "off" and r["batch"] == "64")
    assert 1 + float(doubled["error"]) == pytest.approx((1 + off.error) / 2, rel=1e-3)
