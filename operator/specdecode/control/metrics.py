"""Reading vLLM's metrics from Prometheus: a fixed query plan and a pure core (the reader
that talks HTTP is the shell's: `specdecode.shell.prometheus`).

Per evaluation tick the operator runs one fixed set of PromQL queries for *all* services at
once, each grouped ``by (namespace, specdecode_service, specdecode_config_hash)``; never one
query per SpecDecodeService. Services that share a window and a metrics selector share one
`QueryScope`, so the number of queries depends on the number of distinct scopes (usually
one or two), never on the number of services.

Layers:

* query plan (pure): `QuerySpec` describes one query structurally (metric, function,
  aggregation, extra grouping labels); `build_query_plan` renders the PromQL for a scope.
* observation core (pure): `build_observations` turns the plan's results (label sets and
  values) into one `Observation` per (namespace, service, config hash). The benchmark uses
  the very same function.
* emulation (pure): `evaluate_plan` evaluates the same plan on raw scraped series with
  `specdecode.control.promql` (Prometheus's ``increase``/``avg_over_time``/``timestamp`` semantics,
  counter resets and extrapolation included), for the benchmark and for the e2e check.
* shell (`shell/prometheus.py`): `PrometheusReader` runs the plan through prometheus-api-client with a bearer token,
  CA bundle and custom headers; every failure becomes a typed `MetricsUnavailable`.

What the numbers mean (vLLM 0.33, V1 engine; REFERENCE.md):

* ``acceptance_rate = accepted_tokens / draft_tokens`` (depends on K).
* ``alpha_i = accepted_per_pos[i] / accepted_per_pos[i-1]`` with position -1 = drafts: the
  chance that token i is accepted once token i-1 was.
* ``alpha`` (pooled maximum-likelihood estimate under per-token acceptance): every draft
  examines tokens until the first rejection or K, so the trials are
  ``drafts + sum(accepted_per_pos[0..K-2])`` and the successes ``sum(accepted_per_pos)``;
  ``alpha = successes / trials``, standard error ``sqrt(alpha (1 - alpha) / trials)``.
* ``mean_accepted_length = accepted_tokens / drafts``.
* latency quantiles come from the bucket increases with `promql.histogram_quantile`; means
  from ``_sum / _count`` (vLLM's TPOT buckets start at 10 ms, too coarse for speculative
  TPOTs of a few ms: compare configs on means).
* ``step_time_mean = inter_token_latency _sum / _count``: vLLM records one inter-token
  latency per engine step per running request, so this is the engine's mean step time at
  the observed batch, speculation included.

Absent is not failed: with speculation off the spec-decode series do not exist
(``speculation is None``); an idle service has no latency samples (``requests == 0``,
quantiles None). Only a Prometheus failure, or a service with no series at all, is missing.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from specdecode import constants
from specdecode.control import promql
from specdecode import metricnames as N
from specdecode import timestamps
from specdecode.metricnames import SPELLINGS, spelling_of, spellings_of
from specdecode.control.promql import PromQLRules, Sample

LABEL_NAME = "__name__"
LABEL_NAMESPACE = "namespace"
LABEL_LE = "le"
GROUP_LABELS: tuple[str, ...] = (
    LABEL_NAMESPACE,
    constants.PROM_LABEL_SERVICE,
    constants.PROM_LABEL_CONFIG_HASH,
)
"""Every query groups by these: one result per service and config hash."""

LATENCY_QUANTILE = 0.95
QUEUED_PER_REPLICA = 1.0
"""Requests waiting per replica, averaged over a window, that show replicas at their capacity
(`Observation.queued`)."""

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


# --- Query plan (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class QueryScope:
    """What one batch of queries covers: the window and the extra label matchers.

    Services with the same window and the same metrics selector share a scope. A
    ``load_only`` scope reads the finished requests alone (`LOAD_SPECS`): the load over the
    trend window, which the capacity hedge compares with the long window's.
    """

    window_s: float
    matchers: tuple[tuple[str, str], ...] = ()
    load_only: bool = False

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window must be a positive duration, got {self.window_s!r}")
        for name, _ in self.matchers:
            if not _LABEL_NAME_RE.match(name):
                raise ValueError(f"metrics selector: {name!r} is not a Prometheus label name")
            if name.startswith("__"):
                raise ValueError(f"metrics selector: label {name!r} is reserved")

    @classmethod
    def of(cls, window_s: float, selector: Mapping[str, str] | None = None, load_only: bool = False) -> QueryScope:
        """A scope from a window and the spec's selector labels (order-independent)."""
        return cls(window_s, tuple(sorted((selector or {}).items())), load_only)

    @property
    def specs(self) -> tuple[QuerySpec, ...]:
        """The queries this scope's plan runs."""
        return LOAD_SPECS if self.load_only else QUERY_SPECS


