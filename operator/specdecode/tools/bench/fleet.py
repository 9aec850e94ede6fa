"""`specdecode bench fleet`: what N services cost the operator on the local stack.

N SpecDecodeServices (one replica each: kwok pods are cheap, one simulator serves them all,
one Prometheus scrapes them) are applied at once. Measured: the time from the apply until
every service is Serving, then, once every service has been evaluated on full windows, a
steady stretch: the operator's RSS and CPU seconds per minute, the Prometheus queries per
evaluation tick and per minute (Prometheus' own count), the operator's API writes per minute
(the apiserver's audit log) against the decisions it made.

`fleet_targets` and `fleet_service` are pure; `run_fleet` drives the stack.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ... import constants as C
from .live import Target

NAMESPACE = "specdecode-fleet"
SCRAPE_S = 10.0
EVALUATION_TICK_S = 5.0
RECONCILE_INTERVAL_S = 60.0
EVALUATION_INTERVAL = "30s"
WINDOW = "60s"
SERVING_GOAL_S = 60.0
RSS_GOAL_MB = 250.0
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
    """How long `kubectl apply` of the N services took (part of serving_s: the API server
    creates them one by one while the operator already works on the first)."""
    machine: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("services", str(self.services)),
            ("apply -> all Serving", "never" if self.serving_s is None else f"{self.serving_s:.0f} s"
             + ("" if self.serving == self.services else f" ({self.serving} Serving)")),
            ("  of which kubectl apply", "" if self.apply_s is None else f"{self.apply_s:.0f} s"),
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
              keep: bool, progress: Progress) -> FleetFigures:
    import yaml

    from ...shell.kube import load_config
    from ..localstack.install import OPERATOR_USER, kubectl
    from ..localstack.stack import Stack
    from . import live

    stack = Stack(workdir, progress=progress)
    try:
        nodes = max(4, math.ceil(services / 64) + 1)  # a node has 64 GPUs at most
        cluster = stack.start_cluster(cluster_name, nodes=nodes, gpus_per_node=64, ready_delay="2s",
                                      recreate=False, keep=keep, build_progress=False)
        prometheus = stack.start_prometheus(label="fleet", scrape_interval_s=SCRAPE_S)
        operator = stack.start_operator(prometheus_url=prometheus.url, reconcile_interval_s=RECONCILE_INTERVAL_S,
                                        evaluation_tick_s=EVALUATION_TICK_S)
        live.fresh_namespace(stack.kubectl_command, NAMESPACE)
        scenario = workdir / "fleet-steady.yaml"
        scenario.write_text(yaml.safe_dump(scenario_document()))
        stack.start_simulator(str(scenario), prometheus, label="fleet", namespaces=[NAMESPACE])
        custom = _custom_objects(load_config(str(cluster.kubeconfig)))
        k = steady_k()
        manifest = "\n".join(json.dumps(fleet_service(i, k)) for i in range(services))

        progress(f"applying {services} services")
        applied = time.monotonic()
        kubectl(stack.kubectl_command, "apply", "--server-side", "--field-manager=specdecode-bench", "-f", "-",
                input=manifest, timeout=max(300.0, serve_timeout_s))
        apply_s = time.monotonic() - applied
        serving_s, serving = None, 0
        while time.monotonic() - applied < serve_timeout_s:
            serving = sum(1 for s in _statuses(custom) if s.get("phase") == C.PHASE_SERVING)
            if serving == services:
                serving_s = time.monotonic() - applied
                break
            time.sleep(1.0)
        progress(f"{serving}/{services} Serving after {time.monotonic() - applied:.0f} s; waiting for "
                 "every service's first evaluation on a full window")
        deadline = time.monotonic() + serve_timeout_s + 300
        while time.monotonic() < deadline:
            measured = sum(1 for s in _statuses(custom) if (s.get("observations") or {}).get("alpha") is not None)
            if measured >= serving:
                break
            time.sleep(2.0)

        settle_s = 70.0  # the window (60 s) and the warm-up (10 s) once more: first full windows, rules settled
        progress(f"every service measured; {settle_s:.0f} s for the first full windows")
        time.sleep(settle_s)
        progress(f"measuring a steady stretch of {measure_s:.0f} s")
        audit = live.AuditLog(cluster.audit_log)
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
            apply_s=apply_s, machine=live.machine_note(),
        )
    finally:
        stack.close()


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
