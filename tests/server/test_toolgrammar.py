"""The tool-call grammar (`elpis.server.toolgrammar`) against the Qwen3.8 template's own rendering of calls
and against the decoder that reads them."""

from __future__ import annotations

import json

import pytest

from elpis.server.toolcalls import TOOL_CALL_OPEN, ToolCallDecoder, scan_call
from elpis.server.toolgrammar import tool_call_lark
from elpis.spec.grammar import Grammar, GrammarTokenizer

TOOLS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["metric", "imperial"]},
            "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}},
                       "required": ["hourly"], "additionalProperties": False},
        },
        "required": ["city", "days"],
    },
    "note": {"type": "object", "properties": {"text": {"type": "string"}, "tags": {
        "type": "array", "items": {"type": "string"}}}, "required": ["text"]},
    "ping": None,  # no declared parameters: any keys
}


@pytest.fixture(scope="module")
def vocabulary(qwen_text) -> GrammarTokenizer:
    tokenizer, _ = qwen_text
    return GrammarTokenizer(tokenizer.backend.to_str(), 248_320, tokenizer.eos_ids)


def _rendered_calls(qwen_text, calls: list[tuple[str, dict]]) -> str:
    """What the template writes for an assistant turn holding `calls` and no text, after its header."""
    _, template = qwen_text
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    text = template.render(messages, add_generation_prompt=False)
    turn = text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    turn = turn[turn.index(TOOL_CALL_OPEN):]  # after any empty thinking block the template adds
    return turn[: turn.rindex("<|im_end|>")]


def _accepts(qwen_text, grammar: Grammar, text: str, *, finished: bool = True) -> bool:
    """Whether the grammar takes all of `text` (and, when `finished`, lets the sequence end there)."""
    tokenizer, _ = qwen_text
    allowed = grammar.start().allowed_ids(tokenizer.encode(text, special=True))
    if allowed is None:
        return False
    return not finished or bool(set(allowed) & set(grammar.tokenizer.eos_ids))


def _grammar(vocabulary, *, only=None, parallel=True, calls_only=True) -> Grammar:
    lark = tool_call_lark(TOOLS, only=only, parallel=parallel, calls_only=calls_only)
    return Grammar.lark(vocabulary, lark)


GOOD_CALLS = [
    [("get_weather", {"city": "Paris", "days": 3})],
    [("get_weather", {"city": "New York <NY>", "days": 14, "units": "imperial", "detail": {"hourly": True}})],
    [("note", {"text": "two\nlines", "tags": ["a", "b c"]}), ("ping", {"x": "1", "why not": "2"})],
    [("ping", {})],
]


@pytest.mark.parametrize("calls", GOOD_CALLS)
def test_the_grammar_accepts_what_the_template_writes_and_the_decoder_reads_it(qwen_text, vocabulary,
                                                                               calls) -> None:
    text = _rendered_calls(qwen_text, calls)
    assert _accepts(qwen_text, _grammar(vocabulary), text), text
    decoder = ToolCallDecoder(TOOLS)
    body = text[len(TOOL_CALL_OPEN):]
    for position, (name, arguments) in enumerate(calls):
        scan = scan_call(body, final=True)
        assert scan.status == "complete" and scan.call is not None, body
        decoded = decoder.decode(scan.call, position)
        assert not isinstance(decoded, str) and decoded.name == name
        assert json.loads(decoded.arguments) == arguments
        body = body[scan.end:].lstrip("\n")[len(TOOL_CALL_OPEN):]


