"""Chat request -> the model's own chat template input (messages, tools, thinking controls) -> prompt text.

What the OpenAI shape and the Qwen3.8 template disagree on is settled here:
- `developer` messages are system messages, and every system/developer message is merged, in order, into
  one leading system message: the template takes a system message only at the start and refuses one
  anywhere else, while agent clients send them later too (Codex adds a developer message to each turn;
  opencode and others inject system messages mid-conversation). A late instruction so applies from the start
  of the conversation: the one place the model can read it.
- assistant tool-call arguments arrive as JSON text; the template wants a mapping.
- tool results are put back in the order of the calls they answer (the template drops ids, so order is
  the only link the model sees).
- top-level `reasoning_effort` maps onto the template's values: none -> thinking off, minimal -> low,
  high and max -> xhigh; a conflict with `chat_template_kwargs` is refused.
- `tool_choice` (required, named, parallel off) and `response_format: json_object` also become one sentence
  of instruction in the system message, so the model knows what its grammar (`grammars.py`) holds it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from elpis.server.errors import bad_request
from elpis.server.protocol import (
    AssistantMessage,
    ChatRequest,
    ChatTemplateKwargs,
    Message,
    NamedToolChoice,
    SystemMessage,
    ToolDef,
    ToolMessage,
    content_text,
)
from elpis.server.schema_values import strict_json_loads

_EFFORT_TO_TEMPLATE = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "xhigh",
    "xhigh": "xhigh",
    "max": "xhigh",
}


class ChatTemplateLike(Protocol):
    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str: ...


@dataclass(frozen=True)
class ChatInput:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]


def template_kwargs(reasoning_effort: str | None, nested: ChatTemplateKwargs | None) -> dict[str, Any]:
    """Thinking controls for the template; only what the request set, so the template's defaults hold."""
    out: dict[str, Any] = {}
    if nested is not None:
        out = nested.model_dump(exclude_none=True)
    if reasoning_effort is None:
        return out
    thinking = reasoning_effort != "none"
    if out.get("enable_thinking", thinking) != thinking:
        raise bad_request(
            f"reasoning_effort {reasoning_effort!r} conflicts with chat_template_kwargs.enable_thinking",
            "reasoning_effort",
        )
    out["enable_thinking"] = thinking
    if thinking:
        effort = _EFFORT_TO_TEMPLATE[reasoning_effort]
        if out.get("reasoning_effort", effort) != effort:
            raise bad_request(
                f"reasoning_effort {reasoning_effort!r} conflicts with chat_template_kwargs.reasoning_effort",
                "reasoning_effort",
            )
        out["reasoning_effort"] = effort
    elif "reasoning_effort" in out:
        raise bad_request(
            "reasoning_effort none turns thinking off; drop the nested effort", "reasoning_effort"
        )
    return out


def _instructions(request: ChatRequest) -> list[str]:
    lines = []
    choice = request.tool_choice
    if request.tools_enabled():
        if choice == "required":
            lines.append("You must call at least one of the provided functions in this reply.")
        elif isinstance(choice, NamedToolChoice):
            lines.append(f"You must call the function {choice.function.name} in this reply, and no other.")
        if request.parallel_tool_calls is False:
            lines.append("Call at most one function in this reply.")
    if request.response_format is not None and request.response_format.type == "json_object":
        lines.append("Reply with one valid JSON object and nothing else.")
    return lines


def _tool_call_arguments(index: int, position: int, text: str) -> dict[str, Any]:
    where = f"messages[{index}].tool_calls[{position}].function.arguments"
    try:
        value = strict_json_loads(text) if text.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"{where} is not valid JSON: {exc}", where) from None
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON object", where)
    return value


def _assistant(index: int, message: AssistantMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": content_text(message.content)}
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _tool_call_arguments(index, position, call.function.arguments),
                },
            }
            for position, call in enumerate(message.tool_calls)
        ]
    return out


def _ordered_tool_results(messages: list[Message]) -> list[tuple[int, Message]]:
    """Messages with each block of tool results sorted into the order of the calls they answer."""
    out: list[tuple[int, Message]] = []
    pending: dict[str, int] = {}  # call id -> position in the last assistant turn
    block: list[tuple[int, ToolMessage]] = []

    def flush() -> None:
        if block:
            block.sort(key=lambda item: pending.get(item[1].tool_call_id, len(pending)))
            out.extend(block)
            block.clear()

    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if pending and message.tool_call_id not in pending:
                raise bad_request(
                    f"messages[{index}].tool_call_id {message.tool_call_id!r} answers no call of the "
                    "assistant turn before it",
                    f"messages[{index}].tool_call_id",
                )
            block.append((index, message))
            continue
        flush()
        if isinstance(message, AssistantMessage):
            pending = {call.id: pos for pos, call in enumerate(message.tool_calls or [])}
        out.append((index, message))
    flush()
    return out


def chat_input(request: ChatRequest) -> ChatInput:
    messages: list[dict[str, Any]] = []
    system_parts: list[str] = []
    for index, message in _ordered_tool_results(request.messages):
        if isinstance(message, SystemMessage):  # wherever it came: see the module docstring
            system_parts.append(content_text(message.content))
        elif isinstance(message, AssistantMessage):
            messages.append(_assistant(index, message))
        elif isinstance(message, ToolMessage):
            messages.append(
                {
                    "role": "tool",
                    "content": content_text(message.content),
                    "tool_call_id": message.tool_call_id,
                }
            )
        else:
            messages.append({"role": message.role, "content": content_text(message.content)})
    system_parts += _instructions(request)
    if system_parts:
        messages.insert(0, {"role": "system", "content": "\n\n".join(p for p in system_parts if p)})
    tools = [tool_dict(tool) for tool in request.tools] if request.tools_enabled() and request.tools else None
    return ChatInput(messages, tools, template_kwargs(request.reasoning_effort, request.chat_template_kwargs))


def tool_dict(tool: ToolDef) -> dict[str, Any]:
    return tool.model_dump(exclude_none=True)


def render_chat(template: ChatTemplateLike, chat: ChatInput) -> str:
    try:
        return template.render(chat.messages, tools=chat.tools, add_generation_prompt=True, **chat.kwargs)
    except ValueError as exc:  # the template's own message (raise_exception), e.g. "No user query found"
        raise bad_request(f"chat template: {exc}", "messages") from None
