"""The metrics reader's pure core against a real Prometheus.

A prometheus_client HTTP server stands for two vLLM pods (one of them restarts, so its
counters reset); a real Prometheus (Debian package) scrapes it every second with the labels a
PodMonitor gives. We then ask Prometheus for the raw samples it stored and check that the
emulation in `specdecode.control.promql` / `specdecode.control.metrics.evaluate_plan` gives the same answers
as Prometheus itself: the whole query plan, ``rate()`` and ``histogram_quantile`` included,
at several evaluation instants and windows.

The Prometheus process is started by a small fixture of this module (the shared local-stack
helper did not exist when this test was written); it only needs /usr/bin/prometheus.

The pods answer through prometheus_client's own content negotiation, as vLLM's server does,
so Prometheus 2.x stores their series as `vllm_...`; in the `mixed` stack one pod answers in
the classic text format (`vllm:...`, what a `PrometheusText0.0.4` scrape protocol gets), so
the service's series are stored under both names and the reader must add them up.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import threading
import time

import pytest
import requests
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from specdecode import constants
from specdecode.control import metrics, promql
from specdecode.control.metrics import PrometheusAccess, QueryScope, RawSeries
from specdecode.shell.prometheus import PrometheusReader
from specdecode.tools.sim.exposition import exposition

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed"),
]

PROM_BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_INTERVAL_S = 1
E2E_BOUNDS = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "+Inf"]
TPOT_BOUNDS = ["0.01", "0.025", "0.05", "0.075", "0.1", "+Inf"]


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port != 9090:
            return port


class FakeVLLMPod:
    """Counters, histograms and gauges of one vLLM pod, stepped by the test."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """The pod's process restarted: every counter is back to zero."""
        with self.lock:
            self.drafts = 0.0
            self.accepted_per_pos = [0.0] * self.k
            self.e2e = [0.0] * len(E2E_BOUNDS)
            self.e2e_sum = 0.0
            self.tpot = [0.0] * len(TPOT_BOUNDS)
            self.tpot_sum = 0.0
            self.itl_count = 0.0
            self.itl_sum = 0.0
            self.generation = 0.0
            self.running = 0.0
            self.waiting = 0.0

    def step(self, i: int) -> None:
        with self.lock:
            drafts = 3 + i % 5
            self.drafts += drafts
            accepted = drafts
            for pos in range(self.k):
                accepted = accepted * (0.8 if (i + pos) % 3 else 0.6)
                self.accepted_per_pos[pos] += round(accepted)
            latency_bucket = (i * 7) % (len(E2E_BOUNDS))
            self.e2e[latency_bucket] += 1 + i % 2
            self.e2e_sum += 0.4 + 0.1 * latency_bucket
            tpot_bucket = (i * 3) % len(TPOT_BOUNDS)
            self.tpot[tpot_bucket] += 1 + i % 2
            self.tpot_sum += 0.02 * (1 + tpot_bucket)
            self.itl_count += 10 + i % 4
            self.itl_sum += 0.15 + 0.01 * (i % 3)
            self.generation += 40 + 3 * (i % 7)
            self.running = float(i % 9)
            # A queue that grows and drains by turns: the reader's delta() of it.
            self.waiting = float((i * 5) % 23)

    def collect(self):
        with self.lock:
            base = ["model_name", "engine"]
            ids = ["m", "0"]
            drafts = CounterMetricFamily("vllm:spec_decode_num_drafts", "", labels=base)
            drafts.add_metric(ids, self.drafts)
            tokens = CounterMetricFamily("vllm:spec_decode_num_draft_tokens", "", labels=base)
            tokens.add_metric(ids, self.drafts * self.k)
            accepted = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens", "", labels=base)
            accepted.add_metric(ids, sum(self.accepted_per_pos))
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos", "", labels=base + ["position"]
            )
            for pos, value in enumerate(self.accepted_per_pos):
                per_pos.add_metric(ids + [str(pos)], value)
            yield from (drafts, tokens, accepted, per_pos)
            for name, bounds, counts, total in (
                ("vllm:e2e_request_latency_seconds", E2E_BOUNDS, self.e2e, self.e2e_sum),
                ("vllm:request_time_per_output_token_seconds", TPOT_BOUNDS, self.tpot, self.tpot_sum),
            ):
                family = HistogramMetricFamily(name, "", labels=base)
                cumulative, acc = [], 0.0
                for bound, count in zip(bounds, counts):
                    acc += count
                    cumulative.append((bound, acc))
                family.add_metric(ids, cumulative, sum_value=total)
                yield family
            itl = HistogramMetricFamily("vllm:inter_token_latency_seconds", "", labels=base)
            itl.add_metric(ids, [("+Inf", self.itl_count)], sum_value=self.itl_sum)
            yield itl
            generation = CounterMetricFamily("vllm:generation_tokens", "", labels=base)
            generation.add_metric(ids, self.generation)
            yield generation
            running = GaugeMetricFamily("vllm:num_requests_running", "", labels=base)
            running.add_metric(ids, self.running)
            yield running
            waiting = GaugeMetricFamily("vllm:num_requests_waiting", "", labels=base)
            waiting.add_metric(ids, self.waiting)
            yield waiting


