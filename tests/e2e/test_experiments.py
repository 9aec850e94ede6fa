"""Canary experiments, end to end: the operator measures a candidate config on a canary
Deployment beside the running one, on the real control plane, with the vLLM simulator's
metrics read from a real Prometheus.

What a user sees with kubectl: `<name>-canary` exists exactly while `status.experiments` ends
with a Running record, the main Deployment lends it a replica (3 = 2 + 1, with maxSurge 0),
a promoted candidate becomes the main Deployment's config, an aborted one leaves the main
Deployment's pod template as it was, a killed operator leaves no canary behind, deleting the
service deletes the canary (owner reference, kube-controller-manager's garbage collector),
and the PodDisruptionBudget keeps protecting the main Deployment's pods.

The closed-loop tests (the policy starts the experiment) use seconds instead of minutes. The
shell-side tests write a Running record into status themselves, as the control loop would:
what they check is what the operator does with the record it finds (the status is the only
store, which is also what a restarted operator finds).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Optional

import pytest
import yaml
from kubernetes import client

from specdecode import api
from specdecode import constants as C
from specdecode import timestamps
from specdecode.control import perfmodel
from specdecode.control.experiments import candidate_choice, rendered_schedule
from specdecode.render import workload as render

from .conftest import poll_until
from .operator_harness import NO_PROMETHEUS, holds_for, kubectl
from .test_control_loop import FAST_AUTOTUNE, WORKLOAD, scenario_file, simulated
from .test_operator import get_deployment

pytestmark = pytest.mark.e2e

NAME = "llama"
CANARY = f"{NAME}{C.CANARY_SUFFIX}"
REPLICAS = 3
RATE = 3.0  # requests per second over all replicas: the canary's third is 1 request/s
# Experiments judged in about a minute: an experiment measures disjoint windows of
# autotune.window (10 s here), at least three, and a few dozen requests a side.
FAST_EXPERIMENTS = {"minRequests": 20, "maxDuration": "3m", "minEffect": 0.03}
WINDOW = "10s"


def service_doc(namespace: str, prometheus_url: str, k: int, experiments: dict, **autotune) -> dict:
    return {
        "apiVersion": C.API_VERSION, "kind": C.KIND,
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                            "numSpeculativeTokens": k, "minK": 1, "maxK": 6},
            "replicas": REPLICAS,
            # No spare GPU: the canary borrows one of the service's replicas (capacity-neutral).
            "rollout": {"maxSurge": 0, "maxUnavailable": 1},
            "autotune": {**FAST_AUTOTUNE, "window": WINDOW, "mode": "Auto",
                         "experiments": {**FAST_EXPERIMENTS, **experiments}, **autotune},
            "metrics": {"prometheusUrl": prometheus_url, "scrapeInterval": "1s"},
        },
    }


def apply(cluster, doc: dict) -> None:
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))


def status(kube_api, namespace: str) -> dict:
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL, NAME)
    return obj.get("status") or {}


def running(st: dict) -> Optional[dict]:
    """The running experiment's record: the last one, while its verdict is Running."""
    records = st.get("experiments") or []
    return records[-1] if records and records[-1].get("verdict") == "Running" else None


def deployment(kube_api, namespace: str, name: str = NAME) -> Optional[client.V1Deployment]:
    return get_deployment(kube_api, namespace, name)


def template_hash(d: client.V1Deployment) -> str:
    return d.spec.template.metadata.labels[C.LABEL_CONFIG_HASH]


def speculative_k(d: client.V1Deployment) -> Optional[int]:
    """K in the Deployment's --speculative-config (None: speculation off)."""
    import json

    args = d.spec.template.spec.containers[0].args
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"]


def wait_serving(kube_api, namespace: str, timeout: float = 90) -> dict:
    return poll_until(lambda: (st := status(kube_api, namespace)).get("phase") == C.PHASE_SERVING
                      and (st.get("speculation") or {}).get("live") and st, timeout, "a live config")


def wait_canary(kube_api, namespace: str, timeout: float, purpose: Optional[str] = None
                ) -> tuple[dict, client.V1Deployment]:
    """A running experiment (of `purpose`), its canary Deployment and the main Deployment
    lending it a replica."""
    def found():
        record = running(status(kube_api, namespace))
        if not record or (purpose and record["purpose"] != purpose):
            return None
        canary = deployment(kube_api, namespace, CANARY)
        main = deployment(kube_api, namespace)
        return canary and main.spec.replicas == REPLICAS - 1 and (record, canary)

    return poll_until(found, timeout, f"a running {purpose or ''} experiment with its canary")


