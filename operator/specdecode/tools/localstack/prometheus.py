"""A real Prometheus server (Debian package `prometheus`) for tests and the demo.

It runs on 127.0.0.1 on a free port (never 9090, where Debian's package may run a system
server), with its own config and data directory, scraping the simulator's file_sd targets
file every second or two: the same labels a PodMonitor would give (namespace, pod,
specdecode_service, specdecode_config_hash). `render_config` is pure; `start_prometheus`
starts the process and waits for `/-/ready`; `PrometheusServer.stop` terminates it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

DEFAULT_BINARY = "/usr/bin/prometheus"

# How this Prometheus stores vLLM's series. The simulator negotiates the format as vLLM does,
# so Debian's Prometheus 2.42 (which asks for OpenMetrics and has no `scrape_protocols`)
# stores them as `vllm_...`, as it would real vLLM's. `VLLM_NAMES_COLON` renames them back
# with a metric relabelling, which is what Prometheus 3, a `scrape_protocols` of
# `[PrometheusText0.0.4]` (>= 2.49) or that same relabelling leaves in a real one.
VLLM_NAMES_AS_SCRAPED = "as-scraped"
VLLM_NAMES_COLON = "vllm:"
VLLM_NAMES = (VLLM_NAMES_AS_SCRAPED, VLLM_NAMES_COLON)
RESERVED_PORTS = frozenset({9090})
JOB_NAME = "vllm"


class PrometheusError(RuntimeError):
    """Prometheus could not be started or did not become ready."""


def find_binary(binary: str | None = None) -> str:
    """The prometheus binary: the given path, /usr/bin/prometheus, or one on PATH."""
    for candidate in (binary, DEFAULT_BINARY, shutil.which("prometheus")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise PrometheusError(
        "prometheus is not installed: install the Debian package (apt-get install prometheus)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free, never a reserved one."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def render_config(
    targets_file: Path,
    scrape_interval_s: float = 1.0,
    evaluation_interval_s: float | None = None,
    vllm_names: str = VLLM_NAMES_AS_SCRAPED,
) -> str:
    """prometheus.yml scraping the file_sd targets (labels come from the file)."""
    if vllm_names not in VLLM_NAMES:
        raise ValueError(f"vllm_names must be one of {', '.join(VLLM_NAMES)}, got {vllm_names!r}")
    interval = _duration(scrape_interval_s)
    evaluation = _duration(evaluation_interval_s or scrape_interval_s)
    relabel = (
        "    metric_relabel_configs:\n"
        "      - source_labels: [__name__]\n"
        "        regex: 'vllm_(.+)'\n"
        "        target_label: __name__\n"
        "        replacement: 'vllm:$1'\n"
        if vllm_names == VLLM_NAMES_COLON
        else ""
    )
    # A scrape must finish within the interval; vLLM answers /metrics in milliseconds.
    return (
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  scrape_timeout: {interval}\n"
        f"  evaluation_interval: {evaluation}\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB_NAME}\n"
        "    metrics_path: /metrics\n"
        "    file_sd_configs:\n"
        f"      - files: [{str(targets_file)!r}]\n"
        # fsnotify picks changes up at once; the refresh is the fallback.
        "        refresh_interval: 5s\n"
        + relabel
    )


def _duration(seconds: float) -> str:
    millis = int(round(seconds * 1000))
    if millis <= 0:
        raise ValueError(f"an interval must be > 0 s, got {seconds}")
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


@dataclass
class PrometheusServer:
    """A running Prometheus; `stop()` ends it (idempotent)."""

    url: str
    port: int
    process: subprocess.Popen
    work_dir: Path
    config_file: Path
    log_file: Path
    _log: IO[str] | None = field(default=None, repr=False)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def is_ready(self) -> bool:
        return _ready(self.url)

    def reload(self) -> None:
        """Ask Prometheus to reread its config (needs --web.enable-lifecycle, which we set)."""
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_prometheus(
    work_dir: Path | str,
    targets_file: Path | str,
    *,
    scrape_interval_s: float = 1.0,
    port: int | None = None,
    binary: str | None = None,
    ready_timeout_s: float = 60.0,
    retention: str = "1d",
    vllm_names: str = VLLM_NAMES_AS_SCRAPED,
) -> PrometheusServer:
    """Start Prometheus scraping `targets_file`; return once `/-/ready` answers 200.

    `work_dir` holds prometheus.yml, the TSDB (data/) and prometheus.log. The targets file
    need not exist yet: Prometheus watches it. `vllm_names`: `VLLM_NAMES`.
    """
    exe = find_binary(binary)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    targets = Path(targets_file).resolve()
    config = work / "prometheus.yml"
    config.write_text(render_config(targets, scrape_interval_s, vllm_names=vllm_names), encoding="utf-8")
    port = port if port is not None else free_port()
    if port in RESERVED_PORTS:
        raise PrometheusError(f"port {port} is reserved for a system Prometheus; pick another")
    log_path = work / "prometheus.log"
    log = open(log_path, "a", encoding="utf-8")
    process = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    server = PrometheusServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        process=process,
        work_dir=work,
        config_file=config,
        log_file=log_path,
        _log=log,
    )
    deadline = time.monotonic() + ready_timeout_s
    while not _ready(server.url):
        if process.poll() is not None:
            server.stop()
            raise PrometheusError(
                f"prometheus exited with {process.returncode}: {_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            server.stop()
            raise PrometheusError(
                f"prometheus not ready after {ready_timeout_s:g}s: {_tail(log_path)}"
            )
        time.sleep(0.1)
    return server


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
