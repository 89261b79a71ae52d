"""Penalties and logit_bias (`elpis.spec.penalties`): the documented arithmetic, each tree row counting its
own path, and speculation committing exactly plain decoding's tokens with them, greedy and sampled."""

from __future__ import annotations

import math
import random

import pytest
import torch

from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
from elpis.spec import generate as generate_module
from elpis.spec.drafters import OracleDrafter
from elpis.spec.penalties import History, tree_paths

from .conftest import assert_speculation_is_plain

VOCAB = 50
PROMPT = "one two three, one two three, one two three, one two"
PENALISED = {"presence_penalty": 1.5, "frequency_penalty": 0.4, "repetition_penalty": 1.3}
# Biased by +30 below: a random tiny model's logits spread ~4 around its top, so these three win every step
# and the penalties decide among them (unbiased, it never repeats a token and no penalty bites).
WORDS = (" one", " two", " three")


def _favoured(model) -> tuple[tuple[int, float], ...]:
    return tuple((model.tokenizer.encode(word)[0], 30.0) for word in WORDS)


def _by_hand(row: list[float], params: SamplingParams, prompt: list[int],
             generated: list[int]) -> list[float]:
    """The module docstring's three steps, one Python float at a time."""
    counts = {t: generated.count(t) for t in set(generated)}
    seen = set(prompt) | set(generated)
    bias = dict(params.logit_bias)
    out = []
    for t, x in enumerate(row):
        if t in seen and params.repetition_penalty != 1.0:
            x = x * (1.0 / params.repetition_penalty) if x > 0 else x * params.repetition_penalty
        c = float(counts.get(t, 0))
        x = x - (c * params.frequency_penalty + (1.0 if c > 0 else 0.0) * params.presence_penalty)
        out.append(x + bias.get(t, 0.0))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_adjusted_rows_follow_the_documented_arithmetic_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    params = SamplingParams(presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                            repetition_penalty=rng.uniform(0.5, 2), logit_bias=((3, -7.5), (11, 2.25)))
    prompt = [rng.randrange(VOCAB) for _ in range(12)]
    generated = [rng.randrange(VOCAB) for _ in range(9)]
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    logits[0, 5] = 0.0  # the repetition penalty's x <= 0 branch on a zero
    history = History(params, prompt, VOCAB)
    history.commit(generated[:4])
    paths = [(), (generated[4],), tuple(generated[4:])]
    got = history.adjusted(logits, paths)
    assert got.dtype == torch.float64
    for r, path in enumerate(paths):
        want = _by_hand([float(v) for v in logits[r].tolist()], params, prompt, generated[:4] + list(path))
        assert got[r].tolist() == want


def test_a_rows_path_counts_as_if_committed() -> None:
    params = SamplingParams(**PENALISED, logit_bias=((0, 1.0),))
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(7))
    tree = History(params, [1, 2, 3], VOCAB)
    tree.commit([4, 4])
    plain = History(params, [1, 2, 3], VOCAB)
    plain.commit([4, 4, 9, 4])
    row = tree.adjusted(logits, [(), (9, 4)])[1]
    assert torch.equal(row, plain.adjusted(logits[1:], [()])[0])
    # ...and the path changes the row: a row that ignored it would differ at tokens 9 and 4.
    ignored = tree.adjusted(logits[1:], [()])[0]
    assert not torch.equal(row, ignored)
    assert {int(t) for t in torch.nonzero(row != ignored).flatten()} == {4, 9}


def test_the_prompt_feeds_only_the_repetition_penalty() -> None:
    logits = torch.full((1, VOCAB), 2.0)
    for kwargs, changed in (({"presence_penalty": 1.0}, False), ({"frequency_penalty": 1.0}, False),
                            ({"repetition_penalty": 2.0}, True)):
        row = History(SamplingParams(**kwargs), [6], VOCAB).adjusted(logits, [()])[0]
        assert (row[6].item() != 2.0) is changed
        assert torch.all(row[:6] == 2.0) and torch.all(row[7:] == 2.0)


def test_tree_paths_run_from_the_anchor_to_each_row() -> None:
    assert tree_paths([7, 1, 2, 3, 4], [-1, 0, 0, 1, 3]) == [(), (1,), (2,), (1, 3), (1, 3, 4)]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"presence_penalty": math.nan}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"logit_bias": ((1, 101.0),)}, "logit_bias values"),
    ({"logit_bias": ((1, 1.0), (1, 2.0))}, "twice"),
    ({"logit_bias": ((-1, 1.0),)}, "token ids"),
    ({"logit_bias": {1: 1.0}}, "tuple"),
])
def test_bad_adjustments_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_neutral_values_adjust_nothing() -> None:
    assert not SamplingParams(presence_penalty=0.0, frequency_penalty=0, repetition_penalty=1).adjusts_logits
    assert SamplingParams(logit_bias=((1, 0.5),)).adjusts_logits
    with pytest.raises(ValueError, match="adjust"):
        History(SamplingParams(), [1], VOCAB)


def test_a_bias_outside_the_vocabulary_is_refused_before_anything_runs(tiny_models) -> None:
    model = tiny_models[0]
    backend = model.backend()
    request = GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), 4,
                                SamplingParams(logit_bias=((backend.info.vocab_size, 1.0),)))
    with pytest.raises(ValueError, match="logit_bias token ids"):
        SpeculativeGenerator(backend, model.tokenizer).generate(request)  # raised by the call, not a round


def _request(model, temperature: float, max_tokens: int = 16, **adjust) -> GenerationRequest:
    sampling = SamplingParams(temperature=temperature, top_k=40 if temperature else 0, seed=11, **adjust)
    return GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), max_tokens, sampling, top_logprobs=1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculation_with_penalties_commits_plain_decoding(tiny_models, run, temperature: float) -> None:
    model = tiny_models[1]
    request = _request(model, temperature, **PENALISED, logit_bias=_favoured(model))
    plain = run(model.backend(), model.tokenizer, request)
    biased_only = run(model.backend(), model.tokenizer,
                      _request(model, temperature, logit_bias=_favoured(model)))
    assert plain.token_ids != biased_only.token_ids  # the penalties change the text here
    assert_speculation_is_plain(model, request, plain)


def test_rows_that_ignore_their_path_break_it(tiny_models, run, monkeypatch) -> None:
    """The check has teeth: count only the committed tokens (every path empty) and the oracle's deeper rows
    draw from other logits than plain decoding does."""
    model = tiny_models[1]
    request = _request(model, 0.0, max_tokens=24, frequency_penalty=2.0, logit_bias=_favoured(model))
    plain = run(model.backend(), model.tokenizer, request)
    monkeypatch.setattr(generate_module, "tree_paths", lambda tokens, parents: [()] * len(tokens))
    oracle = OracleDrafter(model.backend(), request.sampling, prompt_length=len(request.prompt_ids))
    got = run(model.backend(), model.tokenizer, request, oracle, tree_budget=8)
    assert got.token_ids != plain.token_ids


def test_an_oracle_for_adjusted_requests_needs_the_prompt_length(tiny_models) -> None:
    with pytest.raises(ValueError, match="prompt's length"):
        OracleDrafter(tiny_models[0].backend(), SamplingParams(presence_penalty=1.0))
