"""What the policy decides: the action, the rule that decided, why a wanted change held,
and the predictions behind it (typed: the status, the benchmark and the shell read these
members, never the words of a reason)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from specdecode import timestamps
from specdecode.control.perfmodel import OFF, Schedule


class Action(str, Enum):
    """What a decision does."""

    HOLD = "hold"
    SET_K = "set_k"
    DISABLE = "disable"
    ENABLE = "enable"
    FALLBACK = "fallback"
    """Speculation turned off because its pods could not start (history only; the policy
    never decides it)."""


class Rule(StrEnum):
    """The policy's rules: what decided (``Decision.rule``). One name for the policy, its
    history, the status and the benchmark, which classifies outcomes by these members, never
    by the words of a reason."""

    MODE_OFF = "mode-off"
    BOUNDS = "bounds"
    METRICS = "metrics"
    ROLLOUT = "rollout"
    WARMUP = "warmup"
    IDLE = "idle"
    SAMPLES = "samples"
    SLO_GUARD = "slo-guard"
    COLLAPSE = "collapse"
    FAST_FALLBACK = "fast-fallback"
    PROBE_ABANDON = "probe-abandon"
    FLOOR = "floor"
    REPROBE = "reprobe"
    HEDGE = "hedge"
    PEAK_READINESS = "peak-readiness"
    """Inside the hysteresis, a config that cannot carry the last day's peak gives way at the
    calm to one no slower now that does (`rules._ready_for_peak`). Applied at once, as a
    hedge: a canary at the calm could only measure the claim the move does not make (that
    the new config is faster there), and would end without a clear difference."""
    PLAN = "plan"
    """(`autotune` planner mode, `PolicyTuning.planner`) A move the plan is sure of: it wins at the pessimistic end of what the model is unsure
    of (acceptance at its confidence bound, the unmeasured config's step slower than
    predicted). Applied at once: a canary would buy information the plan does not need."""
    TUNE = "tune"
    """A tuning move. In planner mode: one the plan prefers at its estimates but not at their
    pessimistic end; where canary experiments are on, it is tested on a canary first (value
    of information)."""
    HOLD = "hold"
    COOLDOWN = "cooldown"
    BUDGET = "budget"
    EXPERIMENT = "experiment"
    """A canary experiment: started instead of a move, running, or promoted (the change)."""
    SCHEDULE = "schedule"
    """A per-batch-size K schedule adopted or replaced (`control.schedules`)."""
    SCHEDULE_REVERT = "schedule-revert"
    """A schedule measured clearly worse than the plain K it replaced: back to that K."""


CANARIED_RULES = frozenset({Rule.TUNE, Rule.REPROBE, Rule.SCHEDULE})
"""Moves the model predicts that are tested on a canary first (Auto mode, a plan without a
blocker): a tuning move, a re-probe, a per-batch-size K schedule adopted or replaced; every
other change (the floor, the guards, bounds, hedges, a move the plan is sure of, a schedule's
revert) applies at once."""
FLOOR_RULES = frozenset({Rule.FLOOR, Rule.COLLAPSE})
"""The acceptance floor on the long (floor) and the short (collapse) window: the user's hard
rule, no restart price."""
FALLBACK_RULES = frozenset({Rule.COLLAPSE, Rule.FLOOR, Rule.FAST_FALLBACK, Rule.SLO_GUARD})
"""Rules that fall back from a collapse of acceptance."""
PROBE_RULES = frozenset({Rule.REPROBE, Rule.PROBE_ABANDON})
"""Exploration: a re-probe of a config and its abandonment."""


class Held(StrEnum):
    """Why nothing changes (`Decision.hold`); the first four and EXPERIMENT also say why a rule
    that wanted a change held instead (``Decision.held``)."""

    OVERLOAD = "overload"
    """The rollout would overload the replicas left serving and not repay itself."""
    OUTAGE = "outage"
    """spec.autotune.allowOutages is false and the rollout would leave no replica serving, or
    too few to carry the load (`disruption.gate`): the change stays a recommendation."""
    PRICE = "price"
    """The restart makes the change slower than staying over the payback horizon."""
    COOLDOWN = "cooldown"
    BUDGET = "budget"
    METRICS = "metrics"
    """Metrics unavailable, missing or stale: fail static."""
    WARMUP = "warmup"
    """A rollout, the warm-up of the config or its first full window: its metrics do not count yet."""
    SAMPLES = "samples"
    """Idle, or too few requests or drafted tokens to judge."""
    SETTLED = "settled"
    """Nothing is predicted to pay enough to change (or a re-probe is not due)."""
    MODE_OFF = "mode-off"
    """autotune.mode Off: no decisions."""
    EXPERIMENT = "experiment"
    """A canary experiment tests the change (or one runs, or the candidate lost one lately)."""


HOLD_OF_RULE = {
    Rule.MODE_OFF: Held.MODE_OFF,
    Rule.METRICS: Held.METRICS,
    Rule.ROLLOUT: Held.WARMUP,
    Rule.WARMUP: Held.WARMUP,
    Rule.IDLE: Held.SAMPLES,
    Rule.SAMPLES: Held.SAMPLES,
    Rule.COOLDOWN: Held.COOLDOWN,
    Rule.BUDGET: Held.BUDGET,
    Rule.EXPERIMENT: Held.EXPERIMENT,
}
"""The hold each rule that decides to hold stands for (other rules: settled)."""


@dataclass(frozen=True)
class Condition:
    """A status condition's value as a decision sets it (MetricsAvailable,
    SpeculationEffective): ``status`` None leaves the condition as it is."""

    status: bool | None
    reason: str
    message: str


@dataclass(frozen=True)
class ConfigPrediction:
    """The calibrated model's view of one config at the observed load."""

    k: int
    e2e_mean_s: float
    e2e_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    goodput_tokens_per_s: float
    capacity_rps: float
    score: float
    """min(goodput / best goodput, best latency / latency): 1.0 is the best config."""
    speedup: float
    """Mean e2e latency of the current config / this config's (> 1: faster)."""
    schedule: str | None = None
    """The label of the schedule this K runs as (the one in effect, for its largest K:
    `estimates.Calibration.running`); None: plain K."""


