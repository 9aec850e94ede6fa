"""The operator rides out an API server outage: kube-apiserver stopped for 150 s (longer than
the ~80 s after which the operator used to exit when kopf's retries ran out; shorter than the
10 minutes it is now configured to survive, to keep the suite's wall time reasonable), then
started again as kwokctl ran it. The operator process stays up, logs what it retries as
WARNING (not ERROR), and serves a service created after the outage."""

from __future__ import annotations

import socket
import time
import urllib.parse

import pytest

from specdecode.tools.localstack import LocalCluster
from specdecode.tools.localstack.cluster import ComponentLaunch

from .conftest import E2E_CLUSTER_NAME, poll_until
from .operator_harness import holds_for, kubectl
from .test_operator import apply, sample_in, wait_serving

pytestmark = pytest.mark.e2e

OUTAGE_S = 150


def _hold_port(port: int):
    """Other processes on the machine pick free ports: hold the API server's while it is down,
    bound but not listening (connections are still refused), SO_REUSEADDR as the API server
    itself binds, so its own TIME_WAIT connections do not stand in the way. Best effort."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        holder.close()
        return None
    return holder


def _apiserver_ready(cluster) -> bool:
    done = kubectl(cluster, "get", "--raw", "/readyz", "--request-timeout=3s", check=False)
    return done.returncode == 0 and done.stdout.strip() == "ok"


def test_the_operator_survives_a_150_second_api_server_outage(cluster, kube_api, operator, namespace):
    apply(cluster, sample_in(namespace, name="before"))
    wait_serving(kube_api, namespace, "before")
    local = LocalCluster(E2E_CLUSTER_NAME)
    log_before = operator.process.managed.log_path.read_text(errors="replace").count("\n")

    launches = {name: ComponentLaunch.of_process(name, pid) for name, pid in local.component_pids().items() if pid}
    launch = local.stop_component("kube-apiserver")
    placeholder = None
    try:
        placeholder = _hold_port(urllib.parse.urlparse(cluster.server).port)
        assert not _apiserver_ready(cluster)
        holds_for(operator.alive, OUTAGE_S, f"the operator exited during the outage:\n{operator.log_tail()}")
    finally:
        if placeholder is not None:
            placeholder.close()
        local.start_component(launch)
        poll_until(lambda: _apiserver_ready(cluster), 120, "kube-apiserver to be ready again", interval=1)
    # The controllers run without leader election and ride it out; should one have exited
    # anyway, it is started again as it ran: the test cluster's business, not the operator's.
    for name, pid in local.component_pids().items():
        if pid is None and name in launches:
            local.start_component(launches[name])

    started = time.monotonic()
    apply(cluster, sample_in(namespace, name="after"))
    # End to end: the controller-manager and kwok recover from the outage too (82 s measured).
    wait_serving(kube_api, namespace, "after", timeout=180)
    assert operator.alive()
    recovered_s = time.monotonic() - started

    lines = operator.process.managed.log_path.read_text(errors="replace").splitlines()[log_before:]
    errors = [line for line in lines if "ERROR" in line]
    assert errors == [], "\n".join(errors[:20])
    assert any("WARNING" in line for line in lines), "the outage left no trace in the log"
    print(f"outage {OUTAGE_S}s: operator alive; a new service Serving {recovered_s:.0f}s after the API server returned")