def serve(registry: CollectorRegistry, port: int, accepts: list[str], classic: bool) -> ThreadingHTTPServer:
    """Serve ``registry`` as vLLM does (the format negotiated from the scraper's Accept
    header), or, with ``classic``, as if the scraper had asked for the classic text format.
    Records the Accept headers seen."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            accept = self.headers.get("Accept") or ""
            accepts.append(accept)
            body, content_type = exposition(registry, CONTENT_TYPE_LATEST if classic else accept)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module", params=["negotiated", "mixed"])
def stack(request, tmp_path_factory):
    """Two fake pods on their own ports and a real Prometheus scraping them."""
    tmp = tmp_path_factory.mktemp("prom")
    pods = {"pod-a": FakeVLLMPod(k=3), "pod-b": FakeVLLMPod(k=3)}
    ports = {}
    servers = []
    accepts: list[str] = []
    for name, pod in pods.items():
        registry = CollectorRegistry()
        registry.register(pod)
        ports[name] = free_port()
        classic = request.param == "mixed" and name == "pod-a"
        servers.append(serve(registry, ports[name], accepts, classic))

    targets = "\n".join(
        f"""  - targets: ["127.0.0.1:{ports[name]}"]
    labels:
      namespace: team-a
      pod: {name}
      {constants.PROM_LABEL_SERVICE}: llama
      {constants.PROM_LABEL_CONFIG_HASH}: cfg1"""
        for name in pods
    )
    config = tmp / "prometheus.yml"
    config.write_text(
        f"""global:
  scrape_interval: {SCRAPE_INTERVAL_S}s
  scrape_timeout: {SCRAPE_INTERVAL_S}s
scrape_configs:
- job_name: vllm
  static_configs:
{targets}
"""
    )
    port = free_port()
    log = open(tmp / "prometheus.log", "w")
    process = subprocess.Popen(
        [
            PROM_BINARY,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError((tmp / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        version = requests.get(f"{url}/api/v1/status/buildinfo", timeout=2).json()["data"]["version"]

        # Step the pods for ~24 s; pod-b restarts half-way (its counters reset).
        for i in range(48):
            for name, pod in pods.items():
                if name == "pod-b" and i == 24:
                    pod.reset()
                pod.step(i)
            time.sleep(0.5)
        STACK_INFO.update(mode=request.param, version=version, accepts=set(accepts))
        yield url, promql.rules_for_version(version), time.time()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        for server in servers:
            server.shutdown()
            server.server_close()


STACK_INFO: dict = {}
"""The current stack's mode, Prometheus version and the Accept headers its scrapes sent."""


def either(name: str) -> str:
    """``name`` under both spellings, each series once (as the reader's queries do)."""
    return f"({name} or {name.replace('vllm:', 'vllm_', 1)})"


def canonical(series_name: str) -> str:
    return series_name.replace("vllm_", "vllm:", 1)


def query(url: str, text: str, at: float) -> list[dict]:
    response = requests.get(
        f"{url}/api/v1/query", params={"query": text, "time": f"{at:.3f}"}, timeout=5
    )
    response.raise_for_status()
    return response.json()["data"]["result"]


def raw_series(url: str, at: float) -> list[RawSeries]:
    """Every sample Prometheus stored for our series in the last 5 minutes before ``at``."""
    result = query(url, f'{{__name__=~"vllm[:_].+", {constants.PROM_LABEL_SERVICE}!=""}}[300s]', at)
    return [
        RawSeries(item["metric"], [(float(t), float(v)) for t, v in item["values"]])
        for item in result
    ]


