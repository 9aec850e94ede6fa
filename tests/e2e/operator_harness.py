"""Run the operator as a user would: its CRD, RBAC and peering applied with kubectl, the
process started with a ServiceAccount token bound to the shipped ClusterRole (never as
cluster-admin), its liveness and metrics endpoints polled.

Test modules import the `operator` fixture from here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specdecode.localstack import ClusterInfo

from .conftest import poll_until

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "specdecode-system"
OPERATOR_ACCOUNT = "specdecode-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
# Short so tests see many level-triggered passes quickly.
RECONCILE_INTERVAL_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kubectl(cluster: ClusterInfo, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cluster.kubectl_command(*args), input=input, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def wait_established(cluster: ClusterInfo, *crd_names: str) -> None:
    """Poll until each CRD is Established (`kubectl wait` errors out while a brand-new CRD
    has no conditions yet)."""
    for name in crd_names:
        poll_until(
            lambda: kubectl(cluster, "get", "crd", name, "-o",
                            "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False).stdout == "True",
            60, f"CRD {name} to be Established",
        )


def install_prerequisites(cluster: ClusterInfo) -> None:
    """What `manifests/` installs before the operator runs: CRD, peering, namespace, RBAC."""
    kubectl(cluster, "apply", "--server-side", "-f", str(REPO / "crds"))
    wait_established(cluster, "specdecodeservices.serving.specdecode.io")
    # kopf's peering: its CRD must be Established before the ClusterKopfPeering object exists.
    peering = list(yaml.safe_load_all((REPO / "manifests" / "base" / "kopf-peering.yaml").read_text()))
    crds = [d for d in peering if d["kind"] == "CustomResourceDefinition"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    wait_established(cluster, *(d["metadata"]["name"] for d in crds))
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([d for d in peering if d not in crds]))
    kubectl(cluster, "create", "namespace", OPERATOR_NAMESPACE, check=False)
    kubectl(cluster, "apply", "--server-side", "-f", str(REPO / "manifests" / "base" / "rbac.yaml"))


def service_account_kubeconfig(cluster: ClusterInfo, path: Path) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount (TokenRequest)."""
    token = kubectl(cluster, "create", "token", OPERATOR_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster_entry}],
        "users": [{"name": OPERATOR_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": OPERATOR_ACCOUNT}}],
        "current-context": "operator",
    }
    if "certificate-authority" in cluster_entry and not Path(cluster_entry["certificate-authority"]).is_absolute():
        base = cluster.kubeconfig.parent
        cluster_entry["certificate-authority"] = str(base / cluster_entry["certificate-authority"])
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class RunningOperator:
    process: subprocess.Popen
    log_path: Path
    metrics_url: str
    liveness_url: str
    kubeconfig: Path
    env: dict = field(default_factory=dict)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of the operator's /metrics, keyed by (name, sorted labels)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
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
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None


def start_operator(cluster: ClusterInfo, workdir: Path, extra_args: tuple[str, ...] = (), env: dict | None = None) -> RunningOperator:
    kubeconfig = service_account_kubeconfig(cluster, workdir / "operator.kubeconfig")
    liveness, metrics = free_port(), free_port()
    log_path = workdir / "operator.log"
    environ = {**os.environ, **(env or {})}
    environ.pop("KUBECONFIG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "specdecode", "run", "--kubeconfig", str(kubeconfig),
         "--reconcile-interval", str(RECONCILE_INTERVAL_S), "--liveness-port", str(liveness),
         "--metrics-port", str(metrics), *extra_args],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=environ,
    )
    running = RunningOperator(process, log_path, f"http://127.0.0.1:{metrics}/metrics",
                              f"http://127.0.0.1:{liveness}/healthz", kubeconfig, environ)

    def healthy() -> bool:
        if not running.alive():
            pytest.fail(f"the operator exited ({process.returncode}):\n{running.log_tail()}")
        try:
            return urllib.request.urlopen(running.liveness_url, timeout=2).status == 200
        except OSError:
            return False

    poll_until(healthy, 60, "the operator's liveness endpoint")
    return running


def stop_operator(running: RunningOperator) -> None:
    if running.alive():
        running.process.terminate()
        try:
            running.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            running.process.kill()
            running.process.wait(timeout=10)


# Where the operator finds no Prometheus: connections are refused at once, so evaluations
# hold with MetricsAvailable=False instead of waiting on DNS.
NO_PROMETHEUS = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def operator(cluster: ClusterInfo, tmp_path_factory) -> Iterator[RunningOperator]:
    install_prerequisites(cluster)
    running = start_operator(cluster, tmp_path_factory.mktemp("operator"), ("--prometheus-url", NO_PROMETHEUS))
    try:
        yield running
    finally:
        stop_operator(running)
        if os.environ.get("CI"):
            sys.stderr.write(f"\n--- operator log (tail) ---\n{running.log_tail(200)}\n")


def audit_writes(cluster: ClusterInfo, user: str, namespace: str, since_line: int = 0) -> tuple[list[dict], int]:
    """Write requests `user` made in `namespace` according to the apiserver's audit log, and
    the number of lines read (pass it back as `since_line` to see only newer entries)."""
    import json

    lines = cluster.audit_log.read_text(errors="replace").splitlines()
    writes = []
    for line in lines[since_line:]:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written right now
        if entry.get("stage") != "ResponseComplete" or entry.get("user", {}).get("username") != user:
            continue
        if entry.get("verb") in ("create", "update", "patch", "delete", "deletecollection"):
            if (entry.get("objectRef") or {}).get("namespace") == namespace:
                writes.append(entry)
    return writes, len(lines)
