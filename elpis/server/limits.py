"""Server limits and timeouts, with their defaults (the CLI exposes each one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024
    header_timeout_s: float = 60.0
    body_timeout_s: float = 300.0
    write_timeout_s: float = 60.0
    keepalive_s: float = 10.0  # SSE comment after this long without a write
    max_queue: int = 64
    shutdown_grace_s: float = 30.0  # the running request may finish for this long on SIGTERM
    default_chat_max_tokens: int = 4096
    default_completion_max_tokens: int = 256
    # reasoning tokens at most for chat requests that name no budget (`thinking_token_budget`); None: none
    default_thinking_budget: int | None = None
