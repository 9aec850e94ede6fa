"""Install the operator's prerequisites into a cluster with kubectl, as a user would: the CRD,
kopf's peering, the namespace and the shipped RBAC; and a kubeconfig that authenticates as
the operator's ServiceAccount (a TokenRequest), so that what runs locally runs with exactly
the permissions `manifests/` grants, never as cluster-admin.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Sequence

import yaml

REPO = Path(__file__).resolve().parents[4]
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


def service_account_kubeconfig(kubectl_command: Sequence[str], admin_kubeconfig: Path, path: Path, *,
                               namespace: str = OPERATOR_NAMESPACE, account: str = OPERATOR_ACCOUNT,
                               duration: str = "12h", create: bool = False) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/account` with a
    TokenRequest token (`kubectl create token`), so that a process run with it has exactly
    the permissions its RBAC grants and its writes carry its own name in the audit log.

    `create` makes the namespace and the account first (the operator's come with its RBAC).
    """
    if create:
        for manifest in (
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        ):
            kubectl(kubectl_command, "apply", "--server-side", "--field-manager=specdecode-localstack", "-f", "-",
                    input=json.dumps(manifest))
    token = kubectl(kubectl_command, "create", "token", account, "-n", namespace, f"--duration={duration}").stdout.strip()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    (cluster,) = admin["clusters"]
    entry = dict(cluster["cluster"])
    authority = entry.get("certificate-authority")
    if authority and not Path(authority).is_absolute():
        entry["certificate-authority"] = str(admin_kubeconfig.parent / authority)
    user = f"{namespace}:{account}"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The token is a credential: readable by the owner only, from the first byte on.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(descriptor, "w") as handle:
        yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster["name"], "cluster": entry}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user, "namespace": namespace}}],
            "current-context": user,
        }, handle, sort_keys=False)
    return path
