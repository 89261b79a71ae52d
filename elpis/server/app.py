"""The aiohttp application: routes, authentication, body limits, and the request -> job -> response path.

Data flows one way: body -> pydantic model -> prompt tokens (template + tokenizer, off the event loop) ->
a generation job on the scheduler's engine thread -> steps -> channel splitter -> JSON or SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from elpis.server import sse
from elpis.server.auth import Authorizer
from elpis.server.channels import (
    OutputSplitter,
    TextEvent,
    ToolCallEvent,
    prompt_opens_reasoning,
)
from elpis.server.errors import APIError, anthropic_error_body, bad_request
from elpis.server.grammars import completion_grammar, request_grammar
from elpis.server.limits import Limits
from elpis.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from elpis.server.metrics import Metrics
from elpis.server.prompting import chat_input, render_chat
from elpis.server.protocol import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    NamedToolChoice,
    RenderRequest,
    SamplingFields,
    TokenizeRequest,
    parse_json_body,
    validate_request,
)
from elpis.server.responses import (
    ChatTurn,
    ResponseHead,
    chat_logprobs,
    completion_logprobs,
    new_id,
    tool_call_object,
    usage,
)
from elpis.server.scheduler import Job, JobEnd, Scheduler
from elpis.server.service import ModelService
from elpis.server.thinking import thinking_budget
from elpis.server.toolcalls import ToolCallDecoder
from elpis.spec import GenerationRequest, SamplingParams, Step
from elpis.spec.grammar import Grammar
from elpis.spec.thinking import ThinkingBudget

log = logging.getLogger("elpis.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"})  # everything else needs the API key
ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's Messages API: its errors come in Anthropic's envelope


class ClientGone(Exception):
    """The client closed the connection or stopped reading."""


@dataclass(frozen=True)
class ChatRun:
    """A chat request on its way: its job on the queue, the splitter its text goes through, its prompt."""

    job: Job
    splitter: OutputSplitter
    prompt_ids: list[int]
    max_tokens: int  # the budget it runs with (what was asked, or what fits; see _launch_chat)


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_response(err: APIError, anthropic: bool = False) -> web.Response:
    headers = dict(err.headers)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    body = anthropic_error_body(err) if anthropic else err.body()
    response = web.json_response(body, status=err.status, headers=headers)
    if err.close:
        response.force_close()
    return response


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def _check_in_vocabulary(service: ModelService, ids: Sequence[int], what: str, param: str) -> None:
    """Refuse token ids outside the model's vocabulary (400), naming them as `what` and the field `param`."""
    bad = [i for i in ids if not 0 <= i < service.vocab_size]
    if bad:
        raise bad_request(f"{what} {bad[:4]} are outside the vocabulary (0..{service.vocab_size - 1})", param)


