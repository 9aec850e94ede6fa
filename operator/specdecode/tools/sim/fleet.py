"""The simulator's shell: one process standing for the vLLM pods of many services.

`Simulator` keeps one `PodEngine` per pod (keyed by namespace, name and uid), serves each
Ready pod on its own 127.0.0.1 port (`/metrics`, `/health`), advances every engine on a
ticker with the load of its service split across the service's Ready pods, and writes the
Prometheus file_sd targets file (with the labels a PodMonitor gives) whenever the set of
served pods changes. Pods that are not Ready, terminating or deleted stop serving (their port
closes); a pod's counters live as long as its container: a new pod or a restarted container
starts from zero.

The pod list comes from outside: the Kubernetes watcher (`sim.kube`) calls `sync`, `upsert`
and `remove`; tests call them with hand-made `PodInfo`s through the same code path.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from prometheus_client import CollectorRegistry

from specdecode import constants as C
from specdecode.tools.scenario import Scenario, true_conditions
from specdecode.tools.sim.engine import PodEngine, engine_config_from_args, pod_params
from specdecode.tools.sim.exposition import exposition

log = logging.getLogger(__name__)

RESERVED_PORTS = frozenset({9090})
"""Debian's prometheus package may run a system server there; never serve on it."""


@dataclass(frozen=True)
class PodInfo:
    """What the simulator needs to know of a pod (from the Kubernetes API or a test)."""

    namespace: str
    name: str
    uid: str
    service: str
    """The SpecDecodeService it belongs to (label serving.specdecode.io/service)."""
    config_hash: str
    """Label serving.specdecode.io/config-hash of its pod template."""
    args: tuple[str, ...]
    """The vLLM container's command and args."""
    ready: bool
    restart_count: int = 0
    terminating: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating

    @property
    def lifetime(self) -> tuple[str, int]:
        """Identity of the container's life: counters reset when it changes."""
        return (self.uid, self.restart_count)


class _Pod:
    """A pod the simulator stands for: its engine, and its HTTP server while it serves."""

    def __init__(self, info: PodInfo, engine: PodEngine | None, error: str | None) -> None:
        self.info = info
        self.engine = engine
        self.error = error
        self.server: ThreadingHTTPServer | None = None
        self.registry: CollectorRegistry | None = None

    @property
    def port(self) -> int | None:
        return self.server.server_address[1] if self.server is not None else None


