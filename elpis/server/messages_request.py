"""`POST /v1/messages` and `/v1/messages/count_tokens` requests (Anthropic's Messages API): validated here,
then translated into the chat request that `/v1/chat/completions` runs, so every API shares one generation
path (template, sampling, grammars, reasoning and tool-call parsing, thinking budget, scheduler).

Only what elpis can honour is accepted: text, tool use and tool results, thinking blocks sent back as
history. Images, documents, server tools (web search, code execution, MCP servers, containers), assistant
prefill and context edits that drop input are refused with 400 naming the field. Bookkeeping that Claude
Code sends (`metadata.user_id`, `cache_control` anywhere, the `clear_thinking` context edit, `service_tier`)
is accepted without effect; see elpis/server/README.md for each decision. Errors raised on the shared chat
path are put back into this API's vocabulary by `messages_vocabulary`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from elpis.server.errors import APIError, bad_request
from elpis.server.protocol import Strict

# Accepted with any value and without effect: a capacity hint with no meaning on a single-user server.
MESSAGES_IGNORED = frozenset({"service_tier"})

# Claude's effort levels -> the Qwen3.8 template's reasoning_effort (its values: low, medium, xhigh).
EFFORT_TO_TEMPLATE = {"low": "low", "medium": "medium", "high": "xhigh", "xhigh": "xhigh", "max": "xhigh"}


# ----------------------------------------------------------------------------------------- content blocks


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # prompt caching is automatic here (the prefix cache)
    citations: list[Any] | None = None  # echoed back from earlier answers; must be empty

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind != "text":
            raise ValueError(f"only text blocks are supported here, not {str(kind)[:40]!r}")
        return data

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("citations are not supported (elpis has no documents to cite)")
        return value


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        if self.content is None:
            body = ""
        elif isinstance(self.content, str):
            body = self.content
        else:
            body = "\n\n".join(block.text for block in self.content)
        # The template has no error flag for a tool response: the model reads it from the text.
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Claude's integrity check of its own thinking; nothing to check here
    cache_control: dict[str, Any] | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str  # encrypted by Anthropic: unreadable here, and left out
    cache_control: dict[str, Any] | None = None


class UnsupportedBlock(Strict):
    """Stands for any other block type; validating it always fails, saying why."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("each content block must be an object")
        kind = str(data.get("type"))[:40]
        if kind in ("image", "document", "search_result", "container_upload"):
            raise ValueError(f"{kind} blocks are not supported: the served model reads text only")
        raise ValueError(
            f"content block type {kind!r} is not supported; elpis takes text, tool_use, tool_result, "
            f"thinking and redacted_thinking blocks"
        )


# The tags are listed in protocol._TAGS, which keeps them out of error locations.
_BLOCK_TAGS = {
    "text": "anthropic_text",
    "tool_use": "anthropic_tool_use",
    "tool_result": "anthropic_tool_result",
    "thinking": "anthropic_thinking",
    "redacted_thinking": "anthropic_redacted_thinking",
}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return (
        _BLOCK_TAGS.get(kind, "anthropic_unsupported") if isinstance(kind, str) else "anthropic_unsupported"
    )


