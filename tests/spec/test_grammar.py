"""Structured output (`elpis.spec.grammar`): each tree row masked by the grammar's state after its own path,
and speculation committing exactly plain decoding's tokens under a grammar, greedy and sampled."""

from __future__ import annotations

import pytest
import torch

from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
from elpis.spec import generate as generate_module
from elpis.spec.grammar import Grammar, GrammarTokenizer
from tests.grammar_cases import WEATHER, check_weather

from .conftest import assert_speculation_is_plain, speculation_drafters

PROMPT = "Describe the weather as JSON:"


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models[1]  # the conftest's `vocabulary` is this model's


def _encode(model, text: str) -> list[int]:
    return model.tokenizer.encode(text, special=False)


def test_a_rows_mask_is_the_grammar_after_its_own_path(model, vocabulary) -> None:
    grammar = Grammar.json_schema(vocabulary, WEATHER)
    text = _encode(model, '{"sunny": true, "wind": 12')
    tree = grammar.start()
    tree.commit(text[:3])
    for cut in range(3, len(text) + 1):
        plain = grammar.start()
        plain.commit(text[:cut])
        assert tree.allowed_ids(text[3:cut]) == plain.allowed_ids(), cut
    # the path's own tokens change the mask: after '"wind": 12' a digit or the end of the number may follow
    after_number = set(tree.allowed_ids(text[3:]) or [])
    assert after_number != set(tree.allowed_ids() or [])
    assert _encode(model, ",")[0] in after_number
    # a path the grammar refuses is unreachable and left unmasked
    assert tree.allowed_ids(_encode(model, "xyz")) is None


def test_masking_puts_minus_infinity_where_the_grammar_forbids_and_nothing_else(model, vocabulary) -> None:
    grammar = Grammar.json_schema(vocabulary, WEATHER)
    constraint = grammar.start()
    vocab = vocabulary.vocab_size
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    paths = [(), tuple(_encode(model, '{"')), tuple(_encode(model, "zzz"))]
    got = constraint.masked(logits, paths)
    for r, path in enumerate(paths):
        allowed = constraint.allowed_ids(path)
        keep = torch.zeros(vocab, dtype=torch.bool)
        if allowed is None:
            keep[:] = True
        else:
            keep[allowed] = True
        assert torch.equal(got[r][keep], logits[r][keep])
        assert torch.all(got[r][~keep] == float("-inf"))
        # each row alone gives the same bits as among the others
        assert torch.equal(constraint.masked(logits[r:r + 1], [path])[0], got[r])
    start = set(constraint.allowed_ids() or [])
    assert _encode(model, "{")[0] in start and _encode(model, "x")[0] not in start
    assert got.dtype == logits.dtype


def test_the_grammar_opens_after_its_token(model, vocabulary) -> None:
    opener = _encode(model, "!")[0]
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=(opener,))
    constraint = grammar.start()
    assert constraint.allowed_ids() is None and not constraint.open
    assert constraint.allowed_ids(_encode(model, "any text")) is None
    free = _encode(model, "some reasoning")
    constraint.commit(free)
    assert not constraint.open
    # a row whose path crosses the opening token is constrained from there on
    assert constraint.allowed_ids((*free[:1], opener)) == Grammar.json_schema(vocabulary, WEATHER).start() \
        .allowed_ids()
    assert constraint.awaited == opener
    constraint.commit([opener, *_encode(model, "\n\n{")])
    assert constraint.open and constraint.awaited is None
    fresh = Grammar.json_schema(vocabulary, WEATHER).start()
    fresh.commit(_encode(model, "\n\n{"))
    assert constraint.allowed_ids() == fresh.allowed_ids()


