"""vLLM's metric names (0.33, V1 engine; REFERENCE.md), shared by the reader
(control/metrics.py, which queries them) and the simulator (tools/sim/exposition.py, which
serves them).

Counters are named as vLLM declares them, without the `_total` suffix prometheus_client adds
in the exposition (`total(name)` is the series name Prometheus stores); histograms as their
family name (`_bucket`, `_sum`, `_count` series).
"""

from __future__ import annotations

# --- counters --------------------------------------------------------------------------------
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"

# --- gauges ----------------------------------------------------------------------------------
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"

# --- histograms ------------------------------------------------------------------------------
E2E = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"

# --- labels ----------------------------------------------------------------------------------
LABEL_MODEL_NAME = "model_name"
LABEL_ENGINE = "engine"
LABEL_POSITION = "position"
LABEL_FINISHED_REASON = "finished_reason"


def total(counter: str) -> str:
    """The stored series name of a counter."""
    return counter + "_total"


# How Prometheus stores them. vLLM names its series `vllm:...` and serves /metrics through
# prometheus_client, which negotiates the format with the scraper: Prometheus 2.x asks for
# OpenMetrics first, and prometheus_client (>= 0.22) answers it with every character a classic
# metric name cannot hold escaped to `_`, so Prometheus stores `vllm_...`. The classic text
# format (Prometheus Operator's `scrapeProtocols: [PrometheusText0.0.4]`), an OpenMetrics
# request that allows UTF-8 names (Prometheus 3) or a relabelling back keep `vllm:...`.
SPELLING_COLON = "vllm:"
SPELLING_UNDERSCORE = "vllm_"
SPELLINGS: tuple[str, ...] = (SPELLING_COLON, SPELLING_UNDERSCORE)
"""Both prefixes, in the order the queries prefer them."""


def spellings_of(metric: str) -> tuple[str, ...]:
    """The names one vLLM series can be stored under: as vLLM names it, then escaped."""
    if not metric.startswith(SPELLING_COLON):
        return (metric,)
    return (metric, SPELLING_UNDERSCORE + metric[len(SPELLING_COLON):])


def spelling_of(name: str) -> str | None:
    """Which spelling a stored series name uses (None for a name that is neither)."""
    return next((prefix for prefix in SPELLINGS if name.startswith(prefix)), None)
