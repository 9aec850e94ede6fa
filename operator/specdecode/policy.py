"""The speculation policy: a pure, deterministic decision function.

``decide(settings, state, observed, history, now) -> Decision``. No I/O, no clock, no
randomness: time comes in as ``now``, the metrics as ``observed``, and everything the policy
remembers comes from ``state`` (status plus the live Deployment) and ``history`` (the status's
bounded decision history), so decisions survive an operator restart.

A *config* is an integer as in `specdecode.control.perfmodel`: 0 is speculation off, K >= 1 is K
drafted tokens per step.

Order of the rules (the first that applies decides):

1. Mode Off: hold the spec's declared K; no decisions (the handler renders the spec as is).
2. Bounds: a current config outside the spec's bounds (the user narrowed them) moves to the
   nearest allowed one at once.
3. Metrics health (fail static): Prometheus unavailable, the current config's series missing
   once they should exist, or stale beyond ``stale_after_scrapes`` scrapes -> hold with
   ``MetricsAvailable=False``. A rollout in progress, the warm-up of a new config and an idle
   service are holds with metrics still available: absent is not failed.
4. Fast guards on the short (guard) window, speculation on, bypassing the cooldown:
   - SLO guard: P95 e2e or P95 TPOT above its SLO and a smaller K (or off) predicted to meet
     it and to score at least ``slo_guard_margin`` better: fall back now. When no config is
     predicted to meet the SLO at the observed load the breach is overload, not speculation:
     the guard holds (a restart would take a replica away while it is needed most) and leaves
     it to the tuning rule, which moves to a higher-capacity config only if that repays the
     restart.
   - Acceptance collapse: alpha confidently below the floor on the guard window and the model
     agrees that less speculation is better -> off (minK when disabling is not allowed).
     The floor is the user's hard rule: no restart price applies, with one exception: with
     maxSurge 0, while the load is above ``restart_max_rollout_load`` of what the replicas
     left serving carry and the rollout would not repay itself over the guard horizon, the
     floor waits (an overloaded replica costs every request of those minutes; low
     acceptance costs some speed).
   - Fast fallback / probe abandonment: a smaller K or off predicted better by
     ``fast_fallback_margin`` (``probe_abandon_margin`` while a re-probe is on trial).
   A collapse held back by the change budget does not end the evaluation: the rules below
   (the floor among them) still run.
5. Enough data: the long window must lie entirely after the current config's warm-up, with
   ``minRequests`` finished requests and (speculation on) ``minDrafts`` drafted tokens.
6. Acceptance floor (the user's hard rule) on the long window: alpha confidently below it ->
   off (or minK), whatever the restart costs but an overloading rollout (as in 4); unless
   the short window, newer, shows alpha confidently back above the floor (the long window's
   acceptance is then the past).
7. Speculation off: re-probe after ``reprobeInterval`` (doubled after every further probe
   that failed in a row, and once more for a draft never seen above the floor, up to
   ``reprobe_backoff_max`` times), when the model predicts that the remembered acceptance
   (the best of history's entries and status.observations.alpha before the switch-off, at
   least ``default_probe_alpha``) would pay at the current load, restart included; at the
   best K for a slightly lower acceptance (conservative). With maxSurge 0 a probe also waits
   while the load is above ``restart_max_rollout_load`` of what the replicas left serving
   during a rollout carry (a failed probe costs two restarts), and while the probed K would
   be locked in (the hedge's release, below).
8. Capacity hedge (maxSurge 0, two replicas or more): a rollout serves on the replicas left;
   once the load passes what they carry, every restart is an overload and the running config
   is locked in. When the load (the long window at its lower confidence bound, and the short
   window) reaches ``hedge_zone`` of that rollout capacity (but not the capacity itself), the
   policy insures against the load rising on to the current config's capacity
   (x ``hedge_overload``): it moves to a config with ``hedge_min_capacity_gain`` more
   capacity that would be ``hedge_min_benefit`` faster there, when the mean e2e saved in that
   future outweighs the mean e2e it costs at today's load over the payback horizon, restart
   included (`hedge_outlook`, weights ``hedge_rise_prior``). Release: no tuning move or
   re-probe goes to a config with less capacity while the load on either window is above
   ``hedge_release`` of the rollout capacity and the hedge would send it back at once.
9. Tuning: the best config by predicted score; act only when it beats the current one by the
   hysteresis margin at the point estimate, is no worse at every corner of the confidence box
   (alpha +- z*sigma, request rate +- z*sigma), survives a return of acceptance to its
   recent low (status.observations.recentLowAlpha, when ``reversion_min_drop`` below today's:
   the move must not lose on average over the two futures, so n-gram bursts do not lure K
   up for as long as they last), repays the restart within ``payback_horizon_s``, and the
   cooldown and change budget allow it.

Prediction (the performance model calibrated to the observations):

* workload: the observed request rate, prompt and output tokens per request, the waiting queue
  as an initial backlog, and the estimated acceptance (temperature is inside alpha);
* acceptance: alpha and its decay over positions from a weighted log-linear fit of the
  per-position rates ``alpha_i = a * d**i`` (weights = the trials at each position), so a
  longer or shorter K is predicted without trying it; with K = 1 the decay is the prior's;
* cost: ``scale = measured mean step time / perfmodel.step_time(prior, K, batch, context,
  prefill)`` at the observed batch; every time cost of the prior is multiplied by it. The
  other side (off when on, on when off) uses the scale remembered from the last window it was
  measured in (history), else the current one;
* KV memory: the KV-usage gauge over the running batch gives the tokens a replica holds; the
  prior's KV capacity is scaled to it (both sides alike: a smaller GPU), so capacities and
  the rollout's capacity follow the real cache;
* each config's phase over ``prediction_horizon_s`` (queueing included) gives mean/P95 e2e,
  TPOT and goodput; ``score(k) = min(goodput_k / best goodput, best latency / latency_k)``
  (the benchmark's headline score); ``speedup(k) = latency(current) / latency(k)``;
* restart price: a change restarts every replica; with ``maxSurge`` 0 each round takes
  ``maxUnavailable`` replicas away for ``restart_s`` while the others carry the load and the
  queue builds. `switch_outlook` compares staying with switching now over
  ``payback_horizon_s`` (one hour for tuning moves and re-probes, decided on the long window;
  ``guard_payback_horizon_s``, 30 minutes, for short-window guards): the rollout's rounds
  with the queue carried, then the new config. A change must save latency (or win good
  tokens) over that horizon, restart included.

Confidence: alpha's standard error is binomial over the trials times an overdispersion factor
(tokens of one request are correlated); the request rate's relative error is
``sqrt(overdispersion / requests)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum, StrEnum
from typing import Any, Iterable, Mapping, Sequence

from specdecode import constants, timestamps
from specdecode.control import perfmodel
from specdecode.control.metrics import Observation
from specdecode.control.perfmodel import OFF, EngineParams, Workload


class Mode(str, Enum):
    """What the operator does with its decisions (spec.autotune.mode)."""

    AUTO = "Auto"
    RECOMMEND = "Recommend"
    OFF = "Off"


class Action(str, Enum):
    """What a decision does."""

    HOLD = "hold"
    SET_K = "set_k"
    DISABLE = "disable"
    ENABLE = "enable"


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
    TUNE = "tune"
    HOLD = "hold"
    COOLDOWN = "cooldown"
    BUDGET = "budget"


FLOOR_RULES = frozenset({Rule.FLOOR, Rule.COLLAPSE})
"""The acceptance floor on the long (floor) and the short (collapse) window: the user's hard
rule, no restart price."""
FALLBACK_RULES = frozenset({Rule.COLLAPSE, Rule.FLOOR, Rule.FAST_FALLBACK, Rule.SLO_GUARD})
"""Rules that fall back from a collapse of acceptance."""
PROBE_RULES = frozenset({Rule.REPROBE, Rule.PROBE_ABANDON})
"""Exploration: a re-probe of a config and its abandonment."""


class Held(StrEnum):
    """Why a rule that wanted a change held instead (``Decision.held``)."""

    OVERLOAD = "overload"
    """The rollout would overload the replicas left serving and not repay itself."""
    PRICE = "price"
    """The restart makes the change slower than staying over the payback horizon."""
    COOLDOWN = "cooldown"
    BUDGET = "budget"


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyTuning:
    """Internal constants of the policy (not API fields); each documented with its reason."""

    min_gain: float = 0.05
    """Hysteresis: a tuning move needs a predicted score at least 5% above the current one."""
    slo_guard_margin: float = 0.03
    """The SLO guard's fallback must score at least 3% better (it must also meet the SLO)."""
    fast_fallback_margin: float = 0.25
    """On the short window, reduce speculation at once only for a large predicted gain."""
    probe_abandon_margin: float = 0.02
    """A re-probe that does not pay is abandoned on its first short window."""
    confidence_z: float = 2.0
    """Width of the confidence box, in standard errors."""
    overdispersion: float = 4.0
    """Variance inflation of counts: tokens of a request, and requests, come in bursts."""
    payback_horizon_s: float = 3600.0
    """A change decided on the long window must repay its restart price within this time
    (the conditions of a full window are assumed to last about an hour)."""
    guard_payback_horizon_s: float = 1800.0
    """The same for a change decided on the short window (SLO guard, fast fallback, probe
    abandonment): 75 seconds of evidence are trusted for a shorter future."""
    min_switch_saving: float = 0.01
    """Switching (restart included) must save at least 1% of latency over the horizon."""
    prediction_horizon_s: float = perfmodel.DEFAULT_HORIZON_S
    """Phase length the performance model evaluates each config over (queue growth counts)."""
    stale_after_scrapes: float = 4.0
    """Newest sample older than this many scrape intervals: metrics are stale."""
    missing_grace_scrapes: float = 3.0
    """A live config without series after this many scrapes past its warm-up: missing."""
    reprobe_backoff_max: int = 8
    """The re-probe interval doubles after each failed probe from the second on, up to this
    factor."""
    default_probe_alpha: float = 0.6
    """Acceptance assumed for a re-probe when history remembers no better one."""
    probe_alpha_discount: float = 0.05
    """A probe's K is the best K for the remembered acceptance minus this (conservative)."""
    min_position_trials: float = 200.0
    """Per-position rates with fewer trials are left out of the decay fit."""
    decay_bounds: tuple[float, float] = (0.5, 1.0)
    """Clamp of the fitted acceptance decay over positions."""
    scale_bounds: tuple[float, float] = (0.2, 5.0)
    """Clamp of the measured/prior step-time scale (outside: the prior is badly off)."""
    min_kv_usage: float = 0.02
    """KV usage below which the gauge is too small a signal to calibrate the KV memory."""
    kv_scale_bounds: tuple[float, float] = (0.1, 2.0)
    """Clamp of the measured/prior KV memory."""
    reserved_guard_changes: int = 1
    """Changes per hour kept for fallbacks: tuning moves stop one short of the budget."""
    hedge_zone: float = 0.8
    """Capacity hedge (maxSurge 0): considered once the long window's request rate, at its
    lower confidence bound, and the short window's reach this fraction of what the replicas
    left serving during a rollout carry. A rise of a quarter more makes every restart an
    overload: the running config is locked in."""
    hedge_release: float = 0.7
    """Hysteresis of the hedge: a move to a config with less capacity is refused while the
    load on either window is above this fraction of the rollout's capacity and the hedge
    would send it back (so a hedge is not undone while the load is still near the zone)."""
    hedge_min_capacity_gain: float = 0.1
    """A hedge moves to a config with at least 10% more capacity than the current one."""
    hedge_overload: float = 1.05
    """The future the hedge insures against: the load rising to this multiple of the current
    config's capacity (where it is locked in and its queue grows)."""
    hedge_min_benefit: float = 0.25
    """A hedge must be at least 25% faster than the current config in that future."""
    restart_max_rollout_load: float = 0.8
    """With maxSurge 0, a restart is affordable only while the load is below this fraction of
    what the replicas left serving during the rollout carry: nearer that capacity each round
    builds a queue that takes minutes to drain. A re-probe (which costs two restarts if it
    fails) and the acceptance floor wait above it."""
    reversion_min_drop: float = 0.1
    """Tuning moves are checked against the recent low acceptance (`recent_low_alpha`) when
    it lies at least this far below today's estimate (smaller dips are noise)."""
    hedge_rise_prior: float = 0.5
    """Assumed chance that a load in the zone keeps rising to that future: a hedge is taken
    when prior x the mean e2e it saves there exceeds (1 - prior) x the mean e2e it costs at
    today's load over the payback horizon, restart included (seconds against seconds: the
    time-averaged latency users see)."""


