"""End to end on the real reference backend (the `elpis synth --tiny` model, n-gram drafting), with the
official `openai` client."""

from __future__ import annotations

import math

import pytest

from elpis.server.service import ModelService
from elpis.spec import SpeculativeGenerator
from elpis.spec.drafters import NgramDrafter

from .conftest import running_server

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def tiny(tiny_model, qwen_text):
    from elpis.reference.loader import load_backend

    tokenizer, template = qwen_text

    def load() -> ModelService:
        backend = load_backend(tiny_model, max_context=2048, model_id="tiny")
        generator = SpeculativeGenerator(backend, tokenizer, drafter=NgramDrafter(), tree_budget=8)
        return ModelService("tiny", tokenizer, template, generator, max_context=2048)

    with running_server(load) as server:
        yield server


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