def wait_experiment_over(kube_api, namespace: str, started_at: str, timeout: float) -> dict:
    """The experiment started at `started_at` ended, its canary is gone and the main
    Deployment has every replica again; returns its record."""
    def over():
        st = status(kube_api, namespace)
        record = next((r for r in st.get("experiments") or [] if r["startedAt"] == started_at), None)
        main = deployment(kube_api, namespace)
        return (record and record["verdict"] != "Running" and deployment(kube_api, namespace, CANARY) is None
                and main.spec.replicas == REPLICAS and record)

    return poll_until(over, timeout, f"the experiment started at {started_at} to end and its canary to go")


def best_k(rate: float, acceptance: float) -> int:
    params = dataclasses.replace(perfmodel.EngineParams.for_method("draft_model"), replicas=REPLICAS, min_k=1, max_k=6)
    return perfmodel.best_config(params, perfmodel.Workload(request_rate=rate, acceptance=acceptance, **WORKLOAD))


# --------------------------------------------------------------------- the closed loop


def test_a_collapse_is_recovered_by_a_canary_and_promoted(cluster, kube_api, operator, namespace, tmp_path):
    collapse_at, recover_at = 40.0, 70.0
    phases = [{"at": 0, "request_rate": RATE, "acceptance": 0.8, **WORKLOAD},
              {"at": collapse_at, "acceptance": 0.2}, {"at": recover_at, "acceptance": 0.8}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "recovery", phases)) as sim:
        started = time.monotonic()
        apply(cluster, service_doc(namespace, sim.prometheus_url, k=best_k(RATE, 0.8), experiments={"control": False}))
        wait_serving(kube_api, namespace)

        # The collapse: speculation off at once on every replica (a safety move, never canaried).
        poll_until(lambda: (st := status(kube_api, namespace)).get("speculation", {}).get("enabled") is False
                   and not running(st), collapse_at + 120 - (time.monotonic() - started), "speculation off")
        poll_until(lambda: speculative_k(deployment(kube_api, namespace)) is None, 30, "the main Deployment off")

        # The recovery is found by a re-probe on a canary, not by restarting every replica (a
        # re-probe that came before the recovery loses and is retried after its back-off).
        deadline = recover_at + 300
        while True:
            record, canary = wait_canary(kube_api, namespace, deadline - (time.monotonic() - started), "Reprobe")
            assert speculative_k(canary) == record["candidateK"]
            assert speculative_k(deployment(kube_api, namespace)) is None  # the main Deployment still runs off
            assert canary.spec.template.metadata.labels[C.LABEL_CONFIG_HASH] == record["candidateHash"]
            ended = wait_experiment_over(kube_api, namespace, record["startedAt"], 240)
            print("re-probe:", {k: ended.get(k) for k in ("verdict", "reason", "effect", "windows", "requests")})
            if ended["verdict"] == "Promote":
                break
            assert ended["verdict"].startswith("Abort") and speculative_k(deployment(kube_api, namespace)) is None
        main = poll_until(lambda: (d := deployment(kube_api, namespace)) and speculative_k(d) == record["candidateK"]
                          and d, 30, "the main Deployment to run the promoted candidate")
        assert template_hash(main) == record["candidateHash"]
        st = status(kube_api, namespace)
        assert st["speculation"]["enabled"] is True and st["speculation"]["k"] == record["candidateK"]
        events = yaml.safe_load(kubectl(cluster, "get", "events", "-n", namespace, "-o", "yaml").stdout)["items"]
        assert any(e["reason"] == C.EVENT_EXPERIMENT_PROMOTED for e in events), [e["reason"] for e in events]


def _a_control_experiment(cluster, kube_api, namespace: str, prometheus_url: str, **experiments) -> dict:
    """A well-paying speculation at its best K, then the periodic no-speculation control
    experiment, which must lose."""
    k = best_k(RATE, 0.8)
    apply(cluster, service_doc(namespace, prometheus_url, k=k,
                               experiments={"control": True, "controlInterval": "20s", **experiments}))
    return wait_serving(kube_api, namespace)


