"""Server-sent events framing (text/event-stream): chat's data-only frames, as OpenAI clients read them, and
the typed frames of the Responses and Messages APIs."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # reverse proxies must not buffer a token stream
}


def data_frame(payload: dict[str, Any]) -> bytes:
    return (
        b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"
    )


def event_frame(event: dict[str, Any]) -> bytes:
    """One typed event (the Responses and Messages APIs): `event: <its type>`, then its JSON."""
    return b"event: " + event["type"].encode("utf-8") + b"\n" + data_frame(event)
