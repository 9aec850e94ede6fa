"""`specdecode bench fleet`: what N services cost the operator on the local stack.

N SpecDecodeServices (one replica each: kwok pods are cheap, one simulator serves them all,
one Prometheus scrapes them) are applied at once. Measured: the time from the apply until
every service is Serving, then, once every service has been evaluated on full windows, a
steady stretch: the operator's RSS and CPU seconds per minute, the Prometheus queries per
evaluation tick and per minute (Prometheus' own count), the operator's API writes per minute
(the apiserver's audit log) against the decisions it made.

Before the operator starts, the stack's own floor: the same N Deployments and Services the
operator would render, applied straight with no operator, timed until every Service exists
and every Deployment has an available replica. Time to Serving cannot be shorter than that on
the same machine (the operator writes Serving after it applied the Service: a service no
client can reach is not serving); the difference is the operator's. Around the floor and
around the operator's ramp, what the stack did (`stackload`): the apiserver's ClusterIP
allocations (one at a time, under one lock: the pace of new Services), its etcd writes, and
every process's CPU, so a run shows where its time went.

`fleet_targets` and `fleet_service` are pure; `run_fleet` drives the stack.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ... import constants as C
from . import stackload
from .live import Target
from .stackload import StackLoad

NAMESPACE = "specdecode-fleet"
FLOOR_NAMESPACE = "specdecode-fleet-floor"
SCRAPE_S = 10.0
EVALUATION_TICK_S = 5.0
RECONCILE_INTERVAL_S = 60.0
EVALUATION_INTERVAL = "30s"
WINDOW = "60s"
SERVING_GOAL_S = 60.0
# How the policy's recommendation reads until a service's first full window is in.
FIRST_WINDOW = "collecting the first full"
RSS_GOAL_MB = 250.0
# Services applied at once: one server-side apply request each, as a GitOps tool or
# `kubectl apply` in parallel would send them (kubectl alone sends them one by one: 38 s for
# 500, most of it waiting for each answer in turn).
APPLY_WORKERS = 8
CORES = os.cpu_count() or 1
WORKLOAD = {"request_rate": 2.0, "prompt_tokens": 1000, "output_tokens": 300, "temperature": 0.0, "acceptance": 0.8}

Progress = Callable[[str], None]


@dataclass
class FleetFigures:
    services: int
    serving_s: Optional[float]
    """Apply until every service was Serving; None when some never were (see `serving`)."""
    serving: int
    steady_s: float
    rss_mb: float
    peak_rss_mb: float
    cpu_s_per_min: float
    prometheus_queries_per_tick: float
    prometheus_queries_per_min: float
    reads_per_tick: float
    queries_per_read: float
    evaluations_per_min: float
    decisions_per_min: float
    writes_per_min: float
    writes_by_request: dict[str, int] = field(default_factory=dict)
    apply_s: Optional[float] = None
    """How long applying the N services took (part of serving_s: one server-side apply per
    service, APPLY_WORKERS at a time, while the operator already works on the first)."""
    stages: list[dict] = field(default_factory=list)
    """Where the time to Serving went (`live.serving_stages`, from the audit log)."""
    coming_up_writes: dict[str, dict[str, float]] = field(default_factory=dict)
    """The operator's writes from the apply until every service was Serving, by kind: how many
    and their latency at the apiserver (`live.latency_by`)."""
    stack_floor_s: Optional[float] = None
    """The same N Deployments and Services applied with no operator until every Service existed
    and every Deployment was available (`stack_floor`); None when not measured or when some
    never were."""
    floor_load: Optional[StackLoad] = None
    """What the stack did during the floor, and during the operator's ramp (from the apply
    until every service was Serving): its ClusterIP allocations, etcd writes and CPU."""
    ramp_load: Optional[StackLoad] = None
    machine: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("services", str(self.services)),
            ("apply -> all Serving", "never" if self.serving_s is None else f"{self.serving_s:.0f} s"
             + ("" if self.serving == self.services else f" ({self.serving} Serving)")),
            ("  of which the apply", "" if self.apply_s is None else f"{self.apply_s:.0f} s"),
            ("the stack alone (no operator)", "not measured" if self.stack_floor_s is None
             else f"{self.stack_floor_s:.0f} s until the same Deployments and Services were there"),
            *[(f"  {s['name']}", f"{s['median_s']:.1f} s median, {s['p90_s']:.1f} s p90 after the step before; "
                                 f"the last at {s['last_at_s']:.0f} s ({s['services']} services)")
              for s in self.stages],
            *_load_rows("the stack alone, while it came up", self.floor_load),
            *_load_rows("the stack, while the operator's fleet came up", self.ramp_load),
            ("operator writes while coming up", ""),
            *[(f"  {kind}", f"{w['count']:.0f} ({w.get('per_s', 0.0):.1f} a second), {w['median_s']:.2f} s median, "
                             f"{w['p90_s']:.2f} s p90 latency")
              for kind, w in self.coming_up_writes.items()],
            ("steady stretch measured", f"{self.steady_s:.0f} s"),
            ("operator RSS (steady / peak)", f"{self.rss_mb:.0f} MB / {self.peak_rss_mb:.0f} MB"),
            ("operator CPU", f"{self.cpu_s_per_min:.1f} s per minute"),
            ("Prometheus queries", f"{self.prometheus_queries_per_tick:.1f} per tick, "
                                   f"{self.prometheus_queries_per_min:.0f} per minute"),
            ("batched reads", f"{self.reads_per_tick:.2f} per tick ({self.queries_per_read:.0f} queries each)"),
            ("evaluations", f"{self.evaluations_per_min:.0f} per minute"),
            ("decisions", f"{self.decisions_per_min:.2f} per minute"),
            ("API writes (steady)", f"{self.writes_per_min:.2f} per minute"),
            *[(f"  {request}", str(count)) for request, count in self.writes_by_request.items()],
            ("machine", self.machine),
        ]


def _load_rows(title: str, load: Optional[StackLoad]) -> list[tuple[str, str]]:
    return [] if load is None else [(title, ""), *load.describe()]


def fleet_targets(f: FleetFigures) -> list[Target]:
    """The issue's goals: all Serving within 60 s, RSS < 250 MB, one batched read per tick
    whatever N, steady-state writes no more than the decisions made."""
    return [
        Target("all Serving after apply", "never" if f.serving_s is None else f"{f.serving_s:.0f} s",
               f"<= {SERVING_GOAL_S:.0f} s", f.serving_s is not None and f.serving_s <= SERVING_GOAL_S),
        Target("operator RSS", f"{f.rss_mb:.0f} MB", f"< {RSS_GOAL_MB:.0f} MB", f.rss_mb < RSS_GOAL_MB),
        Target("Prometheus reads per tick (independent of N)", f"{f.reads_per_tick:.2f}", "<= 1 batched read",
               f.reads_per_tick <= 1.0 + 1e-9),
        Target("steady API writes per minute", f"{f.writes_per_min:.2f}",
               f"<= decisions ({f.decisions_per_min:.2f})", f.writes_per_min <= f.decisions_per_min + 1e-9),
    ]


def fleet_service(index: int, k: int, namespace: str = NAMESPACE) -> dict:
    """One service of the fleet: one replica, the draft the simulator serves, K the model's best
    for the workload (a steady fleet: the policy should hold)."""
    from .live import draft_service

    return draft_service(f"svc-{index:04d}", namespace, k=k, replicas=1,
                         autotune={"evaluationInterval": EVALUATION_INTERVAL, "window": WINDOW, "warmup": "10s"},
                         metrics={"scrapeInterval": f"{SCRAPE_S:g}s"})


def steady_k() -> int:
    """The K the perf model finds best for the fleet's workload (what the policy keeps)."""
    from ...control import perfmodel

    params = perfmodel.EngineParams.for_method("draft_model", {"replicas": 1, "min_k": 1, "max_k": 6})
    return perfmodel.best_config(params, perfmodel.Workload(**WORKLOAD))


