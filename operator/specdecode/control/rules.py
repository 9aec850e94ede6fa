"""The speculation policy: a pure, deterministic decision function.

``decide(settings, state, observed, history, now) -> Decision``. No I/O, no clock, no
randomness: time comes in as ``now``, the metrics as ``observed``, and everything the policy
remembers comes from ``state`` (status plus the live Deployment) and ``history`` (the status's
bounded decision history), so decisions survive an operator restart.

A *config* is an integer as in `specdecode.control.perfmodel`: 0 is speculation off, K >= 1 is K
drafted tokens per step.

"maxSurge 0" below stands for any rollout that takes replicas away: maxSurge 0, or
maxUnavailable >= 1 whatever maxSurge is (the Deployment controller takes an old pod down while
a surge pod starts). Only maxSurge >= 1 with maxUnavailable 0 keeps every replica serving
(`PolicySettings.rollout_keeps_capacity`).

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
   - Acceptance collapse: alpha confidently below the floor on the guard window, confirmed by
     a second window (the guard window of an evaluation at least half a guard window earlier,
     every evaluation since showing it too, or the long window), and the model agrees that
     less speculation is better -> off (minK when disabling is not allowed). One window is
     not enough: real acceptance dips below the floor for a minute and comes back, and each
     such fallback costs a restart there and another back.
     The floor is the user's hard rule: no restart price applies, with one exception: with
     maxSurge 0, while the load is above ``restart_max_rollout_load`` of what the replicas
     left serving carry and the rollout would not repay itself over the guard horizon, the
     floor waits (an overloaded replica costs every request of those minutes; low
     acceptance costs some speed).
   - Fast fallback / probe abandonment: a smaller K or off predicted better by
     ``fast_fallback_margin`` (``probe_abandon_margin`` while a re-probe is on trial);
     while a capacity-neutral canary starts, also at the load per replica once it serves
     (the main Deployment's replicas carry the borrowed ones' share for those minutes).
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
   be locked in (the hedge's release, below). It takes a draft that carries the peak of
   about the last day (status.observations.recentPeakRequestRate), or stays off when none
   that pays does: should the peak come back, a restart would overload the replicas left
   serving. Unless speculation went off by the capacity hedge (rule 8; status.history's
   rule `hedge`) and a hedge from the probed K would qualify too: the load's rise to that
   peak passed through the hedge's zone in time, and should it rise the same way again the
   hedge moves away again, after a calm with speculation on.
8. Capacity hedge (maxSurge 0, two replicas or more): a rollout serves on the replicas left;
   once the load passes what they carry, every restart is an overload and the running config
   is locked in. When the load (the long window at its lower confidence bound, and the short
   window) reaches ``hedge_zone`` of that rollout capacity (but not the capacity itself), the
   policy insures against the load rising on to the current config's capacity
   (x ``hedge_overload``): it moves to a config with ``hedge_min_capacity_gain`` more
   capacity that would be ``hedge_min_benefit`` faster there, when the mean e2e saved in that
   future outweighs the mean e2e it costs at today's load over the payback horizon, restart
   included (`hedge_outlook`, weights ``hedge_rise_prior``), and only while the load is
   rising: the long window's request rate ``hedge_min_rise`` above the trend window's (half
   an hour or more; a load that sits in the zone buys no insurance). A new service's first
   trend window reaches back before its traffic began, and its rise from none is no rise:
   no hedge until the service has served a trend window (`_trend_predates_traffic`).
   Release: no tuning move or re-probe goes to a config with less capacity while the load
   on either window is above ``hedge_release`` of the rollout capacity and the hedge would
   send it back at once.
9. Tuning: the best config by predicted score; act only when it beats the current one by the
   hysteresis margin at the point estimate, is no worse at every corner of the confidence box
   (alpha +- z*sigma, request rate +- z*sigma), survives a return of acceptance to its
   recent low (status.observations.recentLowAlpha, when ``reversion_min_drop`` below today's:
   the move must not lose on average over the two futures, so n-gram bursts do not lure K
   up for as long as they last), repays the restart within ``payback_horizon_s``, and the
   cooldown and change budget allow it. With maxSurge 0 a longer draft must also leave the
   acceptance floor its way out: should acceptance fall to the floor, the replicas left
   serving during a rollout to off must carry today's load at ``restart_max_rollout_load``
   (else the floor waits, rule 6, and the service keeps its longest draft exactly while it
   loses most); the longest draft that does is the choice. Among configs the model cannot
   tell from the best (within the hysteresis) the move takes the shortest draft that beats
   the current config, by the hysteresis when it is longer (`shortest_near_best`): a longer
   draft bets on acceptance staying, and a shorter one carries more of a load rise. While
   a canary of that shorter draft found no gain lately (it backs off), the move takes the
   model's favourite.
   Inside the hysteresis one move still goes ahead: readiness for the last day's peak
   (maxSurge 0). When the running config carries less than the peak of about the last day
   (status.observations.recentPeakRequestRate), a restart at that load would overload the
   replicas left serving, and a config no slower now carries it (with its step
   ``unmeasured_step_tolerance`` slower than predicted), the move is made at the calm, while
   the rollout is cheap, for up to ``peak_readiness_price`` of the next hour's latency: the
   horizon sees the calm, not the overload it avoids. It applies at once, as a hedge does:
   a canary at the calm could only test a gain the move does not claim. (Generated
   `gen-1-15-swing-x2`: an EAGLE service held K=3 at the calm, where K=2 was 3 to 4 % faster
   and alone carried the peak, and met the second peak overloaded: 0.28 against 1.00 for K=1
   all day; readied at the calm, 0.45.)

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

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from specdecode import constants
from specdecode.api import AutotuneMode
from specdecode.control.canary import backing_off, canary_starting, promoted_lately
from specdecode.control.decision import (
    FLOOR_RULES, Action, Condition, ConfigPrediction, Decision, Held, Rule,
)
from specdecode.control.estimates import (
    Calibration, Estimate, PolicyObservations, estimate, kv_scale, predict, scaled_params,
    step_scale, switch_outlook,
)
from specdecode.control.explain import (
    describe_hedge, fmt_alpha, fmt_pct, fmt_s, fmt_x, label, shut_way_out, summary,
)
from specdecode.control.forecast import Forecast, forecast
from specdecode.control.hedge import HedgeOutlook, best_hedge, config_capacity, hedge_outlook, overloading_rollout
from specdecode.control.planning import SLOTS, PolicyPlan, plan_now
from specdecode.control.memory import HistoryEntry, Memory, remember
from specdecode.control.settings import PolicySettings, PolicyTuning
from specdecode.control.state import Cause, ControlState, bounded
from specdecode.control.metrics import Observation
from specdecode.control.perfmodel import OFF, Schedule


@dataclass(frozen=True)
class _Context:
    settings: PolicySettings
    state: ControlState
    now: float
    memory: Memory
    observed: PolicyObservations
    _computed: dict = field(default_factory=dict, compare=False, repr=False)
    """Estimates and calibrations of this decision, each computed once."""

    def estimate(self, obs: Observation) -> Estimate:
        """The estimate of one of this decision's windows (computed once per window)."""
        key = ("estimate", id(obs))
        if key not in self._computed:
            self._computed[key] = (obs, estimate(obs, self.tuning))
        return self._computed[key][1]

    def calibrated(self, est: Estimate) -> tuple[Calibration, float | None]:
        """The model calibrated on ``est`` (computed once per estimate)."""
        key = ("calibration", id(est))
        if key not in self._computed:
            self._computed[key] = (est, _calibrate(self, est))
        return self._computed[key][1]

    @property
    def tuning(self) -> PolicyTuning:
        return self.settings.tuning

    @property
    def current(self) -> int:
        """The running config as the rules compare it: K (a schedule's largest), or off."""
        return self.state.config

    @property
    def running(self) -> Schedule | None:
        """The per-batch-size schedule in effect (`Calibration.running`), None under plain K."""
        return self.state.schedule if self.state.enabled else None

    @property
    def acting(self) -> bool:
        return self.settings.mode is AutotuneMode.AUTO

    @property
    def in_probe_trial(self) -> bool:
        """A re-probe whose first full window after warm-up is not over yet (one promoted by a
        canary experiment was measured already: it is not on trial)."""
        live = self.state.live_since
        if not self.memory.in_probe or live is None or promoted_lately(self.state):
            return False
        return self.now < live + self.settings.warmup_s + self.settings.window_s

    def forecast(self, est: Estimate) -> Forecast:
        """The load the plan expects in each of its slots (`forecast.forecast`), from the load
        arriving now (past capacity: what arrives, not what finishes) and the history."""
        key = ("forecast", id(est))
        if key not in self._computed:
            load = self.present_load()
            # A trend window that reaches back before the traffic began reads a rise from none.
            trend = None if _trend_predates_traffic(self) else self.observed.trend_rate
            self._computed[key] = (est, forecast(self.state.load_history, self.now, load, trend, SLOTS))
        return self._computed[key][1]

    def present_load(self) -> float:
        """The load the plan starts from: the long window's (past capacity: what arrives), not
        the higher of the two windows'. A queue integrates the load over time, and the short
        window's noise read as the level makes a config near its capacity look overloaded for
        the whole horizon (`gen-313-12-stationary`: K=3 carrying 60 req/s left for a reading
        of 65). A rise is the trend's to see, and the recent peak's future (`_other_futures`)
        judges what a move risks should it return."""
        assert self.observed.window is not None
        return self.observed.window.restart_load(self.tuning.past_capacity_margin)

    def allowed(self) -> tuple[int, ...]:
        return tuple(k for k in self.settings.configs() if k not in self.state.excluded_ks or k == OFF)


