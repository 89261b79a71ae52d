"""End to end over HTTP with the official `openai` client, on a scripted backend.

The generator, acceptor, scheduler, parsers and HTTP path are the real ones; only the model's output is a
script (see scripted.py), so reasoning, tool calls, stops and limits can be forced exactly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import API_KEY, assert_cancelled_job_stopped, running_server
from .scripted import SCRIPTS, scripted_server, scripted_service
from .test_protocol import bodies

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def fast(qwen_text):
    with scripted_server(qwen_text, max_body_bytes=256 * 1024) as server:
        yield server


@pytest.fixture(scope="module")
def slow(qwen_text):
    with scripted_server(qwen_text, delay_s=0.03, drafter=False, max_queue=1) as server:
        yield server


AUTH = {"Authorization": f"Bearer {API_KEY}"}
HTTP = httpx.Client(timeout=30)  # one client: making one per request costs more than the request


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def render_prompt(server, messages: list[dict]) -> str:
    reply = httpx.post(server.url + "/v1/chat/completions/render", json={"messages": messages}, headers=AUTH)
    assert reply.status_code == 200
    return reply.json()["prompt"]


def sse_frames(server, body: dict, key: str = API_KEY) -> list[str]:
    """Raw SSE lines of a streamed request: data payloads and comments, in order."""
    frames = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                frames.append(line)
    return frames


# ------------------------------------------------------------------------------------------------ chat


def test_plain_chat_splits_reasoning_and_reports_usage(fast) -> None:
    reply = fast.client().chat.completions.create(model="scripted", messages=user("hi SCRIPT:hello"))
    message = reply.choices[0].message
    assert message.content == "Hello! How can I help?"
    assert message.reasoning_content == "The user greets me.\nI greet back."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.id.startswith("chatcmpl-") and reply.model == "scripted"
    usage = reply.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    expected = len(fast.server.service.tokenizer.encode(SCRIPTS["hello"])) + 1  # + the end-of-turn token
    assert usage.completion_tokens == expected
    spec = usage.model_extra["speculation"]
    assert spec["rounds"] >= 1 and spec["committed_tokens"] == usage.completion_tokens
    assert spec["tokens_per_round"] == round(usage.completion_tokens / spec["rounds"], 4)


def test_thinking_off_gives_content_only(fast) -> None:
    reply = fast.client().chat.completions.create(
        model="scripted",
        messages=user("SCRIPT:nothink"),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content == "Plain answer, no reasoning."
    assert reply.choices[0].message.reasoning_content is None


def test_stream_frames_are_ordered_and_match_the_whole_answer(fast) -> None:
    body = {"messages": user("hi SCRIPT:hello"), "stream": True, "stream_options": {"include_usage": True}}
    frames = sse_frames(fast, body)
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames if f.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    kinds = [next(iter(d)) for d in deltas[1:] if d]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning_content")  # reasoning first, then content
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == ("The user greets me.\nI greet back.", "Hello! How can I help?")
    assert len([d for d in deltas if d.get("content")]) > 1  # really streamed, not one buffered piece
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_openai_client_stream(fast) -> None:
    stream = fast.client().chat.completions.create(
        model="scripted", messages=user("SCRIPT:hello"), stream=True, stream_options={"include_usage": True}
    )
    content, reasoning, usage = "", "", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
    assert content == "Hello! How can I help?" and reasoning.startswith("The user greets me.")
    assert usage is not None and usage.prompt_tokens > 0


# ------------------------------------------------------------------------------------------ tool calls


def test_tool_call_round_trip(fast) -> None:
    client = fast.client()
    messages = user("What is the weather in Paris? SCRIPT:tool")
    first = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "Needs the weather tool."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}

    messages = [
        *messages,
        {
            "role": "assistant",
            "content": choice.message.content,
            "reasoning_content": "Needs the weather tool.",
            "tool_calls": [call.model_dump()],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"} SCRIPT:after_tool'},
    ]
    rendered = httpx.post(
        fast.url + "/v1/chat/completions/render",
        json={"messages": messages, "tools": TOOLS},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()
    assert '<tool_response>\n{"forecast": "sunny"} SCRIPT:after_tool\n</tool_response>' in rendered["prompt"]
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in rendered["prompt"]
    second = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "It will be sunny in Paris for 3 days."
    assert second.choices[0].finish_reason == "stop"
    # the second turn re-used the first turn's prompt from the prefix cache
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_streamed_tool_calls_match_the_whole_answer(fast) -> None:
    client = fast.client()
    whole = client.chat.completions.create(model="scripted", messages=user("SCRIPT:two_tools"), tools=TOOLS)
    stream = client.chat.completions.create(
        model="scripted", messages=user("SCRIPT:two_tools"), tools=TOOLS, stream=True
    )
    calls: dict[int, dict] = {}
    finish = None
    order = []
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                if delta.id:
                    entry["id"] = delta.id
                    order.append(("id+name", delta.index))
                if delta.function and delta.function.name:
                    entry["name"] = delta.function.name
                if delta.function and delta.function.arguments:
                    entry["arguments"] += delta.function.arguments
                    order.append(("arguments", delta.index))
    assert finish == "tool_calls"
    assert order == [("id+name", 0), ("arguments", 0), ("id+name", 1), ("arguments", 1)]
    expected = [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls
    ]
    got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    assert (
        got
        == expected
        == [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome", "days": 3})]
    )
    assert whole.choices[0].message.content is None


def test_malformed_tool_markup_is_returned_as_content(fast) -> None:
    reply = fast.client().chat.completions.create(
        model="scripted", messages=user("SCRIPT:broken"), tools=TOOLS
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == SCRIPTS["broken"].split("</think>\n\n")[1]
    assert httpx.get(fast.url + "/health").status_code == 200


def test_tool_choice_none_leaves_markup_as_text(fast) -> None:
    reply = fast.client().chat.completions.create(
        model="scripted", messages=user("SCRIPT:tool"), tools=TOOLS, tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None
    assert "<tool_call>" in reply.choices[0].message.content


def test_without_a_grammar_vocabulary_structured_output_is_refused_and_tools_still_decode(fast) -> None:
    """A service with no grammar vocabulary (this one's is switched off) refuses structured output with 400
    naming the field, and loses nothing else: tool calls are still decoded from the text."""
    client = fast.client()
    for extra, field in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"extra_body": {"structured_outputs": {"choice": ["a", "b"]}}}, "structured_outputs"),
    ):
        with pytest.raises(openai.BadRequestError, match="Hugging Face tokenizer") as caught:
            client.chat.completions.create(model="scripted", messages=user("SCRIPT:tool"), **extra)
        assert caught.value.body["param"] == field
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.completions.create(model="scripted", prompt="x",
                                  extra_body={"structured_outputs": {"regex": "a"}})
    reply = client.chat.completions.create(
        model="scripted", messages=user("SCRIPT:tool"), tools=TOOLS, tool_choice="required"
    )
    assert reply.choices[0].finish_reason == "tool_calls"


# ----------------------------------------------------------------------------------- stops and limits


def test_stop_strings_across_multi_token_rounds(fast) -> None:
    client = fast.client()
    full = client.chat.completions.create(model="scripted", messages=user("SCRIPT:repeat"), max_tokens=200)
    assert full.usage.model_extra["speculation"]["tokens_per_round"] > 1.5  # drafts were accepted
    text = full.choices[0].message.content
    for stop in ["HALT", "ALT a", "five six. one", "x-never-there"]:
        reply = client.chat.completions.create(
            model="scripted", messages=user("SCRIPT:repeat"), max_tokens=200, stop=[stop]
        )
        assert reply.choices[0].message.content == text.split(stop)[0]
        assert reply.choices[0].finish_reason == "stop"
        spec = reply.usage.model_extra["speculation"]
        assert spec["committed_tokens"] == reply.usage.completion_tokens  # what the stop cut is counted apart
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="scripted", messages=user("SCRIPT:repeat"), max_tokens=200, stop=[stop], stream=True
            )
            if c.choices
        )
        assert streamed == reply.choices[0].message.content


def test_max_tokens_is_exact_with_multi_token_rounds(fast) -> None:
    client = fast.client()
    for limit in (1, 2, 7, 13, 40):
        reply = client.chat.completions.create(
            model="scripted", messages=user("SCRIPT:repeat"), max_tokens=limit
        )
        assert reply.usage.completion_tokens == limit
        assert reply.choices[0].finish_reason == "length"
    reply = client.chat.completions.create(
        model="scripted",
        messages=user("SCRIPT:repeat"),
        max_completion_tokens=9,
        extra_body={"return_token_ids": True},
    )
    extra = reply.choices[0].model_extra
    assert len(extra["token_ids"]) == 9 and extra["prompt_token_ids"] == fast.server.service.tokenizer.encode(
        render_prompt(fast, user("SCRIPT:repeat"))
    )


def test_context_limit_names_both_numbers(fast) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        fast.client().chat.completions.create(
            model="scripted", messages=user("SCRIPT:hello"), max_tokens=5000
        )
    error = info.value.body
    assert error["code"] == "context_length_exceeded"
    assert "max_tokens (5000)" in error["message"] and "4096" in error["message"]


# ------------------------------------------------------------------------------------------ errors


def test_401_for_missing_or_wrong_keys(fast) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        fast.client(key="wrong").chat.completions.create(model="scripted", messages=user("hi"))
    assert info.value.body["code"] == "invalid_api_key"
    assert info.value.response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(fast.url + "/v1/models").status_code == 401
    assert httpx.get(fast.url + "/metrics").status_code == 401
    assert httpx.get(fast.url + "/health").status_code == 200  # open


def raw_exchange(server, request: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Send raw bytes; return the first response (head and body) and how long it took to start coming."""
    start = time.monotonic()
    first = float("inf")
    data = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                first = min(first, time.monotonic() - start)
                data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                if length and len(body) >= int(length[0].split(b":")[1]):
                    break
        except TimeoutError:
            pass
    return data, first


def test_401_comes_before_the_body_is_read(fast) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    answer, first = raw_exchange(fast, head + b"Content-Length: 1000000\r\n\r\n")  # the body never comes
    assert answer.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in answer
    assert b"Connection: close" in answer and first < 1.0
    answer, _ = raw_exchange(fast, head + b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401") and b"100 Continue" not in answer


def test_400_names_the_unknown_field(fast) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        fast.client().chat.completions.create(
            model="scripted", messages=user("hi"), extra_body={"frobnicate": 1}
        )
    assert info.value.body["message"] == "Unsupported field: frobnicate"
    assert info.value.body["param"] == "frobnicate"
    with pytest.raises(openai.NotFoundError):
        fast.client().chat.completions.create(model="gpt-4o", messages=user("hi"))


def test_413_for_large_bodies(fast) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        fast.client().chat.completions.create(model="scripted", messages=user("x" * 300_000))
    assert info.value.status_code == 413 and info.value.body["code"] == "body_too_large"
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + API_KEY.encode()
    answer, first = raw_exchange(fast, head + b"\r\nContent-Length: 999999999\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and first < 1.0


def test_408_for_slow_headers_and_bodies(fast) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + API_KEY.encode()
    answer, first = raw_exchange(fast, head + b'\r\nContent-Length: 100\r\n\r\n{"messages"', wait=10)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert 1.5 < first < 8  # the body deadline is 2 s
    answer, first = raw_exchange(fast, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nX-Slow", wait=10)
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < first < 8  # the header deadline is 2 s
    assert httpx.get(fast.url + "/health").status_code == 200


def test_429_when_the_queue_is_full(slow) -> None:
    async def burst() -> list:
        client = slow.async_client()
        calls = [
            client.chat.completions.create(model="scripted", messages=user("SCRIPT:long"), max_tokens=20)
            for _ in range(4)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(burst())
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    done = [r for r in results if not isinstance(r, Exception)]
    assert refused and done and len(refused) + len(done) == 4
    assert int(refused[0].response.headers["Retry-After"]) >= 1
    assert all(r.usage.completion_tokens == 20 for r in done)


# ------------------------------------------------------------------------------------ disconnects, load


def test_client_disconnect_mid_stream_cancels_and_the_server_stays_correct(slow) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "scripted", "messages": user("SCRIPT:long"), "stream": True}
    cancelled_before = slow.server.metrics.cancelled
    with httpx.stream("POST", slow.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen == 5:
                break  # leave mid-stream: the connection closes
    calls = assert_cancelled_job_stopped(slow, cancelled_before)
    assert calls < 100  # far short of the 400+ tokens of the script
    assert httpx.get(slow.url + "/health").status_code == 200
    reply = slow.client().chat.completions.create(model="scripted", messages=user("SCRIPT:hello"))
    assert reply.choices[0].message.content == "Hello! How can I help?"


def keep_busy(server, max_tokens: int) -> threading.Thread:
    """Start a slow request on a thread and return once the engine is running it."""
    begun = len(server.backend.begun)
    busy = threading.Thread(
        target=lambda: server.client().chat.completions.create(
            model="scripted", messages=user("SCRIPT:long"), max_tokens=max_tokens
        )
    )
    busy.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
        len(server.backend.begun) > begun
        and server.backend.begun[-1] == "long"
        and server.server.scheduler.running
    ):
        time.sleep(0.005)
    assert server.server.scheduler.running is not None
    return busy


def test_a_queued_request_whose_client_leaves_never_runs(slow) -> None:
    busy = keep_busy(slow, max_tokens=100)
    body = {"model": "scripted", "messages": user("SCRIPT:nothink"), "stream": True}
    with httpx.stream("POST", slow.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as r:
        lines = r.iter_lines()  # kept alive: dropping the iterator would close the connection
        next(lines)  # the role chunk: the request is queued behind the busy one
        assert slow.server.scheduler.queue_depth == 1
    deadline = time.monotonic() + 5
    while slow.server.scheduler.queue_depth and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow.server.scheduler.queue_depth == 0  # dropped as soon as the client left
    busy.join()
    assert "nothink" not in slow.backend.begun


def test_fifty_concurrent_clients_all_complete_correctly(fast) -> None:
    async def everyone() -> list:
        client = fast.async_client(timeout=120)
        calls = [
            client.chat.completions.create(model="scripted", messages=user(f"Who am I? SCRIPT:client{i}"))
            for i in range(50)
        ]
        return await asyncio.gather(*calls)

    replies = asyncio.run(everyone())
    for i, reply in enumerate(replies):
        assert reply.choices[0].message.content == f"Client {i} gets answer {i * i}."
        assert reply.choices[0].finish_reason == "stop"
    metrics = httpx.get(fast.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert "elpis_queue_depth 0" in metrics and "elpis_running 0" in metrics


def test_fatal_engine_error_turns_the_server_unhealthy(qwen_text) -> None:
    service, _ = scripted_service(qwen_text)
    with running_server(lambda: service) as server:
        client = server.client()
        assert client.chat.completions.create(model="scripted", messages=user("SCRIPT:hello")).choices
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="scripted", messages=user("SCRIPT:explode"))
        assert info.value.status_code == 503 and info.value.body["code"] == "generation_failed"
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "generation_failed"
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="scripted", messages=user("SCRIPT:hello"))
        body = {"messages": user("SCRIPT:hello"), "stream": True}
        streamed = httpx.post(server.url + "/v1/chat/completions", json=body, headers=AUTH)
        assert streamed.status_code == 503


# ------------------------------------------------------------------------------------- other endpoints


def test_models_metrics_tokenize_detokenize(fast) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = fast.client().models.list()
    assert [m.id for m in models.data] == ["scripted"]
    assert fast.client().models.retrieve("scripted").id == "scripted"
    with pytest.raises(openai.NotFoundError):
        fast.client().models.retrieve("gpt-4o")
    ids = httpx.post(fast.url + "/tokenize", json={"prompt": "Hello world"}, headers=headers).json()
    assert ids["count"] == len(ids["tokens"]) > 0 and ids["max_model_len"] == 4096
    text = httpx.post(fast.url + "/detokenize", json={"tokens": ids["tokens"]}, headers=headers).json()
    assert text == {"prompt": "Hello world"}
    bad = httpx.post(fast.url + "/detokenize", json={"tokens": [-1]}, headers=headers)
    assert bad.status_code == 400
    chat_ids = httpx.post(fast.url + "/tokenize", json={"messages": user("hi")}, headers=headers).json()
    rendered = httpx.post(
        fast.url + "/v1/chat/completions/render", json={"messages": user("hi")}, headers=headers
    )
    assert rendered.json()["token_ids"] == chat_ids["tokens"]
    metrics = httpx.get(fast.url + "/metrics", headers=headers)
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'elpis_requests_total{endpoint="/tokenize",status="200"}' in metrics.text
    assert "elpis_tokens_per_round_bucket" in metrics.text and "elpis_prefix_cache_hits_total" in metrics.text


def test_completions_text_ids_and_stream(fast) -> None:
    client = fast.client()
    reply = client.completions.create(model="scripted", prompt="SCRIPT:nothink", max_tokens=50)
    assert reply.choices[0].text == "Plain answer, no reasoning." and reply.choices[0].finish_reason == "stop"
    ids = fast.server.service.tokenizer.encode("SCRIPT:nothink")
    by_ids = client.completions.create(model="scripted", prompt=ids, max_tokens=50)
    assert by_ids.choices[0].text == reply.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="scripted", prompt="SCRIPT:nothink", max_tokens=50, stream=True) if c.choices)  # fmt: skip
    assert streamed == reply.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="scripted", prompt=[10**9], max_tokens=5)
    # one prompt in a list, as some clients send it; a batch of prompts is refused, naming the field
    listed = client.completions.create(model="scripted", prompt=["SCRIPT:nothink"], max_tokens=50)
    assert listed.choices[0].text == reply.choices[0].text
    with pytest.raises(openai.BadRequestError) as batch:
        client.completions.create(model="scripted", prompt=["SCRIPT:nothink", "SCRIPT:nothink"], max_tokens=5)
    assert batch.value.body["param"] == "prompt" and "batch of 2 prompts" in batch.value.body["message"]
    # stop ids outside the vocabulary name the field that holds them
    for field, value in (("stop", ["END", 10**9]), ("stop_token_ids", [10**9])):
        with pytest.raises(openai.BadRequestError) as stop:
            client.completions.create(
                model="scripted", prompt="SCRIPT:nothink", max_tokens=5, extra_body={field: value}
            )
        assert stop.value.body["param"] == field and "outside the vocabulary" in stop.value.body["message"]


def test_keepalive_comments_while_queued(slow) -> None:
    busy = keep_busy(slow, max_tokens=60)
    try:
        frames = sse_frames(slow, {"messages": user("SCRIPT:hello"), "stream": True})
    finally:
        busy.join()
    first_content = next(i for i, f in enumerate(frames) if '"content":"Hello' in f)
    assert ": keep-alive" in frames[1:first_content]  # sent while waiting behind the busy request
    assert frames[0].startswith("data: ") and '"role":"assistant"' in frames[0]


# ------------------------------------------------------------------------------------- fuzz over HTTP


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize"]))
def test_fuzzed_requests_get_clean_answers(fast, body: dict, path: str) -> None:
    body = {**body, "max_tokens": 4} if "max_tokens" in body else body
    raw = json.dumps(body)  # may carry NaN/Infinity, which the server must refuse cleanly
    headers = {**AUTH, "Content-Type": "application/json"}
    response = HTTP.post(fast.url + path, content=raw, headers=headers)
    assert response.status_code in (200, 400, 404), response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
    assert HTTP.get(fast.url + "/health").status_code == 200