def latest_sample_time(url: str) -> float:
    result = query(url, f"max(timestamp({either('vllm:num_requests_running')}))", time.time())
    return float(result[0]["value"][1])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("window_s", [5, 10, 20])
def test_emulated_plan_matches_prometheus(stack, window_s):
    url, rules, _ = stack
    end = latest_sample_time(url)
    reader = PrometheusReader(PrometheusAccess(url, timeout_s=5))
    scope = QueryScope.of(window_s, {"namespace": "team-a"})
    for offset in (0.0, 0.37, 3.3, 7.81):
        at = round(end - offset, 3)
        series = raw_series(url, at)
        assert series, "Prometheus stored no samples"
        emulated = metrics.evaluate_plan(scope, series, at, rules)
        for planned in metrics.build_query_plan(scope):
            real = {
                tuple(sorted(item["metric"].items())): float(item["value"][1])
                for item in query(url, planned.text, at)
            }
            mine = {tuple(sorted(s.labels.items())): s.value for s in emulated[planned.spec.name]}
            assert set(real) == set(mine), planned.text
            for labels, value in real.items():
                assert close(value, mine[labels]), (planned.text, at, value, mine[labels])

        real_result = reader.read([scope], at)
        assert isinstance(real_result, metrics.MetricsSnapshot)
        real_obs = real_result.observations[scope]
        emulated_obs = metrics.observe_series(scope, series, at, rules)
        assert set(real_obs) == set(emulated_obs)
        for key, obs in real_obs.items():
            other = emulated_obs[key]
            assert close(obs.speculation.alpha, other.speculation.alpha)
            assert close(obs.e2e_p95_s, other.e2e_p95_s)
            assert close(obs.tpot_p95_s, other.tpot_p95_s)
            assert close(obs.step_time_mean_s, other.step_time_mean_s)
            assert obs.queue_change is not None and close(obs.queue_change, other.queue_change)
            assert close(obs.arrival_rate, other.arrival_rate)
            assert obs.pods == other.pods == 2


def test_reader_finds_the_series_under_the_names_prometheus_stored(stack):
    url, _, _ = stack
    if not STACK_INFO["version"].startswith("2."):
        pytest.skip("Prometheus 3 may ask for UTF-8 names")
    # Prometheus 2.x asks for OpenMetrics first; prometheus_client then escapes the names.
    assert all(a.startswith("application/openmetrics-text;version=1.0.0,") for a in STACK_INFO["accepts"])
    scope = QueryScope.of(10, {"namespace": "team-a"})
    result = PrometheusReader(PrometheusAccess(url, timeout_s=5)).read([scope], latest_sample_time(url))
    assert isinstance(result, metrics.MetricsSnapshot)
    (obs,) = result.observations[scope].values()
    assert obs.pods == 2 and obs.speculation is not None and obs.speculation.k == 3
    expected = ("vllm_",) if STACK_INFO["mode"] == "negotiated" else ("vllm:", "vllm_")
    assert obs.metric_spellings == expected
    assert result.queries == len(metrics.QUERY_SPECS)  # one query per family, either spelling


@pytest.mark.timeout(120)
def test_the_trend_scope_reads_the_full_plans_finished_requests_in_one_query(stack):
    """The capacity hedge's trend window costs one query per selector; on the real
    Prometheus it counts the same finished requests as the full plan's query over the same
    window, and the emulation the benchmark uses agrees."""
    url, rules, _ = stack
    at = latest_sample_time(url)
    full = QueryScope.of(20, {"namespace": "team-a"})
    load = QueryScope.of(20, {"namespace": "team-a"}, load_only=True)
    result = PrometheusReader(PrometheusAccess(url, timeout_s=5)).read([full, load], at)
    assert isinstance(result, metrics.MetricsSnapshot)
    assert result.queries == len(metrics.QUERY_SPECS) + 1
    by_full, by_load = result.observations[full], result.observations[load]
    assert by_load and set(by_load) == set(by_full)
    emulated = metrics.observe_series(load, raw_series(url, at), at, rules)
    for key, obs in by_load.items():
        assert obs.requests > 0 and close(obs.requests, by_full[key].requests)
        assert close(obs.requests, emulated[key].requests)
        assert obs.speculation is None and obs.e2e_p95_s is None  # nothing else was asked


