"""The Grafana dashboard the chart ships (files/specdecode.json): the panels a platform team
asks about throughput and experiments, reading series that exist, laid out without overlap."""

from __future__ import annotations

import json

from specdecode import metricnames
from specdecode.shell import instrumentation

from .test_chart import CHART, find, template

DASHBOARD = CHART / "files" / "specdecode.json"


def panels() -> dict[str, dict]:
    return {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"}


def exprs(panel: dict) -> str:
    return "\n".join(t["expr"] for t in panel["targets"])


def test_tokens_per_second_reads_vllms_generation_counter_under_both_names():
    counter = metricnames.total(metricnames.GENERATION_TOKENS)
    text = exprs(panels()["Tokens per second"])
    assert counter in text and counter.replace("vllm:", "vllm_", 1) in text
    assert "sum by (namespace, specdecode_service)" in text


def test_goodput_is_throughput_while_the_slo_holds():
    text = exprs(panels()["Goodput (tokens per second within the SLO)"])
    assert metricnames.total(metricnames.GENERATION_TOKENS) in text
    assert 'type="SLOMet", status="False"' in text and "unless on (namespace, specdecode_service)" in text
    assert "or (0 *" in text  # 0 during a breach, not a gap


def test_experiments_are_counted_by_purpose_and_outcome():
    text = exprs(panels()["Experiments ended (per day)"])
    assert "specdecode_experiments_total" in text and "purpose, outcome" in text
    assert instrumentation.EXPERIMENTS._name + "_total" == "specdecode_experiments_total"
    assert {"purpose", "outcome"} <= set(instrumentation.EXPERIMENTS._labelnames)
    assert "specdecode_service_condition" in exprs(panels()["Experiments running and conditions to look at"])


def test_panels_do_not_overlap_and_ids_are_unique():
    every = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in every}) == len(every)
    cells = {}
    for panel in every:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        assert g["x"] + g["w"] <= 24


def test_the_configmap_carries_the_dashboard_unchanged():
    config_map = find(template("dashboard.enabled=true"), "ConfigMap")
    assert json.loads(config_map["data"]["specdecode.json"]) == json.loads(DASHBOARD.read_text())