@pytest.mark.parametrize(("schema", "match"), [
    ({"type": "nonsense"}, "nonsense"),
    ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "nope"),
    ({"minimum": "x"}, "minimum"),
    ([1, 2], "must be an object"),
])
def test_bad_schemas_are_refused_with_the_reason(vocabulary, schema, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Grammar.json_schema(vocabulary, schema)


def test_a_grammar_for_another_vocabulary_or_with_ignore_eos_is_refused(model, vocabulary) -> None:
    other = GrammarTokenizer(model.tokenizer.backend.to_str(), vocabulary.vocab_size + 64, vocabulary.eos_ids)
    prompt = tuple(_encode(model, PROMPT))
    request = GenerationRequest(prompt, 8, grammar=Grammar.json_schema(other, WEATHER))
    with pytest.raises(ValueError, match="grammar was built for"):
        SpeculativeGenerator(model.backend(), model.tokenizer).generate(request)
    with pytest.raises(ValueError, match="ignore_eos"):
        GenerationRequest(prompt, 8, ignore_eos=True, grammar=Grammar.json_schema(vocabulary, WEATHER))


def _request(model, grammar: Grammar | None, temperature: float, max_tokens: int = 48,
             **adjust) -> GenerationRequest:
    sampling = SamplingParams(temperature=temperature, top_k=40 if temperature else 0, seed=5, **adjust)
    return GenerationRequest(tuple(_encode(model, PROMPT)), max_tokens, sampling, top_logprobs=1,
                             grammar=grammar)


@pytest.mark.parametrize(("temperature", "adjust"), [
    (0.0, {}), (0.8, {}), (0.0, {"presence_penalty": 1.5}), (0.8, {"frequency_penalty": 0.5}),
])
def test_speculation_under_a_grammar_commits_plain_decoding(model, vocabulary, run, temperature: float,
                                                            adjust: dict) -> None:
    grammar = Grammar.json_schema(vocabulary, WEATHER)
    request = _request(model, grammar, temperature, **adjust)
    plain = run(model.backend(), model.tokenizer, request)
    # the plain output is the schema's, complete, and ends with the model's end of sequence
    assert plain.finish_reason == "stop", plain.text
    check_weather(plain.text)
    free = run(model.backend(), model.tokenizer, _request(model, None, temperature, **adjust))
    assert free.token_ids[:4] != plain.token_ids[:4]  # the grammar changes what a random model writes
    assert_speculation_is_plain(model, request, plain)


def test_speculation_with_a_grammar_opening_mid_answer_commits_plain_decoding(model, vocabulary, run) -> None:
    free = run(model.backend(), model.tokenizer, _request(model, None, 0.0, max_tokens=6))
    opener = free.token_ids[2]  # the grammar opens after the third token the model writes freely
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=(opener,))
    request = _request(model, grammar, 0.0)
    plain = run(model.backend(), model.tokenizer, request)
    assert plain.token_ids[:3] == free.token_ids[:3]
    check_weather(model.tokenizer.decode(plain.token_ids[3:-1]))  # then the schema's value, then the end
    oracle = speculation_drafters(model, request)["oracle"]
    got = run(model.backend(), model.tokenizer, request, oracle, tree_budget=16)
    assert got.same_output(plain)


def test_rows_masked_without_their_path_break_it(model, vocabulary, run, monkeypatch) -> None:
    """The check has teeth: mask every row as if its path were empty and deeper rows draw under the anchor's
    grammar state, so what the oracle's tree commits leaves the grammar (refused) or differs."""
    request = _request(model, Grammar.json_schema(vocabulary, WEATHER), 0.0)
    plain = run(model.backend(), model.tokenizer, request)
    monkeypatch.setattr(generate_module, "tree_paths", lambda tokens, parents: [()] * len(tokens))
    oracle = speculation_drafters(model, request)["oracle"]
    try:
        got = run(model.backend(), model.tokenizer, request, oracle, tree_budget=8)
    except RuntimeError as error:
        assert "grammar refused" in str(error)
    else:
        assert got.token_ids != plain.token_ids


def test_opening_tokens_are_awaited_in_their_order(model, vocabulary) -> None:
    first, second = _encode(model, "!")[0], _encode(model, "?")[0]
    constraint = Grammar.json_schema(vocabulary, WEATHER, opens_after=(first, second)).start()
    assert constraint.awaited == first
    constraint.commit([second, second])  # the second before the first opens nothing
    assert constraint.awaited == first
    constraint.commit([first])
    assert constraint.awaited == second and not constraint.open
    constraint.commit([second])
    assert constraint.awaited is None and constraint.open
    assert Grammar.json_schema(vocabulary, WEATHER).start().awaited is None
