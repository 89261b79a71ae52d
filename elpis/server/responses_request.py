"""`POST /v1/responses` requests (OpenAI's Responses API): validated here, then translated into the chat
request that `/v1/chat/completions` runs, so both endpoints share one generation path (template, sampling,
grammars, reasoning and tool-call parsing, budget, scheduler).

elpis is stateless: what needs a stored response (`previous_response_id`, `conversation`, `background`,
item references, stored `prompt` templates) is refused with 400 naming the field, and asks for the whole
conversation in `input`. Only function tools and text content exist here; built-in tools and non-text
parts are refused the same way. Errors that the shared chat path raises are put back into this API's
vocabulary (`text.format`, `max_output_tokens`, `reasoning.effort`, `input`) by `responses_vocabulary`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from elpis.server.errors import APIError, bad_request
from elpis.server.protocol import FunctionDef, Strict
from elpis.server.schema_values import strict_json_loads

# Accepted with any value and without effect (bookkeeping Codex and the SDKs send).
RESPONSES_IGNORED = frozenset({"service_tier", "safety_identifier", "prompt_cache_key"})
STATELESS = "elpis is stateless and stores no responses: send the whole conversation in input"
MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys up to 64 and values up to 512 characters

ItemStatus = Literal["in_progress", "completed", "incomplete"]


# ------------------------------------------------------------------------------------------- input items


class TextPart(Strict):
    """A text content part; `output_text` is what an earlier response returned, sent back as history."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # echoed back from output_text parts; no effect
    logprobs: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in ("input_text", "output_text"):
            raise ValueError(
                f"only text content parts (input_text, output_text) are supported, not {str(kind)[:40]!r}"
            )
        return data


Content = str | list[TextPart]


def content_text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class InputMessage(Strict):
    type: Literal["message"] = "message"  # optional on input (OpenAI's "easy" message)
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None
    status: ItemStatus | None = None
    phase: str | None = None  # Codex labels its assistant messages ("commentary", "final_answer")


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Content
    id: str | None = None
    status: ItemStatus | None = None


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Strict):
    """Reasoning sent back as history. Its plain text (`content`, else `summary`) becomes the reasoning of the
    assistant turn it belongs to; `encrypted_content` cannot be read here and is ignored."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        if self.content:
            return "".join(part.text for part in self.content)
        return "\n\n".join(part.text for part in self.summary)


class UnsupportedItem(Strict):
    """Stands for any other item type; validating it always fails, saying why."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("each input item must be an object")
        kind = str(data.get("type"))[:40]
        if kind == "item_reference":
            raise ValueError(f"item_reference needs stored items; {STATELESS}")
        raise ValueError(
            f"input item type {kind!r} is not supported; elpis takes message, function_call, "
            f"function_call_output and reasoning items"
        )


# The union's tags (these and "unsupported") are listed in protocol._TAGS, which keeps them out of `param`.
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _item_tag(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _ITEM_TYPES else "unsupported"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[UnsupportedItem, Tag("unsupported")],
    Discriminator(_item_tag),
]


# ------------------------------------------------------------------------------------------- the rest


