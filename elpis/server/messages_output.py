"""Messages API output: content blocks, the message object, its stop reason and usage, and the stream events.

`BlockBuilder` folds the channel splitter's events (the ones chat and the Responses API are built from) into
content blocks and says each change as a stream event, so a streamed message and a whole one are the same
fold and cannot disagree. Blocks come in the order the model wrote them: `thinking` (the reasoning),
`text`, one `tool_use` per call. A call is decoded when its block closes (`channels.OutputSplitter`), so its
input comes as one `input_json_delta`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from elpis.server.channels import Event, ToolCallEvent
from elpis.spec import GenerationStats

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"]


def new_block_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class BlockBuilder:
    """Content blocks folded from splitter events; `feed` and `finish` return the stream events
    (`content_block_start`, `content_block_delta`, `content_block_stop`). With `show_thinking` False
    (thinking.display "omitted") thinking blocks keep their place but carry no text."""

    def __init__(self, show_thinking: bool = True) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.show_thinking = show_thinking
        self._open: dict[str, Any] | None = None  # the thinking or text block whose text still grows

    def feed(self, events: Sequence[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ToolCallEvent):
                out += self._close()
                out += self._tool_use(event)
                continue
            kind = "thinking" if event.channel == "reasoning" else "text"
            if self._open is None or self._open["type"] != kind:
                out += self._close()
                out += self._begin(kind)
            out += self._delta(event.text)
        return out

    def finish(self) -> list[dict[str, Any]]:
        return self._close()

    @property
    def tool_uses(self) -> int:
        return sum(block["type"] == "tool_use" for block in self.blocks)

    # --------------------------------------------------------------------------------------- the steps

    def _begin(self, kind: Literal["thinking", "text"]) -> list[dict[str, Any]]:
        block: dict[str, Any] = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        self.blocks.append(block)
        self._open = block
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        block = self._open
        assert block is not None
        index = len(self.blocks) - 1
        if block["type"] == "text":
            block["text"] += text
            return [
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
            ]
        if not self.show_thinking:
            return []
        block["thinking"] += text
        delta = {"type": "thinking_delta", "thinking": text}
        return [{"type": "content_block_delta", "index": index, "delta": delta}]

    def _close(self) -> list[dict[str, Any]]:
        block, self._open = self._open, None
        if block is None:
            return []
        index = self.blocks.index(block)
        out: list[dict[str, Any]] = []
        if block["type"] == "thinking":
            # Claude's clients expect a signature before the block stops; elpis signs nothing: it is empty.
            delta = {"type": "signature_delta", "signature": ""}
            out.append({"type": "content_block_delta", "index": index, "delta": delta})
        out.append({"type": "content_block_stop", "index": index})
        return out

    def _tool_use(self, event: ToolCallEvent) -> list[dict[str, Any]]:
        call = event.call
        arguments = call.arguments if call.arguments.strip() else "{}"
        block = {
            "type": "tool_use",
            "id": new_block_id("toolu"),
            "name": call.name,
            "input": json.loads(arguments),
        }
        self.blocks.append(block)
        index = len(self.blocks) - 1
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return [
            {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]


# ---------------------------------------------------------------------------------------- the message


def stop_reason(
    finish_reason: str,
    *,
    tool_uses: int,
    last_token: int | None,
    model_stops: Sequence[int],
    budget: int,
    asked: int,
) -> StopReason:
    """Why the message ended. A stop that is not the model's own end of turn is one of the request's stop
    sequences (the generator names it: `Step.stop_string`). A length stop is
    `max_tokens` when the request's own budget ran out, else the context did (the budget was lowered)."""
    if finish_reason == "length":
        return "max_tokens" if budget >= asked else "model_context_window_exceeded"
    if tool_uses:
        return "tool_use"
    if last_token is None or last_token in model_stops:
        return "end_turn"
    return "stop_sequence"


def messages_usage(stats: GenerationStats) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are the prompt tokens not read from the prefix cache, which counts
    as `cache_read_input_tokens` (their sum is the prompt); nothing is ever written to a cache by request."""
    cached = stats.cached_tokens
    return {
        "input_tokens": stats.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": stats.completion_tokens,
    }


@dataclass
class MessageShell:
    """What every state of one message shares: its id and model."""

    model: str
    id: str = field(default_factory=lambda: new_block_id("msg"))

    def body(
        self,
        content: list[dict[str, Any]],
        usage: dict[str, Any],
        stop_reason: str | None = None,
        stop_sequence: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": json.loads(json.dumps(content)),  # a snapshot: the blocks keep growing after it
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }
