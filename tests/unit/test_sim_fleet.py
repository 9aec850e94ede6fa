"""The simulator's shell: per-pod ports, /health, targets with PodMonitor labels, lifetimes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdecode import constants as C
from specdecode.render import vllm_args as vllm
from specdecode.tools.scenario import parse_scenario
from specdecode.tools.sim import PodInfo, Simulator
from specdecode.tools.sim.fleet import write_atomically

SCENARIO = parse_scenario(
    {
        "name": "fleet",
        "duration": "10m",
        "seed": 5,
        "method": "draft_model",
        "phases": [{"at": 0, "request_rate": 8, "acceptance": 0.8}],
        "metrics_outage": [{"at": "5m", "duration": "1m"}],
    }
)
K3 = ("vllm", "serve", "org/m", "--served-model-name", "m") + tuple(
    vllm.speculative_args(vllm.SpeculativeConfig("draft_model", 3, model="d"), "0.33.0")
)
OFF = ("vllm", "serve", "org/m", "--served-model-name", "m")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, ready: bool = True, args=K3, uid: str | None = None, restarts: int = 0,
        service: str = "llama", namespace: str = "team-a", config_hash: str = "h1") -> PodInfo:
    return PodInfo(namespace, name, uid or f"uid-{name}", service, config_hash, tuple(args), ready,
                   restart_count=restarts)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def counter(port: int, name: str) -> float:
    _, text = get(port, "/metrics")
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def closed(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


@pytest.fixture
def sim(tmp_path: Path):
    clock = Clock()
    s = Simulator(SCENARIO, tmp_path / "sd" / "targets.json", clock=clock)
    s.test_clock = clock  # type: ignore[attr-defined]
    yield s
    s.close()


def advance(sim: Simulator, seconds: float, step: float = 0.5) -> None:
    for _ in range(int(seconds / step)):
        sim.test_clock.now += step  # type: ignore[attr-defined]
        sim.tick()


def test_ready_pods_serve_metrics_and_health_on_their_own_port(sim: Simulator) -> None:
    sim.sync([pod("a"), pod("b", args=OFF), pod("c", ready=False)])
    served = sim.served()
    assert set(served) == {("team-a", "a"), ("team-a", "b")}
    assert len(set(served.values())) == 2 and 9090 not in served.values()
    advance(sim, 5)
    a, b = served[("team-a", "a")], served[("team-a", "b")]
    assert get(a, "/health")[0] == 200
    assert get(a, "/nope")[0] == 404
    assert counter(a, "vllm:spec_decode_num_drafts_total") > 0
    assert "spec_decode" not in get(b, "/metrics")[1]


def test_targets_file_carries_the_podmonitor_labels(sim: Simulator) -> None:
    sim.sync([pod("a"), pod("c", ready=False)])
    groups = json.loads(sim.targets_file.read_text())
    port = sim.served()[("team-a", "a")]
    assert groups == [{
        "targets": [f"127.0.0.1:{port}"],
        "labels": {"namespace": "team-a", "pod": "a", C.PROM_LABEL_SERVICE: "llama",
                   C.PROM_LABEL_CONFIG_HASH: "h1"},
    }]


def test_not_ready_or_deleted_pods_stop_serving(sim: Simulator) -> None:
    sim.sync([pod("a"), pod("b")])
    a, b = sim.served()[("team-a", "a")], sim.served()[("team-a", "b")]
    sim.upsert(pod("a", ready=False))
    sim.remove("team-a", "b")
    assert closed(a) and closed(b)
    assert json.loads(sim.targets_file.read_text()) == []
    sim.upsert(pod("a"))
    assert get(sim.served()[("team-a", "a")], "/health")[0] == 200


def test_sync_drops_pods_missing_from_the_list_in_its_namespace(sim: Simulator) -> None:
    sim.sync([pod("a"), pod("x", namespace="team-b")])
    sim.sync([pod("b")], namespace="team-a")
    assert set(sim.served()) == {("team-a", "b"), ("team-b", "x")}


def test_counters_live_as_long_as_the_container(sim: Simulator) -> None:
    sim.sync([pod("a")])
    advance(sim, 5)
    port = sim.served()[("team-a", "a")]
    before = counter(port, "vllm:generation_tokens_total")
    sim.upsert(pod("a", ready=False))  # readiness flaps: same container, same counters
    sim.upsert(pod("a"))
    port = sim.served()[("team-a", "a")]
    assert counter(port, "vllm:generation_tokens_total") == before
    sim.upsert(pod("a", restarts=1))  # the container restarted: counters start from zero
    port = sim.served()[("team-a", "a")]
    assert counter(port, "vllm:generation_tokens_total") == 0
    sim.remove("team-a", "a")
    sim.upsert(pod("a", uid="new-uid"))  # a new pod of the same name starts from zero
    assert counter(sim.served()[("team-a", "a")], "vllm:generation_tokens_total") == 0


def test_a_rollout_changes_what_the_pod_emits(sim: Simulator) -> None:
    sim.sync([pod("old", args=K3, config_hash="h1")])
    advance(sim, 2)
    sim.sync([pod("new", args=OFF, config_hash="h2")])
    port = sim.served()[("team-a", "new")]
    advance(sim, 2)
    assert "spec_decode" not in get(port, "/metrics")[1]
    labels = json.loads(sim.targets_file.read_text())[0]["labels"]
    assert labels[C.PROM_LABEL_CONFIG_HASH] == "h2"


def test_load_is_split_across_the_services_ready_pods(sim: Simulator) -> None:
    sim.sync([pod("a"), pod("b"), pod("solo", service="other")])
    advance(sim, 60)
    count = {name: sim.engine("team-a", name).metrics.histograms[
        "vllm:e2e_request_latency_seconds"].count for name in ("a", "b", "solo")}
    assert count["solo"] == pytest.approx(2 * count["a"], rel=0.25)
    assert count["a"] == pytest.approx(count["b"], rel=0.25)


def test_metrics_outage_fails_scrapes_but_not_health(sim: Simulator) -> None:
    sim.sync([pod("a")])
    port = sim.served()[("team-a", "a")]
    advance(sim, 301)
    assert sim.metrics_outage
    assert get(port, "/metrics")[0] == 503 and get(port, "/health")[0] == 200
    advance(sim, 60)
    assert get(port, "/metrics")[0] == 200


def test_unparseable_args_never_serve(sim: Simulator) -> None:
    sim.sync([pod("bad", args=("vllm", "serve", "m", "--speculative-config", "{oops"))])
    assert sim.served() == {}


def test_same_seed_same_counters(tmp_path: Path) -> None:
    def run() -> dict:
        clock = Clock()
        s = Simulator(SCENARIO, None, clock=clock)
        s.sync([pod("a"), pod("b")])
        for _ in range(40):
            clock.now += 0.5
            s.tick()
        out = {n: dict(s.engine("team-a", n).metrics.counters) for n in ("a", "b")}
        s.close()
        return out

    first, second = run(), run()
    assert first == second
    assert first["a"] != first["b"]


def test_time_scale_compresses_the_scenario() -> None:
    clock = Clock()
    s = Simulator(SCENARIO, None, clock=clock, time_scale=60)
    assert s.scenario.duration == 10
    s.close()


def test_write_atomically_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    write_atomically(target, "[]\n")
    write_atomically(target, "[1]\n")
    assert target.read_text() == "[1]\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