class _Listener:
    """One thread that accepts connections for every pod's server; each request is then
    handled on a thread of its own (ThreadingHTTPServer). A `serve_forever` thread per pod
    wakes 5 times a second to check for shutdown: at 500 pods those 2,500 wake-ups a second
    (and the GIL they take) made the simulator the busiest process of `bench fleet`."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sim-listener", daemon=True)
        self._thread.start()

    def add(self, server: ThreadingHTTPServer) -> None:
        server.timeout = 0  # handle_request: accept what the selector found ready, never wait
        with self._lock:
            self._selector.register(server, selectors.EVENT_READ, server)
        self._wake()

    def remove(self, server: ThreadingHTTPServer) -> None:
        """Stop accepting for ``server`` (its caller closes it)."""
        with self._lock:
            self._selector.unregister(server)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(timeout=5)
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending, or the listener is closed

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=5.0):
                if key.data is None:
                    try:
                        while self._wake_read.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                try:
                    key.data.handle_request()
                except (OSError, ValueError):
                    pass  # closed between the select and the accept: the pod stopped serving


class Simulator:
    """Stands for vLLM pods: metrics from the performance model under a scenario.

    `clock` returns seconds (monotonic); the scenario plays at `time_scale` times real time
    (its time axis compressed), while engines run in real time, so rates and latencies in
    the metrics keep their real-world values.
    """

    def __init__(
        self,
        scenario: Scenario,
        targets_file: Path | str | None = None,
        *,
        seed: int | None = None,
        time_scale: float = 1.0,
        host: str = "127.0.0.1",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scenario = scenario.compressed(time_scale) if time_scale != 1 else scenario
        self.seed = scenario.seed if seed is None else seed
        self.targets_file = Path(targets_file) if targets_file is not None else None
        self.host = host
        self.clock = clock
        self.start = clock()
        self._last_tick: float | None = None
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._lock = threading.RLock()
        self._written_targets: str | None = None
        self._outage = False
        self._listener = _Listener()
        if self.targets_file is not None:
            self._write_targets()

    # --- pod list updates (from the watcher or tests) ----------------------------------

    def sync(self, pods: Iterable[PodInfo], namespace: str | None = None) -> None:
        """The complete list of pods in `namespace` (all namespaces when None)."""
        pods = list(pods)
        seen = {p.key for p in pods}
        with self._lock:
            for key in list(self._pods):
                if (namespace is None or key[0] == namespace) and key not in seen:
                    self._drop(key)
            for pod in pods:
                self._apply(pod)
            self._write_targets()

    def upsert(self, pod: PodInfo) -> None:
        with self._lock:
            self._apply(pod)
            self._write_targets()

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._drop((namespace, name))
            self._write_targets()

    def _apply(self, info: PodInfo) -> None:
        current = self._pods.get(info.key)
        if current is not None and current.info.lifetime != info.lifetime:
            log.info("pod %s/%s restarted: counters start from zero", *info.key)
            self._drop(info.key)
            current = None
        if current is None:
            current = self._new_pod(info)
            self._pods[info.key] = current
        else:
            current.info = info
        if info.serving and current.engine is not None:
            self._serve(current)
        else:
            self._stop_serving(current)

    def _new_pod(self, info: PodInfo) -> _Pod:
        try:
            config = engine_config_from_args(info.args)
        except ValueError as err:
            # A real vLLM would crash-loop on such arguments: it never serves.
            log.warning("pod %s/%s: cannot start vLLM: %s", info.namespace, info.name, err)
            return _Pod(info, None, str(err))
        params = pod_params(self.scenario.params, config, self.scenario.model)
        material = f"{info.namespace}/{info.name}/{info.uid}/{info.restart_count}"
        rng = np.random.default_rng([self.seed, zlib.crc32(material.encode())])
        engine = PodEngine(config, params, rng)
        engine.metrics.created = time.time()  # prometheus_client stamps `_created` on the wall clock
        return _Pod(info, engine, None)

    def _drop(self, key: tuple[str, str]) -> None:
        pod = self._pods.pop(key, None)
        if pod is not None:
            self._stop_serving(pod)

    # --- HTTP ---------------------------------------------------------------------------

    def _serve(self, pod: _Pod) -> None:
        if pod.server is not None:
            return
        assert pod.engine is not None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(pod.engine.metrics)
        simulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    self._reply(200, b"", "text/plain")
                elif path == "/metrics":
                    if simulator.metrics_outage:
                        self._reply(503, b"metrics outage (scenario)\n", "text/plain")
                        return
                    self._reply(200, *exposition(registry, self.headers.get("Accept")))
                else:
                    self._reply(404, b"not found\n", "text/plain")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        server = _bind(self.host, Handler)
        self._listener.add(server)
        pod.server, pod.registry = server, registry
        log.info("serving %s/%s on %s:%d", pod.info.namespace, pod.info.name, self.host, pod.port)

    def _stop_serving(self, pod: _Pod) -> None:
        if pod.server is None:
            return
        server = pod.server
        pod.server = pod.registry = None
        self._listener.remove(server)
        server.server_close()
        log.info("stopped serving %s/%s", pod.info.namespace, pod.info.name)

    # --- targets ------------------------------------------------------------------------

    def targets(self) -> list[dict]:
        """file_sd target groups of the served pods, sorted for stable output."""
        with self._lock:
            groups = [
                {
                    "targets": [f"{self.host}:{pod.port}"],
                    "labels": {
                        "namespace": pod.info.namespace,
                        "pod": pod.info.name,
                        C.PROM_LABEL_SERVICE: pod.info.service,
                        C.PROM_LABEL_CONFIG_HASH: pod.info.config_hash,
                    },
                }
                for pod in self._pods.values()
                if pod.server is not None
            ]
        return sorted(groups, key=lambda g: (g["labels"]["namespace"], g["labels"]["pod"]))

    def _write_targets(self) -> None:
        if self.targets_file is None:
            return
        text = json.dumps(self.targets(), indent=2) + "\n"
        if text == self._written_targets:
            return
        write_atomically(self.targets_file, text)
        self._written_targets = text

    def served(self) -> dict[tuple[str, str], int]:
        """(namespace, pod) -> port of every pod being served."""
        with self._lock:
            return {k: p.port for k, p in self._pods.items() if p.port is not None}

    def engine(self, namespace: str, name: str) -> PodEngine | None:
        with self._lock:
            pod = self._pods.get((namespace, name))
            return pod.engine if pod is not None else None

    # --- time ---------------------------------------------------------------------------

    @property
    def metrics_outage(self) -> bool:
        return self._outage

    def scenario_time(self, now: float | None = None) -> float:
        return (self.clock() if now is None else now) - self.start

    def tick(self, now: float | None = None) -> None:
        """Advance every serving pod to `now` (seconds on `clock`)."""
        now = self.clock() if now is None else now
        with self._lock:
            last = self.start if self._last_tick is None else self._last_tick
            dt = now - last
            if dt <= 0:
                return
            self._last_tick = now
            t = self.scenario_time(now)
            conditions = true_conditions(self.scenario, t)
            self._outage = conditions.metrics_outage
            ready: dict[tuple[str, str], int] = {}
            for pod in self._pods.values():
                if pod.server is not None:
                    service = (pod.info.namespace, pod.info.service)
                    ready[service] = ready.get(service, 0) + 1
            for pod in self._pods.values():
                if pod.server is None or pod.engine is None:
                    continue
                replicas = ready[(pod.info.namespace, pod.info.service)]
                pod.engine.advance(dt, conditions.workload, replicas)

    def run(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        """Tick every `interval_s` until `stop` is set."""
        while not stop.wait(interval_s):
            self.tick()

    def close(self) -> None:
        """Stop serving every pod (the targets file is emptied)."""
        with self._lock:
            for key in list(self._pods):
                self._drop(key)
            self._write_targets()
        self._listener.close()


def _bind(host: str, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A server on a free port chosen by the OS, never a reserved one."""
    while True:
        server = ThreadingHTTPServer((host, 0), handler)
        server.daemon_threads = True
        if server.server_address[1] not in RESERVED_PORTS:
            return server
        server.server_close()


def write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so Prometheus never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["PodInfo", "Simulator", "write_atomically"]
