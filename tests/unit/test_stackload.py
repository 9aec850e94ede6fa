"""What `bench fleet` reports of the stack itself: the apiserver's ClusterIP allocations and
etcd writes between two readings of its /metrics, and the CPU of the stack's processes."""

from __future__ import annotations

import os

from specdecode.tools.bench import fleet, stackload


def _apiserver_metrics(allocated_s: float, allocations: int, etcd: dict[str, tuple[float, int]]) -> str:
    """The apiserver's /metrics as far as the two histograms go, in its own spelling."""
    lines = [
        f"# HELP {stackload.ALLOCATION_HISTOGRAM} [ALPHA] ClusterIP allocation latency",
        f"# TYPE {stackload.ALLOCATION_HISTOGRAM} histogram",
        f'{stackload.ALLOCATION_HISTOGRAM}_bucket{{cidr="10.96.0.0/16",le="0.1"}} {allocations}',
        f'{stackload.ALLOCATION_HISTOGRAM}_bucket{{cidr="10.96.0.0/16",le="+Inf"}} {allocations}',
        f'{stackload.ALLOCATION_HISTOGRAM}_sum{{cidr="10.96.0.0/16"}} {allocated_s}',
        f'{stackload.ALLOCATION_HISTOGRAM}_count{{cidr="10.96.0.0/16"}} {allocations}',
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        'apiserver_request_total{code="201",resource="services",verb="APPLY"} 500',
        f"# HELP {stackload.ETCD_HISTOGRAM} [ALPHA] Etcd request latency in seconds",
        f"# TYPE {stackload.ETCD_HISTOGRAM} histogram",
    ]
    for key, (seconds, count) in etcd.items():
        operation, resource = key.split("/")
        labels = f'group="",operation="{operation}",resource="{resource}"'
        lines += [f'{stackload.ETCD_HISTOGRAM}_bucket{{{labels},le="+Inf"}} {count}',
                  f"{stackload.ETCD_HISTOGRAM}_sum{{{labels}}} {seconds}",
                  f"{stackload.ETCD_HISTOGRAM}_count{{{labels}}} {count}"]
    return "\n".join(lines) + "\n"


def test_a_spans_allocations_etcd_writes_and_cpu_are_the_differences_of_its_two_readings():
    before = stackload.StackSample(
        t=100.0, metrics=_apiserver_metrics(1.0, 20, {"create/services": (0.2, 20), "get/pods": (9.0, 900)}),
        cpu_s={"kube-apiserver": 30.0, "etcd": 5.0})
    after = stackload.StackSample(
        t=150.0,
        metrics=_apiserver_metrics(31.0, 320, {"create/services": (6.2, 320), "update/pods": (4.0, 80),
                                               "get/pods": (99.0, 9000)}),
        cpu_s={"kube-apiserver": 70.0, "etcd": 9.0, "operator": 16.0})
    load = stackload.load_between(before, after, cores=2)
    assert load.allocations == 300 and load.allocation_mean_ms == 100.0 and load.allocation_busy == 0.6
    # writes only: the reads (get, list) are not what an allocation waits behind
    assert load.etcd_writes == 380 and round(load.etcd_write_mean_ms, 1) == round(1000 * 10.0 / 380, 1)
    # a process that started within the span counts whole
    assert load.cpu_s == {"kube-apiserver": 40.0, "etcd": 4.0, "operator": 16.0}
    assert load.cpu_busy == 0.6
    rows = dict(load.describe())
    assert rows["  ClusterIP allocations (one at a time)"] == "300, 100 ms mean: the lock held 60% of the 50 s"
    assert rows["  etcd writes"].startswith("380 (8 a second), 26 ms mean")
    assert rows["  CPU"] == "60% of the cores: kube-apiserver 40 s, operator 16 s, etcd 4 s"


def test_an_apiserver_that_does_not_report_allocations_is_said_so_not_taken_for_zero():
    empty = "# HELP apiserver_request_total x\n# TYPE apiserver_request_total counter\n"
    load = stackload.load_between(stackload.StackSample(0.0, empty, {}), stackload.StackSample(10.0, empty, {}), 2)
    assert load.allocation_mean_ms is None and load.etcd_write_mean_ms is None
    assert "not reported" in dict(load.describe())["  ClusterIP allocations (one at a time)"]


def test_the_stacks_processes_are_found_by_their_command_lines_and_named_by_role(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")

    def process(pid: int, argv: list[str], cpu_ticks: int) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        fields = ["S"] + ["0"] * 10 + [str(cpu_ticks), str(cpu_ticks)] + ["0"] * 30
        (entry / "stat").write_text(f"{pid} (x y) " + " ".join(fields))

    state, work = "/state/cluster/fleet500", "/tmp/specdecode-bench-fleet-abc"
    process(10, [f"{state}/bin/kube-apiserver", "--etcd-prefix=/registry", f"--audit-log-path={state}/audit.log"],
            3 * ticks)
    process(11, [f"{state}/bin/etcd", f"--data-dir={state}/etcd"], ticks)
    process(12, ["/venv/bin/python", "-m", "specdecode", "run", "--kubeconfig", f"{work}/operator.kubeconfig"],
            2 * ticks)
    process(13, ["/venv/bin/python", "-m", "specdecode", "sim", "--scenario", f"{work}/fleet-steady.yaml"], ticks)
    process(14, ["/usr/bin/prometheus", f"--config.file={work}/fleet/prometheus/prometheus.yml"], ticks)
    process(15, ["/usr/bin/sshd", "-D"], 50 * ticks)  # not the stack's
    (tmp_path / "self").mkdir()
    cpu = stackload.stack_cpu([state, work], proc=tmp_path)
    assert cpu == {"kube-apiserver": 6.0, "etcd": 2.0, "operator": 4.0, "simulator": 2.0, "prometheus": 2.0}


def test_the_fleet_report_shows_the_stacks_load_beside_the_floor_and_the_ramp():
    load = stackload.StackLoad(span_s=74.0, allocations=500, allocation_mean_ms=112.0, allocation_busy=0.75,
                               etcd_writes=14189, etcd_write_mean_ms=55.0, cpu_s={"kube-apiserver": 56.0},
                               cpu_busy=0.99)
    figures = fleet.FleetFigures(
        services=500, serving_s=74.0, serving=500, steady_s=30.0, rss_mb=220.0, peak_rss_mb=240.0,
        cpu_s_per_min=15.0, prometheus_queries_per_tick=21.0, prometheus_queries_per_min=250.0,
        reads_per_tick=0.5, queries_per_read=42.0, evaluations_per_min=995.0, decisions_per_min=0.0,
        writes_per_min=0.0, ramp_load=load)
    rows = dict(figures.rows())
    assert "the stack, while the operator's fleet came up" in rows
    assert "the stack alone, while it came up" not in rows  # the floor was not measured
    assert rows["  ClusterIP allocations (one at a time)"] == "500, 112 ms mean: the lock held 75% of the 74 s"
    assert figures.to_json()["ramp_load"]["allocation_mean_ms"] == 112.0
