"""Qwen XML tool calls: `<tool_call><function=NAME><parameter=KEY>value</parameter>..</function></tool_call>`.

`scan_call` reads the text after `<tool_call>` and says whether it is a complete call, needs more text, or
can no longer become a call. Its verdict at any point depends only on the text up to that point, so a
stream gives the same result however the text was split into deltas (the fuzz tests check this).
`ToolCallDecoder` turns a scanned call into an OpenAI tool call, converting each value by the tool's
JSON schema (see `schema_values`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from elpis.server.schema_values import convert_value, parameter_schema

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
# Markup that may not appear inside a parameter value (the call would be ambiguous).
NESTED_MARKUP = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, FUNCTION_OPEN, FUNCTION_CLOSE, PARAMETER_OPEN)
MAX_NAME_CHARS = 256
_BAD_NAME_CHARS = ("<", "\n", "\r")


@dataclass(frozen=True)
class RawCall:
    name: str
    parameters: tuple[tuple[str, str], ...]  # (key, raw value text) in order


@dataclass(frozen=True)
class Scan:
    status: Literal["complete", "incomplete", "invalid"]
    call: RawCall | None = None
    end: int = 0  # for "complete": offset just after the call's closing markup
    reason: str = ""


INCOMPLETE = Scan("incomplete")


def _invalid(reason: str) -> Scan:
    return Scan("invalid", reason=reason)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _is_partial(text: str, pos: int, literal: str) -> bool:
    """The rest of `text` from `pos` is a proper prefix of `literal` (more text may complete it)."""
    rest = len(text) - pos
    return rest < len(literal) and literal.startswith(text[pos:])


def _read_name(text: str, pos: int, what: str) -> tuple[str | None, int, Scan | None]:
    """Read `NAME>` at pos: (name, offset after '>', None) or (None, pos, verdict)."""
    end = text.find(">", pos, pos + MAX_NAME_CHARS + 1)
    fragment = text[pos : end if end >= 0 else pos + MAX_NAME_CHARS + 1]
    if any(bad in fragment for bad in _BAD_NAME_CHARS):
        return None, pos, _invalid(f"malformed {what} tag")
    if end < 0:
        if len(text) - pos > MAX_NAME_CHARS:
            return None, pos, _invalid(f"{what} name longer than {MAX_NAME_CHARS} characters")
        return None, pos, INCOMPLETE
    name = text[pos:end]
    if not name.strip():
        return None, pos, _invalid(f"empty {what} name")
    return name, end + 1, None


def _strip_one_newline(value: str) -> str:
    for newline in ("\r\n", "\n"):
        if value.startswith(newline):
            value = value[len(newline) :]
            break
    for newline in ("\r\n", "\n"):
        if value.endswith(newline):
            value = value[: -len(newline)]
            break
    return value


def scan_call(
    body: str,
    *,
    final: bool,
    close_at_end: bool = False,
    check_name: Callable[[str], str | None] = lambda name: None,
) -> Scan:
    """Scan `body`, the text right after `<tool_call>`.

    `final`: no more text will come (an unfinished call is then invalid). `close_at_end`: at the final
    text, `</function>` followed only by space also closes the call (the model stopped before
    `</tool_call>`). `check_name` returns a reason when a function name is not acceptable.
    """
    pos = _skip_space(body, 0)
    if not body.startswith(FUNCTION_OPEN, pos):
        if _is_partial(body, pos, FUNCTION_OPEN):
            return _invalid("unclosed tool call") if final else INCOMPLETE
        return _invalid("expected <function=NAME> after <tool_call>")
    name, pos, verdict = _read_name(body, pos + len(FUNCTION_OPEN), "function")
    if verdict is not None:
        return _invalid("unclosed tool call") if final and verdict.status == "incomplete" else verdict
    assert name is not None
    problem = check_name(name)
    if problem:
        return _invalid(problem)
    parameters: list[tuple[str, str]] = []
    seen: set[str] = set()
    while True:
        pos = _skip_space(body, pos)
        if body.startswith(PARAMETER_OPEN, pos):
            key, value_start, verdict = _read_name(body, pos + len(PARAMETER_OPEN), "parameter")
            if verdict is not None:
                return _invalid("unclosed parameter") if final and verdict.status == "incomplete" else verdict
            assert key is not None
            if key in seen:
                return _invalid(f"duplicate parameter {key!r}")
            value_end = body.find(PARAMETER_CLOSE, value_start)
            region = body[value_start : value_end if value_end >= 0 else len(body)]
            if any(marker in region for marker in NESTED_MARKUP):
                return _invalid("markup nested inside a parameter value")
            if value_end < 0:
                return _invalid("unclosed parameter") if final else INCOMPLETE
            seen.add(key)
            parameters.append((key, _strip_one_newline(region)))
            pos = value_end + len(PARAMETER_CLOSE)
            continue
        if body.startswith(FUNCTION_CLOSE, pos):
            call = RawCall(name, tuple(parameters))
            pos = _skip_space(body, pos + len(FUNCTION_CLOSE))
            if body.startswith(TOOL_CALL_CLOSE, pos):
                return Scan("complete", call, pos + len(TOOL_CALL_CLOSE))
            if pos == len(body) or _is_partial(body, pos, TOOL_CALL_CLOSE):
                if not final:
                    return INCOMPLETE
                if close_at_end:
                    return Scan("complete", call, len(body))
                return _invalid("unclosed tool call")
            return _invalid("text between </function> and </tool_call>")
        if (
            pos == len(body)
            or _is_partial(body, pos, PARAMETER_OPEN)
            or _is_partial(body, pos, FUNCTION_CLOSE)
        ):
            return _invalid("unclosed function") if final else INCOMPLETE
        return _invalid("unexpected text inside <function>")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolCallDecoder:
    """Which calls a request accepts, and how their values become JSON.

    `tools` maps each declared function name to its parameters schema. `only` restricts calls to one
    function (a named `tool_choice`). `parallel=False` accepts one call per turn.
    """

    def __init__(
        self,
        tools: Mapping[str, dict[str, Any] | None],
        *,
        only: str | None = None,
        parallel: bool = True,
    ) -> None:
        self.tools = dict(tools)
        self.only = only
        self.parallel = parallel

    def check_name(self, name: str) -> str | None:
        if name not in self.tools:
            return f"call to undeclared function {name!r}"
        if self.only is not None and name != self.only:
            return f"call to {name!r} while tool_choice names {self.only!r}"
        return None

    def decode(self, call: RawCall, calls_so_far: int) -> ToolCall | str:
        """The OpenAI tool call, or the reason it is refused."""
        problem = self.check_name(call.name)
        if problem:
            return problem
        if calls_so_far >= 1 and not self.parallel:
            return "more than one call while parallel_tool_calls is false"
        schema = self.tools[call.name]
        arguments = {key: convert_value(raw, parameter_schema(schema, key)) for key, raw in call.parameters}
        return ToolCall(new_call_id(), call.name, json.dumps(arguments, ensure_ascii=False))
