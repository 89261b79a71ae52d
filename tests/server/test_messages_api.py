"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API) end to end over HTTP, on the
scripted backend (exact texts: thinking, tool use, stops, limits, failures). The CPU reference backend's
tests are in test_messages_reference.py.

Anthropic's SDK is not installed, so requests go through httpx; the SSE parser below checks the framing
itself (`event:` line, then `data:` with the same `type`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elpis.server.thinking import CLOSING_TEXT

from .conftest import API_KEY, assert_cancelled_job_stopped, running_server, typed_events
from .scripted import SCRIPTS, scripted_server, scripted_service
from .test_protocol import json_values

KEY = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
BEARER = {"Authorization": f"Bearer {API_KEY}"}
HTTP = httpx.Client(timeout=60)
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather forecast",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": TOOLS[0]["input_schema"],
        },
    }
]


@pytest.fixture(scope="module")
def fast(qwen_text):
    with scripted_server(qwen_text) as server:
        yield server


@pytest.fixture(scope="module")
def slow(qwen_text):
    with scripted_server(qwen_text, delay_s=0.03, max_queue=1) as server:
        yield server


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "scripted", "max_tokens": 1024, "messages": [{"role": "user", "content": text}], **extra}


def post(server, data: dict, path: str = "/v1/messages", headers: dict | None = None) -> httpx.Response:
    return HTTP.post(server.url + path, json=data, headers=KEY if headers is None else headers)


def ok(server, data: dict) -> dict:
    reply = post(server, data)
    assert reply.status_code == 200, reply.text
    return reply.json()


def refused(reply: httpx.Response, status: int, kind: str) -> str:
    """The Anthropic error envelope of a refusal; its message."""
    assert reply.status_code == status, reply.text
    data = reply.json()
    assert data["type"] == "error" and set(data) == {"type", "error"}
    assert data["error"]["type"] == kind and set(data["error"]) == {"type", "message"}
    return data["error"]["message"]