@dataclass(frozen=True)
class PolicySettings:
    """The user's intent (spec) in the policy's units: seconds, floats, a prior cost model."""

    mode: Mode = Mode.AUTO
    method: str = "draft_model"
    configured_k: int = 3
    """spec.speculation.numSpeculativeTokens: what Off mode runs."""
    min_k: int = 1
    max_k: int = 8
    allow_disable: bool = True
    evaluation_interval_s: float = 60.0
    window_s: float = 300.0
    guard_window_s: float = 75.0
    """The short window of the fast guards (`metrics.guard_window`)."""
    warmup_s: float = 120.0
    min_drafts: int = 2000
    """Drafted tokens the long window needs (scaled down for the guard window)."""
    min_requests: int = 20
    acceptance_floor: float = 0.35
    slo_e2e_s: float | None = None
    slo_tpot_s: float | None = None
    cooldown_s: float = 600.0
    max_changes_per_hour: int = 4
    reprobe_interval_s: float = 1800.0
    replicas: int = 1
    max_surge: int = 0
    max_unavailable: int = 1
    restart_s: float = 180.0
    """Time a restarted replica serves nothing (model load): the restart price's duration."""
    scrape_interval_s: float = 15.0
    prior: EngineParams | None = None
    """Prior costs of the engine; default: `EngineParams.for_method(method)`."""
    tuning: PolicyTuning = field(default_factory=PolicyTuning)

    def __post_init__(self) -> None:
        if not 1 <= self.min_k <= self.max_k:
            raise ValueError(f"need 1 <= min_k <= max_k, got {self.min_k}..{self.max_k}")
        for name in ("window_s", "guard_window_s", "evaluation_interval_s", "scrape_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    def configs(self) -> tuple[int, ...]:
        """Configs the policy may choose: off (when allowed) then minK..maxK."""
        ks = tuple(range(self.min_k, self.max_k + 1))
        return ((OFF,) + ks) if self.allow_disable else ks

    def prior_params(self) -> EngineParams:
        """The prior cost model within the spec's bounds (unknown methods: a draft model's)."""
        if self.prior is not None:
            base = self.prior
        elif self.method in perfmodel.METHODS:
            base = EngineParams.for_method(self.method)
        else:
            base = EngineParams.for_method("draft_model")
        return replace(base, min_k=self.min_k, max_k=self.max_k, replicas=max(1, self.replicas))

    @classmethod
    def from_spec(
        cls,
        spec: Any,
        *,
        restart_s: float = 180.0,
        prior: EngineParams | None = None,
        tuning: PolicyTuning | None = None,
    ) -> "PolicySettings":
        """Settings from an `api.SpecDecodeServiceSpec` (durations parsed to seconds)."""
        from specdecode import api
        from specdecode.control import metrics

        auto, spec_k = spec.autotune, spec.speculation
        window = api.parse_duration(auto.window)
        scrape = api.parse_duration(spec.metrics.scrape_interval)
        method = spec_k.method.value if hasattr(spec_k.method, "value") else str(spec_k.method)
        slo = auto.slo
        return cls(
            mode=Mode(auto.mode.value if hasattr(auto.mode, "value") else auto.mode),
            method=method,
            configured_k=spec_k.num_speculative_tokens,
            min_k=spec_k.min_k,
            max_k=spec_k.max_k,
            allow_disable=spec_k.allow_disable,
            evaluation_interval_s=api.parse_duration(auto.evaluation_interval),
            window_s=window,
            guard_window_s=metrics.guard_window(window, scrape),
            warmup_s=api.parse_duration(auto.warmup),
            min_drafts=auto.min_drafts,
            min_requests=auto.min_requests,
            acceptance_floor=auto.acceptance_floor,
            slo_e2e_s=api.parse_duration(slo.p95_end_to_end) if slo.p95_end_to_end else None,
            slo_tpot_s=(
                api.parse_duration(slo.p95_time_per_output_token)
                if slo.p95_time_per_output_token
                else None
            ),
            cooldown_s=api.parse_duration(auto.cooldown),
            max_changes_per_hour=auto.max_changes_per_hour,
            reprobe_interval_s=api.parse_duration(auto.reprobe_interval),
            replicas=spec.replicas,
            max_surge=spec.rollout.max_surge,
            max_unavailable=spec.rollout.max_unavailable,
            restart_s=restart_s,
            scrape_interval_s=scrape,
            prior=prior,
            tuning=tuning or PolicyTuning(),
        )


@dataclass(frozen=True)
class PolicyState:
    """The current speculation, derived from status.speculation and the live Deployment."""

    enabled: bool
    k: int | None
    """K in use; None when speculation is off."""
    since: float
    """When the current config was chosen (status.speculation.since), seconds since epoch."""
    live_since: float | None
    """When every replica ran the current config and was Ready; None while rolling out."""
    ready_replicas: int = 1
    excluded_ks: frozenset[int] = frozenset()
    """Configs whose pods failed to start (status.failedConfigs): never chosen again."""
    last_alpha: float | None = None
    """status.observations.alpha as the previous evaluation left it (kept through outages):
    the memory of how the current config did before this evaluation."""
    recent_low_alpha: float | None = None
    """status.observations.recentLowAlpha: the lowest acceptance of the evaluations of about
    the last hour (`recent_low_alpha`), whatever config measured it. Acceptance that fell
    this low lately can fall this low again: tuning moves are priced against it too."""

    @property
    def config(self) -> int:
        """The current config as perfmodel counts it: 0 off, else K."""
        return self.k if (self.enabled and self.k) else OFF


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
            "reason": self.reason[:1024],
        }
        if self.from_k is not None:
            out["fromK"] = self.from_k
        if self.to_k is not None:
            out["toK"] = self.to_k
        if self.alpha is not None:
            out["alpha"] = round(self.alpha, 4)
        if self.step_scale is not None:
            out["stepScale"] = round(self.step_scale, 4)
        return out

    @classmethod
    def from_status(cls, record: Mapping[str, Any]) -> "HistoryEntry":
        """Parse one status.history record (camelCase wire form)."""
        return cls(
            time=timestamps.epoch_seconds(record["time"]),
            action=Action(record["action"]) if record["action"] in _ACTIONS else Action.SET_K,
            from_k=record.get("fromK"),
            to_k=record.get("toK"),
            reason=record.get("reason", ""),
            applied=bool(record.get("applied", True)),
            alpha=record.get("alpha"),
            step_scale=record.get("stepScale"),
        )


_ACTIONS = {a.value for a in Action}


def history_from_status(records: Iterable[Mapping[str, Any]]) -> tuple[HistoryEntry, ...]:
    """status.history as entries, oldest first."""
    return tuple(sorted((HistoryEntry.from_status(r) for r in records), key=lambda e: e.time))


