"""The generated CRD: identical to the committed file, structural, documented, bounded."""

from __future__ import annotations

import kubernetes_validate
import yaml

from specdecode import constants as C
from specdecode.crd import crd_yaml, custom_resource_definition

from ..spec_corpus import walk_schema
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
    return walk_schema(node, path)


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


def _rule_nodes(node, path="spec"):
    """Every schema node with CEL rules, with its path."""
    if node.get("x-kubernetes-validations"):
        yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _rule_nodes(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _rule_nodes(node["items"], f"{path}[]")


def test_cel_rules_read_only_fields_that_are_there_or_guarded_by_has():
    """A rule that reads an optional field with no default fails with `no such key` when a
    user leaves it out (an `engine` block without `extraArgs` was refused this way): every
    such read must sit behind `has(...)`."""
    import re

    unguarded = []
    for path, node in _rule_nodes(_schema()["properties"]["spec"]):
        for validation in node["x-kubernetes-validations"]:
            rule = validation["rule"]
            for chain in set(re.findall(r"self((?:\.[a-zA-Z]+)+)", rule)):
                here = node
                prefix = "self"
                for part in chain.strip(".").split("."):
                    props = here.get("properties", {})
                    if part not in props:
                        break  # a method such as .all or .exists, or a map's key
                    prefix += f".{part}"
                    present = part in here.get("required", []) or "default" in props[part]
                    if not present and f"has({prefix})" not in rule:
                        unguarded.append((path, prefix, rule))
                    here = props[part]
    assert unguarded == []


def _largest(node, path="spec"):
    """The largest value the schema admits: every string at maxLength, every list at maxItems,
    every map at maxProperties with keys as long as its rules allow. Pass-through Kubernetes
    objects (x-kubernetes-preserve-unknown-fields) stay empty: the schema cannot bound them."""
    import re

    kind = node.get("type")
    if "enum" in node:
        return max(node["enum"], key=lambda v: len(str(v)))
    if kind == "string":
        assert "maxLength" in node, f"{path} is an unbounded string"
        return "x" * node["maxLength"]
    if kind in ("integer", "number"):
        return node.get("maximum", 0)
    if kind == "boolean":
        return False
    if kind == "array":
        assert "maxItems" in node, f"{path} is an unbounded list"
        return [_largest(node["items"], f"{path}[]") for _ in range(node["maxItems"])]
    if node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
        return {}
    if "properties" in node:
        return {key: _largest(child, f"{path}.{key}") for key, child in node["properties"].items()}
    assert "maxProperties" in node, f"{path} is an unbounded map"
    key_limits = [int(m) for v in node.get("x-kubernetes-validations", []) for m in re.findall(r"size\(k\) <= (\d+)", v["rule"])]
    assert key_limits, f"{path}: map keys are unbounded"
    value = _largest(node["additionalProperties"], f"{path}{{}}")
    return {f"{i:03d}".ljust(min(key_limits), "k"): value for i in range(node["maxProperties"])}


def test_the_largest_spec_the_schema_admits_fits_the_annotations_kopf_and_kubectl_keep():
    """kubectl's client-side apply keeps the object in an annotation and all annotations share
    256 KiB: the bounds keep the largest typed spec under SPEC_BOUND_BYTES."""
    import json

    from specdecode import api

    largest = _largest(_schema()["properties"]["spec"])
    size = len(json.dumps(largest, separators=(",", ":")))
    assert 50 * 1024 < size <= api.SPEC_BOUND_BYTES < 200 * 1024


def test_every_cel_rule_parses():
    """A syntax error in one rule makes the apiserver refuse the whole CRD: catch it here,
    before an install does (cel-python parses the same grammar)."""
    import celpy

    env = celpy.Environment()
    rules = [v["rule"] for _, node in _rule_nodes(_schema()["properties"]["spec"]) for v in node["x-kubernetes-validations"]]
    assert len(rules) > 15
    for rule in rules:
        env.compile(rule)
