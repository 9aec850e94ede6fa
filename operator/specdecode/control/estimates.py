"""Observations and estimates: what the metrics say of the current config (load,
acceptance and their uncertainty), the calibrated performance model, and its predictions
of each config and of a switch (restart included)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from specdecode import constants
from specdecode.control import memo
from specdecode.control import perfmodel
from specdecode.control.decision import ConfigPrediction
from specdecode.control.settings import PolicySettings, PolicyTuning
from specdecode.control.metrics import LATENCY_QUANTILE, Observation, confident_quantile
from specdecode.control.perfmodel import OFF, EngineParams, Workload


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
    trend_rate: float | None = None
    """Finished requests per second of the whole service (every config, so a restart does not
    reset it) over the trend window (`PolicySettings.trend_window_s`); None when unread."""

    def guard_request_rate(self, settings: PolicySettings) -> float | None:
        """The short window's request rate when it saw enough requests to count (its share of
        `min_requests`, at least 3); None otherwise. It tells a load that just moved from the
        long window's average."""
        guard = self.guard
        if guard is None or guard.idle:
            return None
        fraction = settings.guard_window_s / settings.window_s
        return guard.request_rate if guard.requests >= max(3.0, settings.min_requests * fraction) else None

    def highest_request_rate(self, settings: PolicySettings) -> float:
        """The load a restart now would have to carry: the higher of the long window's and the
        short window's (when it counts, `guard_request_rate`), each what arrives where the
        replicas are past their capacity and what finishes elsewhere
        (`Observation.restart_load`)."""
        assert self.window is not None
        margin = settings.tuning.past_capacity_margin
        load = self.window.restart_load(margin)
        if self.guard_request_rate(settings) is None:
            return load
        assert self.guard is not None
        return max(load, self.guard.restart_load(margin))

    @classmethod
    def unavailable(cls, message: str, reason: str = constants.REASON_METRICS_MISSING) -> "PolicyObservations":
        return cls(False, None, None, reason, message)

    @classmethod
    def of(
        cls, window: Observation | None, guard: Observation | None, trend_rate: float | None = None
    ) -> "PolicyObservations":
        return cls(True, window, guard, trend_rate=trend_rate)


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
    e2e_p95_low_s: float | None = None
    """What the window's P95 e2e latency is at least, at the confidence box's width
    (`metrics.confident_quantile`); None without a histogram."""
    tpot_p95_low_s: float | None = None
    """The same for the P95 time per output token."""


_DEFAULT_PROMPT_TOKENS = 1000.0
_DEFAULT_OUTPUT_TOKENS = 300.0


def binomial_stderr(p: float, trials: float, overdispersion: float) -> float:
    """Standard error of a proportion ``p`` over ``trials``, its variance inflated by
    ``overdispersion`` (tokens of one request are correlated) and kept above 1e-4 so that a
    rate of 0 or 1 is never certain. The project's one standard-error formula."""
    return math.sqrt(max(p * (1 - p), 1e-4) * overdispersion / max(trials, 1.0))


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
        stderr = binomial_stderr(pooled, spec.alpha_trials, tuning.overdispersion)
        alpha, decay = fit_acceptance(spec.drafts, spec.known_positions, tuning)
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
        e2e_p95_low_s=confident_quantile(
            obs.e2e_buckets, LATENCY_QUANTILE, requests, tuning.confidence_z, tuning.overdispersion),
        tpot_p95_low_s=confident_quantile(
            obs.tpot_buckets, LATENCY_QUANTILE, requests, tuning.confidence_z, tuning.overdispersion),
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


def step_scale(params: EngineParams, k: perfmodel.Config, est: Estimate) -> float | None:
    """Measured mean step time / the prior's step time at the observed batch (None: unknown);
    a schedule's step is the one of the K its range gives that batch."""
    if est.step_time_s is None or est.batch_per_replica is None or est.batch_per_replica <= 0:
        return None
    replicas = max(1, params.replicas)
    context = est.prompt_tokens + est.output_tokens / 2.0
    prefill = est.request_rate / replicas * est.prompt_tokens * est.step_time_s
    model = perfmodel.step_time(params, k, est.batch_per_replica, context, prefill)
    if model <= 0:
        return None
    return est.step_time_s / model


def kv_scale(params: EngineParams, k: perfmodel.Config, est: Estimate, tuning: PolicyTuning) -> float | None:
    """Measured / prior KV-cache memory of a replica (None: unknown).

    The KV usage gauge over the running batch gives the tokens one replica holds:
    ``batch x (prompt + output/2 + K) / usage``; with speculation on that is what is left
    after the proposer's weights and KV, so the prior's draft sizes convert it back to the
    memory both sides share (a smaller GPU shrinks them alike). Usage below
    ``min_kv_usage`` is too small a signal."""
    usage, batch = est.kv_usage, est.batch_per_replica
    if usage is None or batch is None or batch <= 0 or usage < tuning.min_kv_usage:
        return None
    drafted = k.k_at(batch) if isinstance(k, perfmodel.Schedule) else k
    held = batch * (est.prompt_tokens + est.output_tokens / 2.0 + drafted) / usage
    loaded = perfmodel.config_max_k(k) != OFF  # a schedule's draft stays loaded at K 0
    memory = held * (1.0 + params.draft_kv_ratio) + params.draft_weight_tokens if loaded else held
    lo, hi = tuning.kv_scale_bounds
    return min(hi, max(lo, memory / params.kv_capacity_tokens))