Block = Annotated[
    Annotated[TextBlock, Tag("anthropic_text")]
    | Annotated[ToolUseBlock, Tag("anthropic_tool_use")]
    | Annotated[ToolResultBlock, Tag("anthropic_tool_result")]
    | Annotated[ThinkingBlock, Tag("anthropic_thinking")]
    | Annotated[RedactedThinkingBlock, Tag("anthropic_redacted_thinking")]
    | Annotated[UnsupportedBlock, Tag("anthropic_unsupported")],
    Discriminator(_block_tag),
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


# ------------------------------------------------------------------------------------------- the rest


class Tool(Strict):
    """A custom tool. Anthropic's built-in tools (bash, text editor, web search, ...) run on Anthropic's
    servers or need their own client loop; none of them exists here."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: every call the model begins is held to its schema anyway
    eager_input_streaming: bool | None = None  # a streaming hint: a call's input comes in one delta here

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(
                f"tool type {str(data.get('type'))[:40]!r} is not supported; elpis serves custom tools "
                f"(name, description, input_schema) only: built-in and server tools run nowhere here"
            )
        return data


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is required with type tool, and only with it")
        if self.type == "none" and self.disable_parallel_tool_use is not None:
            raise ValueError("disable_parallel_tool_use does not go with type none")
        return self


class ThinkingConfig(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget_with_enabled(self) -> ThinkingConfig:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("budget_tokens is required with type enabled, and only with it")
        if self.type == "disabled" and self.display is not None:
            raise ValueError("display does not go with type disabled")
        return self


class OutputFormat(Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class ContextEdit(Strict):
    """Only the edit that clears earlier thinking: the template already decides which earlier reasoning
    the model sees. Edits that drop tool results or compact the conversation would change the input."""

    type: Literal["clear_thinking_20251015"]
    keep: Any = None

    @model_validator(mode="before")
    @classmethod
    def _clear_thinking_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind != "clear_thinking_20251015":
            raise ValueError(
                f"context edit {str(kind)[:40]!r} is not supported: elpis never drops or rewrites input; "
                f"only clear_thinking_20251015 is accepted"
            )
        return data


class ContextManagement(Strict):
    edits: list[ContextEdit] = Field(default_factory=list)


class Metadata(Strict):
    user_id: str | None = None  # accepted, no effect (Claude Code sends one)


class CountTokensRequest(Strict):
    """The body of `/v1/messages/count_tokens`; `/v1/messages` takes the same plus the generation fields."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: dict[str, Any] | None = None  # automatic prompt caching: the prefix cache always is
    # refused in check(), each with its reason
    mcp_servers: Any = None
    container: Any = None

    def check(self) -> None:
        if self.mcp_servers is not None:
            raise bad_request(
                "mcp_servers: MCP servers are not supported; run MCP tools on the client side "
                "and declare them as tools",
                "mcp_servers",
            )
        if self.container is not None:
            raise bad_request("container: code execution containers are not supported", "container")
        last = len(self.messages) - 1
        if self.messages[last].role != "user":
            raise bad_request(
                f"messages[{last}]: the last message must have role user; elpis does not continue "
                f"(prefill) an assistant message",
                f"messages[{last}]",
            )


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = None  # checked by chat's field of the same name
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    metadata: Metadata | None = None


# ------------------------------------------------------------------------------------ to a chat request


@dataclass
class _Turn:
    """One assistant message's blocks, as chat's assistant message."""

    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(self.text)}
        if self.reasoning:
            out["reasoning_content"] = "\n\n".join(self.reasoning)
        if self.calls:
            out["tool_calls"] = self.calls
        return out


