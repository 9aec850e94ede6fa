"""What the policy sees in the benchmark: simulated pods, scrapes, and the production reader.

Each Ready replica is a `specdecode.tools.sim.engine.PodEngine` (the simulator's pod: vLLM 0.33's
counters, histograms and gauges, advanced from the true performance model with Poisson and
binomial noise). Every scrape interval Prometheus would store one sample of every series of
every Ready pod, labelled as the PodMonitor labels them; a restarted replica is a new pod
(new series from zero), and the old pod's series go stale. The policy then reads them
through `specdecode.control.metrics` (the same query plan and observation core as production) with
Prometheus's evaluation emulated by `specdecode.control.promql`: windows, extrapolation, counter
resets, staleness. During a metrics outage nothing is scraped and every read fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specdecode import constants
from specdecode.metricnames import total
from specdecode.control import metrics, promql
from specdecode.control.metrics import ConfigKey, Observation, QueryScope, RawSeries
from specdecode.control.perfmodel import Config, EngineParams, Schedule, Workload
from specdecode.tools.sim import engine as sim_engine
from specdecode.tools.sim import exposition as x

NAMESPACE = "bench"
MODEL_NAME = "model"
RULES = promql.PROMETHEUS_3
STALE_AFTER_S = 0.001
"""How long after its last sample a deleted pod's series is marked stale, at the least."""


def config_hash(config: Config) -> str:
    """The config-hash label of a config (stands for the hash of the rendered engine)."""
    if isinstance(config, Schedule):
        return "s" + "_".join(f"{start}-{k}" for start, _, k in config.bands)
    return "off" if config == 0 else f"k{config}"


class BenchPodEngine(sim_engine.PodEngine):
    """The simulator's pod engine with its request sampling vectorized (numpy).

    Same distributions as `PodEngine` (prompt, output, TPOT and TTFT lognormals, queue wait
    from the backlog spread over the tick, finish reasons), but drawn as arrays and bucketed
    at once, and only into the series the operator reads: the e2e and per-request TPOT
    histograms, prompt tokens and finished requests. A benchmark replays millions of
    requests; the simulator's per-request loop would dominate its run time.
    """

    def _requests(self, n: int, workload: Workload, state, wait: float, dt: float) -> None:
        if n <= 0:
            return
        rng, m, p = self.rng, self.metrics, self.params
        lognormal = sim_engine._lognormal
        outputs = np.maximum(1.0, np.rint(lognormal(rng, workload.output_tokens, p.output_tokens_cv, n)))
        prompts = np.maximum(1.0, np.rint(lognormal(rng, workload.prompt_tokens, sim_engine.PROMPT_TOKENS_CV, n)))
        tpots = lognormal(rng, state.tpot_s, state.tpot_cv, n)
        ttft_service = lognormal(rng, state.ttft_s, sim_engine.TTFT_CV, n)
        waits = wait + (rng.uniform(0.0, dt, n) if wait > 0 else np.zeros(n))
        sched = 0.5 * state.step_time_s
        prefill = np.maximum(1e-4, ttft_service - sched)
        e2e = waits + sched + prefill + (outputs - 1.0) * tpots
        _observe_many(m.histograms[x.E2E], e2e)
        _observe_many(m.histograms[x.REQUEST_TPOT], tpots[outputs > 1.0])
        m.inc(x.PROMPT_TOKENS, float(prompts.sum()))
        length = int((rng.random(n) < sim_engine.LENGTH_FINISH_FRACTION).sum())
        m.request_success["length"] += float(length)
        m.request_success["stop"] += float(n - length)


def _observe_many(histogram: x.Histogram, values: np.ndarray) -> None:
    """Bucket many observations at once (``le`` buckets: a value on a bound belongs to it)."""
    if values.size == 0:
        return
    index = np.searchsorted(np.asarray(histogram.bounds), values, side="left")
    counts = np.bincount(index, minlength=len(histogram.counts))
    histogram.add([int(c) for c in counts], float(values.sum()))


@dataclass
class _Pod:
    name: str
    config: Config
    engine: sim_engine.PodEngine
    label: str
    """Its config-hash label (a canary's pods carry the experiment's candidate hash)."""
    series: dict[tuple, RawSeries] = field(default_factory=dict)