def test_a_worse_candidate_is_aborted_and_the_main_deployment_keeps_its_template(
        cluster, kube_api, operator, namespace, tmp_path):
    phases = [{"at": 0, "request_rate": RATE, "acceptance": 0.8, **WORKLOAD}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "steady", phases)) as sim:
        _a_control_experiment(cluster, kube_api, namespace, sim.prometheus_url)
        record, canary = wait_canary(kube_api, namespace, 120, "Control")
        assert speculative_k(canary) is None and record["candidateEnabled"] is False, record
        main = deployment(kube_api, namespace)
        assert template_hash(main) == record["incumbentHash"]
        before = (template_hash(main), main.metadata.annotations.get("deployment.kubernetes.io/revision"),
                  main.spec.template.to_dict())

        # GitOps health stays Healthy throughout: the main Deployment lends a replica and gets
        # it back, which is a scale, not a rollout (phase Serving, Progressing never True).
        seen: set = set()

        def watched() -> dict:
            st = status(kube_api, namespace)
            progressing = next((c for c in st.get("conditions") or [] if c["type"] == C.COND_PROGRESSING), {})
            seen.add((st.get("phase"), progressing.get("status")))
            return st

        ended = poll_until(
            lambda: (r := next((r for r in watched().get("experiments") or [] if r["startedAt"] == record["startedAt"]
                                and r["verdict"] != "Running"), None)) and r, 240, "the control experiment to end")
        print("control:", {k: ended.get(k) for k in ("verdict", "reason", "effect", "windows", "requests")})
        assert ended["verdict"].startswith("Abort"), ended
        poll_until(lambda: watched().get("readyReplicas") == REPLICAS and deployment(kube_api, namespace, CANARY) is None
                   and (d := deployment(kube_api, namespace)).spec.replicas == REPLICAS
                   and (d.status.available_replicas or 0) == REPLICAS, 120, "every main replica back and available")
        assert seen == {(C.PHASE_SERVING, "False")}, seen
        main = deployment(kube_api, namespace)
        # Its replicas went to 2 and back to 3; its pods' template (hence its ReplicaSet) never moved.
        after = (template_hash(main), main.metadata.annotations.get("deployment.kubernetes.io/revision"),
                 main.spec.template.to_dict())
        assert after == before
        assert status(kube_api, namespace)["speculation"]["enabled"] is True


def test_an_operator_killed_mid_experiment_leaves_no_orphan_canary(cluster, kube_api, operator, namespace, tmp_path):
    phases = [{"at": 0, "request_rate": RATE, "acceptance": 0.8, **WORKLOAD}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "killed", phases)) as sim:
        _a_control_experiment(cluster, kube_api, namespace, sim.prometheus_url)
        record, _ = wait_canary(kube_api, namespace, 120, "Control")

        operator.process.managed.process.send_signal(signal.SIGKILL)
        operator.process.managed.process.wait(timeout=30)
        assert deployment(kube_api, namespace, CANARY) is not None  # nobody deleted it
        operator.restart()

        # The new process resumes the experiment from status (its evidence is there) or ends
        # it; either way the canary goes with it.
        ended = wait_experiment_over(kube_api, namespace, record["startedAt"], 240)
        print("after the kill:", {k: ended.get(k) for k in ("verdict", "reason", "windows")})
        assert ended["windows"] >= record.get("windows", 0)
        holds_for(lambda: deployment(kube_api, namespace, CANARY) is None or running(status(kube_api, namespace)),
                  10, "a canary without a running experiment")


# ------------------------------------------------- the shell's side: the record it finds


def _injected(cluster, kube_api, namespace: str, k_candidate: int = 2, schedule: Optional[str] = None) -> dict:
    """A serving service (no Prometheus: the policy holds) and a Running record in its status,
    written as the control loop writes one (with ``schedule``: a schedule's, its largest K
    ``k_candidate``)."""
    doc = service_doc(namespace, NO_PROMETHEUS, k=3, experiments={"control": False})
    apply(cluster, doc)
    st = wait_serving(kube_api, namespace)
    spec = api.parse_spec(doc["spec"])
    rendered = rendered_schedule(schedule, spec) if schedule else None
    candidate = candidate_choice(k_candidate, rendered)
    record = {
        "purpose": "Change", "candidate": f"draft_model {schedule or f'K={k_candidate}'}", "candidateEnabled": True,
        "candidateK": k_candidate, "candidateHash": render.config_hash(spec, candidate),
        "incumbentHash": st["speculation"]["configHash"],
        "startedAt": timestamps.rfc3339(time.time()), "verdict": "Running",
        **({"candidateSchedule": schedule, "predictedEffect": -0.02} if schedule else {}),
    }
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        C.GROUP, C.VERSION, namespace, C.PLURAL, NAME, {"status": {"experiments": [record]}})
    wait_canary(kube_api, namespace, 30)
    return record