def stream(server, data: dict) -> list[dict]:
    with httpx.stream(
        "POST", server.url + "/v1/messages", json={**data, "stream": True}, headers=KEY, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    return [e for e in typed_events(lines) if e["type"] != "ping"]


def fold(events: list[dict]) -> dict:
    """The message a client accumulates from a stream, checking the event grammar on the way: message_start
    first; each block started, given deltas of its own type and stopped, in index order; message_delta then
    message_stop last."""
    assert events[0]["type"] == "message_start"
    message = events[0]["message"]
    assert message["content"] == [] and message["stop_reason"] is None and message["stop_sequence"] is None
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    open_index, partial = None, ""
    for event in events[1:-2]:
        kind = event["type"]
        if kind == "content_block_start":
            assert open_index is None and event["index"] == len(message["content"])
            open_index = event["index"]
            message["content"].append(dict(event["content_block"]))
            continue
        assert event["index"] == open_index, event
        block = message["content"][open_index]
        if kind == "content_block_stop":
            if block["type"] == "tool_use":
                assert block["input"] == {}
                block["input"] = json.loads(partial)
            open_index, partial = None, ""
            continue
        assert kind == "content_block_delta"
        delta = event["delta"]
        if delta["type"] == "text_delta":
            assert block["type"] == "text"
            block["text"] += delta["text"]
        elif delta["type"] == "thinking_delta":
            assert block["type"] == "thinking"
            block["thinking"] += delta["thinking"]
        elif delta["type"] == "signature_delta":
            assert block["type"] == "thinking"
            block["signature"] += delta["signature"]
        else:
            assert delta["type"] == "input_json_delta" and block["type"] == "tool_use"
            partial += delta["partial_json"]
    assert open_index is None
    message.update(events[-2]["delta"])
    message["usage"].update(events[-2]["usage"])
    return message


def without_ids(content: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in content]


def rendered_ids(server, messages: list[dict], **extra: Any) -> list[int]:
    """The prompt ids chat renders for `messages` (the translation target of a Messages request)."""
    reply = HTTP.post(
        server.url + "/v1/chat/completions/render", json={"messages": messages, **extra}, headers=BEARER
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["token_ids"]


# ----------------------------------------------------------------------------------------- text


def test_text_and_thinking_whole(fast) -> None:
    reply = ok(fast, body("hi SCRIPT:hello", metadata={"user_id": "u-1"}))
    assert reply["id"].startswith("msg_") and reply["type"] == "message" and reply["role"] == "assistant"
    assert reply["model"] == "scripted"
    assert reply["content"] == [
        {"type": "thinking", "thinking": "The user greets me.\nI greet back.", "signature": ""},
        {"type": "text", "text": "Hello! How can I help?"},
    ]
    assert reply["stop_reason"] == "end_turn" and reply["stop_sequence"] is None
    prompt = rendered_ids(fast, [{"role": "user", "content": "hi SCRIPT:hello"}])
    assert fast.backend.prompts[-1] == prompt
    usage = reply["usage"]
    assert set(usage) == {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(prompt)
    assert usage["cache_creation_input_tokens"] == 0
    generated = fast.server.service.tokenizer.encode(SCRIPTS["hello"])
    assert usage["output_tokens"] == len(generated) + 1  # + the end-of-turn token


def test_stream_events_are_ordered_and_agree_with_the_whole_message(fast) -> None:
    whole = ok(fast, body("hi SCRIPT:hello"))
    events = stream(fast, body("hi SCRIPT:hello"))
    start = events[0]["message"]
    assert (
        start["usage"]["input_tokens"] == len(fast.backend.prompts[-1])
        and start["usage"]["output_tokens"] == 0
    )
    message = fold(events)
    assert message["id"] == start["id"] and message["content"] == whole["content"]
    assert message["stop_reason"] == "end_turn" and message["usage"] == {
        **whole["usage"],
        "input_tokens": message["usage"]["input_tokens"],
        "cache_read_input_tokens": message["usage"]["cache_read_input_tokens"],
    }
    assert message["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    for index, kind, key in ((0, "thinking_delta", "thinking"), (1, "text_delta", "text")):
        pieces = [e["delta"][key] for e in events if e.get("delta", {}).get("type") == kind]
        assert len(pieces) > 1 and all(
            e["index"] == index for e in events if e.get("delta", {}).get("type") == kind
        )
        assert "".join(pieces) == whole["content"][index][key]  # really streamed, and the pieces add up
    kinds = [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in events]
    # the thinking block gets its (empty) signature just before it stops
    assert kinds[kinds.index(("content_block_stop", 0, None)) - 1] == (
        "content_block_delta",
        0,
        "signature_delta",
    )


def test_thinking_disabled_and_adaptive(fast) -> None:
    off = ok(fast, body("SCRIPT:nothink", thinking={"type": "disabled"}))
    assert off["content"] == [{"type": "text", "text": "Plain answer, no reasoning."}]
    messages = [{"role": "user", "content": "SCRIPT:nothink"}]
    assert fast.backend.prompts[-1] == rendered_ids(
        fast, messages, chat_template_kwargs={"enable_thinking": False}
    )
    assert fast.backend.prompts[-1] != rendered_ids(fast, messages)
    on = ok(fast, body("hi SCRIPT:hello", thinking={"type": "adaptive"}))
    assert [b["type"] for b in on["content"]] == ["thinking", "text"]
    hello = [{"role": "user", "content": "hi SCRIPT:hello"}]
    assert fast.backend.prompts[-1] == rendered_ids(
        fast, hello, chat_template_kwargs={"enable_thinking": True}
    )
    effort = ok(fast, body("hi SCRIPT:hello", thinking={"type": "adaptive"}, output_config={"effort": "low"}))
    assert effort["content"] == on["content"]
    assert fast.backend.prompts[-1] == rendered_ids(
        fast, hello, chat_template_kwargs={"enable_thinking": True, "reasoning_effort": "low"}
    )
    # with thinking off the effort has nothing to steer, and the prompt is thinking-off's
    ok(fast, body("SCRIPT:nothink", thinking={"type": "disabled"}, output_config={"effort": "high"}))
    assert fast.backend.prompts[-1] == rendered_ids(
        fast, messages, chat_template_kwargs={"enable_thinking": False}
    )


def test_thinking_display_omitted_keeps_the_block_without_its_text(fast) -> None:
    asked = body("hi SCRIPT:hello", thinking={"type": "adaptive", "display": "omitted"})
    reply = ok(fast, asked)
    assert reply["content"] == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": "Hello! How can I help?"},
    ]
    events = stream(fast, asked)
    assert not [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    assert fold(events)["content"] == reply["content"]


def test_thinking_budget_cuts_the_reasoning(fast) -> None:
    """As test_thinking_budget checks for chat: the script's first N tokens, the server's closing tokens,
    then the script from the step after them."""
    tokenizer = fast.server.service.tokenizer
    script = tokenizer.encode(SCRIPTS["hello"])
    close = tokenizer.encode(CLOSING_TEXT, special=True)
    ids = [*script[:3], *close, *script[3 + len(close) :], fast.backend.end_of_turn]
    asked = body("hi SCRIPT:hello", thinking={"type": "enabled", "budget_tokens": 3})
    reply = ok(fast, asked)
    thinking, text = reply["content"]
    assert thinking == {"type": "thinking", "thinking": tokenizer.decode(script[:3]).strip(), "signature": ""}
    assert text == {"type": "text", "text": tokenizer.decode(ids[3 + len(close) : -1]).strip()}
    assert reply["usage"]["output_tokens"] == len(ids) and reply["stop_reason"] == "end_turn"
    assert fold(stream(fast, asked))["content"] == reply["content"]
    roomy = ok(fast, body("hi SCRIPT:hello", thinking={"type": "enabled", "budget_tokens": 500}))
    assert roomy["content"][0]["thinking"] == "The user greets me.\nI greet back."


# ----------------------------------------------------------------------------------------- tools


def test_tool_use_whole(fast) -> None:
    reply = ok(fast, body("What is the weather in Paris? SCRIPT:tool", tools=TOOLS))
    thinking, text, call = reply["content"]
    assert thinking["thinking"] == "Needs the weather tool." and text == {
        "type": "text",
        "text": "Let me check.",
    }
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["name"] == "get_weather"
    assert call["input"] == {"city": "Paris", "days": 3}
    assert reply["stop_reason"] == "tool_use" and reply["stop_sequence"] is None
    prompt = rendered_ids(
        fast, [{"role": "user", "content": "What is the weather in Paris? SCRIPT:tool"}], tools=CHAT_TOOLS
    )
    assert fast.backend.prompts[-1] == prompt


def test_tool_use_streamed_input_json_concatenates_to_the_input(fast) -> None:
    asked = body("SCRIPT:two_tools", tools=TOOLS)
    whole = ok(fast, asked)
    events = stream(fast, asked)
    message = fold(events)  # parses each block's input_json_delta pieces as JSON
    assert without_ids(message["content"]) == without_ids(whole["content"])
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use", "tool_use"]
    assert [b["input"] for b in message["content"][1:]] == [
        {"city": "Paris", "days": 3},
        {"city": "Rome", "days": 3},
    ]
    assert message["stop_reason"] == "tool_use"
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == [0, 1, 2]
    assert starts[1]["content_block"]["input"] == {} and starts[1]["content_block"]["name"] == "get_weather"


def test_tool_choice_any_tool_none_and_parallel(fast) -> None:
    ok(fast, body("SCRIPT:tool", tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True}))
    text = fast.server.service.tokenizer.decode(fast.backend.prompts[-1])
    assert "You must call at least one of the provided functions" in text and "at most one function" in text
    named = ok(fast, body("SCRIPT:tool", tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}))
    assert named["content"][-1]["type"] == "tool_use"
    text = fast.server.service.tokenizer.decode(fast.backend.prompts[-1])
    assert "You must call the function get_weather in this reply" in text
    off = ok(fast, body("SCRIPT:tool", tools=TOOLS, tool_choice={"type": "none"}))
    assert [b["type"] for b in off["content"]] == ["thinking", "text"] and off["stop_reason"] == "end_turn"
    assert "<tool_call>" in off["content"][1]["text"]


def test_tool_result_round_trip_is_rendered_into_the_prompt(fast) -> None:
    question = {"role": "user", "content": "What is the weather in Paris? SCRIPT:tool"}
    first = ok(fast, body(question["content"], tools=TOOLS))
    call = first["content"][2]
    result = '{"forecast": "sunny"} SCRIPT:after_tool'
    history = [
        question,
        {"role": "assistant", "content": first["content"]},  # sent back as Claude Code does
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call["id"],
                    "content": [{"type": "text", "text": result}],
                },
                {"type": "text", "text": "Thanks.", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    second = ok(fast, {**body("x", tools=TOOLS), "messages": history})
    assert second["content"][-1] == {"type": "text", "text": "It will be sunny in Paris for 3 days."}
    assert second["usage"]["cache_read_input_tokens"] >= first["usage"]["input_tokens"] - 1
    chat = [
        question,
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Needs the weather tool.",
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(call["input"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": result},
        {"role": "user", "content": "Thanks."},
    ]
    prompt = fast.backend.prompts[-1]
    assert prompt == rendered_ids(fast, chat, tools=CHAT_TOOLS)
    text = fast.server.service.tokenizer.decode(prompt)
    assert f"<tool_response>\n{result}\n</tool_response>" in text
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text
    # an error result says so to the model
    history[2]["content"][0] = {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "content": "boom",
        "is_error": True,
    }
    ok(fast, {**body("x", tools=TOOLS), "messages": history})
    assert "<tool_response>\nError: boom\n</tool_response>" in fast.server.service.tokenizer.decode(
        fast.backend.prompts[-1]
    )


def test_system_blocks_become_the_system_message(fast) -> None:
    system = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Use metric units."},
    ]
    ok(fast, body("SCRIPT:nothink", system=system))
    expected = rendered_ids(
        fast,
        [
            {"role": "system", "content": "You are a coding agent.\n\nUse metric units."},
            {"role": "user", "content": "SCRIPT:nothink"},
        ],
    )
    assert fast.backend.prompts[-1] == expected
    ok(fast, body("SCRIPT:nothink", system="Be brief."))
    assert fast.backend.prompts[-1] == rendered_ids(
        fast, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "SCRIPT:nothink"}]
    )


# ------------------------------------------------------------------------------------ stops and limits


def test_stop_sequences_give_stop_reason_stop_sequence(fast) -> None:
    asked = body("SCRIPT:repeat", stop_sequences=["NEVER", "HALT"])
    reply = ok(fast, asked)
    assert reply["stop_reason"] == "stop_sequence" and reply["stop_sequence"] == "HALT"
    text = reply["content"][-1]["text"]
    assert "HALT" not in text and text.startswith("one two three")
    message = fold(stream(fast, asked))
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "HALT"
    assert message["content"] == reply["content"]
    # a sequence the text never reaches leaves the model's own end
    free = ok(fast, body("hi SCRIPT:hello", stop_sequences=["NEVER"]))
    assert free["stop_reason"] == "end_turn" and free["stop_sequence"] is None


def test_max_tokens_gives_stop_reason_max_tokens(fast) -> None:
    reply = ok(fast, body("SCRIPT:repeat", max_tokens=9))
    assert reply["stop_reason"] == "max_tokens" and reply["usage"]["output_tokens"] == 9
    message = fold(stream(fast, body("SCRIPT:repeat", max_tokens=9)))
    assert message["stop_reason"] == "max_tokens" and message["content"] == reply["content"]
    cut = ok(fast, body("hi SCRIPT:hello", max_tokens=3))  # all of it is thinking
    assert [b["type"] for b in cut["content"]] == ["thinking"] and cut["stop_reason"] == "max_tokens"


def test_a_budget_past_the_context_is_cut_there(fast) -> None:
    """Claude Code asks for 32000 tokens whatever the context: the budget is what fits, and an answer the
    context cut says so (`model_context_window_exceeded`, Anthropic's stop reason for it)."""
    long = "word " * 3500 + "SCRIPT:long"
    reply = ok(fast, body(long, max_tokens=32000))
    prompt = len(fast.backend.prompts[-1])
    assert reply["stop_reason"] == "model_context_window_exceeded"
    assert reply["usage"]["output_tokens"] == 4096 - prompt
    too_long = post(fast, body("word " * 5000))
    assert "messages: the prompt has" in refused(too_long, 400, "invalid_request_error")


# ------------------------------------------------------------------------------------------ count_tokens


def test_count_tokens_is_the_rendered_prompts_length(fast) -> None:
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    asked = {
        "model": "scripted",
        "system": system,
        "tools": TOOLS,
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "What now?"}],
    }
    reply = post(fast, asked, "/v1/messages/count_tokens")
    assert reply.status_code == 200, reply.text
    expected = rendered_ids(
        fast,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What now?"}],
        tools=CHAT_TOOLS,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert reply.json() == {"input_tokens": len(expected)}
    calls = fast.backend.verify_calls
    ok(
        fast,
        {**asked, "messages": [{"role": "user", "content": "What now? SCRIPT:nothink"}], "max_tokens": 50},
    )
    generated = fast.backend.verify_calls
    post(fast, asked, "/v1/messages/count_tokens")
    assert fast.backend.verify_calls == generated > calls  # counting generates nothing
    for field in ("max_tokens", "stream", "stop_sequences"):
        bad = post(fast, {**asked, field: 5}, "/v1/messages/count_tokens")
        assert f"Unsupported field: {field}" in refused(bad, 400, "invalid_request_error")


# ------------------------------------------------------------------------------------------ auth, errors


def test_x_api_key_and_bearer_both_authenticate(fast) -> None:
    assert post(fast, body("SCRIPT:nothink")).status_code == 200  # x-api-key
    assert post(fast, body("SCRIPT:nothink"), headers=BEARER).status_code == 200  # ANTHROPIC_AUTH_TOKEN's way
    message = refused(post(fast, body("SCRIPT:nothink"), headers={}), 401, "authentication_error")
    assert "x-api-key" in message
    refused(post(fast, body("SCRIPT:nothink"), headers={"x-api-key": "wrong"}), 401, "authentication_error")
    both = {"x-api-key": "wrong", **BEARER}  # a wrong key is never outvoted by a right one
    refused(post(fast, body("SCRIPT:nothink"), headers=both), 401, "authentication_error")
    refused(post(fast, {}, "/v1/messages/count_tokens", headers={}), 401, "authentication_error")
    # the other endpoints take x-api-key too, and keep their own error shape
    models = HTTP.get(fast.url + "/v1/models", headers={"x-api-key": API_KEY})
    assert models.status_code == 200
    bare = HTTP.get(fast.url + "/v1/models")
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"


def test_another_model_is_404_naming_the_served_one(fast) -> None:
    message = refused(post(fast, {**body("hi"), "model": "claude-sonnet-4-5"}), 404, "not_found_error")
    assert message.startswith("model 'claude-sonnet-4-5'") and "'scripted'" in message
    message = refused(
        post(
            fast,
            {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]},
            "/v1/messages/count_tokens",
        ),
        404,
        "not_found_error",
    )
    assert "'scripted'" in message
    refused(post(fast, body("hi"), "/v1/messages/batches"), 404, "not_found_error")