@pytest.mark.parametrize(("calls_text", "why"), [
    ('<tool_call>\n<function=other>\n</function>\n</tool_call>', "undeclared function"),
    ('<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>',
     "required city missing"),
    ('<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=days>\nthree\n'
     '</parameter>\n</function>\n</tool_call>', "days not an integer"),
    ('<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=days>\n30\n'
     '</parameter>\n</function>\n</tool_call>', "days above its maximum"),
    ('<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=days>\n3\n'
     '</parameter>\n<parameter=wind>\n1\n</parameter>\n</function>\n</tool_call>', "undeclared parameter"),
    ('<tool_call>\n<function=note>\n<parameter=text>\na<parameter=b\n</parameter>\n</function>\n</tool_call>',
     "markup inside a raw value"),
    ('<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=days>\n3\n'
     '</parameter>\n<parameter=units>\nkelvin\n</parameter>\n</function>\n</tool_call>',
     "units not in its enum"),
    ('Sure! <tool_call>\n<function=ping>\n</function>\n</tool_call>', "text before the call"),
])
def test_the_grammar_refuses_calls_the_decoder_would_refuse_or_misread(qwen_text, vocabulary, calls_text,
                                                                       why: str) -> None:
    assert not _accepts(qwen_text, _grammar(vocabulary), calls_text, finished=False), why


def test_named_and_single_call_choices(qwen_text, vocabulary) -> None:
    ping = _rendered_calls(qwen_text, [("ping", {})])
    two = _rendered_calls(qwen_text, [("ping", {}), ("ping", {"a": "b"})])
    assert _accepts(qwen_text, _grammar(vocabulary, only="ping"), ping)
    weather = _rendered_calls(qwen_text, [("get_weather", {"city": "Oslo", "days": 1})])
    assert not _accepts(qwen_text, _grammar(vocabulary, only="ping"), weather, finished=False)
    assert _accepts(qwen_text, _grammar(vocabulary), two)
    assert not _accepts(qwen_text, _grammar(vocabulary, parallel=False), two)


def test_after_open_takes_the_text_after_the_models_own_tool_call_token(qwen_text, vocabulary) -> None:
    text = _rendered_calls(qwen_text, [("get_weather", {"city": "Rome", "days": 2})])
    grammar = _grammar(vocabulary, calls_only=False)
    assert _accepts(qwen_text, grammar, text[len(TOOL_CALL_OPEN):])
    assert not _accepts(qwen_text, grammar, text, finished=False)


def test_a_parameter_name_the_markup_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        tool_call_lark({"f": {"type": "object", "properties": {"a>b": {}}}}, only=None, parallel=True,
                       calls_only=True)


def test_definitions_resolve_and_unimplemented_keywords_do_not_refuse_a_tool(qwen_text, vocabulary) -> None:
    """A pydantic-style schema (a `$ref` into `$defs`) and a keyword llguidance does not implement
    (`uniqueItems`): the tool still gets its grammar, the `$ref`'d value is held to its definition, and the
    decoder reads it as the object it is."""
    point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
             "additionalProperties": False}
    labels = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    tools = {"tag": {"type": "object", "$defs": {"Point": point},
                     "properties": {"at": {"$ref": "#/$defs/Point"}, "labels": labels}, "required": ["at"]}}
    grammar = Grammar.lark(vocabulary, tool_call_lark(tools, only=None, parallel=True, calls_only=True))
    good = _rendered_calls(qwen_text, [("tag", {"at": {"x": 3}, "labels": ["a"]})])
    assert _accepts(qwen_text, grammar, good)
    scan = scan_call(good[len(TOOL_CALL_OPEN):], final=True)
    assert scan.call is not None
    decoded = ToolCallDecoder(tools).decode(scan.call, 0)
    assert not isinstance(decoded, str) and json.loads(decoded.arguments) == {"at": {"x": 3}, "labels": ["a"]}
    assert not _accepts(qwen_text, grammar, _rendered_calls(qwen_text, [("tag", {"at": {"y": 3}})]),
                        finished=False)
    dangling = {"f": {"type": "object", "properties": {"a": {"type": "object", "$ref": "#/$defs/X"}}}}
    with pytest.raises(ValueError, match="does not exist"):  # a broken tool is still refused
        Grammar.lark(vocabulary, tool_call_lark(dangling, only=None, parallel=True, calls_only=True))
