"""Installing the operator with Helm as the README says, on the local control plane, with the
Helm built from its Go module: the release namespace created with Pod Security "restricted",
`helm install`, `helm upgrade` (to a namespaced install), `helm uninstall`; and the CRD
upgrade path: a new chart whose CRD adds a field is served with it after `helm upgrade`, and
`helm uninstall` keeps the CRD. The operator's pod only has to be admitted: the fake nodes
carry the GPU taint, so it is not expected to run.

The releases have names of their own (namespace specdecode-helm, fullnameOverride) so that they
stand beside the objects the harness and test_install.py apply. The SpecDecodeService CRD is
applied apart here as the harness applies it (`crds.install=false`, as with GitOps); the CRD
upgrade test renames its CRD's group, so that it never touches the CRD the other tests use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

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
    # The CRD as the harness (or a GitOps tool) applies it, whatever ran before this module.
    kubectl(cluster, "apply", "--server-side", "-f", str(REPO / "crds" / "specdecodeservices.yaml"))
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
    done = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--set", f"fullnameOverride={RELEASE}",
                "--set", "crds.install=false")
    assert "STATUS: deployed" in done.stdout, done.stdout
    # NOTES.txt: what was installed and how to check it.
    assert f"Deployment {NAMESPACE}/{RELEASE}" in done.stdout
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in done.stdout

    # Cluster-wide: the ClusterRole bound cluster-wide and kopf's cluster peering.
    assert get(cluster, "clusterrolebinding", RELEASE) is not None
    assert get(cluster, "clusterkopfpeering", RELEASE) is not None
    assert operator_env(cluster)["SPECDECODE_PEERING_NAME"] == RELEASE

    # The ReplicaSet's pod passes Pod Security admission ("restricted").
    def pods():
        found = get(cluster, "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name=specdecode-operator,app.kubernetes.io/instance={RELEASE}")
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
    # The CRD was not the release's (crds.install=false): the SpecDecodeServices of other installs stay.
    assert get(cluster, "crd", "specdecodeservices.serving.specdecode.io") is not None


# --------------------------------------------------------------------------- CRD upgrades

UPGRADE_RELEASE = "specdecode-crd"
UPGRADE_GROUP = "crd-upgrade.specdecode.test"
UPGRADE_CRD = f"specdecodeservices.{UPGRADE_GROUP}"
ADDED_FIELD = "upgradeProbe"


def chart_copy(directory: Path, added_field: str | None = None) -> Path:
    """The chart with its CRD moved to a test group (and, if asked, one more spec field, as a
    next version of the operator would add)."""
    chart = directory / "specdecode-operator"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / "specdecodeservices.yaml"
    crd = yaml.safe_load(crd_file.read_text().replace("serving.specdecode.io", UPGRADE_GROUP))
    if added_field:
        (version,) = crd["spec"]["versions"]
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][added_field] = {
            "type": "string", "description": "A field the next version adds."}
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def served_spec_fields(cluster: ClusterInfo) -> set[str] | None:
    crd = get(cluster, "crd", UPGRADE_CRD)
    if crd is None:
        return None
    (version,) = crd["spec"]["versions"]
    return set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_helm_upgrade_serves_the_field_a_new_crd_adds_and_uninstall_keeps_the_crd(cluster, helm, tmp_path):
    first, second = (chart_copy(tmp_path / name, field) for name, field in (("first", None), ("second", ADDED_FIELD)))
    common = ("-n", NAMESPACE, "--set", f"fullnameOverride={UPGRADE_RELEASE}")
    try:
        helm("install", UPGRADE_RELEASE, str(first), *common)
        crd = get(cluster, "crd", UPGRADE_CRD)
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert "model" in served_spec_fields(cluster) and ADDED_FIELD not in served_spec_fields(cluster)

        done = helm("upgrade", UPGRADE_RELEASE, str(second), *common)
        assert "REVISION: 2" in done.stdout, done.stdout
        assert ADDED_FIELD in served_spec_fields(cluster)

        # The API server keeps the new field in a SpecDecodeService (it prunes unknown fields).
        service = {"apiVersion": f"{UPGRADE_GROUP}/v1alpha1", "kind": "SpecDecodeService",
                   "metadata": {"name": "qwen-coder", "namespace": TENANT},
                   "spec": {"model": {"name": "Qwen/Qwen2.5-Coder-7B-Instruct"}, "speculation": {"method": "ngram"},
                            "replicas": 2, "resources": {"gpus": 1}, ADDED_FIELD: "kept"}}

        refusals: list[str] = []

        def created() -> bool:
            done = kubectl(cluster, "apply", "--server-side", "-f", "-", input=json.dumps(service), check=False)
            refusals.append(done.stderr.strip())
            return done.returncode == 0

        try:
            wait_for(created, 30, "a SpecDecodeService with the new field accepted")
        except pytest.fail.Exception:
            pytest.fail(f"the SpecDecodeService with {ADDED_FIELD} was refused: {refusals[-1]}")
        stored = get(cluster, f"specdecodeservices.{UPGRADE_GROUP}", "qwen-coder", "-n", TENANT)
        assert stored["spec"][ADDED_FIELD] == "kept"

        helm("uninstall", UPGRADE_RELEASE, "-n", NAMESPACE)
        wait_for(lambda: get(cluster, "deployment", UPGRADE_RELEASE, "-n", NAMESPACE) is None, 60,
                 "the release's Deployment deleted by helm uninstall")
        assert get(cluster, "crd", UPGRADE_CRD) is not None  # helm.sh/resource-policy: keep
        assert get(cluster, f"specdecodeservices.{UPGRADE_GROUP}", "qwen-coder", "-n", TENANT) is not None
    finally:
        helm("uninstall", UPGRADE_RELEASE, "-n", NAMESPACE, check=False)
        kubectl(cluster, "delete", "crd", UPGRADE_CRD, "--ignore-not-found", "--wait=false", check=False)