@pytest.mark.timeout(120)
def test_rate_and_histogram_quantile_match_prometheus(stack):
    url, rules, _ = stack
    end = latest_sample_time(url)
    group = f"namespace, {constants.PROM_LABEL_SERVICE}"
    for offset in (0.0, 1.5, 6.25):
        at = round(end - offset, 3)
        series = raw_series(url, at)
        for window in (4, 9, 15):
            # rate() per series, including pod-b's reset.
            drafts = "vllm:spec_decode_num_drafts_total"
            text = f"rate({drafts}[{window}s]) or rate({drafts.replace(':', '_')}[{window}s])"
            for item in query(url, text, at):
                pod = item["metric"]["pod"]
                samples = next(
                    s.samples for s in series
                    if canonical(s.name) == drafts and s.labels["pod"] == pod
                )
                assert close(float(item["value"][1]), promql.rate(samples, at, window, rules))

            # histogram_quantile over the service's summed bucket rates.
            text = (
                f"histogram_quantile(0.95, sum by ({group}, le) "
                f"(rate(vllm:e2e_request_latency_seconds_bucket[{window}s])"
                f" or rate(vllm_e2e_request_latency_seconds_bucket[{window}s])))"
            )
            real = query(url, text, at)
            assert len(real) == 1
            buckets: dict[float, float] = {}
            for s in series:
                if canonical(s.name) != "vllm:e2e_request_latency_seconds_bucket":
                    continue
                value = promql.rate(s.samples, at, window, rules)
                if value is not None:
                    bound = float(s.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + value
            mine = promql.histogram_quantile(0.95, buckets.items())
            assert close(float(real[0]["value"][1]), mine), (window, at)


@pytest.mark.timeout(60)
def test_idle_window_gives_nan_quantile_in_both(stack):
    url, rules, stopped_at = stack
    # Wait until a 2 s window lies entirely after the last step: no increase, no requests.
    while latest_sample_time(url) < stopped_at + 3.5:
        time.sleep(0.5)
    at = round(latest_sample_time(url), 3)
    text = ("histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[2s])"
            " or rate(vllm_e2e_request_latency_seconds_bucket[2s])))")
    real = query(url, text, at + 0.001)
    series = raw_series(url, at)
    buckets: dict[float, float] = {}
    for s in series:
        if canonical(s.name) == "vllm:e2e_request_latency_seconds_bucket":
            value = promql.rate(s.samples, at + 0.001, 2, rules)
            if value is not None:
                buckets[float(s.labels["le"])] = buckets.get(float(s.labels["le"]), 0.0) + value
    mine = promql.histogram_quantile(0.95, buckets.items())
    assert math.isnan(mine)
    assert real and math.isnan(float(real[0]["value"][1]))


def test_prometheus_stopped_is_unavailable():
    reader = PrometheusReader(PrometheusAccess(f"http://127.0.0.1:{free_port()}", timeout_s=2))
    result = reader.read([QueryScope.of(30)], at=time.time())
    assert isinstance(result, metrics.MetricsUnavailable)



DASHBOARD = (
    __import__("pathlib").Path(__file__).resolve().parents[2]
    / "manifests" / "overlays" / "prometheus-operator" / "dashboards" / "specdecode.json"
)


def test_dashboard_panels_read_the_pods_under_either_name(stack):
    """The shipped dashboard's vLLM panels on the series as this Prometheus stored them: the
    acceptance rate agrees with the reader's, and the running requests add up both pods."""
    import json

    url, _, _ = stack
    at = latest_sample_time(url)
    panels = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in json.loads(DASHBOARD.read_text())["panels"]}

    def panel(title: str, index: int = 0) -> list[dict]:
        expr = panels[title][index]
        for variable, value in {"$__rate_interval": "10s", "$namespace": "team-a", "$service": "llama"}.items():
            expr = expr.replace(variable, value)
        return query(url, expr, at)

    (acceptance,) = panel("Acceptance rate")
    scope = QueryScope.of(10, {"namespace": "team-a"})
    result = PrometheusReader(PrometheusAccess(url, timeout_s=5)).read([scope], at)
    (obs,) = result.observations[scope].values()
    assert float(acceptance["value"][1]) == pytest.approx(obs.speculation.acceptance_rate, rel=0.05)
    (running,) = panel("Requests running and waiting")
    # Both pods' gauges, each once, whichever name each is stored under.
    panels["pods"] = [panels["Requests running and waiting"][0].replace("sum by", "count by", 1)]
    (pods,) = panel("pods")
    assert float(pods["value"][1]) == 2 and float(running["value"][1]) > 0