def decide(
    settings: PolicySettings,
    state: ControlState,
    observed: PolicyObservations,
    history: Sequence[HistoryEntry],
    now: float,
) -> Decision:
    """The policy. Pure and deterministic: same inputs, same decision."""
    ctx = _Context(settings, state, now, remember(history, state, now), observed)
    return _decide(ctx)


def _decide(ctx: _Context) -> Decision:
    s, state = ctx.settings, ctx.state
    if s.mode is AutotuneMode.OFF:
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

    below = _below_floor_on_guard(ctx)
    decision = _decide_on_windows(ctx, below)
    if not below:
        return decision
    if not decision.changes and not _collapse_confirmed(ctx):
        decision = replace(decision, reason=f"{decision.reason}; {_unconfirmed_note(ctx)}")
    return replace(decision, below_floor=True)


def _decide_on_windows(ctx: _Context, below_floor: bool) -> Decision:
    """The rules that read the windows (4 to 9), ``below_floor`` the guard window's evidence
    (`_below_floor_on_guard`)."""
    s, state = ctx.settings, ctx.state
    obs_long, obs_guard = ctx.observed.window, ctx.observed.guard
    ready_at = state.live_since + s.warmup_s  # type: ignore[operator]
    guard_ready = ctx.now >= ready_at + s.guard_window_s
    long_ready = ctx.now >= ready_at + s.window_s
    flags = _metrics_flags(ctx)

    # --- fast guards (short window; bypass the cooldown) ---
    if state.enabled and guard_ready and obs_guard is not None:
        guard_decision = _guards(ctx, obs_guard, flags, below_floor)
        if guard_decision is not None:
            return guard_decision

    if not long_ready:
        left = ready_at + s.window_s - ctx.now
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"collecting the first full {fmt_s(s.window_s)} window of {ctx.state.config_label} "
            f"after its warm-up ({fmt_s(left)} left)",
            metrics=flags,
        )
    if obs_long is not None and not obs_long.requests_counted:
        return _make(
            ctx, Action.HOLD, state.k, Rule.SAMPLES,
            f"Prometheus holds fewer than two samples of the request counter in the last "
            f"{fmt_s(s.window_s)} (its scrapes resumed after a gap, or the pods' series began "
            f"inside the window): nothing to judge until the window fills",
            metrics=flags,
        )
    if obs_long is None or obs_long.idle:
        return _make(
            ctx, Action.HOLD, state.k, Rule.IDLE,
            f"no finished requests in the last {fmt_s(s.window_s)}: nothing to judge "
            f"(idle is not a failure)",
            metrics=flags,
        )
    est = ctx.estimate(obs_long)
    samples = _samples_hold(ctx, est, 1.0, flags)
    if samples is not None:
        return samples

    calibration, scale = ctx.calibrated(est)
    ks = ctx.allowed()

    # --- acceptance floor on the long window (the user's hard rule: no price check) ---
    # Unless the short window, newer, shows acceptance confidently back above the floor:
    # then the long window's low acceptance is the past, not the present.
    if state.enabled and est.alpha_pooled is not None:
        if _confidently_below_floor(ctx, est) and not _recovered(ctx, obs_guard):
            preds = predict(calibration, est, ks, ctx.current, s)
            target = OFF if s.allow_disable else s.min_k
            if target != ctx.current:
                reason = (
                    f"alpha {est.alpha_pooled:.2f} < floor {s.acceptance_floor:.2f} over "
                    f"{est.draft_tokens:.0f} drafted tokens ({fmt_s(s.window_s)} window); "
                    f"predicted {summary(preds, (target, ctx.current))}"
                )
                return _change(ctx, target, Rule.FLOOR, reason, preds, flags, est, scale, guard=True)

    if ctx.tuning.planner:
        return _reprobe_planned(ctx, est, flags) if not state.enabled else _tune_planned(ctx, est, flags)
    if not state.enabled:
        return _reprobe(ctx, est, flags)

    return _tune(ctx, est, flags)


# --- rules -----------------------------------------------------------------------------------


def _recovered(ctx: _Context, obs_guard: Observation | None) -> bool:
    """The short window's acceptance is confidently above the floor (with its own sample
    minimums)."""
    s = ctx.settings
    if obs_guard is None or obs_guard.idle or not ctx.state.enabled:
        return False
    short = ctx.estimate(obs_guard)
    if short.alpha_pooled is None or short.alpha_stderr is None:
        return False
    if short.draft_tokens < max(50.0, s.min_drafts * s.guard_window_s / s.window_s):
        return False
    return short.alpha_pooled - ctx.tuning.confidence_z * short.alpha_stderr > s.acceptance_floor


def _below_floor_on_guard(ctx: _Context) -> bool:
    """The short (guard) window shows acceptance confidently below the floor, with the guard's
    sample minimums: the collapse guard's evidence (speculation on, the window after the
    config's warm-up)."""
    s, state, obs = ctx.settings, ctx.state, ctx.observed.guard
    if not state.enabled or state.live_since is None or obs is None or obs.idle:
        return False
    if ctx.now < state.live_since + s.warmup_s + s.guard_window_s:
        return False
    est = ctx.estimate(obs)
    if _samples_hold(ctx, est, s.guard_window_s / s.window_s, _metrics_flags(ctx)) is not None:
        return False
    return _confidently_below_floor(ctx, est)


def _collapse_confirmed(ctx: _Context) -> bool:
    """The guard window's low acceptance is a collapse, not a dip: a second window shows it
    too. Either an earlier evaluation's guard window did, at least half a guard window ago (so
    most of today's window is data that one did not see) and every evaluation since; or the
    long window, after the config's warm-up, is confidently below the floor as well.

    Acceptance dips below the floor for a minute or so on real traffic (a burst of unusual
    requests); turning speculation off for each dip costs a restart, and turning it back on
    another. A collapse lasts: waiting for the second window costs one evaluation."""
    s, state = ctx.settings, ctx.state
    since = state.below_floor_since
    if since is not None and ctx.now - since >= s.guard_window_s / 2.0:
        return True
    obs = ctx.observed.window
    live = state.live_since
    if obs is None or obs.idle or live is None or ctx.now < live + s.warmup_s + s.window_s:
        return False
    est = ctx.estimate(obs)
    if _samples_hold(ctx, est, 1.0, _metrics_flags(ctx)) is not None:
        return False
    return _confidently_below_floor(ctx, est)


def _confidently_below_floor(ctx: _Context, est: Estimate) -> bool:
    """The window's acceptance is below the floor by more than its noise (z standard errors)."""
    return (est.alpha_pooled is not None and est.alpha_stderr is not None
            and est.alpha_pooled + ctx.tuning.confidence_z * est.alpha_stderr < ctx.settings.acceptance_floor)


def _unconfirmed_note(ctx: _Context) -> str:
    """What the decision says while the guard window is below the floor and no change came of it."""
    s, since = ctx.settings, ctx.state.below_floor_since
    seen = "first seen in this window" if since is None else f"seen for {fmt_s(ctx.now - since)}"
    return (f"acceptance below the floor {s.acceptance_floor:.2f} on the {fmt_s(s.guard_window_s)} window "
            f"({seen}): a collapse once a later window shows it too, a dip if not")


def _bounds_rule(ctx: _Context) -> Decision | None:
    """A current config outside the spec's bounds moves where `state.bounded` says (the one
    rule the reconcile renders by too)."""
    s, state = ctx.settings, ctx.state
    target = bounded(ctx.current, s.min_k, s.max_k, s.allow_disable, s.configured_k)
    if target == ctx.current:
        return None
    if ctx.current == OFF:
        reason = f"speculation is off but allowDisable is false: enabling at K={target}"
    else:
        reason = f"K={state.k} is outside the spec's bounds [{s.min_k}, {s.max_k}]: moving to K={target}"
    return _change(ctx, target, Rule.BOUNDS, reason, (), _metrics_flags(ctx), None, None, guard=True)


def _metrics_flags(ctx: _Context) -> Condition:
    """MetricsAvailable for the current observations."""
    observed = ctx.observed
    if not observed.available:
        return Condition(False, observed.reason, observed.message)
    obs = observed.guard or observed.window
    if obs is None:
        return Condition(True, constants.REASON_METRICS_OK, "no series yet for the current config")
    stale = _stale(ctx, obs)
    if stale is not None:
        return Condition(False, constants.REASON_METRICS_STALE, stale)
    return Condition(True, constants.REASON_METRICS_OK, f"newest sample {fmt_s(obs.staleness_s)} old")


def _stale(ctx: _Context, obs: Observation) -> str | None:
    limit = ctx.tuning.stale_after_scrapes * ctx.settings.scrape_interval_s
    if obs.staleness_s is None:
        return "no fresh sample of the current config (its pods are not scraped)"
    if obs.staleness_s > limit:
        return f"newest sample is {fmt_s(obs.staleness_s)} old (limit {fmt_s(limit)})"
    return None


