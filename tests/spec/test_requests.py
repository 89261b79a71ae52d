"""Request semantics with multi-token commits: max_tokens, stop ids, stop strings, cancellation, context
limit, log-probabilities, stats and the cost model, each checked against plain decoding."""

from __future__ import annotations

import pytest

from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
from elpis.spec.drafters import NgramDrafter, OracleDrafter

PROMPT = "Speculation must never change the text:"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models[0]


@pytest.fixture(scope="module")
def prompt(model) -> tuple[int, ...]:
    return tuple(model.tokenizer.encode(PROMPT))


def _oracle(model, request: GenerationRequest) -> OracleDrafter:
    return OracleDrafter(model.backend(), request.sampling)


@pytest.fixture(scope="module")
def plain_text(model, prompt, run):
    """Plain greedy decoding without stops: the reference the stop tests cut from."""
    return run(model.backend(), model.tokenizer, GenerationRequest(prompt, MAX_TOKENS, ignore_eos=True))


def test_max_tokens_is_exact_within_one_commit(model, prompt, run, recording) -> None:
    request = GenerationRequest(prompt, 5, ignore_eos=True)
    backend = recording(model.backend())
    outcome = run(backend, model.tokenizer, request, _oracle(model, request), tree_budget=16)
    assert len(outcome.token_ids) == 5 and outcome.finish_reason == "length"
    assert outcome.stats.rounds == 1 and outcome.stats.committed_per_round == [5]
    assert backend.depths() == [4]  # no row deeper than the budget left: alternatives fill the width


def test_a_stop_id_inside_a_commit_ends_there(model, prompt, run, plain_text) -> None:
    tokens = plain_text.token_ids
    k = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    request = GenerationRequest(prompt, MAX_TOKENS, stop_token_ids=(tokens[k],), ignore_eos=True)
    plain = run(model.backend(), model.tokenizer, request)
    speculative = run(model.backend(), model.tokenizer, request, _oracle(model, request), tree_budget=16)
    for outcome in (plain, speculative):
        assert outcome.token_ids == tokens[: k + 1] and outcome.finish_reason == "stop"
        assert outcome.text == model.tokenizer.decode(tokens[:k], skip_special=True)  # no stop token text
        assert outcome.stats.completion_tokens == k + 1
    assert speculative.stats.rounds == 1