def _pods(kube_api, namespace: str, selector: str) -> list[client.V1Pod]:
    return [p for p in client.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector=selector).items
            if not p.metadata.deletion_timestamp]


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _evict(kube_api, namespace: str, pod: str) -> int:
    """Evict a pod as `kubectl drain` does; the HTTP status (201 evicted, 429 refused by a PDB)."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    try:
        client.CoreV1Api(kube_api).create_namespaced_pod_eviction(pod, namespace, body)
    except client.ApiException as err:
        return err.status
    return 201


def test_the_pdb_protects_the_main_deployments_pods_during_an_experiment(cluster, kube_api, operator, namespace):
    _injected(cluster, kube_api, namespace)
    main_selector = f"{render.selector_string(NAME)},!{C.LABEL_CANARY}"
    canary_selector = f"{render.selector_string(NAME)},{C.LABEL_CANARY}=true"
    poll_until(lambda: len(_pods(kube_api, namespace, canary_selector)) == 1
               and len([p for p in _pods(kube_api, namespace, main_selector) if _ready(p)]) == REPLICAS - 1,
               60, "2 ready main pods and the canary's pod")

    policy = client.PolicyV1Api(kube_api)
    pdb = policy.read_namespaced_pod_disruption_budget(NAME, namespace)
    # Its selector takes the main Deployment's pods and leaves the canary's out.
    selected = {p.metadata.name for p in _pods(
        kube_api, namespace, f"{render.selector_string(NAME)},!{pdb.spec.selector.match_expressions[0].key}")}
    assert selected == {p.metadata.name for p in _pods(kube_api, namespace, main_selector)}
    assert not selected & {p.metadata.name for p in _pods(kube_api, namespace, canary_selector)}
    pdb = poll_until(lambda: (b := policy.read_namespaced_pod_disruption_budget(NAME, namespace)).status
                     and b.status.expected_pods == REPLICAS - 1 and b.status.disruptions_allowed == 1 and b,
                     60, "the disruption controller to count the 2 main pods, 1 disruption allowed")

    # A drain takes the canary's pod freely (the budget is the serving replicas'), one main
    # pod, and no second one while the first is not back.
    (canary_pod,) = _pods(kube_api, namespace, canary_selector)
    assert _evict(kube_api, namespace, canary_pod.metadata.name) == 201
    first, second = (p.metadata.name for p in _pods(kube_api, namespace, main_selector))
    assert _evict(kube_api, namespace, first) == 201
    assert _evict(kube_api, namespace, second) == 429


def test_a_schedule_on_trial_runs_its_table_on_the_canary_alone(cluster, kube_api, operator, namespace):
    """A schedule's experiment (autotune.schedules Auto, the default): the API server keeps its
    record as written (candidateSchedule and predictedEffect are in the CRD's schema, not
    pruned), the canary runs vLLM with the schedule's table under the hash the record names,
    and the main Deployment keeps plain K=3 on the replicas it has left."""
    record = _injected(cluster, kube_api, namespace, k_candidate=4, schedule="1-32:K4,33+:off")
    stored = running(status(kube_api, namespace))
    assert (stored["candidateSchedule"], stored["predictedEffect"]) == ("1-32:K4,33+:off", -0.02), stored
    canary = deployment(kube_api, namespace, CANARY)
    args = canary.spec.template.spec.containers[0].args
    assert '"num_speculative_tokens_per_batch_size":[[1,32,4],[33,1024,0]]' in args[args.index("--speculative-config") + 1]
    assert template_hash(canary) == record["candidateHash"]
    main = deployment(kube_api, namespace)
    assert speculative_k(main) == 3 and main.spec.replicas == REPLICAS - 1
    assert "num_speculative_tokens_per_batch_size" not in " ".join(main.spec.template.spec.containers[0].args)


def test_deleting_the_service_deletes_its_canary(cluster, kube_api, operator, namespace):
    _injected(cluster, kube_api, namespace)
    canary = deployment(kube_api, namespace, CANARY)
    assert canary.metadata.owner_references[0].kind == C.KIND and canary.metadata.owner_references[0].controller
    kubectl(cluster, "delete", "sds", NAME, "-n", namespace, "--wait=false")
    poll_until(lambda: deployment(kube_api, namespace, CANARY) is None and deployment(kube_api, namespace) is None,
               90, "the garbage collector to delete the canary and the main Deployment")


def test_a_deleted_canary_is_put_back_and_a_cancelled_experiment_takes_it_away(cluster, kube_api, operator, namespace):
    record = _injected(cluster, kube_api, namespace)
    client.AppsV1Api(kube_api).delete_namespaced_deployment(CANARY, namespace)
    poll_until(lambda: (d := deployment(kube_api, namespace, CANARY)) and d.metadata.deletion_timestamp is None
               and d.spec.replicas == 1, 30, "the canary applied again")

    # Autotune leaves Auto: the experiment is cancelled through the one cancel path.
    apply(cluster, service_doc(namespace, NO_PROMETHEUS, k=3, experiments={"control": False}, mode="Recommend"))
    ended = wait_experiment_over(kube_api, namespace, record["startedAt"], 30)
    # The reconcile of the edit or the next evaluation, whichever comes first, ends it.
    assert ended["verdict"] == "Cancelled" and "Recommend" in ended["reason"], ended
    events = yaml.safe_load(kubectl(cluster, "get", "events", "-n", namespace, "-o", "yaml").stdout)["items"]
    assert [e["reason"] for e in events].count(C.EVENT_EXPERIMENT_CANCELLED) == 1
