"""OpenAI response bodies: usage, logprobs, chat and completion objects and stream chunks."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from elpis.server.channels import TextEvent, ToolCallEvent
from elpis.spec import GenerationStats


def usage(stats: GenerationStats) -> dict[str, Any]:
    """OpenAI usage plus cached tokens and speculation stats.

    `committed_tokens` counts the tokens the rounds delivered (= completion_tokens); tokens the acceptor
    committed past a stop string in the last round are cut from the answer and counted apart, as
    `discarded_tokens`, so committed_tokens <= completion_tokens always holds.
    """
    delivered = stats.completion_tokens
    discarded = max(0, sum(stats.committed_per_round) - delivered)
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": delivered,
        "total_tokens": stats.prompt_tokens + delivered,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "speculation": {
            "rounds": stats.rounds,
            "committed_tokens": delivered,
            "tokens_per_round": round(delivered / stats.rounds, 4) if stats.rounds else 0.0,
            "accepted_draft_tokens": sum(stats.accepted_depths),
            "verified_rows": sum(stats.tree_rows),
            "discarded_tokens": discarded,
            # Faults the integrity checks detected (by kind; each discards its attempt, but for a result of
            # a round on the device, which is fetched again) and rounds committed after one.
            "faults_detected": dict(sorted(stats.faults_detected.items())),
            "rounds_recovered": stats.rounds_recovered,
        },
    }


TokenText = Callable[[int], str]
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


def _logprob_value(value: float) -> float:
    return max(value, -9999.0)  # -inf is not JSON


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    content = []
    for token_id, logprob, alternatives in entries:
        text = token_text(token_id)
        content.append(
            {
                "token": text,
                "logprob": _logprob_value(logprob),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": (alt := token_text(alt_id)),
                        "logprob": _logprob_value(alt_lp),
                        "bytes": list(alt.encode("utf-8")),
                    }
                    for alt_id, alt_lp in alternatives
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    entries: Sequence[TokenLogprob], token_text: TokenText, offset: int
) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for token_id, logprob, alternatives in entries:
        text = token_text(token_id)
        tokens.append(text)
        values.append(_logprob_value(logprob))
        tops.append({token_text(alt_id): _logprob_value(alt_lp) for alt_id, alt_lp in alternatives})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


@dataclass
class ChatTurn:
    """A whole chat answer, folded from the splitter's events (the same events a stream sends)."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, events: Sequence[TextEvent | ToolCallEvent]) -> None:
        for event in events:
            if isinstance(event, ToolCallEvent):
                self.tool_calls.append(tool_call_object(event))
            elif event.channel == "reasoning":
                self.reasoning.append(event.text)
            else:
                self.content.append(event.text)

    def message(self, saw_reasoning: bool) -> dict[str, Any]:
        content = "".join(self.content)
        out: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.tool_calls and not content else content,
            "reasoning_content": "".join(self.reasoning) if saw_reasoning else None,
        }
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def tool_call_object(event: ToolCallEvent) -> dict[str, Any]:
    call = event.call
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass
class ResponseHead:
    """What every object and chunk of one response shares."""

    id: str
    model: str
    object: str
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