BUILTIN = {"type": "web_search_20250305", "name": "web_search"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"max_tokens": None}, "max_tokens", "Field required"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"model": None}, "model", "Field required"),
        ({"messages": []}, "messages", "at least 1"),
        ({"tools": [BUILTIN]}, "tools[0]", "custom tools"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "Field required"),
        ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools[0].name", "pattern"),
        ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema", "object"),
        ({"tools": [{**TOOLS[0], "defer_loading": True}]}, "tools[0].defer_loading", "Unsupported field"),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "tool_choice", "name is required"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice", "not among"),
        ({"tool_choice": {"type": "required"}}, "tool_choice.type", "'auto', 'any', 'tool' or 'none'"),
        ({"thinking": {"type": "enabled"}}, "thinking", "budget_tokens is required"),
        ({"thinking": {"type": "enabled", "budget_tokens": -1}}, "thinking.budget_tokens", "greater than"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type", "'enabled', 'disabled' or 'adaptive'"),
        ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"top_k": -1}, "top_k", "greater than or equal to 0"),
        ({"stop_sequences": [""]}, "stop_sequences", "must not be empty"),
        ({"stop_sequences": [str(i) for i in range(17)]}, "stop_sequences", "at most 16"),
        ({"metadata": {"user_id": "u", "tier": 1}}, "metadata.tier", "Unsupported field"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers", "MCP"),
        ({"container": "c1"}, "container", "containers"),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits[0]",
            "never drops",
        ),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort", "'low'"),
        (
            {
                "tools": TOOLS,
                "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
            },
            "output_config.format",
            "tools",
        ),
        ({"frobnicate": 1}, "frobnicate", "Unsupported field"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE]}]},
            "messages[0].content[1]",
            "image blocks are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
            "document blocks",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "server_tool_use", "id": "s"}]}]},
            "messages[0].content[0]",
            "not supported",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a", "citations": [{"x": 1}]}]}
                ]
            },
            "messages[0].content[0].citations",
            "citations",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
                    }
                ]
            },
            "messages[0].content[0].tool_use_id",
            "answers no tool_use",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "tool_result", "tool_use_id": "t1"},
                        ],
                    },
                ]
            },
            "messages[2].content[1]",
            "must come before any text",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
                ]
            },
            "messages[0].content[0]",
            "belong in assistant messages",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
                    {"role": "user", "content": "r"},
                ]
            },
            "messages[1].content[0]",
            "belong in user messages",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}],
                    }
                ]
            },
            "messages[0].content[0].content[0]",
            "only text blocks",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "The answer is"},
                ]
            },
            "messages[1]",
            "prefill",
        ),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "needs content"),
        ({"messages": [{"role": "system", "content": "q"}]}, "messages[0].role", "'user' or 'assistant'"),
    ],
)
def test_refusals_are_400_naming_the_field(fast, change: dict, field: str, words: str) -> None:
    asked = body("hi SCRIPT:hello")
    for key, value in change.items():
        if value is None:
            asked.pop(key)
        else:
            asked[key] = value
    message = refused(post(fast, asked), 400, "invalid_request_error")
    named = message.startswith((f"{field}: ", f"{field} ")) or message == f"Unsupported field: {field}"
    assert named, message
    assert words in message, message


