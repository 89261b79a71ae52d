"""End to end on the real reference backend (the `elpis synth --tiny` model, n-gram drafting), with the
official `openai` client."""

from __future__ import annotations

import json
import math
import re

import pytest

from elpis.server.service import ModelService
from elpis.spec import SpeculativeGenerator
from elpis.spec.drafters import NgramDrafter
from tests.grammar_cases import WEATHER, check_weather

from .conftest import running_server

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def ask(server, text: str, **kwargs):
    return server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": text}], **kwargs
    )


def test_plain_and_streamed_chat_agree(tiny) -> None:
    whole = ask(tiny, "Say something.", max_tokens=24, extra_body=NO_THINK)
    assert whole.usage.completion_tokens <= 24 and whole.choices[0].message.content
    pieces = []
    for chunk in ask(tiny, "Say something.", max_tokens=24, extra_body=NO_THINK, stream=True):
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    assert len([p for p in pieces if p]) > 1


def test_thinking_on_starts_in_reasoning(tiny) -> None:
    reply = ask(tiny, "Think.", max_tokens=12)
    # the random model never closes </think>: all of it is reasoning, and the turn was cut by max_tokens
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.model_extra["reasoning_content"]
    assert reply.choices[0].message.content == ""


def test_max_tokens_is_exact(tiny) -> None:
    for limit in (1, 5, 17):
        reply = ask(tiny, "Count.", max_tokens=limit, extra_body={**NO_THINK, "ignore_eos": True})
        assert reply.usage.completion_tokens == limit and reply.choices[0].finish_reason == "length"


def test_stop_string_cuts_exactly(tiny) -> None:
    full = ask(tiny, "Write.", max_tokens=40, extra_body={**NO_THINK, "ignore_eos": True})
    text = full.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = ask(tiny, "Write.", max_tokens=40, stop=[stop], extra_body={**NO_THINK, "ignore_eos": True})
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs(tiny) -> None:
    reply = ask(tiny, "Hi.", max_tokens=6, logprobs=True, top_logprobs=3, extra_body=NO_THINK)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, rel_tol=1e-5)  # greedy: the best
        assert entry.logprob <= 0


def test_second_turn_reuses_the_prefix_cache(tiny) -> None:
    client = tiny.client()
    messages = [{"role": "user", "content": "First question about caching."}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, extra_body=NO_THINK)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Second question."},
    ]
    second = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, extra_body=NO_THINK
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1
    assert cached < second.usage.prompt_tokens


def test_usage_reports_recovered_round_faults(tiny, tiny_model, qwen_text) -> None:
    """A server whose rounds are damaged (elpis.spec.faults) answers with the clean server's text and says
    in usage which faults it detected and how many rounds it recomputed."""
    from elpis.reference.loader import load_backend
    from elpis.spec.faults import CORRUPT, DROPPED, REPEATED, FaultSchedule, FaultyBackend

    tokenizer, template = qwen_text
    schedule = FaultSchedule({1: (CORRUPT,), 2: (DROPPED, REPEATED)}, seed=3)

    def load() -> ModelService:
        backend = load_backend(tiny_model, max_context=2048, model_id="tiny")
        faulty = FaultyBackend(backend, schedule)
        generator = SpeculativeGenerator(faulty, tokenizer, drafter=NgramDrafter(), tree_budget=8)
        return ModelService("tiny", tokenizer, template, generator, max_context=2048)

    body = {**NO_THINK, "ignore_eos": True}
    clean = ask(tiny, "Count slowly.", max_tokens=24, extra_body=body)
    with running_server(load) as faulty_server:
        damaged = ask(faulty_server, "Count slowly.", max_tokens=24, extra_body=body)
    assert damaged.choices[0].message.content == clean.choices[0].message.content
    spec, clean_spec = damaged.usage.model_extra["speculation"], clean.usage.model_extra["speculation"]
    assert clean_spec["faults_detected"] == {} and clean_spec["rounds_recovered"] == 0
    assert spec["faults_detected"] == {CORRUPT: 1, DROPPED: 1, REPEATED: 1}
    assert spec["rounds_recovered"] == 2


