"""The generated CRD: identical to the committed file, structural, documented, bounded."""

from __future__ import annotations

import kubernetes_validate
import yaml

from specdecode import constants as C
from specdecode.crd import crd_yaml, custom_resource_definition

from .conftest import KUBERNETES_SCHEMA_VERSION, REPO

CRD_FILE = REPO / "crds" / "specdecodeservices.yaml"


def test_committed_crd_matches_the_generator():
    assert CRD_FILE.read_text() == crd_yaml(), (
        "crds/specdecodeservices.yaml drifted from the API models: run "
        "`specdecode crd > crds/specdecodeservices.yaml`"
    )


def _schema():
    return custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, child in node.get("properties", {}).items():
            yield from _walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    forbidden = {"$ref", "anyOf", "allOf", "oneOf", "prefixItems", "const", "title", "$defs"}
    for path, node in _walk(_schema()):
        assert not forbidden & set(node), (path, forbidden & set(node))
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), path


def test_every_field_is_documented_for_kubectl_explain():
    undocumented = [
        path
        for path, node in _walk(_schema()["properties"]["spec"])
        if not path.endswith("[]") and not path.endswith("{}") and not node.get("description")
    ]
    assert undocumented == []
    status = [p for p, n in _walk(_schema()["properties"]["status"]) if not p.endswith(("[]", "{}")) and not n.get("description")]
    assert status == []


def test_lists_and_strings_are_bounded_so_cel_stays_cheap():
    for path, node in _walk(_schema()["properties"]["spec"]):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path


def test_cross_field_rules_are_cel_validations():
    spec = _schema()["properties"]["spec"]
    speculation_rules = spec["properties"]["speculation"]["x-kubernetes-validations"]
    messages = " ".join(r["message"] for r in speculation_rules)
    assert "within [minK, maxK]" in messages
    assert "draftModel is required" in messages
    assert "must not overlap" in messages
    assert any("draftTensorParallelSize" in r["rule"] for r in spec["x-kubernetes-validations"])


def test_names_subresources_and_columns():
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == C.CRD_NAME
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["sds"] and names["kind"] == "SpecDecodeService"
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ["Phase", "Method", "K", "Acceptance", "P95", "Age"]:
        assert wanted in columns


def test_nested_objects_default_so_the_apiserver_fills_their_fields():
    spec = _schema()["properties"]["spec"]
    assert spec["properties"]["autotune"]["default"]["mode"] == "Auto"
    assert spec["properties"]["autotune"]["properties"]["mode"]["default"] == "Auto"


def test_crd_validates_against_the_kubernetes_schema():
    kubernetes_validate.validate(yaml.safe_load(CRD_FILE.read_text()), KUBERNETES_SCHEMA_VERSION, strict=True)
