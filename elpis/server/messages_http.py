"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: the request runs as the chat request it turns
into (`messages_request`), through the server's shared chat path (`OpenAIServer._launch_chat`: prompt,
budget, tool decoder, grammar, thinking budget, scheduler), and its output is rendered in Anthropic's shapes
(`messages_output`), whole or as typed SSE events.

A stream sends `message_start` at once (also while the request waits in the queue; `ping` events while
waiting), then each content block's `content_block_start`, deltas and `content_block_stop` as tokens are
committed, then `message_delta` (stop reason, final usage) and `message_stop`. A failure after the 200 is an
`error` event, and the stream ends there. A client that leaves cancels the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from elpis.server import sse
from elpis.server.app import ChatRun, ClientGone, OpenAIServer
from elpis.server.channels import TextEvent, ToolCallEvent
from elpis.server.errors import APIError, anthropic_error_body
from elpis.server.messages_output import (
    BlockBuilder,
    MessageShell,
    messages_usage,
    stop_reason,
)
from elpis.server.messages_request import (
    MESSAGES_IGNORED,
    CountTokensRequest,
    MessagesRequest,
    chat_body,
    messages_vocabulary,
)
from elpis.server.protocol import ChatRequest, RenderRequest, validate_request
from elpis.server.service import ModelService
from elpis.spec import Step

log = logging.getLogger("elpis.server")
PING = {"type": "ping"}


async def create_message(server: OpenAIServer, request: web.Request) -> web.StreamResponse:
    service = server.ready()
    asked = validate_request(MessagesRequest, await server.read_json(request), MESSAGES_IGNORED)
    server._check_model(service, asked.model)
    translated = chat_body(asked)  # its own errors name this request's fields already
    with messages_vocabulary():
        chat = validate_request(ChatRequest, translated)
        run = await server._launch_chat(service, chat, fit_context=True)
    shell = MessageShell(service.model_id)
    show_thinking = asked.thinking is None or asked.thinking.display != "omitted"
    try:
        if asked.stream:
            return await _stream(server, request, service, asked, run, shell, BlockBuilder(show_thinking))
        return await _whole(server, service, asked, run, shell, BlockBuilder(show_thinking))
    finally:
        server._abandon(run.job)


async def count_tokens(server: OpenAIServer, request: web.Request) -> web.Response:
    """The prompt's length in tokens, rendered as `/v1/messages` would render it; nothing is generated."""
    service = server.ready()
    asked = validate_request(CountTokensRequest, await server.read_json(request), MESSAGES_IGNORED)
    server._check_model(service, asked.model)
    translated = chat_body(asked)
    with messages_vocabulary():
        chat = validate_request(RenderRequest, translated)
        _, ids = await asyncio.to_thread(server._prepare_chat, service, chat)
    return web.json_response({"input_tokens": len(ids)})


def _ending(service: ModelService, asked: MessagesRequest, run: ChatRun, builder: BlockBuilder, final: Step,
            token_ids: Sequence[int]) -> tuple[str, str | None]:
    """The stop reason and the matched stop sequence (the generator's: `Step.stop_string`)."""
    assert final.finish_reason is not None
    reason = stop_reason(
        final.finish_reason,
        tool_uses=builder.tool_uses,
        last_token=token_ids[-1] if token_ids else None,
        model_stops=service.generator.backend.info.stop_token_ids,
        budget=run.max_tokens,
        asked=asked.max_tokens,
    )
    if reason != "stop_sequence":
        return reason, None
    if final.stop_string is None:  # not expected: a stop neither the model's nor one of the sequences
        log.warning("[serve] a stop the model did not make matched no stop sequence")
        return "end_turn", None
    return reason, final.stop_string


async def _whole(
    server: OpenAIServer,
    service: ModelService,
    asked: MessagesRequest,
    run: ChatRun,
    shell: MessageShell,
    builder: BlockBuilder,
) -> web.Response:

    async def collect(events: list[TextEvent | ToolCallEvent]) -> None:
        builder.feed(events)

    final, token_ids = await server._relay(run, collect)  # a failed job raises its error (503 ...)
    assert final.stats is not None
    builder.finish()
    reason, sequence = _ending(service, asked, run, builder, final, token_ids)
    return web.json_response(shell.body(builder.blocks, messages_usage(final.stats), reason, sequence))


async def _stream(
    server: OpenAIServer,
    request: web.Request,
    service: ModelService,
    asked: MessagesRequest,
    run: ChatRun,
    shell: MessageShell,
    builder: BlockBuilder,
) -> web.StreamResponse:
    response, write = await server._open_stream(request)

    async def send(event: dict[str, Any]) -> None:
        await write(sse.event_frame(event))

    async def fail(error: APIError) -> None:
        await send(anthropic_error_body(error))

    async def ping() -> None:
        await send(PING)

    async def relay(events: list[TextEvent | ToolCallEvent]) -> None:
        for event in builder.feed(events):
            await send(event)

    try:
        # The cache is not consulted until the job runs: until the final usage, the whole prompt is input.
        start = {
            "input_tokens": len(run.prompt_ids),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        }
        await send({"type": "message_start", "message": shell.body([], start)})
        try:
            final, token_ids = await server._relay(run, relay, ping)
        except APIError as error:  # the job failed, or the shutdown cut it
            await fail(error)
            return response
        assert final.stats is not None
        for event in builder.finish():
            await send(event)
        reason, sequence = _ending(service, asked, run, builder, final, token_ids)
        await send(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": messages_usage(final.stats),
            }
        )
        await send({"type": "message_stop"})
    except ClientGone as gone:
        log.info("[serve] stream ended early: %s", gone)
    except Exception as exc:  # the 200 is already out: report in the stream
        log.error("[serve] internal error while streaming: %s", type(exc).__name__, exc_info=exc)
        with contextlib.suppress(ClientGone):
            await fail(APIError(500, "internal server error", "internal_error"))
    return response