class OpenAIServer:
    def __init__(
        self, authorizer: Authorizer, limits: Limits | None = None, service: ModelService | None = None
    ):
        self.authorizer = authorizer
        self.limits = limits or Limits()
        self.service = service
        self.load_failure: str | None = None
        self.scheduler = Scheduler(self.limits.max_queue)
        self.metrics = Metrics()

    # ---------------------------------------------------------------------------------------- the app

    def make_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self._auth], client_max_size=self.limits.max_body_bytes
        )
        app.on_startup.append(self._startup)
        routes = [
            ("GET", "/health", self.health),
            ("GET", "/v1/models", self.models),
            ("GET", "/v1/models/{model}", self.model),
            ("GET", "/metrics", self.prometheus),
            ("POST", "/v1/chat/completions", self.chat),
            ("POST", "/v1/chat/completions/render", self.render),
            ("POST", "/v1/completions", self.completions),
            ("POST", "/v1/responses", self.responses),
            ("POST", "/v1/messages", self.messages),
            ("POST", "/v1/messages/count_tokens", self.count_message_tokens),
            ("POST", "/tokenize", self.tokenize),
            ("POST", "/detokenize", self.detokenize),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler, expect_handler=self._expect)
        return app

    async def _startup(self, app: web.Application) -> None:
        self.scheduler.start()

    def set_service(self, service: ModelService) -> None:
        self.service = service
        log.info("[serve] ready: %s", service.describe())

    def set_load_failure(self, reason: str) -> None:
        self.load_failure = reason
        log.error("[serve] model failed to load: %s", reason)

    # ---------------------------------------------------------------------------------- middlewares

    def _authorized(self, request: web.Request) -> bool:
        return request.path in OPEN_PATHS or self.authorizer.allows_request(
            request.headers.getall("Authorization", []), request.headers.getall("x-api-key", [])
        )

    @staticmethod
    def _unauthorized() -> APIError:
        return APIError(
            401,
            "missing or invalid API key (Authorization: Bearer <key>, or x-api-key: <key>)",
            "invalid_api_key",
            close=True,
        )

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        # `Expect: 100-continue`: answer auth and size problems before the client sends the body.
        anthropic = is_anthropic(request.path)
        if not self._authorized(request):
            return error_response(self._unauthorized(), anthropic)
        if request.content_length is not None and request.content_length > self.limits.max_body_bytes:
            return error_response(self._too_large(), anthropic)
        return await _default_expect_handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._authorized(request):
            raise self._unauthorized()  # the body is never read
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "other"
        anthropic = is_anthropic(request.path)
        try:
            response = await handler(request)
        except APIError as err:
            response = error_response(err, anthropic)
        except web.HTTPException as exc:
            code = _HTTP_CODES.get(exc.status, "invalid_request")
            message = "not found" if exc.status == 404 else exc.reason
            response = error_response(APIError(exc.status, message, code, close=exc.status == 413), anthropic)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            log.error("[serve] internal error: %s", type(exc).__name__, exc_info=exc)
            response = error_response(APIError(500, "internal server error", "internal_error"), anthropic)
        self.metrics.request_done(endpoint, response.status)
        return response

    # --------------------------------------------------------------------------------------- helpers

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than {self.limits.max_body_bytes} bytes",
            "body_too_large",
            close=True,
        )

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while chunk := await request.content.read(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large()
                    chunks.append(chunk)
        except TimeoutError:
            raise APIError(
                408, "the request body did not arrive in time", "request_timeout", close=True
            ) from None
        if not chunks:
            raise bad_request("the request body is empty; send a JSON object")
        return parse_json_body(b"".join(chunks))

    def ready(self) -> ModelService:
        if self.scheduler.failure is not None:
            raise APIError(503, "the engine failed and the server needs a restart", "generation_failed")
        if self.scheduler.shutting_down:
            raise APIError(503, "the server is shutting down", "server_shutting_down")
        if self.load_failure is not None:
            raise APIError(503, "the model failed to load", "model_load_failed")
        if self.service is None:
            raise APIError(503, "the model is still loading", "model_loading", headers={"Retry-After": "5"})
        return self.service

    def _check_model(self, service: ModelService, name: str | None) -> None:
        if name is not None and name != service.model_id:
            raise APIError(
                404,
                f"model {name!r} is not served here; this server serves {service.model_id!r}",
                "model_not_found",
                param="model",
            )

    @staticmethod
    def _budget(service: ModelService, prompt_len: int, asked: int | None, default: int) -> int:
        limit = service.max_context
        if prompt_len >= limit:
            raise APIError(
                400,
                f"the prompt has {prompt_len} tokens; the context holds {limit}",
                "context_length_exceeded",
                param="messages",
            )
        if asked is None:
            return min(default, limit - prompt_len)
        if prompt_len + asked > limit:
            raise APIError(
                400,
                f"the prompt ({prompt_len} tokens) plus max_tokens ({asked}) is {prompt_len + asked} tokens, "
                f"more than the context of {limit} tokens",
                "context_length_exceeded",
                param="max_tokens",
            )
        return asked

    @staticmethod
    def _sampling(fields: SamplingFields) -> SamplingParams:
        temperature = float(fields.temperature or 0.0)
        seed = fields.seed
        if seed is None:
            seed = secrets.randbits(63) if temperature > 0 else 0
        return SamplingParams(
            temperature=temperature,
            top_p=1.0 if fields.top_p is None else float(fields.top_p),
            top_k=0 if fields.top_k in (None, -1) else int(fields.top_k),
            min_p=float(fields.min_p or 0.0),
            seed=seed,
            presence_penalty=float(fields.presence_penalty or 0.0),
            frequency_penalty=float(fields.frequency_penalty or 0.0),
            repetition_penalty=1.0 if fields.repetition_penalty is None else float(fields.repetition_penalty),
            logit_bias=fields.bias_pairs(),
        )

    def _start_job(
        self,
        service: ModelService,
        fields: SamplingFields,
        prompt_ids: list[int],
        max_tokens: int,
        top_logprobs: int | None,
        grammar: Grammar | None = None,
        thinking: ThinkingBudget | None = None,
    ) -> Job:
        self._check_token_ids(service, fields)
        stop = threading.Event()
        try:
            request = GenerationRequest(
                prompt_ids=tuple(prompt_ids),
                max_tokens=max_tokens,
                sampling=self._sampling(fields),
                stop_token_ids=fields.stop_ids(),
                stop_strings=fields.stop_strings(),
                ignore_eos=fields.ignore_eos,
                top_logprobs=top_logprobs,
                grammar=grammar,
                thinking=thinking,
            )
            steps: Iterator[Step] = service.generator.generate(request, should_stop=stop.is_set)
        except ValueError as exc:  # the generator checks ids, stops and limits before anything runs
            raise bad_request(str(exc)) from None
        return self.scheduler.submit(lambda should_stop: steps, stop=stop)

    @staticmethod
    def _check_token_ids(service: ModelService, fields: SamplingFields) -> None:
        """Stop and logit_bias ids outside the vocabulary are refused naming the field that holds them."""
        _check_in_vocabulary(service, fields.listed_stop_ids(), "stop token ids", "stop")
        _check_in_vocabulary(service, fields.stop_token_ids or [], "stop token ids", "stop_token_ids")
        biased = [token for token, _ in fields.bias_pairs()]
        _check_in_vocabulary(service, biased, "logit_bias token ids", "logit_bias")

    async def _next_item(self, job: Job, on_idle: Callable[[], Awaitable[None]] | None) -> Any:
        while True:
            try:
                return await job.next(self.limits.keepalive_s if on_idle else None)
            except TimeoutError:
                assert on_idle is not None
                await on_idle()

    async def _job_steps(
        self, job: Job, on_idle: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncIterator[Step]:
        """A job's steps (`on_idle` runs while none comes: a stream's keepalive): a failed job raises its
        error, which a whole answer answers and a stream, its 200 already out, reports in-band; the last step
        is counted."""
        while True:
            item = await self._next_item(job, on_idle)
            if isinstance(item, JobEnd):
                if item.error is not None:
                    raise item.error
                return
            if item.finish_reason is not None:
                self._count_generation(item)
            yield item

    async def _split_steps(
        self, job: Job, splitter: OutputSplitter, on_idle: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncIterator[tuple[Step, list[TextEvent | ToolCallEvent]]]:
        """A chat-shaped job's steps (`_job_steps`), each with the output events its text completes; the
        splitter is finished at the last step. Chat, the Responses API and the Messages API read them."""
        async for step in self._job_steps(job, on_idle):
            events = splitter.feed(step.text)
            if step.finish_reason is not None:
                events += splitter.finish(stopped=step.finish_reason == "stop")
            yield step, events

    async def _relay(
        self,
        run: ChatRun,
        relay: Callable[[list[TextEvent | ToolCallEvent]], Awaitable[None]],
        on_idle: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Step, list[int]]:
        """A chat-shaped job run to its end, each step's output events handed to `relay` (an API's builder:
        a stream's sends them): the last step and every token id. A failed job raises its error and a
        cancelled one the shutdown's (a whole answer answers it; a stream reports it in-band)."""
        token_ids: list[int] = []
        final: Step | None = None
        async for step, events in self._split_steps(run.job, run.splitter, on_idle):
            token_ids += step.token_ids
            if step.finish_reason is not None:
                final = step
            await relay(events)
        assert final is not None and final.stats is not None
        if final.finish_reason == "cancelled":
            raise self._shutdown_cut()
        return final, token_ids

    def _count_generation(self, step: Step) -> None:
        if step.stats is not None:
            stats = step.stats
            self.metrics.generation_done(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                cached_tokens=stats.cached_tokens,
                committed_per_round=stats.committed_per_round,
            )

    def _abandon(self, job: Job) -> None:
        if job.state != "done":
            self.metrics.cancelled += 1
            log.info("[serve] request cancelled: client disconnected")
        self.scheduler.cancel(job)

    @staticmethod
    def _shutdown_cut() -> APIError:
        return APIError(503, "the server is shutting down; the answer was cut off", "server_shutting_down")

    # ------------------------------------------------------------------------------------ endpoints

    async def health(self, request: web.Request) -> web.Response:
        if request.content_length or "Transfer-Encoding" in request.headers:
            raise APIError(400, "GET /health takes no body", close=True)
        try:
            service = self.ready()
        except APIError as err:
            return web.json_response({"status": "unavailable", **err.body()}, status=503)
        return web.json_response({"status": "ok", "model": service.model_id})

    @staticmethod
    def _model_entry(service: ModelService) -> dict[str, Any]:
        return {
            "id": service.model_id,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "elpis",
            "max_model_len": service.max_context,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_entry(self.ready())]})

    async def model(self, request: web.Request) -> web.Response:
        service = self.ready()
        self._check_model(service, request.match_info["model"])
        return web.json_response(self._model_entry(service))

    async def prometheus(self, request: web.Request) -> web.Response:
        text = self.metrics.render(
            queue_depth=self.scheduler.queue_depth,
            running=int(self.scheduler.running is not None),
            healthy=self.scheduler.healthy and self.service is not None,
        )
        return web.Response(text=text, headers={"Content-Type": METRICS_CONTENT_TYPE})

    # ----------------------------------------------------------------------------------------- chat

    def _prepare_chat(self, service: ModelService, request: ChatRequest) -> tuple[str, list[int]]:
        if service.template is None:
            raise bad_request("this model has no chat template; use /v1/completions")
        text = render_chat(service.template, chat_input(request))
        return text, list(service.tokenizer.encode(text, special=True))

    async def render(self, request: web.Request) -> web.Response:
        service = self.ready()
        chat = validate_request(RenderRequest, await self.read_json(request))
        self._check_model(service, chat.model)
        text, ids = await asyncio.to_thread(self._prepare_chat, service, chat)
        asked = chat.output_budget()
        self._budget(service, len(ids), asked, 1)
        return web.json_response({"prompt": text, "token_ids": ids, "count": len(ids)})

    async def _launch_chat(
        self, service: ModelService, chat: ChatRequest, fit_context: bool = False
    ) -> ChatRun:
        """Prompt, budget, tool decoder, splitter and grammar of a chat request, and its job on the queue.
        Shared by /v1/chat/completions, /v1/responses and /v1/messages (which translate their requests into
        chat ones). With `fit_context` an asked budget the context cannot hold is lowered to what it can
        (the Messages API's rule: such an answer ends `model_context_window_exceeded`) instead of a 400."""
        text, prompt_ids = await asyncio.to_thread(self._prepare_chat, service, chat)
        asked = chat.output_budget()
        if fit_context and asked is not None:
            asked = max(1, min(asked, service.max_context - len(prompt_ids)))  # a prompt too long still 400s
        max_tokens = self._budget(service, len(prompt_ids), asked, self.limits.default_chat_max_tokens)
        top_logprobs = (chat.top_logprobs or 0) if chat.logprobs else None
        decoder = None
        if chat.tools_enabled() and chat.tools:
            only = chat.tool_choice.function.name if isinstance(chat.tool_choice, NamedToolChoice) else None
            decoder = ToolCallDecoder(
                {tool.function.name: tool.function.parameters for tool in chat.tools},
                only=only,
                parallel=chat.parallel_tool_calls is not False,
            )
        reasoning = prompt_opens_reasoning(text)
        splitter = OutputSplitter(starts_in_reasoning=reasoning, tools=decoder)
        grammar = await asyncio.to_thread(request_grammar, service, chat, reasoning, decoder)
        asked_thinking = chat.thinking_token_budget
        limit = self.limits.default_thinking_budget if asked_thinking is None else asked_thinking
        thinking = thinking_budget(service, limit, reasoning)
        job = self._start_job(service, chat, prompt_ids, max_tokens, top_logprobs, grammar, thinking)
        return ChatRun(job, splitter, prompt_ids, max_tokens)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        service = self.ready()
        chat = validate_request(ChatRequest, await self.read_json(request))
        self._check_model(service, chat.model)
        run = await self._launch_chat(service, chat)
        job, splitter, prompt_ids = run.job, run.splitter, run.prompt_ids
        head = ResponseHead(new_id("chatcmpl-"), service.model_id, "chat.completion")
        try:
            if chat.stream:
                head.object = "chat.completion.chunk"
                return await self._stream_chat(request, service, chat, job, splitter, prompt_ids, head)
            return await self._whole_chat(service, chat, job, splitter, prompt_ids, head)
        finally:
            self._abandon(job)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        from elpis.server.responses_http import create_response  # imported late: it imports this module

        return await create_response(self, request)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        from elpis.server.messages_http import create_message  # imported late: it imports this module

        return await create_message(self, request)

    async def count_message_tokens(self, request: web.Request) -> web.Response:
        from elpis.server.messages_http import count_tokens

        return await count_tokens(self, request)

    @staticmethod
    def _chat_finish(reason: str, splitter: OutputSplitter, chat: ChatRequest) -> str:
        if reason == "stop" and splitter.tool_calls:
            return "tool_calls"
        if reason == "stop" and chat.tool_choice not in (None, "auto", "none") and not splitter.tool_calls:
            log.warning("[tool] unparsed: tool_choice asked for a call and none was made")
        return reason

    async def _whole_chat(
        self,
        service: ModelService,
        chat: ChatRequest,
        job: Job,
        splitter: OutputSplitter,
        prompt_ids: list[int],
        head: ResponseHead,
    ) -> web.Response:
        turn = ChatTurn()
        token_ids: list[int] = []
        logprobs: list[Any] = []
        final: Step | None = None
        async for step, events in self._split_steps(job, splitter):
            token_ids += step.token_ids
            logprobs += step.logprobs or []
            turn.add(events)
            if step.finish_reason is not None:
                final = step
        assert final is not None and final.stats is not None and final.finish_reason is not None
        if final.finish_reason == "cancelled":
            raise self._shutdown_cut()
        choice: dict[str, Any] = {
            "index": 0,
            "message": turn.message(splitter.saw_reasoning),
            "logprobs": chat_logprobs(logprobs, service.token_text) if chat.logprobs else None,
            "finish_reason": self._chat_finish(final.finish_reason, splitter, chat),
        }
        if chat.return_token_ids:
            choice.update(prompt_token_ids=prompt_ids, token_ids=token_ids)
        return web.json_response(head.envelope([choice], usage=usage(final.stats)))

    async def _open_stream(
        self, request: web.Request
    ) -> tuple[web.StreamResponse, Callable[[bytes], Awaitable[None]]]:
        response = web.StreamResponse(status=200, headers=sse.HEADERS)
        await response.prepare(request)

        async def write(data: bytes) -> None:
            try:
                await asyncio.wait_for(response.write(data), self.limits.write_timeout_s)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                raise ClientGone(type(exc).__name__) from None

        return response, write

    async def _stream_chat(
        self,
        request: web.Request,
        service: ModelService,
        chat: ChatRequest,
        job: Job,
        splitter: OutputSplitter,
        prompt_ids: list[int],
        head: ResponseHead,
    ) -> web.StreamResponse:
        response, write = await self._open_stream(request)
        usage_field = {"usage": None} if chat.include_usage() else {}
        pending_ids: list[int] = []
        pending_logprobs: list[Any] = []

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **extra,
            }
            if chat.logprobs and pending_logprobs:
                choice["logprobs"] = chat_logprobs(pending_logprobs, service.token_text)
            if chat.return_token_ids:
                choice["token_ids"] = list(pending_ids)
            pending_ids.clear()
            pending_logprobs.clear()
            return sse.data_frame(head.envelope([choice], **usage_field))

        def deltas(events: Sequence[TextEvent | ToolCallEvent]) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for event in events:
                if isinstance(event, TextEvent):
                    key = "reasoning_content" if event.channel == "reasoning" else "content"
                    out.append({key: event.text})
                    continue
                call = tool_call_object(event)
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": event.index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                out.append(
                    {
                        "tool_calls": [
                            {"index": event.index, "function": {"arguments": call["function"]["arguments"]}}
                        ]
                    }
                )
            return out

        async def keepalive() -> None:
            await write(sse.KEEPALIVE)

        try:
            first: dict[str, Any] = {"role": "assistant", "content": ""}
            # with return_token_ids, the prompt ids ride on the first chunk
            await write(chunk(first, **({"prompt_token_ids": prompt_ids} if chat.return_token_ids else {})))
            final: Step | None = None
            try:
                async for step, events in self._split_steps(job, splitter, keepalive):
                    pending_ids.extend(step.token_ids)
                    pending_logprobs.extend(step.logprobs or [])
                    if step.finish_reason is not None:
                        final = step
                    for delta in deltas(events):
                        await write(chunk(delta))
            except APIError as error:  # the job failed
                await write(sse.data_frame(error.body()))
                return response
            assert final is not None and final.stats is not None and final.finish_reason is not None
            if final.finish_reason == "cancelled":
                await write(sse.data_frame(self._shutdown_cut().body()))
                return response
            await write(chunk({}, self._chat_finish(final.finish_reason, splitter, chat)))
            if chat.include_usage():
                await write(sse.data_frame(head.envelope([], usage=usage(final.stats))))
            await write(sse.DONE)
        except ClientGone as gone:
            log.info("[serve] stream ended early: %s", gone)
        except Exception as exc:  # the 200 is already out: report in the stream, as OpenAI does
            await self._stream_failure(write, exc)
        return response

    @staticmethod
    async def _stream_failure(write: Callable[[bytes], Awaitable[None]], exc: Exception) -> None:
        log.error("[serve] internal error while streaming: %s", type(exc).__name__, exc_info=exc)
        with contextlib.suppress(ClientGone):
            await write(sse.data_frame(APIError(500, "internal server error", "internal_error").body()))

    # ---------------------------------------------------------------------------------- completions

    def _prepare_completion(self, service: ModelService, completion: CompletionRequest) -> list[int]:
        ids = completion.prompt_ids()
        if ids is None:
            assert isinstance(completion.prompt, str)
            return list(service.tokenizer.encode(completion.prompt, special=True))
        _check_in_vocabulary(service, ids, "prompt token ids", "prompt")
        return ids

    async def completions(self, request: web.Request) -> web.StreamResponse:
        service = self.ready()
        completion = validate_request(CompletionRequest, await self.read_json(request))
        self._check_model(service, completion.model)
        prompt_ids = await asyncio.to_thread(self._prepare_completion, service, completion)
        max_tokens = self._budget(
            service, len(prompt_ids), completion.max_tokens, self.limits.default_completion_max_tokens
        )
        grammar = await asyncio.to_thread(completion_grammar, service, completion)
        job = self._start_job(service, completion, prompt_ids, max_tokens, completion.logprobs, grammar)
        head = ResponseHead(new_id("cmpl-"), service.model_id, "text_completion")
        try:
            if completion.stream:
                return await self._stream_completion(request, service, completion, job, prompt_ids, head)
            return await self._whole_completion(service, completion, job, prompt_ids, head)
        finally:
            self._abandon(job)

    async def _whole_completion(
        self,
        service: ModelService,
        completion: CompletionRequest,
        job: Job,
        prompt_ids: list[int],
        head: ResponseHead,
    ) -> web.Response:
        texts: list[str] = []
        token_ids: list[int] = []
        logprobs: list[Any] = []
        final: Step | None = None
        async for step in self._job_steps(job):
            texts.append(step.text)
            token_ids += step.token_ids
            logprobs += step.logprobs or []
            if step.finish_reason is not None:
                final = step
        assert final is not None and final.stats is not None and final.finish_reason is not None
        if final.finish_reason == "cancelled":
            raise self._shutdown_cut()
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(texts),
            "logprobs": completion_logprobs(logprobs, service.token_text, 0)
            if completion.logprobs is not None
            else None,
            "finish_reason": final.finish_reason,
        }
        if completion.return_token_ids:
            choice.update(prompt_token_ids=prompt_ids, token_ids=token_ids)
        return web.json_response(head.envelope([choice], usage=usage(final.stats)))

    async def _stream_completion(
        self,
        request: web.Request,
        service: ModelService,
        completion: CompletionRequest,
        job: Job,
        prompt_ids: list[int],
        head: ResponseHead,
    ) -> web.StreamResponse:
        response, write = await self._open_stream(request)
        usage_field = {"usage": None} if completion.include_usage() else {}
        offset = 0
        first = True

        async def keepalive() -> None:
            await write(sse.KEEPALIVE)

        try:
            final: Step | None = None
            try:
                async for step in self._job_steps(job, keepalive):
                    if step.finish_reason is not None:
                        final = step
                        if step.finish_reason == "cancelled":
                            await write(sse.data_frame(self._shutdown_cut().body()))
                            return response
                    if not (step.text or step.token_ids or step.finish_reason):
                        continue
                    choice: dict[str, Any] = {
                        "index": 0,
                        "text": step.text,
                        "logprobs": None,
                        "finish_reason": step.finish_reason,
                    }
                    if completion.logprobs is not None and step.logprobs:
                        choice["logprobs"] = completion_logprobs(step.logprobs, service.token_text, offset)
                    if completion.return_token_ids:
                        choice["token_ids"] = step.token_ids
                        if first:
                            choice["prompt_token_ids"] = prompt_ids
                    first = False
                    offset += len(step.text)
                    await write(sse.data_frame(head.envelope([choice], **usage_field)))
            except APIError as error:  # the job failed
                await write(sse.data_frame(error.body()))
                return response
            assert final is not None and final.stats is not None
            if completion.include_usage():
                await write(sse.data_frame(head.envelope([], usage=usage(final.stats))))
            await write(sse.DONE)
        except ClientGone as gone:
            log.info("[serve] stream ended early: %s", gone)
        except Exception as exc:  # the 200 is already out: report in the stream, as OpenAI does
            await self._stream_failure(write, exc)
        return response

    # ----------------------------------------------------------------------------- tokenize / detokenize

    async def tokenize(self, request: web.Request) -> web.Response:
        service = self.ready()
        body = validate_request(TokenizeRequest, await self.read_json(request))
        self._check_model(service, body.model)

        def work() -> list[int]:
            if body.prompt is not None:
                return list(service.tokenizer.encode(body.prompt, special=body.add_special_tokens))
            if service.template is None:
                raise bad_request("this model has no chat template; send a prompt")
            chat = ChatRequest.model_construct(
                messages=body.messages,
                tools=body.tools,
                tool_choice=None,
                parallel_tool_calls=None,
                response_format=None,
                reasoning_effort=None,
                chat_template_kwargs=body.chat_template_kwargs,
            )
            prepared = chat_input(chat)
            text = service.template.render(
                prepared.messages,
                tools=prepared.tools,
                add_generation_prompt=body.add_generation_prompt,
                **prepared.kwargs,
            )
            return list(service.tokenizer.encode(text, special=True))

        try:
            ids = await asyncio.to_thread(work)
        except ValueError as exc:
            raise bad_request(f"chat template: {exc}", "messages") from None
        out: dict[str, Any] = {"count": len(ids), "max_model_len": service.max_context, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = [service.token_text(i) for i in ids]
        return web.json_response(out)

    async def detokenize(self, request: web.Request) -> web.Response:
        service = self.ready()
        body = validate_request(DetokenizeRequest, await self.read_json(request))
        self._check_model(service, body.model)
        _check_in_vocabulary(service, body.tokens, "token ids", "tokens")
        text = await asyncio.to_thread(service.tokenizer.decode, body.tokens)
        return web.json_response({"prompt": text})

    # ------------------------------------------------------------------------------------- shutdown

    async def shutdown(self) -> bool:
        """Stop taking work, let the running request finish (bounded), cancel it if it does not."""
        return await self.scheduler.shutdown(self.limits.shutdown_grace_s)


__all__ = ["Limits", "OpenAIServer"]
