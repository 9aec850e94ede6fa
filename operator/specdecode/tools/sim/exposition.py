"""vLLM 0.33's Prometheus metrics for one simulated pod: names, labels, buckets, HELP texts.

Everything here was read from the vLLM 0.33.0 wheel (vllm/v1/metrics/loggers.py,
vllm/v1/metrics/buckets.py, vllm/v1/spec_decode/metrics.py, vllm/v1/engine/__init__.py):
- labels `model_name` (the served model name) and `engine` (engine index, "0");
- spec-decode counters registered only when speculation is configured, the per-position
  counter with position "0".."K-1" for K = num_speculative_tokens;
- `request_success_total{finished_reason}` pre-created for every finish reason;
- bucket families (`--custom-histogram-buckets` replaces a family's defaults):
  request_latency -> e2e, queue, inference, prefill, decode; time_to_first_token -> TTFT;
  inter_token_latency -> inter-token latency AND per-request time per output token.
vLLM 0.33's API server serves prometheus_client's default registry (vllm/v1/metrics/
prometheus.py `get_prometheus_registry`; the multiprocess registry only when
`--api-server-count` > 1, vllm/entrypoints/cli/serve.py `run_multi_api_server`), so its
counters and histograms come with `_created` series; a `PodMetrics` given its creation
time serves them too.

`/metrics` goes through prometheus_client's own content negotiation (`exposition`), as
vLLM's `make_asgi_app` mount does (vllm/entrypoints/serve/instrumentator/metrics.py):
Prometheus 2.x asks for OpenMetrics first and gets every name escaped to `vllm_...`;
a scraper asking for the classic text format, or for OpenMetrics with
`escaping=allow-utf-8` (Prometheus 3), gets `vllm:...`.

`PodMetrics` holds the counters of one pod's lifetime (they start at zero and only grow);
its `collect()` makes it a prometheus_client collector for a per-pod CollectorRegistry.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

LABEL_MODEL_NAME = "model_name"
LABEL_ENGINE = "engine"
LABEL_POSITION = "position"
LABEL_FINISHED_REASON = "finished_reason"
ENGINE_INDEX = "0"

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# Counter names without the `_total` suffix prometheus_client adds in the exposition.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"

E2E = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"

REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

DEFAULT_BUCKETS: dict[str, tuple[float, ...]] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
    "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
}

# Which bucket family each latency histogram draws from (vllm/v1/metrics/loggers.py).
HISTOGRAM_FAMILY: dict[str, str] = {
    E2E: "request_latency",
    QUEUE_TIME: "request_latency",
    INFERENCE_TIME: "request_latency",
    PREFILL_TIME: "request_latency",
    DECODE_TIME: "request_latency",
    TTFT: "time_to_first_token",
    INTER_TOKEN_LATENCY: "inter_token_latency",
    REQUEST_TPOT: "inter_token_latency",
}

HELP: dict[str, str] = {
    SPEC_DRAFTS: "Number of spec decoding drafts.",
    SPEC_DRAFT_TOKENS: "Number of draft tokens.",
    SPEC_ACCEPTED_TOKENS: "Number of accepted tokens.",
    SPEC_ACCEPTED_PER_POS: "Accepted tokens per draft position.",
    GENERATION_TOKENS: "Number of generation tokens processed.",
    PROMPT_TOKENS: "Number of prefill tokens processed.",
    PREEMPTIONS: "Cumulative number of preemption from the engine.",
    REQUEST_SUCCESS: "Count of successfully processed requests.",
    RUNNING: "Number of requests in model execution batches.",
    WAITING: "Number of requests waiting to be processed.",
    KV_CACHE_USAGE: "KV-cache usage. 1 means 100 percent usage.",
    E2E: "Histogram of e2e request latency in seconds.",
    QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    INFERENCE_TIME: "Histogram of time spent in RUNNING phase for request.",
    PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    TTFT: "Histogram of time to first token in seconds.",
    INTER_TOKEN_LATENCY: "Histogram of inter-token latency in seconds.",
    REQUEST_TPOT: "Histogram of time_per_output_token_seconds per request.",
}


def bucket_bounds(custom: Mapping[str, Sequence[float]] | None = None) -> dict[str, tuple[float, ...]]:
    """Finite upper bounds of each latency histogram, after `--custom-histogram-buckets`."""
    families = dict(DEFAULT_BUCKETS)
    for family, bounds in (custom or {}).items():
        if family in families:
            families[family] = tuple(float(b) for b in bounds)
    return {name: families[family] for name, family in HISTOGRAM_FAMILY.items()}


@dataclass
class Histogram:
    """One histogram's buckets (non-cumulative counts, the last one is +Inf) and its sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # Prometheus buckets are `le`: a value equal to a bound belongs to that bucket.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, counts: Sequence[int], total: float) -> None:
        """Add many observations at once, already bucketed (len(bounds) + 1 counts)."""
        if len(counts) != len(self.counts):
            raise ValueError(f"expected {len(self.counts)} bucket counts, got {len(counts)}")
        for i, c in enumerate(counts):
            self.counts[i] += int(c)
        self.total += total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts):
            acc += c
            out.append((_le(bound), float(acc)))
        out.append(("+Inf", float(acc + self.counts[-1])))
        return out


