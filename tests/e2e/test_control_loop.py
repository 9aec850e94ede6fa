"""The closed loop, end to end: the operator reads a real Prometheus scraping the vLLM
simulator, which follows the pods the operator rolls out on the real control plane.

Every test gets its own namespace, simulator and Prometheus (its service points at it with
spec.metrics.prometheusUrl); the operator is the session's, under the shipped RBAC. The
autotune intervals are seconds instead of minutes so that each story plays in a few minutes.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from specdecode import constants as C
from specdecode.control import metrics, perfmodel, rules
from specdecode.control.settings import PolicyTuning
from specdecode.tools.localstack.prometheus import VLLM_NAMES_AS_SCRAPED, VLLM_NAMES_COLON, start_prometheus
from specdecode.tools.localstack.stack import SimulatedMetrics, Stack

from .conftest import poll_until
from .operator_harness import holds_for, kubectl

pytestmark = pytest.mark.e2e

EVALUATION_S = 5.0
WINDOW_S = 30.0
SCRAPE_S = 1.0
GUARD_WINDOW_S = metrics.guard_window(WINDOW_S, SCRAPE_S)
ROLLOUT_ALLOWANCE_S = 15.0  # kwok's ready delay, the rolling update and a reconcile pass

FAST_AUTOTUNE = {
    "evaluationInterval": f"{EVALUATION_S:g}s", "window": f"{WINDOW_S:g}s", "warmup": "5s",
    "minDrafts": 200, "minRequests": 10, "cooldown": "15s", "maxChangesPerHour": 30, "reprobeInterval": "40s",
    # These stories are about the loop's own moves: re-probes and tune moves apply at once
    # (canary experiments have their own e2e test).
    "experiments": {"enabled": False},
}
WORKLOAD = {"prompt_tokens": 1000, "output_tokens": 300}


def scenario_file(tmp_path: Path, name: str, phases: list[dict], **extra) -> Path:
    # The truth exactly unless a test asks for noise (scenarios wander by default).
    doc = {"name": name, "duration": "1h", "seed": 11, "method": "draft_model", "phases": phases,
           "noise": False, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def service(namespace: str, prometheus_url: str, k: int = 3, mode: str = "Auto", **autotune) -> dict:
    return {
        "apiVersion": C.API_VERSION, "kind": C.KIND,
        "metadata": {"name": "llama", "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                            "numSpeculativeTokens": k, "minK": 1, "maxK": 6},
            "replicas": 2,
            "rollout": {"maxSurge": 1, "maxUnavailable": 0},
            "autotune": {**FAST_AUTOTUNE, "mode": mode, **autotune},
            "metrics": {"prometheusUrl": prometheus_url, "scrapeInterval": f"{SCRAPE_S:g}s"},
        },
    }


@contextmanager
def simulated(cluster, tmp_path: Path, namespace: str, scenario: Path,
              vllm_names: str = VLLM_NAMES_AS_SCRAPED) -> Iterator[SimulatedMetrics]:
    """A simulator for the test's namespace and a Prometheus scraping it, stopped afterwards.
    As scraped, Prometheus 2.x stores vLLM's series as `vllm_...` (as it does real vLLM's)."""
    stack = Stack(tmp_path / "stack")
    stack.use_existing_cluster(cluster.kubeconfig, kubectl=str(cluster.kubectl))
    try:
        yield stack.start_simulated_metrics(str(scenario), label=namespace, namespaces=[namespace],
                                            scrape_interval_s=SCRAPE_S, vllm_names=vllm_names)
    finally:
        stack.close()


def sds(kube_api, namespace: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL, "llama")


def status(kube_api, namespace: str) -> dict:
    return sds(kube_api, namespace).get("status") or {}


def condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def speculation(st: dict) -> tuple[bool | None, int | None]:
    effective = st.get("speculation") or {}
    return effective.get("enabled"), effective.get("k")


def deployment_args(kube_api, namespace: str) -> list[str]:
    deployment = client.AppsV1Api(kube_api).read_namespaced_deployment("llama", namespace)
    return deployment.spec.template.spec.containers[0].args


def wait_live(kube_api, namespace: str, timeout: float = 90) -> dict:
    return poll_until(lambda: (st := status(kube_api, namespace)).get("phase") == C.PHASE_SERVING
                      and (st.get("speculation") or {}).get("live") and st, timeout, "a live config")


def longer_draft_target(params: perfmodel.EngineParams, workload: perfmodel.Workload, current: int) -> int:
    """Where the tune rule moves a service running `current`: the model's best K, or, for a move
    to a longer draft, the shortest K the model cannot tell from it (within the hysteresis)
    that still beats `current` by it (`rules.shortest_near_best`), scored by mean latency."""
    results = perfmodel.compare_configs(params, workload, None, perfmodel.DEFAULT_HORIZON_S)
    best = min(results, key=lambda k: (results[k].e2e_mean_s, k))
    scores = {k: 1.0 / r.e2e_mean_s for k, r in results.items() if k != perfmodel.OFF}
    return rules.shortest_near_best(scores, best, current, PolicyTuning().min_gain)


@pytest.mark.parametrize("vllm_names, stored", [(VLLM_NAMES_AS_SCRAPED, "vllm_"), (VLLM_NAMES_COLON, "vllm:")])
def test_good_draft_settles_on_the_shortest_k_near_the_models_best(cluster, kube_api, operator, namespace, tmp_path,
                                                                   vllm_names, stored):
    phases = [{"at": 0, "request_rate": 2, "acceptance": 0.8, **WORKLOAD}]
    params = dataclasses.replace(perfmodel.EngineParams.for_method("draft_model"), replicas=2, min_k=1, max_k=6)
    best = longer_draft_target(params, perfmodel.Workload(request_rate=2, acceptance=0.8, **WORKLOAD), current=1)
    assert best >= 2, "the scenario must make a longer K pay"
    scenario = scenario_file(tmp_path, "good", phases)
    with simulated(cluster, tmp_path, namespace, scenario, vllm_names) as sim:
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, sim.prometheus_url, k=1)))
        st = poll_until(lambda: speculation(s := status(kube_api, namespace)) == (True, best) and s, 180,
                        f"K to settle at K={best}, the shortest within the hysteresis of the model's best")
        # Whichever name Prometheus stored vLLM's series under, the operator read them and says which.
        assert st["observations"]["metricNames"] == stored
        assert all(h["action"] != "disable" for h in st.get("history", []))
        # The decision is in status first; the re-render follows it.
        poll_until(lambda: f'"num_speculative_tokens":{best}' in " ".join(deployment_args(kube_api, namespace)), 30,
                   f"the Deployment to run K={best}")
        # Settled: the next evaluations hold.
        changes = len(st["history"])
        wait_live(kube_api, namespace)
        settled = wait_evaluations(kube_api, operator, namespace, 3, 3 * EVALUATION_S + 60)
        assert len(settled["history"]) == changes, settled["history"]
        assert speculation(settled) == (True, best)


def test_collapse_falls_back_fast_survives_an_operator_kill_and_recovers(cluster, kube_api, operator, namespace, tmp_path):
    collapse_at, recover_at = 60.0, 150.0
    phases = [{"at": 0, "request_rate": 2, "acceptance": 0.8, **WORKLOAD},
              {"at": collapse_at, "acceptance": 0.2}, {"at": recover_at, "acceptance": 0.8}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "collapse", phases)) as sim:
        started = time.monotonic()
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, sim.prometheus_url)))
        wait_live(kube_api, namespace)
        assert speculation(status(kube_api, namespace)) == (True, 3)

        # The collapse is in a full guard window by collapse_at + GUARD_WINDOW_S; from then on
        # the operator has three evaluation intervals plus the rollout.
        deadline = collapse_at + GUARD_WINDOW_S + 3 * EVALUATION_S + ROLLOUT_ALLOWANCE_S
        off = poll_until(lambda: speculation(s := status(kube_api, namespace))[0] is False and s,
                         deadline - (time.monotonic() - started), "speculation to be turned off after the collapse")
        fell_back_after = time.monotonic() - started - collapse_at
        effective = condition(off, C.COND_SPECULATION_EFFECTIVE)
        assert effective["status"] == "False"
        assert re.search(r"alpha 0\.\d+", effective["message"]), effective["message"]  # the numbers
        print(f"fell back {fell_back_after:.1f}s after the collapse began")
        poll_until(lambda: "--speculative-config" not in deployment_args(kube_api, namespace), 30,
                   "the Deployment to run without speculation")

        # The operator dies hard mid-scenario and comes back: it carries on from status.
        disables = [h for h in off["history"] if h["action"] == "disable"]
        # status.history names the rule that decided, with the same names as bench trace.
        assert disables and disables[-1].get("rule") in ("collapse", "floor", "fast-fallback", "slo-guard"), disables
        operator.process.managed.process.send_signal(signal.SIGKILL)
        operator.process.managed.process.wait(timeout=30)
        operator.restart()

        back = poll_until(lambda: speculation(s := status(kube_api, namespace))[0] is True and s,
                          recover_at + 200 - (time.monotonic() - started), "the re-probe to turn speculation back on")
        history = back["history"]
        assert [h for h in history if h["action"] == "disable"][: len(disables)] == disables  # nothing lost
        for earlier, later in zip(history, history[1:]):
            assert (earlier["action"], earlier.get("toK")) != (later["action"], later.get("toK")) or earlier["time"] != later["time"], \
                f"duplicate decision {earlier} / {later}"
        assert history[-1]["action"] in ("enable", "set_k")
        assert history[-1].get("rule") in ("reprobe", "experiment"), history[-1]


def test_load_surge_reduces_speculation_and_calm_restores_it(cluster, kube_api, operator, namespace, tmp_path):
    surge_at, calm_at = 60.0, 180.0
    phases = [{"at": 0, "request_rate": 2, "acceptance": 0.8, **WORKLOAD},
              {"at": surge_at, "request_rate": 40}, {"at": calm_at, "request_rate": 2}]
    params = dataclasses.replace(perfmodel.EngineParams.for_method("draft_model"), replicas=2, min_k=1, max_k=6)
    surge = perfmodel.Workload(request_rate=40, acceptance=0.8, **WORKLOAD)
    assert perfmodel.best_config(params, surge) == perfmodel.OFF, "the surge must pass the crossover clearly"
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "surge", phases)) as sim:
        started = time.monotonic()
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, sim.prometheus_url)))
        wait_live(kube_api, namespace)

        def reduced():
            enabled, k = speculation(st := status(kube_api, namespace))
            return (enabled is False or (k or 0) < 3) and st

        during = poll_until(reduced, calm_at - (time.monotonic() - started), "K reduced or speculation off in the surge")
        print("during the surge:", speculation(during), during["history"][-1]["reason"])
        lowest = poll_until(lambda: speculation(s := status(kube_api, namespace))[0] is False and s,
                            calm_at - (time.monotonic() - started), "speculation off at the height of the surge")
        calm_history = len(lowest["history"])

        def restored():
            st = status(kube_api, namespace)
            later = st.get("history", [])[calm_history:]
            return st if speculation(st)[0] and any(h["action"] in ("enable", "set_k") for h in later) else None

        back = poll_until(restored, calm_at + 240 - (time.monotonic() - started), "speculation back on after the surge")
        print("after the calm:", speculation(back), back["history"][-1]["reason"])


def wait_evaluations(kube_api, operator, namespace: str, count: int, timeout: float) -> dict:
    """Wait until `count` more evaluations of the service ran (the operator counts them in
    specdecode_evaluations_total; status is written only when an evaluation changes it)."""
    def done() -> float:
        return operator.total("specdecode_evaluations_total", namespace=namespace, specdecode_service="llama")

    start = done()
    return poll_until(lambda: done() >= start + count and status(kube_api, namespace), timeout, f"{count} evaluations")


def test_noisy_steady_service_holds_and_rides_out_a_metrics_outage(cluster, kube_api, operator, namespace, tmp_path):
    phases = [{"at": 0, "request_rate": 4, "acceptance": 0.8, **WORKLOAD}]
    path = scenario_file(tmp_path, "noisy", phases, noise={"acceptance_sd": 0.03, "request_rate_cv": 0.2, "period": "10s"})
    with simulated(cluster, tmp_path, namespace, path) as sim:
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, sim.prometheus_url)))
        wait_live(kube_api, namespace)
        poll_until(lambda: "window" in (status(kube_api, namespace).get("recommendation") or {}).get("reason", "")
                   or "best" in (status(kube_api, namespace).get("recommendation") or {}).get("reason", ""),
                   90, "evaluations on full windows")
        # A stationary noisy stretch: a dozen evaluations, not one change.
        steady = wait_evaluations(kube_api, operator, namespace, 12, 12 * EVALUATION_S + 60)
        assert steady.get("history", []) == [], steady["history"]
        assert speculation(steady) == (True, 3)

        # Prometheus goes away: hold, say so, change nothing.
        port = sim.prometheus.port
        sim.prometheus.stop()
        down = poll_until(lambda: condition(s := status(kube_api, namespace), C.COND_METRICS_AVAILABLE).get("status") == "False" and s,
                          3 * EVALUATION_S + 10, "MetricsAvailable=False")
        assert "unreachable" in condition(down, C.COND_METRICS_AVAILABLE)["message"]
        apps = client.AppsV1Api(kube_api)
        generation = apps.read_namespaced_deployment("llama", namespace).metadata.generation
        holds_for(lambda: speculation(status(kube_api, namespace)) == (True, 3)
                  and apps.read_namespaced_deployment("llama", namespace).metadata.generation == generation,
                  3 * EVALUATION_S, "nothing may change while metrics are missing")

        # It comes back on the same address: control resumes.
        restarted = start_prometheus(sim.prometheus.work_dir, sim.targets_file, scrape_interval_s=SCRAPE_S, port=port)
        try:
            poll_until(lambda: condition(status(kube_api, namespace), C.COND_METRICS_AVAILABLE).get("status") == "True",
                       60, "MetricsAvailable=True after the outage")
            assert status(kube_api, namespace).get("history", []) == []
        finally:
            restarted.stop()


def test_recommend_mode_moves_the_recommendation_and_never_the_deployment(cluster, kube_api, operator, namespace, tmp_path):
    phases = [{"at": 0, "request_rate": 2, "acceptance": 0.8, **WORKLOAD}, {"at": 45, "acceptance": 0.2}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "recommend", phases)) as sim:
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, sim.prometheus_url, mode="Recommend")))
        wait_live(kube_api, namespace)
        generation = client.AppsV1Api(kube_api).read_namespaced_deployment("llama", namespace).metadata.generation
        advised = poll_until(lambda: (status(kube_api, namespace).get("recommendation") or {}).get("action") == "disable"
                             and status(kube_api, namespace), 150, "a recommendation to disable")
        # The short window sees the collapse first: the advice comes from the floor or from the
        # fast fallback ("speculation hurts"), whichever window crosses first.
        reason = advised["recommendation"]["reason"]
        assert "floor" in reason or "speculation hurts" in reason, reason
        assert advised["history"][-1]["applied"] is False
        assert speculation(advised) == (True, 3)
        assert client.AppsV1Api(kube_api).read_namespaced_deployment("llama", namespace).metadata.generation == generation
        assert "--speculative-config" in deployment_args(kube_api, namespace)
