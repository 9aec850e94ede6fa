"""The demo's pure parts: the service it applies, the timeline from status snapshots, the
summary a newcomer reads, the live view and the PNG."""

from __future__ import annotations

import copy
import io
import struct
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from specdecode.tools import demo
from specdecode.api import SpecDecodeService
from specdecode.cli import ExitCode, main
from specdecode.tools.scenario import load_scenario, parse_scenario

from .conftest import SAMPLES, load_yaml

START = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
PROMETHEUS = "http://127.0.0.1:40123"


def rfc3339(seconds: float) -> str:
    return (START + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def sds(*, enabled=True, k=4, live=True, phase="Serving", acceptance=0.6, alpha=0.8, rate=4.0,
        history=(), name="llama", recommendation=("hold", "within the confidence box")) -> dict:
    speculation = {"enabled": enabled, "method": "draft_model", "live": live}
    if enabled:
        speculation["k"] = k
    return {
        "apiVersion": "serving.specdecode.io/v1alpha1",
        "kind": "SpecDecodeService",
        "metadata": {"name": name, "namespace": "specdecode-demo"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                 "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct"}},
        "status": {
            "phase": phase,
            "replicas": 2,
            "readyReplicas": 2,
            "speculation": speculation,
            "observations": {"acceptanceRate": acceptance, "alpha": alpha, "p95EndToEndSeconds": 3.2,
                             "p95TimePerOutputTokenSeconds": 0.009, "requestRate": rate, "runningRequests": 6.5,
                             "waitingRequests": 0.0, "kvCacheUsage": 0.12},
            "recommendation": {"action": recommendation[0], "enabled": enabled, "reason": recommendation[1]},
            "conditions": [{"type": "MetricsAvailable", "status": "True", "reason": "Fresh",
                            "lastTransitionTime": rfc3339(0)}],
            "history": list(history),
        },
    }


def record(t, action, from_k, to_k, reason="because"):
    entry = {"time": rfc3339(t), "action": action, "reason": reason, "applied": True}
    if from_k is not None:
        entry["fromK"] = from_k
    if to_k is not None:
        entry["toK"] = to_k
    return entry


# ------------------------------------------------------------------------------ the service


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_becomes_a_valid_fast_demo_service(sample):
    original = load_yaml(sample)
    kept = copy.deepcopy(original)
    service = demo.demo_service(original, namespace="specdecode-demo", prometheus_url=PROMETHEUS)
    assert original == kept, "the sample itself is not modified"
    parsed = SpecDecodeService.model_validate(service)
    assert parsed.metadata["namespace"] == "specdecode-demo"
    autotune = service["spec"]["autotune"]
    assert autotune["mode"] == "Auto" and autotune["evaluationInterval"] == "5s" and autotune["window"] == "30s"
    assert autotune["experiments"] == {"enabled": False}  # the demo shows the loop's own moves
    assert service["spec"]["rollout"] == {**original["spec"].get("rollout", {}), "maxSurge": 1, "maxUnavailable": 0}
    assert service["spec"]["metrics"]["prometheusUrl"] == PROMETHEUS
    # The demo's namespace has no token Secret and no model-cache PVC.
    assert not {"hfTokenSecret", "claimName"} & set(service["spec"].get("modelCache", {}))
    # What the user declared about speculation and SLOs stays.
    assert service["spec"]["speculation"] == original["spec"]["speculation"]
    assert autotune.get("slo") == original["spec"].get("autotune", {}).get("slo")


def test_each_method_has_a_shipped_sample():
    names = {p.name for p in SAMPLES}
    assert set(demo.SAMPLE_FOR_METHOD.values()) <= names and demo.DEFAULT_SAMPLE in names


# ------------------------------------------------------------------------------ scenario


def test_the_demo_scenario_tells_its_story_on_the_compressed_axis():
    played = load_scenario("demo").compressed(4)
    events = demo.scenario_events(played)
    assert [(e.t, e.kind) for e in events] == [
        (0, "start"), (60, "collapse"), (105, "recovery"), (150, "surge"), (210, "calm")]
    assert events[1].label == "collapse: acceptance 0.8 -> 0.2"
    assert events[3].label == "surge: load 4 -> 38 req/s"
    assert "true acceptance 0.2" in demo.scenario_now(played, events, 70)
    assert demo.scenario_now(played, events, 70).startswith("collapse")