def test_what_claude_code_sends_is_accepted(fast) -> None:
    """A request shaped as Claude Code sends one: system blocks with cache_control, metadata.user_id, the
    clear_thinking context edit, adaptive thinking with an effort, tools with cache_control and the eager
    streaming hint, thinking blocks with signatures (and a redacted one) sent back as history."""
    asked = {
        "model": "scripted",
        "max_tokens": 32000,
        "stream": False,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                    {"type": "text", "text": "Hi.", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "They greet.", "signature": "EqQBCgIYAhIM"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Hello.", "citations": None},
                ],
            },
            {"role": "user", "content": "And now? SCRIPT:hello"},
        ],
        "tools": [
            {
                **TOOLS[0],
                "cache_control": {"type": "ephemeral"},
                "eager_input_streaming": True,
                "strict": True,
            }
        ],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": '{"device_id":"abc","session_id":"s-1"}'},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "temperature": 1,
        "service_tier": "auto",
        "cache_control": {"type": "ephemeral"},
    }
    reply = ok(fast, asked)
    assert reply["content"][-1] == {"type": "text", "text": "Hello! How can I help?"}
    chat = [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "<system-reminder>x</system-reminder>\n\nHi."},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "They greet."},
        {"role": "user", "content": "And now? SCRIPT:hello"},
    ]
    assert fast.backend.prompts[-1] == rendered_ids(
        fast,
        chat,
        tools=CHAT_TOOLS,
        chat_template_kwargs={"enable_thinking": True, "reasoning_effort": "xhigh"},
    )


