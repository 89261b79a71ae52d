"""Qwen tool-call scanning and schema-driven value conversion."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elpis.server.schema_values import convert_value, parameter_schema, strict_json_loads
from elpis.server.toolcalls import RawCall, ToolCallDecoder, scan_call

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "zip": {"type": "string"},
        "ratio": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object"},
        "note": {"type": ["string", "null"]},
        "unit": {"enum": ["c", "f"]},
    },
}


def call_text(name: str, params: list[tuple[str, str]], close: str = "\n</tool_call>") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"\n<function={name}>\n{body}</function>{close}"


def test_complete_call_is_scanned_with_values_unwrapped() -> None:
    scan = scan_call(call_text("get_weather", [("city", "Paris"), ("days", "3")]) + "rest", final=False)
    assert scan.status == "complete"
    assert scan.call == RawCall("get_weather", (("city", "Paris"), ("days", "3")))
    assert call_text("get_weather", [("city", "Paris"), ("days", "3")]).__len__() == scan.end


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("hello <function=f></function></tool_call>", "expected <function=NAME>"),
        ("<function=f>\n<parameter=a>1</parameter>\n<parameter=a>2</parameter></function>", "duplicate"),
        ("<function=f><parameter=a>1 <tool_call> 2</parameter></function></tool_call>", "nested"),
        ("<function=f>junk</function></tool_call>", "unexpected text"),
        ("<function=f></function> junk </tool_call>", "text between"),
        ("<function=a\nb></function></tool_call>", "malformed function"),
        ("<function=></function></tool_call>", "empty function"),
        ("<function=" + "x" * 300 + ">", "longer than"),
    ],
)
def test_malformed_markup_is_invalid_with_a_reason(body: str, reason: str) -> None:
    scan = scan_call(body, final=False)
    assert scan.status == "invalid"
    assert reason in scan.reason


@pytest.mark.parametrize(
    "body",
    [
        "",
        "  <func",
        "<function=get_wea",
        "<function=f>\n<parameter=a>\nhalf a val",
        "<function=f></function>\n</tool",
    ],
)
def test_prefixes_wait_for_more_text_and_fail_at_the_end(body: str) -> None:
    assert scan_call(body, final=False).status == "incomplete"
    assert scan_call(body, final=True).status == "invalid"


def test_missing_close_tag_is_accepted_only_when_the_model_stopped() -> None:
    body = "<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n"
    assert scan_call(body, final=True, close_at_end=True).status == "complete"
    assert scan_call(body, final=True, close_at_end=False).status == "invalid"


def test_name_check_rejects_undeclared_functions_as_soon_as_the_name_is_read() -> None:
    decoder = ToolCallDecoder({"get_weather": WEATHER})
    scan = scan_call("<function=launch_missiles>\n<parameter=", final=False, check_name=decoder.check_name)
    assert scan.status == "invalid" and "undeclared" in scan.reason


def test_decoder_converts_each_value_by_its_schema() -> None:
    decoder = ToolCallDecoder({"get_weather": WEATHER})
    raw = RawCall(
        "get_weather",
        (
            ("city", "Paris"),
            ("days", "3"),
            ("metric", "true"),
            ("zip", "00123"),
            ("ratio", "0.5"),
            ("tags", '["a", "b"]'),
            ("options", '{"x": [1, {"y": null}]}'),
            ("note", "null"),
            ("unit", "c"),
            ("extra", "42"),
        ),
    )
    call = decoder.decode(raw, 0)
    assert not isinstance(call, str)
    assert call.id.startswith("call_") and call.name == "get_weather"
    assert json.loads(call.arguments) == {
        "city": "Paris",
        "days": 3,
        "metric": True,
        "zip": "00123",
        "ratio": 0.5,
        "tags": ["a", "b"],
        "options": {"x": [1, {"y": None}]},
        "note": "null",  # a string is allowed, so the text stays text
        "unit": "c",
        "extra": "42",  # undeclared: kept as text
    }


def test_decoder_limits_calls() -> None:
    named = ToolCallDecoder({"a": None, "b": None}, only="a")
    assert "tool_choice" in str(named.decode(RawCall("b", ()), 0))
    single = ToolCallDecoder({"a": None}, parallel=False)
    assert not isinstance(single.decode(RawCall("a", ()), 0), str)
    assert "parallel" in str(single.decode(RawCall("a", ()), 1))


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("42", {"type": "integer"}, 42),
        ("42.0", {"type": "integer"}, 42.0),
        ("4.5", {"type": "integer"}, "4.5"),  # does not fit: the text is kept
        ("True", {"type": "boolean"}, True),
        ("None", {"type": "null"}, None),
        ("001", {"type": "string"}, "001"),
        ("001", {"type": "integer"}, "001"),  # not JSON
        ("NaN", {"type": "number"}, "NaN"),
        ('{"a": 1, "a": 2}', {"type": "object"}, '{"a": 1, "a": 2}'),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 7),
        ("7", {"anyOf": [{"type": "integer"}, {}]}, "7"),  # one branch admits anything
        ("x", {"enum": [1, 2]}, "x"),
        ("2", {"enum": [1, 2]}, 2),
        ("[1]", {"description": "no type"}, "[1]"),
        ("[" * 5000, {"type": "array"}, "[" * 5000),
    ],
)
def test_convert_value(raw: str, schema: dict, expected: object) -> None:
    assert convert_value(raw, schema) == expected
    assert type(convert_value(raw, schema)) is type(expected)


def test_parameter_schema_lookup() -> None:
    assert parameter_schema(WEATHER, "city") == {"type": "string"}
    assert parameter_schema({"additionalProperties": {"type": "integer"}}, "x") == {"type": "integer"}
    assert parameter_schema(None, "x") is None


def test_strict_json_loads_refuses_duplicates_and_constants() -> None:
    with pytest.raises(ValueError):
        strict_json_loads('{"a": 1, "a": 1}')
    with pytest.raises(ValueError):
        strict_json_loads("[NaN]")
    assert strict_json_loads('{"a": [1.5]}') == {"a": [1.5]}


# ------------------------------------------------------------------------------------- fuzz

MARKUP = [
    "<function=",
    "<parameter=",
    "</parameter>",
    "</function>",
    "</tool_call>",
    "<tool_call>",
    ">",
    "\n",
]
markup_text = st.lists(
    st.one_of(st.sampled_from(MARKUP), st.sampled_from(["f", "a", "1", "[", "{"]), st.text(max_size=4)),
    max_size=25,
).map("".join)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
TYPES = ["string", "integer", "number", "boolean", "null", "array", "object", "bogus"]
leaf_schema = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), max_size=3),
        "enum": st.lists(json_leaf, max_size=3),
        "const": json_leaf,
    },
)
schemas = st.recursive(
    leaf_schema,
    lambda inner: st.fixed_dictionaries(
        {}, optional={"anyOf": st.lists(inner, max_size=3), "oneOf": st.lists(inner | json_leaf, max_size=3)}
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=markup_text, final=st.booleans(), close_at_end=st.booleans())
def test_scanner_never_raises_and_complete_means_closed(body: str, final: bool, close_at_end: bool) -> None:
    scan = scan_call(body, final=final, close_at_end=close_at_end)
    assert scan.status in ("complete", "incomplete", "invalid")
    if final:
        assert scan.status != "incomplete"
    if scan.status == "complete":
        assert scan.call is not None and 0 < scan.end <= len(body)
        assert body[: scan.end].rstrip().endswith(("</tool_call>", "</function>"))


def readings(raw: str) -> list:
    """Every value the text may legitimately become: itself, its JSON, or a Python-style literal."""
    out: list = [raw]
    with contextlib.suppress(ValueError, RecursionError):
        out.append(strict_json_loads(raw))
    literals = {"True": True, "False": False, "None": None}
    if raw.strip() in literals:
        out.append(literals[raw.strip()])
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.tuples(st.text(min_size=1, max_size=5), st.text(max_size=12)), max_size=5),
    schema=schemas,
)
def test_decoder_always_produces_a_json_object_of_the_given_values(values, schema) -> None:
    unique = tuple(dict(values).items())
    decoder = ToolCallDecoder({"f": {"type": "object", "properties": {key: schema for key, _ in unique}}})
    call = decoder.decode(RawCall("f", unique), 0)
    assert not isinstance(call, str)
    arguments = json.loads(call.arguments)
    assert isinstance(arguments, dict) and list(arguments) == [key for key, _ in unique]
    for key, raw in unique:  # nothing is invented: the value is the text, its JSON, or its literal
        assert any(
            arguments[key] == option and type(arguments[key]) is type(option) for option in readings(raw)
        )
        if schema == {"type": "string"}:
            assert arguments[key] == raw