class Fleet:
    """The simulated pods of one service and the series a Prometheus would hold for them."""

    def __init__(
        self, service: str, method: str, params: EngineParams, seed: int, keep_s: float,
        request_acceptance_sd: float = 0.0,
    ):
        self.service = service
        self.request_acceptance_sd = request_acceptance_sd
        self.method = method
        self.params = params
        self.seed = seed
        self.keep_s = keep_s
        self.pods: dict[int, _Pod] = {}
        self._generation = 0
        self._by_metric: dict[str, list[RawSeries]] = {}
        self._scrapes = 0

    # --- pods ------------------------------------------------------------------------------

    def start(self, slot: int, config: Config, label: str | None = None) -> None:
        """A new pod in ``slot`` running ``config`` (K, off or a per-batch-size schedule)
        becomes Ready (counters from zero), labelled ``label`` (default: the config's own hash)."""
        self._generation += 1
        label = label or config_hash(config)
        name = f"{self.service}-{label}-{self._generation}"
        if isinstance(config, Schedule):
            engine_config = sim_engine.EngineConfig(
                MODEL_NAME, self.method, config.max_k, per_batch_size=config.rows()
            )
        else:
            engine_config = sim_engine.EngineConfig(
                MODEL_NAME, self.method if config else None, config
            )
        rng = np.random.default_rng([self.seed, slot, self._generation])
        engine = BenchPodEngine(engine_config, self.params, rng)
        engine.request_acceptance_sd = self.request_acceptance_sd
        self.pods[slot] = _Pod(name, config, engine, label)

    def stop(self, slot: int, at: float) -> None:
        """The pod in ``slot`` is deleted at ``at``: its series go stale."""
        pod = self.pods.pop(slot, None)
        if pod is None:
            return
        for key, series in pod.series.items():
            # Prometheus writes the staleness marker after the target's last scrape; a pod
            # deleted by a decision taken on that scrape's data is gone just after it.
            last = series.samples[-1][0] if series.samples else at
            stale = RawSeries(series.labels, series.samples, max(at, last + STALE_AFTER_S))
            bucket = self._by_metric[series.name]
            for i, item in enumerate(bucket):
                if item is series:
                    bucket[i] = stale
                    break

    @property
    def ready(self) -> int:
        return len(self.pods)

    def advance(self, dt: float, workload: Workload) -> None:
        """Every Ready pod lives ``dt`` seconds of its share of the service's workload."""
        ready = self.ready
        for slot in sorted(self.pods):
            self.pods[slot].engine.advance(dt, workload, ready)

    # --- scrapes ---------------------------------------------------------------------------

    def scrape(self, at: float) -> None:
        """One scrape of every Ready pod at ``at``."""
        for slot in sorted(self.pods):
            pod = self.pods[slot]
            for name, extra, value in _samples(pod.engine.metrics):
                key = (name, extra)
                series = pod.series.get(key)
                if series is None:
                    labels = {
                        "__name__": name,
                        "namespace": NAMESPACE,
                        constants.PROM_LABEL_SERVICE: self.service,
                        constants.PROM_LABEL_CONFIG_HASH: pod.label,
                        "pod": pod.name,
                        x.LABEL_MODEL_NAME: MODEL_NAME,
                        x.LABEL_ENGINE: x.ENGINE_INDEX,
                        **dict(extra),
                    }
                    series = RawSeries(labels, [])
                    pod.series[key] = series
                    self._by_metric.setdefault(name, []).append(series)
                series.samples.append((at, value))  # type: ignore[attr-defined]
        self._scrapes += 1
        if self._scrapes % 20 == 0:
            self._prune(at)

    def _prune(self, at: float) -> None:
        """Drop samples no query can reach any more (window + lookback behind)."""
        horizon = at - self.keep_s
        for name, bucket in self._by_metric.items():
            kept = []
            for series in bucket:
                samples = series.samples
                cut = 0
                while cut < len(samples) and samples[cut][0] < horizon:
                    cut += 1
                if cut:
                    del samples[:cut]  # type: ignore[attr-defined]
                if samples or series.stale_at is None:
                    kept.append(series)
            self._by_metric[name] = kept

    # --- the production reader on the stored series ------------------------------------------

    def observe(self, scope: QueryScope, at: float) -> dict[ConfigKey, Observation]:
        """What the operator's query plan returns at ``at`` (emulated Prometheus)."""
        results = {
            spec.name: metrics.evaluate_query(
                spec, scope, [s for name in spec.names for s in self._by_metric.get(name, ())], at, RULES
            )
            for spec in scope.specs
        }
        return metrics.build_observations(results, window_s=scope.window_s, evaluated_at=at)


def _samples(m: x.PodMetrics) -> list[tuple[str, tuple, float]]:
    """(metric name, extra labels, value) of the series the operator's queries read."""
    out: list[tuple[str, tuple, float]] = []
    if m.spec_tokens is not None:
        for name in (x.SPEC_DRAFTS, x.SPEC_DRAFT_TOKENS, x.SPEC_ACCEPTED_TOKENS):
            out.append((total(name), (), m.counters[name]))
        for pos, value in enumerate(m.accepted_per_pos):
            out.append((total(x.SPEC_ACCEPTED_PER_POS), ((x.LABEL_POSITION, str(pos)),), value))
    for name in (x.GENERATION_TOKENS, x.PROMPT_TOKENS, x.PREEMPTIONS):
        out.append((total(name), (), m.counters[name]))
    for name in (x.RUNNING, x.WAITING, x.KV_CACHE_USAGE):
        out.append((name, (), m.gauges[name]))
    for name in (x.E2E, x.REQUEST_TPOT):
        histogram = m.histograms[name]
        for le, value in histogram.cumulative():
            out.append((name + "_bucket", (("le", le),), value))
        out.append((name + "_sum", (), histogram.total))
        out.append((name + "_count", (), float(histogram.count)))
    itl = m.histograms[x.INTER_TOKEN_LATENCY]
    out.append((x.INTER_TOKEN_LATENCY + "_sum", (), itl.total))
    out.append((x.INTER_TOKEN_LATENCY + "_count", (), float(itl.count)))
    return out


def current_observation(
    observations: dict[ConfigKey, Observation], service: str, config: Config
) -> Observation | None:
    return observations.get(ConfigKey(NAMESPACE, service, config_hash(config)))


def keep_seconds(windows: Sequence[float], lookback_s: float = promql.DEFAULT_LOOKBACK_S) -> float:
    return max(windows) + lookback_s + 60.0
