"""Progress display for the Go builds: live on a terminal, plain timestamped lines elsewhere.

A cold build of Kubernetes takes many minutes; a silent terminal for that long looks hung,
and CI logs need occasional lines rather than a redrawn screen. Both displays implement the
same small interface, driven by `build.ensure_binaries`.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from specdecode.tools.localstack.build import ComponentBuild


class BuildReporter(Protocol):
    def cached(self, build: ComponentBuild) -> None: ...
    def begin(self, build: ComponentBuild) -> None: ...
    def status(self, build: ComponentBuild, text: str) -> None: ...
    def set_total(self, build: ComponentBuild, packages: int) -> None: ...
    def advance(self, build: ComponentBuild, package: str) -> None: ...
    def finish(self, build: ComponentBuild, seconds: float) -> None: ...
    def __enter__(self) -> BuildReporter: ...
    def __exit__(self, *exc_info) -> None: ...


def _label(build: ComponentBuild) -> str:
    return f"{build.spec.name} {build.version}"


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class SilentReporter:
    def cached(self, build): pass
    def begin(self, build): pass
    def status(self, build, text): pass
    def set_total(self, build, packages): pass
    def advance(self, build, package): pass
    def finish(self, build, seconds): pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


class PlainReporter:
    """One line per event worth keeping in a log; compile progress at most every `interval`."""

    def __init__(self, stream=None, interval: float = 30.0):
        self._stream = stream or sys.stderr
        self._interval = interval
        self._started: dict[str, float] = {}
        self._last_line: dict[str, float] = {}
        self._done: dict[str, int] = {}
        self._total: dict[str, int] = {}
        self._downloads: dict[str, int] = {}

    def _print(self, build, text: str) -> None:
        elapsed = time.monotonic() - self._started.get(build.spec.name, time.monotonic())
        print(f"[build {_label(build)} +{format_duration(elapsed)}] {text}", file=self._stream, flush=True)

    def cached(self, build):
        print(f"[build {_label(build)}] cached in {build.bin_dir}", file=self._stream, flush=True)

    def begin(self, build):
        self._started[build.spec.name] = time.monotonic()
        self._last_line[build.spec.name] = time.monotonic()
        self._print(build, f"building {', '.join(build.spec.binaries)} from {build.builder_dir}")

    def status(self, build, text):
        if text.startswith("downloading "):
            # Hundreds of modules: count them instead of logging each.
            self._downloads[build.spec.name] = self._downloads.get(build.spec.name, 0) + 1
            return
        if text == "compiling" and self._downloads.get(build.spec.name):
            self._print(build, f"downloaded {self._downloads[build.spec.name]} modules")
        self._print(build, text)

    def set_total(self, build, packages):
        self._total[build.spec.name] = packages
        self._done[build.spec.name] = 0

    def advance(self, build, package):
        name = build.spec.name
        self._done[name] = self._done.get(name, 0) + 1
        now = time.monotonic()
        if now - self._last_line.get(name, 0.0) >= self._interval:
            self._last_line[name] = now
            self._print(build, f"compiled {self._done[name]}/{self._total.get(name, '?')} packages")

    def finish(self, build, seconds):
        self._print(build, f"built in {format_duration(seconds)} -> {build.bin_dir}")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


class RichReporter:
    """A spinner, a package-count bar and the elapsed time per component."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)

        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[status]}"),
            console=Console(stderr=True),
        )
        self._tasks: dict[str, int] = {}

    def _task(self, build) -> int:
        name = build.spec.name
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(_label(build), total=None, status="")
        return self._tasks[name]

    def cached(self, build):
        task = self._task(build)
        self._progress.update(task, total=1, completed=1, status=f"cached in {build.bin_dir}")

    def begin(self, build):
        self._progress.reset(self._task(build), total=None, status="starting")

    def status(self, build, text):
        self._progress.update(self._task(build), status=text)

    def set_total(self, build, packages):
        self._progress.update(self._task(build), total=packages, completed=0)

    def advance(self, build, package):
        self._progress.update(self._task(build), advance=1, status=package)

    def finish(self, build, seconds):
        task = self._task(build)
        total = self._progress.tasks[task].total or 1
        self._progress.update(task, total=total, completed=total,
                              status=f"built in {format_duration(seconds)}")

    def __enter__(self):
        self._progress.start()
        return self

    def __exit__(self, *exc_info):
        self._progress.stop()


def make_reporter(progress: bool, stream=None) -> BuildReporter:
    """Live display on a terminal, plain lines when stderr is a file or pipe (CI)."""
    if not progress:
        return SilentReporter()
    stream = stream or sys.stderr
    if stream.isatty():
        return RichReporter()
    return PlainReporter(stream)
