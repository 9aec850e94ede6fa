"""Run the operator as a user would, through the same local stack the demo uses: its CRD,
RBAC and peering applied with kubectl, the process started with a ServiceAccount token bound
to the shipped ClusterRole (never as cluster-admin), its liveness and metrics polled.

The `operator` fixture is registered once, in conftest.py: a session fixture imported into
several test modules would be one fixture per module, and two operators of equal peering
priority freeze each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdecode.tools.bench.live import AuditLog, AuditMark
from specdecode.tools.localstack import ClusterInfo
from specdecode.tools.localstack.install import OPERATOR_USER  # noqa: F401  (re-exported for tests)
from specdecode.tools.localstack.stack import OperatorProcess, Stack, log_tail

REPO = Path(__file__).resolve().parents[2]
# Short so tests see many level-triggered passes and evaluations quickly.
RECONCILE_INTERVAL_S = 2.0
EVALUATION_TICK_S = 1.0
# Where the shared operator finds no Prometheus: connections are refused at once, so
# evaluations hold with MetricsAvailable=False. Closed-loop tests point each service at a
# Prometheus of their own through spec.metrics.prometheusUrl.
NO_PROMETHEUS = "http://127.0.0.1:9"
# The tests' Prometheus servers listen on 127.0.0.1 at ports chosen at run time: the platform
# (here, the test) allows every port of that one address, and nothing else.
ALLOWED_PROMETHEUS = "http://127.0.0.1:*"
ALLOW_LOCAL_PROMETHEUS = ("--allowed-prometheus-urls", ALLOWED_PROMETHEUS)


def kubectl(cluster: ClusterInfo, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cluster.kubectl_command(*args), input=input, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done


@dataclass
class RunningOperator:
    stack: Stack
    process: OperatorProcess
    cluster: ClusterInfo
    workdir: Path

    @property
    def model_cache_root(self) -> Path:
        """Where the operator reads model configs for the draft preflight (tests put some)."""
        return self.workdir / "model-cache"

    def restart(self) -> None:
        """A new operator process with the same settings (the old one stopped if still alive):
        everything it knows must come from the cluster."""
        self.stack.close()
        fresh = start_operator(self.cluster, self.workdir)
        self.stack, self.process = fresh.stack, fresh.process

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of the operator's /metrics, keyed by (name, sorted labels)."""
        text = urllib.request.urlopen(self.process.metrics_url, timeout=5).read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def total(self, name: str, **labels: str) -> float:
        return sum(
            value
            for (sample, sample_labels), value in self.metrics().items()
            if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items())
        )

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.process.managed.log_path, lines)

    def alive(self) -> bool:
        return self.process.managed.alive()


def start_operator(cluster: ClusterInfo, workdir: Path, extra_args: tuple[str, ...] = ()) -> RunningOperator:
    """The tests' operator (`extra_args`: more `specdecode run` flags, e.g. a setting under test)."""
    stack = Stack(workdir)
    stack.use_existing_cluster(cluster.kubeconfig, kubectl=str(cluster.kubectl))
    (workdir / "model-cache").mkdir(exist_ok=True)
    process = stack.start_operator(prometheus_url=NO_PROMETHEUS, reconcile_interval_s=RECONCILE_INTERVAL_S,
                                   evaluation_tick_s=EVALUATION_TICK_S,
                                   extra_args=("--model-cache-root", str(workdir / "model-cache"),
                                               *ALLOW_LOCAL_PROMETHEUS, *extra_args))
    return RunningOperator(stack, process, cluster, workdir)


@pytest.fixture(scope="session")
def operator(cluster: ClusterInfo, tmp_path_factory) -> Iterator[RunningOperator]:
    running = start_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield running
    finally:
        running.stack.close()
        if os.environ.get("CI"):
            sys.stderr.write(f"\n--- operator log (tail) ---\n{running.log_tail(200)}\n")


def wait_namespace_usable(cluster: ClusterInfo, name: str, timeout: float = 120.0) -> None:
    """Wait while namespace `name` is being deleted: a module before this one deleted it
    without waiting, and nothing can be created in it (not even a dry run) until it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = kubectl(cluster, "get", "namespace", name, "-o", "jsonpath={.status.phase}", check=False)
        if done.returncode != 0 or done.stdout.strip() != "Terminating":
            return
        time.sleep(0.5)
    pytest.fail(f"namespace {name} still terminating after {timeout:.0f}s")


def holds_for(check, seconds: float, what: str) -> None:
    """Assert that `check` stays true, polled all along, for `seconds` (the way to show
    that something does NOT happen: no change, no flap)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert check(), what
        time.sleep(0.5)


def audit_writes(cluster: ClusterInfo, user: str, namespace: str,
                 since: Optional[AuditMark] = None) -> tuple[list[dict], AuditMark]:
    """Write requests `user` made in `namespace` according to the apiserver's audit log, and
    a mark of what was read (pass it back as `since` to see only newer entries; the log may
    rotate in between: `AuditLog` reads across it)."""
    log = AuditLog(cluster.audit_log)
    mark = log.mark()
    lines = log.lines_since(since or AuditMark(0, 0))
    writes = []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written right now
        if entry.get("stage") != "ResponseComplete" or entry.get("user", {}).get("username") != user:
            continue
        if entry.get("verb") in ("create", "update", "patch", "delete", "deletecollection"):
            if (entry.get("objectRef") or {}).get("namespace") == namespace:
                writes.append(entry)
    return writes, mark
