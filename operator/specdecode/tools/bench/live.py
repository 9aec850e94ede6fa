"""What the benchmarks on the local stack (`bench fleet`, `bench faults`) measure and how
they report it: process figures from /proc, Prometheus' own count of the queries it
answered, the operator's counters, the apiserver's audit log, and targets printed as holds /
falls short.

The parsers are pure (text in, numbers out); the readers around them only fetch the text.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Target:
    """One figure against its goal."""

    name: str
    figure: str
    goal: str
    holds: bool

    def to_json(self) -> dict:
        return asdict(self)


# -------------------------------------------------------------------------------- services


def draft_service(name: str, namespace: str, *, k: int, replicas: int, autotune: dict, metrics: dict,
                  rollout: Optional[dict] = None) -> dict:
    """A SpecDecodeService with a draft model the simulator serves (the benchmarks' fleets)."""
    from ... import constants as C

    spec = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                        "numSpeculativeTokens": k, "minK": 1, "maxK": 6},
        "replicas": replicas,
        "autotune": {"mode": "Auto", **autotune},
        "metrics": metrics,
    }
    if rollout:
        spec["rollout"] = rollout
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def fresh_namespace(kubectl_command, namespace: str) -> None:
    """The benchmark's namespace, empty (a kept cluster may hold an earlier run's)."""
    from ..localstack.install import kubectl

    kubectl(kubectl_command, "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=300)
    kubectl(kubectl_command, "create", "namespace", namespace)


# ------------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int
    peak_rss_bytes: int
    cpu_s: float


def parse_proc(status_text: str, stat_text: str, ticks_per_s: float) -> ProcessSample:
    """/proc/PID/status (VmRSS, VmHWM) and /proc/PID/stat (utime + stime, children excluded)."""
    fields = {}
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()

    def kib(name: str) -> int:
        return int(fields.get(name, "0 kB").split()[0]) * 1024

    # The command name (2nd field) may hold spaces: split after its closing parenthesis.
    rest = stat_text.rsplit(")", 1)[1].split()
    utime, stime = int(rest[11]), int(rest[12])
    return ProcessSample(kib("VmRSS"), kib("VmHWM"), (utime + stime) / ticks_per_s)


def process_sample(pid: int) -> ProcessSample:
    base = Path("/proc") / str(pid)
    return parse_proc((base / "status").read_text(), (base / "stat").read_text(), os.sysconf("SC_CLK_TCK"))


# --------------------------------------------------------------------------------- counters


def counter_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples in Prometheus' text format, over the samples whose labels
    include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def scrape(url: str, timeout_s: float = 10.0) -> str:
    return urllib.request.urlopen(url, timeout=timeout_s).read().decode()


def prometheus_queries(prometheus_url: str) -> float:
    """Instant queries Prometheus has answered (its own counter: independent of the operator's)."""
    text = scrape(prometheus_url.rstrip("/") + "/metrics")
    return counter_sum(text, "prometheus_http_requests_total", handler="/api/v1/query")


# -------------------------------------------------------------------------------- audit log


@dataclass(frozen=True)
class AuditWrite:
    verb: str
    resource: str  # "deployments", "specdecodeservices/status", ...
    namespace: str
    name: str
    time: str
    latency_s: Optional[float] = None
    """From the request's arrival to its answer (the audit entry's two timestamps)."""


def _completed_writes(lines: Iterable[str]) -> Iterator[dict]:
    """The audit entries of completed write requests; a line cut short by the writer is skipped."""
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("stage") == "ResponseComplete" and entry.get("verb") in WRITE_VERBS:
            yield entry


def audit_writes(lines: Iterable[str], user: str, namespaces: Optional[Iterable[str]] = None) -> list[AuditWrite]:
    """The write requests `user` made (in `namespaces`, when given) in audit log lines."""
    wanted = None if namespaces is None else set(namespaces)
    out = []
    for entry in _completed_writes(lines):
        if (entry.get("user") or {}).get("username") != user:
            continue
        ref = entry.get("objectRef") or {}
        if wanted is not None and ref.get("namespace") not in wanted:
            continue
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        received, answered = _stamp(entry.get("requestReceivedTimestamp", "")), _stamp(entry.get("stageTimestamp", ""))
        latency = answered - received if received is not None and answered is not None else None
        out.append(AuditWrite(entry["verb"], resource, ref.get("namespace", ""), ref.get("name", ""),
                              entry.get("stageTimestamp", ""), latency))
    return out


@dataclass(frozen=True)
class AuditMark:
    """A place in the audit log: the file (by inode, which a rotation does not change) and the
    byte offset in it."""

    inode: int
    offset: int


class AuditLog:
    """Reads an audit log from a mark, so that a long run does not re-read it all.

    The API server rotates its audit log (at 100 MB on the local stack: the backups are
    `audit-<time>.log` beside it): a 500-service run crossed that, and an offset into the new
    file read nothing, so the steady stretch showed 0 writes whatever was written. A mark names
    its file by inode; the lines since are the rest of that file and every file after it."""

    def __init__(self, path: Path):
        self.path = path

    def _files(self) -> list[Path]:
        """Oldest first: the rotated backups (their names sort by time), then the live log."""
        backups = sorted(self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}"))
        return [*backups, self.path] if self.path.exists() else backups

    def mark(self) -> AuditMark:
        try:
            stat = self.path.stat()
        except OSError:
            return AuditMark(0, 0)
        return AuditMark(stat.st_ino, stat.st_size)

    def lines_since(self, mark: AuditMark) -> list[str]:
        files = self._files()
        inodes = [f.stat().st_ino for f in files]
        if mark.inode == 0:
            start, offset = 0, 0  # no log yet when marked: all of it is since
        elif mark.inode in inodes:
            start, offset = inodes.index(mark.inode), mark.offset
        else:
            raise RuntimeError(f"the audit log {self.path} rotated past the mark and its backup is gone: "
                               "the writes since cannot be counted")
        data = b""
        for index, path in enumerate(files[start:]):
            with open(path, "rb") as handle:
                handle.seek(offset if index == 0 else 0)
                data += handle.read()
        return data.decode(errors="replace").splitlines()


def count_by(writes: Iterable[AuditWrite]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in writes:
        key = f"{w.verb} {w.resource}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def latency_by(writes: Iterable[AuditWrite]) -> dict[str, dict[str, float]]:
    """Per kind of write ("patch services"): how many, the median and 90th percentile of
    their latency, and how many the apiserver completed a second from its first answer to its
    last (the kube-apiserver allocates ClusterIPs one at a time, so Services come at its pace
    however many are in flight), the most numerous first."""
    latencies: dict[str, list[float]] = {}
    answered: dict[str, list[float]] = {}
    for w in writes:
        if w.latency_s is not None:
            key = f"{w.verb} {w.resource}"
            latencies.setdefault(key, []).append(w.latency_s)
            at = _stamp(w.time)
            if at is not None:
                answered.setdefault(key, []).append(at)
    summary = {}
    for key, values in sorted(latencies.items(), key=lambda kv: -len(kv[1])):
        times = answered.get(key, [])
        span = max(times) - min(times) if len(times) > 1 else 0.0
        summary[key] = {"count": len(values), "median_s": _percentile(values, 0.5), "p90_s": _percentile(values, 0.9),
                        "per_s": (len(times) - 1) / span if span > 0 else 0.0}
    return summary


# ------------------------------------------------------------------------------------ table


def render_targets(console, title: str, rows: list[tuple[str, str]], targets: list[Target]) -> None:
    from rich.table import Table

    figures = Table(title=title, show_header=True, header_style="bold")
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    for name, value in rows:
        figures.add_row(name, value)
    console.print(figures)
    table = Table(title="targets", show_header=True, header_style="bold")
    table.add_column("target")
    table.add_column("measured", justify="right")
    table.add_column("goal")
    table.add_column("verdict")
    for t in targets:
        table.add_row(t.name, t.figure, t.goal, "[green]holds[/]" if t.holds else "[red]falls short[/]")
    console.print(table)


def machine_note() -> str:
    """What else ran while the benchmark did: load average and CPU count (runs vary with it)."""
    try:
        load = os.getloadavg()
    except OSError:
        return f"{os.cpu_count()} CPUs"
    return f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"


# ------------------------------------------------------------------------ time to Serving


@dataclass(frozen=True)
class Stage:
    """One step on a new service's way to Serving, over the fleet: how long it took each
    service after the previous step (median, 90th percentile) and when the last service
    reached it, counted from the first service's creation (the path to "all Serving")."""

    name: str
    median_s: float
    p90_s: float
    last_at_s: float
    services: int


# The steps of a new service, in order, as the audit log shows them.
SERVING_STAGES = ("created", "Deployment applied", "Deployment available", "Serving written")


def _stamp(text: str) -> Optional[float]:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    import math

    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _says_serving(request: Any) -> bool:
    """Whether a status write (a JSON patch or a whole object) sets phase Serving."""
    if isinstance(request, list):
        return any(isinstance(op, dict) and _says_serving(op.get("value")) for op in request)
    if isinstance(request, dict):
        status = request.get("status", request)
        return isinstance(status, dict) and status.get("phase") == "Serving"
    return False


def _available(request: Any) -> bool:
    return isinstance(request, dict) and ((request.get("status") or {}).get("availableReplicas") or 0) >= 1


def serving_stages(lines: Iterable[str], namespace: str, operator_user: str) -> list[Stage]:
    """Where the time to Serving goes, from the audit log (writes logged with their request bodies): per
    service, its creation, the operator's first apply of its Deployment, the Deployment
    controller's first status with an available replica, the operator's status write that
    says Serving. Services missing a step are left out of that step and the ones after it."""
    first: dict[str, dict[str, float]] = {stage: {} for stage in SERVING_STAGES}
    # Most of a fleet's log is pods: skip them before parsing.
    relevant = (line for line in lines
                if '"resource":"specdecodeservices"' in line or '"resource":"deployments"' in line)
    for entry in _completed_writes(relevant):
        ref = entry.get("objectRef") or {}
        if ref.get("namespace") != namespace or not (200 <= (entry.get("responseStatus") or {}).get("code", 200) < 300):
            continue
        at = _stamp(entry.get("stageTimestamp", ""))
        if at is None:
            continue
        user = (entry.get("user") or {}).get("username")
        resource, sub, name = ref.get("resource"), ref.get("subresource"), ref.get("name", "")
        stage = None
        if resource == "specdecodeservices" and not sub and user != operator_user and entry["verb"] != "delete":
            stage = "created"
        elif resource == "deployments" and not sub and user == operator_user and entry["verb"] != "delete":
            stage = "Deployment applied"
        elif resource == "deployments" and sub == "status" and _available(entry.get("requestObject")):
            stage = "Deployment available"
        elif resource == "specdecodeservices" and sub == "status" and user == operator_user \
                and _says_serving(entry.get("requestObject")):
            stage = "Serving written"
        if stage and name not in first[stage]:
            first[stage][name] = at
    created = first["created"]
    if not created:
        return []
    origin = min(created.values())
    stages = []
    previous = created
    for name in SERVING_STAGES:
        reached = {svc: at for svc, at in first[name].items() if svc in previous}
        if not reached:
            break
        gaps = [at - previous[svc] for svc, at in reached.items()] if name != "created" else [0.0]
        stages.append(Stage(name, _percentile(gaps, 0.5), _percentile(gaps, 0.9),
                            max(reached.values()) - origin, len(reached)))
        previous = reached
    return stages