@dataclass(frozen=True)
class PlanSummary:
    """The plan a decision rests on, as status shows it (`status.plan`)."""

    configs: tuple[str, ...]
    """The config planned for each slot (`config_label`)."""
    slot_s: tuple[float, ...]
    forecast_rps: tuple[float, ...]
    """The request rate forecast for each slot."""
    forecast_method: str
    """"seasonal", "trend" or "present" (`forecast`)."""
    period_s: float | None
    gain: float
    """Headline-score gain of the chosen plan over the best plan that keeps the running
    config now (0 when it keeps it)."""

    def to_status(self, now: float) -> dict[str, Any]:
        return {
            "at": timestamps.rfc3339(now),
            "configs": list(self.configs),
            "slotSeconds": [round(s) for s in self.slot_s],
            "forecastRequestRate": [round(r, 4) for r in self.forecast_rps],
            "forecastMethod": self.forecast_method,
            "periodSeconds": None if self.period_s is None else round(self.period_s),
            "gain": round(self.gain, 4) if math.isfinite(self.gain) else None,
        }


@dataclass(frozen=True)
class Decision:
    """What to do, why, and what the status conditions should say."""

    action: Action
    enabled: bool
    k: int | None
    reason: str
    rule: Rule
    """Which rule decided (cooldown and budget: a change held by them)."""
    applied: bool
    """True when the operator acts on it (Auto mode and a change)."""
    metrics_available: bool
    metrics_reason: str
    metrics_message: str
    speculation_effective: bool | None
    effective_reason: str
    effective_message: str
    predictions: tuple[ConfigPrediction, ...] = ()
    alpha: float | None = None
    """The best acceptance the current config showed in this evaluation's windows (long and
    short): what history remembers of it."""
    step_scale: float | None = None
    held: Held | None = None
    """Why a rule that wanted a change held (None: it did not hold one back)."""
    wanted: Rule | None = None
    """The rule whose change was held (for cooldown and budget holds, the one that wanted it)."""
    schedule: Schedule | None = None
    """The per-batch-size K schedule decided (``k`` is its largest K); None: plain K. Any
    decision without one leaves a running schedule for plain K."""
    peak_probe_alpha: float | None = None
    """A re-probe held because no plain K that pays carries the load of the last day's peak
    (`rules._peak_unserved`): the acceptance it assumed. The schedules path may re-probe with
    a schedule that stops drafting at the peak's batch instead (`schedules.consider`)."""
    predicted_effect: float | None = None
    """A schedule's: the model's relative change of time per token against the running config
    at today's load (-0.02: 2 % faster); its canary is judged against it (`experiments.judge`)."""
    plan: PlanSummary | None = None
    """The planner's plan this decision followed or held by (None: no plan was made, e.g. a
    guard, the floor or a hold for missing metrics decided)."""
    below_floor: bool = False
    """The short (guard) window showed acceptance confidently below the floor in this
    evaluation: the collapse guard's evidence, remembered (`ControlState.below_floor_since`)
    until an evaluation does not show it."""

    @property
    def config(self) -> int:
        return self.k if (self.enabled and self.k) else OFF

    @property
    def changes(self) -> bool:
        return self.action is not Action.HOLD

    @property
    def hold(self) -> Held | None:
        """Why nothing changes (None for a change)."""
        if self.changes:
            return None
        if self.held is not None:
            return self.held
        return HOLD_OF_RULE.get(self.rule, Held.SETTLED)

    def predicted_speedup(self) -> float | None:
        """Predicted speed of the decided config relative to the current one."""
        for p in self.predictions:
            if p.k == self.config:
                return p.speedup
        return None

    def recommendation_status(self, now: float) -> dict[str, Any]:
        """status.recommendation (camelCase)."""
        out: dict[str, Any] = {
            "action": self.action.value,
            "enabled": self.enabled,
            "reason": self.reason[:2048],
            "at": timestamps.rfc3339(now),
        }
        if self.enabled and self.k is not None:
            out["k"] = self.k
        if self.enabled and self.schedule is not None:
            out["schedule"] = self.schedule.label
        speedup = self.predicted_speedup()
        if speedup is not None and math.isfinite(speedup):
            out["predictedSpeedup"] = round(speedup, 3)
        return out
