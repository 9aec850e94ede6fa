"""The samples apply as they are, the way their kustomization's header says: the namespace,
the token Secret (one command), then `kubectl apply -k manifests/samples`; with the operator
running, every sample reaches phase Serving on the local control plane.

The local stack has no storage provisioner: a PersistentVolume stands in for the one a
cluster's storage class would provision for the claim `hf-model-cache`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdecode import constants as C
from specdecode.tools.localstack import ClusterInfo

from ..spec_corpus import SAMPLES
from .conftest import wait_for
from .operator_harness import kubectl, wait_namespace_usable

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SAMPLES_DIR = REPO / "manifests" / "samples"
NAMESPACE = "inference"
SAMPLE_FILES = SAMPLES  # the shipped SpecDecodeService samples


def _standin_volume(tmp_path: Path) -> str:
    claim = yaml.safe_load((SAMPLES_DIR / "prerequisites" / "model-cache-pvc.yaml").read_text())
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "e2e-hf-model-cache"},
        "spec": {"capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                 "accessModes": claim["spec"]["accessModes"],
                 "persistentVolumeReclaimPolicy": "Delete",
                 "hostPath": {"path": str(tmp_path / "model-cache")}},
    })


@pytest.fixture(scope="module")
def applied(cluster: ClusterInfo, operator, tmp_path_factory) -> dict:
    """Applies the samples as a user would; returns what `kubectl apply -k` printed."""
    tmp_path = tmp_path_factory.mktemp("samples")
    kubectl(cluster, "apply", "-f", "-", input=_standin_volume(tmp_path))
    wait_namespace_usable(cluster, NAMESPACE)
    kubectl(cluster, "apply", "-f", str(SAMPLES_DIR / "prerequisites" / "namespace.yaml"))
    token = tmp_path / "token"
    token.write_text("hf_e2e_not_a_real_token")
    kubectl(cluster, "-n", NAMESPACE, "create", "secret", "generic", "hf-token", f"--from-file=token={token}")
    done = kubectl(cluster, "apply", "--server-side", "-k", str(SAMPLES_DIR), check=False)
    try:
        yield {"stdout": done.stdout, "stderr": done.stderr, "returncode": done.returncode}
    finally:
        kubectl(cluster, "delete", "namespace", NAMESPACE, "--wait=false", check=False)
        kubectl(cluster, "delete", "pv", "e2e-hf-model-cache", "--wait=false", check=False)


def _name(path: Path) -> str:
    return yaml.safe_load(path.read_text())["metadata"]["name"]


@pytest.mark.parametrize("sample", SAMPLE_FILES, ids=lambda p: p.stem)
def test_every_sample_applies_and_reaches_serving(cluster: ClusterInfo, applied, sample):
    name = _name(sample)
    assert f"specdecodeservice.serving.specdecode.io/{name} serverside-applied" in applied["stdout"], applied

    claim = json.loads(kubectl(cluster, "get", "pvc", "hf-model-cache", "-n", NAMESPACE, "-o", "json").stdout)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]

    def serving():
        sds = json.loads(kubectl(cluster, "get", "sds", name, "-n", NAMESPACE, "-o", "json").stdout)
        return sds if (sds.get("status") or {}).get("phase") == C.PHASE_SERVING else None

    sds = wait_for(serving, 120, f"SpecDecodeService {NAMESPACE}/{name} in phase Serving")
    conditions = {c["type"]: c for c in sds["status"]["conditions"]}
    # The samples keep their weights on the claim: no warning about an ephemeral cache.
    assert conditions[C.COND_MODEL_CACHE_EPHEMERAL]["status"] == "False", conditions[C.COND_MODEL_CACHE_EPHEMERAL]
    deployment = json.loads(kubectl(cluster, "get", "deployment", name, "-n", NAMESPACE, "-o", "json").stdout)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-model-cache"}