def _token_spans(tokenizer, tokens: list[int]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for i in range(len(tokens)):
        end = len(tokenizer.decode(tokens[: i + 1], skip_special=True))
        spans.append((start, end))
        start = end
    return spans


@pytest.mark.parametrize("budget", [1, 2, 16])
def test_a_stop_string_is_cut_exactly_across_tokens_and_rounds(model, prompt, run, plain_text,
                                                                budget: int) -> None:
    text, tokens = plain_text.text, plain_text.token_ids
    spans = _token_spans(model.tokenizer, tokens)
    # A stop string from the middle of one token's text to the middle of a later token's text.
    first = next(i for i in range(2, len(spans)) if spans[i][1] - spans[i][0] >= 2)
    last = next(i for i in range(first + 2, len(spans)) if spans[i][1] - spans[i][0] >= 2)
    stop = text[spans[first][0] + 1 : spans[last][0] + 1]
    cut = text.find(stop)
    assert cut != -1
    completing = next(i for i, (_, end) in enumerate(spans) if end >= cut + len(stop))
    request = GenerationRequest(prompt, MAX_TOKENS, stop_strings=("never-appears", stop), ignore_eos=True)
    drafter = _oracle(model, request) if budget > 1 else None
    outcome = run(model.backend(), model.tokenizer, request, drafter, tree_budget=budget)
    assert outcome.finish_reason == "stop"
    assert outcome.text == text[:cut]
    assert outcome.token_ids == tokens[: completing + 1]
    # Every delta is a piece of the cut text in order: nothing past the cut was ever handed out.
    position = 0
    for step in outcome.steps:
        assert text[:cut][position : position + len(step.text)] == step.text
        position += len(step.text)


def test_text_that_may_start_a_stop_string_is_held_back_only_while_it_may(model, prompt, run,
                                                                          plain_text) -> None:
    text, tokens = plain_text.text, plain_text.token_ids
    middle = len(text) // 2
    stop = text[middle : middle + 4] + "\x00"  # never completes: the text has no NUL
    request = GenerationRequest(prompt, MAX_TOKENS, stop_strings=(stop,), ignore_eos=True)
    outcome = run(model.backend(), model.tokenizer, request)
    assert outcome.text == text and outcome.finish_reason == "length"
    released, held_at_some_point = 0, False
    for i, step in enumerate(outcome.steps[:-1]):
        released += len(step.text)
        # Text available after token i (whole characters only), minus its longest suffix that is a proper
        # prefix of the stop string: exactly that much must be out.
        decoded = [model.tokenizer.decode(tokens[:j], skip_special=True) for j in range(i + 2)]
        available = next(d for d in reversed(decoded) if not d.endswith("\ufffd"))
        held = max(k for k in range(len(stop)) if available.endswith(stop[:k]))
        assert released == len(available) - held
        held_at_some_point |= held > 0
    assert held_at_some_point


def test_should_stop_cancels_between_rounds(model, prompt, run) -> None:
    request = GenerationRequest(prompt, MAX_TOKENS, ignore_eos=True)
    generator = SpeculativeGenerator(model.backend(), model.tokenizer, _oracle(model, request), tree_budget=3)
    steps = []
    for step in generator.generate(request, should_stop=lambda: len(steps) >= 2):
        steps.append(step)
    assert [s.finish_reason for s in steps] == [None, None, "cancelled"]
    assert [len(s.token_ids) for s in steps] == [3, 3, 0]
    assert steps[-1].stats.completion_tokens == 6 and steps[-1].stats.rounds == 2


def test_a_full_context_ends_with_length(model, prompt, run) -> None:
    request = GenerationRequest(prompt, MAX_TOKENS, ignore_eos=True)
    limit = len(prompt) + 3  # room for 4 tokens: the last one is drawn from row max_context - 1
    plain = run(model.backend(max_context=limit), model.tokenizer, request)
    speculative = run(model.backend(max_context=limit), model.tokenizer, request, _oracle(model, request),
                      tree_budget=16)
    assert plain.finish_reason == speculative.finish_reason == "length"
    assert plain.token_ids == speculative.token_ids and len(plain.token_ids) == 4


def test_logprobs_and_stats(model, prompt, run) -> None:
    request = GenerationRequest(prompt, MAX_TOKENS, SamplingParams(temperature=0.8, seed=3), ignore_eos=True,
                                top_logprobs=3)
    plain = run(model.backend(), model.tokenizer, request)
    speculative = run(model.backend(), model.tokenizer, request, _oracle(model, request), tree_budget=5)
    assert speculative.same_output(plain)
    assert len(plain.logprobs) == MAX_TOKENS
    for _token, logprob, alternatives in plain.logprobs:
        assert logprob <= 0.0 and len(alternatives) == 3
        assert alternatives[0][1] >= logprob  # the top alternative is at least as likely as the sampled one
    stats = speculative.stats
    assert stats.prompt_tokens == len(prompt) and stats.completion_tokens == MAX_TOKENS
    assert stats.committed_per_round == [5, 5, 2] and stats.accepted_depths == [4, 4, 1]
    assert stats.rounds == 3 and stats.tokens_per_round == 4.0
    assert plain.stats.committed_per_round == [1] * MAX_TOKENS


def test_prefix_cache_hits_are_reported(model, prompt, run) -> None:
    backend = model.backend()
    request = GenerationRequest(prompt, 3, ignore_eos=True)
    first = run(backend, model.tokenizer, request)
    second = run(backend, model.tokenizer, request)
    assert first.stats.cached_tokens == 0 and second.stats.cached_tokens == len(prompt) - 1
    assert second.same_output(first)


class CostReporting:
    """The reference backend plus a verify cost table: rows beyond 3 cost twice as much."""

    def __init__(self, inner) -> None:
        self.inner, self.info = inner, inner.info
        self.begin, self.verify, self.commit = inner.begin, inner.verify, inner.commit
        self.finish, self.position = inner.finish, inner.position

    def verify_cost(self, rows: int) -> float:
        return 1.0 if rows <= 3 else 2.0


def test_the_cost_model_picks_the_row_count(model, prompt, run) -> None:
    request = GenerationRequest(prompt, MAX_TOKENS, ignore_eos=True)
    plain = run(model.backend(), model.tokenizer, request)
    costed = run(CostReporting(model.backend()), model.tokenizer, request, _oracle(model, request),
                 tree_budget=8)
    assert costed.same_output(plain)
    # The oracle's chain has probability 1 per row: 3 rows give 3 tokens per unit, 8 rows 8 per 2 units.
    assert costed.stats.tree_rows[0] == 8
    cheap_wins = run(CostReporting(model.backend()), model.tokenizer, request, _oracle(model, request),
                     tree_budget=5)
    assert cheap_wins.stats.tree_rows[0] == 3  # 3 tokens per unit beats 5 per 2 units


def test_bad_requests_are_refused_before_anything_runs(model, prompt) -> None:
    backend = model.backend()
    generator = SpeculativeGenerator(backend, model.tokenizer, NgramDrafter())
    model_stops = backend.info.stop_token_ids
    too_many = tuple(range(10, 10 + 5 - len(model_stops)))
    with pytest.raises(ValueError, match="at most 4 stop token ids"):
        generator.generate(GenerationRequest(prompt, 4, stop_token_ids=too_many))
    # ignore_eos drops the model's own ids, so four request ids fit.
    generator.generate(GenerationRequest(prompt, 4, stop_token_ids=(10, 11, 12, 13), ignore_eos=True))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generator.generate(GenerationRequest((1, backend.info.vocab_size), 4))
    short = SpeculativeGenerator(model.backend(max_context=len(prompt) - 1), model.tokenizer)
    with pytest.raises(ValueError, match="context"):
        short.generate(GenerationRequest(prompt, 4))
    with pytest.raises(ValueError, match="max_tokens"):
        GenerationRequest(prompt, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        generator.generate(GenerationRequest(prompt, 2**48))
    with pytest.raises(ValueError, match="prompt_ids"):
        GenerationRequest((), 4)
    with pytest.raises(ValueError, match="stop strings"):
        GenerationRequest(prompt, 4, stop_strings=("",))
    with pytest.raises(ValueError, match="top_logprobs"):
        GenerationRequest(prompt, 4, top_logprobs=21)
    with pytest.raises(ValueError, match="tree budget"):
        SpeculativeGenerator(backend, model.tokenizer, NgramDrafter(), tree_budget=17)
    with pytest.raises(RuntimeError, match="no active sequence"):
        backend.position()