@dataclass(frozen=True)
class QuerySpec:
    """One query of the plan, described structurally so that it can be rendered as PromQL
    and emulated on raw series alike.

    ``function``: ``increase`` (counters), ``delta`` (a gauge's change), ``avg_over_time``,
    ``max_over_time``, ``sum_over_time`` and ``count_over_time`` (gauges over the window),
    ``timestamp`` (time of the newest sample), ``value`` (the instant value).
    ``aggregation``: ``sum``, ``avg``, ``max`` or ``count`` across pods.

    Each query matches the metric under both of its stored names (`spellings_of`) in one
    expression: ``f(vllm:x[w]) or f(vllm_x[w])``. ``or`` matches series on their labels
    without the name, so it keeps each series under vLLM's own name and adds an escaped one
    only where no series with the same labels has it: nothing is counted twice, and a fleet
    whose pods are stored under different names adds up. ``value`` keeps the name
    (``vllm:x or vllm_x``) and the plan groups it by ``__name__`` too, so the pod count says
    which spelling Prometheus stores.
    """

    name: str
    metric: str
    function: str
    aggregation: str = "sum"
    extra_by: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The stored names this query reads, preferred first."""
        return spellings_of(self.metric)

    def promql(self, scope: QueryScope) -> str:
        """The PromQL text of this query for ``scope``."""
        matchers = render_matchers(scope.matchers)
        window = promql.format_duration(scope.window_s)
        if self.function == "value":
            inner = " or ".join(f"{name}{{{matchers}}}" for name in self.names)
        elif self.function in promql.RANGE_FUNCTIONS:
            inner = " or ".join(f"{self.function}({name}{{{matchers}}}[{window}])" for name in self.names)
        elif self.function == "timestamp":
            inner = " or ".join(f"timestamp({name}{{{matchers}}})" for name in self.names)
        else:
            raise ValueError(f"unknown query function {self.function!r}")
        by = ", ".join(GROUP_LABELS + self.extra_by)
        return f"{self.aggregation} by ({by}) ({inner})"


def _counter(name: str, metric: str, *extra_by: str) -> QuerySpec:
    return QuerySpec(name, metric, "increase", "sum", tuple(extra_by))


QUERY_SPECS: tuple[QuerySpec, ...] = (
    _counter("drafts", N.total(N.SPEC_DRAFTS)),
    _counter("draft_tokens", N.total(N.SPEC_DRAFT_TOKENS)),
    _counter("accepted_tokens", N.total(N.SPEC_ACCEPTED_TOKENS)),
    _counter("accepted_per_position", N.total(N.SPEC_ACCEPTED_PER_POS), N.LABEL_POSITION),
    _counter("e2e_buckets", N.E2E + "_bucket", LABEL_LE),
    _counter("e2e_sum", N.E2E + "_sum"),
    _counter("e2e_count", N.E2E + "_count"),
    _counter("tpot_buckets", N.REQUEST_TPOT + "_bucket", LABEL_LE),
    _counter("tpot_sum", N.REQUEST_TPOT + "_sum"),
    _counter("tpot_count", N.REQUEST_TPOT + "_count"),
    _counter("itl_sum", N.INTER_TOKEN_LATENCY + "_sum"),
    _counter("itl_count", N.INTER_TOKEN_LATENCY + "_count"),
    _counter("generation_tokens", N.total(N.GENERATION_TOKENS)),
    _counter("prompt_tokens", N.total(N.PROMPT_TOKENS)),
    _counter("preemptions", N.total(N.PREEMPTIONS)),
    # The running batch per pod over the window, each pod sample once (sum / count): a pod
    # that left inside the window (a canary borrowing a replica, a rollout) weighs by the time
    # it served, where a sum of per-pod means would count it as a whole pod beside the live
    # ones (Prometheus keeps its samples in range after the staleness marker).
    QuerySpec("running_sum", N.RUNNING, "sum_over_time", "sum"),
    QuerySpec("running_samples", N.RUNNING, "count_over_time", "sum"),
    QuerySpec("waiting", N.WAITING, "avg_over_time", "sum"),
    # What the waiting queues and the running batches gained over the window: past capacity
    # the finished requests are the capacity, not the load, and the rest of the load piles
    # up here. Both: where the KV cache bounds the batch, preemptions move requests from the
    # batch back to the queue, and the queue alone swung by 450 requests a window.
    QuerySpec("waiting_change", N.WAITING, "delta", "sum"),
    QuerySpec("running_change", N.RUNNING, "delta", "sum"),
    # The largest running batch of any one pod in the window: the top of the batch range a
    # per-batch-size K schedule must serve (`control.schedules`).
    QuerySpec("peak_running", N.RUNNING, "max_over_time", "max"),
    QuerySpec("kv_cache_usage", N.KV_CACHE_USAGE, "avg_over_time", "avg"),
    QuerySpec("newest_sample", N.RUNNING, "timestamp", "max"),
    QuerySpec("pods", N.RUNNING, "value", "count", (LABEL_NAME,)),
)
"""The fixed plan: one query per metric family, each covering every service in a scope."""

LOAD_SPECS: tuple[QuerySpec, ...] = tuple(spec for spec in QUERY_SPECS if spec.name == "e2e_count")
"""The plan of a ``load_only`` scope: finished requests, one cheap counter."""


@dataclass(frozen=True)
class PlannedQuery:
    """A query of the plan bound to a scope, with its PromQL text."""

    spec: QuerySpec
    scope: QueryScope
    text: str


def render_matchers(matchers: Iterable[tuple[str, str]]) -> str:
    """Label matchers for a selector: the service label must be set, plus the scope's
    equality matchers with PromQL string escaping."""
    parts = [f'{constants.PROM_LABEL_SERVICE}!=""']
    for name, value in matchers:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{name}="{escaped}"')
    return ", ".join(parts)


def build_query_plan(scope: QueryScope) -> tuple[PlannedQuery, ...]:
    """The fixed queries of one scope (independent of how many services it covers)."""
    return tuple(PlannedQuery(spec, scope, spec.promql(scope)) for spec in scope.specs)


def guard_window(window_s: float, scrape_interval_s: float) -> float:
    """The short window of the fast guards (acceptance collapse, SLO breach).

    A tuning estimate needs the long window; a collapse must be seen sooner. A quarter of
    the window, but at least four scrapes so that ``increase`` has samples to work with,
    and never longer than the window itself.
    """
    return min(window_s, max(window_s / 4.0, 4.0 * scrape_interval_s))


TREND_WINDOW_MIN_S = 1800.0
"""The trend window is at least half an hour: a rise the capacity hedge insures against
shows over tens of minutes (a diurnal swing, a ramp), and a stationary load's noise averages
out."""


def trend_window(window_s: float) -> float:
    """The window whose load the long window's is compared with, to tell a rising load from a
    stationary one: six long windows, at least `TREND_WINDOW_MIN_S`."""
    return max(TREND_WINDOW_MIN_S, 6.0 * window_s)


# --- Observations (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigKey:
    """The unit of attribution: one service's pods running one rendered config."""

    namespace: str
    service: str
    config_hash: str

    @property
    def service_key(self) -> tuple[str, str]:
        return (self.namespace, self.service)