@dataclass(frozen=True)
class PolicyObservations:
    """What the metrics reader saw for the current config, or why it saw nothing."""

    available: bool
    window: Observation | None = None
    """The long (tuning) window of the current config hash."""
    guard: Observation | None = None
    """The short (guard) window of the current config hash."""
    reason: str = constants.REASON_METRICS_OK
    message: str = ""

    @classmethod
    def unavailable(cls, message: str, reason: str = constants.REASON_METRICS_MISSING) -> "PolicyObservations":
        return cls(False, None, None, reason, message)

    @classmethod
    def of(cls, window: Observation | None, guard: Observation | None) -> "PolicyObservations":
        return cls(True, window, guard)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


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

    @property
    def config(self) -> int:
        return self.k if (self.enabled and self.k) else OFF

    @property
    def changes(self) -> bool:
        return self.action is not Action.HOLD

    def predicted_speedup(self) -> float | None:
        """Predicted speed of the decided config relative to the current one."""
        for p in self.predictions:
            if p.k == self.config:
                return p.speedup
        return None

    def history_entry(self, now: float, state: PolicyState) -> HistoryEntry | None:
        """The history record of this decision (None for holds)."""
        if not self.changes:
            return None
        return HistoryEntry(
            time=now,
            action=self.action,
            from_k=state.k if state.enabled else None,
            to_k=self.k if self.enabled else None,
            reason=self.reason,
            applied=self.applied,
            alpha=self.alpha if state.enabled else None,
            step_scale=self.step_scale,
        )

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
        speedup = self.predicted_speedup()
        if speedup is not None and math.isfinite(speedup):
            out["predictedSpeedup"] = round(speedup, 3)
        return out


# --------------------------------------------------------------------------------------------
# Estimation and prediction (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """The load and acceptance one window implies, with their uncertainty."""

    window_s: float
    requests: float
    request_rate: float
    rate_rel_stderr: float
    prompt_tokens: float
    output_tokens: float
    waiting: float
    batch_per_replica: float | None
    step_time_s: float | None
    alpha: float | None
    """Acceptance of position 0 in the model's form alpha * decay**i (None: speculation off)."""
    alpha_pooled: float | None
    """Pooled MLE over positions (what status and the floor use)."""
    alpha_stderr: float | None
    decay: float | None
    draft_tokens: float
    e2e_p95_s: float | None
    tpot_p95_s: float | None
    kv_usage: float | None = None
    """Mean KV-cache usage of a replica (0..1) over the window."""


_DEFAULT_PROMPT_TOKENS = 1000.0
_DEFAULT_OUTPUT_TOKENS = 300.0


def estimate(obs: Observation, tuning: PolicyTuning) -> Estimate:
    """Load, acceptance and their uncertainty from one observation window."""
    requests = obs.requests
    rel = math.sqrt(tuning.overdispersion / requests) if requests > 0 else math.inf
    prompt = obs.prompt_tokens_per_request or _DEFAULT_PROMPT_TOKENS
    output = obs.output_tokens_per_request or _DEFAULT_OUTPUT_TOKENS
    alpha = pooled = stderr = decay = None
    draft_tokens = 0.0
    spec = obs.speculation
    if spec is not None:
        draft_tokens = spec.draft_tokens
    if spec is not None and spec.alpha is not None:
        pooled = spec.alpha
        stderr = math.sqrt(
            max(pooled * (1 - pooled), 1e-4) * tuning.overdispersion / max(spec.alpha_trials, 1.0)
        )
        alpha, decay = fit_acceptance(spec.drafts, spec.accepted_per_position, tuning)
        if alpha is None:
            alpha = pooled
    return Estimate(
        window_s=obs.window_s,
        requests=requests,
        request_rate=obs.request_rate,
        rate_rel_stderr=rel,
        prompt_tokens=max(1.0, prompt),
        output_tokens=max(1.0, output),
        waiting=max(0.0, obs.waiting or 0.0),
        batch_per_replica=obs.batch_per_pod,
        step_time_s=obs.step_time_mean_s,
        alpha=alpha,
        alpha_pooled=pooled,
        alpha_stderr=stderr,
        decay=decay,
        draft_tokens=draft_tokens,
        e2e_p95_s=obs.e2e_p95_s,
        tpot_p95_s=obs.tpot_p95_s,
        kv_usage=obs.kv_cache_usage,
    )


def fit_acceptance(
    drafts: float, accepted_per_position: Sequence[float], tuning: PolicyTuning = PolicyTuning()
) -> tuple[float | None, float | None]:
    """(alpha, decay) of ``P(i accepted | i-1 accepted) = alpha * decay**i``.

    Weighted least squares of ``log(rate_i)`` on ``i`` with the trials of each position as
    weights; positions with fewer than ``min_position_trials`` trials are left out. With a
    single usable position the decay is unknown (None) and alpha is that position's rate.
    """
    points: list[tuple[int, float, float]] = []
    previous = drafts
    for i, accepted in enumerate(accepted_per_position):
        if previous >= tuning.min_position_trials and accepted > 0:
            rate = min(1.0, accepted / previous)
            points.append((i, math.log(rate), previous))
        previous = accepted
    if not points:
        return None, None
    if len(points) == 1:
        return math.exp(points[0][1]), None
    total = sum(w for _, _, w in points)
    mean_x = sum(w * x for x, _, w in points) / total
    mean_y = sum(w * y for _, y, w in points) / total
    sxx = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    sxy = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points)
    slope = sxy / sxx if sxx > 0 else 0.0
    lo, hi = tuning.decay_bounds
    decay = min(hi, max(lo, math.exp(slope)))
    # Refit the intercept with the clamped slope so the fit stays consistent.
    intercept = mean_y - math.log(decay) * mean_x
    return min(0.999, math.exp(intercept)), decay


def step_scale(params: EngineParams, k: int, est: Estimate) -> float | None:
    """Measured mean step time / the prior's step time at the observed batch (None: unknown)."""
    if est.step_time_s is None or est.batch_per_replica is None or est.batch_per_replica <= 0:
        return None
    replicas = max(1, params.replicas)
    context = est.prompt_tokens + est.output_tokens / 2.0
    prefill = est.request_rate / replicas * est.prompt_tokens * est.step_time_s
    model = perfmodel.step_time(params, k, est.batch_per_replica, context, prefill)
    if model <= 0:
        return None
    return est.step_time_s / model


def kv_scale(params: EngineParams, k: int, est: Estimate, tuning: PolicyTuning) -> float | None:
    """Measured / prior KV-cache memory of a replica (None: unknown).

    The KV usage gauge over the running batch gives the tokens one replica holds:
    ``batch x (prompt + output/2 + K) / usage``; with speculation on that is what is left
    after the proposer's weights and KV, so the prior's draft sizes convert it back to the
    memory both sides share (a smaller GPU shrinks them alike). Usage below
    ``min_kv_usage`` is too small a signal."""
    usage, batch = est.kv_usage, est.batch_per_replica
    if usage is None or batch is None or batch <= 0 or usage < tuning.min_kv_usage:
        return None
    held = batch * (est.prompt_tokens + est.output_tokens / 2.0 + k) / usage
    memory = held if k == OFF else held * (1.0 + params.draft_kv_ratio) + params.draft_weight_tokens
    lo, hi = tuning.kv_scale_bounds
    return min(hi, max(lo, memory / params.kv_capacity_tokens))


def scaled_params(
    params: EngineParams, scale: float, decay: float | None, kv: float | None = None
) -> EngineParams:
    """The prior with every time cost multiplied by ``scale`` (and the fitted decay, and the
    KV memory by ``kv``), rounded to 1% / 0.01 / 2% (their noise is larger)."""
    scale = _round_rel(scale, 0.01)
    if decay is not None:
        decay = round(decay, 2)
    if kv is not None:
        kv_tokens = int(round(params.kv_capacity_tokens * _round_rel(kv, 0.02)))
        params = replace(params, kv_capacity_tokens=max(params.draft_weight_tokens + 1, kv_tokens))
    return replace(
        params,
        step_fixed_s=params.step_fixed_s * scale,
        per_batched_token_s=params.per_batched_token_s * scale,
        per_kv_token_s=params.per_kv_token_s * scale,
        step_overhead_s=params.step_overhead_s * scale,
        spec_overhead_s=params.spec_overhead_s * scale,
        proposer_cpu_s_per_seq=params.proposer_cpu_s_per_seq * scale,
        acceptance_decay=decay if decay is not None else params.acceptance_decay,
    )


@dataclass(frozen=True)
class Calibration:
    """The calibrated model: params for configs with speculation off and on."""

    off: EngineParams
    on: EngineParams
    scale_now: float | None
    """Scale measured on the current config in this window."""

    def params_for(self, k: int) -> EngineParams:
        return self.off if k == OFF else self.on


def _round_rel(value: float, step: float) -> float:
    """``value`` rounded to a relative resolution (``step`` = 0.01: 1%)."""
    if value <= 0 or not math.isfinite(value):
        return value
    exponent = round(math.log(value) / math.log1p(step))
    return math.exp(exponent * math.log1p(step))


def _workload(est: Estimate, alpha: float | None, rate_factor: float = 1.0) -> Workload:
    """The model's workload from an estimate, rounded to the estimate's resolution (1% for
    rates and token counts, 0.005 for alpha): far below the measurement noise, and it lets
    `_phase` reuse evaluations."""
    return Workload(
        request_rate=_round_rel(max(0.0, est.request_rate * rate_factor), 0.01),
        prompt_tokens=max(1.0, _round_rel(est.prompt_tokens, 0.01)),
        output_tokens=max(1.0, _round_rel(est.output_tokens, 0.01)),
        temperature=0.0,
        acceptance=round(min(0.995, max(0.0, alpha if alpha is not None else 0.0)) * 200) / 200,
    )


@functools.lru_cache(maxsize=8192)
def _phase(
    params: EngineParams,
    workload: Workload,
    k: int,
    horizon_s: float,
    initial_queue: float,
    replicas: int,
    slo_e2e_s: float | None,
    slo_tpot_s: float | None,
) -> perfmodel.PhaseResult:
    """`perfmodel.evaluate_phase`, memoized (pure, so caching changes no result)."""
    return perfmodel.evaluate_phase(
        params, workload, k, horizon_s, initial_queue, replicas, slo_e2e_s, slo_tpot_s
    )


