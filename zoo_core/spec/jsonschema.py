"""``zoo schema``: the envelope's JSON Schema with ``model.core`` as a union of every core's params."""

from __future__ import annotations

import copy
from typing import Any

from ..params import CoreParams
from ..plugin_registry import Registry
from .schema import ModelSpec


def core_schema(name: str, params: type[CoreParams]) -> dict[str, Any]:
    """One core's params as a schema branch keyed by ``kind`` (d_model comes from model.d_model)."""
    schema = copy.deepcopy(params.model_json_schema())
    props = schema.setdefault("properties", {})
    props.pop("d_model", None)
    schema["required"] = [r for r in schema.get("required", []) if r != "d_model"]
    props["kind"] = {"const": name}
    props["preset"] = {"type": "string"}
    schema["required"].insert(0, "kind")
    schema["additionalProperties"] = False
    schema["title"] = f"core {name}"
    return schema


def full_schema(registry: Registry) -> dict[str, Any]:
    schema = ModelSpec.model_json_schema()
    defs = schema.setdefault("$defs", {})
    branches = []
    for name, entry in sorted(registry.cores.items()):
        branch = core_schema(name, entry.params)
        for key, value in branch.pop("$defs", {}).items():
            defs[f"{name}.{key}"] = value
        branches.append(_rename_refs(branch, name))
    defs["CoreSpec"] = {"title": "core", "oneOf": branches} if branches else {"type": "object"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def _rename_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        return {k: (v.replace("#/$defs/", f"#/$defs/{prefix}.") if k == "$ref" and isinstance(v, str) else _rename_refs(v, prefix))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rename_refs(v, prefix) for v in node]
    return node