def test_penalties_and_logit_bias_are_honoured(tiny, qwen_text) -> None:
    """Qwen's recommended settings (presence_penalty 1.5 beside top_k 20) are served, not refused, and they
    act: three words biased by +50 take every step, and the penalties change which of them comes next."""
    import openai

    tokenizer, _ = qwen_text
    words = {" one", " two", " three"}
    bias = {str(tokenizer.encode(word)[0]): 50 for word in words}
    body = {**NO_THINK, "ignore_eos": True}
    biased = ask(tiny, "Count.", max_tokens=16, logit_bias=bias, extra_body=body).choices[0].message.content
    penalties = {"frequency_penalty": 2.0, "presence_penalty": 1.5}
    extra = {**body, "repetition_penalty": 1.3}
    penalised = ask(tiny, "Count.", max_tokens=16, logit_bias=bias, **penalties,
                    extra_body=extra).choices[0].message.content
    for text in (biased, penalised):
        assert set(text.split()) <= {w.strip() for w in words}, text
    assert penalised != biased
    streamed = ask(tiny, "Count.", max_tokens=16, logit_bias=bias, **penalties, extra_body=extra, stream=True)
    assert "".join(c.delta.content or "" for chunk in streamed for c in chunk.choices) == penalised
    recommended = ask(tiny, "Hi.", max_tokens=8, temperature=0.7, top_p=0.8, presence_penalty=1.5,
                      extra_body={**NO_THINK, "top_k": 20})
    assert recommended.choices[0].finish_reason in ("stop", "length")
    for bad in ({"logit_bias": {"248320": 1}}, {"logit_bias": {"7": 1, "07": 1}}, {"presence_penalty": 2.5}):
        with pytest.raises(openai.BadRequestError) as info:
            ask(tiny, "Hi.", max_tokens=4, extra_body=bad)
        assert info.value.body["param"] == next(iter(bad)), info.value.body


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}


def test_json_schema_answers_follow_the_schema_whole_and_streamed(tiny) -> None:
    """A random model writes whatever its weights say; under response_format json_schema that is the schema's
    JSON, complete, ended by the model's own end of turn."""
    reply = ask(tiny, "Weather?", max_tokens=64, response_format=_schema_format(WEATHER), extra_body=NO_THINK)
    assert reply.choices[0].finish_reason == "stop"
    check_weather(reply.choices[0].message.content)
    pieces = []
    for chunk in ask(tiny, "Weather?", max_tokens=64, response_format=_schema_format(WEATHER),
                     extra_body=NO_THINK, stream=True):
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == reply.choices[0].message.content
    free = ask(tiny, "Weather?", max_tokens=16, extra_body=NO_THINK).choices[0].message.content
    assert not free.startswith("{")  # without the grammar the random model writes something else


def test_json_object_and_sampled_json_schema_answers(tiny) -> None:
    reply = ask(tiny, "Anything.", max_tokens=48, response_format={"type": "json_object"},
                extra_body={**NO_THINK, "ignore_eos": False})
    text = reply.choices[0].message.content
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still an object's opening
        assert text.lstrip().startswith("{")
    sampled = ask(tiny, "Weather?", max_tokens=64, temperature=0.9, top_p=0.95, seed=3, presence_penalty=1.5,
                  response_format=_schema_format(WEATHER), extra_body=NO_THINK)
    check_weather(sampled.choices[0].message.content)


def test_a_keyword_the_engine_lacks_is_ignored_unless_strict(tiny) -> None:
    unique = {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2, "uniqueItems": True}
    loose = {"type": "json_schema", "json_schema": {"name": "pair", "schema": unique}}  # strict absent
    reply = ask(tiny, "Pick.", max_tokens=16, response_format=loose, extra_body=NO_THINK)
    assert set(json.loads(reply.choices[0].message.content)) <= {"a", "b"}


def test_json_schema_after_reasoning_constrains_the_answer_only(tiny, qwen_text) -> None:
    """Thinking on: the grammar opens after </think>. A bias makes the random model close its reasoning at
    once; from there the grammar holds (it forbids a second </think>, bias or not)."""
    tokenizer, _ = qwen_text
    close = tokenizer.encode("</think>", special=True)
    assert len(close) == 1
    reply = ask(tiny, "Weather?", max_tokens=64, response_format=_schema_format(WEATHER),
                logit_bias={str(close[0]): 100})
    assert reply.choices[0].finish_reason == "stop"
    check_weather(reply.choices[0].message.content)