@dataclass(frozen=True, slots=True)
class VectorSample:
    """One element of an instant-vector query result."""

    labels: Mapping[str, str]
    value: float


QueryResults = Mapping[str, Sequence[VectorSample]]
"""Results of one scope's plan, by query name."""


_LENGTH_TOLERANCE = 0.005
"""Relative shortfall of drafted tokens under drafts x K that still reads as full-length drafts:
both counters' increases are extrapolated over the same samples, so a plain K's ratio is K to
far better than this."""


@dataclass(frozen=True)
class SpeculationCounts:
    """Spec-decode counter increases over the window, and what they imply."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens (what users see; depends on K)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Accepted tokens per draft."""
        return self.accepted_tokens / self.drafts if self.drafts > 0 else None

    @property
    def full_length_drafts(self) -> bool:
        """Every draft proposed all ``k`` positions, as under a plain K. Under a per-batch-size
        K schedule whose ranges draft different Ks the drafts differ in length: vLLM counts
        accepted tokens per position but not drafted ones (its per-position draft counts stay
        inside the engine, 0.33), so past position 0 nobody knows how many drafts reached a
        position, and dividing by the accepted tokens of the one before would count the short
        drafts' missing positions as rejections. n-gram drafts run short too, near the end of a
        context (vLLM proposes the tokens after the match, at most K)."""
        return self.draft_tokens >= self.drafts * self.k * (1.0 - _LENGTH_TOLERANCE)

    @property
    def known_positions(self) -> tuple[float, ...]:
        """``accepted_per_position`` at the positions whose trials are known: all of them for
        full-length drafts, else position 0 (every draft has one; its trials are the drafts)."""
        return self.accepted_per_position if self.full_length_drafts else self.accepted_per_position[:1]

    @property
    def alpha_per_position(self) -> tuple[float | None, ...]:
        """alpha_i = accepted_per_pos[i] / accepted_per_pos[i-1], position -1 = drafts; None
        where a position had no trials or its trials are unknown (`full_length_drafts`)."""
        out: list[float | None] = []
        previous = self.drafts
        for accepted in self.known_positions:
            out.append(_clamp01(accepted / previous) if previous > 0 else None)
            previous = accepted
        return tuple(out) + (None,) * (self.k - len(out))

    @property
    def alpha_trials(self) -> float:
        """Token positions examined: drafts plus every accepted position but the last (of the
        known ones)."""
        known = self.known_positions
        if not known:
            return 0.0
        return self.drafts + math.fsum(known[:-1])

    @property
    def alpha(self) -> float | None:
        """Pooled per-token acceptance (MLE under independent per-token acceptance)."""
        trials = self.alpha_trials
        if trials <= 0:
            return None
        return _clamp01(math.fsum(self.known_positions) / trials)

    @property
    def k(self) -> int:
        """Number of draft positions the counters report (the K the pods ran)."""
        return len(self.accepted_per_position)


