"""A real model: prompt lookup on SmolLM2-135M with a repetitive prompt commits more than one token per
round, and the text equals plain decoding."""

from __future__ import annotations

import pytest

from elpis.spec import GenerationRequest
from elpis.spec.drafters import NgramDrafter

PROMPT = ("Copy the list exactly, again and again.\n"
          "apple, banana, cherry, date, elderberry, fig, grape\n"
          "apple, banana, cherry, date, elderberry, fig, grape\n"
          "apple, banana, cherry, date, elderberry, fig, grape\n"
          "apple, banana,")


@pytest.fixture(scope="module")
def smollm2():
    from elpis.reference.assets import ensure_smollm2
    from elpis.reference.loader import load_backend
    from elpis.text import load_tokenizer

    path = ensure_smollm2()
    return load_backend(path, max_context=512), load_tokenizer(path)


@pytest.mark.slow
def test_ngram_drafting_commits_several_tokens_per_round(smollm2, run) -> None:
    backend, tokenizer = smollm2
    request = GenerationRequest(tuple(tokenizer.encode(PROMPT)), 16)
    plain = run(backend, tokenizer, request)
    speculative = run(backend, tokenizer, request, NgramDrafter(), tree_budget=8)
    assert speculative.same_output(plain)
    assert "cherry, date" in plain.text  # the model does continue the pattern
    stats = speculative.stats
    assert stats.tokens_per_round > 1.0, stats
    assert max(stats.committed_per_round) > 1
    assert plain.stats.tokens_per_round == 1.0


@pytest.mark.slow
def test_drafting_what_a_grammar_forces_commits_more_per_round(smollm2, run, monkeypatch) -> None:
    """Under a JSON schema the keys and separators are forced; drafting them (`Constraint.forced_tokens`,
    `tree.with_forced`) commits the same text in fewer rounds than prompt lookup alone."""
    from elpis.spec.grammar import Constraint, Grammar, GrammarTokenizer
    from tests.grammar_cases import WEATHER, check_weather

    backend, tokenizer = smollm2
    vocabulary = GrammarTokenizer(tokenizer.backend.to_str(), backend.info.vocab_size,
                                  backend.info.stop_token_ids)
    prompt = tuple(tokenizer.encode("Today's weather as JSON: "))
    request = GenerationRequest(prompt, 48, grammar=Grammar.json_schema(vocabulary, WEATHER))
    plain = run(backend, tokenizer, request)
    check_weather(tokenizer.decode(plain.token_ids[:-1]))
    drafted = run(backend, tokenizer, request, NgramDrafter(), tree_budget=8)
    monkeypatch.setattr(Constraint, "forced_tokens", lambda self, limit: [])
    lookup_only = run(backend, tokenizer, request, NgramDrafter(), tree_budget=8)
    assert drafted.same_output(plain) and lookup_only.same_output(plain)
    assert drafted.stats.rounds < lookup_only.stats.rounds, (drafted.stats.rounds, lookup_only.stats.rounds)