def test_a_drop_that_stays_above_the_floor_is_no_collapse():
    scenario = parse_scenario({"name": "x", "duration": "10m", "method": "draft_model", "phases": [
        {"at": 0, "request_rate": 4, "acceptance": 0.8},
        {"at": "2m", "acceptance": 0.6, "temperature": 1.0},
        {"at": "4m", "acceptance": 0.1},
        {"at": "6m", "acceptance": 0.3},
        {"at": "8m", "acceptance": 0.7, "request_rate": 5},
    ]})
    kinds = [(e.kind, e.label) for e in demo.scenario_events(scenario)]
    assert kinds[1] == ("acceptance", "acceptance 0.8 -> 0.6")
    assert kinds[2] == ("workload", "temperature 0 -> 1")
    assert [k for k, _ in kinds[3:]] == ["collapse", "acceptance", "recovery", "load"]


# ------------------------------------------------------------------------------ timeline


def test_snapshots_read_what_kubectl_shows():
    snapshot = demo.snapshot_from_object(sds(k=3), 12.0)
    assert (snapshot.t, snapshot.phase, snapshot.config, snapshot.live) == (12.0, "Serving", "K=3", True)
    assert (snapshot.acceptance, snapshot.alpha, snapshot.p95_tpot_s, snapshot.request_rate) == (0.6, 0.8, 0.009, 4.0)
    assert snapshot.metrics_available is True and snapshot.recommendation == "hold"
    assert demo.snapshot_from_object(sds(enabled=False), 1).config == "off"
    empty = demo.snapshot_from_object({"metadata": {"name": "x"}, "spec": {}}, 0)
    assert empty.config == "pending" and empty.acceptance is None


def test_decisions_are_kept_across_the_bounded_history():
    timeline = demo.Timeline("specdecode-demo", "llama", START)
    first = record(70, "disable", 4, None, "alpha 0.24 < floor 0.35")
    assert [d.action for d in timeline.record(sds(history=[first]), 71)] == ["disable"]
    assert timeline.record(sds(history=[first]), 72) == [], "seen once, counted once"
    second = record(120, "enable", None, 3)
    new = timeline.record(sds(history=[second]), 121)  # the first fell out of the history
    assert [(d.t, d.action, d.from_k, d.to_k) for d in new] == [(120.0, "enable", None, 3)]
    assert [d.action for d in timeline.decisions] == ["disable", "enable"]
    assert timeline.last_decision.describe() == "enable off -> K=3"
    assert timeline.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_time_on_each_config_integrates_the_snapshots():
    snapshots = [demo.Snapshot(t=0), demo.Snapshot(t=5, enabled=True, k=4), demo.Snapshot(t=65, enabled=False),
                 demo.Snapshot(t=125, enabled=True, k=3)]
    assert demo.time_on_configs(snapshots, end=150) == {"pending": 5, "K=4": 60, "off": 60, "K=3": 25}


def _story_timeline() -> demo.Timeline:
    timeline = demo.Timeline("specdecode-demo", "llama", START)
    history = []
    for t in range(0, 240, 2):
        if t == 64:
            history.append(record(64, "disable", 4, None, "alpha 0.24 < floor 0.35"))
        if t == 150:
            history.append(record(150, "enable", None, 3, "re-probe"))
        if t == 190:
            history.append(record(190, "disable", 3, None, "load 38 req/s past the crossover"))
        on = t < 64 or 150 <= t < 190
        k = 4 if t < 64 else 3
        timeline.record(sds(enabled=on, k=k, live=t not in (64, 150, 190), history=history), float(t))
    return timeline


def test_summary_measures_fallback_and_reprobe_from_the_scenarios_events():
    events = demo.scenario_events(load_scenario("demo").compressed(4))
    summary = demo.summarize(_story_timeline(), events, end=240)
    assert summary.counts == {"disable": 2, "enable": 1}
    assert summary.collapse_at == 60 and summary.off_decided_after_s == 4 and summary.off_live_after_s == 6
    assert summary.recovery_at == 105 and summary.on_decided_after_s == 45 and summary.on_after_collapse_k == 3
    assert summary.time_on == {"K=4": 64, "off": 136, "K=3": 40}
    assert summary.final_config == "off"
    text = "\n".join(summary.lines())
    assert "3 decisions (disable 2, enable 1) in 4m00s" in text
    assert "collapse at 1m00s: speculation off 4s after it began, off on every replica 6s after" in text
    assert "recovery at 1m45s: speculation back on at K=3 45s after it began" in text
    assert "K=4 1m04s (27%)" in text
    data = summary.to_json()
    assert data["counts"] == {"disable": 2, "enable": 1} and data["decisions"][0]["action"] == "disable"


