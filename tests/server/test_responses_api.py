"""`POST /v1/responses` end to end over HTTP, on the scripted backend (exact texts: reasoning, tool calls,
limits, failures) and on the CPU reference backend (grammar-held JSON, a real model's stream).

The installed `openai` client predates the Responses API, so requests go through httpx; the SSE parser
below checks the framing itself (`event:` line, then `data:` with the same `type`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.grammar_cases import WEATHER, check_weather

from .conftest import API_KEY, assert_cancelled_job_stopped, running_server, typed_events
from .scripted import SCRIPTS, scripted_server, scripted_service
from .test_protocol import json_values

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


@pytest.fixture(scope="module")
def fast(qwen_text):
    with scripted_server(qwen_text) as server:
        yield server


@pytest.fixture(scope="module")
def slow(qwen_text):
    with scripted_server(qwen_text, delay_s=0.03, max_queue=1) as server:
        yield server


def post(server, body: dict, key: str = API_KEY) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def ok(server, body: dict) -> dict:
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream(server, body: dict) -> list[dict]:
    with httpx.stream(
        "POST", server.url + "/v1/responses", json={**body, "stream": True}, headers=AUTH, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert "data: [DONE]" not in lines  # the Responses API has no sentinel
    events = typed_events(lines)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def rendered_ids(server, messages: list[dict], **extra: Any) -> list[int]:
    """The prompt ids chat renders for `messages` (the translation target of a Responses request)."""
    reply = httpx.post(
        server.url + "/v1/chat/completions/render", json={"messages": messages, **extra}, headers=AUTH
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["token_ids"]


def item_events(events: list[dict], item_id: str) -> list[str]:
    return [
        e["type"] for e in events if e.get("item_id") == item_id or e.get("item", {}).get("id") == item_id
    ]


def without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]


# ----------------------------------------------------------------------------------------- plain text


def test_plain_text_splits_reasoning_and_reports_usage(fast) -> None:
    reply = ok(
        fast,
        {
            "model": "scripted",
            "input": "hi SCRIPT:hello",
            "metadata": {"run": "7"},
            "user": "u1",
            "store": True,
        },
    )
    assert reply["object"] == "response" and reply["id"].startswith("resp_") and reply["model"] == "scripted"
    assert reply["status"] == "completed" and reply["incomplete_details"] is None and reply["error"] is None
    reasoning, message = reply["output"]
    assert (
        reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    )
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user greets me.\nI greet back."}]
    assert (
        message["type"] == "message" and message["role"] == "assistant" and message["status"] == "completed"
    )
    assert message["content"] == [
        {"type": "output_text", "text": "Hello! How can I help?", "annotations": []}
    ]
    assert reply["output_text"] == "Hello! How can I help?"
    # echoed settings: what was in effect; nothing is stored, whatever `store` asked
    assert reply["metadata"] == {"run": "7"} and reply["user"] == "u1" and reply["store"] is False
    assert reply["temperature"] == 0.0 and reply["tool_choice"] == "auto" and reply["tools"] == []
    assert reply["text"] == {"format": {"type": "text"}} and reply["parallel_tool_calls"] is True

    tokenizer = fast.server.service.tokenizer
    generated = tokenizer.encode(SCRIPTS["hello"])
    close = tokenizer.encode("</think>", special=True)
    assert len(close) == 1
    usage = reply["usage"]
    assert usage["input_tokens"] == len(rendered_ids(fast, [{"role": "user", "content": "hi SCRIPT:hello"}]))
    assert usage["output_tokens"] == len(generated) + 1  # + the end-of-turn token
    assert usage["output_tokens_details"]["reasoning_tokens"] == generated.index(close[0]) + 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["speculation"]["committed_tokens"] == usage["output_tokens"]
    assert fast.backend.prompts[-1] == rendered_ids(fast, [{"role": "user", "content": "hi SCRIPT:hello"}])


def test_stream_events_are_ordered_and_agree_with_the_whole_response(fast) -> None:
    whole = ok(fast, {"input": "hi SCRIPT:hello"})
    events = stream(fast, {"input": "hi SCRIPT:hello"})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert kinds[-1] == "response.completed" and kinds.count("response.completed") == 1
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] and final["status"] == "completed"
    assert without_ids(final["output"]) == without_ids(whole["output"])
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert final["usage"]["output_tokens_details"] == whole["usage"]["output_tokens_details"]

    reasoning, message = final["output"]
    for item, delta, done, text in (
        (
            reasoning,
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "The user greets me.\nI greet back.",
        ),
        (message, "response.output_text.delta", "response.output_text.done", "Hello! How can I help?"),
    ):
        sequence = item_events(events, item["id"])
        deltas = [e["delta"] for e in events if e["type"] == delta and e["item_id"] == item["id"]]
        assert len(deltas) > 1 and "".join(deltas) == text  # really streamed, and the pieces add up
        assert sequence == [
            "response.output_item.added",
            "response.content_part.added",
            *[delta] * len(deltas),
            done,
            "response.content_part.done",
            "response.output_item.done",
        ]
        assert next(e for e in events if e["type"] == done and e["item_id"] == item["id"])["text"] == text
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1]
    assert added[1]["item"]["status"] == "in_progress" and added[1]["item"]["content"] == []
    # reasoning comes whole before the message begins
    assert kinds.index("response.output_text.delta") > max(
        i for i, k in enumerate(kinds) if k == "response.reasoning_text.delta"
    )


def test_reasoning_effort_none_turns_thinking_off(fast) -> None:
    reply = ok(fast, {"input": "SCRIPT:nothink", "reasoning": {"effort": "none"}})
    assert [item["type"] for item in reply["output"]] == ["message"]
    assert reply["output_text"] == "Plain answer, no reasoning."
    assert reply["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    assert reply["reasoning"] == {"effort": "none", "summary": None}
    messages = [{"role": "user", "content": "SCRIPT:nothink"}]
    assert fast.backend.prompts[-1] == rendered_ids(fast, messages, reasoning_effort="none")
    assert fast.backend.prompts[-1] != rendered_ids(fast, messages)


def test_instructions_and_developer_messages_become_the_system_message(fast) -> None:
    body = {
        "instructions": "Answer briefly.",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Use metric units."}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "SCRIPT:nothink"}],
            },
        ],
    }
    ok(fast, body)
    expected = rendered_ids(
        fast,
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": "SCRIPT:nothink"},
        ],
    )
    assert fast.backend.prompts[-1] == expected
    text = fast.server.service.tokenizer.decode(expected)
    assert "Answer briefly.\n\nUse metric units." in text


# ------------------------------------------------------------------------------------------ tool calls


def test_tool_call_and_its_output_round_trip(fast) -> None:
    question = {"role": "user", "content": "What is the weather in Paris? SCRIPT:tool"}
    first = ok(fast, {"input": [question], "tools": TOOLS})
    assert first["status"] == "completed" and first["tools"] == TOOLS
    assert [item["type"] for item in first["output"]] == ["reasoning", "message", "function_call"]
    call = first["output"][2]
    assert (
        call["id"].startswith("fc_") and call["call_id"].startswith("call_") and call["status"] == "completed"
    )
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris", "days": 3}
    assert first["output_text"] == "Let me check."

    # the whole output goes back as history, as an SDK user or Codex sends it, with the tool's result
    result = '{"forecast": "sunny"} SCRIPT:after_tool'
    history = [
        question,
        *first["output"],
        {"type": "function_call_output", "call_id": call["call_id"], "output": result},
    ]
    second = ok(fast, {"input": history, "tools": TOOLS})
    assert second["output_text"] == "It will be sunny in Paris for 3 days."
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] - 1
    chat = [
        question,
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Needs the weather tool.",
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["call_id"], "content": result},
    ]
    prompt = fast.backend.prompts[-1]
    assert prompt == rendered_ids(fast, chat, tools=CHAT_TOOLS)
    text = fast.server.service.tokenizer.decode(prompt)
    assert f"<tool_response>\n{result}\n</tool_response>" in text
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text


def test_streamed_tool_calls_match_the_whole_response(fast) -> None:
    whole = ok(fast, {"input": "SCRIPT:two_tools", "tools": TOOLS, "parallel_tool_calls": True})
    events = stream(fast, {"input": "SCRIPT:two_tools", "tools": TOOLS})
    final = events[-1]["response"]
    assert without_ids(final["output"]) == without_ids(whole["output"])
    calls = [item for item in final["output"] if item["type"] == "function_call"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"city": "Paris", "days": 3},
        {"city": "Rome", "days": 3},
    ]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call", "function_call"]
    for call in calls:
        sequence = item_events(events, call["id"])
        assert sequence == [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
        deltas = "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call["id"]
        )
        done = next(
            e
            for e in events
            if e["type"] == "response.function_call_arguments.done" and e["item_id"] == call["id"]
        )
        assert deltas == done["arguments"] == call["arguments"] and done["name"] == "get_weather"
        added = next(
            e for e in events if e["type"] == "response.output_item.added" and e["item"]["id"] == call["id"]
        )
        assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"


def test_tool_choice_none_and_a_named_choice(fast) -> None:
    off = ok(fast, {"input": "SCRIPT:tool", "tools": TOOLS, "tool_choice": "none"})
    assert [item["type"] for item in off["output"]] == ["reasoning", "message"]
    assert "<tool_call>" in off["output_text"]
    named = ok(
        fast,
        {"input": "SCRIPT:tool", "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}},
    )
    assert named["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert named["output"][-1]["type"] == "function_call"
    text = fast.server.service.tokenizer.decode(fast.backend.prompts[-1])
    assert "You must call the function get_weather in this reply" in text  # chat's instruction, shared


def test_reasoning_items_sent_back_become_the_turns_reasoning() -> None:
    from elpis.server.protocol import validate_request
    from elpis.server.responses_request import RESPONSES_IGNORED, ResponsesRequest, chat_body

    body = {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "S1"}, {"type": "summary_text", "text": "S2"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": ""},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "r"}],
            },
            {
                "type": "reasoning",
                "summary": [],
                "encrypted_content": "opaque",
            },  # nothing readable: no reasoning
            {"role": "assistant", "content": "done"},
        ]
    }
    messages = chat_body(validate_request(ResponsesRequest, body, RESPONSES_IGNORED))["messages"]
    assert messages == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "S1\n\nS2",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "done"},
    ]


# ------------------------------------------------------------------------------------------ limits


def test_max_output_tokens_gives_an_incomplete_response(fast) -> None:
    reply = ok(fast, {"input": "SCRIPT:repeat", "max_output_tokens": 9})
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["usage"]["output_tokens"] == 9 and reply["max_output_tokens"] == 9
    assert reply["output"][-1]["type"] == "message" and reply["output"][-1]["status"] == "incomplete"
    events = stream(fast, {"input": "SCRIPT:repeat", "max_output_tokens": 9})
    assert events[-1]["type"] == "response.incomplete"
    assert "response.completed" not in [e["type"] for e in events]
    final = events[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert without_ids(final["output"]) == without_ids(reply["output"])
    # thinking that never ends: all reasoning, then an empty incomplete message
    cut = ok(fast, {"input": "SCRIPT:hello", "max_output_tokens": 3})
    assert [item["type"] for item in cut["output"]] == ["reasoning", "message"]
    assert cut["output_text"] == "" and cut["usage"]["output_tokens_details"]["reasoning_tokens"] == 3


def test_context_limit_names_this_apis_fields(fast) -> None:
    reply = post(fast, {"input": "SCRIPT:hello", "max_output_tokens": 5000})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "max_output_tokens" and "max_output_tokens (5000)" in error["message"]
    reply = post(fast, {"input": "word " * 5000})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"


# ------------------------------------------------------------------------------------------ errors


def test_401_without_the_key_and_404_for_another_model(fast) -> None:
    bare = httpx.post(fast.url + "/v1/responses", json={"input": "hi"})
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
    wrong = post(fast, {"input": "hi"}, key="wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    other = post(fast, {"model": "gpt-5", "input": "hi"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert other.json()["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "send the whole conversation in input"),
        ({"conversation": "conv_1"}, "conversation", "send the whole conversation in input"),
        ({"background": True}, "background", "stateless"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt templates"),
        ({"truncation": "auto"}, "truncation", "never drops input"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "pattern"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "function tools only"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "other"}}, "tool_choice", "not among"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": "data:"},
                        ],
                    }
                ]
            },
            "input[0].content[1]",
            "only text",
        ),
        (
            {"input": [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "msg_1"}]},
            "input[1]",
            "send the whole conversation in input",
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]", "not supported"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].call_id",
            "no function_call",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "a"},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{nope"},
                ]
            },
            "input[1].arguments",
            "not valid JSON",
        ),
        ({"input": []}, "input", "empty"),
        ({"include": ["message.output_text.logprobs"]}, "include", "cannot be included"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "medium"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs name and schema"),
        (
            {"text": {"format": {"type": "json_schema", "name": "no spaces", "schema": {}}}},
            "text.format.name",
            "pattern",
        ),
        ({"tools": TOOLS, "text": {"format": {"type": "json_object"}}}, "text.format", "tools"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "reasoning.effort"),
        ({"max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"metadata": {"k": "v" * 600}}, "metadata", "512"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options", "Unsupported field"),
        ({"frobnicate": 1}, "frobnicate", "Unsupported field"),
    ],
)
def test_refused_fields_get_400_naming_the_field(fast, extra: dict, param: str, words: str) -> None:
    reply = post(fast, {"input": "hi SCRIPT:hello", **extra})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_bookkeeping_fields_codex_sends_are_accepted(fast) -> None:
    body = {
        "model": "scripted",
        "instructions": "You are a coding agent.",
        "input": "SCRIPT:nothink",
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conversation-1",
        "service_tier": "auto",
        "text": {"verbosity": "medium"},
    }
    reply = ok(fast, body)
    assert reply["status"] == "completed" and reply["parallel_tool_calls"] is False
    assert reply["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert reply["text"] == {"format": {"type": "text"}, "verbosity": "medium"}


def test_a_full_queue_gets_429(slow) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [
                client.post(
                    slow.url + "/v1/responses",
                    headers=AUTH,
                    json={"input": "SCRIPT:long", "max_output_tokens": 20},
                )
                for _ in range(4)
            ]
            return await asyncio.gather(*calls)

    replies = asyncio.run(burst())
    codes = sorted(r.status_code for r in replies)
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.json()["error"]["code"] == "queue_full" and int(refused.headers["Retry-After"]) >= 1


def test_client_disconnect_mid_stream_cancels_generation(slow) -> None:
    cancelled = slow.server.metrics.cancelled
    body = {"input": "SCRIPT:long", "stream": True}
    with httpx.stream("POST", slow.url + "/v1/responses", json=body, headers=AUTH, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("event: response.output_text.delta")
            if seen == 5:
                break  # leave mid-stream: the connection closes
    assert_cancelled_job_stopped(slow, cancelled)
    reply = ok(slow, {"input": "SCRIPT:hello"})
    assert reply["output_text"] == "Hello! How can I help?"


def test_a_failure_after_the_200_is_response_failed(qwen_text) -> None:
    service, _ = scripted_service(qwen_text)
    with running_server(lambda: service) as server:
        events = stream(server, {"input": "SCRIPT:explode"})
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "generation_failed"
        assert failed["error"]["message"]
        after = post(server, {"input": "SCRIPT:hello"})  # the engine failed: no garbage is ever served
        assert after.status_code == 503 and after.json()["error"]["code"] == "generation_failed"


def test_metrics_count_the_endpoint(fast) -> None:
    ok(fast, {"input": "SCRIPT:nothink"})
    metrics = httpx.get(fast.url + "/metrics", headers=AUTH).text
    assert 'elpis_requests_total{endpoint="/v1/responses",status="200"}' in metrics


FIELDS = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "stream",
    "text",
    "reasoning",
    "metadata",
    "store",
    "include",
    "truncation",
    "temperature",
    "top_p",
    "previous_response_id",
    "background",
    "prompt_cache_key",
]
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "x"])},
    optional={"text": json_values | st.text(max_size=4)},
)
item = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"]),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": st.text(max_size=4) | st.lists(part, max_size=2) | json_values,
        "call_id": st.sampled_from(["c1", "c2", ""]) | json_values,
        "name": st.sampled_from(["f", ""]),
        "arguments": st.sampled_from(["{}", '{"a": 1}', "[1]", "{", ""]),
        "output": st.text(max_size=4) | st.lists(part, max_size=2),
        "summary": st.lists(
            st.fixed_dictionaries({"type": st.just("summary_text"), "text": st.text(max_size=3)})
        ),
    },
)
responses_bodies = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=6),
    json_values | st.text(max_size=4) | st.lists(item, max_size=4),
    max_size=8,
).map(lambda body: {"input": [{"role": "user", "content": "q"}], **body})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=responses_bodies)
def test_translation_never_raises_anything_but_a_400(body: dict) -> None:
    """Any body: a Responses request and the chat request it becomes, or a 400 naming what is wrong."""
    from elpis.server.errors import APIError
    from elpis.server.protocol import ChatRequest, validate_request
    from elpis.server.responses_request import (
        RESPONSES_IGNORED,
        ResponsesRequest,
        chat_body,
        responses_vocabulary,
    )

    try:
        with responses_vocabulary():
            asked = validate_request(ResponsesRequest, body, RESPONSES_IGNORED)
            validate_request(ChatRequest, chat_body(asked))
            json.dumps(asked.settings())
    except APIError as err:
        assert err.status == 400 and err.message
        assert err.param is None or "messages" not in err.param  # this API's names
        json.dumps(err.body())


# --------------------------------------------------------------------------- the CPU reference backend


NO_THINK = {"reasoning": {"effort": "none"}}


def test_reference_model_streams_what_it_answers_whole(tiny) -> None:
    body = {"model": "tiny", "input": "Say something.", "max_output_tokens": 24, **NO_THINK}
    whole = ok(tiny, body)
    events = stream(tiny, body)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert whole["output_text"] and len(deltas) > 1 and "".join(deltas) == whole["output_text"]
    final = events[-1]["response"]
    assert final["status"] == whole["status"] and final["output_text"] == whole["output_text"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"] <= 24


def test_reference_model_json_schema_answers_follow_the_schema(tiny) -> None:
    text_format = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    body = {"input": "Weather?", "max_output_tokens": 64, "text": {"format": text_format}, **NO_THINK}
    reply = ok(tiny, body)
    assert reply["status"] == "completed" and reply["text"] == {"format": text_format}
    check_weather(reply["output_text"])
    events = stream(tiny, body)
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        == reply["output_text"]
    )
    free = ok(tiny, {"input": "Weather?", "max_output_tokens": 16, **NO_THINK})
    assert not free["output_text"].startswith("{")  # without the grammar the random model writes otherwise
    bad = post(
        tiny, {"input": "Weather?", "text": {"format": {**text_format, "schema": {"type": "nonsense"}}}}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text.format"
    assert bad.json()["error"]["message"].startswith("text.format: ")


def test_reference_model_named_tool_call_is_well_formed(tiny) -> None:
    """A random model cannot write a Qwen call by chance; held to the tool's grammar it writes one."""
    get_time = {
        "type": "function",
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    }
    body = {
        "input": "Time?",
        "tools": [*TOOLS, get_time],
        "tool_choice": {"type": "function", "name": "get_time"},
        "parallel_tool_calls": False,
        "max_output_tokens": 64,
        **NO_THINK,
    }
    reply = ok(tiny, body)
    [call] = [item for item in reply["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_time" and json.loads(call["arguments"]) in ({"zone": "UTC"}, {"zone": "CET"})
    free = ok(tiny, {**body, "tool_choice": "auto"})
    assert "function_call" not in [item["type"] for item in free["output"]]  # unheld, it writes no call


def test_codexs_per_turn_developer_messages_join_the_leading_system_message(fast) -> None:
    """Codex sends `instructions` and a developer message with each turn, after earlier turns: the prompt
    holds one system message with all of them in order (the template refuses one past the start)."""
    body = {
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": "Sandbox: read-only."},
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "message", "role": "developer", "content": "Sandbox: workspace-write."},
            {"type": "message", "role": "user", "content": "again SCRIPT:hello"},
        ],
    }
    ok(fast, body)
    text = fast.server.service.tokenizer.decode(fast.backend.prompts[-1])
    assert text.count("<|im_start|>system") == 1
    assert text.index("You are Codex.") < text.index("read-only") < text.index("workspace-write")
    assert text.index("workspace-write") < text.index("<|im_start|>user")
