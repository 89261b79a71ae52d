"""Split a chat completion's text deltas into reasoning, content and tool calls, as they stream.

One pure state machine over text deltas, used for both streamed and whole answers (a whole answer is
the fold of its events), so the two can never disagree:

- reasoning: from an open `<think>` (already open when the prompt ends with `<think>`, as Qwen3.8's does
  with thinking on; otherwise only when the answer starts with `<think>`) to `</think>`; leading and
  trailing space is trimmed.
- content: everything else; the space right after `</think>` or after a tool call is trimmed.
- tool calls (only when the request enables them): each `<tool_call>...</tool_call>` block that scans and
  decodes cleanly becomes one call event, emitted as soon as its block closes. A block that cannot be a
  call is returned as content, and the reason is recorded and logged (never the text).

A tail that may still turn into a marker (`</think>`, `<tool_call>`) or trailing space that a marker
would trim is held back, and only until the next delta decides it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from elpis.server.holdback import partial_marker_len, trailing_space_len
from elpis.server.toolcalls import TOOL_CALL_OPEN, ToolCall, ToolCallDecoder, scan_call

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

log = logging.getLogger("elpis.server")


@dataclass(frozen=True)
class TextEvent:
    channel: Literal["reasoning", "content"]
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    index: int
    call: ToolCall


Event = TextEvent | ToolCallEvent


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt leaves a `<think>` block open (generation starts in reasoning)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


class OutputSplitter:
    def __init__(self, *, starts_in_reasoning: bool, tools: ToolCallDecoder | None = None) -> None:
        self._state: Literal["start", "reasoning", "content", "call"] = (
            "reasoning" if starts_in_reasoning else "start"
        )
        self._tools = tools
        self._pending = ""
        self._trim_leading = starts_in_reasoning
        self._events: list[Event] = []
        self._space_before_call = ""  # trimmed before a call; given back if the call is refused
        self.saw_reasoning = starts_in_reasoning
        self.tool_calls = 0
        self.problems: list[str] = []  # why markup was returned as content

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        self._run(final=False, stopped=False)
        return self._take()

    def finish(self, stopped: bool) -> list[Event]:
        """Flush at the end of the answer; `stopped` is False when it was cut off (max_tokens, cancel)."""
        self._run(final=True, stopped=stopped)
        return self._take()

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _emit(self, channel: Literal["reasoning", "content"], text: str) -> None:
        if not text:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, TextEvent) and last.channel == channel:
            self._events[-1] = TextEvent(channel, last.text + text)
        else:
            self._events.append(TextEvent(channel, text))

    def _problem(self, reason: str) -> None:
        self.problems.append(reason)
        log.warning("[tool] unparsed: %s", reason)

    def _run(self, *, final: bool, stopped: bool) -> None:
        # Every pass either consumes text, changes state, or returns: the loop always ends.
        while True:
            if self._state == "start":
                if not self._start(final):
                    return
            elif self._state == "reasoning":
                if not self._reasoning(final):
                    return
            elif self._state == "content":
                if not self._content(final):
                    return
            elif not self._call(final, stopped):
                return

    def _start(self, final: bool) -> bool:
        head = self._pending.lstrip()
        if head.startswith(THINK_OPEN):
            self._pending = head[len(THINK_OPEN) :]
            self._state, self._trim_leading, self.saw_reasoning = "reasoning", True, True
            return True
        if not final and THINK_OPEN.startswith(head):
            return False  # still could be `<think>`
        self._state = "content"
        return True

    def _trim(self) -> bool:
        """Drop leading space while trimming is on; False when nothing is left to look at yet."""
        if self._trim_leading:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._trim_leading = False
        return True

    def _reasoning(self, final: bool) -> bool:
        if not self._trim():
            return False
        end = self._pending.find(THINK_CLOSE)
        if end >= 0:
            self._emit("reasoning", self._pending[:end].rstrip())
            self._pending = self._pending[end + len(THINK_CLOSE) :]
            self._state, self._trim_leading = "content", True
            return True
        if final:
            self._emit("reasoning", self._pending.rstrip())
            self._pending = ""
            return False
        self._release("reasoning", (THINK_CLOSE,))
        return False

    def _content(self, final: bool) -> bool:
        if not self._trim():
            return False
        if self._tools is None:
            self._emit("content", self._pending)
            self._pending = ""
            return False
        start = self._pending.find(TOOL_CALL_OPEN)
        if start >= 0:
            before = self._pending[:start]
            text = before.rstrip()
            self._emit("content", text)
            self._space_before_call = before[len(text) :]
            self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
            self._state = "call"
            return True
        if final:
            self._emit("content", self._pending)
            self._pending = ""
            return False
        self._release("content", (TOOL_CALL_OPEN,))
        return False

    def _release(self, channel: Literal["reasoning", "content"], markers: tuple[str, ...]) -> None:
        """Emit what cannot be part of a marker; keep a possible marker start and trailing space."""
        keep = partial_marker_len(self._pending, markers)
        ready = self._pending[: len(self._pending) - keep]
        ready_len = len(ready) - trailing_space_len(ready)
        self._emit(channel, self._pending[:ready_len])
        self._pending = self._pending[ready_len:]

    def _call(self, final: bool, stopped: bool) -> bool:
        assert self._tools is not None
        scan = scan_call(self._pending, final=final, close_at_end=stopped, check_name=self._tools.check_name)
        if scan.status == "incomplete":
            return False
        if scan.status == "invalid":
            # Give back the opening tag as text and read on: a later block may still be a call.
            self._problem(scan.reason)
            self._emit("content", self._space_before_call + TOOL_CALL_OPEN)
            self._state = "content"
            return True
        assert scan.call is not None
        decoded = self._tools.decode(scan.call, self.tool_calls)
        if isinstance(decoded, str):
            self._problem(decoded)
            self._emit("content", self._space_before_call + TOOL_CALL_OPEN + self._pending[: scan.end])
        else:
            self._events.append(ToolCallEvent(self.tool_calls, decoded))
            self.tool_calls += 1
        self._pending = self._pending[scan.end :]
        self._state, self._trim_leading = "content", True
        return True