def scenario_document() -> dict:
    return {"name": "fleet-steady", "duration": "24h", "seed": 7, "method": "draft_model",
            "model": {"replicas": 1}, "phases": [{"at": 0, **WORKLOAD}]}


# ---------------------------------------------------------------------------------- the run


def run_fleet(services: int, *, workdir: Path, cluster_name: str, measure_s: float, serve_timeout_s: float,
              keep: bool, progress: Progress, floor: bool = True) -> FleetFigures:
    import yaml

    from ...shell.kube import load_config
    from ..localstack.install import OPERATOR_USER
    from ..localstack.stack import Stack
    from . import live

    stack = Stack(workdir, progress=progress)
    try:
        # A node has 64 GPUs at most; the floor's pods stay, so room for both sets.
        pods = services * (2 if floor else 1)
        nodes = max(4, math.ceil(pods / 64) + 1)
        cluster = stack.start_cluster(cluster_name, nodes=nodes, gpus_per_node=64, ready_delay="2s",
                                      recreate=False, keep=keep, build_progress=False)
        api_client = load_config(str(cluster.kubeconfig))
        k = steady_k()
        # The stack's processes: the cluster's binaries run from its state directory; the
        # operator, the simulator and Prometheus name the bench's work directory.
        markers = [str(cluster.state_dir), str(workdir)]
        floor_s = floor_load = None
        if floor:
            progress(f"the stack alone: applying the {services} Deployments and Services with no operator")
            before_floor = stackload.sample(api_client, markers, time.monotonic)
            floor_s = stack_floor(api_client, stack.kubectl_command, services, k, serve_timeout_s)
            floor_load = stackload.load_between(before_floor, stackload.sample(api_client, markers, time.monotonic),
                                                CORES)
            progress("the stack alone: " + ("not all there" if floor_s is None
                                            else f"all there {floor_s:.0f} s after the apply began"))
        prometheus = stack.start_prometheus(label="fleet", scrape_interval_s=SCRAPE_S)
        operator = stack.start_operator(prometheus_url=prometheus.url, reconcile_interval_s=RECONCILE_INTERVAL_S,
                                        evaluation_tick_s=EVALUATION_TICK_S)
        live.fresh_namespace(stack.kubectl_command, NAMESPACE)
        scenario = workdir / "fleet-steady.yaml"
        scenario.write_text(yaml.safe_dump(scenario_document()))
        stack.start_simulator(str(scenario), prometheus, label="fleet", namespaces=[NAMESPACE])
        custom = _custom_objects(api_client)
        audit = live.AuditLog(cluster.audit_log)
        before_apply = audit.mark()

        progress(f"applying {services} services")
        before_ramp = stackload.sample(api_client, markers, time.monotonic)
        applied = time.monotonic()
        apply_services(custom, [fleet_service(i, k) for i in range(services)])
        apply_s = time.monotonic() - applied
        serving = wait_all_serving(custom, services, applied + serve_timeout_s)
        serving_s = time.monotonic() - applied if serving == services else None
        ramp_load = stackload.load_between(before_ramp, stackload.sample(api_client, markers, time.monotonic), CORES)
        progress(f"{serving}/{services} Serving after {time.monotonic() - applied:.0f} s; waiting for "
                 "every service's first evaluation on a full window")
        coming_up = audit.lines_since(before_apply)
        stages = live.serving_stages(coming_up, NAMESPACE, OPERATOR_USER)
        coming_up_writes = live.latency_by(live.audit_writes(coming_up, OPERATOR_USER, [NAMESPACE]))
        for stage in stages:
            progress(f"  {stage.name}: {stage.median_s:.1f} s median, {stage.p90_s:.1f} s p90; "
                     f"the last at {stage.last_at_s:.0f} s")
        deadline = time.monotonic() + serve_timeout_s + 300
        while time.monotonic() < deadline:
            # Measured on a full window: the first full window's verdict is one status write
            # per service, a transition, not steady state (under load it came after the
            # fixed settling time below and counted as steady writes).
            statuses = _statuses(custom)
            measured = sum(1 for s in statuses if (s.get("observations") or {}).get("alpha") is not None
                           and FIRST_WINDOW not in ((s.get("recommendation") or {}).get("reason") or ""))
            if measured >= serving:
                break
            time.sleep(5.0)

        settle_s = 70.0  # the window (60 s) and the warm-up (10 s) once more: rules settled
        progress(f"every service measured on a full window; {settle_s:.0f} s more to settle")
        time.sleep(settle_s)
        progress(f"measuring a steady stretch of {measure_s:.0f} s")
        pid = operator.managed.process.pid
        start = _marks(pid, prometheus.url, operator.metrics_url)
        offset = audit.mark()
        time.sleep(measure_s)
        end = _marks(pid, prometheus.url, operator.metrics_url)
        writes = live.audit_writes(audit.lines_since(offset), OPERATOR_USER, [NAMESPACE])
        elapsed = end["t"] - start["t"]
        per_min = 60.0 / elapsed
        ticks = elapsed / EVALUATION_TICK_S
        reads = end["reads"] - start["reads"]
        queries = end["queries"] - start["queries"]
        return FleetFigures(
            services=services, serving_s=serving_s, serving=serving, steady_s=elapsed,
            rss_mb=end["rss"] / 2**20, peak_rss_mb=end["peak"] / 2**20,
            cpu_s_per_min=(end["cpu"] - start["cpu"]) * per_min,
            prometheus_queries_per_tick=queries / ticks, prometheus_queries_per_min=queries * per_min,
            reads_per_tick=reads / ticks, queries_per_read=queries / reads if reads else 0.0,
            evaluations_per_min=(end["evaluations"] - start["evaluations"]) * per_min,
            decisions_per_min=(end["decisions"] - start["decisions"]) * per_min,
            writes_per_min=len(writes) * per_min, writes_by_request=live.count_by(writes),
            apply_s=apply_s, stages=[asdict(stage) for stage in stages],
            coming_up_writes=coming_up_writes, stack_floor_s=floor_s, floor_load=floor_load, ramp_load=ramp_load,
            machine=live.machine_note(),
        )
    finally:
        stack.close()


