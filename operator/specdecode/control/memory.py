"""What the control loop remembers between evaluations: the decision history (changes,
probes, acceptance and calibration of either side) and the recent low acceptance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, TYPE_CHECKING

from specdecode import timestamps
from specdecode.control.decision import Action, Rule
from specdecode.control.experiments import Purpose
from specdecode.control.settings import PolicyTuning
from specdecode.control.metrics import Observation
from specdecode.control.perfmodel import OFF

if TYPE_CHECKING:
    from specdecode.control.decision import Decision
    from specdecode.control.experiments import Experiment
    from specdecode.control.state import ControlState


STATUS_DIGITS = 4
"""Acceptance is stored in status with 4 decimals: the memory keeps what the status can hold,
so a state read back from the status equals the one that was written."""
REASON_CHARS = 1024
"""status.history's reasons are cut here."""


def recent_low_alpha(
    previous: float | None,
    previous_at: float | None,
    observation: Observation | None,
    min_drafts: float,
    now: float,
    memory_s: float = PolicyTuning.payback_horizon_s,
) -> float | None:
    """The lowest acceptance seen lately: a new low at once, a rise only gradually (each
    evaluation closes the gap to the present by elapsed / ``memory_s``: a time constant of
    ``memory_s``). Only a window with ``min_drafts`` drafted tokens counts (a young config's
    first drafts are noise, not a low). Without such a measurement (speculation off, an
    outage, too few drafts) the memory is kept as it is: nothing was learned that could
    lift it."""
    spec = None if observation is None else observation.speculation
    alpha = None
    if spec is not None and spec.alpha is not None and spec.draft_tokens >= min_drafts:
        alpha = spec.alpha
    if alpha is None:
        return previous
    if previous is None or previous_at is None:
        return alpha
    fraction = min(1.0, max(0.0, now - previous_at) / memory_s)
    relaxed = previous + (alpha - previous) * fraction
    return max(min(previous, alpha), min(alpha, relaxed))


def recent_peak(
    previous: tuple[float, float] | None,
    previous_at: float | None,
    observation: Observation | None,
    now: float,
    tuning: PolicyTuning = PolicyTuning(),
) -> tuple[float, float] | None:
    """(rate, when last seen) of the highest load (finished requests per second, the long
    window's) of about the last day: a new peak at once; a load within ``peak_refresh_share``
    of it sees it again; kept whole for ``peak_hold_s`` after it was last seen, then each
    evaluation (``previous_at``: the one before) closes the gap to today's load by elapsed /
    ``peak_memory_s``. An idle or unread window leaves it as it is. (A plain decay with a
    one-day time constant kept only 43 % of a daily peak's excess over the night's load by the
    next day's peak.)"""
    if observation is None or observation.idle:
        return previous
    rate = observation.request_rate
    if previous is None:
        return rate, now
    peak, seen_at = previous
    if rate >= tuning.peak_refresh_share * peak:
        return max(rate, peak), now
    if now - seen_at < tuning.peak_hold_s or previous_at is None:
        return previous
    fraction = min(1.0, max(0.0, now - previous_at) / tuning.peak_memory_s)
    return max(rate, peak + (rate - peak) * fraction), seen_at


@dataclass(frozen=True)
class HistoryEntry:
    """One decision of status.history (newest last). camelCase only in `to_status`."""

    time: float
    action: Action
    from_k: int | None
    to_k: int | None
    reason: str = ""
    applied: bool = True
    alpha: float | None = None
    """Acceptance measured on the config being left (memory for re-probes)."""
    step_scale: float | None = None
    """Measured/prior step time of the config being left (calibration memory)."""
    from_schedule: str | None = None
    """Per-batch-size K schedule left (its label), None for plain K."""
    to_schedule: str | None = None
    """Per-batch-size K schedule chosen (its label), None for plain K."""
    rule: str | None = None
    """The rule that decided (`decision.Rule`'s value); None for a start-up failure's fallback
    and for records written before it was kept."""

    @property
    def from_config(self) -> int:
        return self.from_k or OFF

    @property
    def to_config(self) -> int:
        return self.to_k or OFF

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "time": timestamps.rfc3339(self.time),
            "action": self.action.value,
            "applied": self.applied,
            "reason": self.reason[:REASON_CHARS],
        }
        if self.from_k is not None:
            out["fromK"] = self.from_k
        if self.to_k is not None:
            out["toK"] = self.to_k
        if self.alpha is not None:
            out["alpha"] = round(self.alpha, STATUS_DIGITS)
        if self.step_scale is not None:
            out["stepScale"] = round(self.step_scale, STATUS_DIGITS)
        if self.from_schedule is not None:
            out["fromSchedule"] = self.from_schedule
        if self.to_schedule is not None:
            out["toSchedule"] = self.to_schedule
        if self.rule is not None:
            out["rule"] = self.rule
        return out

    @classmethod
    def from_status(cls, record: Mapping[str, Any]) -> "HistoryEntry":
        """Parse one status.history record (camelCase wire form)."""
        return cls(
            time=timestamps.epoch_seconds(record["time"]),
            # Unknown actions (none are written today) count as a change of K.
            action=Action(record["action"]) if record["action"] in _ACTIONS else Action.SET_K,
            from_k=record.get("fromK"),
            to_k=record.get("toK"),
            reason=record.get("reason", ""),
            applied=bool(record.get("applied", True)),
            alpha=record.get("alpha"),
            step_scale=record.get("stepScale"),
            from_schedule=record.get("fromSchedule"),
            to_schedule=record.get("toSchedule"),
            rule=record.get("rule"),
        )