def _assistant(index: int, blocks: list[Any]) -> tuple[dict[str, Any], set[str]]:
    turn = _Turn()
    ids: set[str] = set()
    for position, block in enumerate(blocks):
        where = f"messages[{index}].content[{position}]"
        if isinstance(block, ThinkingBlock):
            if block.thinking:
                turn.reasoning.append(block.thinking)
        elif isinstance(block, TextBlock):
            turn.text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            if block.id in ids:
                raise bad_request(f"{where}.id: tool_use id {block.id[:64]!r} is used twice", f"{where}.id")
            ids.add(block.id)
            arguments = json.dumps(block.input, ensure_ascii=False)
            turn.calls.append(
                {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
            )
        elif isinstance(block, ToolResultBlock):
            raise bad_request(f"{where}: tool_result blocks belong in user messages", where)
        # redacted_thinking: encrypted, nothing readable to render
    return turn.message(), ids


def _user(index: int, blocks: list[Any], answerable: set[str]) -> list[dict[str, Any]]:
    """Tool results (first, as Anthropic requires) as chat tool messages, then the text as a user message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for position, block in enumerate(blocks):
        where = f"messages[{index}].content[{position}]"
        if isinstance(block, ToolResultBlock):
            if texts:
                raise bad_request(
                    f"{where}: tool_result blocks must come before any text in a user message", where
                )
            if block.tool_use_id not in answerable:
                raise bad_request(
                    f"{where}.tool_use_id: {block.tool_use_id[:64]!r} answers no tool_use block of the "
                    f"assistant message just before it",
                    f"{where}.tool_use_id",
                )
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            raise bad_request(f"{where}: {block.type} blocks belong in assistant messages", where)
    if texts:
        # Separate pieces (Claude Code sends a reminder and the user's words as two): kept apart.
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def chat_messages(request: CountTokensRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = request.system
    if isinstance(system, list):
        system = "\n\n".join(block.text for block in system)
    if system:
        messages.append({"role": "system", "content": system})
    answerable: set[str] = set()  # tool_use ids of the assistant message just before
    for index, message in enumerate(request.messages):
        content = message.content
        if isinstance(content, list) and not content and not (message.role == "assistant"):
            raise bad_request(
                f"messages[{index}].content: a user message needs content", f"messages[{index}].content"
            )
        if message.role == "assistant":
            if isinstance(content, str):
                messages.append({"role": "assistant", "content": content})
                answerable = set()
            else:
                turn, answerable = _assistant(index, content)
                messages.append(turn)
            continue
        if isinstance(content, str):
            messages.append({"role": "user", "content": content})
        else:
            messages += _user(index, content, answerable)
        answerable = set()
    return messages


def chat_body(request: CountTokensRequest) -> dict[str, Any]:
    """The chat completions body that asks for the same answer (its refusals name this request's fields);
    validate it as a `ChatRequest` inside `messages_vocabulary()`."""
    body: dict[str, Any] = {"messages": chat_messages(request)}
    if request.tools is not None:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    **({"description": tool.description} if tool.description is not None else {}),
                    "parameters": tool.input_schema,
                },
            }
            for tool in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or {
            "type": "function",
            "function": {"name": choice.name},
        }
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    thinking = request.thinking
    kwargs: dict[str, Any] = {}
    if thinking is not None:
        kwargs["enable_thinking"] = thinking.type != "disabled"
        if thinking.budget_tokens is not None:
            body["thinking_token_budget"] = thinking.budget_tokens
    config = request.output_config
    if config is not None:
        # Effort steers the template's reasoning; with thinking off there is nothing here for it to steer.
        if config.effort is not None and kwargs.get("enable_thinking") is not False:
            kwargs["reasoning_effort"] = EFFORT_TO_TEMPLATE[config.effort]
        if config.format is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": config.format.json_schema},
            }
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if isinstance(request, MessagesRequest):
        body["max_tokens"] = request.max_tokens
        if request.stop_sequences:
            body["stop"] = request.stop_sequences
        passed = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k}
        body.update({name: value for name, value in passed.items() if value is not None})
    return body


# chat's names -> this API's, for errors raised on the shared path (param and message alike)
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^stop\b"), "stop_sequences"),
    (re.compile(r"\bstop strings\b"), "stop_sequences"),
    (re.compile(r"\bresponse_format(\.json_schema)?\b"), "output_config.format"),
    (re.compile(r"\bthinking_token_budget\b"), "thinking.budget_tokens"),
    (re.compile(r"\bchat_template_kwargs\.reasoning_effort\b"), "output_config.effort"),
    (re.compile(r"\bchat_template_kwargs\.enable_thinking\b"), "thinking"),
    (re.compile(r"\bparallel_tool_calls\b"), "tool_choice.disable_parallel_tool_use"),
    (re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
    (re.compile(r"^(tools\[\d+\])\.function\.parameters\b"), r"\1.input_schema"),
    (re.compile(r"^(tools\[\d+\])\.function\b"), r"\1"),
    (re.compile(r"^tool_choice\.function\.name\b"), "tool_choice.name"),
    (re.compile(r"^messages\[\d+\][.\w\[\]]*"), "messages"),  # chat's indices are not this request's
)


def _rename(text: str) -> str:
    for pattern, replacement in _RENAMES:
        text = pattern.sub(replacement, text)
    return text


@contextmanager
def messages_vocabulary() -> Iterator[None]:
    """Errors raised inside (by the chat path the request is translated to) name this API's fields."""
    try:
        yield
    except APIError as err:
        if err.status != 400:
            raise
        param = None if err.param is None else _rename(err.param)
        raise APIError(err.status, _rename(err.message), err.code, param, err.headers, err.close) from None