@pytest.mark.parametrize(("response_format", "extra", "match"), [
    (_schema_format({"type": "nonsense"}), {}, "nonsense"),
    (_schema_format({"type": "array", "uniqueItems": True}), {}, "uniqueItems"),  # strict: refused
    ({"type": "json_schema", "json_schema": {"name": "x"}}, {}, "schema"),
    ({"type": "json_schema"}, {}, "json_schema is required"),
    ({"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {}}}, {}, "name"),
    ({"type": "json_object"}, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "tool_choice"),
])
def test_bad_structured_output_requests_get_400_naming_the_field(tiny, response_format, extra,
                                                                match: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match=match) as caught:
        ask(tiny, "Weather?", max_tokens=8, response_format=response_format, extra_body=NO_THINK, **extra)
    assert "response_format" in str(caught.value.body)


CALL_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
                                                                              "maximum": 9}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]


def _check_calls(reply, names: set[str]) -> list:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = choice.message.tool_calls
    assert calls
    for call in calls:
        assert call.function.name in names
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city", "days"} and isinstance(arguments["city"], str)
            assert 1 <= arguments["days"] <= 9
        else:
            assert arguments in ({"zone": "UTC"}, {"zone": "CET"})
    return calls


def test_tool_choice_required_and_named_always_give_well_formed_calls(tiny) -> None:
    """A random model cannot write a Qwen tool call by chance; held to the tools' grammar it writes one that
    the server decodes into declared functions with arguments valid under their schemas."""
    required = ask(tiny, "Weather in Oslo?", max_tokens=96, tools=CALL_TOOLS, tool_choice="required",
                   extra_body=NO_THINK)
    _check_calls(required, {"get_weather", "get_time"})
    named = ask(tiny, "Weather in Oslo?", max_tokens=96, tools=CALL_TOOLS, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_time"}}, extra_body=NO_THINK)
    assert len(_check_calls(named, {"get_time"})) == 1
    free = ask(tiny, "Weather in Oslo?", max_tokens=24, tools=CALL_TOOLS, extra_body=NO_THINK)
    assert free.choices[0].finish_reason != "tool_calls"  # unheld (auto), the random model writes no call


def test_a_call_the_model_begins_under_auto_is_completed_well_formed(tiny, qwen_text) -> None:
    """tool_choice auto: text stays free, but once the model writes <tool_call> (here forced by a bias, after
    a reasoning block closed by another) the rest of the call follows the tools' grammar."""
    tokenizer, _ = qwen_text
    bias = {str(tokenizer.encode(marker, special=True)[0]): 100 for marker in ("<tool_call>", "</think>")}
    reply = ask(tiny, "Weather in Oslo?", max_tokens=96, tools=CALL_TOOLS, parallel_tool_calls=False,
                logit_bias=bias)
    assert len(_check_calls(reply, {"get_weather", "get_time"})) == 1


def test_structured_outputs_choice_regex_json_and_grammar(tiny) -> None:
    """vLLM's structured_outputs on chat and completions: the random model's answer is one of the choices,
    matches the regex, is the schema's JSON, or a sentence of the Lark grammar."""
    client = tiny.client()
    choices = ["positive", "negative", "neutral"]
    chat = ask(tiny, "Sentiment?", max_tokens=16,
               extra_body={**NO_THINK, "structured_outputs": {"choice": choices}})
    assert chat.choices[0].message.content in choices and chat.choices[0].finish_reason == "stop"
    completion = client.completions.create(model="tiny", prompt="Code:", max_tokens=24,
                                           extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}})
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", completion.choices[0].text), completion.choices[0].text
    as_text = client.completions.create(model="tiny", prompt="Weather:", max_tokens=64,
                                        extra_body={"structured_outputs": {"json": json.dumps(WEATHER)}})
    check_weather(as_text.choices[0].text)
    lark = 'start: "yes" | "no" | "maybe " NUM\nNUM: /[1-9]/\n'
    sentence = client.completions.create(model="tiny", prompt="Answer:", max_tokens=8,
                                         extra_body={"structured_outputs": {"grammar": lark}})
    assert re.fullmatch("yes|no|maybe [1-9]", sentence.choices[0].text), sentence.choices[0].text


@pytest.mark.parametrize(("structured", "extra", "match"), [
    ({"regex": "("}, {}, "regex"),
    ({"choice": ["a"], "regex": "a"}, {}, "exactly one"),
    ({"json": "{not json"}, {}, "not valid JSON"),
    ({"grammar": "start: ("}, {}, "grammar"),
    ({"choice": ["a"]}, {"response_format": {"type": "json_object"}}, "cannot be combined"),
])
def test_bad_structured_outputs_get_400(tiny, structured, extra, match: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match=match) as caught:
        ask(tiny, "Hi.", max_tokens=8, extra_body={**NO_THINK, "structured_outputs": structured}, **extra)
    assert "structured_outputs" in str(caught.value.body)