def predict(
    calibration: Calibration,
    est: Estimate,
    ks: Iterable[int],
    current: int,
    settings: PolicySettings,
    alpha: float | None = None,
    rate_factor: float = 1.0,
) -> dict[int, ConfigPrediction]:
    """Each config's predicted latency, goodput, score and speedup at the observed load."""
    alpha = est.alpha if alpha is None else alpha
    workload = _workload(est, alpha, rate_factor)
    ks = sorted(set(ks) | {current})
    replicas = calibration.on.replicas
    backlog = round(est.waiting, 1)
    results = {
        k: _phase(
            calibration.params_for(k),
            workload,
            k,
            settings.tuning.prediction_horizon_s,
            backlog,
            replicas,
            settings.slo_e2e_s,
            settings.slo_tpot_s,
        )
        for k in ks
    }
    best_goodput = max(r.goodput_tokens_per_s for r in results.values())
    best_latency = min(r.e2e_mean_s for r in results.values())
    current_latency = results[current].e2e_mean_s
    out: dict[int, ConfigPrediction] = {}
    for k, r in results.items():
        good = r.goodput_tokens_per_s / best_goodput if best_goodput > 0 else 1.0
        fast = best_latency / r.e2e_mean_s if math.isfinite(r.e2e_mean_s) and r.e2e_mean_s > 0 else 0.0
        speed = (
            current_latency / r.e2e_mean_s
            if math.isfinite(r.e2e_mean_s) and r.e2e_mean_s > 0
            else 0.0
        )
        if not math.isfinite(current_latency) and not math.isfinite(r.e2e_mean_s):
            speed = 1.0
        elif not math.isfinite(current_latency):
            speed = math.inf
        out[k] = ConfigPrediction(
            k=k,
            e2e_mean_s=r.e2e_mean_s,
            e2e_p95_s=r.e2e_p95_s,
            tpot_mean_s=r.tpot_mean_s,
            tpot_p95_s=r.tpot_p95_s,
            goodput_tokens_per_s=r.goodput_tokens_per_s,
            capacity_rps=r.steady.capacity_rps,
            score=min(good, fast),
            speedup=speed,
        )
    return out


@dataclass(frozen=True)
class SwitchOutlook:
    """Staying vs switching now, over the payback horizon, restart included."""

    stay_request_s: float
    """Request-seconds of e2e latency of the arrivals over the horizon if nothing changes."""
    switch_request_s: float
    """The same if the change starts now: the rollout's rounds, then the new config."""
    stay_good_tokens: float
    switch_good_tokens: float
    rollout_s: float

    @property
    def saving(self) -> float:
        """Relative latency saving of switching (> 0: switching is better)."""
        if not math.isfinite(self.stay_request_s) or self.stay_request_s <= 0:
            return 1.0 if math.isfinite(self.switch_request_s) else 0.0
        if not math.isfinite(self.switch_request_s):
            return -math.inf
        return 1.0 - self.switch_request_s / self.stay_request_s

    def pays(self, min_saving: float) -> bool:
        """Switching saves latency, or wins good tokens without costing latency."""
        if self.saving >= min_saving:
            return True
        more_good = self.switch_good_tokens > self.stay_good_tokens * (1.0 + 2.0 * min_saving)
        return more_good and self.saving >= 0.0


def switch_outlook(
    calibration: Calibration,
    est: Estimate,
    current: int,
    target: int,
    settings: PolicySettings,
    alpha: float | None = None,
    horizon_s: float | None = None,
) -> SwitchOutlook:
    """Compare staying with switching now over ``horizon_s`` (default ``payback_horizon_s``;
    the same phases the benchmark scores): with maxSurge 0 each round of the rollout takes
    maxUnavailable replicas away for ``restart_s`` while the others serve (the majority's
    config), the queue carries from round to round and into the new config; with
    maxSurge >= 1 capacity is kept and the old config serves half of the rollout."""
    horizon = settings.tuning.payback_horizon_s if horizon_s is None else horizon_s
    workload = _workload(est, est.alpha if alpha is None else alpha)
    replicas = max(1, calibration.on.replicas)
    slo = (settings.slo_e2e_s, settings.slo_tpot_s)
    backlog = round(est.waiting, 1)
    stay = _phase(calibration.params_for(current), workload, current, horizon, backlog, replicas, *slo)

    pieces: list[tuple[int, float, int]] = []  # (config, seconds, serving replicas)
    if settings.max_surge >= 1:
        pieces.append((current, replicas * settings.restart_s / 2.0, replicas))
    else:
        down = max(1, min(settings.max_unavailable, replicas))
        serving = replicas - down
        for j in range(math.ceil(replicas / down)):
            config = target if (j * down) * 2 > serving else current
            pieces.append((config, settings.restart_s, serving))
    rollout = math.fsum(seconds for _, seconds, _ in pieces)
    if rollout < horizon:
        pieces.append((target, horizon - rollout, replicas))

    cost = good = 0.0
    queue = backlog
    for config, seconds, serving in pieces:
        if seconds <= 0:
            continue
        if serving <= 0:
            arrivals = workload.request_rate * seconds
            cost += arrivals * seconds / 2.0
            queue += arrivals
            continue
        piece = _phase(calibration.params_for(config), workload, config, seconds, round(queue, 1), serving, *slo)
        cost += piece.arrivals * piece.e2e_mean_s
        good += piece.goodput_tokens_per_s * seconds
        queue = piece.queue_end
    return SwitchOutlook(
        stay_request_s=stay.arrivals * stay.e2e_mean_s,
        switch_request_s=cost,
        stay_good_tokens=stay.goodput_tokens_per_s * horizon,
        switch_good_tokens=good,
        rollout_s=rollout,
    )


@dataclass(frozen=True)
class HedgeOutlook:
    """Switching from ``current`` to ``target`` now as insurance against a rising load.

    With maxSurge 0 a rollout serves on the replicas left (R - maxUnavailable); once the load
    passes what they carry, any restart is an overload and the running config is locked in.
    The hedge compares two futures over the payback horizon: the load stays (the premium:
    what the switch costs today, restart included) or it rises to ``future_rate`` (the
    current config's capacity x ``hedge_overload``), where the target is faster by
    ``benefit``."""

    current: int
    target: int
    rollout_capacity_rps: float
    """What the replicas left serving during the rollout carry (the lower of both configs)."""
    future_rate: float
    horizon_s: float
    stay_future_s: float
    """Mean e2e latency of the current config at the future rate, over the horizon."""
    hedge_future_s: float
    premium: float
    """Relative latency lost by switching now if the load stays (restart included, >= 0)."""
    premium_s: float
    """The same in seconds of mean e2e latency over the payback horizon."""
    benefit: float
    """Relative latency saved at the future rate (1 - hedge / stay)."""

    @property
    def benefit_s(self) -> float:
        """Seconds of mean e2e latency saved at the future rate."""
        if not math.isfinite(self.stay_future_s):
            return math.inf if math.isfinite(self.hedge_future_s) else 0.0
        return self.stay_future_s - self.hedge_future_s

    def value(self, prior: float) -> float:
        """Expected mean-latency saving in seconds: > 0 means the insurance is worth its
        premium."""
        return prior * self.benefit_s - (1.0 - prior) * self.premium_s


def _serving_in_rollout(settings: PolicySettings, replicas: int) -> int:
    """Replicas that keep serving while a maxSurge-0 rollout restarts the others."""
    return replicas - max(1, min(settings.max_unavailable, replicas))


def _rollout_capacity(
    calibration: Calibration,
    est: Estimate,
    configs: Iterable[int],
    settings: PolicySettings,
    alpha: float | None = None,
) -> float | None:
    """What the replicas left serving during a maxSurge-0 rollout carry (the lowest over
    ``configs``); None with maxSurge >= 1 or a single replica."""
    replicas = max(1, calibration.on.replicas)
    serving = _serving_in_rollout(settings, replicas)
    if settings.max_surge >= 1 or serving < 1:
        return None
    workload = _workload(est, est.alpha if alpha is None else alpha)
    return min(_capacity(calibration.params_for(k), workload, k, serving) for k in configs)


@functools.lru_cache(maxsize=8192)
def _capacity(params: EngineParams, workload: Workload, k: int, replicas: int) -> float:
    """Capacity (requests/s) of ``replicas`` replicas at config k, memoized."""
    return perfmodel.steady_state(params, workload, k, replicas).capacity_rps


def hedge_outlook(
    calibration: Calibration,
    est: Estimate,
    current: int,
    target: int,
    settings: PolicySettings,
    rate: float | None = None,
    zone: float = 0.0,
    peak_rate: float | None = None,
    alpha: float | None = None,
) -> HedgeOutlook | None:
    """The hedge from ``current`` to ``target``; None when it does not apply: maxSurge >= 1,
    a single replica, a target without ``hedge_min_capacity_gain`` more capacity, ``rate``
    (default: the estimate's) below ``zone`` x the rollout's capacity, or ``peak_rate`` (when
    given) at or above it (too late: the rollout itself would overload)."""
    t = settings.tuning
    replicas = max(1, calibration.on.replicas)
    serving = _serving_in_rollout(settings, replicas)
    if settings.max_surge >= 1 or serving < 1:
        return None
    horizon = t.payback_horizon_s
    slo = (settings.slo_e2e_s, settings.slo_tpot_s)
    workload = _workload(est, est.alpha if alpha is None else alpha)

    def phase(k: int, load: Workload, n: int) -> perfmodel.PhaseResult:
        return _phase(calibration.params_for(k), load, k, horizon, 0.0, n, *slo)

    def capacity(k: int, n: int) -> float:
        return _capacity(calibration.params_for(k), workload, k, n)

    cap_current = capacity(current, replicas)
    if not capacity(target, replicas) >= cap_current * (1.0 + t.hedge_min_capacity_gain):
        return None
    rollout_capacity = min(capacity(current, serving), capacity(target, serving))
    rate = est.request_rate if rate is None else rate
    if rate < zone * rollout_capacity:
        return None
    if peak_rate is not None and peak_rate >= rollout_capacity:
        return None
    future_rate = _round_rel(cap_current * t.hedge_overload, 0.01)
    future = replace(workload, request_rate=future_rate)
    stay = phase(current, future, replicas).e2e_mean_s
    hedge = phase(target, future, replicas).e2e_mean_s
    if not math.isfinite(hedge):
        benefit = 0.0
    elif not math.isfinite(stay) or stay <= 0:
        benefit = 1.0
    else:
        benefit = 1.0 - hedge / stay
    premium = premium_s = 0.0
    if benefit >= t.hedge_min_benefit:
        outlook = switch_outlook(calibration, est, current, target, settings, alpha)
        saving = outlook.saving
        premium = max(0.0, -saving) if math.isfinite(saving) else math.inf
        arrivals = workload.request_rate * t.payback_horizon_s
        if not math.isfinite(outlook.switch_request_s):
            premium_s = math.inf
        elif arrivals > 0:
            premium_s = max(0.0, outlook.switch_request_s - outlook.stay_request_s) / arrivals
    return HedgeOutlook(
        current=current,
        target=target,
        rollout_capacity_rps=rollout_capacity,
        future_rate=future_rate,
        horizon_s=horizon,
        stay_future_s=stay,
        hedge_future_s=hedge,
        premium=premium,
        premium_s=premium_s,
        benefit=benefit,
    )


