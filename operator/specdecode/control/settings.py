"""The policy's inputs from the user's intent: `PolicySettings` (the spec in seconds and
floats) and `PolicyTuning` (internal constants, each with its reason)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specdecode.control import perfmodel
from specdecode.api import AutotuneMode
from specdecode.control.experiments import ExperimentPolicy
from specdecode.control.perfmodel import OFF, EngineParams


@dataclass(frozen=True)
class PolicyTuning:
    """Internal constants of the policy (not API fields); each documented with its reason."""

    min_gain: float = 0.05
    """Hysteresis: a tuning move needs a predicted score at least 5% above the current one."""
    planner: bool = False
    """Tuning and re-probes by the receding-horizon planner (`control.planning`: a plan over
    a forecast of the service's own load, restarts and queues included) instead of the rules
    (hedge, peak readiness, price over the payback horizon). Off by default until it beats the
    rules on held-back seeds (`specdecode bench policy --policy planner`)."""
    slo_guard_margin: float = 0.03
    """The SLO guard's fallback must score at least 3% better (it must also meet the SLO)."""
    fast_fallback_margin: float = 0.25
    """On the short window, reduce speculation at once only for a large predicted gain."""
    probe_abandon_margin: float = 0.02
    """A re-probe that does not pay is abandoned on its first short window."""
    confidence_z: float = 2.0
    """Width of the confidence box, in standard errors."""
    unmeasured_step_tolerance: float = 0.05
    """The fast fallback restarts every replica on the model's word, with no canary to measure
    the config it moves to, so its case must also hold with that config's step this much
    slower than predicted: the calibration fits the running config at today's load, and the
    other config is the prior's shape carried there. Near saturation a capacity difference
    smaller than that decides the queue, and the predicted gain with it (n-gram on the H200's
    measured steps, 28 req/s: off predicted 1.96x K=3 on capacities 2 % apart, where K=3
    carried 3 % more). A tuning move's K must carry the day's overloading peak with the same
    margin (`rules._peak_unserved`): a canary at the calm measures it at the calm's batch only."""
    overdispersion: float = 4.0
    """Variance inflation of counts: tokens of a request, and requests, come in bursts."""
    past_capacity_margin: float = 0.1
    """Requests arriving this much above those finishing (`Observation.arrival_rate`), with a
    queue, in both windows, show a schedule's replicas past their capacity
    (`Observation.past_capacity`), and what arrives is then the load a restart meets
    (`Observation.restart_load`)."""
    payback_horizon_s: float = 3600.0
    """A change decided on the long window must repay its restart price within this time
    (the conditions of a full window are assumed to last about an hour)."""
    guard_payback_horizon_s: float = 1800.0
    """The same for a change decided on the short window (SLO guard, fast fallback, probe
    abandonment): 75 seconds of evidence are trusted for a shorter future."""
    min_switch_saving: float = 0.01
    """Switching (restart included) must save at least 1% of latency over the horizon."""
    peak_readiness_price: float = 0.05
    """A move that readies the service for the return of the last day's peak (the current
    config cannot carry it, and with maxSurge 0 no restart can leave it then) may cost up to
    this much latency over the payback horizon, restart included: the horizon sees the calm,
    not the overload the move avoids."""
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
    split_scale_gap: float = 0.15
    """A step time this much above the prior's (relative) with speculation on starts a
    Calibrate experiment, when nothing measured speculation off beside it yet: one config cannot
    tell whether the draft or the target costs more than the prior says, and the answer
    decides where speculation stops paying (a 3B draft for an 8B target ran 1.24x the prior;
    the model, scaling the target alike, never ranked off first where off won)."""
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
    hedge_min_rise: float = 0.2
    """A hedge insures against a rising load, so it needs one: the long window's request rate
    at least this much above the trend window's (`metrics.trend_window`, half an hour or
    more). A load that sits in the zone is not insured against: each restart there costs
    latency today for a rise nothing shows (a day at a stationary load near the zone hedged
    off and stayed off)."""
    hedge_steep_rise: float = 1.0
    """A load rising this much or more (the long window's request rate over the trend
    window's) is judged by the hedge's zone where one more such rise takes it: a load that
    doubled within half an hour is insured before it steps past the zone. Smaller rises are
    judged where they are: the rate's noise alone moves a window by a fifth."""
    restart_max_rollout_load: float = 0.8
    """With maxSurge 0, a restart is affordable only while the load is below this fraction of
    what the replicas left serving during the rollout carry: nearer that capacity each round
    builds a queue that takes minutes to drain. A re-probe (which costs two restarts if it
    fails) and the acceptance floor wait above it."""
    peak_hold_s: float = 26 * 3600.0
    """How long the recent peak load (`memory.recent_peak`) is kept whole after it was last
    seen: a day's peak comes back the next day (a day and two hours: tomorrow's comes a little
    later than today's), so a move that could not carry it is judged against it all day."""
    peak_refresh_share: float = 0.9
    """A load at least this share of the remembered peak sees it again: its hold starts anew
    (a peak a little lower than yesterday's keeps yesterday's in memory)."""
    peak_memory_s: float = 6 * 3600.0
    """Once held that long, the time constant over which the remembered peak falls to the
    load of today (a service whose load has left for good gets its faster configs back)."""
    peak_future_rise: float = 0.5
    """Planner mode: a recent peak at least this far above today's load is a future of its own
    that every planned move must also be worth its restart in (`rules._other_futures`); a
    smaller one is within what the present's noise and trend already cover."""
    unseen_surge_rise: float = 3.0
    """Planner mode, with less than ``history_day_s`` of load history: the peak future is at
    least the load risen by this share (four times today's), since nothing yet says no peak
    comes. A day's peak is often several times its night (the generated swings: 2-9x); on
    judged seed 311 a doubling scored 0.706 and four times 0.726 (docs/planner.md)."""
    history_day_s: float = 24 * 3600.0
    """History that long has seen a day's peak: the recent peak, not a prior, is the future."""
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

    mode: AutotuneMode = AutotuneMode.AUTO
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
    trend_window_s: float = 1800.0
    """The window whose load tells a rising load from a stationary one (`metrics.trend_window`)."""
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
    allow_outages: bool = True
    """spec.autotune.allowOutages: whether a change may roll out when the replicas left serving
    cannot carry the load (`disruption.gate`). The API defaults it to false (`from_spec`); a
    direct construction keeps the rules alone, as the rules' own tests and tools expect."""
    restart_s: float = 180.0
    """Time a restarted replica serves nothing (model load): the restart price's duration."""
    scrape_interval_s: float = 15.0
    prior: EngineParams | None = None
    """Prior costs of the engine; default: `EngineParams.for_method(method)`."""
    tuning: PolicyTuning = field(default_factory=PolicyTuning)
    experiments: ExperimentPolicy | None = None
    """spec.autotune.experiments (`from_spec`); None: no experiments, every move applies at once."""
    schedules: bool = False
    """autotune.schedules Auto: the policy may choose per-batch-size K schedules."""
    schedules_unsupported: str | None = None
    """Why this service cannot run an operator-chosen schedule (version, method, a declared
    table), None when it can (`schedule_support.unsupported_reason`)."""

    @property
    def rollout_keeps_capacity(self) -> bool:
        """Whether a rollout keeps every replica serving: a surge pod starts before an old one
        goes (maxSurge >= 1 and maxUnavailable 0). With maxUnavailable >= 1 the Deployment
        controller takes old pods down while the surge pods start, maxSurge or not: the
        replicas left serving carry the load for a restart's time, as with maxSurge 0."""
        return self.max_surge >= 1 and self.max_unavailable == 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_k <= self.max_k:
            raise ValueError(f"need 1 <= min_k <= max_k, got {self.min_k}..{self.max_k}")
        for name in ("window_s", "guard_window_s", "trend_window_s", "evaluation_interval_s", "scrape_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    def configs(self) -> tuple[int, ...]:
        """Configs the policy may choose: off (when allowed) then minK..maxK."""
        ks = tuple(range(self.min_k, self.max_k + 1))
        return ((OFF,) + ks) if self.allow_disable else ks

    def prior_params(self, schedule_overhead_s: float | None = None) -> EngineParams:
        """The prior cost model within the spec's bounds (unknown methods: a draft model's),
        with the per-step schedule overhead calibrated so far when given
        (`ControlState.schedule_overhead_s`; None: the prior's)."""
        if self.prior is not None:
            base = self.prior
        elif self.method in perfmodel.METHODS:
            base = EngineParams.for_method(self.method)
        else:
            base = EngineParams.for_method("draft_model")
        if schedule_overhead_s is not None:
            base = replace(base, schedule_overhead_s=schedule_overhead_s)
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
        from specdecode.control import metrics, schedule_support

        auto, spec_k = spec.autotune, spec.speculation
        window = api.parse_duration(auto.window)
        scrape = api.parse_duration(spec.metrics.scrape_interval)
        method = spec_k.method.value if hasattr(spec_k.method, "value") else str(spec_k.method)
        slo = auto.slo
        return cls(
            mode=AutotuneMode(auto.mode),
            method=method,
            configured_k=spec_k.num_speculative_tokens,
            min_k=spec_k.min_k,
            max_k=spec_k.max_k,
            allow_disable=spec_k.allow_disable,
            evaluation_interval_s=api.parse_duration(auto.evaluation_interval),
            window_s=window,
            guard_window_s=metrics.guard_window(window, scrape),
            trend_window_s=metrics.trend_window(window),
            warmup_s=api.parse_duration(auto.warmup),
            min_drafts=auto.min_drafts,
            min_requests=auto.min_requests,
            acceptance_floor=spec.acceptance_floor,
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
            allow_outages=auto.allow_outages,
            restart_s=restart_s,
            scrape_interval_s=scrape,
            prior=prior,
            tuning=tuning or PolicyTuning(),
            experiments=ExperimentPolicy.from_spec(spec),
            schedules=auto.schedules == api.ScheduleMode.AUTO,
            schedules_unsupported=schedule_support.unsupported_reason(spec),
        )
