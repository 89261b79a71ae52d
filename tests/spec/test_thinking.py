"""A thinking budget (`elpis.spec.thinking`): after `limit` tokens of open reasoning, the closing tokens are
committed as if generated, and the model answers after them; with and without a drafter, the same tokens.

The tiny random models never write Qwen's `</think>`, so each test names as the block's end a token the
unbudgeted request does or does not write where it needs to."""

from __future__ import annotations

import pytest

from elpis.spec import GenerationRequest, SamplingParams
from elpis.spec.thinking import ThinkingBudget, ThinkingTracker

from .conftest import assert_speculation_is_plain

PROMPT = "The quick brown fox jumps over"
MAX_TOKENS = 20


def _request(model, *, budget: ThinkingBudget | None = None, max_tokens: int = MAX_TOKENS,
             prompt: tuple[int, ...] | None = None, **sampling) -> GenerationRequest:
    ids = prompt if prompt is not None else tuple(model.tokenizer.encode(PROMPT))
    return GenerationRequest(ids, max_tokens, SamplingParams(**sampling), top_logprobs=2, ignore_eos=True,
                             thinking=budget)


def _unwritten(tokens: list[int], count: int) -> tuple[int, ...]:
    """`count` small ids the request never writes: closing tokens the model would not write itself."""
    return tuple(t for t in range(1000, 2000) if t not in tokens)[:count]


# -- the tracker ---------------------------------------------------------------------------------------------
def test_the_tracker_caps_rounds_at_the_budget_then_asks_for_the_closing_tokens() -> None:
    tracker = ThinkingTracker(ThinkingBudget(5, (7, 9)))
    assert tracker.cap(20) == 5 and tracker.cap(3) == 3 and tracker.due() == ()
    tracker.saw([1, 2, 3])
    assert tracker.cap(20) == 2 and tracker.due() == ()
    tracker.saw([4, 5])
    assert tracker.used == 5 and tracker.due() == (7, 9)
    tracker.saw([7], forced=True)  # a forced round of one row
    assert tracker.due() == (9,) and tracker.open
    tracker.saw([9, 4, 4], forced=False)  # the end closes the block: what follows is the answer
    assert not tracker.open and tracker.due() == () and tracker.cap(20) == 20 and tracker.used == 6


def test_the_model_closing_its_reasoning_itself_ends_the_budget() -> None:
    tracker = ThinkingTracker(ThinkingBudget(5, (7, 9)))
    tracker.saw([1, 9, 2, 3, 4, 5, 6])
    assert not tracker.open and tracker.used == 1 and tracker.due() == ()


def test_a_zero_budget_closes_at_once() -> None:
    tracker = ThinkingTracker(ThinkingBudget(0, (9,)))
    assert tracker.due() == (9,)


@pytest.mark.parametrize(("limit", "close", "message"), [
    (-1, (9,), "integer >= 0"), (True, (9,), "integer >= 0"), (2.0, (9,), "integer >= 0"),
    (3, (), "close the reasoning"), (3, (9, -1), "non-negative"), (3, (9, False), "non-negative"),
])  # fmt: skip
def test_a_malformed_budget_is_refused(limit, close, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ThinkingBudget(limit, close)


def test_a_request_refuses_a_budget_of_another_type(tiny_models) -> None:
    with pytest.raises(ValueError, match="ThinkingBudget"):
        GenerationRequest((1, 2), 4, thinking=5)  # type: ignore[arg-type]


def test_closing_tokens_outside_the_vocabulary_are_refused(tiny_models, run) -> None:
    model = tiny_models[0]
    vocab = model.backend().info.vocab_size
    request = _request(model, budget=ThinkingBudget(3, (vocab + 5,)))
    with pytest.raises(ValueError, match="thinking's closing token"):
        run(model.backend(), model.tokenizer, request)


# -- generation ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 5}])
@pytest.mark.parametrize("limit", [0, 3, 8])
def test_the_budget_closes_the_reasoning_and_the_model_answers_after_it(tiny_models, run, limit: int,
                                                                         sampling: dict) -> None:
    """The first `limit` tokens are the unbudgeted request's, then the closing tokens, then exactly what the
    model writes after a prompt that holds them (the randomness is keyed by absolute position)."""
    model = tiny_models[0]
    free = run(model.backend(), model.tokenizer, _request(model, **sampling))
    close = _unwritten(free.token_ids, 2)
    budgeted = _request(model, budget=ThinkingBudget(limit, close), **sampling)
    got = run(model.backend(), model.tokenizer, budgeted)
    assert got.token_ids[:limit] == free.token_ids[:limit]
    assert tuple(got.token_ids[limit : limit + len(close)]) == close
    prompt = (*model.tokenizer.encode(PROMPT), *got.token_ids[: limit + len(close)])
    rest = MAX_TOKENS - limit - len(close)
    after = run(model.backend(), model.tokenizer, _request(model, max_tokens=rest, prompt=prompt, **sampling))
    assert got.token_ids[limit + len(close) :] == after.token_ids
    assert got.finish_reason == "length" and len(got.token_ids) == MAX_TOKENS
    # the closing tokens' log-probabilities are the model's own, as every generated token's
    assert [lp[0] for lp in got.logprobs] == got.token_ids


def test_reasoning_the_model_closes_within_the_budget_is_left_alone(tiny_models, run) -> None:
    model = tiny_models[0]
    free = run(model.backend(), model.tokenizer, _request(model))
    end = free.token_ids[2]  # the model "closes" its reasoning at its third token
    got = run(model.backend(), model.tokenizer,
              _request(model, budget=ThinkingBudget(5, (*_unwritten(free.token_ids, 1), end))))
    assert got.same_output(free)


def test_max_tokens_cuts_the_closing_tokens(tiny_models, run) -> None:
    model = tiny_models[0]
    free = run(model.backend(), model.tokenizer, _request(model))
    close = _unwritten(free.token_ids, 3)
    budgeted = _request(model, budget=ThinkingBudget(4, close), max_tokens=5)
    got = run(model.backend(), model.tokenizer, budgeted)
    assert got.token_ids == [*free.token_ids[:4], close[0]] and got.finish_reason == "length"


def test_a_closing_token_that_is_a_stop_ends_the_request(tiny_models, run) -> None:
    model = tiny_models[0]
    free = run(model.backend(), model.tokenizer, _request(model))
    close = _unwritten(free.token_ids, 2)
    request = GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), MAX_TOKENS, SamplingParams(),
                                stop_token_ids=(close[0],), ignore_eos=True,
                                thinking=ThinkingBudget(3, close))
    got = run(model.backend(), model.tokenizer, request)
    assert got.token_ids == [*free.token_ids[:3], close[0]] and got.finish_reason == "stop"


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 30, "seed": 5}])
@pytest.mark.parametrize("limit", [0, 5])
def test_speculation_under_a_budget_is_plain_decoding(tiny_models, run, limit: int, sampling: dict) -> None:
    """Drafters at budgets 4 and 16 give plain decoding's tokens, text and log-probabilities: no round
    commits past the budget, and the closing tokens come at the same place."""
    model = tiny_models[1]
    free = run(model.backend(), model.tokenizer, _request(model, **sampling))
    request = _request(model, budget=ThinkingBudget(limit, _unwritten(free.token_ids, 2)), **sampling)
    plain = run(model.backend(), model.tokenizer, request)
    assert plain.token_ids != free.token_ids
    assert_speculation_is_plain(model, request, plain)
