"""What the stack itself did while a fleet came up (`bench fleet`): the apiserver's own account
of its ClusterIP allocations and etcd writes, and every process's CPU.

A ClusterIP Service's address is allocated one at a time, under one lock in the apiserver
(`MetaAllocator.AllocateNextService`), so N new services take at least N allocations end to
end; the apiserver's histogram of them says how long each took and how much of a span the
lock was held. How slow every etcd write was, as the apiserver saw it, says whether the
allocations were slow alone or with everything else. Both are read from the apiserver's
`/metrics` at the start and the end of a span, as differences.

The parsers are pure (text in, numbers out); `sample` only fetches the text and /proc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

ALLOCATION_HISTOGRAM = "kube_apiserver_clusterip_allocator_allocation_duration_seconds"
ETCD_HISTOGRAM = "etcd_request_duration_seconds"
# The apiserver's etcd3 store labels its writes so; a read is get or list.
ETCD_WRITE_OPERATIONS = frozenset({"create", "update", "delete"})


@dataclass(frozen=True)
class StackSample:
    """One reading: when, the apiserver's metrics (parsed afterwards: a sample is taken at the
    moment the fleet is applied, and parsing 2 MB of text then would take CPU from the stack
    being measured), CPU seconds by process."""

    t: float
    metrics: str
    cpu_s: dict[str, float]


@dataclass(frozen=True)
class StackLoad:
    """A span's difference of two samples."""

    span_s: float
    allocations: int
    allocation_mean_ms: Optional[float]
    allocation_busy: float
    """The part of the span the allocation lock was held (the allocations' summed time)."""
    etcd_writes: int
    etcd_write_mean_ms: Optional[float]
    cpu_s: dict[str, float]
    cpu_busy: float
    """The part of every core's time the stack's processes used."""

    def describe(self) -> list[tuple[str, str]]:
        """Report rows, indented under a heading the caller gives."""
        allocations = ("not reported (an apiserver without the allocator's histogram)"
                       if self.allocation_mean_ms is None else
                       f"{self.allocations}, {self.allocation_mean_ms:.0f} ms mean: the lock held "
                       f"{self.allocation_busy:.0%} of the {self.span_s:.0f} s")
        etcd = ("none" if self.etcd_write_mean_ms is None else
                f"{self.etcd_writes} ({self.etcd_writes / self.span_s:.0f} a second), "
                f"{self.etcd_write_mean_ms:.0f} ms mean as the apiserver saw them")
        top = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in
                        sorted(self.cpu_s.items(), key=lambda item: -item[1]) if seconds >= 0.5)
        return [
            ("  ClusterIP allocations (one at a time)", allocations),
            ("  etcd writes", etcd),
            ("  CPU", f"{self.cpu_busy:.0%} of the cores: {top}"),
        ]


def histogram_totals(text: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """(sum, count) of the ClusterIP allocations and of the etcd writes, from the apiserver's
    metrics in Prometheus' text format."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = (ALLOCATION_HISTOGRAM, ETCD_HISTOGRAM)
    # Only the two histograms' lines: the rest is thousands of series this does not read.
    lines = [line for line in text.splitlines()
             if line.startswith(wanted) or (line.startswith("#") and any(name in line for name in wanted))]
    allocations = [0.0, 0.0]
    writes = [0.0, 0.0]
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if family.name == ETCD_HISTOGRAM and sample.labels.get("operation") not in ETCD_WRITE_OPERATIONS:
                continue
            totals = allocations if family.name == ALLOCATION_HISTOGRAM else writes
            if sample.name.endswith("_sum"):
                totals[0] += sample.value
            elif sample.name.endswith("_count"):
                totals[1] += sample.value
    return (allocations[0], allocations[1]), (writes[0], writes[1])


def process_name(cmdline: list[str]) -> str:
    """A short name for a process of the stack: the local stack's Python parts by their
    subcommand, everything else by its executable."""
    if "specdecode" in cmdline and "-m" in cmdline:
        after = cmdline[cmdline.index("specdecode") + 1:]
        return {"run": "operator", "sim": "simulator"}.get(after[0] if after else "", "specdecode")
    return Path(cmdline[0]).name if cmdline else "?"


def load_between(before: StackSample, after: StackSample, cores: int) -> StackLoad:
    span = max(after.t - before.t, 1e-9)
    (alloc_sum0, alloc_count0), (write_sum0, write_count0) = histogram_totals(before.metrics)
    (alloc_sum1, alloc_count1), (write_sum1, write_count1) = histogram_totals(after.metrics)
    allocated_s = alloc_sum1 - alloc_sum0
    allocations = int(round(alloc_count1 - alloc_count0))
    written_s = write_sum1 - write_sum0
    writes = int(round(write_count1 - write_count0))
    cpu = {name: seconds - before.cpu_s.get(name, 0.0) for name, seconds in after.cpu_s.items()}
    return StackLoad(
        span_s=span,
        allocations=allocations,
        allocation_mean_ms=1000.0 * allocated_s / allocations if allocations else None,
        allocation_busy=allocated_s / span,
        etcd_writes=writes,
        etcd_write_mean_ms=1000.0 * written_s / writes if writes else None,
        cpu_s=cpu,
        cpu_busy=sum(cpu.values()) / (span * cores),
    )


# ------------------------------------------------------------------------------ the readers


def apiserver_metrics(api_client) -> str:
    """The apiserver's /metrics (the bench's admin credentials may read it)."""
    method, url, headers, body, post_params = api_client.param_serialize(
        "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    response = api_client.call_api(method, url, header_params=headers, body=body, post_params=post_params,
                                   _request_timeout=30)
    response.read()
    return response.data.decode()


def stack_cpu(markers: Iterable[str], proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU seconds (user + system) by `process_name`, of the processes whose command line names
    one of `markers` (the cluster's state directory, the bench's work directory)."""
    from .live import parse_proc

    ticks = os.sysconf("SC_CLK_TCK")
    markers = [m for m in markers if m]
    totals: dict[str, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            args = [part.decode(errors="replace") for part in cmdline if part]
            joined = " ".join(args)
            if not any(marker in joined for marker in markers):
                continue
            seconds = parse_proc("", (entry / "stat").read_text(), ticks).cpu_s
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or a kernel thread
        name = process_name(args)
        totals[name] = totals.get(name, 0.0) + seconds
    return totals


def sample(api_client, markers: Iterable[str], clock) -> StackSample:
    return StackSample(t=clock(), metrics=apiserver_metrics(api_client), cpu_s=stack_cpu(markers))
