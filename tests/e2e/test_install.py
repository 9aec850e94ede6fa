"""Installing the operator as the README says, on the local control plane: the CRDs first,
then an overlay, with `kubectl apply --server-side -k`. The Prometheus Operator's CRDs come
from the pinned copy in manifests/third_party. The operator's pod only has to be admitted
(the namespace enforces Pod Security "restricted"): the fake nodes carry the GPU taint, so it
is not expected to run here.

The module removes what only it installed (the operator Deployment, Service and
NetworkPolicy, the monitoring objects and the Prometheus Operator CRDs) so that later tests in the session see
the cluster as the harness sets it up; the CRDs, namespace, RBAC and peering it leaves are
the ones the harness installs too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from specdecode.tools.localstack import ClusterInfo

from .conftest import wait_for
from .operator_harness import kubectl

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
NAMESPACE = "specdecode-system"
OUR_CRDS = ("specdecodeservices.serving.specdecode.io", "clusterkopfpeerings.kopf.dev")
PROMETHEUS_OPERATOR_CRDS = ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
                            "prometheusrules.monitoring.coreos.com")


def apply(cluster: ClusterInfo, directory: str) -> str:
    return kubectl(cluster, "apply", "--server-side", "-k", str(MANIFESTS / directory)).stdout


def wait_established(cluster: ClusterInfo, names) -> None:
    """Polls instead of `kubectl wait`, which fails outright (".status.conditions accessor
    error", kubernetes/kubernetes#66439) when asked in the instant before a new CRD has
    conditions; a jsonpath query fails the same way then, so errors count as "not yet"."""
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    for name in names:
        wait_for(lambda: kubectl(cluster, "get", f"crd/{name}", "-o", f"jsonpath={jsonpath}", check=False).stdout == "True",
                 60, f"CRD {name} Established")


def no_drift(cluster: ClusterInfo, directory: str) -> None:
    """`kubectl diff --server-side` finds nothing to change right after the apply: the
    manifests are stable under the apiserver's defaulting (no fight with GitOps tools)."""
    done = kubectl(cluster, "diff", "--server-side", "-k", str(MANIFESTS / directory), check=False)
    assert done.returncode == 0, f"kubectl diff -k manifests/{directory} (exit {done.returncode}):\n{done.stdout}{done.stderr}"


def get(cluster: ClusterInfo, *args: str) -> dict:
    return json.loads(kubectl(cluster, "get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def installed(cluster: ClusterInfo) -> Iterator[ClusterInfo]:
    try:
        yield cluster
    finally:
        for kind, name in (("deployment", "specdecode-operator"), ("service", "specdecode-operator-metrics"),
                           ("networkpolicy", "specdecode-operator"), ("configmap", "specdecode-dashboard")):
            kubectl(cluster, "delete", kind, name, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        kubectl(cluster, "delete", "--ignore-not-found", "--timeout=60s",
                *(f"crd/{name}" for name in PROMETHEUS_OPERATOR_CRDS), check=False)


def test_default_overlay_installs_after_its_crds(installed):
    cluster = installed
    apply(cluster, "crds")
    wait_established(cluster, OUR_CRDS)
    output = apply(cluster, "overlays/default")
    assert "deployment.apps/specdecode-operator serverside-applied" in output, output

    namespace = get(cluster, "namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    get(cluster, "clusterkopfpeering", "specdecode-operator")
    get(cluster, "clusterrolebinding", "specdecode-operator")
    deployment = get(cluster, "deployment", "specdecode-operator", "-n", NAMESPACE)
    assert deployment["spec"]["strategy"]["type"] == "Recreate" and deployment["spec"]["replicas"] == 1
    service = get(cluster, "service", "specdecode-operator-metrics", "-n", NAMESPACE)
    assert service["spec"]["ports"][0]["name"] == "metrics"

    # The ReplicaSet's pod passes Pod Security admission ("restricted") and uses the account.
    def operator_pods():
        pods = get(cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=specdecode-operator")["items"]
        return pods

    pods = wait_for(operator_pods, 60, "the operator's pod (admitted under Pod Security 'restricted')")
    assert pods[0]["spec"]["serviceAccountName"] == "specdecode-operator"
    events = kubectl(cluster, "get", "events", "-n", NAMESPACE, "--field-selector", "reason=FailedCreate",
                     "-o", "json").stdout
    assert not json.loads(events)["items"], events

    no_drift(cluster, "overlays/default")


def test_prometheus_operator_overlay_installs_with_the_pinned_crds(installed):
    cluster = installed
    apply(cluster, "third_party/prometheus-operator")
    wait_established(cluster, PROMETHEUS_OPERATOR_CRDS)
    apply(cluster, "crds")
    wait_established(cluster, OUR_CRDS)
    output = apply(cluster, "overlays/prometheus-operator")
    for created in ("servicemonitor.monitoring.coreos.com/specdecode-operator",
                    "prometheusrule.monitoring.coreos.com/specdecode-operator",
                    "configmap/specdecode-dashboard"):
        assert f"{created} serverside-applied" in output, output

    monitor = get(cluster, "servicemonitor", "specdecode-operator", "-n", NAMESPACE)
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    rule = get(cluster, "prometheusrule", "specdecode-operator", "-n", NAMESPACE)
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "SpecDecodeOperatorDown" in alerts
    dashboard = get(cluster, "configmap", "specdecode-dashboard", "-n", NAMESPACE)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["specdecode.json"])["uid"] == "specdecode-overview"

    no_drift(cluster, "overlays/prometheus-operator")


def test_namespaced_overlay_installs_as_the_readme_says(installed):
    """The namespaced install: kopf's namespaced peering CRD first, then the overlay, which
    binds the operator in its watched namespace (team-a, which must exist) and nowhere else."""
    cluster = installed
    if kubectl(cluster, "get", "namespace", "team-a", check=False).returncode != 0:
        kubectl(cluster, "create", "namespace", "team-a")
    apply(cluster, "crds")
    wait_established(cluster, OUR_CRDS)
    kubectl(cluster, "apply", "--server-side", "-f", str(MANIFESTS / "overlays" / "namespaced" / "kopf-peering.yaml"))
    wait_established(cluster, ["kopfpeerings.kopf.dev"])
    try:
        output = apply(cluster, "overlays/namespaced")
        assert "rolebinding.rbac.authorization.k8s.io/specdecode-operator serverside-applied" in output, output
        get(cluster, "kopfpeering", "specdecode-operator", "-n", "team-a")
        binding = get(cluster, "rolebinding", "specdecode-operator", "-n", "team-a")
        assert binding["roleRef"]["name"] == "specdecode-operator-namespaced"
        deployment = get(cluster, "deployment", "specdecode-operator", "-n", NAMESPACE)
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["SPECDECODE_NAMESPACES"] == "team-a"
        no_drift(cluster, "overlays/namespaced")
    finally:
        # The session's operator runs cluster-wide under the base RBAC: take back what only
        # this overlay added.
        for args in (("rolebinding", "specdecode-operator", "-n", "team-a"),
                     ("clusterrolebinding", "specdecode-operator-discovery"),
                     ("clusterrole", "specdecode-operator-discovery"),
                     ("clusterrole", "specdecode-operator-namespaced")):
            kubectl(cluster, "delete", "--ignore-not-found", *args, check=False)


def test_the_crds_kustomization_matches_the_overlays(installed):
    """What `manifests/crds` installs is what the overlays carry: applying an overlay after it
    changes no CRD."""
    cluster = installed
    built = kubectl(cluster, "kustomize", str(MANIFESTS / "crds")).stdout
    names = sorted(d["metadata"]["name"] for d in yaml.safe_load_all(built) if d)
    assert names == sorted(OUR_CRDS)
    no_drift(cluster, "crds")
