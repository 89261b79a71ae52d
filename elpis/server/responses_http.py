"""`POST /v1/responses`: the request runs as the chat request it translates to (`responses_request`), through
the server's shared chat path (`OpenAIServer._launch_chat`: prompt, budget, tool decoder, grammar, scheduler),
and its output is rendered in the Responses shapes (`responses_output`), whole or as typed SSE events.

A stream sends `response.created` and `response.in_progress` at once (also while the request waits in the
queue), then each output item's events as tokens are committed, then `response.completed`, or
`response.incomplete` when `max_output_tokens` cut the answer. A failure after the 200 is `response.failed`
with the error. There is no `[DONE]` in this API. A client that leaves cancels the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from elpis.server import sse
from elpis.server.app import ChatRun, ClientGone, OpenAIServer
from elpis.server.channels import TextEvent, ToolCallEvent
from elpis.server.errors import APIError
from elpis.server.protocol import ChatRequest, validate_request
from elpis.server.responses_output import OutputBuilder, ResponseShell, reasoning_tokens, responses_usage
from elpis.server.responses_request import (
    RESPONSES_IGNORED,
    ResponsesRequest,
    chat_body,
    responses_vocabulary,
)
from elpis.server.service import ModelService
from elpis.spec import Step

log = logging.getLogger("elpis.server")


async def create_response(server: OpenAIServer, request: web.Request) -> web.StreamResponse:
    service = server.ready()
    asked = validate_request(ResponsesRequest, await server.read_json(request), RESPONSES_IGNORED)
    server._check_model(service, asked.model)
    with responses_vocabulary():
        chat = validate_request(ChatRequest, chat_body(asked))
        run = await server._launch_chat(service, chat)
    shell = ResponseShell(service.model_id, asked.settings())
    try:
        if asked.stream:
            return await _stream(server, request, service, run, shell)
        return await _whole(server, service, run, shell)
    finally:
        server._abandon(run.job)


def _status(step: Step) -> str:
    return "incomplete" if step.finish_reason == "length" else "completed"


async def _usage(
    service: ModelService, run: ChatRun, final: Step, token_ids: Sequence[int]
) -> dict[str, Any]:
    assert final.stats is not None

    def decode(ids: Sequence[int]) -> str:
        return service.tokenizer.decode(ids, skip_special=False)

    reasoning = await asyncio.to_thread(reasoning_tokens, decode, token_ids, run.splitter.saw_reasoning)
    return responses_usage(final.stats, reasoning)


async def _whole(
    server: OpenAIServer, service: ModelService, run: ChatRun, shell: ResponseShell
) -> web.Response:
    builder = OutputBuilder()

    async def collect(events: list[TextEvent | ToolCallEvent]) -> None:
        builder.feed(events)

    final, token_ids = await server._relay(run, collect)  # a failed job raises its error (503 ...)
    status = _status(final)
    builder.finish(status)
    return web.json_response(shell.body(status, builder, await _usage(service, run, final, token_ids)))


async def _stream(
    server: OpenAIServer, request: web.Request, service: ModelService, run: ChatRun, shell: ResponseShell
) -> web.StreamResponse:
    response, write = await server._open_stream(request)
    numbers = itertools.count()
    builder = OutputBuilder()

    async def send(event: dict[str, Any]) -> None:
        await write(sse.event_frame({**event, "sequence_number": next(numbers)}))

    async def fail(error: APIError) -> None:
        body = {"code": error.code, "message": error.message}
        await send({"type": "response.failed", "response": shell.body("failed", builder, error=body)})

    async def keepalive() -> None:
        await write(sse.KEEPALIVE)

    async def relay(events: list[TextEvent | ToolCallEvent]) -> None:
        for event in builder.feed(events):
            await send(event)

    try:
        await send({"type": "response.created", "response": shell.body("in_progress")})
        await send({"type": "response.in_progress", "response": shell.body("in_progress")})
        try:
            final, token_ids = await server._relay(run, relay, keepalive)
        except APIError as error:  # the job failed, or the shutdown cut it
            await fail(error)
            return response
        status = _status(final)
        for event in builder.finish(status):
            await send(event)
        usage = await _usage(service, run, final, token_ids)
        await send({"type": f"response.{status}", "response": shell.body(status, builder, usage)})
    except ClientGone as gone:
        log.info("[serve] stream ended early: %s", gone)
    except Exception as exc:  # the 200 is already out: report in the stream
        log.error("[serve] internal error while streaming: %s", type(exc).__name__, exc_info=exc)
        with contextlib.suppress(ClientGone):
            await fail(APIError(500, "internal server error", "internal_error"))
    return response