def best_hedge(
    calibration: Calibration,
    est: Estimate,
    current: int,
    candidates: Iterable[int],
    settings: PolicySettings,
    rate: float,
    zone: float,
    peak_rate: float | None = None,
    alpha: float | None = None,
) -> HedgeOutlook | None:
    """The most valuable hedge from ``current`` at load ``rate`` (``peak_rate``: the highest
    recent load) with the zone threshold ``zone``, or None when none is worth its premium."""
    t = settings.tuning
    best: HedgeOutlook | None = None
    for target in candidates:
        if target == current:
            continue
        outlook = hedge_outlook(
            calibration, est, current, target, settings, rate, zone, peak_rate, alpha
        )
        if outlook is None or outlook.benefit < t.hedge_min_benefit:
            continue
        value = outlook.value(t.hedge_rise_prior)
        if value > 0 and (best is None or value > best.value(t.hedge_rise_prior)):
            best = outlook
    return best


def _finite_gap(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 0.0
    if math.isinf(a):
        return 1e9
    if math.isinf(b):
        return -1e9
    return a - b


# --------------------------------------------------------------------------------------------
# Memory from history (pure)
# --------------------------------------------------------------------------------------------


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


def remember(history: Sequence[HistoryEntry], state: PolicyState, now: float) -> Memory:
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
    return Memory(
        last_change_at=last_change,
        changes_last_hour=recent,
        in_probe=in_probe,
        failed_probes=failed,
        best_alpha=max(alphas) if alphas else None,
        scale_off=scale_off,
        scale_on=scale_on,
    )


# --------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------


def _label(k: int | None) -> str:
    return "off" if not k else f"K={k}"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "inf"
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    return f"{seconds / 60:.1f}min"


def _fmt_pct(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.0%}"


def _fmt_x(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.2f}x"


def _summary(preds: Mapping[int, ConfigPrediction], first: Iterable[int]) -> str:
    """'off 1.00x, K=3 0.82x' for the named configs (speedups vs the current config)."""
    seen: list[int] = []
    for k in first:
        if k in preds and k not in seen:
            seen.append(k)
    return ", ".join(f"{_label(k)} {_fmt_x(preds[k].speedup)}" for k in seen)


@dataclass(frozen=True)
class _Context:
    settings: PolicySettings
    state: PolicyState
    now: float
    memory: Memory
    observed: PolicyObservations

    @property
    def tuning(self) -> PolicyTuning:
        return self.settings.tuning

    @property
    def current(self) -> int:
        return self.state.config

    @property
    def acting(self) -> bool:
        return self.settings.mode is Mode.AUTO

    @property
    def in_probe_trial(self) -> bool:
        """A re-probe whose first full window after warm-up is not over yet."""
        live = self.state.live_since
        if not self.memory.in_probe or live is None:
            return False
        return self.now < live + self.settings.warmup_s + self.settings.window_s

    def allowed(self) -> tuple[int, ...]:
        return tuple(k for k in self.settings.configs() if k not in self.state.excluded_ks or k == OFF)


def decide(
    settings: PolicySettings,
    state: PolicyState,
    observed: PolicyObservations,
    history: Sequence[HistoryEntry],
    now: float,
) -> Decision:
    """The policy. Pure and deterministic: same inputs, same decision."""
    ctx = _Context(settings, state, now, remember(history, state, now), observed)
    return _decide(ctx)


def _decide(ctx: _Context) -> Decision:
    s, state = ctx.settings, ctx.state
    if s.mode is Mode.OFF:
        return _make(
            ctx,
            Action.HOLD,
            s.configured_k,
            Rule.MODE_OFF,
            f"autotune mode Off: running numSpeculativeTokens={s.configured_k} as declared; "
            "no decisions",
            metrics=_metrics_flags(ctx),
            applied=False,
        )

    bounded = _bounds_rule(ctx)
    if bounded is not None:
        return bounded

    health = _health(ctx)
    if health is not None:
        return health

    obs_long, obs_guard = ctx.observed.window, ctx.observed.guard
    ready_at = state.live_since + s.warmup_s  # type: ignore[operator]
    guard_ready = ctx.now >= ready_at + s.guard_window_s
    long_ready = ctx.now >= ready_at + s.window_s
    flags = _metrics_flags(ctx)

    # --- fast guards (short window; bypass the cooldown) ---
    if state.enabled and guard_ready and obs_guard is not None:
        guard_decision = _guards(ctx, obs_guard, flags)
        if guard_decision is not None:
            return guard_decision

    if not long_ready:
        left = ready_at + s.window_s - ctx.now
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"collecting the first full {_fmt_s(s.window_s)} window of {_label(ctx.current)} "
            f"after its warm-up ({_fmt_s(left)} left)",
            metrics=flags,
        )
    if obs_long is None or obs_long.idle:
        return _make(
            ctx, Action.HOLD, state.k, Rule.IDLE,
            f"no finished requests in the last {_fmt_s(s.window_s)}: nothing to judge "
            f"(idle is not a failure)",
            metrics=flags,
        )
    est = estimate(obs_long, ctx.tuning)
    samples = _samples_hold(ctx, est, 1.0, flags)
    if samples is not None:
        return samples

    calibration, scale = _calibrate(ctx, est)
    ks = ctx.allowed()

    # --- acceptance floor on the long window (the user's hard rule: no price check) ---
    # Unless the short window, newer, shows acceptance confidently back above the floor:
    # then the long window's low acceptance is the past, not the present.
    if state.enabled and est.alpha_pooled is not None and est.alpha_stderr is not None:
        upper = est.alpha_pooled + ctx.tuning.confidence_z * est.alpha_stderr
        if upper < s.acceptance_floor and not _recovered(ctx, obs_guard):
            preds = predict(calibration, est, ks, ctx.current, s)
            target = OFF if s.allow_disable else s.min_k
            if target != ctx.current:
                reason = (
                    f"alpha {est.alpha_pooled:.2f} < floor {s.acceptance_floor:.2f} over "
                    f"{est.draft_tokens:.0f} drafted tokens ({_fmt_s(s.window_s)} window); "
                    f"predicted {_summary(preds, (target, ctx.current))}"
                )
                return _change(ctx, target, Rule.FLOOR, reason, preds, flags, est, scale, guard=True)

    if not state.enabled:
        return _reprobe(ctx, est, calibration, scale, flags)

    return _tune(ctx, est, calibration, scale, flags)


# --- rules -----------------------------------------------------------------------------------


def _recovered(ctx: _Context, obs_guard: Observation | None) -> bool:
    """The short window's acceptance is confidently above the floor (with its own sample
    minimums)."""
    s = ctx.settings
    if obs_guard is None or obs_guard.idle or not ctx.state.enabled:
        return False
    short = estimate(obs_guard, ctx.tuning)
    if short.alpha_pooled is None or short.alpha_stderr is None:
        return False
    if short.draft_tokens < max(50.0, s.min_drafts * s.guard_window_s / s.window_s):
        return False
    return short.alpha_pooled - ctx.tuning.confidence_z * short.alpha_stderr > s.acceptance_floor


def _bounds_rule(ctx: _Context) -> Decision | None:
    s, state = ctx.settings, ctx.state
    if state.enabled and state.k is not None and not s.min_k <= state.k <= s.max_k:
        target = min(s.max_k, max(s.min_k, state.k))
        return _change(
            ctx, target, Rule.BOUNDS,
            f"K={state.k} is outside the spec's bounds [{s.min_k}, {s.max_k}]: moving to K={target}",
            (), _metrics_flags(ctx), None, None, guard=True,
        )
    if not state.enabled and not s.allow_disable:
        target = min(s.max_k, max(s.min_k, s.configured_k))
        return _change(
            ctx, target, Rule.BOUNDS,
            f"speculation is off but allowDisable is false: enabling at K={target}",
            (), _metrics_flags(ctx), None, None, guard=True,
        )
    return None


def _metrics_flags(ctx: _Context) -> tuple[bool, str, str]:
    """(MetricsAvailable, reason, message) for the current observations."""
    observed = ctx.observed
    if not observed.available:
        return False, observed.reason, observed.message
    obs = observed.guard or observed.window
    if obs is None:
        return True, constants.REASON_METRICS_OK, "no series yet for the current config"
    stale = _stale(ctx, obs)
    if stale is not None:
        return False, constants.REASON_METRICS_STALE, stale
    return True, constants.REASON_METRICS_OK, f"newest sample {_fmt_s(obs.staleness_s)} old"


