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