def _health(ctx: _Context) -> Decision | None:
    s, state, observed = ctx.settings, ctx.state, ctx.observed
    flags = _metrics_flags(ctx)
    if not observed.available:
        return _make(
            ctx, Action.HOLD, state.k, Rule.METRICS,
            f"holding {ctx.state.config_label}: metrics unavailable ({observed.message})",
            metrics=flags,
        )
    if state.live_since is None:
        return _make(
            ctx, Action.HOLD, state.k, Rule.ROLLOUT,
            f"rollout of {ctx.state.config_label} in progress: waiting for every replica to be Ready",
            metrics=flags,
        )
    ready_at = state.live_since + s.warmup_s
    if ctx.now < ready_at:
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"{ctx.state.config_label} warming up ({fmt_s(ready_at - ctx.now)} left): its metrics "
            "do not count yet",
            metrics=flags,
        )
    if observed.window is None and observed.guard is None:
        grace = ctx.tuning.missing_grace_scrapes * s.scrape_interval_s
        if ctx.now >= ready_at + grace:
            message = (
                f"no series of the current config for {fmt_s(ctx.now - state.live_since)} "
                "since it went live (is the PodMonitor scraping the pods? vllm:num_requests_running "
                "or vllm_num_requests_running with labels specdecode_service and specdecode_config_hash)"
            )
            return _make(
                ctx, Action.HOLD, state.k, Rule.METRICS,
                f"holding {ctx.state.config_label}: {message}",
                metrics=Condition(False, constants.REASON_METRICS_MISSING, message),
            )
        return _make(
            ctx, Action.HOLD, state.k, Rule.WARMUP,
            f"waiting for the first scrapes of {ctx.state.config_label}", metrics=flags,
        )
    if not flags.status:
        return _make(
            ctx, Action.HOLD, state.k, Rule.METRICS,
            f"holding {ctx.state.config_label}: {flags.message}", metrics=flags,
        )
    return None