FLOOR_KINDS = ("Deployment", "Service")


def floor_objects(services: int, k: int, namespace: str = FLOOR_NAMESPACE) -> list[list[dict]]:
    """Per service, the Deployment and the Service the operator renders for it (in the order
    it applies them), without an owner (none exists: the garbage collector would delete them).
    One replica each: no PodDisruptionBudget; the local stack serves no PodMonitor. Without
    the operator's managed-by label either, on them and their pods: the operator's Deployment
    handler would take each event of the floor's for one of its own (an event, a pass and
    kopf's memory of the object) while it is measured."""
    from ... import api
    from ...control import state as cs
    from ...render import workload as render

    objects = []
    for index in range(services):
        service = api.parse_service(fleet_service(index, k, namespace))
        choice, _, _ = cs.choose(service.spec, None)
        kept = [obj for obj in render.render_all(service, choice, pod_monitor_served=False) if obj["kind"] in FLOOR_KINDS]
        for obj in kept:
            obj["metadata"]["labels"].pop(C.LABEL_MANAGED_BY, None)
            if obj["kind"] == "Deployment":
                obj["spec"]["template"]["metadata"]["labels"].pop(C.LABEL_MANAGED_BY, None)
        objects.append(kept)
    return objects


def stack_floor(api_client, kubectl_command: list[str], services: int, k: int, timeout_s: float) -> Optional[float]:
    """Seconds from the first apply until every one of the fleet's Services exists and every
    Deployment has an available replica, each service's objects applied straight in the
    operator's order (APPLY_WORKERS services at a time); None past the timeout. A ClusterIP
    Service is the slow write of the two (the apiserver allocates its address): 2 to 6 a second
    on the 2-core machine at N=500.
    They stay (idle kwok pods cost the stack nothing more): deleting 500 would keep the
    controllers busy while the operator is measured."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    from ...shell.kube import Kube
    from . import live

    live.fresh_namespace(kubectl_command, FLOOR_NAMESPACE)
    objects = floor_objects(services, k)
    kube = Kube(api_client)

    def apply_all(service_objects: list[dict]) -> None:
        for obj in service_objects:
            kube.apply(obj)

    started = time.monotonic()
    with ThreadPoolExecutor(APPLY_WORKERS) as pool:
        list(pool.map(apply_all, objects))
    apps = client.AppsV1Api(api_client)
    available = _watch_until(
        apps.list_namespaced_deployment, FLOOR_NAMESPACE, services, started + timeout_s,
        lambda d: (d.get("status") or {}).get("availableReplicas", 0) >= 1)
    return time.monotonic() - started if available >= services else None


def apply_services(custom, documents: list[dict], workers: int = APPLY_WORKERS) -> None:
    """Server-side apply of every service, `workers` requests in flight."""
    from concurrent.futures import ThreadPoolExecutor

    def apply(doc: dict) -> None:
        meta = doc["metadata"]
        custom.patch_namespaced_custom_object(
            C.GROUP, C.VERSION, meta["namespace"], C.PLURAL, meta["name"], doc,
            field_manager="specdecode-bench", force=True, _content_type="application/apply-patch+yaml")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(apply, documents))


def wait_all_serving(custom, services: int, deadline: float) -> int:
    """How many of the fleet's services are Serving once all `services` are or the deadline
    (time.monotonic()) passes."""
    return _watch_until(
        lambda *args, **kw: custom.list_namespaced_custom_object(C.GROUP, C.VERSION, *args, C.PLURAL, **kw),
        NAMESPACE, services, deadline, lambda obj: (obj.get("status") or {}).get("phase") == C.PHASE_SERVING)


def _watch_until(list_fn, namespace: str, wanted: int, deadline: float, done: Callable[[dict], bool]) -> int:
    """Follow a namespace's objects of one kind with a watch until `wanted` of them are `done`
    or the deadline (time.monotonic()) passes; returns how many are. A watch, not a list every
    second: listing 500 objects with their status is megabytes of JSON a second for the API
    server that the fleet's own work shares the cores with. `list_fn(namespace, **kw)`: the
    client's list call (typed or custom objects: both read as dicts here)."""
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException

    as_dict = client.ApiClient().sanitize_for_serialization
    finished: dict[str, bool] = {}
    version = None
    while time.monotonic() < deadline:
        if version is None:
            listed = as_dict(list_fn(namespace))
            finished = {item["metadata"]["name"]: done(item) for item in listed["items"]}
            version = listed["metadata"]["resourceVersion"]
        if sum(finished.values()) >= wanted:
            return sum(finished.values())
        left = max(1, int(deadline - time.monotonic()))
        try:
            for event in watch.Watch().stream(list_fn, namespace, resource_version=version,
                                              timeout_seconds=min(60, left)):
                obj = as_dict(event["object"])
                version = obj["metadata"]["resourceVersion"]
                finished[obj["metadata"]["name"]] = event["type"] != "DELETED" and done(obj)
                if sum(finished.values()) >= wanted:
                    return wanted
        except ApiException as err:
            if err.status != 410:  # 410: the version is too old; list again
                raise
            version = None
    return sum(finished.values())


def _custom_objects(api_client):
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


def _statuses(custom) -> list[dict]:
    listed = custom.list_namespaced_custom_object(C.GROUP, C.VERSION, NAMESPACE, C.PLURAL)
    return [item.get("status") or {} for item in listed.get("items", [])]


def _marks(pid: int, prometheus_url: str, operator_metrics_url: str) -> dict:
    from . import live

    text = live.scrape(operator_metrics_url)
    proc = live.process_sample(pid)
    return {
        "t": time.monotonic(),
        "rss": proc.rss_bytes, "peak": proc.peak_rss_bytes, "cpu": proc.cpu_s,
        "queries": live.prometheus_queries(prometheus_url),
        "reads": live.counter_sum(text, "specdecode_prometheus_reads_total"),
        "evaluations": live.counter_sum(text, "specdecode_evaluations_total"),
        "decisions": live.counter_sum(text, "specdecode_decisions_total"),
    }