def _stale(ctx: _Context, obs: Observation) -> str | None:
    limit = ctx.tuning.stale_after_scrapes * ctx.settings.scrape_interval_s
    if obs.staleness_s is None:
        return "no fresh sample of the current config (its pods are not scraped)"
    if obs.staleness_s > limit:
        return f"newest sample is {_fmt_s(obs.staleness_s)} old (limit {_fmt_s(limit)})"
    return None


def _health(ctx: _Context) -> Decision | None:
    s, state, observed = ctx.settings, ctx.state, ctx.observed
    flags = _metrics_flags(ctx)
    if not observed.available:
        return _make(
            ctx, Action.HOLD, state.k, Rule.METRICS,
            f"holding {_label(ctx.current)}: metrics unavailable ({observed.message})",
            metrics=flags,
        )
    if state.live_since is None:
        return _make(
            ctx, Action.HOLD, state.k, Rule.ROLLOUT,
            f"rollout of {_label(ctx.current)} in progress: waiting for every replica to be Ready",
            metrics=flags,
        )
    ready_at = state.live_since + s.warmup_s
    if ctx.now < ready_at:
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"{_label(ctx.current)} warming up ({_fmt_s(ready_at - ctx.now)} left): its metrics "
            "do not count yet",
            metrics=flags,
        )
    if observed.window is None and observed.guard is None:
        grace = ctx.tuning.missing_grace_scrapes * s.scrape_interval_s
        if ctx.now >= ready_at + grace:
            message = (
                f"no series of the current config for {_fmt_s(ctx.now - state.live_since)} "
                "since it went live (is the PodMonitor scraping the pods? vllm:num_requests_running "
                "or vllm_num_requests_running with labels specdecode_service and specdecode_config_hash)"
            )
            return _make(
                ctx, Action.HOLD, state.k, Rule.METRICS,
                f"holding {_label(ctx.current)}: {message}",
                metrics=(False, constants.REASON_METRICS_MISSING, message),
            )
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"waiting for the first scrapes of {_label(ctx.current)}", metrics=flags,
        )
    if not flags[0]:
        return _make(
            ctx, Action.HOLD, state.k, Rule.METRICS,
            f"holding {_label(ctx.current)}: {flags[2]}", metrics=flags,
        )
    return None


def _samples_hold(
    ctx: _Context, est: Estimate, fraction: float, flags: tuple[bool, str, str]
) -> Decision | None:
    """Hold when a window has too few requests or (speculation on) drafted tokens.

    ``fraction`` scales the minimums for a window shorter than the tuning window.
    """
    s = ctx.settings
    min_requests = max(3.0, s.min_requests * fraction)
    min_drafts = max(50.0, s.min_drafts * fraction)
    missing = []
    if est.requests < min_requests:
        missing.append(f"{est.requests:.0f} requests < {min_requests:.0f}")
    if ctx.state.enabled and est.draft_tokens < min_drafts:
        missing.append(f"{est.draft_tokens:.0f} drafted tokens < {min_drafts:.0f}")
    if ctx.state.enabled and est.alpha is None and est.draft_tokens >= min_drafts:
        missing.append("no per-position acceptance series")
    if not missing:
        return None
    return _make(
        ctx, Action.HOLD, ctx.state.k, Rule.SAMPLES,
        f"not enough samples in {_fmt_s(est.window_s)}: {', '.join(missing)}",
        metrics=flags,
    )


def _calibrate(ctx: _Context, est: Estimate) -> tuple[Calibration, float | None]:
    prior = ctx.settings.prior_params()
    lo, hi = ctx.tuning.scale_bounds
    measured = step_scale(prior, ctx.current, est)
    scale_now = None if measured is None else min(hi, max(lo, measured))
    base = scale_now if scale_now is not None else 1.0
    if ctx.state.enabled:
        on_scale = base
        off_scale = ctx.memory.scale_off if ctx.memory.scale_off is not None else base
    else:
        off_scale = base
        on_scale = ctx.memory.scale_on if ctx.memory.scale_on is not None else base
    decay = est.decay
    kv = kv_scale(prior, ctx.current, est, ctx.tuning)
    calibration = Calibration(
        off=scaled_params(prior, off_scale, decay, kv),
        on=scaled_params(prior, on_scale, decay, kv),
        scale_now=scale_now,
    )
    return calibration, scale_now


def _shifted(ctx: _Context, short: Estimate, long_obs: Observation | None) -> bool:
    """Whether the short window differs from the long one beyond their noise (a change in
    acceptance or load the long window has not caught up with)."""
    if long_obs is None or long_obs.idle:
        return True
    long = estimate(long_obs, ctx.tuning)
    z = ctx.tuning.confidence_z
    if long.request_rate > 0:
        rel = math.hypot(short.rate_rel_stderr, long.rate_rel_stderr)
        if abs(short.request_rate / long.request_rate - 1.0) > z * rel:
            return True
    if short.alpha_pooled is not None and long.alpha_pooled is not None:
        sigma = math.hypot(short.alpha_stderr or 0.0, long.alpha_stderr or 0.0)
        if abs(short.alpha_pooled - long.alpha_pooled) > z * sigma:
            return True
    return False


def _guards(ctx: _Context, obs: Observation, flags: tuple[bool, str, str]) -> Decision | None:
    """SLO guard, acceptance collapse, fast fallback and probe abandonment (short window)."""
    s, t = ctx.settings, ctx.tuning
    if obs.idle:
        return None
    est = estimate(obs, t)
    fraction = s.guard_window_s / s.window_s
    if _samples_hold(ctx, est, fraction, flags) is not None:
        return None
    current = ctx.current
    lower = [k for k in ctx.allowed() if k < current]
    if not lower:
        return None

    breaches = []
    if s.slo_e2e_s is not None and est.e2e_p95_s is not None and est.e2e_p95_s > s.slo_e2e_s:
        breaches.append(f"P95 e2e {_fmt_s(est.e2e_p95_s)} > SLO {_fmt_s(s.slo_e2e_s)}")
    if s.slo_tpot_s is not None and est.tpot_p95_s is not None and est.tpot_p95_s > s.slo_tpot_s:
        breaches.append(f"P95 TPOT {_fmt_s(est.tpot_p95_s)} > SLO {_fmt_s(s.slo_tpot_s)}")
    below_floor = (
        est.alpha_pooled is not None
        and est.alpha_stderr is not None
        and est.alpha_pooled + t.confidence_z * est.alpha_stderr < s.acceptance_floor
    )
    live = ctx.state.live_since or 0.0
    long_ready = ctx.now >= live + s.warmup_s + s.window_s
    # The fast fallback looks for what the long window cannot see yet: a probe on trial, a
    # config too young for a full window, or a shift of acceptance or load.
    fast = ctx.in_probe_trial or not long_ready or _shifted(ctx, est, ctx.observed.window)
    if not (breaches or below_floor or fast):
        return None

    calibration, scale = _calibrate(ctx, est)
    preds = predict(calibration, est, lower + [current], current, s)
    cur = preds[current]
    window = _fmt_s(s.guard_window_s)

    # SLO guard.
    if breaches:
        meeting = [k for k in lower if _meets_slo(s, est, cur, preds[k])]
        better = [k for k in meeting if preds[k].score >= cur.score * (1 + t.slo_guard_margin)]
        if better:
            target = max(better, key=lambda k: (preds[k].score, k))
            reason = (
                f"{'; '.join(breaches)} over {est.requests:.0f} requests ({window} window) and "
                f"speculation is the likely cause: predicted {_summary(preds, (target, current))}"
                f", {_label(target)} P95 e2e {_fmt_s(_corrected(est.e2e_p95_s, cur.e2e_p95_s, preds[target].e2e_p95_s))}"
            )
            decision = _change(ctx, target, Rule.SLO_GUARD, reason, preds, flags, est, scale, guard=True)
            if decision.changes or decision.rule is not Rule.SLO_GUARD:
                return decision

    # Acceptance collapse: confidently below the floor, and the model agrees.
    if below_floor and est.alpha_pooled is not None:
        target = OFF if s.allow_disable else s.min_k
        if target in preds and target != current:
            if preds[target].score > cur.score:
                reason = (
                    f"alpha {est.alpha_pooled:.2f} < floor {s.acceptance_floor:.2f} over "
                    f"{est.draft_tokens:.0f} drafted tokens ({window} window); predicted "
                    f"{_summary(preds, (target, current))}"
                )
                decision = _change(ctx, target, Rule.COLLAPSE, reason, preds, flags, est, scale, guard=True)
                # A collapse held back (the change budget) does not end the evaluation:
                # the later rules, the floor on the long window among them, still run.
                if decision.changes:
                    return decision

    # Fast fallback, or abandoning a re-probe that does not pay.
    if not fast:
        return None
    probing = ctx.in_probe_trial
    margin = t.probe_abandon_margin if probing else t.fast_fallback_margin
    target = max(lower, key=lambda k: (preds[k].score, -k))
    if preds[target].score >= cur.score * (1 + margin) and _robust(
        ctx, calibration, est, current, target, margin=0.0
    ):
        rule = Rule.PROBE_ABANDON if probing else Rule.FAST_FALLBACK
        what = "re-probe does not pay" if probing else "speculation hurts at this load"
        reason = (
            f"{what}: predicted {_summary(preds, (target, current))} at "
            f"{est.request_rate:.2f} req/s, alpha {_fmt_alpha(est)} ({window} window)"
        )
        return _change(ctx, target, rule, reason, preds, flags, est, scale, guard=True)
    return None


def _corrected(observed: float | None, predicted_current: float, predicted_other: float) -> float:
    """The other config's P95 scaled by how far the model is from the observed P95."""
    if observed is None or not math.isfinite(predicted_current) or predicted_current <= 0:
        return predicted_other
    return predicted_other * observed / predicted_current


def _meets_slo(
    s: PolicySettings, est: Estimate, cur: ConfigPrediction, other: ConfigPrediction
) -> bool:
    if s.slo_e2e_s is not None:
        if _corrected(est.e2e_p95_s, cur.e2e_p95_s, other.e2e_p95_s) > s.slo_e2e_s:
            return False
    if s.slo_tpot_s is not None:
        if _corrected(est.tpot_p95_s, cur.tpot_p95_s, other.tpot_p95_s) > s.slo_tpot_s:
            return False
    return True


