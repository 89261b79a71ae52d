"""Talking to any OpenAI-compatible server: key file, connection, served model, usage extras.

Shared by the evaluation lanes (`elpis eval`) and the served GSM8K workload (`elpis bench gsm8k`).
Requests are sent one at a time and never retried: a failed request is an error, not a silent retry.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import openai


class ClientError(RuntimeError):
    """A user-facing problem talking to the server (bad URL, key, model, or a failed request)."""


def read_api_key(path: Path) -> str:
    """The key in `path`: a regular file holding one line of printable ASCII (a trailing newline is fine)."""
    try:
        info = path.lstat()
    except OSError as exc:
        raise ClientError(f"cannot read API key file {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise ClientError(f"API key file {path} is not a regular file")
    key = path.read_text(encoding="ascii", errors="replace").removesuffix("\n").removesuffix("\r")
    if not key or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ClientError(f"API key file {path} must hold one non-empty line of printable ASCII")
    return key


def base_url(url: str) -> str:
    """Accept the server root or its `/v1` URL; return the `/v1` base the OpenAI client wants."""
    trimmed = url.rstrip("/")
    if not trimmed.startswith(("http://", "https://")):
        raise ClientError(f"--url must start with http:// or https://, got {url!r}")
    return trimmed if trimmed.endswith("/v1") else trimmed + "/v1"


def connect(url: str, api_key_file: Path | None, timeout: float) -> openai.OpenAI:
    key = read_api_key(api_key_file) if api_key_file is not None else "none"
    return openai.OpenAI(base_url=base_url(url), api_key=key, max_retries=0, timeout=timeout)


def served_model(client: openai.OpenAI, requested: str | None) -> str:
    """The model to ask for: `requested` if the server lists it, else the server's only model."""
    try:
        ids = [model.id for model in client.models.list()]
    except openai.AuthenticationError as exc:
        raise ClientError("the server refused the API key (401)") from exc
    except openai.APIConnectionError as exc:
        raise ClientError(f"cannot reach the server at {client.base_url}: {exc}") from exc
    except openai.APIError as exc:
        raise ClientError(f"GET /v1/models failed: {exc}") from exc
    if requested is not None:
        if requested not in ids:
            raise ClientError(f"the server does not serve model {requested!r} (it serves {ids})")
        return requested
    if len(ids) != 1:
        raise ClientError(f"the server serves {len(ids)} models {ids}: choose one with --model")
    return ids[0]


# Where a server may put speculation statistics inside `usage`: elpis's own block first
# (`speculation: {rounds, committed_tokens, ...}`), then the published EXL3 server's (`exl3_spec: {rounds,
# committed}`).
SPEC_USAGE_KEYS = ("speculation", "exl3_spec")


def speculation_stats(usage: Any) -> dict[str, int] | None:
    """`{"rounds": R, "committed": C}` from a response's `usage` block, or None if the server sent none.

    Refuses inconsistent numbers (negative counts, committed tokens beyond the completion). Committed
    tokens may be fewer than rounds: a round whose tokens all fall after a stop string delivers none.
    """
    if usage is None:
        return None
    extra = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
    for key in SPEC_USAGE_KEYS:
        block = extra.get(key)
        if not isinstance(block, dict) or not isinstance(block.get("rounds"), int):
            continue
        committed = block.get("committed_tokens", block.get("committed"))
        if not isinstance(committed, int):
            raise ClientError(f"usage.{key} has rounds but no committed token count")
        rounds, completion = block["rounds"], extra.get("completion_tokens")
        if rounds < 0 or committed < 0 or (isinstance(completion, int) and committed > completion):
            raise ClientError(
                f"usage.{key} is inconsistent: {rounds} rounds, {committed} committed, "
                f"{completion} completion tokens"
            )
        return {"rounds": rounds, "committed": committed}
    return None


def request_error(exc: openai.APIError) -> ClientError:
    status = getattr(exc, "status_code", None)
    where = f"HTTP {status}" if status is not None else type(exc).__name__
    return ClientError(f"request failed ({where}): {exc}")
