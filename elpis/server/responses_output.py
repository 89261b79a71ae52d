"""Responses API output: output items, the response object, its usage, and the typed stream events.

`OutputBuilder` folds the channel splitter's events (the same events chat is built from) into output items
and says each change as a stream event, so a streamed response and a whole one are the same fold and can
never disagree. Items appear in the order the model wrote them: a `reasoning` item (its text as one
`reasoning_text` part), a `message` item (one `output_text` part), one `function_call` item per call.
Calls are decoded whole (`channels.OutputSplitter`), so each call's arguments come as one delta.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from elpis.server.channels import THINK_CLOSE, Event, ToolCallEvent
from elpis.server.responses import usage as chat_usage
from elpis.spec import GenerationStats

Status = Literal["completed", "incomplete"]
_PART_TYPE = {"message": "output_text", "reasoning": "reasoning_text"}
_DELTA = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class OutputBuilder:
    """Output items folded from splitter events; `feed` and `finish` return the stream events (without
    `sequence_number`, which the writer numbers)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the reasoning or message item whose text still grows

    def feed(self, events: Sequence[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ToolCallEvent):
                out += self._close("completed")
                out += self._call(event)
                continue
            kind = "reasoning" if event.channel == "reasoning" else "message"
            if self._open is None or self._open["type"] != kind:
                out += self._close("completed")
                out += self._begin(kind)
            out += self._delta(event.text)
        return out

    def finish(self, status: Status) -> list[dict[str, Any]]:
        """Close the open item (`incomplete` when the response is). A response without a message or a call
        still gets a message, empty, so every answer has one place for its text."""
        out = self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            out += self._begin("message")
            out += self._close(status)
        return out

    def output_text(self) -> str:
        return "".join(item["content"][0]["text"] for item in self.items if item["type"] == "message")

    def reasoning_text(self) -> str:
        return "".join(item["content"][0]["text"] for item in self.items if item["type"] == "reasoning")

    # --------------------------------------------------------------------------------------- the steps

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def _begin(self, kind: Literal["message", "reasoning"]) -> list[dict[str, Any]]:
        if kind == "message":
            item: dict[str, Any] = {
                "id": new_item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            item = {
                "id": new_item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
                "encrypted_content": None,
            }
        self.items.append(item)
        self._open = item
        added = {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": _copy(item),
        }
        item["content"].append(_part(kind, ""))
        part = {
            "type": "response.content_part.added",
            **self._where(item),
            "content_index": 0,
            "part": _part(kind, ""),
        }
        return [added, part]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        event = {
            "type": _DELTA[item["type"]] + ".delta",
            **self._where(item),
            "content_index": 0,
            "delta": text,
        }
        if item["type"] == "message":
            event["logprobs"] = []
        return [event]

    def _close(self, status: Status) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        text = item["content"][0]["text"]
        done = {"type": _DELTA[item["type"]] + ".done", **self._where(item), "content_index": 0, "text": text}
        if item["type"] == "message":
            done["logprobs"] = []
        part = {
            "type": "response.content_part.done",
            **self._where(item),
            "content_index": 0,
            "part": _copy(item["content"][0]),
        }
        whole = {
            "type": "response.output_item.done",
            "output_index": self.items.index(item),
            "item": _copy(item),
        }
        return [done, part, whole]

    def _call(self, event: ToolCallEvent) -> list[dict[str, Any]]:
        call = event.call
        item: dict[str, Any] = {
            "id": new_item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        self.items.append(item)
        added = {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": _copy(item),
        }
        item.update(arguments=call.arguments, status="completed")
        where = self._where(item)
        return [
            added,
            {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments},
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(item)},
        ]


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "reasoning_text", "text": text}


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value))  # events carry snapshots: the items keep growing after them


# ---------------------------------------------------------------------------------------- the response


def reasoning_tokens(decode: Callable[[Sequence[int]], str], token_ids: Sequence[int], reasoned: bool) -> int:
    """Generated tokens up to and including the one that completes `</think>` (all of them if it never
    came; 0 without reasoning). The shortest prefix whose text holds the marker, by bisection: a longer
    prefix's text starts with a shorter one's, so holding the marker is monotone in the prefix length."""
    if not reasoned:
        return 0
    if THINK_CLOSE not in decode(token_ids):
        return len(token_ids)
    low, high = 1, len(token_ids)  # decode(token_ids[:high]) holds the marker
    while low < high:
        middle = (low + high) // 2
        if THINK_CLOSE in decode(token_ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return high


def responses_usage(stats: GenerationStats, reasoning: int) -> dict[str, Any]:
    """The Responses usage shape, plus chat's speculation statistics."""
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "speculation": chat_usage(stats)["speculation"],
    }


@dataclass
class ResponseShell:
    """What every state of one response object shares: its id, model, creation time and echoed settings."""

    model: str
    settings: dict[str, Any]
    id: str = field(default_factory=lambda: new_item_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        builder: OutputBuilder | None = None,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        output = _copy({"items": builder.items})["items"] if builder is not None else []
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "output_text": builder.output_text() if builder is not None else "",
            "usage": usage,
            **self.settings,
        }
