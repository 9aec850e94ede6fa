"""Per-batch-size K schedules end to end: the operator with `autotune.schedules: Auto` on the
real control plane, reading a real Prometheus scraping the simulator.

Run with your own cluster name: `SPECDECODE_E2E_CLUSTER=sched pytest -q tests/e2e/test_schedules.py`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from specdecode.control import perfmodel, schedules

from .conftest import poll_until
from .operator_harness import holds_for, kubectl
from .test_control_loop import (
    EVALUATION_S, ROLLOUT_ALLOWANCE_S, WINDOW_S, WORKLOAD, deployment_args, scenario_file, service, simulated,
    speculation, status, wait_evaluations, wait_live,
)

pytestmark = pytest.mark.e2e


def test_a_version_without_tables_runs_plain_k_and_says_why(cluster, kube_api, operator, namespace, tmp_path):
    """vLLM 0.23.0 has no num_speculative_tokens_per_batch_size: with schedules Auto the
    service runs plain K, status says why, and a load surge past the crossover is met the
    plain way (no table is ever rendered)."""
    phases = [{"at": 0, "request_rate": 4, "acceptance": 0.8, **WORKLOAD}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "old-vllm", phases)) as sim:
        doc = service(namespace, sim.prometheus_url, schedules="Auto")
        doc["spec"]["engine"] = {"version": "0.23.0"}
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))
        wait_live(kube_api, namespace)
        st = poll_until(
            lambda: "0.23.0" in ((s := status(kube_api, namespace)).get("speculation") or {}).get("scheduleReason", "")
            and s, WINDOW_S + 6 * EVALUATION_S + 60, "status.speculation.scheduleReason to name the version",
        )
        assert "plain K" in st["speculation"]["scheduleReason"]
        assert "schedule" not in st["speculation"]
        assert speculation(st) == (True, 3)
        args = " ".join(deployment_args(kube_api, namespace))
        assert "num_speculative_tokens_per_batch_size" not in args
        steady = wait_evaluations(kube_api, operator, namespace, 3, 3 * EVALUATION_S + 60)
        assert steady.get("history", []) == [], steady["history"]
        # kubectl get shows the Schedule column, empty for plain K.
        table = kubectl(cluster, "get", "sds", "-n", namespace)
        assert "SCHEDULE" in table.stdout.splitlines()[0]


# --- a table in effect: load swings without restarts; an operator-chosen schedule reverted -------
#
# Schedules the operator chooses (autotune.schedules Auto) are rarely worth their restart with
# the shipped prior (the benchmark's journal, "The policy with schedules"): every step under a
# table pays the schedule's overhead, and a K 0 step the speculation bookkeeping too (~2 % of
# the step at batch 300 here), which near saturation, where a surge's move to off is decided, is ~6.6 % of
# e2e against off: instead of that move a schedule does not pass its 2 % check. The penalty story
# uses where one pays: an n-gram proposer (no draft memory) on a GPU 4.5 times slower than the
# prior's fit (the overhead is small against the step; 4.5 is inside the step scale's clamp),
# acceptance 0.35 (K=3 pays at the calm's batches, off at a surge's). After a surge has shown
# the batch range, back at the calm, plain K=3 holds and the schedule saves per token at the
# batches seen: adopted, so the next surge needs no restart. The no-restart story runs a
# declared table, which needs no adoption.

SLOW_GPU = {
    # The prior's draft-free target costs, 4.5 times over (`EngineParams.for_method("ngram")`).
    "step_fixed_s": 26.55e-3, "per_batched_token_s": 94.5e-6, "per_kv_token_s": 175.5e-9,
    "step_overhead_s": 5.4e-3, "spec_overhead_s": 1.35e-3, "proposer_cpu_s_per_seq": 90e-6,
}
LOW_RPS, SURGE_RPS, ALPHA = 2, 10, 0.35
"""At 2 req/s K=3 is best (batch 9 a replica, `perfmodel.steady_state`); 10 req/s is past the
capacity of both K=3 (8.1 req/s) and off (9.4): the batch climbs to ~300, where off wins."""
SLO_TPOT_S = 0.5
"""Above the model's P95 TPOT of K=3 (329 ms) and off (283 ms) at the surge's full batch, so
the SLO guard leaves the surge to tuning."""
WARMUP_S = 60.0
"""autotune.warmup of the penalty story: a new config is judged only once the surge's backlog
has drained (a window that mixes a draining queue and the calm compares nothing like with
like). With 5 s the schedule, adopted in the surge, was checked on the drain: not reverted."""
SURGE_AT, SURGE_S = 150.0, 45.0
"""After plain K=3's first full windows at the calm (live at ~5 s, + warm-up + window, and the
simulator's clock starts some seconds before the test's): its baseline there; long enough for
the batch to pass the crossover."""
REPROBE_S = 40.0
"""FAST_AUTOTUNE's reprobeInterval: if the surge turned speculation off, K=3 is back this long
after."""
PENALTY = 0.4
"""The truth's slow-down of every step under a table (the reported CUDA-graph fallback, worse);
the operator's prior does not know it. At the calm the schedule runs K=3: 40 % above what
plain K=3 measured there, far past the 8 % margin."""


def schedule_scenario(tmp_path: Path, name: str, phases: list[dict], **truth) -> Path:
    return scenario_file(tmp_path, name, phases, method="ngram", model={**SLOW_GPU, **truth})


def ngram_service(namespace: str, prometheus_url: str) -> dict:
    doc = service(namespace, prometheus_url, schedules="Auto")
    # K pinned at 3 (off allowed): the surge's load-driven move is to off, not a detour
    # through K=2 first (whose restart comes before the schedule could replace it).
    doc["spec"]["speculation"] = {"method": "ngram", "numSpeculativeTokens": 3, "minK": 3, "maxK": 3}
    doc["spec"]["autotune"]["slo"] = {"p95TimePerOutputToken": f"{SLO_TPOT_S * 1e3:g}ms"}
    return doc


def running_schedule(kube_api, namespace: str) -> dict | None:
    st = status(kube_api, namespace)
    return st if (st.get("speculation") or {}).get("schedule") else None


def workload_identity(kube_api, namespace: str) -> dict:
    """What a restart changes: the pod template, its ReplicaSets, the pods."""
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    deployment = apps.read_namespaced_deployment("llama", namespace)
    return {
        "template": client.ApiClient().sanitize_for_serialization(deployment.spec.template),
        "replicasets": sorted(rs.metadata.name for rs in apps.list_namespaced_replica_set(namespace).items),
        "pods": sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items
                       if p.metadata.deletion_timestamp is None),
    }


def p95_tpot(prometheus_url: str, range_s: float) -> float | None:
    """P95 TPOT of the service's requests over the last `range_s`, from Prometheus."""
    from .test_sim_prometheus import query

    metric = "vllm_request_time_per_output_token_seconds_bucket"  # as scraped (test_control_loop.simulated)
    rows = query(prometheus_url, f"histogram_quantile(0.95, sum by (le) (increase({metric}[{range_s:.0f}s])))")
    value = float(rows[0]["value"][1]) if rows else float("nan")
    return None if math.isnan(value) else value


@contextmanager
def status_on_failure(kube_api, namespace: str) -> Iterator[None]:
    """A failure says what the operator decided (the namespace is gone afterwards)."""
    try:
        yield
    except (AssertionError, pytest.fail.Exception) as err:
        st = status(kube_api, namespace)
        raise AssertionError(f"{err}\nstatus.speculation: {st.get('speculation')}\nrecommendation: "
                             f"{st.get('recommendation')}\nhistory: {st.get('history')}") from err


def events(kube_api, namespace: str) -> list:
    return client.CoreV1Api(kube_api).list_namespaced_event(namespace).items


DECLARED_TABLE = [{"minBatchSize": 1, "maxBatchSize": 16, "k": 3}, {"minBatchSize": 17, "maxBatchSize": 1024, "k": 0}]
DECLARED_SLO_TPOT_S = 0.1
"""The model's P95 TPOT of that table at 40 req/s is 52 ms (K=3 55 ms, off 49 ms;
`perfmodel.steady_state`, draft_model defaults, 2 replicas)."""


def scalar(prometheus_url: str, promql: str) -> float | None:
    from .test_sim_prometheus import query

    rows = query(prometheus_url, promql)
    value = float(rows[0]["value"][1]) if rows else float("nan")
    return None if math.isnan(value) else value


