"""`specdecode bench faults`: the operator under faults, on the local stack, as figures.

A small fleet (3 services, 2 replicas each) is served by the simulator playing a scenario that
makes the policy decide again and again (acceptance collapses and recovers every cycle).
Faults, one after another, each followed by the wait for convergence:

- the operator SIGKILLed at seeded random points: right after a decision is in status and
  before the Deployment changed, right after the Deployment changed and before status
  (crash points, `specdecode.shell.crashpoints`), mid-rollout, and at a random moment;
- the kube-apiserver stopped and started again;
- Prometheus stopped for minutes (no change may happen while metrics are missing);
- owned objects deleted (Deployment, Service) and edited (scale, a foreign annotation, the
  Service's port).

Figures: decisions lost (seen in status history, later gone, or status and Deployment
disagreeing at the end), decisions duplicated in history, extra starts of vLLM pods (beyond
what the decisions and the bench's own deletions explain), time to converge after each fault,
and changes while metrics were missing.

The figures are computed by pure functions of what a watcher saw (`History`, `converged`,
`duplicated`, `lost`, `extra_pod_starts`, `fault_targets`); `run_faults` drives the stack.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ... import constants as C
from ...shell import crashpoints
from .live import Target
from ... import timestamps

NAMESPACE = "specdecode-faults"
SERVICES = 3
REPLICAS = 2
RECONCILE_INTERVAL_S = 10.0
EVALUATION_TICK_S = 1.0
SCRAPE_S = 1.0
CYCLE_S = 80.0  # acceptance good for half a cycle, collapsed for the other half
MID_ROLLOUT = "mid-rollout"
RANDOM_MOMENT = "random-moment"
KILL_POINTS = (crashpoints.DECISION_IN_STATUS, crashpoints.DEPLOYMENT_APPLIED, MID_ROLLOUT, RANDOM_MOMENT)
TIMEOUT = 5.0  # seconds for each of the watcher's API calls (an apiserver going away must not hang it)
WORKLOAD = {"prompt_tokens": 1000, "output_tokens": 300, "temperature": 0.0}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    kills: tuple[str, ...]
    apiserver_down_s: float
    prometheus_down_s: float
    arm_timeout_s: float
    converge_timeout_s: float

    @classmethod
    def of(cls, seed: int, quick: bool, kills: Optional[int] = None) -> "Plan":
        """Quick: each kill point once, short outages. Full: 20 kills at seeded points (each
        point at least once), the apiserver down a minute, Prometheus three minutes."""
        rng = random.Random(seed)
        count = kills if kills is not None else (len(KILL_POINTS) if quick else 20)
        points = list(KILL_POINTS[:count]) + [rng.choice(KILL_POINTS) for _ in range(count - len(KILL_POINTS))]
        rng.shuffle(points)
        if quick:
            return cls(tuple(points), apiserver_down_s=15.0, prometheus_down_s=60.0, arm_timeout_s=2 * CYCLE_S,
                       converge_timeout_s=120.0)
        return cls(tuple(points), apiserver_down_s=60.0, prometheus_down_s=180.0, arm_timeout_s=2 * CYCLE_S,
                   converge_timeout_s=240.0)


# -------------------------------------------------------------------------- what to apply


def scenario_document(seed: int) -> dict:
    """Acceptance good (K tunes, stays on) then collapsed (the guards turn speculation off),
    every CYCLE_S, for two hours: decisions keep coming."""
    phases = []
    for i in range(int(2 * 3600 / CYCLE_S)):
        at = i * CYCLE_S
        phases.append({"at": f"{at:g}s", "request_rate": 2, "acceptance": 0.8, **WORKLOAD})
        phases.append({"at": f"{at + CYCLE_S / 2:g}s", "acceptance": 0.2})
    return {"name": "faults-churn", "duration": "2h", "seed": seed, "method": "draft_model",
            "model": {"replicas": REPLICAS}, "phases": phases}


def service_manifest(index: int, prometheus_url: str, namespace: str = NAMESPACE) -> dict:
    from .live import draft_service

    return draft_service(
        f"svc-{index}", namespace, k=3, replicas=REPLICAS, rollout={"maxSurge": 1, "maxUnavailable": 0},
        # Canary experiments off: the figures count decisions, Deployment rollouts and pod
        # starts of the main Deployment (a re-probe on a canary would be neither a decision's
        # rollout nor a fault's pod); the canary's own crash-safety has its e2e tests (#15).
        autotune={"evaluationInterval": "5s", "window": "30s", "warmup": "5s", "minDrafts": 200, "minRequests": 10,
                  "cooldown": "10s", "maxChangesPerHour": 60, "reprobeInterval": "30s",
                  "experiments": {"enabled": False}},
        metrics={"prometheusUrl": prometheus_url, "scrapeInterval": f"{SCRAPE_S:g}s"})


# ------------------------------------------------------------------------- pure figures


def decision_key(entry: dict) -> tuple:
    return (entry.get("time"), entry.get("action"), entry.get("fromK"), entry.get("toK"))


@dataclass
class History:
    """Everything a watcher saw, per service."""

    seen: dict[str, dict[tuple, dict]] = field(default_factory=dict)
    """Every history entry ever seen in status, by decision_key."""
    template_hashes: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """The Deployment template's config hash each time it changed (wall time, hash)."""
    pods: dict[str, set[str]] = field(default_factory=dict)
    """The uid of every vLLM pod ever seen (kwok pods live seconds at least: polling sees all)."""

    def observe(self, now: float, services: list[dict], deployments: list[dict], pods: list[dict] = ()) -> None:
        for pod in pods:
            meta = pod.get("metadata") or {}
            name = (meta.get("labels") or {}).get(C.LABEL_SERVICE)
            if name:
                self.pods.setdefault(name, set()).add(meta.get("uid", ""))
        for sds in services:
            name = sds["metadata"]["name"]
            bucket = self.seen.setdefault(name, {})
            for entry in (sds.get("status") or {}).get("history") or []:
                bucket.setdefault(decision_key(entry), entry)
        for d in deployments:
            name = ((d.get("metadata") or {}).get("labels") or {}).get(C.LABEL_SERVICE)
            if not name:
                continue
            labels = (((d.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
            config = labels.get(C.LABEL_CONFIG_HASH, "")
            changes = self.template_hashes.setdefault(name, [])
            if not changes or changes[-1][1] != config:
                changes.append((now, config))


def lost(seen: dict[str, dict[tuple, dict]], final: dict[str, list[dict]], bound: int = C.MAX_DECISION_HISTORY) -> int:
    """Decisions seen in status that are gone at the end (not pushed out by the history bound)."""
    count = 0
    for name, entries in seen.items():
        have = {decision_key(e) for e in final.get(name, [])}
        if len(final.get(name, [])) >= bound:
            oldest = min((e.get("time") or "" for e in final.get(name, [])), default="")
            entries = {k: e for k, e in entries.items() if (e.get("time") or "") >= oldest}
        count += sum(1 for key in entries if key not in have)
    return count


def duplicated(history: list[dict]) -> int:
    """Entries that repeat a decision: the same move again, or a move from a K the previous
    decision had already left (decided from a stale state)."""
    count = 0
    for earlier, later in zip(history, history[1:]):
        if not (earlier.get("applied", True) and later.get("applied", True)):
            continue
        same = (earlier.get("action"), earlier.get("fromK"), earlier.get("toK")) == \
            (later.get("action"), later.get("fromK"), later.get("toK"))
        stale = later.get("fromK") != earlier.get("toK") and later.get("action") != "fallback"
        count += 1 if (same or stale) else 0
    return count


def extra_pod_starts(pod_creates: int, replicas: int, rollouts: int, deployment_deletes: int, scaled_up: int) -> int:
    """vLLM pods started beyond what the bench explains: the first rollout, one new pod per
    replica for each rollout of a decision, the pods of Deployments the bench deleted, and
    the pods a bench's scale-up added."""
    expected = replicas * (1 + rollouts + deployment_deletes) + scaled_up
    return max(0, pod_creates - expected)


def converged(sds: dict, deployment: Optional[dict], service: Optional[dict], ports: Optional[list],
              need_metrics: bool = False) -> Optional[str]:
    """None when the service is where the operator should have brought it, else what is not."""
    status = sds.get("status") or {}
    effective = status.get("speculation") or {}
    if status.get("phase") != C.PHASE_SERVING:
        return f"phase {status.get('phase')}"
    degraded = next((c for c in status.get("conditions", []) if c.get("type") == C.COND_DEGRADED), {})
    if degraded.get("status") == "True":
        return f"Degraded: {degraded.get('message', '')[:120]}"
    if need_metrics:
        available = next((c for c in status.get("conditions", []) if c.get("type") == C.COND_METRICS_AVAILABLE), {})
        if available.get("status") != "True":
            return "MetricsAvailable is not True"
    if deployment is None:
        return "no Deployment"
    spec, dstatus, meta = deployment.get("spec") or {}, deployment.get("status") or {}, deployment.get("metadata") or {}
    want = (sds.get("spec") or {}).get("replicas", 1)
    if spec.get("replicas") != want:
        return f"Deployment replicas {spec.get('replicas')}, spec says {want}"
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(C.LABEL_CONFIG_HASH) != effective.get("configHash"):
        return f"Deployment runs config {labels.get(C.LABEL_CONFIG_HASH)}, status says {effective.get('configHash')}"
    if (dstatus.get("observedGeneration") or 0) < (meta.get("generation") or 0):
        return "Deployment not observed yet"
    for key in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"):
        if (dstatus.get(key) or 0) != want:
            return f"rollout: {key} {dstatus.get(key) or 0}/{want}"
    if not effective.get("live"):
        return "status: config not live yet"
    if service is None:
        return "no Service"
    if ports is not None and service_ports(service) != ports:
        return f"Service ports {service_ports(service)}, rendered {ports}"
    return None


def service_ports(service: dict) -> list:
    return [(p.get("name"), p.get("port"), str(p.get("targetPort"))) for p in (service.get("spec") or {}).get("ports") or []]


@dataclass
class FaultResult:
    fault: str
    detail: str
    converge_s: Optional[float]
    """From the end of the fault (the operator restarted, the part back, the edit made)."""
    not_converged: str = ""


@dataclass
class FaultFigures:
    faults: list[FaultResult]
    kills: int
    kill_points_reached: dict[str, int]
    decisions: int
    decisions_lost: int
    decisions_duplicated: int
    extra_pod_starts: int
    changes_without_metrics: int
    operator_exits: int
    """Times the operator exited by itself (not killed by the bench), e.g. during the outage."""
    reconcile_interval_s: float
    elapsed_s: float
    machine: str = ""

    @property
    def worst_converge_s(self) -> Optional[float]:
        times = [f.converge_s for f in self.faults]
        return None if any(t is None for t in times) or not times else max(times)

    def to_json(self) -> dict:
        out = asdict(self)
        out["worst_converge_s"] = self.worst_converge_s
        return out

    def rows(self) -> list[tuple[str, str]]:
        rows = [(f"{f.fault} ({f.detail})" if f.detail else f.fault,
                 "did not converge: " + f.not_converged if f.converge_s is None else f"converged in {f.converge_s:.0f} s")
                for f in self.faults]
        reached = ", ".join(f"{k} {v}" for k, v in self.kill_points_reached.items())
        rows += [
            ("operator SIGKILLs", f"{self.kills} ({reached})"),
            ("decisions made (applied, in history)", str(self.decisions)),
            ("operator exits on its own", str(self.operator_exits)),
            ("run time", f"{self.elapsed_s / 60:.1f} min"),
            ("machine", self.machine),
        ]
        return rows


def fault_targets(f: FaultFigures) -> list[Target]:
    limit = 2 * f.reconcile_interval_s
    worst = f.worst_converge_s
    return [
        Target("decisions lost", str(f.decisions_lost), "0", f.decisions_lost == 0),
        Target("decisions duplicated in history", str(f.decisions_duplicated), "0", f.decisions_duplicated == 0),
        Target("extra vLLM pod starts", str(f.extra_pod_starts), "0", f.extra_pod_starts == 0),
        Target("worst time to converge", "never" if worst is None else f"{worst:.0f} s",
               f"< {limit:.0f} s (2 reconcile intervals)", worst is not None and worst < limit),
        Target("changes while metrics were missing", str(f.changes_without_metrics), "0",
               f.changes_without_metrics == 0),
        Target("operator exits on its own", str(f.operator_exits), "0", f.operator_exits == 0),
    ]


# ------------------------------------------------------------------------------ the run


class Watcher:
    """Polls the services and their Deployments twice a second and records what it saw."""

    def __init__(self, custom, apps, core):
        self.custom, self.apps, self.core = custom, apps, core
        self.history = History()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def snapshot(self) -> tuple[list[dict], dict[str, dict], dict[str, dict]]:
        services = self.custom.list_namespaced_custom_object(C.GROUP, C.VERSION, NAMESPACE, C.PLURAL,
                                                             _request_timeout=TIMEOUT)["items"]
        client = self.apps.api_client
        deployments = {d["metadata"]["name"]: d for d in client.sanitize_for_serialization(
            self.apps.list_namespaced_deployment(NAMESPACE, _request_timeout=TIMEOUT).items)}
        svcs = {s["metadata"]["name"]: s for s in client.sanitize_for_serialization(
            self.core.list_namespaced_service(NAMESPACE, _request_timeout=TIMEOUT).items)}
        return services, deployments, svcs

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        while not self._stop.wait(0.5):
            try:
                services, deployments, _ = self.snapshot()
                pods = self.apps.api_client.sanitize_for_serialization(self.core.list_namespaced_pod(
                    NAMESPACE, label_selector=f"{C.LABEL_MANAGED_BY}={C.LABEL_MANAGED_BY_VALUE}",
                    _request_timeout=TIMEOUT).items)
            except (ApiException, HTTPError, OSError):
                continue  # the apiserver is down: nothing to see
            with self.lock:
                self.history.observe(time.time(), services, list(deployments.values()), pods)


def run_faults(plan: Plan, *, seed: int, workdir: Path, cluster_name: str, progress: Progress,
               keep: bool = False) -> FaultFigures:
    import yaml
    from kubernetes import client

    from ...shell.kube import load_config
    from ..localstack.cluster import LocalCluster
    from ..localstack.install import kubectl
    from ..localstack.prometheus import start_prometheus
    from ..localstack.stack import Stack
    from . import live

    rng = random.Random(seed)
    started = time.monotonic()
    stack = Stack(workdir, progress=progress)
    (workdir / "operator").mkdir(parents=True, exist_ok=True)
    operator_stack = Stack(workdir / "operator", progress=progress)
    restarted_prometheus = []
    watcher: Optional[Watcher] = None
    try:
        cluster = stack.start_cluster(cluster_name, nodes=4, gpus_per_node=8, ready_delay="3s", recreate=False,
                                      keep=keep, build_progress=False)
        local = LocalCluster(cluster_name)
        operator_stack.use_existing_cluster(cluster.kubeconfig, kubectl=str(cluster.kubectl))
        k = stack.kubectl_command
        live.fresh_namespace(k, NAMESPACE)
        prometheus = stack.start_prometheus(label="faults", scrape_interval_s=SCRAPE_S)
        scenario = workdir / "faults-churn.yaml"
        scenario.write_text(yaml.safe_dump(scenario_document(seed)))
        stack.start_simulator(str(scenario), prometheus, label="faults", namespaces=[NAMESPACE])

        def start_operator(env: Optional[dict] = None):
            operator_stack.close()
            # The services name the stack's Prometheus, as a platform allows it.
            return operator_stack.start_operator(prometheus_url="http://127.0.0.1:9",
                                                 reconcile_interval_s=RECONCILE_INTERVAL_S,
                                                 evaluation_tick_s=EVALUATION_TICK_S, env=env,
                                                 extra_args=("--allowed-prometheus-urls", prometheus.url))

        operator = start_operator()
        manifests = [service_manifest(i, prometheus.url) for i in range(SERVICES)]
        kubectl(k, "apply", "--server-side", "--field-manager=specdecode-bench", "-f", "-",
                input="\n".join(json.dumps(m) for m in manifests))
        api_client = load_config(str(cluster.kubeconfig))
        watcher = Watcher(client.CustomObjectsApi(api_client), client.AppsV1Api(api_client), client.CoreV1Api(api_client))
        watcher.start()
        ports: dict[str, list] = {}

        def state(need_metrics: bool = False) -> Optional[str]:
            """None when every service converged, else the first thing that is not."""
            services, deployments, svcs = watcher.snapshot()
            if len(services) < SERVICES:
                return "services missing"
            for sds in services:
                name = sds["metadata"]["name"]
                why = converged(sds, deployments.get(name), svcs.get(name), ports.get(name), need_metrics)
                if why is not None:
                    return f"{name}: {why}"
            return None

        def wait_converged(timeout_s: float, need_metrics: bool = False,
                           since: Optional[float] = None) -> tuple[Optional[float], str]:
            """Seconds from `since` (monotonic; default now) until every service converged."""
            from kubernetes.client.exceptions import ApiException
            from urllib3.exceptions import HTTPError

            t0 = time.monotonic() if since is None else since
            why = ""
            while time.monotonic() - t0 < timeout_s:
                try:
                    why = state(need_metrics) or ""
                except (ApiException, HTTPError, OSError) as err:
                    why = f"API: {err}"
                if not why:
                    return time.monotonic() - t0, ""
                time.sleep(0.5)
            return None, why

        progress("waiting for the fleet to serve")
        took, why = wait_converged(180, need_metrics=True)
        if took is None:
            raise RuntimeError(f"the fleet never served: {why}\n{operator_stack_log(operator)}")
        _, _, svcs = watcher.snapshot()
        ports.update({name: service_ports(s) for name, s in svcs.items()})

        results: list[FaultResult] = []
        reached: dict[str, int] = {}
        exits = 0

        def record(fault: str, detail: str, converge: tuple[Optional[float], str]) -> None:
            results.append(FaultResult(fault, detail, converge[0], converge[1]))
            shown = "did not converge: " + converge[1] if converge[0] is None else f"converged in {converge[0]:.0f} s"
            progress(f"{fault} {detail}: {shown}")

        # 1. SIGKILLs at seeded points.
        for number, point in enumerate(plan.kills, 1):
            progress(f"kill {number}/{len(plan.kills)}: {point}")
            if point in crashpoints.POINTS:
                operator = start_operator({crashpoints.ENV: point})
                died = _wait_exit(operator.managed.process, plan.arm_timeout_s)
                detail = point if died else f"{point} not reached in {plan.arm_timeout_s:.0f} s: killed then"
            elif point == MID_ROLLOUT:
                rolling = _wait_for(lambda: _rolling(watcher), plan.arm_timeout_s)
                detail = point if rolling else f"no rollout in {plan.arm_timeout_s:.0f} s: killed then"
                died = False
            else:
                time.sleep(rng.uniform(0.5, 10.0))
                detail, died = point, False
            if not died:
                operator.managed.process.kill()
                operator.managed.process.wait(30)
            killed_at = time.monotonic()
            where = point if detail == point else "not reached"
            reached[where] = reached.get(where, 0) + 1
            operator = start_operator()
            record("operator SIGKILL", detail, wait_converged(plan.converge_timeout_s, since=killed_at))

        # 2. The apiserver goes away and comes back. kube-controller-manager and the scheduler
        # exit when they lose their leader lease meanwhile; a kubelet would restart them.
        progress(f"stopping the kube-apiserver for {plan.apiserver_down_s:.0f} s")
        supervised = [local.component_command(c) for c in ("kube-controller-manager", "kube-scheduler")]
        stopped = local.stop_component("kube-apiserver")
        time.sleep(plan.apiserver_down_s)
        local.start_component(stopped)
        supervisor = threading.Thread(target=_restart_when_dead, args=(local, supervised, 60.0), daemon=True)
        supervisor.start()
        record("kube-apiserver restart", f"down {plan.apiserver_down_s:.0f} s", wait_converged(plan.converge_timeout_s))
        if not operator.managed.alive():
            exits += 1
            progress(f"the operator exited during the apiserver outage (code {operator.managed.process.returncode})")
            operator = start_operator()
            record("operator restarted after exiting", "", wait_converged(plan.converge_timeout_s))

        # 3. Prometheus stops for minutes: no change may happen meanwhile.
        wait_converged(plan.converge_timeout_s, need_metrics=True)
        progress(f"stopping Prometheus for {plan.prometheus_down_s:.0f} s")
        with watcher.lock:
            before = {n: set(v) for n, v in watcher.history.seen.items()}
            hashes_before = {n: len(v) for n, v in watcher.history.template_hashes.items()}
        port = prometheus.port
        prometheus.stop()
        outage_start = time.time()
        time.sleep(plan.prometheus_down_s)
        with watcher.lock:
            new_decisions = sum(
                1 for n, v in watcher.history.seen.items() for key, e in v.items()
                if key not in before.get(n, set()) and (timestamps.epoch_seconds_or_none(e.get("time")) or 0.0) >= outage_start + 2)
            new_rollouts = sum(len(v) - hashes_before.get(n, 0) for n, v in watcher.history.template_hashes.items())
        changes_without_metrics = max(new_decisions, new_rollouts)
        back = start_prometheus(prometheus.work_dir, workdir / "faults" / "targets.json", scrape_interval_s=SCRAPE_S,
                                port=port)
        restarted_prometheus.append(back)
        record("Prometheus outage", f"down {plan.prometheus_down_s:.0f} s",
               wait_converged(plan.converge_timeout_s, need_metrics=True))

        # 4. Owned objects deleted and edited.
        edits = [
            ("Deployment deleted", ["delete", "deployment", "svc-0", "-n", NAMESPACE, "--wait=false"]),
            ("Service deleted", ["delete", "service", "svc-1", "-n", NAMESPACE, "--wait=false"]),
            ("Deployment scaled to 4 (kubectl scale)", ["scale", "deployment", "svc-2", "-n", NAMESPACE, "--replicas=4"]),
            ("foreign annotation on the Deployment", ["annotate", "deployment", "svc-0", "-n", NAMESPACE,
                                                      "example.com/owner=platform-team"]),
            ("Service port edited", ["patch", "service", "svc-1", "-n", NAMESPACE, "--type=json", "-p",
                                     json.dumps([{"op": "replace", "path": "/spec/ports/0/port", "value": 8001}])]),
        ]
        for fault, args in edits:
            wait_converged(plan.converge_timeout_s)
            kubectl(k, *args)
            record(fault, "", wait_converged(plan.converge_timeout_s))

        watcher.stop()
        services, deployments, _ = watcher.snapshot()
        final = {s["metadata"]["name"]: (s.get("status") or {}).get("history") or [] for s in services}
        mismatch = sum(1 for s in services
                       if (deployments.get(s["metadata"]["name"]) or {}).get("spec", {}).get("template", {})
                       .get("metadata", {}).get("labels", {}).get(C.LABEL_CONFIG_HASH)
                       != ((s.get("status") or {}).get("speculation") or {}).get("configHash"))
        seen = watcher.history
        applied = {name: [e for e in entries.values() if e.get("applied", True)] for name, entries in seen.seen.items()}
        extra = sum(
            extra_pod_starts(len(seen.pods.get(name, ())), REPLICAS, len(applied.get(name, [])),
                             deployment_deletes=1 if name == "svc-0" else 0, scaled_up=2 if name == "svc-2" else 0)
            for name in final)
        return FaultFigures(
            faults=results, kills=len(plan.kills), kill_points_reached=reached,
            decisions=sum(len(v) for v in applied.values()),
            decisions_lost=lost(watcher.history.seen, final) + mismatch,
            decisions_duplicated=sum(duplicated(h) for h in final.values()),
            extra_pod_starts=extra, changes_without_metrics=changes_without_metrics, operator_exits=exits,
            reconcile_interval_s=RECONCILE_INTERVAL_S, elapsed_s=time.monotonic() - started,
            machine=live.machine_note(),
        )
    finally:
        if watcher is not None:
            watcher.stop()
        for server in restarted_prometheus:
            server.stop()
        operator_stack.close()
        stack.close()


def operator_stack_log(operator) -> str:
    from ..localstack.stack import log_tail

    return log_tail(operator.managed.log_path, 40)



def _restart_when_dead(local, components: list, watch_s: float) -> None:
    """What a kubelet does for static pods: start a component again when it exited."""
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        pids = local.component_pids()
        for component in components:
            if pids.get(component.component) is None:
                local.start_component(component)
        time.sleep(1.0)


def _wait_exit(process, timeout_s: float) -> bool:
    import subprocess

    try:
        process.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _wait_for(check: Callable[[], Any], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def _rolling(watcher: Watcher) -> bool:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        _, deployments, _ = watcher.snapshot()
    except (ApiException, HTTPError, OSError):  # the apiserver hiccups: not rolling as far as we know
        return False
    for d in deployments.values():
        spec, status, meta = d.get("spec") or {}, d.get("status") or {}, d.get("metadata") or {}
        want = spec.get("replicas", 1)
        if (status.get("observedGeneration") or 0) < (meta.get("generation") or 0):
            return True
        if (status.get("updatedReplicas") or 0) < want or (status.get("replicas") or 0) > want:
            return True
    return False
