"""The whole local stack in one owner: control plane, Prometheus, simulator, operator.

`specdecode demo`, `specdecode cluster` and the e2e fixtures start the same processes the
same way. Each part can be started alone (tests share one control plane and one operator,
and give every test its own simulator and Prometheus); `Stack.close()` stops everything this
stack started, in reverse order, also after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import install
from .cluster import ClusterInfo, LocalCluster
from .prometheus import VLLM_NAMES_AS_SCRAPED, PrometheusServer, start_prometheus

Progress = Callable[[str], None]


class StackError(RuntimeError):
    """A part of the stack did not start; the message says which and shows its log tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ManagedProcess:
    """A child process of the stack with its log file."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def spawn(name: str, args: Sequence[str], log_path: Path, env: Optional[dict] = None) -> ManagedProcess:
    """Start `python -m specdecode ARGS` with its output in `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **(env or {})}
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "specdecode", *args], stdout=log,
                                   stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    return ManagedProcess(name, process, log_path)


def wait_http_ok(url: str, timeout_s: float, what: ManagedProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not what.alive():
            raise StackError(f"{what.name} exited ({what.process.returncode}):\n{log_tail(what.log_path)}")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise StackError(f"{what.name} did not answer {url} within {timeout_s:.0f}s:\n{log_tail(what.log_path)}")


@dataclass
class OperatorProcess:
    managed: ManagedProcess
    metrics_url: str
    liveness_url: str
    kubeconfig: Path


@dataclass
class SimulatedMetrics:
    """A simulator and the Prometheus that scrapes it."""

    simulator: ManagedProcess
    prometheus: PrometheusServer
    targets_file: Path

    @property
    def prometheus_url(self) -> str:
        return self.prometheus.url


@dataclass
class Stack:
    """What one owner started; `close()` stops it all."""

    workdir: Path
    progress: Progress = lambda message: None
    cluster: Optional[ClusterInfo] = None
    kubeconfig: Optional[Path] = None
    kubectl_command: list[str] = field(default_factory=list)
    _owned_cluster: Optional[LocalCluster] = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    # ------------------------------------------------------------------------ control plane

    def start_cluster(self, name: str, *, nodes: int = 4, gpus_per_node: int = 8, ready_delay: str = "2s",
                      recreate: bool = False, keep: bool = False, build_progress: bool = True) -> ClusterInfo:
        local = LocalCluster(name)
        self.progress(f"starting the local control plane '{name}' (builds it the first time)")
        self.cluster = local.up(nodes=nodes, gpus_per_node=gpus_per_node, ready_delay=ready_delay,
                                recreate=recreate, progress=build_progress)
        self.kubeconfig = self.cluster.kubeconfig
        self.kubectl_command = self.cluster.kubectl_command()
        if not keep:
            self._owned_cluster = local
            self._closers.append(lambda: local.down(progress=False))
        return self.cluster

    def use_existing_cluster(self, kubeconfig: Path, kubectl: str = "kubectl") -> None:
        """Work against a cluster someone else runs (`--use-current-context`)."""
        self.kubeconfig = kubeconfig
        self.kubectl_command = [kubectl, "--kubeconfig", str(kubeconfig)]

    # ----------------------------------------------------------------------------- operator

    def start_operator(self, *, prometheus_url: str, reconcile_interval_s: float = 10.0,
                       evaluation_tick_s: float = 2.0, extra_args: Sequence[str] = (),
                       env: Optional[dict] = None) -> OperatorProcess:
        """Install the prerequisites, then run the operator under its ServiceAccount (`env`:
        extra environment, e.g. a crash point of `bench faults`)."""
        assert self.kubeconfig is not None, "start or choose a cluster first"
        self.progress("installing the CRD, RBAC and kopf peering")
        install.install_prerequisites(self.kubectl_command)
        token_config = install.service_account_kubeconfig(
            self.kubectl_command, self.kubeconfig, self.workdir / "operator.kubeconfig")
        liveness, metrics = free_port(), free_port()
        self.progress("starting the operator")
        managed = spawn("operator", [
            "run", "--kubeconfig", str(token_config), "--prometheus-url", prometheus_url,
            "--reconcile-interval", str(reconcile_interval_s), "--evaluation-tick", str(evaluation_tick_s),
            "--liveness-port", str(liveness), "--metrics-port", str(metrics), *extra_args,
        ], self.workdir / "operator.log", env={"KUBECONFIG": "", **(env or {})})
        self._closers.append(managed.stop)
        running = OperatorProcess(managed, f"http://127.0.0.1:{metrics}/metrics",
                                  f"http://127.0.0.1:{liveness}/healthz", token_config)
        wait_http_ok(running.liveness_url, 60, managed)
        return running

    # ----------------------------------------------------------------- simulator + Prometheus

    def start_simulated_metrics(self, scenario: str, *, label: str = "sim", namespaces: Sequence[str] = (),
                                time_scale: float = 1.0, scrape_interval_s: float = 1.0,
                                seed: Optional[int] = None,
                                vllm_names: str = VLLM_NAMES_AS_SCRAPED) -> SimulatedMetrics:
        """A simulator standing for the vLLM pods (of `namespaces`, or all) and a Prometheus
        scraping it with the labels a PodMonitor would give; `vllm_names` says how that
        Prometheus stores vLLM's names (`prometheus.VLLM_NAMES`)."""
        assert self.kubeconfig is not None, "start or choose a cluster first"
        prometheus = self.start_prometheus(label=label, scrape_interval_s=scrape_interval_s,
                                           vllm_names=vllm_names)
        return self.start_simulator(scenario, prometheus, label=label, namespaces=namespaces,
                                    time_scale=time_scale, seed=seed)

    def start_prometheus(self, *, label: str = "sim", scrape_interval_s: float = 1.0,
                         vllm_names: str = VLLM_NAMES_AS_SCRAPED) -> PrometheusServer:
        """A Prometheus scraping the targets a later `start_simulator(label=...)` writes: a
        caller can hand its URL to the operator before the scenario's clock starts."""
        workdir = self.workdir / label
        self.progress(f"starting Prometheus ({label})")
        prometheus = start_prometheus(workdir / "prometheus", workdir / "targets.json",
                                      scrape_interval_s=scrape_interval_s, vllm_names=vllm_names)
        self._closers.append(prometheus.stop)
        return prometheus

    def start_simulator(self, scenario: str, prometheus: PrometheusServer, *, label: str = "sim",
                        namespaces: Sequence[str] = (), time_scale: float = 1.0,
                        seed: Optional[int] = None) -> SimulatedMetrics:
        """The simulator for the Prometheus of `start_prometheus(label=...)`; the scenario's
        clock starts when the process has started."""
        assert self.kubeconfig is not None, "start or choose a cluster first"
        workdir = self.workdir / label
        targets = workdir / "targets.json"
        args = ["sim", "--kubeconfig", str(self.kubeconfig), "--scenario", scenario,
                "--targets-file", str(targets), "--time-scale", str(time_scale)]
        for namespace in namespaces:
            args += ["-n", namespace]
        if seed is not None:
            args += ["--seed", str(seed)]
        self.progress(f"starting the vLLM simulator ({label}: {scenario})")
        simulator = spawn(f"simulator ({label})", args, workdir / "simulator.log")
        self._closers.append(simulator.stop)
        return SimulatedMetrics(simulator, prometheus, targets)

    # ------------------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop every process this stack started, newest first; never raises on the way."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except (OSError, subprocess.SubprocessError, RuntimeError) as err:
                self.progress(f"while stopping: {err}")

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
