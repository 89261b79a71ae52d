"""Turn a Qwen tool-call parameter value (always text in the markup) into the JSON value its schema wants.

The Qwen template writes strings raw and everything else as JSON, so the text alone is ambiguous ("42"
may be a string or a number). The tool's JSON schema decides: a value that is already a valid string
stays a string (this keeps "001"); otherwise JSON (or a Python-style True/False/None) is parsed and kept
when its type fits; anything else stays the raw string, so a value is never lost.
"""

from __future__ import annotations

import json
from typing import Any

_PY_LITERALS = {"True": True, "False": False, "None": None}


def strict_json_loads(text: str | bytes) -> Any:
    """`json.loads` without NaN/Infinity and without duplicate object keys."""

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    return json.loads(text, parse_constant=reject_constant, object_pairs_hook=no_duplicates)


def parameter_schema(parameters: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The schema that applies to property `key` of an object schema (a local `$ref` followed), or None when
    nothing is declared."""
    if not isinstance(parameters, dict):
        return None
    properties = parameters.get("properties")
    if isinstance(properties, dict) and isinstance(properties.get(key), dict):
        return resolve_ref(properties[key], parameters)
    additional = parameters.get("additionalProperties")
    return resolve_ref(additional, parameters) if isinstance(additional, dict) else None


def resolve_ref(schema: Any, root: dict[str, Any] | None) -> Any:
    """`schema` with a local `$ref` ("#/$defs/Name" or "#/definitions/Name") into `root` followed (a few
    hops at most); anything else as it is."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not isinstance(root, dict):
            return schema
        section, _, name = ref.removeprefix("#/").partition("/")
        target = root.get(section, {}).get(name) if section in ("$defs", "definitions") else None
        if not isinstance(target, dict):
            return schema
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _json_type(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number", "integer"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, dict):
        return {"object"}
    return set()


def allowed_types(schema: dict[str, Any], depth: int = 0) -> set[str] | None:
    """JSON types a schema admits, or None when it says nothing about types."""
    if depth > 8:
        return None
    found: set[str] = set()
    known = False
    declared = schema.get("type")
    if isinstance(declared, str):
        found.add(declared)
        known = True
    elif isinstance(declared, list):
        found.update(t for t in declared if isinstance(t, str))
        known = True
    for key in ("enum",):
        if isinstance(schema.get(key), list):
            for value in schema[key]:
                found |= _json_type(value)
            known = True
    if "const" in schema:
        found |= _json_type(schema["const"])
        known = True
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                sub = allowed_types(branch, depth + 1) if isinstance(branch, dict) else None
                if sub is None:
                    return None  # one branch admits anything
                found |= sub
            known = True
    return found if known else None


def _fits(value: Any, schema: dict[str, Any], types: set[str]) -> bool:
    if not (_json_type(value) & types):
        return False
    if isinstance(schema.get("enum"), list) and not any(
        value == item and type(value) is type(item) for item in schema["enum"]
    ):
        return False
    return not ("const" in schema and schema["const"] != value)


def convert_value(raw: str, schema: dict[str, Any] | None) -> Any:
    if schema is None:
        return raw
    types = allowed_types(schema)
    if types is None:
        return raw
    if _fits(raw, schema, types):
        return raw
    if raw.strip() in _PY_LITERALS:
        literal = _PY_LITERALS[raw.strip()]
        if _fits(literal, schema, types):
            return literal
    try:
        parsed = strict_json_loads(raw)
    except (ValueError, RecursionError):
        return raw
    return parsed if _fits(parsed, schema, types) else raw