@dataclass(frozen=True)
class Observation:
    """What one config of one service did over one window.

    Counts are Prometheus ``increase`` values (extrapolated, hence not integers); rates are
    those counts divided by the window. Latencies are seconds; None where undefined.
    """

    key: ConfigKey
    window_s: float
    evaluated_at: float
    newest_sample_at: float | None
    pods: int
    speculation: SpeculationCounts | None
    """None when the spec-decode series are absent (speculation off), not a failure."""
    requests: float
    e2e_p95_s: float | None
    e2e_mean_s: float | None
    tpot_p95_s: float | None
    tpot_mean_s: float | None
    step_time_mean_s: float | None
    steps: float
    """inter-token latency observations: one per running request per engine step."""
    running: float | None
    """Running requests over the window, summed over the pods serving now: the mean per pod
    sample (a pod that left inside the window weighs by the samples it gave) times ``pods``."""
    waiting: float | None
    kv_cache_usage: float | None
    """Mean KV-cache usage (0..1) over the window and the pods."""
    preemption_rate: float | None
    generation_tps: float | None
    prompt_tps: float | None
    metric_spellings: tuple[str, ...] = ()
    """How Prometheus stores the pods' vLLM series (`SPELLINGS`): ``("vllm_",)`` when the
    scrape escaped the names; both when some pods are stored one way and some the other."""
    peak_running: float | None = None
    """Largest running batch of one pod over the window (``max_over_time``)."""
    e2e_buckets: tuple[tuple[float, float], ...] = ()
    """The window's end-to-end latency histogram (upper bound, cumulative count): how sure
    `e2e_p95_s` is (`confident_quantile`)."""
    tpot_buckets: tuple[tuple[float, float], ...] = ()
    """The same for time per output token."""
    queue_change: float | None = None
    """Requests the waiting queues and the running batches gained over the window
    (``delta`` of both gauges, summed over the pods; negative while a backlog drains); None
    unread."""
    requests_counted: bool = True
    """False when Prometheus held fewer than two samples of the request counter in the window
    (its scrapes resumed after a gap, or the pods' series began inside it): ``requests`` is
    then 0 without meaning that no request finished."""

    @property
    def metric_names(self) -> str | None:
        """`metric_spellings` for status and logs: ``vllm:``, ``vllm_`` or both."""
        return " and ".join(self.metric_spellings) or None

    @property
    def staleness_s(self) -> float | None:
        """Age of the newest sample at evaluation time; None when no fresh sample exists."""
        if self.newest_sample_at is None:
            return None
        return max(0.0, self.evaluated_at - self.newest_sample_at)

    @property
    def request_rate(self) -> float:
        """Finished requests per second over the window."""
        return self.requests / self.window_s

    @property
    def arrival_rate(self) -> float:
        """Requests arriving per second over the window: the finished ones plus what the
        queues and batches gained (`queue_change`). Past capacity the finished rate is the
        capacity, and alone it never shows the overload (`past_capacity`)."""
        if self.queue_change is None:
            return self.request_rate
        return max(0.0, self.requests + self.queue_change) / self.window_s

    @property
    def idle(self) -> bool:
        """No request finished in the window (latency is undefined, not failing)."""
        return self.requests <= 0

    @property
    def queued(self) -> bool:
        """``QUEUED_PER_REPLICA`` or more requests waiting per replica on average, in a window
        that finished requests: the replicas at their capacity (what they finish then is
        what they can serve, not the load)."""
        return (not self.idle and self.waiting is not None and self.pods > 0
                and self.waiting / self.pods >= QUEUED_PER_REPLICA)

    def past_capacity(self, margin: float) -> bool:
        """Requests wait (`queued`) and ``margin`` more arrive than finish: what finishes is
        the replicas' capacity, not the load. Without a queue a window's arrivals are only
        noisier than its finished requests. The policy's load stays the finished rate: read as
        the load everywhere, the arrivals lost on held-back scenarios (the benchmark's
        journal, session 31); a restart's load reads them (`restart_load`)."""
        if self.queue_change is None or not self.queued:
            return False
        return self.arrival_rate >= (1.0 + margin) * self.request_rate

    def restart_load(self, margin: float) -> float:
        """Requests per second a restart now would leave to the replicas left serving: what
        arrives when the replicas are past their capacity (`past_capacity`), else what
        finishes. Past capacity the finished rate is what the replicas serve, and a restart
        judged on it would be judged against less than the load it meets."""
        return self.arrival_rate if self.past_capacity(margin) else self.request_rate

    @property
    def batch_per_pod(self) -> float | None:
        """Mean running batch of one replica."""
        if self.running is None or self.pods <= 0:
            return None
        return self.running / self.pods

    @property
    def output_tokens_per_request(self) -> float | None:
        if self.generation_tps is None or self.requests <= 0:
            return None
        return self.generation_tps * self.window_s / self.requests

    @property
    def prompt_tokens_per_request(self) -> float | None:
        if self.prompt_tps is None or self.requests <= 0:
            return None
        return self.prompt_tps * self.window_s / self.requests

    def to_status(self) -> dict[str, Any]:
        """``status.observations`` in the API's camelCase fields (`api.Observations`); values
        that are undefined (idle, speculation off) are left out. Running and waiting requests
        are per replica there; ``drafts`` counts drafts (the sample count of alpha)."""
        spec = self.speculation
        pods = self.pods if self.pods > 0 else None
        fields: dict[str, Any] = {
            "observedAt": timestamps.rfc3339(self.evaluated_at),
            "configHash": self.key.config_hash or None,
            "window": promql.format_duration(self.window_s),
            "pods": pods,
            "requests": _round(self.requests, 1),
            "requestRate": _round(self.request_rate, 3),
            "arrivalRate": _round(self.arrival_rate, 3) if self.queue_change is not None else None,
            "p95EndToEndSeconds": _round(self.e2e_p95_s, 4),
            "meanEndToEndSeconds": _round(self.e2e_mean_s, 4),
            "p95TimePerOutputTokenSeconds": _round(self.tpot_p95_s, 5),
            "meanTimePerOutputTokenSeconds": _round(self.tpot_mean_s, 5),
            "meanStepSeconds": _round(self.step_time_mean_s, 5),
            "runningRequests": _round(self.batch_per_pod, 2),
            "peakRunningRequests": _round(self.peak_running, 2),
            "waitingRequests": _round(
                None if self.waiting is None or pods is None else self.waiting / pods, 2
            ),
            "kvCacheUsage": _round(self.kv_cache_usage, 4),
            "preemptionRate": _round(self.preemption_rate, 4),
            "generationTokensPerSecond": _round(self.generation_tps, 1),
            "stalenessSeconds": _round(self.staleness_s, 1),
            "metricNames": self.metric_names,
        }
        if spec is not None:
            fields.update(
                {
                    "drafts": _round(spec.drafts, 1),
                    "acceptanceRate": _round(spec.acceptance_rate, 4),
                    "alpha": _round(spec.alpha, 4),
                    "alphaPerPosition": [_round(a, 4) for a in spec.alpha_per_position],
                    "meanAcceptedLength": _round(spec.mean_accepted_length, 3),
                }
            )
        return {k: v for k, v in fields.items() if v is not None}


