"""A local Kubernetes control plane with fake GPU nodes, for tests and the demo.

kwokctl (`--runtime=binary`) starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the kwok controller from the binaries `build.py` compiled. kwokctl does
the parts that are easy to get subtly wrong by hand: a CA and admin certificate, the
service-account signing key (TokenRequest works), kubeconfigs for every component, pid
files. This module adds what the project needs on top:

- everything lives in one state directory per cluster (never `~/.kube/config` and never
  `~/.kwok`: `KWOK_WORKDIR` and `--kubeconfig` point into the state directory);
- every component listens on 127.0.0.1 only, on ports chosen under a machine-wide lock
  (kwokctl's own choice races when two clusters start at once);
- an audit log of every write (its path is in `ClusterInfo.audit_log`);
- Stages that make pods start, load (a ready delay) and optionally crash-loop;
- fake GPU nodes; `up` returns only once they are Ready and pods can be created;
- `down` kills every process of the cluster even if kwokctl or a test crashed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import yaml

from specdecode.processes import alive
from specdecode.tools.localstack.build import Binaries, ensure_binaries
from specdecode.tools.localstack.manifests import (ClusterSpec, Ports, audit_policy, gpu_nodes,
                                             kwokctl_configuration, pod_stages)

DEFAULT_CLUSTER_NAME = "specdecode"

# The components kwokctl starts, by the names of their pid files (kwokctl links each binary
# into the cluster's bin/ under these names and keys pids/ and logs/ by them).
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


@dataclass(frozen=True)
class StoppedComponent:
    """How to start a stopped component again."""

    component: str
    command: list[str]
    environ: dict[str, str]
    cwd: str


class ClusterError(RuntimeError):
    """The cluster could not be started, reused or stopped; the message says what to do."""


@dataclass(frozen=True)
class ClusterInfo:
    """How to reach a running local cluster."""

    name: str
    kubeconfig: Path
    server: str
    audit_log: Path
    kubectl: Path
    state_dir: Path
    log_dir: Path
    kubernetes_version: str
    spec: ClusterSpec

    @property
    def kubectl_cache_dir(self) -> Path:
        """kubectl's discovery cache for this cluster (instead of ~/.kube/cache)."""
        return self.state_dir / "kube-cache"

    def kubectl_command(self, *args: str) -> list[str]:
        """A kubectl command line against this cluster (the kubectl built with it)."""
        return [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.kubectl_cache_dir),
                *args]

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | str,
                                   expiration: str = "24h") -> Path:
        """Write a kubeconfig that authenticates as ServiceAccount `namespace/name` (created if
        needed) with a TokenRequest token. Permissions are the caller's business: apply the
        RBAC under test, so that a process run with it has exactly what it would have in a
        real cluster, and its writes carry its own username in the audit log."""
        from specdecode.tools.localstack.install import service_account_kubeconfig

        return service_account_kubeconfig(self.kubectl_command(), self.kubeconfig, Path(path), namespace=namespace,
                                          account=name, duration=expiration, create=True)

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment whose KUBECONFIG points at this cluster."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def to_json(self) -> dict:
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data = {key: str(value) if isinstance(value, Path) else value for key, value in data.items()}
        data["spec"] = self.spec.as_dict()
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> ClusterInfo:
        values = dict(data)
        for key in ("kubeconfig", "audit_log", "kubectl", "state_dir", "log_dir"):
            values[key] = Path(values[key])
        values["spec"] = ClusterSpec(**values["spec"])
        return cls(**values)


@dataclass(frozen=True)
class ComponentLaunch:
    """How a component process was started, read from /proc before it is stopped."""

    component: str
    argv: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]

    @classmethod
    def of_process(cls, component: str, pid: int) -> "ComponentLaunch":
        argv = tuple(a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a)
        raw_env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = tuple(tuple(e.decode(errors="replace").split("=", 1)) for e in raw_env if b"=" in e)
        return cls(component, argv, os.readlink(f"/proc/{pid}/cwd"), env)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    state: str  # "running", "degraded" (some component down or apiserver unhealthy), "absent"
    components: dict[str, int | None]  # component -> pid when alive, else None
    info: ClusterInfo | None
    detail: str = ""