def _samples_hold(
    ctx: _Context, est: Estimate, fraction: float, flags: Condition
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
        missing.append(f"{est.draft_tokens:.0f} drafted tokens < {min_drafts:.0f}{_undrafted_note(ctx, est)}")
    if ctx.state.enabled and est.alpha is None and est.draft_tokens >= min_drafts:
        missing.append("no per-position acceptance series")
    if not missing:
        return None
    return _make(
        ctx, Action.HOLD, ctx.state.k, Rule.SAMPLES,
        f"not enough samples in {fmt_s(est.window_s)}: {', '.join(missing)}",
        metrics=flags,
    )


def _undrafted_note(ctx: _Context, est: Estimate) -> str:
    """Why a schedule in effect drafted too little to measure, when its range of the running
    batch is K 0: the engine stops drafting there by design (the load is past the crossover),
    and the acceptance measured below it is all there is until the batch falls back."""
    schedule, batch = ctx.state.schedule, est.batch_per_replica
    if schedule is None or batch is None:
        return ""
    start, _, k = schedule.band_at(batch)
    if k != OFF:
        return ""
    return (f" (schedule {schedule.label} drafts nothing from batch {start} on, and the replicas run batches of "
            f"{batch:.0f}: acceptance is measured again once the batch falls below {start}; the schedule holds)")


def _calibrate(ctx: _Context, est: Estimate) -> tuple[Calibration, float | None]:
    # The calibrated schedule overhead prices only schedules: under plain K it changes nothing.
    prior = ctx.settings.prior_params(ctx.state.schedule_overhead_s)
    running = ctx.running
    measured_as = running if running is not None else ctx.current
    lo, hi = ctx.tuning.scale_bounds
    measured = step_scale(prior, measured_as, est)
    scale_now = None if measured is None else min(hi, max(lo, measured))
    base = scale_now if scale_now is not None else 1.0
    # The other kind of config (speculation off while it is on, and back): the ratio a canary
    # measured beside this one carries to today's load; a scale measured at another load
    # (the config a change left) serves without one; else the same scale for both.
    ratio = ctx.memory.off_per_on
    if ctx.state.enabled:
        on_scale = base
        if ratio is not None and scale_now is not None:
            off_scale = scale_now * ratio
        else:
            off_scale = ctx.memory.scale_off if ctx.memory.scale_off is not None else base
    else:
        off_scale = base
        if ratio is not None and scale_now is not None:
            on_scale = scale_now / ratio
        else:
            on_scale = ctx.memory.scale_on if ctx.memory.scale_on is not None else base
    decay = est.decay
    kv = kv_scale(prior, measured_as, est, ctx.tuning)
    calibration = Calibration(
        off=scaled_params(prior, off_scale, decay, kv),
        on=scaled_params(prior, on_scale, decay, kv),
        scale_now=scale_now,
        running=running,
    )
    return calibration, scale_now


def _shifted(ctx: _Context, short: Estimate, long_obs: Observation | None) -> bool:
    """Whether the short window differs from the long one beyond their noise (a change in
    acceptance or load the long window has not caught up with)."""
    if long_obs is None or long_obs.idle:
        return True
    long = ctx.estimate(long_obs)
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


def _alpha_shift(ctx: _Context, est: Estimate) -> float | None:
    """The short window's acceptance when it differs confidently from the long window's
    ``est`` (either way: a change of regime the long window has not caught up with), with the
    short window's own sample minimum; None otherwise."""
    obs = ctx.observed.guard
    s = ctx.settings
    if obs is None or obs.idle or est.alpha is None:
        return None
    short = ctx.estimate(obs)
    if short.alpha is None or short.draft_tokens < max(50.0, s.min_drafts * s.guard_window_s / s.window_s):
        return None
    sigma = math.hypot(short.alpha_stderr or 0.0, est.alpha_stderr or 0.0)
    return short.alpha if abs(short.alpha - est.alpha) > ctx.tuning.confidence_z * sigma else None


def _regret(preds: Mapping[int, ConfigPrediction], k: int) -> float:
    """How much slower ``k`` is predicted than the fastest config (0: it is the fastest; inf:
    it scores 0, a queue that grows without end)."""
    if preds[k].score <= 0:
        return math.inf
    return max(p.score for p in preds.values()) / preds[k].score - 1.0


def _slower_text(regret: float) -> str:
    return f"{fmt_pct(regret)} slower" if math.isfinite(regret) else "falling behind its load, unlike"


def _slo_breach(what: str, p95: float | None, at_least: float | None, slo: float | None) -> str:
    """The guard window's P95 above the SLO, confidently: the P95 the window's few hundred
    requests allow at the confidence box's width is above it too (`Estimate.e2e_p95_low_s`;
    the P95 itself without a histogram). A breach within the P95's own sampling noise is no
    reason for a restart (a day of noisy traffic at a steady load tripped it once). Empty:
    no breach."""
    if slo is None or p95 is None or not p95 > slo:
        return ""
    if at_least is not None and not at_least > slo:
        return ""
    confident = f" (at least {fmt_s(at_least)} within the window's sampling noise)" if at_least is not None else ""
    return f"P95 {what} {fmt_s(p95)} > SLO {fmt_s(slo)}{confident}"


def _guards(ctx: _Context, obs: Observation, flags: Condition, below_floor: bool) -> Decision | None:
    """SLO guard, acceptance collapse, fast fallback and probe abandonment (short window).
    ``below_floor``: the window's acceptance is confidently below the floor
    (`_below_floor_on_guard`); the collapse guard acts once that is confirmed
    (`_collapse_confirmed`)."""
    s, t = ctx.settings, ctx.tuning
    if obs.idle:
        return None
    est = ctx.estimate(obs)
    fraction = s.guard_window_s / s.window_s
    if _samples_hold(ctx, est, fraction, flags) is not None:
        return None
    current = ctx.current
    lower = [k for k in ctx.allowed() if k < current]
    if not lower:
        return None

    breaches = [
        breach for breach in (
            _slo_breach("e2e", est.e2e_p95_s, est.e2e_p95_low_s, s.slo_e2e_s),
            _slo_breach("TPOT", est.tpot_p95_s, est.tpot_p95_low_s, s.slo_tpot_s),
        ) if breach
    ]
    collapse = below_floor and _collapse_confirmed(ctx)
    live = ctx.state.live_since or 0.0
    long_ready = ctx.now >= live + s.warmup_s + s.window_s
    # The fast fallback looks for what the long window cannot see yet: a probe on trial, a
    # config too young for a full window, or a shift of acceptance or load.
    fast = ctx.in_probe_trial or not long_ready or _shifted(ctx, est, ctx.observed.window)
    if not (breaches or collapse or fast):
        return None

    calibration, scale = ctx.calibrated(est)
    preds = predict(calibration, est, lower + [current], current, s)
    cur = preds[current]
    window = fmt_s(s.guard_window_s)

    # SLO guard.
    if breaches:
        meeting = [k for k in lower if _meets_slo(s, est, cur, preds[k])]
        better = [k for k in meeting if preds[k].score >= cur.score * (1 + t.slo_guard_margin)]
        if better:
            target = max(better, key=lambda k: (preds[k].score, k))
            reason = (
                f"{'; '.join(breaches)} over {est.requests:.0f} requests ({window} window) and "
                f"speculation is the likely cause: predicted {summary(preds, (target, current))}"
                f", {label(target)} P95 e2e {fmt_s(_corrected(est.e2e_p95_s, cur.e2e_p95_s, preds[target].e2e_p95_s))}"
            )
            decision = _change(ctx, target, Rule.SLO_GUARD, reason, preds, flags, est, scale, guard=True)
            if decision.changes or decision.rule is not Rule.SLO_GUARD:
                return decision

    # Acceptance collapse: confidently below the floor on two windows, and the model agrees.
    if collapse and est.alpha_pooled is not None:
        target = OFF if s.allow_disable else s.min_k
        if target in preds and target != current:
            if preds[target].score > cur.score:
                reason = (
                    f"alpha {est.alpha_pooled:.2f} < floor {s.acceptance_floor:.2f} over "
                    f"{est.draft_tokens:.0f} drafted tokens ({window} window); predicted "
                    f"{summary(preds, (target, current))}"
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
    # A re-probe on trial goes back to the config it left, measured before it; the fast
    # fallback moves to one the calibration only extrapolates to.
    unmeasured = 0.0 if probing else t.unmeasured_step_tolerance
    target = max(lower, key=lambda k: (preds[k].score, -k))
    if preds[target].score >= cur.score * (1 + margin) and _robust(
        ctx, calibration, est, current, target, margin=0.0, unmeasured=unmeasured
    ) and not _canary_start_alone(ctx, est, current, target, margin):
        rule = Rule.PROBE_ABANDON if probing else Rule.FAST_FALLBACK
        what = "re-probe does not pay" if probing else "speculation hurts at this load"
        reason = (
            f"{what}: predicted {summary(preds, (target, current))} at "
            f"{est.request_rate:.2f} req/s, alpha {fmt_alpha(est)} ({window} window)"
        )
        return _change(ctx, target, rule, reason, preds, flags, est, scale, guard=True)
    return None


def _surge_would_pay(
    calibration: Calibration, est: Estimate, current: int, target: int, s: PolicySettings,
    alpha: float | None, horizon: float,
) -> str:
    """What the user can change when a move is held for its price and the rollout takes
    replicas away: where the queue on the replicas left serving is the price, a surge pod
    that starts before an old one goes keeps every replica serving, and the hold says how
    much the move would then save. Empty when that would not make it pay either, or when the
    rollout already keeps capacity."""
    if s.rollout_keeps_capacity:
        return ""
    surging = replace(s, max_surge=max(1, s.max_surge), max_unavailable=0)
    outlook = switch_outlook(calibration, est, current, target, surging, alpha, horizon)
    if not outlook.pays(s.tuning.min_switch_saving) or outlook.saving <= 0:
        return ""
    return (
        f"; with spec.rollout.maxSurge: {surging.max_surge} and maxUnavailable: 0 (room for one more pod on a "
        f"GPU node during a rollout) every replica would keep serving and the move would save "
        f"{fmt_pct(outlook.saving)} of latency"
    )


def _canary_start_alone(ctx: _Context, est: Estimate, current: int, target: int, margin: float) -> bool:
    """Whether the fast fallback's case rests on a capacity-neutral canary's start alone
    (`canary.canary_starting`): for those minutes the main Deployment's replicas carry the
    borrowed ones' share, which the fallback would take for a load that rose for good and
    answer with a restart of every replica, outlasting them. At the service's replicas (the
    load per replica once the canary serves) ``target`` would not beat ``current`` by the
    margin; a load that did rise still does."""
    policy = ctx.settings.experiments
    if policy is None or not canary_starting(ctx.settings, ctx.state, ctx.now):
        return False
    steady = replace(ctx, settings=replace(ctx.settings, replicas=policy.spec.replicas), _computed={})
    calibration, _ = steady.calibrated(est)
    preds = predict(calibration, est, (current, target), current, steady.settings)
    return preds[target].score < preds[current].score * (1 + margin)


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


def _robust(
    ctx: _Context,
    calibration: Calibration,
    est: Estimate,
    current: int,
    candidate: int,
    margin: float,
    unmeasured: float = 0.0,
) -> bool:
    """The candidate scores at least (1 + margin) x the current one at every corner of the
    confidence box: alpha +- z*sigma and request rate x (1 +- z*rel); with ``unmeasured``,
    also with the candidate's step that much slower than the model says (a move no canary
    measures first: `PolicyTuning.unmeasured_step_tolerance`)."""
    t = ctx.tuning
    if unmeasured > 0:
        slowed = calibration.slowed(candidate, 1.0 + unmeasured)
        preds = predict(slowed, est, (current, candidate), current, ctx.settings)
        if preds[candidate].score < preds[current].score * (1 + margin):
            return False
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


def _reprobe_not_due(
    ctx: _Context, est: Estimate, flags: Condition, preds: Mapping[int, ConfigPrediction], scale: float | None,
) -> Decision | None:
    """The hold while the next re-probe is not due, None once it is. The first failed probe
    may have met the tail of a dip: only repeated failures back off. A draft never seen
    above the floor counts as one failure already (probing it is a long shot); one seen
    paying before gets the plain interval."""
    s, memory = ctx.settings, ctx.memory
    never_good = memory.best_alpha is not None and memory.best_alpha < s.acceptance_floor
    exponent = max(0, memory.failed_probes - 1) + (1 if never_good else 0)
    backoff = min(ctx.tuning.reprobe_backoff_max, 2**exponent)
    off_since = ctx.state.since
    wait = off_since + s.reprobe_interval_s * backoff - ctx.now
    if wait <= 0:
        return None
    extra = ""
    if backoff > 1:
        why = [f"after {memory.failed_probes} failed probes"] if memory.failed_probes else []
        why += ["acceptance never seen above the floor"] if never_good else []
        extra = f" (x{backoff}: {', '.join(why)})"
    return _make(
        ctx, Action.HOLD, None, Rule.HOLD,
        f"speculation off since {fmt_s(ctx.now - off_since)} ago; re-probe in {fmt_s(wait)}{extra}",
        metrics=flags, predictions=preds, est=est, scale=scale,
    )


def _reprobe(ctx: _Context, est: Estimate, flags: Condition) -> Decision:
    calibration, scale = ctx.calibrated(est)
    s, t, memory = ctx.settings, ctx.tuning, ctx.memory
    off_since = ctx.state.since
    remembered = memory.best_alpha
    alpha = max(remembered or 0.0, t.default_probe_alpha)
    ks = [k for k in ctx.allowed() if k != OFF]
    preds = predict(calibration, est, ks + [OFF], OFF, s, alpha=alpha)
    best = max(ks, key=lambda k: (preds[k].score, -k)) if ks else None
    waiting = _reprobe_not_due(ctx, est, flags, preds, scale)
    if waiting is not None:
        return waiting
    if best is None:
        return _make(ctx, Action.HOLD, None, Rule.HOLD, "no speculative config is allowed",
                     metrics=flags, predictions=preds, est=est, scale=scale)
    if preds[best].score < preds[OFF].score * (1 + s.tuning.min_gain):
        return _make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"re-probe due, but even at alpha {alpha:.2f} speculation would not pay at "
            f"{est.request_rate:.2f} req/s: predicted {summary(preds, (best, OFF))}",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    conservative = max(0.0, alpha - t.probe_alpha_discount)
    probe_preds = predict(calibration, est, ks, OFF, s, alpha=conservative)
    probe_k = max(ks, key=lambda k: (probe_preds[k].score, -k))
    # Whether a draft carries the last day's peak is judged at the acceptance it was measured
    # at, when that is lower: the probe's assumed acceptance asks whether speculation might pay
    # again, not whether a draft carries a load it was seen not to carry (traced: EAGLE-3 at a
    # measured 0.40, probed at an assumed 0.60, was judged to carry the 235 req/s peak K=1
    # had queued at; promoted at the calm, it met the next peak with 232).
    peak_alpha = conservative if remembered is None else min(conservative, remembered)
    peak_preds = probe_preds if peak_alpha == conservative else predict(calibration, est, ks, OFF, s, alpha=peak_alpha)

    def peak_check(k: int) -> tuple[str | None, str]:
        """(why ``k`` would leave the last day's peak unserved, or None; the reason's note when
        the capacity hedge waives it, else "")."""
        why = _peak_unserved(ctx, calibration, est, peak_preds, k, peak_alpha)
        caught = _hedge_would_catch(ctx, calibration, est, k, peak_alpha) if why is not None else None
        return (why, "") if caught is None else (None, f"; {caught}")

    (unserved, caught), passed_over = peak_check(probe_k), ""
    if unserved is not None:
        carrying = [
            k for k in ks
            if preds[k].score >= preds[OFF].score * (1 + s.tuning.min_gain) and peak_check(k)[0] is None
        ]
        if not carrying:
            return replace(_make(
                ctx, Action.HOLD, None, Rule.HOLD,
                f"re-probe due, but {label(probe_k)} (the fastest at {est.request_rate:.2f} req/s): "
                f"{unserved}; no speculative config that pays carries that load: staying off",
                metrics=flags, predictions=preds, est=est, scale=scale,
            ), peak_probe_alpha=peak_alpha)
        passed_over = f"; not {label(probe_k)}: {unserved}"
        probe_k = max(carrying, key=lambda k: (probe_preds[k].score, -k))
        caught = peak_check(probe_k)[1]
    _, high = _window_rates(ctx, est)
    rollout_capacity = overloading_rollout(calibration, est, (OFF, probe_k), s, high, alpha)
    if rollout_capacity is not None:
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
            f"re-probe due, but at {high:.2f} req/s {label(probe_k)} would be locked in (a "
            f"restart needs the load below {locked.rollout_capacity_rps:.1f} req/s, and at its "
            f"capacity {label(locked.target)} would be {fmt_pct(locked.benefit)} faster): "
            "staying off",
            metrics=flags, predictions=preds, est=est, scale=scale,
        )
    if remembered is not None and remembered >= t.default_probe_alpha:
        source = f"remembered alpha {remembered:.2f}"
    else:
        source = f"assumed alpha {alpha:.2f}"
    reason = (
        f"re-probe after {fmt_s(ctx.now - off_since)} off: with {source} K={probe_k} is "
        f"predicted {fmt_x(preds[probe_k].speedup)} vs off at {est.request_rate:.2f} req/s{passed_over}{caught}"
    )
    return _change(ctx, probe_k, Rule.REPROBE, reason, preds, flags, est, scale, guard=False, alpha=alpha)


def _window_rates(ctx: _Context, est: Estimate) -> tuple[float, float]:
    """(confident, highest) request rate: the lower of the long window's lower confidence
    bound and the short window's rate (a hedge needs the load confidently high and not
    falling), and the higher of both windows' rates (the hedge's release needs both low).
    The short window counts when it has enough requests."""
    lower_bound = est.request_rate * max(0.0, 1.0 - ctx.tuning.confidence_z * est.rate_rel_stderr)
    low, high = lower_bound, est.request_rate
    recent = ctx.observed.guard_request_rate(ctx.settings)
    if recent is not None:
        low, high = min(low, recent), max(high, recent)
    return low, high


def _trend_predates_traffic(ctx: _Context) -> bool:
    """Whether the trend window may reach back before the service's traffic began: its first
    config (the declared one, nothing in history before it) was chosen less than a trend
    window ago. Prometheus divides the requests of a counter born inside the window by the
    whole window, so a load steady since its first minute reads as a rise (in
    `gen-6-04-stationary` a hedge 11 minutes after creation gave up the day's best config).
    A new declaration on a service that served before keeps its history: its trend window
    is the service's, and counts."""
    state = ctx.state
    if state.cause is not Cause.DECLARED or ctx.now - state.since >= ctx.settings.trend_window_s:
        return False
    return not any(entry.time < state.since for entry in state.history)


def _load_rise(ctx: _Context, est: Estimate) -> float | None:
    """How far the long window's request rate is above the trend window's (relative; < 0:
    falling); None when the trend window was not read or saw no request."""
    trend = ctx.observed.trend_rate
    if trend is None or trend <= 0:
        return None
    return est.request_rate / trend - 1.0


def _reach(rate: float, rise: float | None, steep: float) -> float:
    """The load the hedge's zone judges: ``rate``, or, while the load rises at least
    ``steep`` (`PolicyTuning.hedge_steep_rise`), where one more such rise takes it. A load
    that steps past the zone in one go (3 -> 6 req/s against the 4.9 req/s one replica
    carries while the other restarts) is never seen in it: by the time it is, every restart
    overloads the replicas left serving."""
    return rate * (1.0 + rise) if rise is not None and rise >= steep else rate


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


def _peak_unserved(
    ctx: _Context,
    calibration: Calibration,
    est: Estimate,
    preds: Mapping[int, ConfigPrediction],
    k: int,
    alpha: float | None = None,
    unmeasured: float = 0.0,
) -> str | None:
    """Why a move to ``k`` would leave the service short of the load it carried lately, or
    None. ``k`` carries less than the current config and less than the peak of about the last
    day (`memory.recent_peak`), and with maxSurge 0 a restart back at that load would
    overload the replicas left serving: should the peak come back (a daily one does), ``k``
    would be locked into an overload of its own making. (A re-probe at night promoted n-gram
    K=8, 67 % faster per token at a batch of 10, and the next day's peak met it with less
    capacity than the K=3 it had replaced, and speculation off before it.)

    With ``unmeasured`` (a tuning move: `PolicyTuning.unmeasured_step_tolerance`) ``k`` is
    judged with its step that much slower than predicted: the calibration fits the running
    config at today's batch, and ``k``'s capacity is the prior's shape carried to the peak's.
    (On the H200's measured steps n-gram K=4 was predicted to carry 0.1 % more than K=3 at the
    calm; at the next day's overloading peak it carried 0.4 % less on average, up to 3 % less
    where acceptance dipped, and that peak's e2e came out 75 % longer than K=3's.) A re-probe
    passes none: it prices its candidates at a discounted acceptance already, and staying off
    is the alternative it weighs."""
    peak, current = ctx.state.recent_peak_rate, ctx.current
    if peak is None or k == current:
        return None
    carries = preds[k].capacity_rps
    if unmeasured > 0:
        carries = _capacity_unmeasured(calibration, est, k, unmeasured, alpha)
    if carries >= peak or carries >= preds[current].capacity_rps:
        return None
    rollout = overloading_rollout(calibration, est, (k, current), ctx.settings, peak, alpha)
    if rollout is None:
        return None
    margin = f" with its step {unmeasured:.0%} slower than predicted (unmeasured there)" if unmeasured > 0 else ""
    return (
        f"it carries {carries:.1f} req/s{margin} and the load reached {peak:.1f} req/s within the "
        f"last day: should it come back, a restart would load the replicas left serving to "
        f"{peak / rollout:.0%} of the {rollout:.1f} req/s they carry"
    )


def _hedge_would_catch(
    ctx: _Context, calibration: Calibration, est: Estimate, k: int, alpha: float | None = None
) -> str | None:
    """Why the last day's peak need not keep speculation off for ``k``, or None. Speculation
    went off by a capacity hedge (`Memory.hedged_from`): the load's rise to that peak passed
    through the hedge's zone while a restart was still affordable, and a hedge from ``k``
    to speculation off qualifies (off carries ``hedge_min_capacity_gain`` more, and is
    ``hedge_min_benefit`` faster once the load passes ``k``'s capacity). Should the load rise
    the same way again, the hedge moves away from ``k`` as it did before, and speculation pays
    at the calm in between. (In `diurnal-load` speculation stayed off through the evening's
    calm because K=2 carries 37 of the 42 req/s the day reached; re-probed, K=2 measured 30 %
    faster per token there. The oracle re-enables it too.) Only the hedge counts: speculation
    turned off by a fallback or a guard says the rise was not caught in time, and a draft that
    carries about as much as speculation off qualifies for no hedge and would meet the peak
    overloaded."""
    hedged = ctx.memory.hedged_from
    if hedged is None:
        return None
    outlook = hedge_outlook(calibration, est, k, OFF, ctx.settings, alpha=alpha)
    if outlook is None or outlook.benefit < ctx.tuning.hedge_min_benefit:
        return None
    return (
        f"the load's last rise was hedged in time (from {label(hedged)} to off), and a hedge from "
        f"{label(k)} would be too (off carries {config_capacity(calibration, est, OFF, calibration.on.replicas, alpha):.1f} "
        f"req/s, {label(k)} {config_capacity(calibration, est, k, calibration.on.replicas, alpha):.1f})"
    )


def _capacity_unmeasured(
    calibration: Calibration, est: Estimate, k: int, unmeasured: float, alpha: float | None = None
) -> float:
    """What ``k`` carries with its step ``unmeasured`` slower than predicted: a config the
    running one does not measure is the prior's shape carried from today's batch."""
    return config_capacity(calibration.slowed(k, 1.0 + unmeasured), est, k, calibration.on.replicas, alpha)


def _ready_for_peak(
    ctx: _Context,
    calibration: Calibration,
    est: Estimate,
    preds: Mapping[int, ConfigPrediction],
    trapped: Callable[[int], str | None],
) -> tuple[int, str] | None:
    """A config to move to inside the hysteresis, and why: the current config carries less
    than the peak of about the last day (`memory.recent_peak`), with maxSurge 0 a restart at
    that load would overload the replicas left serving, and a config at least as fast now
    carries it (its step ``unmeasured_step_tolerance`` slower than predicted). Should the peak
    come back, the current config meets it in an overload no restart can leave; a move now,
    at a load the rollout carries, costs its restart and no speed. None otherwise (also while
    today's load would overload that rollout: the move waits for a calmer one)."""
    peak, current = ctx.state.recent_peak_rate, ctx.current
    if peak is None:
        return None
    cur = preds[current]
    if cur.capacity_rps >= peak:
        return None
    t = ctx.tuning
    candidates = []
    for k, pred in preds.items():
        if k == current or pred.score < cur.score:
            continue
        carries = _capacity_unmeasured(calibration, est, k, t.unmeasured_step_tolerance)
        if carries < peak:
            continue
        candidates.append((pred.score, -abs(k - current), k, carries))
    for _, _, k, carries in sorted(candidates, reverse=True):
        if trapped(k) is not None:
            continue
        rollout = overloading_rollout(calibration, est, (k, current), ctx.settings, peak)
        if rollout is None:
            return None
        if overloading_rollout(calibration, est, (k, current), ctx.settings, est.request_rate) is not None:
            return None
        return k, (
            f"ready for the peak: {ctx.state.config_label} carries {cur.capacity_rps:.1f} req/s and the load "
            f"reached {peak:.1f} req/s within the last day, where a restart would load the replicas "
            f"left serving to {peak / rollout:.0%} of the {rollout:.1f} req/s they carry; {label(k)} "
            f"carries {carries:.1f} req/s (its step {t.unmeasured_step_tolerance:.0%} slower than "
            f"predicted) and is no slower now (predicted {summary(preds, (k, current))})"
        )
    return None


def _exit_closed(
    ctx: _Context, calibration: Calibration, est: Estimate, k: int, rate: float
) -> str | None:
    """Why a move to the longer draft ``k`` would shut the acceptance floor's way out, or
    None. With maxSurge 0 the floor waits while a rollout would overload the replicas left
    serving (rule 6); a longer draft carries less the lower acceptance falls, so at today's
    load, should acceptance fall to the floor, the service would have to hold ``k`` for as
    long as the low acceptance and the load last: the longest drafts lose the most exactly
    then (n-gram traffic that turns to open chat). The move must leave the floor a rollout
    the replicas left serving carry at ``restart_max_rollout_load``, with acceptance at the
    floor."""
    current, s = ctx.current, ctx.settings
    if k <= current or k == OFF:
        return None
    exit_config = min(ctx.allowed())
    capacity = overloading_rollout(calibration, est, (k, exit_config), s, rate, alpha=s.acceptance_floor)
    if capacity is None:
        return None
    return shut_way_out(rate, capacity, s.acceptance_floor, exit_config)


def _tune(ctx: _Context, est: Estimate, flags: Condition) -> Decision:
    calibration, scale = ctx.calibrated(est)
    s, t = ctx.settings, ctx.tuning
    current = ctx.current
    preds = predict(calibration, est, ctx.allowed(), current, s)
    cur = preds[current]
    context = (
        f"at {est.request_rate:.2f} req/s (batch {est.batch_per_replica or 0:.0f}/replica), "
        f"alpha {fmt_alpha(est)} over {est.draft_tokens:.0f} drafted tokens"
    )

    def hold(reason: str) -> Decision:
        return _make(ctx, Action.HOLD, ctx.state.k, Rule.HOLD, reason,
                     metrics=flags, predictions=preds, est=est, scale=scale)

    low, high = _window_rates(ctx, est)
    rise = _load_rise(ctx, est)
    # A config chosen less than a trend window ago (at creation: the service itself) may have
    # a trend window that reads the time before the traffic began: the projection waits.
    steep = t.hedge_steep_rise if ctx.now - ctx.state.since >= s.trend_window_s else math.inf
    reach, high_reach = _reach(low, rise, steep), _reach(high, rise, steep)
    hedge = best_hedge(calibration, est, current, preds, s, reach, t.hedge_zone, high)
    unneeded = ""
    if hedge is not None:
        no_rise = None
        if rise is not None and rise < t.hedge_min_rise:
            # Insurance against a rise is bought while the load rises; one that sits in the
            # zone would pay the premium every day for a rise nothing shows.
            no_rise = (
                f"the load is not rising ({rise:+.0%} over the "
                f"{fmt_s(s.trend_window_s)} window's {ctx.observed.trend_rate:.2f} req/s, "
                f"{t.hedge_min_rise:.0%} needed)"
            )
        elif _trend_predates_traffic(ctx):
            no_rise = (
                f"the service began {fmt_s(ctx.now - ctx.state.since)} ago: its {fmt_s(s.trend_window_s)} "
                f"trend window reads the time before its traffic, and a rise from none is no rise"
            )
        if no_rise is not None:
            unneeded = (
                f"; in the capacity hedge's zone ({low:.2f} req/s near the "
                f"{hedge.rollout_capacity_rps:.1f} req/s the replicas left serving during a rollout carry), "
                f"but {no_rise}"
            )
            hedge = None
    # The short window's acceptance when it moved confidently away from the long window's
    # (None: it did not); rising, it is a recovery the long window has not caught up with.
    shift = _alpha_shift(ctx, est)
    recovering = shift if shift is not None and shift > est.alpha else None
    if hedge is not None and recovering is not None and best_hedge(
        calibration, est, current, preds, s, low, t.hedge_zone, high, alpha=recovering
    ) is None:
        return hold(
            f"capacity hedge to {label(hedge.target)} at alpha {est.alpha:.2f}, but acceptance is "
            f"recovering ({recovering:.2f} on the {fmt_s(s.guard_window_s)} window): at that "
            f"acceptance {ctx.state.config_label} is out of the hedge zone; keeping {ctx.state.config_label} {context}"
        )
    if hedge is not None:
        reason = f"capacity hedge: {describe_hedge(hedge, reach)}"
        if reach > low:
            reason += (f"; {reach:.2f} req/s is where one more such rise takes the load from {low:.2f} req/s "
                       f"(the {fmt_s(s.window_s)} window's {est.request_rate:.2f} req/s is {rise:+.0%} over the "
                       f"{fmt_s(s.trend_window_s)} window's {ctx.observed.trend_rate:.2f})")
        return _change(ctx, hedge.target, Rule.HEDGE, reason, preds, flags, est, scale, guard=False)
    # The best config that does not walk into the hedge zone nor shut the floor's way out
    # (checked lazily, best first).
    ranked = sorted(preds, key=lambda k: (preds[k].score, -abs(k - current), -k), reverse=True)

    def trapped(k: int) -> str | None:
        hedge_back = _locked_in(ctx, calibration, est, preds, k, high_reach)
        if hedge_back is not None:
            return (
                f"it would be locked in (a restart needs the load below "
                f"{hedge_back.rollout_capacity_rps:.1f} req/s, and at its capacity "
                f"{label(hedge_back.target)} would be {fmt_pct(hedge_back.benefit)} faster)"
            )
        return _exit_closed(ctx, calibration, est, k, high) or _peak_unserved(
            ctx, calibration, est, preds, k, unmeasured=t.unmeasured_step_tolerance
        )

    wanted, locked = ranked[0], None
    best = wanted
    for k in ranked:
        if trapped(k) is None:
            best = k
            break
    scores = {k: p.score for k, p in preds.items()}
    longest, shorter = best, shortest_near_best(scores, best, current, t.min_gain)
    if (shorter != best and trapped(shorter) is None
            and backing_off(ctx.settings, ctx.state, shorter, ctx.now) is None):
        best = shorter
    # What the model alone would have chosen, and why it is not the choice.
    untrapped = shortest_near_best(scores, wanted, current, t.min_gain)
    if untrapped != best:
        why = trapped(untrapped)
        locked = None if why is None else f"{label(untrapped)} ({fmt_x(preds[untrapped].speedup)}): {why}"
    best_pays = best != current and preds[best].score >= cur.score * (1 + t.min_gain)
    if locked is not None and not best_pays and preds[wanted].score >= cur.score * (1 + t.min_gain):
        return hold(f"at {high:.2f} req/s no faster config is safe to enter: {locked}; keeping {ctx.state.config_label} {context}")
    if best == current or preds[best].score < cur.score * (1 + t.min_gain):
        ready = _ready_for_peak(ctx, calibration, est, preds, trapped)
        if ready is not None:
            target, why = ready
            return _change(ctx, target, Rule.PEAK_READINESS, f"{why} {context}", preds, flags, est, scale,
                           guard=False, price_allowance=t.peak_readiness_price)
        runner = max((k for k in preds if k != current), key=lambda k: preds[k].score, default=None)
        comparison = summary(preds, (current, runner) if runner is not None else (current,))
        return hold(
            f"{ctx.state.config_label} is best within {t.min_gain:.0%}: predicted {comparison} {context}{unneeded}"
        )
    # A long window that mixes two regimes of acceptance (the short one moved away from it)
    # picks a K for neither: wait until it has caught up, when the newer reading would choose
    # clearly otherwise. (An EAGLE head back from a topic shift went K=1 -> K=2 on the mixed
    # window, then K=2 -> K=3 half an hour later: two restarts for one change.)
    at_shift = None if shift is None else predict(calibration, est, ctx.allowed(), current, s, alpha=shift)
    if at_shift is not None and _regret(at_shift, best) - _regret(preds, best) > t.min_gain:
        fastest = max(at_shift, key=lambda k: at_shift[k].score)
        return hold(
            f"{label(best)} predicted {fmt_x(preds[best].speedup)}, but acceptance is moving ({shift:.2f} on "
            f"the {fmt_s(s.guard_window_s)} window against {est.alpha:.2f} on the {fmt_s(s.window_s)} one) "
            f"and at {shift:.2f} {label(best)} would be {_slower_text(_regret(at_shift, best))} than "
            f"{label(fastest)}: keeping {ctx.state.config_label} until the long window has caught up {context}"
        )
    if not _robust(ctx, calibration, est, current, best, margin=0.0):
        return hold(
            f"{label(best)} predicted {fmt_x(preds[best].speedup)} but not at every corner of "
            f"the confidence box; keeping {ctx.state.config_label} {context}"
        )
    # The recent low judges the move the model prefers (the longest draft within the
    # hysteresis): acceptance that swung that far lately says no longer draft is a safe bet,
    # even one the model says would survive the swing (bursty n-gram traffic: a canary and a
    # fallback cost more than the shorter draft could win).
    low = _reversion_loss(ctx, calibration, est, current, longest)
    if low is not None:
        return hold(
            f"{label(longest)} predicted {fmt_x(preds[longest].speedup)}, but acceptance was "
            f"{low:.2f} within the last hour and, should it return there, {label(longest)} "
            f"loses more than it gains now; keeping {ctx.state.config_label} {context}"
        )
    reason = f"predicted {summary(preds, (best, current))} {context}"
    if locked is not None:
        reason += f"; not {locked}"
    if best != longest:
        reason += (f"; {label(longest)} ({fmt_x(preds[longest].speedup)}) is within {t.min_gain:.0%} of "
                   f"{label(best)}, and the shorter draft loses less if acceptance falls or the load rises")
    return _change(ctx, best, Rule.TUNE, reason, preds, flags, est, scale, guard=False)


# --- planner mode (`PolicyTuning.planner`): the receding-horizon plan decides tuning and re-probes


def _reprobe_planned(ctx: _Context, est: Estimate, flags: Condition) -> Decision:
    calibration, scale = ctx.calibrated(est)
    s, t, memory = ctx.settings, ctx.tuning, ctx.memory
    off_since = ctx.state.since
    remembered = memory.best_alpha
    alpha = max(remembered or 0.0, t.default_probe_alpha)
    ks = [k for k in ctx.allowed() if k != OFF]
    preds = predict(calibration, est, ks + [OFF], OFF, s, alpha=alpha)
    waiting = _reprobe_not_due(ctx, est, flags, preds, scale)
    if waiting is not None:
        return waiting
    if not ks:
        return _make(ctx, Action.HOLD, None, Rule.HOLD, "no speculative config is allowed",
                     metrics=flags, predictions=preds, est=est, scale=scale)
    # The probe is planned like any move, at a slightly lower acceptance than remembered (a
    # probe that fails costs two restarts): the plan prices its restarts, the forecast's
    # peaks and a config that could not carry them.
    conservative = max(0.0, alpha - t.probe_alpha_discount)
    planned = plan_now(calibration, est, s, OFF, ctx.allowed(), ctx.forecast(est), alpha=conservative)
    if remembered is not None and remembered >= t.default_probe_alpha:
        source = f"remembered alpha {remembered:.2f}"
    else:
        source = f"assumed alpha {alpha:.2f}"
    if planned.first == OFF or planned.plan.gain < t.min_gain:
        return replace(_make(
            ctx, Action.HOLD, None, Rule.HOLD,
            f"re-probe due, but with {source} (planned at {conservative:.2f}) speculation would not pay: "
            f"{planned.describe(OFF)}; staying off at {est.request_rate:.2f} req/s",
            metrics=flags, predictions=preds, est=est, scale=scale,
        ), plan=planned.summary(OFF))
    probe_k = int(planned.first)
    # A probe is a move like any other: it must be worth its restarts in the other plausible
    # futures too (above all the recent peak's: a probe at the calm into a K that cannot
    # carry the peak that came today runs into it tomorrow).
    held = _worth_across_futures(
        ctx, planned, _other_futures(ctx, calibration, est, OFF, probe_k, alpha=conservative), OFF,
        f"staying off at {est.request_rate:.2f} req/s",
    )
    if held is not None:
        return replace(_make(ctx, Action.HOLD, None, Rule.HOLD, f"re-probe due, but {held}", metrics=flags,
                             predictions=preds, est=est, scale=scale), plan=planned.summary(OFF))
    reason = (
        f"re-probe after {fmt_s(ctx.now - off_since)} off: with {source} {planned.describe(OFF)}; "
        f"K={probe_k} predicted {fmt_x(preds[probe_k].speedup)} vs off at {est.request_rate:.2f} req/s"
    )
    decision = _change(ctx, probe_k, Rule.REPROBE, reason, preds, flags, est, scale, guard=False, alpha=alpha,
                       priced=True)
    return replace(decision, plan=planned.summary(OFF))


def _tune_planned(ctx: _Context, est: Estimate, flags: Condition) -> Decision:
    """Tuning: the planner's first move (`planning.plan_now`) over the forecast of the
    service's own load, restarts and queues included; a move must improve the plan's
    headline score by the hysteresis (``min_gain``) against the best plan that keeps the
    running config now."""
    calibration, scale = ctx.calibrated(est)
    s, t = ctx.settings, ctx.tuning
    current = ctx.current
    preds = predict(calibration, est, ctx.allowed(), current, s)
    context = (
        f"at {est.request_rate:.2f} req/s (batch {est.batch_per_replica or 0:.0f}/replica), "
        f"alpha {fmt_alpha(est)} over {est.draft_tokens:.0f} drafted tokens"
    )
    planned = plan_now(calibration, est, s, current, ctx.allowed(), ctx.forecast(est))
    summary_ = planned.summary(current)
    target = planned.first
    if target == current or planned.plan.gain < t.min_gain:
        why = "" if target == current else f" (the move to {label(target)} gains less than {t.min_gain:.0%})"
        held = _make(ctx, Action.HOLD, ctx.state.k, Rule.HOLD,
                     f"{planned.describe(current)}{why}: keeping {ctx.state.config_label} {context}",
                     metrics=flags, predictions=preds, est=est, scale=scale)
        return replace(held, plan=summary_)
    reason = f"{planned.describe(current)}; predicted {summary(preds, (int(target), current))} {context}"
    futures = _other_futures(ctx, calibration, est, current, int(target))
    held = _worth_across_futures(ctx, planned, futures, current, f"keeping {ctx.state.config_label} {context}")
    if held is not None:
        return replace(_make(ctx, Action.HOLD, ctx.state.k, Rule.HOLD, held, metrics=flags, predictions=preds,
                             est=est, scale=scale), plan=summary_)
    # Value of information: a move that needs the model's point estimates is measured on a
    # canary first, where canaries are on and the replicas left serving carry its start. A
    # canary measures the present, so it judges only a move that pays at the present load: a
    # move made for the forecast (a peak the cycle brings back) would be refused by a verdict
    # taken at the calm it leaves (`gen-313-19-swing-x2`: K=6 kept into the second peak).
    pays_now = next((gain for kind, _, gain in futures if kind == PRESENT_FUTURE), planned.plan.gain) >= t.min_gain
    canary = (s.experiments is not None and pays_now and not _sure(ctx, calibration, est, current, int(target))
              and overloading_rollout(calibration, est, (current, int(target)), s,
                                      ctx.observed.highest_request_rate(s)) is None)
    if canary:
        reason += "; the move does not win where the model is unsure (acceptance at its bound, the new config's step slower than predicted)"
    rule = Rule.TUNE if canary else Rule.PLAN
    decision = _change(ctx, int(target), rule, reason, preds, flags, est, scale, guard=False, priced=True)
    return replace(decision, plan=summary_)


PRESENT_FUTURE = "present"
PEAK_FUTURE = "peak"
LOW_ALPHA_FUTURE = "low acceptance"


def _worth_across_futures(
    ctx: _Context, planned: PolicyPlan, futures: Sequence[tuple[str, str, float]], current: int, keeping: str,
) -> str | None:
    """Why a planned move is held, or None where it is worth its restart on average over the
    future it was planned for and the others as plausible (`_other_futures`). Each gain is
    clipped to +-100 %: an overload avoided in one future must not buy any loss in the others."""
    if not futures:
        return None
    t = ctx.tuning
    gains = [planned.plan.gain] + [gain for _, _, gain in futures]
    worth = math.fsum(max(-1.0, min(1.0, g)) for g in gains) / len(gains)
    if worth >= t.min_gain:
        return None
    others = "; ".join(f"{what}: {gain:+.1%}" for _, what, gain in futures)
    return (f"{planned.describe(current)}, but {others} (worth {worth:+.1%} on average, "
            f"{t.min_gain:.0%} needed): {keeping}")


def _other_futures(
    ctx: _Context, calibration: Calibration, est: Estimate, current: int, target: int,
    alpha: float | None = None,
) -> list[tuple[str, str, float]]:
    """(kind, words, gain): what moving to ``target`` now gains in the futures the plan did not
    plan for but that are as plausible:

    - the present load staying (where the forecast sees a trend or a cycle);
    - the recent peak returning (`ControlState.recent_peak_rate`, where it lies
      ``peak_future_rise`` above today's load): a day's peak comes back, and a move at the
      calm to a config that cannot carry it runs into the next peak with no restart
      affordable (`gen-313-19-swing-x2`);
    - acceptance returning to its recent low (`ControlState.recent_low_alpha`, when it lies
      ``reversion_min_drop`` below today's: bursty n-gram traffic lures K up for as long as a
      burst lasts).

    ``alpha``: the acceptance the move was planned at (default the window's)."""
    s, t = ctx.settings, ctx.tuning
    expected = ctx.forecast(est)
    load = expected.rates[0]  # the first slot's: what the next 15 minutes bring
    out = []
    if expected.method != "present":
        present = Forecast(tuple(load for _ in SLOTS), "present")
        out.append((PRESENT_FUTURE, f"should the load stay at {load:.3g} req/s the move gains",
                    plan_now(calibration, est, s, current, ctx.allowed(), present, alpha=alpha).move_gain(target)))
    peak, words = ctx.state.recent_peak_rate, "should the recent peak of {:.3g} req/s return it gains"
    history = ctx.state.load_history
    if load > 0 and (history.start is None or ctx.now - history.start < t.history_day_s):
        # Less than a day of history cannot say that no peak comes: the first one is met
        # with the headroom kept, not with a restart at its start (`gen-311-21-swing-x2`).
        surge = load * (1.0 + t.unseen_surge_rise)
        if peak is None or surge > peak:
            peak, words = surge, "should the load rise to {:.3g} req/s (less than a day of history says nothing of peaks) it gains"
    # Only a move that gives capacity away risks a peak: one that gains capacity is the way
    # to meet it, and a future neither config carries cannot tell them apart.
    if peak is not None and load > 0 and peak >= load * (1.0 + t.peak_future_rise) and _gives_capacity(
        calibration, est, current, target, alpha
    ):
        returns = Forecast((load,) + tuple(peak for _ in SLOTS[1:]), "peak")
        out.append((PEAK_FUTURE, words.format(peak),
                    plan_now(calibration, est, s, current, ctx.allowed(), returns, alpha=alpha).move_gain(target)))
    low = ctx.state.recent_low_alpha
    at = est.alpha if alpha is None else alpha
    if at is not None and low is not None and low <= at - t.reversion_min_drop:
        at_low = plan_now(calibration, est, s, current, ctx.allowed(), expected, alpha=low)
        out.append((LOW_ALPHA_FUTURE, f"should acceptance return to its recent low {low:.2f} it gains",
                    at_low.move_gain(target)))
    return out


def _gives_capacity(calibration: Calibration, est: Estimate, current: int, target: int, alpha: float | None) -> bool:
    """``target`` carries less than ``current`` (by the calibrated model, at ``alpha``)."""
    replicas = max(1, calibration.on.replicas)
    return (config_capacity(calibration, est, target, replicas, alpha)
            < config_capacity(calibration, est, current, replicas, alpha))


def _sure(ctx: _Context, calibration: Calibration, est: Estimate, current: int, target: int) -> bool:
    """Whether the plan still moves to ``target`` at the pessimistic end of what it is unsure
    of: acceptance at its confidence bound on the side that favours staying (lower for more
    drafting, higher for less) and ``target``'s step ``unmeasured_step_tolerance`` slower than
    predicted (the running config calibrates the model; the target's cost is the prior's shape
    carried over). A move that needs the point estimates is worth a canary's measurement."""
    t = ctx.tuning
    alpha, stderr = est.alpha, est.alpha_stderr
    if alpha is not None and stderr is not None:
        shift = t.confidence_z * stderr
        alpha = max(0.0, alpha - shift) if target > current else min(0.995, alpha + shift)
    slowed = calibration.slowed(target, 1.0 + t.unmeasured_step_tolerance)
    planned = plan_now(slowed, est, ctx.settings, current, ctx.allowed(), ctx.forecast(est), alpha=alpha)
    return planned.first == target and planned.plan.gain >= t.min_gain


# --- assembling decisions ------------------------------------------------------------------


def shortest_near_best(scores: Mapping[int, float], best: int, current: int, tolerance: float) -> int:
    """The shortest draft the model cannot tell from ``best`` (predicted within
    ``tolerance``, the tuning hysteresis) on the way of a move from ``current``; ``best``
    when there is none.

    Predictions closer than the hysteresis are not trusted apart, but they are not alike in
    risk. A longer draft is a bet that acceptance stays where it was measured: every step
    drafts and verifies K tokens and only the accepted ones pay, so the K that wins by a hair
    at today's acceptance loses the most when acceptance falls, and the service runs whatever
    it moved to for as long as a restart is unaffordable (n-gram at acceptance 0.7 predicts
    K=8 2-3 % above K=6; at 0.14 K=8 is 13 % slower than K=6 and 33 % slower than K=3). It is
    also a bet that the load stays: a shorter draft carries more past the crossover.

    - A move to a longer draft (``best`` > ``current``): the shortest draft longer than
      ``current`` that still beats it by the hysteresis (it is the bet the move makes).
    - A move to a shorter draft: the shortest draft (not speculation off, which is a move of
      its own) that beats ``current`` at all; the move is made for ``best``'s gain, and the
      shorter draft takes less of both bets. (Generated `gen-8-19-swing-x2`, seed 8: an EAGLE
      head at acceptance 0.33 moved from K=3 to K=2, 1.05x at the calm as K=1 was, and fell
      back to off at the first peak, past 200 req/s, where K=1 carries both peaks with no
      restart: 0.28, and 0.68 with K=1.)"""
    if best == OFF or best == current or current == OFF:
        return best
    if best < current:
        shorter = [k for k in scores if OFF < k < best and scores[k] >= scores[best] / (1.0 + tolerance)
                   and scores[k] > scores.get(current, 0.0)]
        return min(shorter, default=best)
    bar = max(scores[best] / (1.0 + tolerance), scores.get(current, 0.0) * (1.0 + tolerance))
    longer = [k for k in scores if current < k < best and scores[k] >= bar]
    return min(longer, default=best)


def _change(
    ctx: _Context,
    target: int,
    rule: Rule,
    reason: str,
    preds: Mapping[int, ConfigPrediction] | Sequence[ConfigPrediction],
    flags: Condition,
    est: Estimate | None,
    scale: float | None,
    *,
    guard: bool,
    alpha: float | None = None,
    price_allowance: float = 0.0,
    priced: bool = False,
) -> Decision:
    """A change to ``target``, unless the restart price, cooldown or budget forbids it.

    ``alpha`` is the acceptance the predictions assumed (a re-probe's), default the estimate's.
    ``price_allowance``: the latency the move may cost over the payback horizon, restart
    included (a move whose worth the horizon does not see: `_ready_for_peak`). ``priced``:
    the move comes from the planner, which priced its restart over the whole horizon already.
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
        calibration, _ = ctx.calibrated(est)
        _, high = _window_rates(ctx, est)
        capacity = overloading_rollout(calibration, est, (current, target), s, high)
        if capacity is not None:
            outlook = switch_outlook(
                calibration, est, current, target, s, horizon_s=t.guard_payback_horizon_s
            )
            if not outlook.pays(t.min_switch_saving):
                held = (
                    f"would move to {label(target)} ({reason}), but at {high:.2f} req/s the "
                    f"rollout would load the replicas left serving to {high / capacity:.0%} of "
                    f"the {capacity:.1f} req/s they carry and not repay itself within "
                    f"{fmt_s(t.guard_payback_horizon_s)}: holding until the load allows a "
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
        not priced
        and rule not in FLOOR_RULES | {Rule.BOUNDS, Rule.HEDGE}
        and est is not None
        and current in pred_map
        and target in pred_map
    ):
        calibration, _ = ctx.calibrated(est)
        horizon = t.guard_payback_horizon_s if guard else t.payback_horizon_s
        outlook = switch_outlook(calibration, est, current, target, s, alpha, horizon)
        pays = outlook.pays(t.min_switch_saving)
        affordable = price_allowance > 0 and outlook.saving >= -price_allowance
        if not pays and not affordable:
            held = _make(
                ctx, Action.HOLD, keep, rule,
                f"would move to {label(target)} ({reason}), but over "
                f"{fmt_s(horizon)} the restart ({fmt_s(outlook.rollout_s)}) makes "
                f"it {fmt_pct(-outlook.saving)} slower than staying"
                f"{f' (at most {price_allowance:.0%} for this move)' if price_allowance > 0 else ''}"
                f"{_surge_would_pay(calibration, est, current, target, s, alpha, horizon)}",
                metrics=flags, predictions=pred_map, est=est, scale=scale,
            )
            return replace(held, held=Held.PRICE, wanted=rule)
        if pays:
            reason = (
                f"{reason}; switching saves {fmt_pct(outlook.saving)} of latency over "
                f"{fmt_s(horizon)}, restart included"
            )
        else:
            reason = (
                f"{reason}; switching costs {fmt_pct(max(0.0, -outlook.saving))} of latency over "
                f"{fmt_s(horizon)}, restart included (at most {price_allowance:.0%} for this move)"
            )

    if ctx.acting and rule is not Rule.BOUNDS:
        if not guard and memory.last_change_at is not None:
            cooldown_left = memory.last_change_at + s.cooldown_s - ctx.now
            if cooldown_left > 0:
                return replace(_make(
                    ctx, Action.HOLD, keep, Rule.COOLDOWN,
                    f"would move to {label(target)} ({reason}), but the cooldown has "
                    f"{fmt_s(cooldown_left)} left",
                    metrics=flags, predictions=pred_map, est=est, scale=scale,
                ), held=Held.COOLDOWN, wanted=rule)
        budget = s.max_changes_per_hour
        if not guard:
            budget = max(0, budget - t.reserved_guard_changes) if budget > 1 else budget
        if memory.changes_last_hour >= budget:
            return replace(_make(
                ctx, Action.HOLD, keep, Rule.BUDGET,
                f"would move to {label(target)} ({reason}), but {memory.changes_last_hour} "
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
    metrics: Condition,
    predictions: Mapping[int, ConfigPrediction] | None = None,
    est: Estimate | None = None,
    scale: float | None = None,
    enabled: bool | None = None,
    applied: bool | None = None,
) -> Decision:
    if enabled is None:
        enabled = ctx.state.enabled if action is Action.HOLD else k is not None
    if ctx.settings.mode is AutotuneMode.OFF:
        enabled = True
    if not enabled:
        k = None
    preds = dict(predictions or {})
    effective = _effectiveness(ctx, preds, est)
    if applied is None:
        applied = ctx.acting and action is not Action.HOLD
    return Decision(
        action=action,
        enabled=enabled,
        k=k,
        reason=reason,
        rule=rule,
        applied=applied,
        metrics_available=bool(metrics.status),
        metrics_reason=metrics.reason,
        metrics_message=metrics.message,
        speculation_effective=effective.status,
        effective_reason=effective.reason,
        effective_message=effective.message,
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
) -> Condition:
    """SpeculationEffective: on and predicted at least as fast as off."""
    state = ctx.state
    if ctx.settings.mode is AutotuneMode.OFF:
        return Condition(None, constants.REASON_DISABLED_BY_USER, "autotune is Off: not evaluated")
    if not state.enabled:
        return Condition(False, constants.REASON_SPECULATION_OFF, "speculation is off")
    current = ctx.current
    if OFF not in preds or current not in preds or est is None:
        return Condition(None, constants.REASON_NOT_ENOUGH_SAMPLES, "not evaluated yet")
    vs_off = preds[OFF].e2e_mean_s / preds[current].e2e_mean_s if math.isfinite(
        preds[current].e2e_mean_s
    ) else 0.0
    acceptance = f"alpha {fmt_alpha(est)} over {est.draft_tokens:.0f} drafted tokens"
    message = (
        f"{ctx.state.config_label}: {acceptance}; predicted {fmt_x(vs_off)} vs off at "
        f"{est.request_rate:.2f} req/s"
    )
    if vs_off >= 1.0:
        return Condition(True, constants.REASON_SPECULATION_ON, message)
    return Condition(False, constants.REASON_SPECULATION_OFF, message)