def test_a_declared_table_rides_a_surge_past_the_crossover_and_back_without_a_restart(
        cluster, kube_api, operator, namespace, tmp_path):
    """The surge of test_control_loop (2 -> 40 req/s and back), where plain K=3 is turned off
    at the surge and back on after it (two restarts). With a declared table the engine stops
    drafting past batch 16 by itself: nothing restarts, and the P95 TPOT stays within the SLO."""
    surge_at, calm_at, end_at = 50.0, 130.0, 190.0
    phases = [{"at": 0, "request_rate": 2, "acceptance": 0.8, **WORKLOAD},
              {"at": surge_at, "request_rate": 40}, {"at": calm_at, "request_rate": 2}]
    params = dataclasses.replace(perfmodel.EngineParams.for_method("draft_model"), replicas=2, min_k=1, max_k=6)
    surge = perfmodel.Workload(request_rate=40, acceptance=0.8, **WORKLOAD)
    assert perfmodel.best_config(params, surge) == perfmodel.OFF, "the surge must pass the crossover"
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "declared", phases)) as sim, \
            status_on_failure(kube_api, namespace):
        started = time.monotonic()
        doc = service(namespace, sim.prometheus_url)
        doc["spec"]["speculation"]["perBatchSizeK"] = DECLARED_TABLE
        doc["spec"]["autotune"]["slo"] = {"p95TimePerOutputToken": f"{DECLARED_SLO_TPOT_S * 1e3:g}ms"}
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))
        wait_live(kube_api, namespace)
        assert "num_speculative_tokens_per_batch_size" in " ".join(deployment_args(kube_api, namespace))
        before = workload_identity(kube_api, namespace)
        worst, drafting = [0.0], {}

        def same_workload_and_sampled() -> bool:
            elapsed = time.monotonic() - started
            if surge_at + 20 < elapsed < calm_at:
                worst[0] = max(worst[0], p95_tpot(sim.prometheus_url, 20) or 0.0)
                # The engine follows the load: past batch 16 a replica drafts at K 0.
                batch = scalar(sim.prometheus_url, "avg(vllm_num_requests_running)")
                drafts = scalar(sim.prometheus_url, "sum(rate(vllm_spec_decode_num_drafts_total[10s]))")
                if batch is not None and drafts is not None:
                    drafting["surge"] = (batch, drafts)
            elif elapsed > surge_at + 20:
                worst[0] = max(worst[0], p95_tpot(sim.prometheus_url, 20) or 0.0)
            return workload_identity(kube_api, namespace) == before and status(kube_api, namespace).get("history", []) == []

        holds_for(same_workload_and_sampled, end_at - (time.monotonic() - started),
                  "no restart through the surge past the crossover and the calm")
        batch, drafts = drafting["surge"]
        print(f"in the surge: running batch {batch:.0f} per replica, {drafts:.1f} drafts/s")
        assert batch > 16 and drafts < 1.0, drafting
        print(f"P95 TPOT, worst 20 s from the surge on: {worst[0] * 1e3:.0f} ms (SLO {DECLARED_SLO_TPOT_S * 1e3:g} ms)")
        assert 0 < worst[0] <= DECLARED_SLO_TPOT_S, worst[0]
        whole = p95_tpot(sim.prometheus_url, end_at)
        print(f"P95 TPOT over the whole run: {whole * 1e3:.0f} ms")
        assert whole is not None and whole <= DECLARED_SLO_TPOT_S, whole


