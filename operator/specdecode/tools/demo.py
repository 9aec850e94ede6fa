"""The demo's pure parts: the service it applies, the timeline it records, the view, the
summary and the picture.

`specdecode demo` (the shell, `commands/demo.py`) starts the local stack, applies a service
built by `demo_service`, and every second or two hands the SpecDecodeService objects it reads
to `Timeline.record`. Everything here takes time and objects as arguments: no clock, no API,
no processes; `plot_timeline` writes one file with matplotlib's Agg backend.

Times are seconds since the scenario started (the simulator's start): the scenario's own
events (`ScenarioEvent`, from its compressed phases) and the operator's decisions (from
`status.history`, whose timestamps are converted with the wall time of that start) share
one axis with the snapshots.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from specdecode.tools.scenario import Scenario, parse_duration
from specdecode import api, timestamps

# Autotune settings that make the control loop visible within minutes instead of hours: a
# short window and warm-up, a cooldown and re-probe that fit a compressed scenario, and a
# change budget that does not run out. Seen working end to end on the local stack: collapse
# to off within seconds of becoming visible, re-probe back on after the recovery. The demo's
# story is the loop's own moves: canary experiments (which run a re-probe on one replica
# first) are off here.
FAST_AUTOTUNE: dict[str, Any] = {
    "mode": "Auto",
    "evaluationInterval": "5s",
    "window": "30s",
    "warmup": "5s",
    "cooldown": "15s",
    "minDrafts": 200,
    "minRequests": 10,
    "reprobeInterval": "60s",
    "maxChangesPerHour": 30,
    "experiments": {"enabled": False},
}
FAST_ROLLOUT: dict[str, Any] = {"maxSurge": 1, "maxUnavailable": 0}

# The sample each method is shown with (manifests/samples/); others fall back to the first.
SAMPLE_FOR_METHOD = {
    "draft_model": "llama-3.1-8b-draft-model.yaml",
    "eagle3": "llama-3.1-8b-eagle3.yaml",
    "ngram": "qwen2.5-coder-ngram.yaml",
}
DEFAULT_SAMPLE = "llama-3.1-8b-draft-model.yaml"

SPECULATION_OFF_ACTIONS = frozenset({"disable", "fallback"})


# ------------------------------------------------------------------------------ the service


def demo_service(sample: Mapping[str, Any], *, namespace: str, prometheus_url: str,
                 scrape_interval: str = "1s") -> dict[str, Any]:
    """The sample SpecDecodeService as the demo applies it.

    Moved to the demo's namespace, pointed at the demo's Prometheus, with `FAST_AUTOTUNE`
    (bounds, SLOs and the acceptance floor stay the sample's) and a surge rollout so that
    changes keep capacity. The Hugging Face token reference goes: nothing is downloaded.
    """
    service = copy.deepcopy(dict(sample))
    metadata = service.setdefault("metadata", {})
    metadata["namespace"] = namespace
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        metadata.pop(key, None)
    service.pop("status", None)
    spec = service.setdefault("spec", {})
    spec.setdefault("autotune", {}).update(FAST_AUTOTUNE)
    spec.setdefault("rollout", {}).update(FAST_ROLLOUT)
    spec.setdefault("metrics", {}).update({"prometheusUrl": prometheus_url, "scrapeInterval": scrape_interval})
    cache = spec.get("modelCache")
    if isinstance(cache, dict):
        # The demo's namespace has neither the token Secret nor the model-cache PVC.
        for key in ("hfTokenSecret", "claimName", "type"):
            cache.pop(key, None)
        if not cache:
            spec.pop("modelCache")
    return service


def latency_slo(service: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """(P95 end-to-end, P95 time per output token) objectives of a service, in seconds."""
    slo = (((service.get("spec") or {}).get("autotune") or {}).get("slo")) or {}
    e2e, tpot = slo.get("p95EndToEnd"), slo.get("p95TimePerOutputToken")
    return (None if e2e is None else parse_duration(e2e)), (None if tpot is None else parse_duration(tpot))


# ------------------------------------------------------------------------- the scenario side


@dataclass(frozen=True)
class ScenarioEvent:
    """A change the scenario makes at `t` (seconds of the played, compressed scenario)."""

    t: float
    kind: str  # start, collapse, recovery, acceptance, surge, calm, load, workload
    label: str
    short: str = ""
    """A few words for the picture (`collapse (a=0.2)`)."""


def method_floor(scenario: Scenario) -> float:
    """The acceptance floor a service of the scenario's method gets by default."""
    return api.DEFAULT_ACCEPTANCE_FLOOR[api.SpeculationMethod(scenario.method)]


def scenario_events(scenario: Scenario, floor: Optional[float] = None) -> list[ScenarioEvent]:
    """What happens when, in words: the first phase, then every change of acceptance or load.

    A drop of acceptance below `floor` is a collapse, the first rise back above it a recovery;
    a rise of the request rate by half or more is a surge, a fall by a third or more calm
    (`floor` defaults to the method's default floor).
    """
    floor = method_floor(scenario) if floor is None else floor
    events: list[ScenarioEvent] = []
    previous = None
    collapsed = False
    for phase in scenario.phases:
        if previous is None:
            events.append(ScenarioEvent(phase.at, "start", f"acceptance {phase.acceptance:g}, "
                                                           f"{phase.request_rate:g} req/s"))
            collapsed = phase.acceptance < floor
            previous = phase
            continue
        if phase.acceptance != previous.acceptance:
            change = f"acceptance {previous.acceptance:g} -> {phase.acceptance:g}"
            short = f"acceptance {phase.acceptance:g}"
            if phase.acceptance < floor <= previous.acceptance:
                events.append(ScenarioEvent(phase.at, "collapse", f"collapse: {change}", f"collapse ({short})"))
                collapsed = True
            elif collapsed and phase.acceptance >= floor:
                events.append(ScenarioEvent(phase.at, "recovery", f"recovery: {change}", f"recovery ({short})"))
                collapsed = False
            else:
                events.append(ScenarioEvent(phase.at, "acceptance", change, short))
        if phase.request_rate != previous.request_rate:
            change = f"load {previous.request_rate:g} -> {phase.request_rate:g} req/s"
            short = f"{phase.request_rate:g} req/s"
            if phase.request_rate >= 1.5 * previous.request_rate:
                events.append(ScenarioEvent(phase.at, "surge", f"surge: {change}", f"surge ({short})"))
            elif phase.request_rate <= previous.request_rate / 1.5:
                events.append(ScenarioEvent(phase.at, "calm", f"calm: {change}", f"calm ({short})"))
            else:
                events.append(ScenarioEvent(phase.at, "load", change, short))
        for key, unit in (("temperature", ""), ("prompt_tokens", " prompt tokens"),
                          ("output_tokens", " output tokens")):
            before, after = getattr(previous, key), getattr(phase, key)
            if after != before:
                name = "temperature " if key == "temperature" else ""
                label = f"{name}{before:g} -> {after:g}{unit}"
                events.append(ScenarioEvent(phase.at, "workload", label, label))
        previous = phase
    return events


def scenario_now(scenario: Scenario, events: Sequence[ScenarioEvent], t: float) -> str:
    """One line for the view: the latest event and the phase's truth at `t`."""
    phase = scenario.phase_at(max(t, 0.0))
    latest = [e for e in events if e.t <= t]
    story = latest[-1].label if latest else "starting"
    return f"{story}  (true acceptance {phase.acceptance:g}, {phase.request_rate:g} req/s)"


# --------------------------------------------------------------------------- the timeline


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Snapshot:
    """What `kubectl get sds -o yaml` showed at `t`."""

    t: float
    phase: Optional[str] = None
    method: Optional[str] = None
    enabled: Optional[bool] = None
    k: Optional[int] = None
    live: Optional[bool] = None
    replicas: Optional[int] = None
    ready_replicas: Optional[int] = None
    acceptance: Optional[float] = None
    alpha: Optional[float] = None
    p95_e2e_s: Optional[float] = None
    p95_tpot_s: Optional[float] = None
    request_rate: Optional[float] = None
    running_requests: Optional[float] = None
    waiting_requests: Optional[float] = None
    kv_cache_usage: Optional[float] = None
    recommendation: Optional[str] = None
    recommendation_reason: Optional[str] = None
    metrics_available: Optional[bool] = None
    observed_at: Optional[str] = None

    @property
    def config(self) -> str:
        """`K=4`, `off`, or `pending` before the operator chose."""
        if self.enabled is None:
            return "pending"
        if not self.enabled:
            return "off"
        return f"K={self.k}" if self.k is not None else "on"


def snapshot_from_object(obj: Mapping[str, Any], t: float) -> Snapshot:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    speculation = status.get("speculation") or {}
    observations = status.get("observations") or {}
    recommendation = status.get("recommendation") or {}
    metrics_condition = next((c for c in status.get("conditions") or []
                              if c.get("type") == "MetricsAvailable"), None)
    enabled = speculation.get("enabled")
    k = speculation.get("k")
    return Snapshot(
        t=t,
        phase=status.get("phase"),
        method=speculation.get("method") or (spec.get("speculation") or {}).get("method"),
        enabled=bool(enabled) if enabled is not None else None,
        k=int(k) if isinstance(k, (int, float)) and not isinstance(k, bool) else None,
        live=speculation.get("live"),
        replicas=status.get("replicas"),
        ready_replicas=status.get("readyReplicas"),
        acceptance=_number(observations.get("acceptanceRate")),
        alpha=_number(observations.get("alpha")),
        p95_e2e_s=_number(observations.get("p95EndToEndSeconds")),
        p95_tpot_s=_number(observations.get("p95TimePerOutputTokenSeconds")),
        request_rate=_number(observations.get("requestRate")),
        running_requests=_number(observations.get("runningRequests")),
        waiting_requests=_number(observations.get("waitingRequests")),
        kv_cache_usage=_number(observations.get("kvCacheUsage")),
        recommendation=recommendation.get("action"),
        recommendation_reason=recommendation.get("reason"),
        metrics_available=None if metrics_condition is None else metrics_condition.get("status") == "True",
        observed_at=observations.get("observedAt"),
    )


@dataclass(frozen=True)
class Decision:
    """One entry of status.history, on the demo's time axis."""

    t: float
    action: str
    from_k: Optional[int]
    to_k: Optional[int]
    reason: str
    applied: bool = True

    @property
    def turns_off(self) -> bool:
        return self.action in SPECULATION_OFF_ACTIONS

    @property
    def turns_on(self) -> bool:
        return self.action == "enable"

    def describe(self) -> str:
        before = "off" if self.from_k is None else f"K={self.from_k}"
        after = "off" if self.to_k is None else f"K={self.to_k}"
        suffix = "" if self.applied else " (recommended only)"
        return f"{self.action} {before} -> {after}{suffix}"


def decision_from_record(record: Mapping[str, Any], started_at: datetime) -> Optional[Decision]:
    when = timestamps.parse_optional(record.get("time"))
    if when is None or not record.get("action"):
        return None
    return Decision(
        t=(when - started_at).total_seconds(),
        action=str(record["action"]),
        from_k=record.get("fromK"),
        to_k=record.get("toK"),
        reason=str(record.get("reason") or ""),
        applied=bool(record.get("applied", True)),
    )


@dataclass
class Timeline:
    """Everything seen of one service: snapshots and the decisions in its status.history.

    status.history is bounded; decisions are kept here by their identity, so a long demo
    still counts every decision it saw at least once.
    """

    namespace: str
    name: str
    started_at: datetime
    snapshots: list[Snapshot] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    model: Optional[str] = None
    draft: Optional[str] = None
    _seen: set = field(default_factory=set, repr=False)

    def record(self, obj: Mapping[str, Any], t: float) -> list[Decision]:
        """Add a snapshot of `obj` at `t`; return the decisions not seen before."""
        spec = obj.get("spec") or {}
        self.model = (spec.get("model") or {}).get("name", self.model)
        self.draft = (spec.get("speculation") or {}).get("draftModel", self.draft)
        self.snapshots.append(snapshot_from_object(obj, t))
        new = []
        for record in (obj.get("status") or {}).get("history") or []:
            key = (record.get("time"), record.get("action"), record.get("fromK"), record.get("toK"))
            if key in self._seen:
                continue
            decision = decision_from_record(record, self.started_at)
            if decision is None:
                continue
            self._seen.add(key)
            new.append(decision)
        self.decisions.extend(new)
        self.decisions.sort(key=lambda d: d.t)
        return new

    @property
    def latest(self) -> Optional[Snapshot]:
        return self.snapshots[-1] if self.snapshots else None

    @property
    def last_decision(self) -> Optional[Decision]:
        return self.decisions[-1] if self.decisions else None


# ---------------------------------------------------------------------------- the summary


@dataclass(frozen=True)
class Summary:
    """What the demo shows in numbers; `lines()` for people, `to_json()` for tests and CI.

    Times of responses are seconds after the scenario's event; a response to the recovery
    can come before it (a re-probe while the collapse still lasted): then it is negative.
    """

    service: str
    duration_s: float
    decisions: tuple[Decision, ...]
    time_on: dict[str, float]
    collapse_at: Optional[float] = None
    collapse_response: Optional[str] = None
    collapse_response_after_s: Optional[float] = None
    off_decided_after_s: Optional[float] = None
    off_live_after_s: Optional[float] = None
    recovery_at: Optional[float] = None
    recovery_response: Optional[str] = None
    recovery_response_after_s: Optional[float] = None
    on_decided_after_s: Optional[float] = None
    on_after_collapse_k: Optional[int] = None
    final_config: str = "pending"

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for decision in self.decisions:
            counts[decision.action] = counts.get(decision.action, 0) + 1
        return counts

    def lines(self) -> list[str]:
        counts = ", ".join(f"{action} {n}" for action, n in sorted(self.counts.items()))
        noun = "decision" if len(self.decisions) == 1 else "decisions"
        out = [f"{self.service}: {len(self.decisions)} {noun}" + (f" ({counts})" if counts else "")
               + f" in {clock(self.duration_s)}"]
        total = sum(self.time_on.values()) or 1.0
        shares = ", ".join(f"{config} {clock(seconds)} ({seconds / total:.0%})"
                           for config, seconds in self.time_on.items())
        out.append(f"  time on: {shares or 'nothing observed'}")
        if self.collapse_at is not None:
            head = f"  collapse at {clock(self.collapse_at)}: "
            if self.off_decided_after_s is not None:
                live = (f", off on every replica {self.off_live_after_s:.0f}s after"
                        if self.off_live_after_s is not None else "")
                out.append(f"{head}speculation off {self.off_decided_after_s:.0f}s after it began{live}")
            elif self.collapse_response is not None:
                out.append(f"{head}{self.collapse_response} {self.collapse_response_after_s:.0f}s after it began; "
                           "speculation stayed on")
            else:
                out.append(f"{head}no decision; speculation stayed on")
        if self.recovery_at is not None:
            head = f"  recovery at {clock(self.recovery_at)}: "
            after = self.recovery_response_after_s
            if self.recovery_response is not None and after is not None:
                when = (f"{after:.0f}s after it began" if after >= 0
                        else f"{-after:.0f}s before it (a re-probe while the collapse lasted)")
                if self.on_decided_after_s is not None:
                    k = f" at K={self.on_after_collapse_k}" if self.on_after_collapse_k is not None else ""
                    out.append(f"{head}speculation back on{k} {when}" + (" (a re-probe)" if after >= 0 else ""))
                else:
                    out.append(f"{head}{self.recovery_response} {when}")
            elif self.off_decided_after_s is not None:
                out.append(f"{head}speculation not back on by the end")
            elif self.collapse_response is not None:
                out.append(f"{head}K not raised again by the end")
            else:
                out.append(f"{head}nothing to undo")
        out.append(f"  at the end: {self.final_config}")
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["decisions"] = [asdict(d) for d in self.decisions]
        data["counts"] = self.counts
        return data


def time_on_configs(snapshots: Sequence[Snapshot], end: Optional[float] = None) -> dict[str, float]:
    """Seconds the operator had each config chosen, from the snapshots (each holds until the
    next; the last until `end`). Ordered by first appearance."""
    totals: dict[str, float] = {}
    for i, snapshot in enumerate(snapshots):
        until = snapshots[i + 1].t if i + 1 < len(snapshots) else (snapshot.t if end is None else end)
        totals[snapshot.config] = totals.get(snapshot.config, 0.0) + max(0.0, until - snapshot.t)
    return totals


def _lowers(decision: Decision) -> bool:
    return decision.turns_off or (decision.action == "set_k" and decision.from_k is not None
                                  and decision.to_k is not None and decision.to_k < decision.from_k)


def _raises(decision: Decision) -> bool:
    return decision.turns_on or (decision.action == "set_k" and decision.from_k is not None
                                 and decision.to_k is not None and decision.to_k > decision.from_k)


def summarize(timeline: Timeline, events: Sequence[ScenarioEvent], end: float) -> Summary:
    """The numbers of one service's run: decisions, time per config, and how long the
    operator took to respond to the (first) collapse and to the recovery after it."""
    decisions = tuple(d for d in timeline.decisions if d.applied and 0 <= d.t <= end + 5)
    collapse = next((e for e in events if e.kind == "collapse" and e.t < end), None)
    recovery = next((e for e in events if e.kind == "recovery" and collapse is not None and e.t > collapse.t
                     and e.t < end), None)
    fields: dict[str, Any] = {}
    response = off = None
    if collapse is not None:
        fields["collapse_at"] = collapse.t
        response = next((d for d in decisions if _lowers(d) and d.t >= collapse.t), None)
        if response is not None:
            fields["collapse_response"] = response.describe()
            fields["collapse_response_after_s"] = response.t - collapse.t
        off = next((d for d in decisions if d.turns_off and d.t >= collapse.t), None)
        if off is not None:
            fields["off_decided_after_s"] = off.t - collapse.t
            live = next((s for s in timeline.snapshots if s.t >= off.t and s.enabled is False and s.live), None)
            if live is not None:
                fields["off_live_after_s"] = live.t - collapse.t
    if recovery is not None:
        fields["recovery_at"] = recovery.t
        since = response.t if response is not None else recovery.t
        back = next((d for d in decisions if _raises(d) and d.t > since), None)
        if back is not None:
            fields["recovery_response"] = back.describe()
            fields["recovery_response_after_s"] = back.t - recovery.t
            if back.turns_on:
                fields["on_decided_after_s"] = back.t - recovery.t
                fields["on_after_collapse_k"] = back.to_k
    latest = timeline.latest
    return Summary(
        service=f"{timeline.namespace}/{timeline.name}",
        duration_s=end,
        decisions=decisions,
        time_on=time_on_configs([s for s in timeline.snapshots if s.t <= end], end),
        final_config=latest.config if latest else "pending",
        **fields,
    )


def clock(seconds: float) -> str:
    """`1m05s`, `42s`: times on the demo's axis."""
    seconds = max(0, int(round(seconds)))
    minutes, rest = divmod(seconds, 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


# ------------------------------------------------------------------------------- the view


def _fmt(value: Optional[float], pattern: str, scale: float = 1.0, missing: str = "-") -> str:
    return missing if value is None else pattern.format(value * scale)


def status_line(timeline: Timeline, t: float) -> str:
    """One plain line of a service's state, for logs and pipes."""
    s = timeline.latest
    if s is None:
        return f"[{clock(t):>6}] {timeline.name}: waiting for the operator"
    decision = timeline.last_decision
    last = f"; last: {decision.describe()} at {clock(decision.t)}" if decision else ""
    return (f"[{clock(t):>6}] {timeline.name}: {s.phase or 'Pending'} {s.config}"
            f"{'' if s.live in (None, True) else ' (rolling)'}"
            f" | acceptance {_fmt(s.acceptance, '{:.2f}')}"
            f" | p95 e2e {_fmt(s.p95_e2e_s, '{:.2f}s')} tpot {_fmt(s.p95_tpot_s, '{:.0f}ms', 1000)}"
            f" | {_fmt(s.request_rate, '{:.1f}')} req/s{last}")


def decision_line(timeline: Timeline, decision: Decision) -> str:
    return f"[{clock(decision.t):>6}] {timeline.name}: {decision.describe()}: {decision.reason}"


def render_view(timelines: Sequence[Timeline], *, t: float, total: float, scenario_line: str,
                title: str):
    """The live terminal view (a rich renderable): a header with the scenario's progress and
    one panel per service."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    # Fits 80 columns: the bar and the clock take 36, the scenario line has a row of its own.
    header = Table.grid(padding=(0, 1), expand=True)
    header.add_column(ratio=1)
    header.add_column(width=20)
    header.add_column(justify="right", width=14)
    header.add_row(Text(title, style="bold"), ProgressBar(total=max(total, 1.0), completed=min(t, total), width=20),
                   Text(f"{clock(t)} / {clock(total)}"))
    panels = [header, Text(f"scenario: {scenario_line}", style="cyan")]
    for timeline in timelines:
        panels.append(_service_panel(timeline, t))
    if not timelines:
        panels.append(Text("waiting for the service to appear...", style="dim"))
    return Group(*panels)


def _service_panel(timeline: Timeline, t: float):
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    s = timeline.latest or Snapshot(t=t)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    if s.enabled is None:
        speculation = Text("pending", style="dim")
    elif s.enabled:
        speculation = Text(f"on, K={s.k}", style="bold green")
    else:
        speculation = Text("off", style="bold red")
    if s.live is False:
        speculation.append("  (rolling out)", style="yellow")
    replicas = f"  {s.ready_replicas or 0}/{s.replicas or 0} ready" if s.replicas is not None else ""
    grid.add_row("phase", Text(f"{s.phase or 'Pending'}{replicas}"))
    grid.add_row("method", Text(f"{s.method or '-'}" + (f"  ({timeline.model} + {timeline.draft})"
                                                        if timeline.model and timeline.draft else "")))
    grid.add_row("speculation", speculation)
    metrics = "" if s.metrics_available in (None, True) else "  [metrics unavailable: holding]"
    grid.add_row("acceptance", Text(f"{_fmt(s.acceptance, '{:.2f}')} (alpha {_fmt(s.alpha, '{:.2f}')})"
                                    f"{metrics}"))
    grid.add_row("P95 latency", Text(f"end-to-end {_fmt(s.p95_e2e_s, '{:.2f} s')}, "
                                     f"per output token {_fmt(s.p95_tpot_s, '{:.1f} ms', 1000)}"))
    grid.add_row("load", Text(f"{_fmt(s.request_rate, '{:.1f}')} req/s, running {_fmt(s.running_requests, '{:.1f}')}"
                              f" per replica, waiting {_fmt(s.waiting_requests, '{:.1f}')}, "
                              f"KV cache {_fmt(s.kv_cache_usage, '{:.0%}')}"))
    decision = timeline.last_decision
    if decision is None:
        grid.add_row("last decision", Text("none yet", style="dim"))
    else:
        grid.add_row("last decision", Text(f"{decision.describe()} at {clock(decision.t)} "
                                           f"({clock(t - decision.t)} ago)", style="bold"))
        grid.add_row("", Text(decision.reason, style="italic"))
    if s.recommendation:
        grid.add_row("policy now", Text(f"{s.recommendation}: {s.recommendation_reason or ''}", style="dim"))
    if len(timeline.decisions) > 1:
        earlier = "; ".join(f"{clock(d.t)} {d.describe()}" for d in timeline.decisions[-5:-1])
        grid.add_row("earlier", Text(earlier, style="dim"))
    return Panel(grid, title=f"[bold]{timeline.namespace}/{timeline.name}", title_align="left")


# ------------------------------------------------------------------------------- the plot

_DECISION_STYLE = {
    "disable": ("v", "tab:red"),
    "fallback": ("v", "tab:red"),
    "enable": ("^", "tab:green"),
    "set_k": ("o", "tab:blue"),
}
_EVENT_COLOR = {"collapse": "tab:red", "recovery": "tab:green", "surge": "tab:orange", "calm": "tab:gray"}


def _series(snapshots: Sequence[Snapshot], attribute: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    """x and y of one observation; NaN where it was absent, so the line breaks there (with
    speculation off there is no acceptance to see)."""
    xs, ys = [], []
    for s in snapshots:
        value = getattr(s, attribute)
        xs.append(s.t)
        ys.append(math.nan if value is None else value * scale)
    return xs, ys


def off_spans(snapshots: Sequence[Snapshot], end: float) -> Iterable[tuple[float, float]]:
    """(start, stop) of every stretch with speculation chosen off."""
    start = None
    for s in snapshots:
        if s.enabled is False and start is None:
            start = s.t
        elif s.enabled is not False and start is not None:
            yield start, s.t
            start = None
    if start is not None:
        yield start, end


def _truth(scenario: Scenario, attribute: str, end: float) -> tuple[list[float], list[float]]:
    """A step line of the scenario's phases (what the simulator plays)."""
    xs, ys = [], []
    for start, stop, phase in scenario.phase_spans():
        if start >= end:
            break
        value = getattr(phase, attribute)
        xs += [start, min(stop, end)]
        ys += [value, value]
    return xs, ys


def plot_timeline(timelines: Sequence[Timeline], scenario: Scenario, events: Sequence[ScenarioEvent],
                  path: Path | str, *, end: float, title: str, floor: Optional[float] = None,
                  slo_e2e_s: Optional[float] = None, slo_tpot_s: Optional[float] = None,
                  dpi: int = 80) -> Path:
    """K over time with the decisions, acceptance (observed and true), load and P95 latency,
    one column per service, the scenario's events as vertical lines; a PNG at `path`."""
    floor = method_floor(scenario) if floor is None else floor
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(1, len(timelines))
    figure, axes = plt.subplots(4, columns, figsize=(11 * columns, 9.5), sharex=True, squeeze=False,
                                gridspec_kw={"height_ratios": [1.3, 1, 1, 1]})
    for column in range(columns):
        timeline = timelines[column] if timelines else None
        k_axis, acceptance_axis, load_axis, latency_axis = (axes[row][column] for row in range(4))
        for axis in axes[:, column]:
            for event in events:
                if 0 < event.t < end:
                    axis.axvline(event.t, color=_EVENT_COLOR.get(event.kind, "0.7"), linestyle=":", linewidth=1)
            axis.grid(True, alpha=0.3)
        for event in events:
            if 0 < event.t < end:
                k_axis.annotate(event.short or event.label, xy=(event.t, 1.0), xycoords=("data", "axes fraction"),
                                xytext=(3, -3), textcoords="offset points", va="top", fontsize=8,
                                color=_EVENT_COLOR.get(event.kind, "0.4"))
        snapshots = timeline.snapshots if timeline else []
        for start, stop in off_spans(snapshots, end):
            for axis in (k_axis, acceptance_axis):
                axis.axvspan(start, stop, color="0.85", alpha=0.5, linewidth=0)
        if any(True for _ in off_spans(snapshots, end)):
            acceptance_axis.annotate("grey: speculation off, acceptance not observable", xy=(1.0, 1.0),
                                     xycoords="axes fraction", xytext=(-4, -4), textcoords="offset points",
                                     ha="right", va="top", fontsize=7, color="0.4")
        # K: a step line (off = 0); decisions as markers where they were made.
        xs = [s.t for s in snapshots if s.enabled is not None]
        ks = [(s.k or 0) if s.enabled else 0 for s in snapshots if s.enabled is not None]
        if xs:
            xs, ks = xs + [end], ks + [ks[-1]]
            k_axis.step(xs, ks, where="post", color="black", linewidth=2, label="K chosen (0 = off)")
        top = max(ks + [4]) if xs else 4
        for decision in (timeline.decisions if timeline else []):
            if not (0 <= decision.t <= end):
                continue
            marker, color = _DECISION_STYLE.get(decision.action, ("s", "tab:purple"))
            level = 0 if decision.to_k is None else decision.to_k
            k_axis.scatter([decision.t], [level], marker=marker, s=90, color=color, zorder=5,
                           edgecolors="black", linewidths=0.5)
            k_axis.annotate(decision.action, xy=(decision.t, level), xytext=(4, 6), textcoords="offset points",
                            fontsize=8, color=color)
        k_axis.set_ylim(-0.5, top + 1.5)
        k_axis.set_ylabel("K (0 = off)")
        k_axis.set_title(title if not timeline else f"{title}: {timeline.namespace}/{timeline.name}",
                         fontsize=11, loc="left")
        # Acceptance.
        acceptance_axis.plot(*_truth(scenario, "acceptance", end), color="0.6", linestyle="--",
                             label="true alpha (scenario)")
        # alpha is per token; the rate is accepted / drafted tokens, which falls as K grows:
        # alpha (1 - alpha^K) / ((1 - alpha) K), 0.59 for alpha 0.8 at K=4 (DESIGN "Names").
        acceptance_axis.plot(*_series(snapshots, "acceptance"), color="tab:blue",
                             label="acceptance rate (accepted/drafted: lower at larger K)")
        acceptance_axis.plot(*_series(snapshots, "alpha"), color="tab:cyan", linewidth=1, alpha=0.8,
                             label="estimated alpha (per token)")
        acceptance_axis.axhline(floor, color="tab:red", linewidth=1, alpha=0.6, label=f"floor {floor:g}")
        acceptance_axis.set_ylim(0, 1.05)
        acceptance_axis.set_ylabel("acceptance")
        acceptance_axis.legend(loc="lower right", fontsize=7, ncol=2)
        # Load.
        load_axis.plot(*_truth(scenario, "request_rate", end), color="0.6", linestyle="--",
                       label="offered (scenario)")
        load_axis.plot(*_series(snapshots, "request_rate"), color="tab:orange", label="observed req/s")
        load_axis.set_ylabel("requests / s")
        load_axis.set_ylim(bottom=0)
        batch_axis = load_axis.twinx()
        batch_axis.plot(*_series(snapshots, "running_requests"), color="0.45", linewidth=1, linestyle="-.",
                        label="running per replica (batch, right axis)")
        batch_axis.set_ylabel("batch")
        batch_axis.set_ylim(bottom=0)
        handles = load_axis.get_legend_handles_labels()
        more = batch_axis.get_legend_handles_labels()
        load_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=7, ncol=3)
        # Latency.
        latency_axis.plot(*_series(snapshots, "p95_e2e_s"), color="tab:purple", label="P95 end-to-end (s)")
        if slo_e2e_s:
            latency_axis.axhline(slo_e2e_s, color="tab:purple", linestyle="--", linewidth=1, alpha=0.6,
                                 label=f"SLO {slo_e2e_s:g} s")
        latency_axis.set_ylabel("P95 e2e (s)")
        latency_axis.set_ylim(bottom=0)
        tpot_axis = latency_axis.twinx()
        tpot_axis.plot(*_series(snapshots, "p95_tpot_s", 1000), color="tab:green", label="P95 per output token (ms)")
        if slo_tpot_s:
            tpot_axis.axhline(slo_tpot_s * 1000, color="tab:green", linestyle="--", linewidth=1, alpha=0.6,
                              label=f"SLO {slo_tpot_s * 1000:g} ms")
        tpot_axis.set_ylabel("P95 TPOT (ms)")
        tpot_axis.set_ylim(bottom=0)
        handles = latency_axis.get_legend_handles_labels()
        more = tpot_axis.get_legend_handles_labels()
        latency_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=7, ncol=4)
        latency_axis.set_xlabel("seconds since the scenario started")
        latency_axis.set_xlim(0, end)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


def service_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace", ""), metadata.get("name", "")


def record_all(timelines: dict[tuple[str, str], Timeline], objects: Iterable[Mapping[str, Any]], t: float,
               started_at: datetime) -> list[tuple[Timeline, Decision]]:
    """Record every object (a new service gets its own timeline); return the new decisions."""
    new = []
    for obj in objects:
        key = service_key(obj)
        timeline = timelines.get(key)
        if timeline is None:
            timeline = timelines[key] = Timeline(namespace=key[0], name=key[1], started_at=started_at)
        new += [(timeline, decision) for decision in timeline.record(obj, t)]
    return new
