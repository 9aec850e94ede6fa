"""Installing the operator with Helm as the README says, on the local control plane, with the
Helm built from its Go module: the release namespace created with Pod Security "restricted",
`helm install`, `helm upgrade` (to a namespaced install), `helm uninstall`. The operator's pod
only has to be admitted: the fake nodes carry the GPU taint, so it is not expected to run.

The release has names of its own (namespace specdecode-helm, fullnameOverride) so that it
stands beside the objects the harness and test_install.py apply; the CRDs exist already, and
Helm leaves existing CRDs alone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from specdecode.tools.localstack import ClusterInfo
from specdecode.tools.localstack.build import cached_binary

from .conftest import wait_for
from .operator_harness import kubectl

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdecode-operator"
NAMESPACE = "specdecode-helm"
RELEASE = "specdecode-helm"
TENANT = "helm-team-a"
PSA_LABELS = ("pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest")


class Helm:
    def __init__(self, cluster: ClusterInfo, home: Path):
        binary = cached_binary("helm", "helm")
        assert binary is not None, "helm is not built: run `specdecode cluster build`"
        self.command = [str(binary), "--kubeconfig", str(cluster.kubeconfig)]
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.command, *args], capture_output=True, text=True, timeout=180, env=self.env)
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done


def get(cluster: ClusterInfo, *args: str) -> dict | None:
    done = kubectl(cluster, "get", "-o", "json", *args, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def operator_env(cluster: ClusterInfo) -> dict[str, str]:
    deployment = get(cluster, "deployment", RELEASE, "-n", NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.fixture(scope="module")
def helm(cluster: ClusterInfo, tmp_path_factory) -> Iterator[Helm]:
    runner = Helm(cluster, tmp_path_factory.mktemp("helm-home"))
    kubectl(cluster, "create", "namespace", NAMESPACE)
    kubectl(cluster, "label", "namespace", NAMESPACE, *PSA_LABELS)
    kubectl(cluster, "create", "namespace", TENANT)
    try:
        yield runner
    finally:
        runner("uninstall", RELEASE, "-n", NAMESPACE, check=False)
        for namespace in (NAMESPACE, TENANT):
            kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_bad_value_fails_the_install_naming_it_and_creates_nothing(cluster, helm):
    done = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--set", f"fullnameOverride={RELEASE}",
                "--set", "logFormat=xml", check=False)
    assert done.returncode != 0
    assert "/logFormat" in done.stderr and "values don't meet the specifications of the schema" in done.stderr
    assert get(cluster, "deployment", RELEASE, "-n", NAMESPACE) is None


def test_install_upgrade_uninstall(cluster, helm):
    done = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--set", f"fullnameOverride={RELEASE}")
    assert "STATUS: deployed" in done.stdout, done.stdout

    # Cluster-wide: the ClusterRole bound cluster-wide and kopf's cluster peering.
    assert get(cluster, "clusterrolebinding", RELEASE) is not None
    assert get(cluster, "clusterkopfpeering", RELEASE) is not None
    assert operator_env(cluster)["SPECDECODE_PEERING_NAME"] == RELEASE

    # The ReplicaSet's pod passes Pod Security admission ("restricted").
    def pods():
        found = get(cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=specdecode-operator")
        return found["items"] if found else None

    (pod,) = wait_for(pods, 60, "the operator's pod (admitted under Pod Security 'restricted')")
    assert pod["spec"]["serviceAccountName"] == RELEASE
    refused = get(cluster, "events", "-n", NAMESPACE, "--field-selector", "reason=FailedCreate")
    assert not refused["items"], refused["items"]

    # Upgrade to a namespaced install: write rights move into the watched namespace.
    done = helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                "--set", f"watchNamespaces={{{TENANT}}}", "--set", "logLevel=DEBUG")
    assert "STATUS: deployed" in done.stdout and "REVISION: 2" in done.stdout, done.stdout
    env = operator_env(cluster)
    assert (env["SPECDECODE_NAMESPACES"], env["SPECDECODE_LOG_LEVEL"], env["SPECDECODE_STANDALONE"]) == (TENANT, "DEBUG", "true")
    role = get(cluster, "role", RELEASE, "-n", TENANT)
    assert any("specdecodeservices" in rule["resources"] for rule in role["rules"])
    assert get(cluster, "rolebinding", f"{RELEASE}-tenant-credentials", "-n", TENANT) is not None
    cluster_role = get(cluster, "clusterrole", RELEASE)
    assert {verb for rule in cluster_role["rules"] for verb in rule["verbs"]} <= {"get", "list", "watch"}
    wait_for(lambda: get(cluster, "clusterkopfpeering", RELEASE) is None, 30, "the cluster peering removed")
    assert "deployed" in helm("status", RELEASE, "-n", NAMESPACE).stdout

    helm("uninstall", RELEASE, "-n", NAMESPACE)
    for args in (("deployment", RELEASE, "-n", NAMESPACE), ("clusterrole", RELEASE), ("clusterrolebinding", RELEASE),
                 ("role", RELEASE, "-n", TENANT), ("service", f"{RELEASE}-metrics", "-n", NAMESPACE)):
        wait_for(lambda: get(cluster, *args) is None, 60, f"{' '.join(args)} deleted by helm uninstall")
    # Helm never deletes CRDs: the SpecDecodeServices of other installs stay.
    assert get(cluster, "crd", "specdecodeservices.serving.specdecode.io") is not None
