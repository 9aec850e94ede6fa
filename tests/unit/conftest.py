"""Shared fixtures of the fast, pure tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ..spec_corpus import SAMPLES  # noqa: F401  (the one list of samples, for the unit tests too)

REPO = Path(__file__).resolve().parents[2]

# The Kubernetes version whose OpenAPI schemas rendered objects must satisfy: the one the
# local control plane runs.
KUBERNETES_SCHEMA_VERSION = "1.34.0"


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture
def minimal_spec() -> dict:
    """The smallest spec a user can write."""
    return {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "speculation": {"method": "ngram"}}


def service_doc(spec: dict, name: str = "svc", namespace: str = "team-a") -> dict:
    return {
        "apiVersion": "serving.specdecode.io/v1alpha1",
        "kind": "SpecDecodeService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
