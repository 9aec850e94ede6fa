"""Install the operator's prerequisites into a cluster with kubectl, as a user would: the CRD,
kopf's peering, the namespace and the shipped RBAC; and a kubeconfig that authenticates as
the operator's ServiceAccount (a TokenRequest), so that what runs locally runs with exactly
the permissions `manifests/` grants, never as cluster-admin.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Sequence

import yaml

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "crds"
RBAC_FILE = REPO / "manifests" / "base" / "rbac.yaml"
PEERING_FILE = REPO / "manifests" / "base" / "kopf-peering.yaml"
OPERATOR_NAMESPACE = "specdecode-system"
OPERATOR_ACCOUNT = "specdecode-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"


class InstallError(RuntimeError):
    """A kubectl step failed; the message has its stderr."""


def kubectl(kubectl_command: Sequence[str], *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run kubectl (`kubectl_command` is the binary plus its --kubeconfig)."""
    done = subprocess.run([*kubectl_command, *args], input=input, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise InstallError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def wait_established(kubectl_command: Sequence[str], *crd_names: str, timeout: float = 60) -> None:
    """Poll until each CRD is Established (`kubectl wait` errors out while a brand-new CRD has
    no conditions yet: kubernetes/kubernetes#66439)."""
    for name in crd_names:
        deadline = time.monotonic() + timeout
        query = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        while kubectl(kubectl_command, "get", "crd", name, "-o", query, check=False).stdout != "True":
            if time.monotonic() > deadline:
                raise InstallError(f"CRD {name} was not Established within {timeout:.0f}s")
            time.sleep(0.3)


def install_prerequisites(kubectl_command: Sequence[str]) -> None:
    """CRD, peering CRD and object, operator namespace, RBAC. Idempotent (server-side apply)."""
    kubectl(kubectl_command, "apply", "--server-side", "-f", str(CRD_DIR))
    wait_established(kubectl_command, "specdecodeservices.serving.specdecode.io")
    # kopf's peering: its CRD must be Established before the ClusterKopfPeering object exists.
    peering = list(yaml.safe_load_all(PEERING_FILE.read_text()))
    crds = [d for d in peering if d["kind"] == "CustomResourceDefinition"]
    kubectl(kubectl_command, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    wait_established(kubectl_command, *(d["metadata"]["name"] for d in crds))
    kubectl(kubectl_command, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([d for d in peering if d not in crds]))
    if kubectl(kubectl_command, "get", "namespace", OPERATOR_NAMESPACE, check=False).returncode != 0:
        kubectl(kubectl_command, "create", "namespace", OPERATOR_NAMESPACE)
    kubectl(kubectl_command, "apply", "--server-side", "-f", str(RBAC_FILE))


def service_account_kubeconfig(kubectl_command: Sequence[str], admin_kubeconfig: Path, path: Path,
                               duration: str = "12h") -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount."""
    token = kubectl(kubectl_command, "create", "token", OPERATOR_ACCOUNT, "-n", OPERATOR_NAMESPACE,
                    f"--duration={duration}").stdout.strip()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster_entry = dict(admin["clusters"][0]["cluster"])
    authority = cluster_entry.get("certificate-authority")
    if authority and not Path(authority).is_absolute():
        cluster_entry["certificate-authority"] = str(admin_kubeconfig.parent / authority)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster_entry}],
        "users": [{"name": OPERATOR_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": OPERATOR_ACCOUNT}}],
        "current-context": "operator",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
