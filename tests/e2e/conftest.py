"""Fixtures for end-to-end tests against a real local control plane (see specdecode.tools.localstack).

The `cluster` fixture starts one cluster per test session and removes it at the end. Build
the binaries beforehand (`specdecode cluster build`, a cold build takes many minutes) so the
first e2e test does not spend its timeout compiling Kubernetes.

Set SPECDECODE_E2E_KEEP_CLUSTER=1 to leave the cluster running after the session for a look
(`specdecode cluster status --name e2e`); the next session replaces it. Sessions that run at
the same time need different SPECDECODE_E2E_CLUSTER names, or they replace each other's.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable, Iterator, TypeVar

import pytest

from specdecode.tools.localstack import ClusterInfo, LocalCluster

# Another name lets two sessions (two engineers, or CI beside a demo) run side by side.
E2E_CLUSTER_NAME = os.environ.get("SPECDECODE_E2E_CLUSTER", "e2e")
# Short enough for fast tests, long enough that "Ready only after the delay" is measurable.
E2E_READY_DELAY = "2s"

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last result: {last!r})")


# The same helper under the name some test modules import.
poll_until = wait_for


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterInfo]:
    local = LocalCluster(E2E_CLUSTER_NAME)
    # A fresh cluster per session: earlier sessions' objects and audit entries would blur
    # what the tests count.
    info = local.up(nodes=4, gpus_per_node=8, ready_delay=E2E_READY_DELAY, recreate=True)
    try:
        yield info
    finally:
        if os.environ.get("SPECDECODE_E2E_KEEP_CLUSTER") != "1":
            local.down()


@pytest.fixture(scope="session")
def kube_api(cluster: ClusterInfo):
    """A kubernetes.client.ApiClient with admin rights on the session's cluster."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube_api) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards (without waiting for it to go)."""
    from kubernetes import client

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods are refused until the ServiceAccount controller made the namespace's `default`.
    wait_for(lambda: any(sa.metadata.name == "default"
                         for sa in core.list_namespaced_service_account(name).items),
             30, f"the default ServiceAccount in {name}")
    try:
        yield name
    finally:
        core.delete_namespace(name)


# The operator, once per session for every module (see operator_harness). Imported here, not
# in the test modules: each module importing it would get an operator of its own.
from .operator_harness import operator  # noqa: E402,F401
