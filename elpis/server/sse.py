"""Server-sent events framing (text/event-stream), as OpenAI clients read it."""

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