def test_disconnect_mid_stream_cancels_generation(slow) -> None:
    cancelled = slow.server.metrics.cancelled
    asked = {**body("SCRIPT:long"), "stream": True}
    with httpx.stream("POST", slow.url + "/v1/messages", json=asked, headers=KEY, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ") and '"text_delta"' in line
            if seen == 5:
                break  # leave mid-stream: the connection closes
    assert_cancelled_job_stopped(slow, cancelled)
    assert ok(slow, body("hi SCRIPT:hello"))["content"][-1]["text"] == "Hello! How can I help?"


def test_a_queued_stream_gets_pings(slow) -> None:
    """A stream whose request waits behind another gets message_start at once, then a ping each keepalive
    interval (0.3 s here) until its tokens come."""
    first = threading.Thread(target=post, args=(slow, body("SCRIPT:long", max_tokens=40)))
    first.start()
    deadline = time.monotonic() + 10
    while slow.server.scheduler.running is None and time.monotonic() < deadline:
        time.sleep(0.01)
    asked = {**body("hi SCRIPT:hello"), "stream": True}
    with httpx.stream("POST", slow.url + "/v1/messages", json=asked, headers=KEY, timeout=30) as r:
        events = typed_events(list(r.iter_lines()))
    first.join()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "ping"  # waiting: pings before the first block
    assert events[1] == {"type": "ping"}
    assert fold([e for e in events if e["type"] != "ping"])["content"][-1]["text"] == "Hello! How can I help?"


def test_a_failure_after_the_200_is_an_error_event(qwen_text) -> None:
    service, _ = scripted_service(qwen_text)
    with running_server(lambda: service) as server:
        events = stream(server, body("SCRIPT:explode"))
        assert [e["type"] for e in events] == ["message_start", "error"]
        assert events[-1]["error"]["type"] == "api_error" and events[-1]["error"]["message"]
        after = post(server, body("SCRIPT:hello"))  # the engine failed: no garbage is ever served
        assert "restart" in refused(after, 503, "api_error")


def test_metrics_count_the_endpoints(fast) -> None:
    ok(fast, body("SCRIPT:nothink"))
    post(
        fast,
        {"model": "scripted", "messages": [{"role": "user", "content": "x"}]},
        "/v1/messages/count_tokens",
    )
    metrics = HTTP.get(fast.url + "/metrics", headers=BEARER).text
    assert 'elpis_requests_total{endpoint="/v1/messages",status="200"}' in metrics
    assert 'elpis_requests_total{endpoint="/v1/messages/count_tokens",status="200"}' in metrics


# ------------------------------------------------------------------------------------------ units


def test_error_types_follow_anthropics_table() -> None:
    from elpis.server.errors import APIError, anthropic_error_body, anthropic_error_type

    table = {
        (400, "invalid_request"): "invalid_request_error",
        (401, "invalid_api_key"): "authentication_error",
        (404, "model_not_found"): "not_found_error",
        (408, "request_timeout"): "invalid_request_error",
        (413, "body_too_large"): "request_too_large",
        (429, "queue_full"): "rate_limit_error",
        (500, "internal_error"): "api_error",
        (503, "model_loading"): "overloaded_error",
        (503, "server_shutting_down"): "overloaded_error",
        (503, "generation_failed"): "api_error",
    }
    for (status, code), kind in table.items():
        assert anthropic_error_type(status, code) == kind
    body_ = anthropic_error_body(APIError(400, "too long", "context_length_exceeded", "max_tokens"))
    assert body_ == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too long"},
    }