def _running(total: float | None, samples: float | None, pods: int) -> float | None:
    """Running requests summed over the pods serving now: the window's mean per pod sample
    times the pods (`Observation.batch_per_pod` divides them again)."""
    if total is None or not samples or pods <= 0:
        return None
    return total / samples * pods


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _key_of(labels: Mapping[str, str]) -> ConfigKey | None:
    namespace = labels.get(LABEL_NAMESPACE, "")
    service = labels.get(constants.PROM_LABEL_SERVICE, "")
    if not service:
        return None
    return ConfigKey(namespace, service, labels.get(constants.PROM_LABEL_CONFIG_HASH, ""))


def _by_key(samples: Sequence[VectorSample]) -> dict[ConfigKey, float]:
    out: dict[ConfigKey, float] = {}
    for sample in samples:
        key = _key_of(sample.labels)
        if key is not None and not math.isnan(sample.value):
            out[key] = sample.value
    return out


def _by_key_and_label(
    samples: Sequence[VectorSample], label: str
) -> dict[ConfigKey, dict[str, float]]:
    out: dict[ConfigKey, dict[str, float]] = {}
    for sample in samples:
        key = _key_of(sample.labels)
        if key is None or math.isnan(sample.value) or label not in sample.labels:
            continue
        out.setdefault(key, {})[sample.labels[label]] = sample.value
    return out