def test_summary_says_when_the_operator_did_not_react():
    timeline = demo.Timeline("specdecode-demo", "llama", START)
    for t in range(0, 120, 5):
        timeline.record(sds(), float(t))
    events = demo.scenario_events(load_scenario("demo").compressed(4))
    summary = demo.summarize(timeline, events, end=120)
    assert summary.off_decided_after_s is None and summary.on_decided_after_s is None
    assert summary.lines()[0] == "specdecode-demo/llama: 0 decisions in 2m00s"
    text = "\n".join(summary.lines())
    assert "collapse at 1m00s: no decision; speculation stayed on" in text
    assert "recovery at 1m45s: nothing to undo" in text


def _timeline_of(decisions: list[tuple[float, str, int | None, int | None]], end: int) -> demo.Timeline:
    timeline = demo.Timeline("specdecode-demo", "llama", START)
    history, k = [], 4
    for t in range(0, end, 2):
        for when, action, from_k, to_k in decisions:
            if when == t:
                history.append(record(when, action, from_k, to_k))
                k = to_k
        timeline.record(sds(enabled=k is not None, k=k, history=history), float(t))
    return timeline


def test_a_smaller_k_counts_as_the_response_to_a_collapse():
    events = demo.scenario_events(load_scenario("demo").compressed(4))
    summary = demo.summarize(_timeline_of([(64, "set_k", 4, 1), (120, "set_k", 1, 3)], 150), events, end=150)
    assert summary.off_decided_after_s is None and summary.collapse_response_after_s == 4
    assert summary.recovery_response == "set_k K=1 -> K=3" and summary.recovery_response_after_s == 15
    text = "\n".join(summary.lines())
    assert text.startswith("specdecode-demo/llama: 2 decisions (set_k 2) in 2m30s")
    assert "collapse at 1m00s: set_k K=4 -> K=1 4s after it began; speculation stayed on" in text
    assert "recovery at 1m45s: set_k K=1 -> K=3 15s after it began" in text


def test_a_reprobe_before_the_recovery_is_reported_as_such():
    events = demo.scenario_events(load_scenario("demo").compressed(4))
    summary = demo.summarize(_timeline_of([(64, "disable", 4, None), (100, "enable", None, 2)], 150), events,
                             end=150)
    assert summary.on_decided_after_s == -5 and summary.on_after_collapse_k == 2
    assert "  recovery at 1m45s: speculation back on at K=2 5s before it (a re-probe while the collapse lasted)" \
        in summary.lines()
    never = demo.summarize(_timeline_of([(64, "disable", 4, None)], 150), events, end=150)
    assert "  recovery at 1m45s: speculation not back on by the end" in never.lines()
    single = demo.summarize(_timeline_of([(64, "set_k", 4, 1)], 150), events, end=150)
    assert single.lines()[0] == "specdecode-demo/llama: 1 decision (set_k 1) in 2m30s"
    assert "  recovery at 1m45s: K not raised again by the end" in single.lines()


# ------------------------------------------------------------------------------ the view


def test_live_view_and_plain_lines_show_phase_k_acceptance_latency_load_and_the_last_decision():
    timeline = _story_timeline()
    played = load_scenario("demo").compressed(4)
    events = demo.scenario_events(played)
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(demo.render_view([timeline], t=200, total=240, scenario_line=demo.scenario_now(played, events, 200),
                                   title="demo x4"))
    screen = console.export_text()
    for expected in ("specdecode-demo/llama", "Serving", "draft_model", "off", "0.60", "3.20 s", "9.0 ms",
                     "4.0 req/s", "KV cache 12%", "disable K=3 -> off at 3m10s", "past the crossover",
                     "surge: load 4 -> 38 req/s", "3m20s / 4m00s"):
        assert expected in screen, expected
    line = demo.status_line(timeline, 200)
    assert line == ("[ 3m20s] llama: Serving off | acceptance 0.60 | p95 e2e 3.20s tpot 9ms | 4.0 req/s; "
                    "last: disable K=3 -> off at 3m10s")
    assert demo.decision_line(timeline, timeline.decisions[0]).endswith("disable K=4 -> off: alpha 0.24 < floor 0.35")
    waiting = Console(file=io.StringIO(), width=120, record=True)
    waiting.print(demo.render_view([], t=0, total=240, scenario_line="starting", title="demo"))
    assert "waiting for the service" in waiting.export_text()