def _le(bound: float) -> str:
    # The same rendering as prometheus_client's own Histogram (and so vLLM): "0.3", "1.0".
    return floatToGoString(bound)


class PodMetrics:
    """The metrics one vLLM pod exposes over its lifetime; a prometheus_client collector.

    `spec_tokens` is num_speculative_tokens, or None when the pod runs without speculation
    (then no spec-decode series exist, as in vLLM). Updates and scrapes may come from
    different threads: every access goes through `lock`.
    """

    def __init__(
        self,
        model_name: str,
        spec_tokens: int | None,
        custom_buckets: Mapping[str, Sequence[float]] | None = None,
        created: float | None = None,
    ) -> None:
        if spec_tokens is not None and spec_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {spec_tokens}")
        self.model_name = model_name
        self.spec_tokens = spec_tokens
        self.created = created
        """When the pod's metrics were created (epoch seconds): the `_created` samples of its
        counters and histograms; None serves none (a pure test needs no clock)."""
        self.lock = threading.Lock()
        self.counters: dict[str, float] = {
            GENERATION_TOKENS: 0.0,
            PROMPT_TOKENS: 0.0,
            PREEMPTIONS: 0.0,
        }
        self.request_success: dict[str, float] = {reason: 0.0 for reason in FINISH_REASONS}
        if spec_tokens is not None:
            self.counters.update({SPEC_DRAFTS: 0.0, SPEC_DRAFT_TOKENS: 0.0, SPEC_ACCEPTED_TOKENS: 0.0})
        self.accepted_per_pos: list[float] = [0.0] * (spec_tokens or 0)
        self.gauges: dict[str, float] = {RUNNING: 0.0, WAITING: 0.0, KV_CACHE_USAGE: 0.0}
        self.histograms: dict[str, Histogram] = {
            name: Histogram(bounds) for name, bounds in bucket_bounds(custom_buckets).items()
        }

    # --- updates (callers hold `lock`) ---------------------------------------------------

    def inc(self, name: str, amount: float) -> None:
        if amount < 0:
            raise ValueError(f"{name}: counters only go up (got {amount})")
        self.counters[name] += amount

    # --- prometheus_client collector -----------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            yield from self._families()

    def describe(self) -> Iterable[Metric]:
        # Describing by collecting would take the lock at registration; nothing to check.
        return []

    def _families(self) -> Iterator[Metric]:
        base = [LABEL_MODEL_NAME, LABEL_ENGINE]
        ids = [self.model_name, ENGINE_INDEX]
        if self.spec_tokens is not None:
            for name in (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS):
                family = CounterMetricFamily(name, HELP[name], labels=base)
                family.add_metric(ids, self.counters[name], created=self.created)
                yield family
            per_pos = CounterMetricFamily(
                SPEC_ACCEPTED_PER_POS, HELP[SPEC_ACCEPTED_PER_POS], labels=base + [LABEL_POSITION]
            )
            for pos, value in enumerate(self.accepted_per_pos):
                per_pos.add_metric(ids + [str(pos)], value, created=self.created)
            yield per_pos
        for name in (PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS):
            family = CounterMetricFamily(name, HELP[name], labels=base)
            family.add_metric(ids, self.counters[name], created=self.created)
            yield family
        success = CounterMetricFamily(
            REQUEST_SUCCESS, HELP[REQUEST_SUCCESS], labels=base + [LABEL_FINISHED_REASON]
        )
        for reason, value in self.request_success.items():
            success.add_metric(ids + [reason], value, created=self.created)
        yield success
        for name, value in self.gauges.items():
            gauge = GaugeMetricFamily(name, HELP[name], labels=base)
            gauge.add_metric(ids, value)
            yield gauge
        for name, histogram in self.histograms.items():
            family = HistogramMetricFamily(name, HELP[name], labels=base)
            family.add_metric(ids, histogram.cumulative(), sum_value=histogram.total)
            if self.created is not None:
                family.add_sample(name + "_created", dict(zip(base, ids)), self.created)
            yield family


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The body and Content-Type of a /metrics answer to a scraper's ``Accept`` header:
    prometheus_client's own negotiation (`choose_encoder`), the one vLLM's server runs."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def lognormal_bucket_probabilities(bounds: Sequence[float], mu: float, sigma: float) -> list[float]:
    """P(value in each bucket) for a lognormal(mu, sigma): len(bounds) + 1 probabilities."""
    cdf = []
    for b in bounds:
        if b <= 0:
            cdf.append(0.0)
        elif sigma <= 0:
            cdf.append(1.0 if math.log(b) >= mu else 0.0)
        else:
            cdf.append(0.5 * math.erfc(-(math.log(b) - mu) / (sigma * math.sqrt(2.0))))
    probs = []
    prev = 0.0
    for c in cdf:
        probs.append(max(0.0, c - prev))
        prev = max(prev, c)
    probs.append(max(0.0, 1.0 - prev))
    return probs