_ACTIONS = {a.value for a in Action}


def history_from_status(records: Iterable[Mapping[str, Any]]) -> tuple[HistoryEntry, ...]:
    """status.history as entries, oldest first."""
    return tuple(sorted((HistoryEntry.from_status(r) for r in records), key=lambda e: e.time))


@dataclass(frozen=True)
class Memory:
    """What history remembers: changes, probes, acceptance and calibration of either side."""

    last_change_at: float | None
    changes_last_hour: int
    in_probe: bool
    failed_probes: int
    best_alpha: float | None
    scale_off: float | None
    scale_on: float | None
    off_per_on: float | None = None
    """Speculation off's step scale over speculation on's, measured side by side on the same
    traffic by the newest canary experiment that ran one against the other (`off_per_on`)."""
    hedged_from: int | None = None
    """The config a capacity hedge left for speculation off, when that was the last change and
    speculation is still off: the load's last rise to its peak was seen in the hedge's zone
    while a restart was still affordable (`rules._hedge_would_catch`)."""


def remember(history: Sequence[HistoryEntry], state: "ControlState", now: float) -> Memory:
    applied = [e for e in history if e.applied]
    last = applied[-1] if applied else None
    last_change = max(last.time, state.since) if last is not None else state.since
    recent = sum(1 for e in applied if now - 3600.0 < e.time <= now)
    in_probe = (
        last is not None
        and state.enabled
        and last.action is Action.ENABLE
        and last.to_k == state.k
    )
    failed = 0
    i = len(applied) - 1
    while i >= 1 and applied[i].action is Action.DISABLE and applied[i - 1].action is Action.ENABLE:
        failed += 1
        i -= 2
    alphas = [e.alpha for e in applied if e.alpha is not None]
    scale_off = next(
        (e.step_scale for e in reversed(applied) if e.step_scale is not None and e.from_config == OFF),
        None,
    )
    scale_on = next(
        (e.step_scale for e in reversed(applied) if e.step_scale is not None and e.from_config != OFF),
        None,
    )
    hedged = (last is not None and not state.enabled and last.rule == Rule.HEDGE
              and last.from_config != OFF and last.to_config == OFF)
    return Memory(
        off_per_on=off_per_on(state.experiments),
        hedged_from=last.from_config if hedged else None,
        last_change_at=last_change,
        changes_last_hour=recent,
        in_probe=in_probe,
        failed_probes=failed,
        best_alpha=max(alphas) if alphas else None,
        scale_off=scale_off,
        scale_on=scale_on,
    )


def off_per_on(experiments: Iterable["Experiment"]) -> float | None:
    """Speculation off's step scale over speculation on's from the newest experiment whose
    canary ran one and the running config the other (a Control: off beside a draft; a
    Reprobe: a draft beside off), both measured in one window on the same traffic. A scale
    is measured at a load and does not carry to another (a slower GPU is slower still per
    token at large batches), but the ratio of two measured at one load does: it says whether
    the draft or the target costs what the prior did not expect."""
    for x in sorted(experiments, key=lambda x: x.last_window_at or 0.0, reverse=True):
        if x.candidate_step_scale is None or not x.incumbent_step_scale:
            continue
        incumbent_off = x.purpose is Purpose.REPROBE  # the one purpose run while speculation is off
        if (x.candidate_k is None) == incumbent_off:
            continue  # both on (a Change of K): nothing of speculation off
        ratio = x.candidate_step_scale / x.incumbent_step_scale
        return ratio if x.candidate_k is None else 1.0 / ratio
    return None


def history_entry(decision: "Decision", now: float, state: "ControlState") -> HistoryEntry | None:
    """The history record of a decision (None for holds)."""
    if not decision.changes:
        return None
    return HistoryEntry(
        time=now,
        action=decision.action,
        from_k=state.k if state.enabled else None,
        to_k=decision.k if decision.enabled else None,
        reason=decision.reason[:REASON_CHARS],
        applied=decision.applied,
        alpha=stored(decision.alpha if state.enabled else None),
        step_scale=stored(decision.step_scale),
        from_schedule=state.schedule.label if state.schedule is not None else None,
        to_schedule=decision.schedule.label if decision.schedule is not None else None,
        rule=str(decision.rule),
    )


def stored(value: float | None) -> float | None:
    return None if value is None else round(value, STATUS_DIGITS)
