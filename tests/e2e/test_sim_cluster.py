"""The simulator watching a real control plane: pods of the operator become scrape targets.

A user's view: pods labelled as the operator labels them appear on their own 127.0.0.1 port
once Ready (kwok's ready delay stands for model loading), expose spec-decode series only with
speculation, and stop serving when deleted; a pod rolled to speculation off stops emitting
spec-decode series. Runs `Simulator` + `sim.kube.start_watchers` exactly as `specdecode sim`.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from specdecode import constants as C
from specdecode.render import vllm_args as vllm
from specdecode.tools.scenario import parse_scenario
from specdecode.tools.sim import Simulator
from specdecode.tools.sim.kube import start_watchers

from .conftest import wait_for

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
SCENARIO = parse_scenario({
    "name": "cluster", "duration": "1h", "seed": 3, "method": "draft_model", "noise": False,
    "phases": [{"at": 0, "request_rate": 4, "acceptance": 0.8}],
})


def vllm_pod(client, name: str, service: str, config_hash: str, k: int | None):
    args = ["meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]
    if k:
        args += vllm.speculative_args(vllm.SpeculativeConfig("draft_model", k, model="d"), "0.33.0")
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={
            C.LABEL_NAME: C.LABEL_NAME_VALUE,
            C.LABEL_MANAGED_BY: C.LABEL_MANAGED_BY_VALUE,
            C.LABEL_SERVICE: service,
            C.LABEL_CONFIG_HASH: config_hash,
        }),
        spec=client.V1PodSpec(
            tolerations=[client.V1Toleration(key=GPU, operator="Exists", effect="NoSchedule")],
            enable_service_links=False,
            containers=[client.V1Container(
                name=C.VLLM_CONTAINER_NAME, image="vllm/vllm-openai:v0.33.0",
                command=["vllm", "serve"], args=args,
                resources=client.V1ResourceRequirements(limits={GPU: "1"}, requests={GPU: "1"}),
            )],
        ),
    )


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def test_simulator_follows_the_pods_of_the_cluster(cluster, kube_api, namespace, tmp_path):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    targets = tmp_path / "targets.json"
    sim = Simulator(SCENARIO, targets)
    stop = threading.Event()
    start_watchers(str(cluster.kubeconfig), sim, [namespace], stop)
    ticker = threading.Thread(target=sim.run, args=(stop, 0.25), daemon=True)
    ticker.start()
    try:
        core.create_namespaced_pod(namespace, vllm_pod(client, "llama-a", "llama", "h-k3", 3))
        core.create_namespaced_pod(namespace, vllm_pod(client, "llama-b", "llama", "h-off", None))
        served = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(sim.served()), 60,
                          "both pods served once Ready")
        port_a, port_b = served[(namespace, "llama-a")], served[(namespace, "llama-b")]
        wait_for(lambda: "vllm:spec_decode_num_drafts_total" in (scrape(port_a) or ""), 10,
                 "spec-decode series on the speculative pod")
        assert "spec_decode" not in (scrape(port_b) or "spec_decode")

        groups = json.loads(targets.read_text())
        assert {(g["labels"]["pod"], g["labels"][C.PROM_LABEL_CONFIG_HASH]) for g in groups} == {
            ("llama-a", "h-k3"), ("llama-b", "h-off")}
        assert all(g["labels"]["namespace"] == namespace and
                   g["labels"][C.PROM_LABEL_SERVICE] == "llama" for g in groups)

        core.delete_namespaced_pod("llama-a", namespace, grace_period_seconds=0)
        wait_for(lambda: scrape(port_a) is None, 60, "the deleted pod's port to close")
        wait_for(lambda: [g["labels"]["pod"] for g in json.loads(targets.read_text())] == ["llama-b"],
                 30, "the deleted pod to leave the targets file")
    finally:
        stop.set()
        ticker.join(timeout=5)
        sim.close()
