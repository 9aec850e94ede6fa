"""Measured step times: the shipped table, its interpolation and the truth built on it."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from specdecode.control import perfmodel, steptable
from specdecode.control.perfmodel import EngineParams, EngineParamsError, Workload

NAME = "h200-llama8b-1b"
TABLE_TRUTH = {"step_table": NAME, "step_overhead_s": 1.0e-3, "spec_overhead_s": 1.5e-3}


def _rows():
    path = resources.files("specdecode.control") / "data" / f"{NAME}-steptime.csv"
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_package_ships_the_measured_table():
    rows = _rows()
    assert len(rows) == 100 and NAME in steptable.table_names()
    table = steptable.load(NAME)
    assert table.batches == (1, 8, 32, 64, 128) and table.contexts == (512, 2048)


def test_interpolation_returns_every_measured_point():
    table = steptable.load(NAME)
    for row in _rows():
        value = table.gpu_ms(row["model"], float(row["batch_size"]), float(row["tokens_per_sequence"]),
                             float(row["context_tokens"]))
        assert value == pytest.approx(float(row["gpu_ms"]), rel=1e-12)


def test_interpolation_is_linear_between_points_and_extends_beyond_them():
    table = steptable.load(NAME)
    mid = table.gpu_ms("target", 48, 3, 1280)
    corners = [table.gpu_ms("target", b, t, c) for b in (32, 64) for t in (2, 4) for c in (512, 2048)]
    assert mid == pytest.approx(sum(corners) / 8, rel=1e-12)  # the centre of the cell
    # Above batch 128: along the 64 -> 128 segment; longer contexts: linear in context.
    at64, at128 = table.gpu_ms("target", 64, 1, 512), table.gpu_ms("target", 128, 1, 512)
    assert table.gpu_ms("target", 256, 1, 512) == pytest.approx(at128 + 2 * (at128 - at64))
    at512, at2048 = table.gpu_ms("target", 8, 1, 512), table.gpu_ms("target", 8, 1, 2048)
    assert table.gpu_ms("target", 8, 1, 3584) == pytest.approx(at2048 + (at2048 - at512))
    # Below batch 1 and beyond 9 tokens the table's edge holds.
    assert table.gpu_ms("draft", 0.2, 12, 512) == table.gpu_ms("draft", 1, 9, 512)


def test_a_table_step_is_target_plus_drafts_plus_the_overheads():
    params = EngineParams.for_method("draft_model", TABLE_TRUTH)
    table = steptable.load(NAME)
    expected = (
        table.gpu_ms("target", 32, 4, 1150)
        + table.gpu_ms("draft", 32, 2, 1150) + 2 * table.gpu_ms("draft", 32, 1, 1150)
    ) / 1000 + 1.0e-3 + 1.5e-3
    assert perfmodel.step_time(params, 3, 32, 1150) == pytest.approx(expected, rel=1e-9)
    off = (table.gpu_ms("target", 32, 1, 1150)) / 1000 + 1.0e-3
    assert perfmodel.step_time(params, 0, 32, 1150) == pytest.approx(off, rel=1e-9)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_proposer_on_the_host_runs_no_draft_forward_on_the_table(method):
    """n-gram and suffix propose by a lookup on the CPU: a K=3 step verifies 4 tokens per
    sequence and pays the lookup, never a draft model's forward passes."""
    params = EngineParams.for_method(method, {**TABLE_TRUTH, "step_table_draft_scale": 1.2})
    table = steptable.load(NAME)
    expected = table.gpu_ms("target", 32, 4, 1150) / 1000 + 1.0e-3 + 1.5e-3 + 32 * params.proposer_cpu_s_per_seq
    assert perfmodel.step_time(params, 3, 32, 1150) == pytest.approx(expected, rel=1e-9)


def test_the_table_truth_is_not_the_policys_model():
    """At batch 8 the first extra verified token costs 0.4-1.0 ms on the measured curve
    (data/README.md), and the truth's speculation overhead is 5x the prior's: speculating at
    K=1 costs the truth's step 1.5x more than the policy's priors say."""
    truth = EngineParams.for_method("draft_model", TABLE_TRUTH)
    prior = EngineParams.for_method("draft_model")

    def speculation_ms(params):
        return (perfmodel.step_time(params, 1, 8, 512) - perfmodel.step_time(params, 0, 8, 512)) * 1000

    assert speculation_ms(truth) > 1.5 * speculation_ms(prior)
    workload = Workload(request_rate=8, prompt_tokens=1000, output_tokens=300, acceptance=0.8)
    t = perfmodel.steady_state(truth, workload, 3)
    p = perfmodel.steady_state(prior, workload, 3)
    assert t.step_time_s > 1.1 * p.step_time_s and t.capacity_rps > 0


def test_a_bad_table_or_bound_names_the_field():
    with pytest.raises(EngineParamsError, match="model.step_table: no table 'h100'"):
        EngineParams.for_method("draft_model", {"step_table": "h100"})
    with pytest.raises(EngineParamsError, match="model.max_k"):
        EngineParams.for_method("draft_model", {"step_table": NAME, "max_k": 10})