def _parse_le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _buckets(by_le: Mapping[str, float] | None) -> list[tuple[float, float]]:
    if not by_le:
        return []
    out = []
    for le, count in by_le.items():
        bound = _parse_le(le)
        if bound is not None:
            out.append((bound, count))
    return out


def _quantile(buckets: Sequence[tuple[float, float]]) -> float | None:
    if not buckets:
        return None
    return _finite(promql.histogram_quantile(LATENCY_QUANTILE, buckets))


def confident_quantile(
    buckets: Sequence[tuple[float, float]], q: float, samples: float, z: float, overdispersion: float
) -> float | None:
    """The latency the ``q`` quantile is at least, at ``z`` standard errors: the histogram's
    quantile at the rank ``q - z * sqrt(q (1 - q) overdispersion / samples)`` (the normal
    approximation of a quantile's rank among ``samples`` observations, inflated because
    requests come in bursts). A window's P95 of a few hundred requests wanders by several
    percent; a breach smaller than that is noise, not a reason to restart. None without a
    histogram."""
    if not buckets or samples <= 0:
        return None
    rank = q - z * math.sqrt(q * (1.0 - q) * overdispersion / samples)
    return _finite(promql.histogram_quantile(max(0.0, rank), buckets))


def _mean(total: float | None, count: float | None) -> float | None:
    if total is None or count is None or count <= 0:
        return None
    return _finite(total / count)


def _positions(by_position: Mapping[str, float] | None) -> tuple[float, ...]:
    if not by_position:
        return ()
    indexed: dict[int, float] = {}
    for text, value in by_position.items():
        try:
            indexed[int(text)] = value
        except ValueError:
            continue
    if not indexed:
        return ()
    # A position missing in the middle (no series yet) accepted nothing.
    return tuple(indexed.get(i, 0.0) for i in range(max(indexed) + 1))