class FunctionTool(FunctionDef):
    """Responses tools are flat: `{"type": "function", "name", "description", "parameters", "strict"}`."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") != "function":
            raise ValueError(
                f"tool type {str(data.get('type'))[:40]!r} is not supported; elpis serves "
                f"function tools only (built-in tools such as web_search run nowhere here)"
            )
        return data


class TextFormat(Strict):
    """`text.format`: text, json_object, or json_schema with its name and schema (flat, unlike chat's)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _fields_match_type(self) -> TextFormat:
        if self.type == "json_schema":
            if self.name is None or self.json_schema is None:
                raise ValueError("type json_schema needs name and schema")
        elif any(v is not None for v in (self.name, self.json_schema, self.description, self.strict)):
            raise ValueError(
                f"name, schema, description and strict go only with type json_schema, not {self.type}"
            )
        return self

    def response_format(self) -> dict[str, Any]:
        """The same format in chat's `response_format` shape."""
        if self.type != "json_schema":
            return {"type": self.type}
        named = {
            "name": self.name,
            "schema": self.json_schema,
            "description": self.description,
            "strict": self.strict,
        }
        return {"type": "json_schema", "json_schema": {k: v for k, v in named.items() if v is not None}}


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # only the neutral value: elpis does not steer answer length

    @field_validator("verbosity", mode="before")
    @classmethod
    def _verbosity(cls, value: Any) -> Any:
        if value not in (None, "medium"):
            raise ValueError(
                f"only 'medium' is supported, not {str(value)[:20]!r}: the length of the answer "
                f"is not steered"
            )
        return value


class ReasoningConfig(Strict):
    effort: str | None = None  # checked by chat's reasoning_effort, which takes the same values
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted: the full reasoning is returned
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's older name


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", "name"}: checked below
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None  # accepted either way: nothing is ever stored
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    # sampling, checked by chat's fields of the same names (elpis extensions: seed and the rest after it)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    # refused in check(), each with its reason
    previous_response_id: Any = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and not value:
            raise ValueError("input is empty; send a string or at least one item")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in ("auto", "none", "required"):
            return value
        if (
            isinstance(value, dict)
            and value.get("type") == "function"
            and set(value) == {"type", "name"}
            and isinstance(value["name"], str)
        ):
            return value
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise ValueError(
                f"tool_choice type {kind[:40]!r} is not supported; elpis serves function tools only"
            )
        raise ValueError(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}'
        )

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > MAX_METADATA:
                raise ValueError(f"at most {MAX_METADATA} metadata pairs, got {len(value)}")
            for key, text in value.items():
                if len(key) > 64 or len(text) > 512:
                    raise ValueError("metadata keys may have up to 64 characters and values up to 512")
        return value

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if name != "reasoning.encrypted_content":
                raise ValueError(
                    f"{name[:60]!r} cannot be included; only reasoning.encrypted_content is "
                    f"accepted (reasoning comes back as plain text in each reasoning item)"
                )
        return value

    def check(self) -> None:
        """Features that need state elpis does not keep, or that it does not have, each refused by name."""
        if self.previous_response_id is not None:
            raise bad_request(f"previous_response_id is not supported: {STATELESS}", "previous_response_id")
        if self.conversation is not None:
            raise bad_request(f"conversation is not supported: {STATELESS}", "conversation")
        if self.background:
            raise bad_request(
                f"background responses are not supported: {STATELESS}; wait for the answer or "
                f"send stream: true",
                "background",
            )
        if self.prompt is not None:
            raise bad_request(
                "stored prompt templates are not supported; send instructions and input", "prompt"
            )
        if self.truncation == "auto":
            raise bad_request(
                "truncation auto is not supported: elpis never drops input; shorten input to fit the context",
                "truncation",
            )

    # ---------------------------------------------------------------------------------- echoed settings

    def settings(self) -> dict[str, Any]:
        """The request's settings as a response object echoes them: the values in effect, defaults filled."""
        text: dict[str, Any] = {"format": {"type": "text"}}
        if self.text is not None:
            text = self.text.model_dump(by_alias=True, exclude_none=True)
            text.setdefault("format", {"type": "text"})
        reasoning = self.reasoning or ReasoningConfig()
        return {
            "instructions": self.instructions,
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or []],
            "tool_choice": "auto" if self.tool_choice is None else self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "max_output_tokens": self.max_output_tokens,
            "temperature": 0.0
            if self.temperature is None
            else self.temperature,  # elpis is greedy by default
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "text": text,
            "reasoning": {
                "effort": reasoning.effort,
                "summary": reasoning.summary or reasoning.generate_summary,
            },
            "metadata": self.metadata or {},
            "user": self.user,
            "store": False,  # whatever was asked: nothing is stored
            "background": False,
            "truncation": "disabled",
            "previous_response_id": None,
        }


# ------------------------------------------------------------------------------------ to a chat request


