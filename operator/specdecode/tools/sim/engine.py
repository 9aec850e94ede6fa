"""One simulated vLLM engine: what its command line configures and how its metrics advance.

Pure core of the simulator. `engine_config_from_args` reads a pod's vLLM arguments (the
speculative part through `specdecode.render.vllm_args.parse_speculative_args`, the one parser of it);
`PodEngine.advance` moves one pod's counters, gauges and histograms forward by `dt` seconds
of its life under a workload, with the noise a real engine's counters have, from a random
generator seeded by the caller. No clock, no I/O: the fleet (shell) supplies time.

What one step of `advance` does, per pod, from `perfmodel.steady_state` at the pod's actual
config: K, or its per-batch-size table as a `perfmodel.Schedule` (the load of its service
split across the service's Ready pods):
- arrivals ~ Poisson(lambda dt); while the pod is past capacity (or holds a backlog) it
  admits ~ Poisson(mu dt) and the rest wait (`vllm:num_requests_waiting`);
- every admitted request is sampled whole: prompt and output lengths (lognormal), its queue
  wait (backlog / mu), TTFT, TPOT (lognormal with the model's mean and spread), decode and
  e2e time; they fill the request histograms at once (a scrape sees a request a few seconds
  before vLLM would: irrelevant at the windows the operator uses);
- engine steps: the running sequences take ~ Poisson(B dt / t_step) sequence-steps; each is
  one draft of K tokens (under a table, the K of the range the batch is in: steps split
  across the table's Ks by the model's `step_shares`), accepted position by position with the model's conditional
  acceptance (nested binomials: position i can only be accepted if i-1 was), one
  `inter_token_latency` observation around the step time, 1 + accepted generated tokens;
- preemptions ~ Poisson(rate dt); gauges from the model's batch, queue and KV usage.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from specdecode.render import vllm_args as vllm
from specdecode.control.perfmodel import (
    METHODS, Config, EngineParams, Schedule, ScheduleError, SteadyState, Workload, steady_state,
)
from specdecode.tools.sim import exposition as x

# Prompts vary less than outputs in most serving traces; the model only uses the mean.
PROMPT_TOKENS_CV = 0.5
# Share of requests that stop on max_tokens rather than a stop token (finished_reason).
LENGTH_FINISH_FRACTION = 0.25
# Step-to-step jitter of one engine step around the model's mean (batch composition).
STEP_TIME_CV = 0.1
# TTFT jitter around the model's mean prefill time.
TTFT_CV = 0.3


@dataclass(frozen=True)
class EngineConfig:
    """What a pod's vLLM command line configures, as far as its metrics are concerned."""

    model_name: str
    """Served model name: the `model_name` label."""
    method: str | None
    """Speculative method as vLLM names it, None when speculation is off."""
    num_speculative_tokens: int
    """K, 0 when speculation is off."""
    per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    """vLLM's num_speculative_tokens_per_batch_size table (inclusive ranges)."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    custom_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """--custom-histogram-buckets, as sorted (family, bounds) pairs."""

    @property
    def speculative(self) -> bool:
        return self.method is not None and self.num_speculative_tokens > 0

    @property
    def perf_config(self) -> Config:
        """The performance model's config of this engine: 0 (off), K, or the table read as
        vLLM reads it (`perfmodel.Schedule.from_table`: gaps and the end carry the last
        row's K forward, capped at num_speculative_tokens)."""
        if not self.speculative:
            return 0
        if not self.per_batch_size:
            return self.num_speculative_tokens
        try:
            return Schedule.from_table(self.per_batch_size, self.num_speculative_tokens)
        except ScheduleError:
            # Every row at K 0: the draft is loaded and never drafts; the model's nearest
            # config is speculation off (its memory is not charged).
            return 0

    def k_at_batch(self, batch: float) -> int:
        """K the engine runs at a batch size (vLLM's dense reading of the table)."""
        config = self.perf_config
        return config.k_at(batch) if isinstance(config, Schedule) else config


def engine_config_from_args(args: Sequence[str]) -> EngineConfig:
    """Read a vLLM command line (`vllm serve MODEL ...` or just `MODEL ...`).

    Raises ValueError on a malformed `--speculative-config` or bucket JSON.
    """
    spec = vllm.parse_speculative_args(list(args))
    served = _flag(args, "--served-model-name")
    model_name = served or _positional_model(args) or "model"
    buckets_raw = _flag(args, "--custom-histogram-buckets")
    custom: tuple[tuple[str, tuple[float, ...]], ...] = ()
    if buckets_raw:
        try:
            data = json.loads(buckets_raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"--custom-histogram-buckets is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("--custom-histogram-buckets must be a JSON object")
        custom = tuple(sorted((str(k), tuple(float(b) for b in v)) for k, v in data.items()))
    enabled = spec is not None and spec.num_speculative_tokens > 0
    return EngineConfig(
        model_name=model_name,
        method=spec.method if enabled and spec is not None else None,
        num_speculative_tokens=spec.num_speculative_tokens if enabled and spec is not None else 0,
        per_batch_size=spec.per_batch_size if enabled and spec is not None else None,
        max_num_seqs=_int_flag(args, "--max-num-seqs"),
        max_num_batched_tokens=_int_flag(args, "--max-num-batched-tokens"),
        custom_buckets=custom,
    )


def _flag(args: Sequence[str], name: str) -> str | None:
    """Value of `--name value` or `--name=value` (the last one wins, as with argparse)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _int_flag(args: Sequence[str], name: str) -> int | None:
    raw = _flag(args, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _positional_model(args: Sequence[str]) -> str | None:
    rest = list(args)
    if rest[:2] == ["vllm", "serve"]:
        rest = rest[2:]
    elif rest[:1] == ["serve"]:
        rest = rest[1:]
    if rest and not rest[0].startswith("-"):
        return rest[0]
    return None


def perf_method(vllm_method: str | None, fallback: str) -> str:
    """The perfmodel proposer class of a vLLM method name (unknown ones: the scenario's)."""
    if vllm_method is None:
        return fallback
    if vllm_method in METHODS:
        return vllm_method
    if vllm_method.startswith("ngram"):
        return "ngram"
    if vllm_method.endswith("mtp"):
        return "mtp"
    return fallback


def pod_params(scenario_params: EngineParams, config: EngineConfig, overrides: Mapping[str, object]) -> EngineParams:
    """The true engine of one pod: the scenario's, for the pod's method and scheduler limits.

    When the pod's method differs from the scenario's, the pod's method defaults apply and
    the scenario's `model:` overrides are laid on top (they describe the hardware).
    """
    method = perf_method(config.method, scenario_params.method)
    params = scenario_params
    if method != scenario_params.method:
        params = EngineParams.for_method(method, dict(overrides))
    limits: dict[str, int] = {}
    if config.max_num_seqs is not None:
        limits["max_num_seqs"] = config.max_num_seqs
    if config.max_num_batched_tokens is not None:
        limits["max_num_batched_tokens"] = config.max_num_batched_tokens
    return replace(params, **limits) if limits else params


@lru_cache(maxsize=4096)
def _state(params: EngineParams, workload: Workload, config: Config, replicas: int) -> SteadyState:
    return steady_state(params, workload, config, replicas)


def engine_state(config: EngineConfig, params: EngineParams, workload: Workload, replicas: int) -> SteadyState:
    """The model's steady state for this pod. With a per-batch-size table each step drafts
    at the K its running batch maps to; `SteadyState.step_shares` says how the steps split
    across those Ks as the batch moves around its mean."""
    return _state(params, workload, config.perf_config, replicas)


@dataclass(frozen=True)
class Tick:
    """What one `advance` did (for logs and tests)."""

    arrivals: int
    admitted: int
    queue: float
    k: int
    """The K most of the tick's steps drafted with (0: off)."""
    state: SteadyState


class PodEngine:
    """One pod's engine over its lifetime: metrics from zero, a waiting queue, a generator."""

    def __init__(self, config: EngineConfig, params: EngineParams, rng: np.random.Generator) -> None:
        self.config = config
        self.params = params
        self.rng = rng
        self.metrics = x.PodMetrics(
            config.model_name,
            config.num_speculative_tokens if config.speculative else None,
            dict(config.custom_buckets),
        )
        self.queue = 0.0
        self.request_acceptance_sd = 0.0
        """SD of one request's own acceptance around the truth (0: every token of every
        request is accepted with the same probability)."""
        self._admitted = 0
        self._bucket_probs: dict[tuple[str, float, float], list[float]] = {}

    def advance(self, dt: float, workload: Workload, ready_replicas: int) -> Tick:
        """Move the pod `dt` seconds forward while its service sees `workload` (service-wide)
        split across `ready_replicas` pods (this one included)."""
        if dt <= 0:
            raise ValueError(f"dt must be > 0, got {dt}")
        replicas = max(1, ready_replicas)
        state = engine_state(self.config, self.params, workload, replicas)
        k = max(state.step_shares(), key=lambda item: item[1])[0]
        rng = self.rng
        lam = workload.request_rate / replicas
        mu = state.capacity_rps / replicas

        arrivals = int(rng.poisson(lam * dt))
        backlog = self.queue
        if state.saturated or backlog >= 1.0:
            admitted = min(int(backlog) + arrivals, int(rng.poisson(mu * dt)))
        else:
            admitted = arrivals + int(backlog)
        self.queue = max(0.0, backlog + arrivals - admitted)
        wait = backlog / mu if mu > 0 and backlog >= 1.0 else 0.0

        self._admitted = admitted
        with self.metrics.lock:
            self._requests(admitted, workload, state, wait, dt)
            self._steps(dt, workload, state)
            m = self.metrics
            m.inc(x.PREEMPTIONS, float(rng.poisson(state.preemptions_per_s / replicas * dt)))
            running = min(state.batch_cap, float(rng.poisson(state.batch))) if state.batch > 0 else 0.0
            m.gauges[x.RUNNING] = running
            m.gauges[x.WAITING] = float(round(self.queue))
            usage = state.kv_usage * (running / state.batch) if state.batch > 0 else 0.0
            m.gauges[x.KV_CACHE_USAGE] = min(1.0, max(0.0, usage))
        return Tick(arrivals, admitted, self.queue, k, state)

    # --- requests --------------------------------------------------------------------------

    def _requests(self, n: int, workload: Workload, state: SteadyState, wait: float, dt: float) -> None:
        if n <= 0:
            return
        rng, m, p = self.rng, self.metrics, self.params
        outputs = _lognormal(rng, workload.output_tokens, p.output_tokens_cv, n)
        prompts = _lognormal(rng, workload.prompt_tokens, PROMPT_TOKENS_CV, n)
        tpots = _lognormal(rng, state.tpot_s, state.tpot_cv, n)
        ttft_service = _lognormal(rng, state.ttft_s, TTFT_CV, n)
        # Requests admitted from a backlog waited for it; spread their arrival over the tick.
        waits = wait + (rng.uniform(0.0, dt, n) if wait > 0 else np.zeros(n))
        # Half a step of scheduling delay is part of TTFT in the model; vLLM counts it as
        # queue time.
        sched = 0.5 * state.step_time_s
        reasons = rng.random(n) < LENGTH_FINISH_FRACTION
        h = m.histograms
        for i in range(n):
            out_tokens = max(1, int(round(outputs[i])))
            prompt_tokens = max(1, int(round(prompts[i])))
            queue_time = float(waits[i]) + sched
            prefill = max(1e-4, float(ttft_service[i]) - sched)
            decode = (out_tokens - 1) * float(tpots[i])
            ttft = queue_time + prefill
            h[x.E2E].observe(ttft + decode)
            h[x.QUEUE_TIME].observe(queue_time)
            h[x.TTFT].observe(ttft)
            h[x.PREFILL_TIME].observe(prefill)
            h[x.DECODE_TIME].observe(decode)
            h[x.INFERENCE_TIME].observe(prefill + decode)
            if out_tokens > 1:
                h[x.REQUEST_TPOT].observe(float(tpots[i]))
            m.inc(x.PROMPT_TOKENS, float(prompt_tokens))
            m.request_success["length" if reasons[i] else "stop"] += 1.0

    # --- engine steps ----------------------------------------------------------------------

    def _steps(self, dt: float, workload: Workload, state: SteadyState) -> None:
        rng, m = self.rng, self.metrics
        if state.batch <= 0 or state.step_time_s <= 0:
            return
        seq_steps = int(rng.poisson(state.batch * dt / state.step_time_s))
        if seq_steps <= 0:
            return
        accepted_total = 0
        if self.config.speculative:
            # Under a table the steps split across the Ks the batch visits; positions beyond
            # a step's K are not drafted, so they count only the steps that reached them.
            shares = state.step_shares()
            if len(shares) == 1:
                groups = [(shares[0][0], seq_steps)]
            else:
                counts = rng.multinomial(seq_steps, [share for _, share in shares])
                groups = [(k, int(n)) for (k, _), n in zip(shares, counts)]
            alpha, decay = self._tick_alpha(state.alpha), self.params.acceptance_decay
            for k, steps in groups:
                if k <= 0 or steps <= 0:
                    continue
                m.inc(x.SPEC_DRAFTS, float(steps))
                m.inc(x.SPEC_DRAFT_TOKENS, float(steps * k))
                survivors = steps
                for pos in range(k):
                    # P(accept pos | pos-1 accepted) = alpha * decay**pos.
                    survivors = int(rng.binomial(survivors, min(1.0, alpha * decay**pos)))
                    m.accepted_per_pos[pos] += survivors
                    accepted_total += survivors
            m.inc(x.SPEC_ACCEPTED_TOKENS, float(accepted_total))
        m.inc(x.GENERATION_TOKENS, float(seq_steps + accepted_total))
        self._bulk_observe(x.INTER_TOKEN_LATENCY, seq_steps, state.step_time_s, STEP_TIME_CV)

    def _tick_alpha(self, alpha: float) -> float:
        """The acceptance this tick's tokens see: with ``request_acceptance_sd``, the
        output-weighted mean of one beta draw per request admitted in the tick (mean
        ``alpha``), so a window's acceptance varies with its number of requests (a
        beta-binomial), as a real service's does."""
        sd = self.request_acceptance_sd
        if sd <= 0 or not 0 < alpha < 1:
            return alpha
        spread = alpha * (1.0 - alpha)
        sd = min(sd, 0.9 * math.sqrt(spread))
        concentration = spread / (sd * sd) - 1.0
        n = max(1, self._admitted)
        draws = self.rng.beta(alpha * concentration, (1.0 - alpha) * concentration, n)
        weights = _lognormal(self.rng, 1.0, self.params.output_tokens_cv, n)
        return float(min(1.0, max(0.0, np.dot(draws, weights) / weights.sum())))

    def _bulk_observe(self, name: str, n: int, mean: float, cv: float) -> None:
        """n observations from a lognormal(mean, cv), bucketed by a multinomial draw."""
        hist = self.metrics.histograms[name]
        sigma2 = math.log1p(cv * cv)
        mu = math.log(mean) - sigma2 / 2.0
        key = (name, round(mu, 6), cv)
        probs = self._bucket_probs.get(key)
        if probs is None:
            probs = x.lognormal_bucket_probabilities(hist.bounds, mu, math.sqrt(sigma2))
            total = sum(probs)
            probs = [q / total for q in probs]
            if len(self._bucket_probs) > 256:
                self._bucket_probs.clear()
            self._bucket_probs[key] = probs
        counts = self.rng.multinomial(n, probs)
        # The sum of n lognormal draws: mean n*mean, sd mean*cv*sqrt(n) (CLT).
        total = max(0.0, float(self.rng.normal(n * mean, mean * cv * math.sqrt(n))))
        hist.add([int(c) for c in counts], total)


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    if not math.isfinite(mean) or mean <= 0:
        return np.full(n, max(0.0, mean) if math.isfinite(mean) else 0.0)
    if cv <= 0:
        return np.full(n, mean)
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2), n)