def build_observations(
    results: QueryResults, *, window_s: float, evaluated_at: float
) -> dict[ConfigKey, Observation]:
    """One observation per (namespace, service, config hash) found in any result.

    Pure: the production reader and the benchmark both call it with the plan's results.
    """
    scalars = {
        spec.name: _by_key(results.get(spec.name, ()))
        for spec in QUERY_SPECS
        if not spec.extra_by
    }
    per_position = _by_key_and_label(results.get("accepted_per_position", ()), N.LABEL_POSITION)
    pods_by_name = _by_key_and_label(results.get("pods", ()), LABEL_NAME)
    e2e_buckets = _by_key_and_label(results.get("e2e_buckets", ()), LABEL_LE)
    tpot_buckets = _by_key_and_label(results.get("tpot_buckets", ()), LABEL_LE)

    keys: set[ConfigKey] = (
        set(per_position) | set(e2e_buckets) | set(tpot_buckets) | set(pods_by_name)
    )
    for values in scalars.values():
        keys.update(values)

    def get(name: str, key: ConfigKey) -> float | None:
        return scalars[name].get(key)

    observations: dict[ConfigKey, Observation] = {}
    for key in sorted(keys, key=lambda k: (k.namespace, k.service, k.config_hash)):
        speculation: SpeculationCounts | None = None
        drafts = get("drafts", key)
        if drafts is not None:
            speculation = SpeculationCounts(
                drafts=max(drafts, 0.0),
                draft_tokens=max(get("draft_tokens", key) or 0.0, 0.0),
                accepted_tokens=max(get("accepted_tokens", key) or 0.0, 0.0),
                accepted_per_position=_positions(per_position.get(key)),
            )
        e2e_count = get("e2e_count", key)
        requests = max(e2e_count or 0.0, 0.0)
        pods_seen = pods_by_name.get(key, {})
        pods = int(sum(pods_seen.values()))
        itl_count = get("itl_count", key)
        # Parsed once: the P95s and the confidence in them (`confident_quantile`) read them.
        e2e_histogram = tuple(_buckets(e2e_buckets.get(key))) if requests > 0 else ()
        tpot_histogram = tuple(_buckets(tpot_buckets.get(key))) if requests > 0 else ()

        def per_second(name: str) -> float | None:
            value = get(name, key)
            return None if value is None else max(value, 0.0) / window_s

        observations[key] = Observation(
            key=key,
            window_s=window_s,
            evaluated_at=evaluated_at,
            newest_sample_at=get("newest_sample", key),
            pods=pods,
            speculation=speculation,
            requests=requests,
            e2e_p95_s=_quantile(e2e_histogram),
            e2e_mean_s=_mean(get("e2e_sum", key), e2e_count),
            tpot_p95_s=_quantile(tpot_histogram),
            tpot_mean_s=_mean(get("tpot_sum", key), get("tpot_count", key)),
            step_time_mean_s=_mean(get("itl_sum", key), itl_count),
            steps=max(itl_count or 0.0, 0.0),
            running=_running(get("running_sum", key), get("running_samples", key), pods),
            waiting=get("waiting", key),
            kv_cache_usage=get("kv_cache_usage", key),
            preemption_rate=per_second("preemptions"),
            generation_tps=per_second("generation_tokens"),
            prompt_tps=per_second("prompt_tokens"),
            peak_running=get("peak_running", key),
            queue_change=_queue_change(get("waiting_change", key), get("running_change", key)),
            requests_counted=e2e_count is not None,
            e2e_buckets=e2e_histogram,
            tpot_buckets=tpot_histogram,
            metric_spellings=tuple(
                prefix for prefix in SPELLINGS if any(spelling_of(n) == prefix for n in pods_seen)
            ),
        )
    return observations


def _queue_change(waiting: float | None, running: float | None) -> float | None:
    """Requests in the system gained over the window; None unless both gauges were read."""
    return None if waiting is None or running is None else waiting + running


def service_request_rate(observations: Iterable[Observation]) -> float | None:
    """Finished requests per second of a service over one window, summed over its configs
    (one `MetricsSnapshot.for_service` answer); None when it has none."""
    found = list(observations)
    if not found:
        return None
    return sum(obs.requests for obs in found) / found[0].window_s


# --- Emulated evaluation on raw series (pure; benchmark and e2e check) ---------------------


@dataclass(frozen=True)
class RawSeries:
    """One scraped time series: its full label set (``__name__`` included) and samples.

    ``stale_at`` is when the series vanished (pod deleted, series dropped): Prometheus
    writes a staleness marker then, and instant queries stop returning it.
    """

    labels: Mapping[str, str]
    samples: Sequence[Sample]
    stale_at: float | None = None

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


def _matches(series: RawSeries, names: tuple[str, ...], scope: QueryScope) -> bool:
    if series.name not in names or not series.labels.get(constants.PROM_LABEL_SERVICE):
        return False
    return all(series.labels.get(name, "") == value for name, value in scope.matchers)


def _series_value(
    spec: QuerySpec, series: RawSeries, at: float, window_s: float, rules: PromQLRules
) -> float | None:
    over_range = promql.RANGE_FUNCTIONS.get(spec.function)
    if over_range is not None:
        return over_range(series.samples, at, window_s, rules)
    sample = promql.instant_sample(series.samples, at, rules, series.stale_at)
    if sample is None:
        return None
    return sample[0] if spec.function == "timestamp" else sample[1]


def _aggregate(aggregation: str, values: list[float]) -> float:
    if aggregation == "sum":
        return math.fsum(values)
    if aggregation == "avg":
        return math.fsum(values) / len(values)
    if aggregation == "max":
        return max(values)
    if aggregation == "count":
        return float(len(values))
    raise ValueError(f"unknown aggregation {aggregation!r}")