def test_authorizer_takes_either_header() -> None:
    from elpis.server.auth import Authorizer

    auth = Authorizer("sk-1")
    assert auth.allows_request(["Bearer sk-1"], []) and auth.allows_request([], ["sk-1"])
    assert auth.allows_request(["Bearer sk-1"], ["sk-1"])
    assert not auth.allows_request([], []) and not auth.allows_request([], ["sk-2"])
    assert not auth.allows_request(["Bearer sk-1"], ["sk-2"]) and not auth.allows_request(
        ["Bearer x"], ["sk-1"]
    )
    assert not auth.allows_request([], ["sk-1", "sk-1"]) and not auth.allows_request([], ["Bearer sk-1"])
    assert not auth.allows_request([], ["sk-é"])
    assert Authorizer(None).allows_request([], [])


FIELDS = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "output_config",
    "context_management",
]
block = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "x"]
        )
    },
    optional={
        "text": st.text(max_size=4) | json_values,
        "id": st.sampled_from(["t1", "t2", ""]),
        "tool_use_id": st.sampled_from(["t1", "t2"]) | json_values,
        "name": st.sampled_from(["f", "get_weather", ""]),
        "input": json_values,
        "content": st.text(max_size=4) | json_values,
        "thinking": st.text(max_size=4),
        "is_error": json_values,
    },
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system"]),
        "content": st.text(max_size=4) | st.lists(block, max_size=3),
    },
)
messages_bodies = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=6),
    json_values | st.text(max_size=4) | st.lists(message, max_size=4),
    max_size=8,
).map(lambda b: {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}], **b})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=messages_bodies)
def test_translation_never_raises_anything_but_a_400(data: dict) -> None:
    """Any body: a Messages request and the chat request it becomes, or a 400 saying what is wrong."""
    from elpis.server.errors import APIError, anthropic_error_body
    from elpis.server.messages_request import (
        MESSAGES_IGNORED,
        MessagesRequest,
        chat_body,
        messages_vocabulary,
    )
    from elpis.server.protocol import ChatRequest, validate_request

    try:
        with messages_vocabulary():
            asked = validate_request(MessagesRequest, data, MESSAGES_IGNORED)
            translated = chat_body(asked)
            validate_request(ChatRequest, translated)
    except APIError as err:
        assert err.status == 400 and err.message
        json.dumps(anthropic_error_body(err))
