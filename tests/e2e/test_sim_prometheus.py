"""The simulator scraped by a real Prometheus: PromQL gives back the scenario's truth.

No Kubernetes here: simulated pods come from a hand-made pod list through the same
`Simulator.sync` the watcher calls; a real Prometheus (Debian package) scrapes the file_sd
targets the simulator writes. Not marked e2e: it needs only /usr/bin/prometheus.

The simulator negotiates the exposition format as vLLM's own server does, so this
Prometheus (2.x, which asks for OpenMetrics) stores every vLLM series as `vllm_...`: the
queries below use the names as stored.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from specdecode import constants as C
from specdecode.render import vllm_args as vllm
from specdecode.tools.localstack.prometheus import find_binary, start_prometheus
from specdecode.control.perfmodel import acceptance_rate, steady_state
from specdecode.tools.scenario import parse_scenario
from specdecode.tools.sim import PodInfo, Simulator

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None and not Path("/usr/bin/prometheus").exists(),
    reason="prometheus is not installed",
)

ALPHA, K, RATE = 0.7, 4, 8.0
SCENARIO = parse_scenario(
    {
        "name": "prom",
        "duration": "1h",
        "seed": 11,
        "method": "draft_model",
        "noise": False,  # the truth exactly: the queries must return the phase's values
        "phases": [{"at": 0, "request_rate": RATE, "prompt_tokens": 1000, "output_tokens": 300,
                    "acceptance": ALPHA}],
    }
)
SPEC = ("vllm", "serve", "org/m", "--served-model-name", "m") + tuple(
    vllm.speculative_args(vllm.SpeculativeConfig("draft_model", K, model="d"), "0.33.0")
)
OFF = ("vllm", "serve", "org/m", "--served-model-name", "m")
GROUP = f"namespace, {C.PROM_LABEL_SERVICE}"


def query(url: str, promql: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.5)


def wait_for_full_window(url: str) -> None:
    """Until every pod has been scraped for longer than the 15 s query window: a counter
    born inside the window has its rate() extrapolated only half an interval past its
    first sample, so early rates read low (Prometheus semantics, not a simulator bug)."""
    wait_for(lambda: len(query(url, "count_over_time(up[20s]) >= 18")) == 3, 90,
             "20 s of scrapes of every pod")


def by_service(result: list[dict]) -> dict[str, float]:
    return {r["metric"][C.PROM_LABEL_SERVICE]: float(r["value"][1]) for r in result}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simprom")
    targets = tmp / "targets.json"
    sim = Simulator(SCENARIO, targets)
    sim.sync([
        PodInfo("team-a", "llama-0", "u0", "llama", "hash-k4", SPEC, True),
        PodInfo("team-a", "llama-1", "u1", "llama", "hash-k4", SPEC, True),
        PodInfo("team-a", "plain-0", "u2", "plain", "hash-off", OFF, True),
    ])
    stop = threading.Event()
    ticker = threading.Thread(target=sim.run, args=(stop, 0.25), daemon=True)
    ticker.start()
    prometheus = start_prometheus(tmp / "prometheus", targets, scrape_interval_s=1.0,
                                  binary=find_binary())
    try:
        yield prometheus.url, sim
    finally:
        stop.set()
        ticker.join(timeout=5)
        prometheus.stop()
        sim.close()


def test_targets_carry_the_podmonitor_labels(stack) -> None:
    url, _ = stack
    result = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(query(url, "up == 1")),
                      30, "three targets up")
    labels = sorted((r["metric"]["pod"], r["metric"][C.PROM_LABEL_SERVICE],
                     r["metric"][C.PROM_LABEL_CONFIG_HASH], r["metric"]["namespace"]) for r in result)
    assert labels == [("llama-0", "llama", "hash-k4", "team-a"),
                      ("llama-1", "llama", "hash-k4", "team-a"),
                      ("plain-0", "plain", "hash-off", "team-a")]


def test_prometheus_2_stores_the_names_escaped_as_it_does_real_vllms(stack) -> None:
    url, _ = stack
    version = json.load(urllib.request.urlopen(f"{url}/api/v1/status/buildinfo", timeout=5))["data"]["version"]
    if not version.startswith("2."):
        pytest.skip(f"Prometheus {version} may allow UTF-8 names")
    wait_for(lambda: len(query(url, "up == 1")) == 3, 30, "three targets up")
    with urllib.request.urlopen(f"{url}/api/v1/label/__name__/values", timeout=5) as response:
        names = [n for n in json.load(response)["data"] if n.startswith("vllm")]
    assert "vllm_spec_decode_num_drafts_total" in names
    assert not [n for n in names if n.startswith("vllm:")]
    # vLLM 0.33 serves the default registry: counters and histograms carry `_created`.
    assert "vllm_spec_decode_num_drafts_created" in names
    assert "vllm_e2e_request_latency_seconds_created" in names


def test_acceptance_rate_query_returns_the_scenarios_acceptance(stack) -> None:
    url, _ = stack
    promql = (
        f"sum by ({GROUP}) (rate(vllm_spec_decode_num_accepted_tokens_total[15s]))"
        f" / sum by ({GROUP}) (rate(vllm_spec_decode_num_draft_tokens_total[15s]))"
    )
    wait_for_full_window(url)
    result = by_service(query(url, promql))
    assert set(result) == {"llama"}  # the pod without speculation has no spec series
    assert result["llama"] == pytest.approx(acceptance_rate(ALPHA, K), abs=0.03)
    first_position = by_service(query(
        url,
        f'sum by ({GROUP}) (rate(vllm_spec_decode_num_accepted_tokens_per_pos_total{{position="0"}}[15s]))'
        f" / sum by ({GROUP}) (rate(vllm_spec_decode_num_drafts_total[15s]))",
    ))
    assert first_position["llama"] == pytest.approx(ALPHA, abs=0.03)


def test_step_time_and_load_follow_the_model(stack) -> None:
    url, sim = stack
    wait_for_full_window(url)
    itl = by_service(query(
        url,
        f"sum by ({GROUP}) (rate(vllm_inter_token_latency_seconds_sum[15s]))"
        f" / sum by ({GROUP}) (rate(vllm_inter_token_latency_seconds_count[15s]))",
    ))
    params = sim.scenario.params
    workload = SCENARIO.phases[0].workload()
    assert itl["llama"] == pytest.approx(steady_state(params, workload, K, 2).step_time_s, rel=0.05)
    assert itl["plain"] == pytest.approx(steady_state(params, workload, 0, 1).step_time_s, rel=0.05)
    generation = by_service(query(url, f"sum by ({GROUP}) (rate(vllm_generation_tokens_total[15s]))"))
    # Each service receives the scenario's whole rate.
    assert generation["llama"] == pytest.approx(RATE * 300, rel=0.25)
    assert generation["plain"] == pytest.approx(RATE * 300, rel=0.25)
