"""The SpecDecodeService CustomResourceDefinition, generated from the pydantic models in `api`.

Pydantic emits JSON Schema (draft 2020-12); a CRD wants a structural OpenAPI v3 subset. The
conversion below inlines `$ref`s, turns `Optional[X]` (`anyOf [X, null]`) into `X` with
`nullable: true`, uses boolean `exclusiveMinimum`/`exclusiveMaximum`, drops
`additionalProperties: false` (a CRD forbids it beside `properties`; pruning already drops
unknown fields), gives nested objects `default: {}` so the apiserver fills their defaults,
and attaches each model's `Rule`s as `x-kubernetes-validations`.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from . import api
from . import constants as C

_DROPPED_KEYS = {"title", "$defs", "discriminator", "examples"}


def _rules_for(model: type[BaseModel]) -> list[dict[str, Any]]:
    validations = []
    for rule in getattr(model, "rules", ()):
        entry = {"rule": rule.cel, "message": rule.message}
        if rule.field:
            entry["fieldPath"] = rule.field
        validations.append(entry)
    return validations


def _models_by_name() -> dict[str, type[BaseModel]]:
    """Every pydantic class reachable from the API, by the name pydantic uses in `$defs`."""
    found: dict[str, type[BaseModel]] = {}

    def visit(model: type[BaseModel]) -> None:
        if model.__name__ in found:
            return
        found[model.__name__] = model
        for field in model.model_fields.values():
            for candidate in _classes_in(field.annotation):
                visit(candidate)

    visit(api.SpecDecodeServiceSpec)
    visit(api.SpecDecodeServiceStatus)
    return found


def _classes_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [c for arg in getattr(annotation, "__args__", ()) for c in _classes_in(arg)]


def _nested_model_defaults(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Wire names and defaults of the fields whose default is a whole sub-object.

    The default is the sub-object with its own defaults filled in, not `{}`: the apiserver
    checks a default against the schema's CEL rules without defaulting inside it first.
    """
    defaults = {}
    for name, field in model.model_fields.items():
        factory = field.default_factory
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            defaults[field.alias or name] = factory().model_dump(by_alias=True, exclude_none=True, mode="json")
    return defaults


class _Converter:
    def __init__(self, defs: dict[str, Any]):
        self.defs = defs
        self.models = _models_by_name()

    def convert(self, schema: dict[str, Any], model: type[BaseModel] | None = None) -> dict[str, Any]:
        schema = dict(schema)
        if "$ref" in schema:
            name = schema.pop("$ref").rsplit("/", 1)[-1]
            target = self.convert(self.defs[name], self.models.get(name))
            # Sibling keys (the field's description, its default) override the referenced ones.
            siblings = {k: v for k, v in schema.items() if k not in _DROPPED_KEYS}
            return {**target, **self._convert_scalars(siblings)}
        if "anyOf" in schema:
            options = [o for o in schema.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"cannot express a union of {len(options)} types in a CRD schema")
            inner = self.convert(options[0])
            outer = {k: v for k, v in schema.items() if k not in _DROPPED_KEYS}
            if outer.get("default", ...) is None:
                outer.pop("default")
            return {**inner, **self._convert_scalars(outer), "nullable": True}
        if "allOf" in schema and len(schema["allOf"]) == 1:
            inner = self.convert(schema.pop("allOf")[0])
            return {**inner, **self._convert_scalars({k: v for k, v in schema.items() if k not in _DROPPED_KEYS})}

        out = self._convert_scalars({k: v for k, v in schema.items() if k not in _DROPPED_KEYS})
        if "const" in out:
            out["enum"] = [out.pop("const")]
            out.setdefault("type", "string")
        if out.get("type") == "object" or "properties" in out:
            out["type"] = "object"
            self._convert_object(out, model)
        if out.get("type") == "array" and "items" in out:
            out["items"] = self.convert(out["items"])
        return out

    def _convert_scalars(self, schema: dict[str, Any]) -> dict[str, Any]:
        out = dict(schema)
        if isinstance(out.get("description"), str):
            out["description"] = " ".join(out["description"].split())
        for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if key in out and not isinstance(out[key], bool):
                out[bound] = out.pop(key)
                out[key] = True
        if "maxLength" in out and out.get("type") == "array":
            out["maxItems"] = out.pop("maxLength")
        if "maxLength" in out and out.get("type") == "object":
            out["maxProperties"] = out.pop("maxLength")
        return out

    def _convert_object(self, out: dict[str, Any], model: type[BaseModel] | None) -> None:
        if out.get("additionalProperties") is False:
            del out["additionalProperties"]
        if out.get("additionalProperties") is True:
            del out["additionalProperties"]
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = self.convert(out["additionalProperties"])
        if "properties" in out:
            out["properties"] = {k: self.convert(v) for k, v in out["properties"].items()}
        if model is not None:
            if model.__doc__ and "description" not in out:
                out["description"] = " ".join(model.__doc__.split())
            for wire_name, default in _nested_model_defaults(model).items():
                out["properties"][wire_name].setdefault("default", default)
            validations = _rules_for(model)
            if validations:
                out["x-kubernetes-validations"] = validations


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one API model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _Converter(raw.get("$defs", {})).convert(raw, model)


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Serving, Progressing, Degraded or Pending."},
    {"name": "Method", "type": "string", "jsonPath": ".spec.speculation.method", "description": "Speculative decoding method."},
    {"name": "K", "type": "integer", "jsonPath": ".status.speculation.k", "description": "num_speculative_tokens in effect; empty when speculation is off."},
    {"name": "Schedule", "type": "string", "jsonPath": ".status.speculation.schedule", "description": "Per-batch-size K schedule in effect (batch ranges:K); empty for plain K."},
    {"name": "Acceptance", "type": "number", "jsonPath": ".status.observations.acceptanceRate", "description": "Accepted / drafted tokens of the last window written to status (written when acceptance falls beyond noise or rises by 0.1; Prometheus has the live series)."},
    {"name": "P95", "type": "number", "jsonPath": ".status.observations.p95EndToEndSeconds", "description": "P95 end-to-end latency in seconds of the last window written to status (latency alone causes no write)."},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "priority": 1, "description": "Ready vLLM pods."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition() -> dict[str, Any]:
    """The whole CRD object, ready for `kubectl apply`."""
    spec_schema = openapi_schema(api.SpecDecodeServiceSpec)
    status_schema = openapi_schema(api.SpecDecodeServiceStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": C.CRD_NAME,
            "labels": {C.LABEL_NAME: C.OPERATOR_NAME, "app.kubernetes.io/part-of": C.OPERATOR_NAME},
        },
        "spec": {
            "group": C.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": C.KIND,
                "plural": C.PLURAL,
                "singular": C.SINGULAR,
                "listKind": f"{C.KIND}List",
                "shortNames": list(C.SHORT_NAMES),
                "categories": ["all", "specdecode"],
            },
            "versions": [
                {
                    "name": C.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": " ".join((api.SpecDecodeService.__doc__ or "").split()),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "serving.specdecode.io/v1alpha1"},
                                "kind": {"type": "string", "description": "SpecDecodeService"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML: exactly what `crds/specdecodeservices.yaml` holds."""
    header = "# Generated by `specdecode crd` from operator/specdecode/api.py. Do not edit.\n"
    return header + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100)