@dataclass
class _AssistantTurn:
    """Consecutive assistant items (reasoning, messages, function calls): one assistant message for chat."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(self.content)}
        if self.reasoning:
            out["reasoning_content"] = "\n\n".join(self.reasoning)
        if self.calls:
            out["tool_calls"] = self.calls
        return out


def _call(index: int, item: FunctionCallItem) -> dict[str, Any]:
    try:
        arguments = strict_json_loads(item.arguments) if item.arguments.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise bad_request(
            f"input[{index}].arguments is not valid JSON: {exc}", f"input[{index}].arguments"
        ) from None
    if not isinstance(arguments, dict):
        raise bad_request(f"input[{index}].arguments must be a JSON object", f"input[{index}].arguments")
    return {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages. Each function_call_output must answer a function_call of
    the assistant turn just before it, as a chat tool message must (the template links them by order only)."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    turn: _AssistantTurn | None = None
    answerable: set[str] = set()  # call ids of the last assistant turn
    for index, item in enumerate(request.input):
        if isinstance(item, ReasoningItem | FunctionCallItem) or (
            isinstance(item, InputMessage) and item.role == "assistant"
        ):
            if turn is None:
                turn, answerable = _AssistantTurn(), set()
            if isinstance(item, ReasoningItem):
                if text := item.text():
                    turn.reasoning.append(text)
            elif isinstance(item, FunctionCallItem):
                turn.calls.append(_call(index, item))
                answerable.add(item.call_id)
            else:
                turn.content.append(content_text(item.content))
            continue
        if turn is not None:
            messages.append(turn.message())
            turn = None
        if isinstance(item, FunctionCallOutputItem):
            if item.call_id not in answerable:
                raise bad_request(
                    f"input[{index}] answers call_id {item.call_id[:64]!r}, which no function_call "
                    f"item of the assistant turn before it has",
                    f"input[{index}].call_id",
                )
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": content_text(item.output)}
            )
        else:
            assert isinstance(item, InputMessage)
            answerable = set()
            messages.append({"role": item.role, "content": content_text(item.content)})
    if turn is not None:
        messages.append(turn.message())
    return messages


def chat_body(request: ResponsesRequest) -> dict[str, Any]:
    """The chat completions body that asks for the same answer; validate it as a `ChatRequest` inside
    `responses_vocabulary()`."""
    body: dict[str, Any] = {"messages": chat_messages(request)}
    if request.model is not None:
        body["model"] = request.model
    if request.tools is not None:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in request.tools
        ]
    choice = request.tool_choice
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        body["tool_choice"] = choice
    if request.text is not None and request.text.format is not None:
        body["response_format"] = request.text.format.response_format()
    if request.reasoning is not None and request.reasoning.effort is not None:
        body["reasoning_effort"] = request.reasoning.effort
    passed = {
        "parallel_tool_calls": request.parallel_tool_calls,
        "max_completion_tokens": request.max_output_tokens,
        **{name: getattr(request, name) for name in _SAMPLING},
    }
    body.update({name: value for name, value in passed.items() if value is not None})
    return body


_SAMPLING = (
    "temperature",
    "top_p",
    "seed",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)

# chat's names -> this API's, for errors raised on the shared path (param and message alike)
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bresponse_format\.json_schema\b"), "text.format"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
    (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
    (re.compile(r"^(tools\[\d+\])\.function\b"), r"\1"),
    (re.compile(r"^tool_choice\.function\b"), "tool_choice"),
)
_PARAM_ONLY = ((re.compile(r"^messages\b"), "input"),)  # "messages" in a message's prose stays


def _rename(text: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


@contextmanager
def responses_vocabulary() -> Iterator[None]:
    """Errors raised inside (by the chat path the request is translated to) name this API's fields."""
    try:
        yield
    except APIError as err:
        if err.status != 400:
            raise
        param = None if err.param is None else _rename(_rename(err.param, _RENAMES), _PARAM_ONLY)
        raise APIError(
            err.status, _rename(err.message, _RENAMES), err.code, param, err.headers, err.close
        ) from None