def test_a_schedule_penalty_the_prior_does_not_know_is_reverted_within_a_few_evaluations(
        cluster, kube_api, operator, namespace, tmp_path):
    """A calm, a surge past capacity, the calm again: having seen the batches of both, plain
    K=3 back at the calm adopts a schedule (K=3 at the calm's batches, off at the surge's).
    The truth's steps are 40 % slower under any table; the after-rollout check compares the
    schedule's measured time per token with what plain K=3 measured at the calm before it:
    reverted, remembered in status.rejectedSchedules, said in an Event, not chosen again."""
    calm_at = SURGE_AT + SURGE_S
    phases = [{"at": 0, "request_rate": LOW_RPS, "acceptance": ALPHA, **WORKLOAD},
              {"at": SURGE_AT, "request_rate": SURGE_RPS}, {"at": calm_at, "request_rate": LOW_RPS}]
    path = schedule_scenario(tmp_path, "penalty", phases, schedule_penalty=PENALTY)
    truth = dataclasses.replace(perfmodel.EngineParams.for_method("ngram"), replicas=2, min_k=3, max_k=3, **SLOW_GPU)
    calm, surge = (perfmodel.Workload(rate, acceptance=ALPHA, **WORKLOAD) for rate in (LOW_RPS, SURGE_RPS))
    assert perfmodel.best_config(truth, calm) == 3 and perfmodel.steady_state(truth, surge, perfmodel.OFF).saturated
    # The surge's backlog (it outruns off's capacity too) drains at the calm at off's spare capacity.
    capacity = perfmodel.steady_state(truth, calm, perfmodel.OFF).capacity_rps
    drain_s = (SURGE_RPS - capacity) * SURGE_S / (capacity - LOW_RPS)
    with simulated(cluster, tmp_path, namespace, path) as sim, status_on_failure(kube_api, namespace):
        started = time.monotonic()
        doc = ngram_service(namespace, sim.prometheus_url)
        doc["spec"]["autotune"]["warmup"] = f"{WARMUP_S:g}s"
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))
        wait_live(kube_api, namespace)
        went_live = time.monotonic() - started
        print(f"plain K=3 live at {went_live:.0f}s, the surge at {SURGE_AT:g}s, the calm at {calm_at:g}s")
        assert went_live + WARMUP_S + WINDOW_S < SURGE_AT, "plain K=3 must measure a full window at the calm"
        # Back at the calm with the backlog drained: K=3 (again, after a re-probe and its
        # rollout if the surge turned speculation off), its first full window, a few
        # evaluations, the schedule's rollout.
        due = (calm_at + drain_s + REPROBE_S + ROLLOUT_ALLOWANCE_S + WARMUP_S + WINDOW_S + 3 * EVALUATION_S
               + ROLLOUT_ALLOWANCE_S)
        adopted = poll_until(lambda: running_schedule(kube_api, namespace), due - (time.monotonic() - started),
                             f"a schedule adopted by {due:.0f}s, back at the calm")
        schedule = adopted["speculation"]["schedule"]
        reason = adopted["history"][-1]["reason"]
        print(f"adopted {schedule} at {time.monotonic() - started:.0f}s: {reason[:300]}")
        print("history:", [(h["action"], h.get("fromK"), h.get("toK"), h["reason"][:60]) for h in adopted["history"]])
        assert "per token" in reason and "at the batches seen" in reason, reason
        live = wait_live(kube_api, namespace, timeout=ROLLOUT_ALLOWANCE_S + 45)
        assert live["speculation"].get("schedule") == schedule, (live["speculation"], live.get("history"))
        live_at = time.monotonic()
        # The check starts at the schedule's first full window after its warm-up and lasts
        # schedules.CHECK_EVALUATIONS evaluations; the revert is due within it, plus the
        # evaluation that sees it and the rollout.
        bound = WARMUP_S + WINDOW_S + schedules.CHECK_EVALUATIONS * EVALUATION_S + EVALUATION_S + ROLLOUT_ALLOWANCE_S
        reverted = poll_until(lambda: not (s := status(kube_api, namespace)).get("speculation", {}).get("schedule")
                              and s, bound, f"the schedule reverted within {bound:.0f}s of going live")
        print(f"reverted {time.monotonic() - live_at:.1f}s after it went live (bound {bound:.0f}s)")
        last = reverted["history"][-1]
        assert last["action"] == "set_k" and "reverted" in last["reason"], last
        assert speculation(reverted) == (True, 3)
        assert "reverted" in reverted["speculation"].get("scheduleReason", ""), reverted["speculation"]
        rejected = reverted.get("rejectedSchedules") or []
        assert [r["schedule"] for r in rejected] == [schedule], rejected
        # Judged against what K=3 measured before the schedule, by whichever check saw the
        # penalty first: the time per token after the rollout ("above K=3 measured before the
        # schedule"), or a queue the schedule fell behind while the surge's backlog drained
        # ("K=3 serves at this batch by what it measured before the schedule").
        assert "K=3" in rejected[0]["reason"] and "measured before the schedule" in rejected[0]["reason"], rejected[0]
        print("rejected:", rejected[0]["reason"])
        poll_until(lambda: "num_speculative_tokens_per_batch_size" not in " ".join(deployment_args(kube_api, namespace)),
                   ROLLOUT_ALLOWANCE_S, "the Deployment back on plain K")
        said = poll_until(lambda: [e for e in events(kube_api, namespace) if schedule in (e.message or "")
                                   and "reverted" in (e.message or "")], 30, "an Event saying the schedule was reverted")
        print("event:", said[-1].reason, said[-1].message)
        # Not chosen again: through plain K=3's first full window at the same calm and a few
        # evaluations after it (where it was adopted the first time).
        wait_live(kube_api, namespace, timeout=ROLLOUT_ALLOWANCE_S + 45)
        holds_for(lambda: (running_schedule(kube_api, namespace) or {}).get("speculation", {}).get("schedule") != schedule,
                  WARMUP_S + WINDOW_S + 3 * EVALUATION_S, f"{schedule} not adopted again")
        after = status(kube_api, namespace)
        assert [r["schedule"] for r in after.get("rejectedSchedules") or []] == [schedule]
        print("afterwards:", speculation(after), (after["speculation"].get("scheduleReason") or "")[:200])