def _fmt_alpha(est: Estimate) -> str:
    if est.alpha_pooled is None:
        return "unknown"
    return f"{est.alpha_pooled:.2f}+-{(est.alpha_stderr or 0.0):.2f}"


def _robust(
    ctx: _Context,
    calibration: Calibration,
    est: Estimate,
    current: int,
    candidate: int,
    margin: float,
) -> bool:
    """The candidate scores at least (1 + margin) x the current one at every corner of the
    confidence box: alpha +- z*sigma and request rate x (1 +- z*rel)."""
    t = ctx.tuning
    alphas = [est.alpha]
    if est.alpha is not None and est.alpha_stderr is not None:
        dz = t.confidence_z * est.alpha_stderr
        alphas = [max(0.0, est.alpha - dz), min(0.999, est.alpha + dz)]
    rel = min(0.9, t.confidence_z * est.rate_rel_stderr)
    for alpha in alphas:
        for factor in (1.0 - rel, 1.0 + rel):
            preds = predict(
                calibration, est, (current, candidate), current, ctx.settings, alpha, factor
            )
            if preds[candidate].score < preds[current].score * (1 + margin):
                return False
    return True


def _reversion_loss(
    ctx: _Context, calibration: Calibration, est: Estimate, current: int, candidate: int
) -> float | None:
    """The recent low acceptance, when a move to ``candidate`` would lose on average over
    the two futures, acceptance as measured now or back at that low (equally likely); None
    when the move survives it or acceptance has not been lower lately. Bursty acceptance
    (n-gram on changing traffic) otherwise lures the policy into a K that pays only while
    the burst lasts, and every change back costs another restart."""
    low = ctx.state.recent_low_alpha
    if low is None or est.alpha is None or low >= est.alpha - ctx.tuning.reversion_min_drop:
        return None
    s = ctx.settings
    now_preds = predict(calibration, est, (current, candidate), current, s)
    low_preds = predict(calibration, est, (current, candidate), current, s, low)
    stay = now_preds[current].score + low_preds[current].score
    move = now_preds[candidate].score + low_preds[candidate].score
    return low if move < stay else None


def _reprobe(
    ctx: _Context,
    est: Estimate,
    calibration: Calibration,
    scale: float | None,
    flags: tuple[bool, str, str],
) -> Decision:
    s, t, memory = ctx.settings, ctx.tuning, ctx.memory
    # The first failed probe may have met the tail of a dip: only repeated failures back off.
    # A draft never seen above the floor counts as one failure already (probing it is a
    # long shot); one seen paying before gets the plain interval.
    never_good = memory.best_alpha is not None and memory.best_alpha < s.acceptance_floor
    exponent = max(0, memory.failed_probes - 1) + (1 if never_good else 0)
    backoff = min(t.reprobe_backoff_max, 2**exponent)
    interval = s.reprobe_interval_s * backoff
    off_since = ctx.state.since
    remembered = memory.best_alpha
    alpha = max(remembered or 0.0, t.default_probe_alpha)
    ks = [k for k in ctx.allowed() if k != OFF]
    preds = predict(calibration, est, ks + [OFF], OFF, s, alpha=alpha)
    best = max(ks, key=lambda k: (preds[k].score, -k)) if ks else None
    wait = off_since + interval - ctx.now
    if wait > 0:
        extra = ""
        if backoff > 1:
            never = ", acceptance never seen above the floor" if never_good else ""
            extra = f" (x{backoff} after {memory.failed_probes} failed probes{never})"
        return _make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"speculation off since {_fmt_s(ctx.now - off_since)} ago; re-probe in "
            f"{_fmt_s(wait)}{extra}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    if best is None:
        return _make(ctx, Action.HOLD, None, Rule.HOLD, "no speculative config is allowed",
                     metrics=flags, predictions=preds, est=est, scale=scale)
    if preds[best].score < preds[OFF].score * (1 + s.tuning.min_gain):
        return _make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"re-probe due, but even at alpha {alpha:.2f} speculation would not pay at "
            f"{est.request_rate:.2f} req/s: predicted {_summary(preds, (best, OFF))}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    conservative = max(0.0, alpha - t.probe_alpha_discount)
    probe_preds = predict(calibration, est, ks, OFF, s, alpha=conservative)
    probe_k = max(ks, key=lambda k: (probe_preds[k].score, -k))
    _, high = _window_rates(ctx, est)
    rollout_capacity = _rollout_capacity(calibration, est, (OFF, probe_k), s, alpha)
    if rollout_capacity is not None and high >= t.restart_max_rollout_load * rollout_capacity:
        return _make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"re-probe due, but at {high:.2f} req/s a probe's restarts (two if it fails) "
            f"would load the replicas left serving to {high / rollout_capacity:.0%} of the "
            f"{rollout_capacity:.1f} req/s they carry: waiting for a lower load",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    locked = _locked_in(ctx, calibration, est, preds, probe_k, high, alpha)
    if locked is not None:
        return _make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"re-probe due, but at {high:.2f} req/s {_label(probe_k)} would be locked in (a "
            f"restart needs the load below {locked.rollout_capacity_rps:.1f} req/s, and at its "
            f"capacity {_label(locked.target)} would be {_fmt_pct(locked.benefit)} faster): "
            "staying off",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    if remembered is not None and remembered >= t.default_probe_alpha:
        source = f"remembered alpha {remembered:.2f}"
    else:
        source = f"assumed alpha {alpha:.2f}"
    reason = (
        f"re-probe after {_fmt_s(ctx.now - off_since)} off: with {source} K={probe_k} is "
        f"predicted {_fmt_x(preds[probe_k].speedup)} vs off at {est.request_rate:.2f} req/s"
    )
    return _change(ctx, probe_k, Rule.REPROBE, reason, preds, flags, est, scale, guard=False, alpha=alpha)


def _window_rates(ctx: _Context, est: Estimate) -> tuple[float, float]:
    """(confident, highest) request rate: the lower of the long window's lower confidence
    bound and the short window's rate (a hedge needs the load confidently high and not
    falling), and the higher of both windows' rates (the hedge's release needs both low).
    The short window counts when it has enough requests."""
    lower_bound = est.request_rate * max(0.0, 1.0 - ctx.tuning.confidence_z * est.rate_rel_stderr)
    low, high = lower_bound, est.request_rate
    guard = ctx.observed.guard
    if guard is not None and not guard.idle:
        fraction = ctx.settings.guard_window_s / ctx.settings.window_s
        if guard.requests >= max(3.0, ctx.settings.min_requests * fraction):
            low, high = min(low, guard.request_rate), max(high, guard.request_rate)
    return low, high


def _locked_in(
    ctx: _Context,
    calibration: Calibration,
    est: Estimate,
    preds: Mapping[int, ConfigPrediction],
    k: int,
    rate: float,
    alpha: float | None = None,
) -> HedgeOutlook | None:
    """The hedge that would send ``k`` back at once, if moving to ``k`` (less capacity than
    the current config) would walk into the hedge zone (with the release threshold)."""
    current = ctx.current
    if k == current or not preds[k].capacity_rps < preds[current].capacity_rps:
        return None
    return best_hedge(
        calibration, est, k, preds, ctx.settings, rate, ctx.tuning.hedge_release, alpha=alpha
    )


def _describe_hedge(h: HedgeOutlook, rate: float) -> str:
    return (
        f"{rate:.2f} req/s is near the {h.rollout_capacity_rps:.1f} req/s the replicas left "
        f"serving during a rollout carry; if the load rises to {h.future_rate:.1f} req/s "
        f"({_label(h.current)}'s capacity) {_label(h.current)} is locked in, at "
        f"{_fmt_s(h.stay_future_s)} mean e2e vs {_fmt_s(h.hedge_future_s)} for "
        f"{_label(h.target)} ({_fmt_pct(h.benefit)} faster); switching now costs "
        f"{_fmt_pct(h.premium)} of latency ({_fmt_s(h.premium_s)} mean e2e over "
        f"{_fmt_s(h.horizon_s)}, restart included) if the load stays"
    )