def evaluate_query(
    spec: QuerySpec,
    scope: QueryScope,
    series: Iterable[RawSeries],
    at: float,
    rules: PromQLRules = promql.PROMETHEUS_3,
) -> list[VectorSample]:
    """What Prometheus would answer to ``spec.promql(scope)`` at ``at`` on these series.

    ``f(A) or f(B)``: a series stored under the escaped name counts only where no series
    with the same labels answered under vLLM's own name.
    """
    names = spec.names
    by = GROUP_LABELS + spec.extra_by
    chosen: dict[frozenset[tuple[str, str]], tuple[int, Mapping[str, str], float]] = {}
    for item in series:
        if not _matches(item, names, scope):
            continue
        value = _series_value(spec, item, at, scope.window_s, rules)
        if value is None:
            continue
        rank = names.index(item.name)
        identity = frozenset((k, v) for k, v in item.labels.items() if k != LABEL_NAME)
        if identity not in chosen or rank < chosen[identity][0]:
            chosen[identity] = (rank, item.labels, value)
    groups: dict[tuple[str, ...], list[float]] = {}
    for _, labels, value in chosen.values():
        group = tuple(labels.get(label, "") for label in by)
        groups.setdefault(group, []).append(value)
    return [
        VectorSample(
            {label: value for label, value in zip(by, group) if value != ""},
            _aggregate(spec.aggregation, values),
        )
        for group, values in sorted(groups.items())
    ]


def evaluate_plan(
    scope: QueryScope,
    series: Sequence[RawSeries],
    at: float,
    rules: PromQLRules = promql.PROMETHEUS_3,
) -> dict[str, list[VectorSample]]:
    """The emulated results of a scope's whole plan at ``at``."""
    return {spec.name: evaluate_query(spec, scope, series, at, rules) for spec in scope.specs}


def observe_series(
    scope: QueryScope,
    series: Sequence[RawSeries],
    at: float,
    rules: PromQLRules = promql.PROMETHEUS_3,
) -> dict[ConfigKey, Observation]:
    """Emulated plan plus the production observation core: what the operator would see."""
    return build_observations(
        evaluate_plan(scope, series, at, rules), window_s=scope.window_s, evaluated_at=at
    )


# --- Reading Prometheus: the values the shell's reader (shell/prometheus.py) returns -------


@dataclass(frozen=True)
class PrometheusAccess:
    """How to reach Prometheus (or Thanos, Mimir, a managed service)."""

    url: str
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    """Read on every tick, so that rotated service-account tokens keep working."""
    ca_bundle: str | None = None
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        token = self.bearer_token
        if self.bearer_token_file:
            with open(self.bearer_token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


@dataclass(frozen=True)
class MetricsSnapshot:
    """A successful read: observations per scope, all evaluated at one instant."""

    evaluated_at: float
    observations: Mapping[QueryScope, Mapping[ConfigKey, Observation]]
    queries: int
    _by_service: dict[QueryScope, dict[tuple[str, str], dict[str, Observation]]] = field(
        init=False, repr=False, compare=False
    )
    """`observations` indexed by (namespace, service), built once per read: every service of
    the tick looks up its own, and a scan of the whole fleet's keys per lookup made each
    evaluation's cost grow with the fleet."""

    def __post_init__(self) -> None:
        index: dict[QueryScope, dict[tuple[str, str], dict[str, Observation]]] = {}
        for scope, by_key in self.observations.items():
            services = index[scope] = {}
            for key, obs in by_key.items():
                services.setdefault((key.namespace, key.service), {})[key.config_hash] = obs
        object.__setattr__(self, "_by_service", index)

    def for_service(
        self, scope: QueryScope, namespace: str, service: str
    ) -> dict[str, Observation]:
        """The observations of one service in a scope, by config hash."""
        return dict(self._by_service.get(scope, {}).get((namespace, service), {}))


@dataclass(frozen=True)
class MetricsUnavailable:
    """Prometheus could not answer: hold every decision (fail static)."""

    reason: str
    """A condition reason (`constants.REASON_METRICS_MISSING`)."""
    message: str
    evaluated_at: float


ReadResult = MetricsSnapshot | MetricsUnavailable


class PrometheusQueryError(Exception):
    """A query failed; carries a one-line, user-facing description."""


def parse_vector(data: Any) -> list[VectorSample]:
    """Parse the ``result`` list of an instant-vector response (values as strings,
    ``NaN``/``+Inf`` included)."""
    if not isinstance(data, list):
        raise PrometheusQueryError(f"expected a vector result, got {type(data).__name__}")
    out: list[VectorSample] = []
    for item in data:
        try:
            labels = item["metric"]
            if not all(type(k) is str and type(v) is str for k, v in labels.items()):
                labels = {str(k): str(v) for k, v in labels.items()}
            else:
                # A fleet's read holds 60,000 of these at once (one per service, bucket and
                # query): the decoded answer's own dicts, each name and value once per text.
                for key, text in labels.items():
                    labels[key] = sys.intern(text)
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise PrometheusQueryError(f"malformed vector element {item!r}: {err}") from err
        out.append(VectorSample(labels, value))
    return out