# --------------------------------------------------------------------------------------------
# Pure helpers: names, paths, command lines
# --------------------------------------------------------------------------------------------

_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


def validate_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.match(name):
        raise ClusterError(
            f"invalid cluster name {name!r}: use 1-40 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def default_state_root(environ: Mapping[str, str] | None = None) -> Path:
    """`$SPECDECODE_STATE_DIR`, else `$XDG_STATE_HOME/specdecode/cluster`, else ~/.local/state/…"""
    environ = os.environ if environ is None else environ
    if environ.get("SPECDECODE_STATE_DIR"):
        return Path(environ["SPECDECODE_STATE_DIR"]).expanduser()
    xdg = environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "specdecode" / "cluster"


def kwokctl_environment(environ: Mapping[str, str], state_dir: Path, kubectl_dir: Path) -> dict[str, str]:
    """kwokctl's environment: its work directory in our state dir, our kubectl first on PATH.

    kwokctl keeps clusters under `$KWOK_WORKDIR` (default ~/.kwok) and runs whichever
    `kubectl` is first on PATH for its health checks; the machine's may be another minor.
    KWOK_* variables from the caller are dropped: they would override our configuration.
    KUBECACHEDIR keeps kubectl's discovery cache out of ~/.kube.
    """
    env = {key: value for key, value in environ.items() if not key.startswith("KWOK_")}
    env["KWOK_WORKDIR"] = str(state_dir / "kwok")
    env["KUBECACHEDIR"] = str(state_dir / "kube-cache")
    env["PATH"] = os.pathsep.join([str(kubectl_dir), env.get("PATH", os.defpath)])
    env.pop("KUBECONFIG", None)
    return env


def kwokctl_create_command(kwokctl: Path, name: str, config: Path, kubeconfig: Path) -> list[str]:
    return [
        str(kwokctl), "--name", name, "--config", str(config),
        "create", "cluster",
        "--runtime", "binary",
        # Without --kubeconfig kwokctl adds the cluster to ~/.kube/config.
        "--kubeconfig", str(kubeconfig),
        "--timeout", "5m",
    ]


def server_from_kubeconfig(kubeconfig_text: str) -> str:
    """The API server URL of the kubeconfig's current context."""
    config = yaml.safe_load(kubeconfig_text) or {}
    contexts = {item["name"]: item["context"] for item in config.get("contexts") or []}
    clusters = {item["name"]: item["cluster"] for item in config.get("clusters") or []}
    current = config.get("current-context")
    if current not in contexts or contexts[current].get("cluster") not in clusters:
        raise ClusterError("the kubeconfig written by kwokctl has no usable current context")
    return clusters[contexts[current]["cluster"]]["server"]


def render_kwokctl_config(binaries: Binaries, spec: ClusterSpec, audit_policy_path: Path, ports: Ports) -> str:
    """One YAML stream: kwokctl's options followed by the pod Stages kwok runs."""
    documents = [kwokctl_configuration(binaries, audit_policy_path, ports), *pod_stages(spec)]
    return yaml.safe_dump_all(documents, sort_keys=False)


def spec_mismatch(running: ClusterSpec, wanted: ClusterSpec) -> list[str]:
    """Human-readable differences between a running cluster's spec and the wanted one."""
    old, new = running.as_dict(), wanted.as_dict()
    return [f"{key}: running {old.get(key)!r}, wanted {new[key]!r}" for key in new if old.get(key) != new[key]]


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------

def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_referencing(path: Path) -> list[int]:
    """Pids whose command line mentions `path`.

    Every process of a cluster gets paths inside its own work directory on its command line
    (data dir, certificates, kubeconfig), so this finds exactly that cluster's processes,
    including ones whose pid file was lost when kwokctl or the caller crashed. Matching
    `path/` (not `path`) keeps a cluster's directory from matching a longer sibling name.
    """
    needle = str(path) + os.sep
    own = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != own and needle in _cmdline(int(entry.name)):
            pids.append(int(entry.name))
    return sorted(pids)


def terminate(pids: Sequence[int], grace_seconds: float = 10.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after the grace period."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # SIGKILL is delivered asynchronously: give the kernel a moment to reap before callers
    # check for survivors.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that are free right now, chosen by the kernel.

    All sockets stay bound until every port is chosen, so the ports differ; the kernel's
    ephemeral range is random, unlike kwokctl's countdown from 32767.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]


def choose_ports(apiserver_port: int = 0) -> Ports:
    """Ports for a new cluster; `apiserver_port` if given (it must be free), others chosen freely."""
    if apiserver_port and port_in_use(apiserver_port):
        raise ClusterError(f"port {apiserver_port} on 127.0.0.1 is in use: choose another --port, or 0 for a free one")
    chosen = free_ports(6)
    if apiserver_port:
        chosen = [apiserver_port] + [port for port in chosen if port != apiserver_port][:5]
    return Ports(*chosen)


# Held from choosing ports until the components listen on them, so that two clusters started
# at the same moment never pick the same ones. Machine-wide (not per state directory).
_START_LOCK = Path(tempfile.gettempdir()) / "specdecode-localstack-start.lock"


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    with open(_START_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------

class LocalCluster:
    """One named local cluster and its state directory.

        info = LocalCluster("e2e").up(nodes=4, gpus_per_node=8, ready_delay="2s")
        subprocess.run(info.kubectl_command("get", "nodes"))
        LocalCluster("e2e").down()
    """

    def __init__(self, name: str = DEFAULT_CLUSTER_NAME, state_dir: Path | str | None = None,
                 log: Callable[[str], None] | None = None):
        self.name = validate_cluster_name(name)
        self.state_dir = Path(state_dir).expanduser().resolve() if state_dir else default_state_root() / name
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))

    # -- paths ---------------------------------------------------------------------------

    @property
    def kwok_root(self) -> Path:
        return self.state_dir / "kwok"

    @property
    def workdir(self) -> Path:
        """kwokctl's directory for this cluster: pki, etcd data, pids, component logs."""
        return self.kwok_root / "clusters" / self.name

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def audit_log_path(self) -> Path:
        return self.log_dir / "audit.log"

    @property
    def _info_path(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def _config_dir(self) -> Path:
        return self.state_dir / "config"

    @property
    def _kwokctl_log(self) -> Path:
        return self.state_dir / "kwokctl.log"

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise `up` and `down` of this cluster across processes (two test sessions).

        The lock file sits beside the state directory, which `down` deletes.
        """
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir.with_name(f".{self.name}.lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- queries -------------------------------------------------------------------------

    def info(self) -> ClusterInfo | None:
        """What `up` recorded, or None when the cluster was never started or is down."""
        try:
            return ClusterInfo.from_json(json.loads(self._info_path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            raise ClusterError(
                f"{self._info_path} is unreadable ({err}): run `specdecode cluster down --name {self.name}`"
            ) from err

    def kubeconfig(self) -> Path:
        if not self.kubeconfig_path.exists():
            raise ClusterError(f"cluster {self.name!r} is not up: run `specdecode cluster up --name {self.name}`")
        return self.kubeconfig_path

    def _recorded_pids(self) -> dict[str, int]:
        """The pids kwokctl recorded for the components it started so far."""
        pids = {}
        for component in COMPONENTS:
            try:
                pids[component] = int((self.workdir / "pids" / f"{component}.pid").read_text().strip())
            except (OSError, ValueError):
                continue
        return pids

    def _is_ours(self, pid: int) -> bool:
        # Guard against a recycled pid: the process must still be one of this cluster's.
        return alive(pid) and str(self.workdir) + os.sep in _cmdline(pid)

    def component_pids(self) -> dict[str, int | None]:
        """Each component's pid if it is alive (kwokctl's pid files), else None."""
        recorded = self._recorded_pids()
        return {component: recorded[component] if component in recorded and self._is_ours(recorded[component])
                else None for component in COMPONENTS}

    def stop_component(self, component: str) -> "ComponentLaunch":
        """Stop one running component (SIGTERM, then SIGKILL) and return how kwokctl started it,
        for `start_component`: an API server outage, a controller crash, on demand."""
        pid = self.component_pids().get(component)
        if pid is None:
            raise ClusterError(f"{component} of cluster {self.name!r} is not running")
        launch = ComponentLaunch.of_process(component, pid)
        terminate([pid])
        return launch

    def start_component(self, launch: "ComponentLaunch") -> int:
        """Start a component again exactly as it ran (command line, directory, environment),
        logging where kwokctl logs it; its pid goes into kwokctl's pid file, so `status` and
        `down` know it."""
        log_path = self.workdir / "logs" / f"{launch.component}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(list(launch.argv), cwd=launch.cwd, env=dict(launch.env), stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (self.workdir / "pids" / f"{launch.component}.pid").write_text(f"{process.pid}\n")
        return process.pid

    def _dead_components(self) -> list[str]:
        """Components that were started and have exited since."""
        return [component for component, pid in self._recorded_pids().items() if not self._is_ours(pid)]

    def _apiserver_ready(self, info: ClusterInfo, timeout: float = 5.0) -> tuple[bool, str]:
        try:
            result = subprocess.run(info.kubectl_command("get", "--raw", "/readyz", f"--request-timeout={int(timeout)}s"),
                                    capture_output=True, text=True, timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            return False, "kube-apiserver did not answer /readyz in time"
        except OSError as err:
            return False, f"cannot run kubectl: {err}"
        if result.returncode == 0 and result.stdout.strip() == "ok":
            return True, ""
        return False, (result.stderr or result.stdout).strip()

    def status(self) -> ClusterStatus:
        info = self.info()
        pids = self.component_pids()
        if info is None and not any(pids.values()):
            return ClusterStatus(self.name, "absent", pids, None)
        down = [name for name, pid in pids.items() if pid is None]
        if info is None:
            return ClusterStatus(self.name, "degraded", pids, None, "processes without a completed `up`")
        if down:
            return ClusterStatus(self.name, "degraded", pids, info, "not running: " + ", ".join(down))
        ready, why = self._apiserver_ready(info)
        if not ready:
            return ClusterStatus(self.name, "degraded", pids, info, why)
        return ClusterStatus(self.name, "running", pids, info)

    # -- up ------------------------------------------------------------------------------

    def up(self, nodes: int = 4, gpus_per_node: int = 8, ready_delay: str = "2s", fail_after: str = "1s",
           crash_backoff: str = "1s", gpu_product: str = "NVIDIA-H100-80GB-HBM3", apiserver_port: int = 0,
           recreate: bool = False, progress: bool = True, timeout: float = 300.0) -> ClusterInfo:
        """Start the cluster, or reuse it when it already runs with the same settings.

        A running cluster with other settings is an error unless `recreate` (its workloads
        would be lost); a half-dead one is replaced. Builds the binaries if they are missing.
        """
        binaries = ensure_binaries(progress=progress)
        with self._lock():
            return self._up_locked(binaries, nodes, gpus_per_node, ready_delay, fail_after, crash_backoff,
                                   gpu_product, apiserver_port, recreate, progress, timeout)

    def _up_locked(self, binaries: Binaries, nodes: int, gpus_per_node: int, ready_delay: str, fail_after: str,
                   crash_backoff: str, gpu_product: str, apiserver_port: int, recreate: bool, progress: bool,
                   timeout: float) -> ClusterInfo:
        spec = ClusterSpec(
            nodes=nodes, gpus_per_node=gpus_per_node, gpu_product=gpu_product, ready_delay=ready_delay,
            fail_after=fail_after, crash_backoff=crash_backoff,
            kubernetes_version=binaries.kubernetes_version, kwok_version=binaries.kwok_version,
            etcd_version=binaries.etcd_version,
        )
        try:
            spec.validate()
        except ValueError as err:
            raise ClusterError(str(err)) from err

        current = self.status()
        if current.state == "running" and current.info is not None and not recreate:
            differences = spec_mismatch(current.info.spec, spec)
            if not differences:
                return current.info
            raise ClusterError(
                f"cluster {self.name!r} is running with other settings ({'; '.join(differences)}): "
                f"run `specdecode cluster down --name {self.name}` first, or pass --recreate"
            )
        if current.state != "absent":
            if current.state == "degraded" and progress:
                self._log(f"cluster {self.name!r} is not healthy ({current.detail}); replacing it")
            self._down_locked(progress=False)

        started = time.monotonic()
        try:
            info = self._create(binaries, spec, apiserver_port, progress, timeout)
        except BaseException:
            # Never leave half a cluster running behind an error (or a Ctrl-C).
            try:
                self._sweep_processes()
            except ClusterError as sweep_error:
                self._log(f"while cleaning up: {sweep_error}")
            raise
        if progress:
            self._log(f"cluster {self.name!r} up in {time.monotonic() - started:.1f}s: {info.server}")
        return info

    def _create(self, binaries: Binaries, spec: ClusterSpec, apiserver_port: int, progress: bool,
                timeout: float) -> ClusterInfo:
        deadline = time.monotonic() + timeout
        self._config_dir.mkdir(parents=True, exist_ok=True)
        audit_policy_path = self._config_dir / "audit-policy.yaml"
        audit_policy_path.write_text(yaml.safe_dump(audit_policy(), sort_keys=False))
        config_path = self._config_dir / "kwokctl.yaml"
        nodes_path = self._config_dir / "nodes.yaml"
        nodes_path.write_text(yaml.safe_dump_all(gpu_nodes(spec), sort_keys=False))

        if progress:
            self._log(f"starting cluster {self.name!r} (Kubernetes {binaries.kubernetes_version}, "
                      f"etcd {binaries.etcd_version}, kwok {binaries.kwok_version}) in {self.state_dir}")
        env = kwokctl_environment(os.environ, self.state_dir, binaries.kubectl.parent)
        command = kwokctl_create_command(binaries.kwokctl, self.name, config_path, self.kubeconfig_path)
        with _start_lock():
            config_path.write_text(render_kwokctl_config(binaries, spec, audit_policy_path,
                                                         choose_ports(apiserver_port)))
            self._run_kwokctl_create(command, env, deadline)

        info = ClusterInfo(
            name=self.name,
            kubeconfig=self.kubeconfig_path,
            server=server_from_kubeconfig(self.kubeconfig_path.read_text()),
            audit_log=self.audit_log_path,
            kubectl=binaries.kubectl,
            state_dir=self.state_dir,
            log_dir=self.log_dir,
            kubernetes_version=binaries.kubernetes_version,
            spec=spec,
        )
        self._wait_until(deadline, "kube-apiserver to become ready", lambda: self._apiserver_ready(info)[0])
        self._kubectl(info, deadline, "apply", "--server-side", "--field-manager=specdecode-localstack",
                      "-f", str(nodes_path))
        self._kubectl(info, deadline, "wait", "--for=condition=Ready", "nodes", "--all",
                      f"--timeout={max(int(deadline - time.monotonic()), 1)}s")
        # Pods are refused until the ServiceAccount controller made the namespace's `default`
        # account; tests that create a pod right after `up` must not race it.
        self._wait_until(deadline, "the default ServiceAccount",
                         lambda: self._kubectl_ok(info, "get", "serviceaccount", "default", "-n", "default"))
        self._info_path.write_text(json.dumps(info.to_json(), indent=2) + "\n")
        return info

    def _run_kwokctl_create(self, command: list[str], env: Mapping[str, str], deadline: float) -> None:
        """Run `kwokctl create cluster`, failing as soon as a component dies.

        kwokctl itself would wait two minutes for an apiserver that already exited.
        """
        with open(self._kwokctl_log, "w") as log:
            process = subprocess.Popen(command, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                while process.poll() is None:
                    dead = self._dead_components()
                    if dead:
                        raise ClusterError(self._failure(f"{', '.join(dead)} exited during start-up"))
                    if time.monotonic() > deadline:
                        raise ClusterError(self._failure("kwokctl create cluster timed out"))
                    time.sleep(0.2)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if process.returncode != 0:
            raise ClusterError(self._failure(f"kwokctl create cluster failed (exit {process.returncode})"))

    def _kubectl(self, info: ClusterInfo, deadline: float, *args: str) -> str:
        command = info.kubectl_command(*args)
        try:
            result = subprocess.run(command, capture_output=True, text=True,
                                    timeout=max(deadline - time.monotonic(), 1) + 10)
        except subprocess.TimeoutExpired as err:
            raise ClusterError(self._failure(f"`kubectl {' '.join(args)}` timed out")) from err
        if result.returncode != 0:
            raise ClusterError(self._failure(f"`kubectl {' '.join(args)}` failed: {result.stderr.strip()}"))
        return result.stdout

    def _kubectl_ok(self, info: ClusterInfo, *args: str) -> bool:
        try:
            return subprocess.run(info.kubectl_command(*args), capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _wait_until(self, deadline: float, what: str, check: Callable[[], bool]) -> None:
        while True:
            if check():
                return
            dead = self._dead_components()
            if dead:
                raise ClusterError(self._failure(f"{', '.join(dead)} exited while waiting for {what}"))
            if time.monotonic() > deadline:
                raise ClusterError(self._failure(f"timed out waiting for {what}"))
            time.sleep(0.25)

    def _failure(self, headline: str) -> str:
        """An error message with the evidence: kwokctl's output and the dead components' logs."""
        parts = [f"{headline} (cluster {self.name!r}, state in {self.state_dir})"]
        kwokctl_tail = _tail(self._kwokctl_log, 8)
        if kwokctl_tail:
            parts.append(f"--- {self._kwokctl_log} (last lines)\n{kwokctl_tail}")
        for component, pid in self.component_pids().items():
            if pid is None:
                log = self.log_dir / f"{component}.log"
                if log.exists():
                    parts.append(f"--- {log} (last lines; {component} is not running)\n{_tail(log, 8)}")
        return "\n".join(parts)

    # -- one component ---------------------------------------------------------------------

    def component_command(self, component: str) -> "StoppedComponent":
        """How a running component was started (command line, environment, directory), so that
        `start_component` can start it again after it stopped."""
        pid = self.component_pids().get(component)
        if pid is None:
            raise ClusterError(f"component {component!r} of cluster {self.name!r} is not running")
        proc = Path("/proc") / str(pid)
        command = [part.decode() for part in proc.joinpath("cmdline").read_bytes().split(b"\0") if part]
        environ = dict(item.decode().split("=", 1) for item in proc.joinpath("environ").read_bytes().split(b"\0")
                       if b"=" in item)
        return StoppedComponent(component, command, environ, os.readlink(proc / "cwd"))

    def stop_component(self, component: str) -> "StoppedComponent":
        """Stop one component (an outage: `bench faults` stops the apiserver); the answer
        starts it again (`start_component`)."""
        stopped = self.component_command(component)
        terminate([self.component_pids()[component]])
        return stopped

    def start_component(self, stopped: "StoppedComponent") -> int:
        """Start a component stopped by `stop_component` again, as kwokctl had started it."""
        with open(self.log_dir / f"{stopped.component}.log", "ab") as log:
            process = subprocess.Popen(stopped.command, cwd=stopped.cwd, env=stopped.environ, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        (self.workdir / "pids" / f"{stopped.component}.pid").write_text(str(process.pid))
        return process.pid

    # -- down ----------------------------------------------------------------------------

    def down(self, progress: bool = True) -> bool:
        """Stop every process of the cluster and delete its state. True if anything was there."""
        with self._lock():
            return self._down_locked(progress)

    def _down_locked(self, progress: bool) -> bool:
        # No `kwokctl delete cluster`: it only SIGKILLs the pids in its pid files and deletes
        # the work directory. Terminating every process that names the work directory covers
        # lost pid files too, and gives the components a SIGTERM first.
        existed = self.state_dir.exists()
        self._sweep_processes()
        if existed:
            shutil.rmtree(self.state_dir)
            if progress:
                self._log(f"cluster {self.name!r} is down; removed {self.state_dir}")
        elif progress:
            self._log(f"cluster {self.name!r} was not running")
        return existed

    def _sweep_processes(self) -> None:
        pids = processes_referencing(self.workdir)
        if pids:
            terminate(pids)
        survivors = [pid for pid in processes_referencing(self.workdir) if alive(pid)]
        if survivors:
            raise ClusterError(f"could not stop processes {survivors} of cluster {self.name!r}: kill them by pid")