def scaled_params(
    params: EngineParams, scale: float, decay: float | None, kv: float | None = None
) -> EngineParams:
    """The prior with every time cost multiplied by ``scale`` (and the fitted decay, and the
    KV memory by ``kv``), rounded to 1% / 0.01 / 2% (their noise is larger)."""
    scale = round_rel(scale, 0.01)
    if decay is not None:
        decay = round(decay, 2)
    if kv is not None:
        kv_tokens = int(round(params.kv_capacity_tokens * round_rel(kv, 0.02)))
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
    slower: tuple[int, float] | None = None
    """(config, factor): that one config's time costs multiplied by the factor (`slowed`)."""
    running: perfmodel.Schedule | None = None
    """The schedule in effect, if any. The rules name the running config by its largest K
    (what sizes the engine), and a plain K of that size is no option while the schedule
    runs (a move to it changes nothing the rules compare); so that K is modelled as the
    schedule, step by step at the K its range gives the batch. Modelled as the plain largest
    K, staying was priced at a K the engine does not run: an n-gram schedule drafting K=3 at
    a peak's batch of 1,000 was priced as K=8, twice as slow, and the move to speculation off
    waited 49 minutes for its price (`gen-9-05-swing-x2`)."""

    def params_for(self, k: int) -> EngineParams:
        params = self.off if k == OFF else self.on
        if self.slower is not None and self.slower[0] == k:
            params = scaled_params(params, self.slower[1], None)
        return params

    def config(self, k: int) -> perfmodel.Config:
        """What config ``k`` runs as: the schedule in effect for its largest K, else ``k``."""
        if self.running is not None and k == self.running.max_k:
            return self.running
        return k

    def slowed(self, k: int, factor: float) -> "Calibration":
        """The same calibration with config ``k``'s step ``factor`` times slower: a config
        the running one does not measure is the prior's shape extrapolated from this load."""
        return replace(self, slower=(k, factor))


def round_rel(value: float, step: float) -> float:
    """``value`` rounded to a relative resolution (``step`` = 0.01: 1%)."""
    if value <= 0 or not math.isfinite(value):
        return value
    exponent = round(math.log(value) / math.log1p(step))
    return math.exp(exponent * math.log1p(step))


def workload_of(est: Estimate, alpha: float | None, rate_factor: float = 1.0) -> Workload:
    """The model's workload from an estimate, rounded to the estimate's resolution (1% for
    rates and token counts, 0.005 for alpha): far below the measurement noise, and it lets
    `_phase` reuse evaluations."""
    return Workload(
        request_rate=round_rel(max(0.0, est.request_rate * rate_factor), 0.01),
        prompt_tokens=max(1.0, round_rel(est.prompt_tokens, 0.01)),
        output_tokens=max(1.0, round_rel(est.output_tokens, 0.01)),
        temperature=0.0,
        acceptance=round(min(0.995, max(0.0, alpha if alpha is not None else 0.0)) * 200) / 200,
    )


@memo.memoized(maxsize=8192)
def phase(
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
    workload = workload_of(est, alpha, rate_factor)
    ks = sorted(set(ks) | {current})
    replicas = calibration.on.replicas
    backlog = round(est.waiting, 1)
    results = {
        k: phase(
            calibration.params_for(k),
            workload,
            calibration.config(k),
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
            schedule=_schedule_label(calibration.config(k)),
        )
    return out


def _schedule_label(config: perfmodel.Config) -> str | None:
    return config.label if isinstance(config, perfmodel.Schedule) else None


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
    the same phases the benchmark scores): each round of the rollout takes maxUnavailable
    replicas (at least one) away for ``restart_s`` while the others serve (the majority's
    config), the queue carries from round to round and into the new config; where the
    rollout keeps capacity (maxSurge >= 1 with maxUnavailable 0,
    `PolicySettings.rollout_keeps_capacity`) the old config serves half of the rollout."""
    horizon = settings.tuning.payback_horizon_s if horizon_s is None else horizon_s
    workload = workload_of(est, est.alpha if alpha is None else alpha)
    replicas = max(1, calibration.on.replicas)
    slo = (settings.slo_e2e_s, settings.slo_tpot_s)
    backlog = round(est.waiting, 1)
    stay = phase(calibration.params_for(current), workload, calibration.config(current), horizon, backlog,
                 replicas, *slo)

    pieces: list[tuple[int, float, int]] = []  # (config, seconds, serving replicas)
    if settings.rollout_keeps_capacity:
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
        piece = phase(calibration.params_for(config), workload, calibration.config(config), seconds,
                      round(queue, 1), serving, *slo)
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