def _tune(
    ctx: _Context,
    est: Estimate,
    calibration: Calibration,
    scale: float | None,
    flags: tuple[bool, str, str],
) -> Decision:
    s, t = ctx.settings, ctx.tuning
    current = ctx.current
    preds = predict(calibration, est, ctx.allowed(), current, s)
    cur = preds[current]
    context = (
        f"at {est.request_rate:.2f} req/s (batch {est.batch_per_replica or 0:.0f}/replica), "
        f"alpha {_fmt_alpha(est)} over {est.draft_tokens:.0f} drafted tokens"
    )
    low, high = _window_rates(ctx, est)
    hedge = best_hedge(calibration, est, current, preds, s, low, t.hedge_zone, high)
    if hedge is not None:
        reason = f"capacity hedge: {_describe_hedge(hedge, low)}"
        return _change(ctx, hedge.target, Rule.HEDGE, reason, preds, flags, est, scale, guard=False)
    # The best config that does not walk into the hedge zone (checked lazily, best first).
    ranked = sorted(preds, key=lambda k: (preds[k].score, -abs(k - current), -k), reverse=True)
    wanted, locked = ranked[0], None
    best = wanted
    for k in ranked:
        hedge_back = _locked_in(ctx, calibration, est, preds, k, high)
        if hedge_back is None:
            best = k
            break
        if locked is None:
            locked = hedge_back
    best_pays = best != current and preds[best].score >= cur.score * (1 + t.min_gain)
    if locked is not None and not best_pays and preds[wanted].score >= cur.score * (1 + t.min_gain):
        h = locked
        return _make(
            ctx, Action.HOLD, ctx.state.k, Rule.HOLD,
            f"{_label(wanted)} predicted {_fmt_x(preds[wanted].speedup)}, but at "
            f"{high:.2f} req/s it would be locked in (a restart needs the load below "
            f"{h.rollout_capacity_rps:.1f} req/s, and at its capacity {_label(h.target)} "
            f"would be {_fmt_pct(h.benefit)} faster); keeping {_label(current)} {context}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    if best == current or preds[best].score < cur.score * (1 + t.min_gain):
        runner = max((k for k in preds if k != current), key=lambda k: preds[k].score, default=None)
        comparison = _summary(preds, (current, runner) if runner is not None else (current,))
        return _make(
            ctx, Action.HOLD, ctx.state.k, Rule.HOLD,
            f"{_label(current)} is best within {t.min_gain:.0%}: predicted {comparison} {context}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    if not _robust(ctx, calibration, est, current, best, margin=0.0):
        return _make(
            ctx, Action.HOLD, ctx.state.k, Rule.HOLD,
            f"{_label(best)} predicted {_fmt_x(preds[best].speedup)} but not at every corner of "
            f"the confidence box; keeping {_label(current)} {context}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    low = _reversion_loss(ctx, calibration, est, current, best)
    if low is not None:
        return _make(
            ctx, Action.HOLD, ctx.state.k, Rule.HOLD,
            f"{_label(best)} predicted {_fmt_x(preds[best].speedup)}, but acceptance was "
            f"{low:.2f} within the last hour and, should it return there, {_label(best)} "
            f"loses more than it gains now; keeping {_label(current)} {context}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    reason = f"predicted {_summary(preds, (best, current))} {context}"
    return _change(ctx, best, Rule.TUNE, reason, preds, flags, est, scale, guard=False)


# --- assembling decisions ------------------------------------------------------------------


def _change(
    ctx: _Context,
    target: int,
    rule: Rule,
    reason: str,
    preds: Mapping[int, ConfigPrediction] | Sequence[ConfigPrediction],
    flags: tuple[bool, str, str],
    est: Estimate | None,
    scale: float | None,
    *,
    guard: bool,
    alpha: float | None = None,
) -> Decision:
    """A change to ``target``, unless the restart price, cooldown or budget forbids it.

    ``alpha`` is the acceptance the predictions assumed (a re-probe's), default the estimate's.
    """
    s, t, memory = ctx.settings, ctx.tuning, ctx.memory
    current = ctx.current
    pred_map = dict(preds) if isinstance(preds, Mapping) else {p.k: p for p in preds}
    keep = ctx.state.k

    # The acceptance floor pays no price, with one exception: a rollout that would overload
    # the replicas left serving and that does not repay itself. Low acceptance costs some
    # speed; minutes of a queue on one replica cost every request of those minutes. The floor
    # then waits for the load to allow a restart.
    if rule in FLOOR_RULES and est is not None:
        calibration, _ = _calibrate(ctx, est)
        _, high = _window_rates(ctx, est)
        capacity = _rollout_capacity(calibration, est, (current, target), s)
        if capacity is not None and high >= t.restart_max_rollout_load * capacity:
            outlook = switch_outlook(
                calibration, est, current, target, s, horizon_s=t.guard_payback_horizon_s
            )
            if not outlook.pays(t.min_switch_saving):
                held = (
                    f"would move to {_label(target)} ({reason}), but at {high:.2f} req/s the "
                    f"rollout would load the replicas left serving to {high / capacity:.0%} of "
                    f"the {capacity:.1f} req/s they carry and not repay itself within "
                    f"{_fmt_s(t.guard_payback_horizon_s)}: holding until the load allows a "
                    "restart"
                )
                decision = _make(
                    ctx, Action.HOLD, keep, rule, held,
                    metrics=flags, predictions=pred_map, est=est, scale=scale,
                )
                # Speculation below the user's floor is not effective, whatever the model
                # says of K vs off: the condition says so, and why nothing changes.
                return replace(
                    decision,
                    held=Held.OVERLOAD,
                    wanted=rule,
                    speculation_effective=False,
                    effective_reason=constants.REASON_ACCEPTANCE_BELOW_FLOOR,
                    effective_message=held,
                )

    # Price: switching now, restart included, must beat staying over the payback horizon.
    # Exempt: bounds fixes (the spec demands them), the acceptance floor on either window
    # (the user's hard rule, rules "floor" and "collapse", held back only by an overloading
    # rollout, above) and hedges (priced by hedge_outlook against a rising load).
    if (
        rule not in FLOOR_RULES | {Rule.BOUNDS, Rule.HEDGE}
        and est is not None
        and current in pred_map
        and target in pred_map
    ):
        calibration, _ = _calibrate(ctx, est)
        horizon = t.guard_payback_horizon_s if guard else t.payback_horizon_s
        outlook = switch_outlook(calibration, est, current, target, s, alpha, horizon)
        if not outlook.pays(t.min_switch_saving):
            held = _make(
                ctx, Action.HOLD, keep, rule,
                f"would move to {_label(target)} ({reason}), but over "
                f"{_fmt_s(horizon)} the restart ({_fmt_s(outlook.rollout_s)}) makes "
                f"it {_fmt_pct(-outlook.saving)} slower than staying",
                metrics=flags, predictions=pred_map, est=est, scale=scale,
            )
            return replace(held, held=Held.PRICE, wanted=rule)
        reason = (
            f"{reason}; switching saves {_fmt_pct(outlook.saving)} of latency over "
            f"{_fmt_s(horizon)}, restart included"
        )

    if ctx.acting and rule is not Rule.BOUNDS:
        if not guard and memory.last_change_at is not None:
            cooldown_left = memory.last_change_at + s.cooldown_s - ctx.now
            if cooldown_left > 0:
                return replace(_make(
                    ctx, Action.HOLD, keep, Rule.COOLDOWN,
                    f"would move to {_label(target)} ({reason}), but the cooldown has "
                    f"{_fmt_s(cooldown_left)} left",
                    metrics=flags, predictions=pred_map, est=est, scale=scale,
                ), held=Held.COOLDOWN, wanted=rule)
        budget = s.max_changes_per_hour
        if not guard:
            budget = max(0, budget - t.reserved_guard_changes) if budget > 1 else budget
        if memory.changes_last_hour >= budget:
            return replace(_make(
                ctx, Action.HOLD, keep, Rule.BUDGET,
                f"would move to {_label(target)} ({reason}), but {memory.changes_last_hour} "
                f"changes in the last hour reach the budget of {budget}",
                metrics=flags, predictions=pred_map, est=est, scale=scale,
            ), held=Held.BUDGET, wanted=rule)

    if target == OFF:
        action = Action.DISABLE
    elif current == OFF:
        action = Action.ENABLE
    else:
        action = Action.SET_K
    return _make(
        ctx, action, target if target != OFF else None, rule, reason,
        metrics=flags, predictions=pred_map, est=est, scale=scale, enabled=target != OFF,
        applied=ctx.acting,
    )


def _make(
    ctx: _Context,
    action: Action,
    k: int | None,
    rule: Rule,
    reason: str,
    *,
    metrics: tuple[bool, str, str],
    predictions: Mapping[int, ConfigPrediction] | None = None,
    est: Estimate | None = None,
    scale: float | None = None,
    enabled: bool | None = None,
    applied: bool | None = None,
) -> Decision:
    if enabled is None:
        enabled = ctx.state.enabled if action is Action.HOLD else k is not None
    if ctx.settings.mode is Mode.OFF:
        enabled = True
    if not enabled:
        k = None
    preds = dict(predictions or {})
    effective, eff_reason, eff_message = _effectiveness(ctx, preds, est)
    if applied is None:
        applied = ctx.acting and action is not Action.HOLD
    return Decision(
        action=action,
        enabled=enabled,
        k=k,
        reason=reason,
        rule=rule,
        applied=applied,
        metrics_available=metrics[0],
        metrics_reason=metrics[1],
        metrics_message=metrics[2],
        speculation_effective=effective,
        effective_reason=eff_reason,
        effective_message=eff_message,
        predictions=tuple(preds[k2] for k2 in sorted(preds)),
        alpha=_best_alpha(ctx, est),
        step_scale=scale,
    )


def _best_alpha(ctx: _Context, est: Estimate | None) -> float | None:
    """The larger of the estimate's acceptance and the long window's: a collapse seen on the
    short window must not erase the memory that the draft paid until just now."""
    values = []
    if est is not None and est.alpha_pooled is not None:
        values.append(est.alpha_pooled)
    window = ctx.observed.window
    if window is not None and window.speculation is not None and window.speculation.alpha is not None:
        values.append(window.speculation.alpha)
    if ctx.state.enabled and ctx.state.last_alpha is not None:
        values.append(ctx.state.last_alpha)
    return max(values) if values else None


def _effectiveness(
    ctx: _Context, preds: Mapping[int, ConfigPrediction], est: Estimate | None
) -> tuple[bool | None, str, str]:
    """SpeculationEffective: on and predicted at least as fast as off."""
    state = ctx.state
    if ctx.settings.mode is Mode.OFF:
        return None, constants.REASON_DISABLED_BY_USER, "autotune is Off: not evaluated"
    if not state.enabled:
        return False, constants.REASON_SPECULATION_OFF, "speculation is off"
    current = ctx.current
    if OFF not in preds or current not in preds or est is None:
        return None, constants.REASON_NOT_ENOUGH_SAMPLES, "not evaluated yet"
    vs_off = preds[OFF].e2e_mean_s / preds[current].e2e_mean_s if math.isfinite(
        preds[current].e2e_mean_s
    ) else 0.0
    acceptance = f"alpha {_fmt_alpha(est)} over {est.draft_tokens:.0f} drafted tokens"
    message = (
        f"{_label(current)}: {acceptance}; predicted {_fmt_x(vs_off)} vs off at "
        f"{est.request_rate:.2f} req/s"
    )
    if vs_off >= 1.0:
        return True, constants.REASON_SPECULATION_ON, message
    return False, constants.REASON_SPECULATION_OFF, message
