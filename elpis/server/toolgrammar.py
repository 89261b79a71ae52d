"""The grammar of Qwen tool calls for a request's tools (Lark text for `elpis.spec.grammar`).

A call is written as the Qwen3.8 template writes one:

    <tool_call>\\n<function=NAME>\\n(<parameter=KEY>\\nVALUE\\n</parameter>\\n)*</function>\\n</tool_call>

and further calls follow after one newline. For each declared function the grammar lists its declared
parameters in their declared order, the required ones mandatory and the others optional (a function without
declared properties takes any keys). A value that is a string enum or const is one of those strings, raw; a
value whose schema admits a string (or says nothing of types) is raw text without tool-call markup; any other
value is JSON valid under its schema, written as the template's
`tojson` writes it. The decoder (`toolcalls.ToolCallDecoder`) then reads every call the grammar lets through.

Two shapes:
- `calls_only`: the answer is one call or more and nothing else (tool_choice required or named);
- `after_open`: the text after a `<tool_call>` token the model chose to write (tool_choice auto), so a call,
  once begun, is always complete and well formed; nothing but further calls may follow it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from elpis.server.schema_values import allowed_types, resolve_ref
from elpis.server.toolcalls import (
    FUNCTION_OPEN,
    NESTED_MARKUP,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)
from elpis.spec.grammar import json_options

_BAD_KEY_CHARS = ("<", ">", "\n", "\r")
# Raw text with no tool-call markup in it; the value's own suffix ends it.
_MARKUP_TEXTS = (*NESTED_MARKUP, PARAMETER_CLOSE)
_MARKUP = "|".join(m.replace("/", "\\/") for m in _MARKUP_TEXTS)
_RAW_VALUE = f'/(?s:.*)/ & ~/(?s:.*({_MARKUP}).*)/'
_ANY_KEY = "/[^<>\\n\\r]+/"


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _checked_key(function: str, key: str) -> str:
    if not key or any(c in key for c in _BAD_KEY_CHARS):
        raise ValueError(f"parameter {key!r} of {function!r} cannot be written in Qwen's tool-call markup")
    return key


def _string_choices(schema: Any) -> list[str] | None:
    """The values of a string enum or const (written raw, as the template writes strings), else None."""
    if not isinstance(schema, dict):
        return None
    values = schema.get("enum") if isinstance(schema.get("enum"), list) else None
    if values is None and "const" in schema:
        values = [schema["const"]]
    if values and all(isinstance(v, str) and not any(m in v for m in _MARKUP_TEXTS) for v in values):
        return list(dict.fromkeys(values))
    return None


def _value_rule(name: str, schema: Any, definitions: dict[str, Any]) -> list[str]:
    """Rules for one value, named `name`: raw text where a string fits, else JSON under the schema (with the
    function schema's `definitions`, so that its `$ref`s resolve; keywords llguidance does not implement are
    ignored, so that no tool is refused for one)."""
    types = allowed_types(schema) if isinstance(schema, dict) else None
    choices = _string_choices(schema)
    if choices:
        return [f'{name}: ({" | ".join(_literal(c) for c in choices)}) "\\n</parameter>"']
    if types is None or "string" in types:
        return [f'{name}[suffix="\\n</parameter>"]: {_RAW_VALUE}']
    styled = {**definitions, **schema, "x-guidance": json_options(lenient=True)}
    return [f'{name}: %json {json.dumps(styled, ensure_ascii=False, allow_nan=False)} "\\n</parameter>"']


def _function_rules(index: int, name: str, parameters: dict[str, Any] | None) -> list[str]:
    rule = f"f{index}"
    definitions = {k: v for k, v in (parameters or {}).items() if k in ("$defs", "definitions")}
    properties = (parameters or {}).get("properties")
    required = set((parameters or {}).get("required") or [])
    rules: list[str] = []
    if isinstance(properties, dict) and properties:
        parts = []
        for k, (key, schema) in enumerate(properties.items()):
            value = f"{rule}_v{k}"
            literal = _literal(f"{PARAMETER_OPEN}{_checked_key(name, key)}>\n")
            rules.append(f'{rule}_p{k}: {literal} {value} "\\n"')
            rules += _value_rule(value, resolve_ref(schema, parameters), definitions)
            parts.append(f"{rule}_p{k}" + ("" if key in required else "?"))
        body = " ".join(parts)
    else:
        rules.append(f'{rule}_any: "{PARAMETER_OPEN}" {_ANY_KEY} ">\\n" {rule}_raw "\\n"')
        rules += _value_rule(f"{rule}_raw", None, definitions)
        body = f"{rule}_any*"
    head = _literal(f"{FUNCTION_OPEN}{name}>\n")
    return [f'{rule}: {head} {body} "</function>"', *rules]


def tool_call_lark(tools: Mapping[str, dict[str, Any] | None], *, only: str | None, parallel: bool,
                   calls_only: bool, special_markers: bool = True) -> str:
    """Lark text for calls to `tools` (name -> parameters schema); `only` restricts them to one function,
    `parallel` False to one call; `calls_only` picks the shape (see the module docstring).
    `special_markers`: `<tool_call>` and `</tool_call>` are single tokens of the vocabulary (Qwen's), named
    as tokens; otherwise they are spelled as text."""
    opening, closing = ((TOOL_CALL_OPEN, TOOL_CALL_CLOSE) if special_markers
                        else (_literal(TOOL_CALL_OPEN), _literal(TOOL_CALL_CLOSE)))
    names = [only] if only is not None else list(tools)
    if not names:
        raise ValueError("a tool-call grammar needs at least one function")
    rules: list[str] = []
    for index, name in enumerate(names):
        rules += _function_rules(index, name, tools[name])
    body = f'"\\n" ({" | ".join(f"f{i}" for i in range(len(names)))}) "\\n" {closing}'
    more = f' ("\\n" {opening} call_body)*' if parallel else ""
    start = (f"start: /[ \\n]{{0,2}}/ {opening} call_body{more}" if calls_only
             else f"start: call_body{more}")
    return "\n".join([start, f"call_body: {body}", *rules]) + "\n"
