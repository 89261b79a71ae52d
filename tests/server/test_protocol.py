"""Request validation: every problem is a 400 naming the field; nothing else ever escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elpis.server.errors import APIError
from elpis.server.protocol import (
    IGNORED_FIELDS,
    ChatRequest,
    CompletionRequest,
    RenderRequest,
    TokenizeRequest,
    parse_json_body,
    validate_request,
)

USER = [{"role": "user", "content": "hi"}]


def refused(model, body) -> APIError:
    with pytest.raises(APIError) as info:
        validate_request(model, body)
    assert info.value.status == 400
    return info.value


def test_unknown_fields_are_named() -> None:
    err = refused(ChatRequest, {"messages": USER, "frobnicate": 1})
    assert err.message == "Unsupported field: frobnicate" and err.param == "frobnicate"
    err = refused(ChatRequest, {"messages": [{"role": "user", "content": "x", "mood": "happy"}]})
    assert err.param == "messages[0].mood"


def test_ignored_fields_are_accepted_with_any_value() -> None:
    body = {"messages": USER, **{name: {"any": ["value"]} for name in IGNORED_FIELDS}}
    assert validate_request(ChatRequest, body).messages


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": "1.5"}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"x1": 2.0}}, "logit_bias"),
        ({"logit_bias": {"-1": 2.0}}, "logit_bias"),
        ({"logit_bias": {"1": 100.5}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format.json_schema.name"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_object", "json_schema": {"name": "x", "schema": {}}}},
         "response_format"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": True, "mode": 1}}, "chat_template_kwargs.mode"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(extra: dict, param: str) -> None:
    assert refused(ChatRequest, {"messages": USER, **extra}).param == param


def test_penalties_and_logit_bias_are_read() -> None:
    body = {"messages": USER, "presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
            "logit_bias": {"12": -100, "3": 2.5}}
    chat = validate_request(ChatRequest, body)
    assert (chat.presence_penalty, chat.frequency_penalty, chat.repetition_penalty) == (1.5, -0.5, 1.1)
    assert chat.bias_pairs() == ((3, 2.5), (12, -100.0))
    assert refused(ChatRequest, {"messages": USER, "logit_bias": {"7": 1, "07": 2}}).param == "logit_bias"


def test_message_shapes() -> None:
    err = refused(
        ChatRequest, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    )
    assert "only text content parts" in err.message and err.param == "messages[0].content[0]"
    assert refused(ChatRequest, {"messages": [{"role": "robot", "content": "x"}]}).param == "messages[0]"
    assert refused(ChatRequest, {"messages": []}).param == "messages"
    assert refused(ChatRequest, {"messages": [{"role": "assistant", "content": None}]}).param == "messages[0]"
    ok = validate_request(
        ChatRequest,
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "w"}},
            "stop": ["END", 7],
            "stop_token_ids": [9],
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "seed": 5,
            "top_k": -1,
        },
    )
    assert ok.stop_strings() == ("END",) and ok.stop_ids() == (7, 9) and ok.include_usage()
    assert ok.tools_enabled()


def test_completion_prompts() -> None:
    assert validate_request(CompletionRequest, {"prompt": [[1, 2, 3]]}).prompt_ids() == [1, 2, 3]
    assert validate_request(CompletionRequest, {"prompt": "abc"}).prompt_ids() is None
    assert refused(CompletionRequest, {"prompt": [[1], [2]]}).param == "prompt"
    # a one-element list of text is one prompt (some clients always send a list); a batch is refused by name
    single = validate_request(CompletionRequest, {"prompt": ["abc"]})
    assert single.prompt == "abc" and single.prompt_ids() is None
    batch = refused(CompletionRequest, {"prompt": ["a", "b"]})
    assert batch.param == "prompt" and "batch of 2 prompts" in str(batch)
    assert refused(CompletionRequest, {"prompt": [""]}).param == "prompt"
    assert refused(CompletionRequest, {"prompt": ""}).param == "prompt"
    assert refused(CompletionRequest, {"prompt": "x", "echo": True}).param == "echo"
    assert (
        refused(CompletionRequest, {"prompt": "x", "max_completion_tokens": 3}).param
        == "max_completion_tokens"
    )


def test_render_and_tokenize_rules() -> None:
    assert refused(RenderRequest, {"messages": USER, "stream": True}).param == "stream"
    assert refused(TokenizeRequest, {"prompt": "a", "messages": USER}).param == "prompt"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"{", "not valid JSON"),
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'{"a": NaN}', "NaN"),
        (b"[1]", "JSON object"),
        (b"[" * 100_000, "not valid JSON"),
    ],
)
def test_bodies_are_parsed_strictly(raw: bytes, message: str) -> None:
    with pytest.raises(APIError) as info:
        parse_json_body(raw)
    assert info.value.status == 400 and message in info.value.message


# ------------------------------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "messages",
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "logprobs",
    "top_logprobs",
    "n",
    "response_format",
    "reasoning_effort",
    "chat_template_kwargs",
    "prompt",
    "return_token_ids",
    "ignore_eos",
    "max_completion_tokens",
    "parallel_tool_calls",
    "user",
    "tokens",
]
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"])},
    optional={
        "content": json_values | st.text(max_size=5),
        "tool_calls": json_values,
        "tool_call_id": json_values,
        "name": json_values,
    },
)
bodies = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=6),
    json_values | st.lists(message, max_size=3),
    max_size=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, model=st.sampled_from([ChatRequest, CompletionRequest, RenderRequest, TokenizeRequest]))
def test_validation_never_raises_anything_but_a_400(body: dict, model) -> None:
    try:
        validate_request(model, body)
    except APIError as err:
        assert err.status == 400 and err.message
        json.dumps(err.body())