def test_timeline_png_is_written(tmp_path):
    played = load_scenario("demo").compressed(4)
    events = demo.scenario_events(played)
    path = demo.plot_timeline([_story_timeline()], played, events, tmp_path / "sub" / "demo.png", end=240,
                              title="demo x4", slo_e2e_s=5, slo_tpot_s=0.02)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (880, 760)
    assert 20_000 < len(data) < 200_000
    empty = demo.plot_timeline([], played, events, tmp_path / "empty.png", end=10, title="nothing")
    assert empty.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------ the command


@pytest.mark.parametrize("argv, message, code", [
    (["--duration", "0s"], "--duration", ExitCode.USAGE),
    (["--time-scale", "-1"], "--time-scale", ExitCode.USAGE),
    (["--scenario", "no-such-scenario"], "no-such-scenario", ExitCode.USAGE),
    (["--sample", "/nonexistent/sds.yaml"], "--sample /nonexistent/sds.yaml", ExitCode.UNREADABLE),
])
def test_demo_refuses_bad_arguments_before_starting_anything(argv, message, code, capsys, tmp_path):
    assert main(["demo", "--workdir", str(tmp_path / "work"), *argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "work").exists()


def test_off_spans_cover_the_stretches_with_speculation_off():
    snapshots = [demo.Snapshot(t=0), demo.Snapshot(t=5, enabled=True, k=4), demo.Snapshot(t=65, enabled=False),
                 demo.Snapshot(t=70, enabled=False), demo.Snapshot(t=125, enabled=True, k=3),
                 demo.Snapshot(t=140, enabled=False)]
    assert list(demo.off_spans(snapshots, end=150)) == [(65, 125), (140, 150)]


def test_text_from_the_cluster_is_shown_as_is_never_as_console_markup():
    reason = "alpha_per_position [0.8, 0.6] and [/bold] [red]"
    obj = sds(history=[record(10, "set_k", 4, 3, reason)], recommendation=("hold", "[metrics] stale"))
    obj["status"]["conditions"][0]["status"] = "False"
    timeline = demo.Timeline("specdecode-demo", "llama", START)
    timeline.record(obj, 12)
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(demo.render_view([timeline], t=12, total=60, scenario_line="[x] start", title="[t]"))
    screen = console.export_text()
    assert reason in screen and "hold: [metrics] stale" in screen and "[metrics unavailable: holding]" in screen
    assert "scenario: [x] start" in screen


def test_a_second_demo_on_the_same_control_plane_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_STATE_DIR", str(tmp_path / "state"))
    from specdecode.commands.demo import _claim_cluster

    first = _claim_cluster("demo-unit")
    try:
        assert main(["demo", "--cluster-name", "demo-unit", "--workdir", str(tmp_path / "work")]) == 2
        assert "another specdecode demo runs on the local control plane 'demo-unit'" in capsys.readouterr().err
    finally:
        first.close()
    assert main(["demo", "--cluster-name", "Not_Valid", "--workdir", str(tmp_path / "work")]) == 2
    assert "--cluster-name: invalid cluster name" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_live_view_fits_80_columns_without_breaking_its_lines():
    """A stock 80-column terminal: nothing is cut, and each fact stays on one line."""
    timeline = _story_timeline()
    played = load_scenario("demo").compressed(4)
    events = demo.scenario_events(played)
    console = Console(file=io.StringIO(), width=80, record=True)
    scenario_line = demo.scenario_now(played, events, 200)
    console.print(demo.render_view([timeline], t=200, total=240, scenario_line=scenario_line, title="demo x4"))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("demo x4") and lines[0].rstrip().endswith("3m20s / 4m00s")
    assert lines[1].rstrip() == f"scenario: {scenario_line}"
    for fact in ("end-to-end 3.20 s, per output token 9.0 ms", "4.0 req/s, running 6.5 per replica, waiting 0.0, KV cache 12%",
                 "disable K=3 -> off at 3m10s (10s ago)"):
        assert any(fact in line for line in lines), fact
