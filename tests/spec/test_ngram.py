"""Prompt-lookup drafter: longest earlier suffix match, count-based log-probabilities, incremental index."""

from __future__ import annotations

import math
import random

import pytest

from elpis.spec.drafters import NgramDrafter


def test_continues_the_longest_match_past_the_end_of_a_periodic_context() -> None:
    drafter = NgramDrafter()
    block = drafter.propose([1, 2, 3, 4, 1, 2, 3], depth=6, top_k=2)
    assert [level[0][0] for level in block.candidates] == [4, 1, 2, 3, 4, 1]
    assert all(level[0][1] == 0.0 for level in block.candidates)


def test_no_match_proposes_nothing() -> None:
    assert NgramDrafter().propose([1, 2, 3, 4], depth=4, top_k=2).candidates == []
    assert NgramDrafter(min_ngram=2).propose([5, 1, 6, 1], depth=4, top_k=2).candidates == []
    assert NgramDrafter().propose([1, 2, 1], depth=0, top_k=2).candidates == []


def test_log_probabilities_come_from_match_counts() -> None:
    # "7" is followed by 8 twice and by 9 once; the chain follows 8, then the occurrences agreeing with it.
    context = [7, 8, 5, 7, 9, 6, 7, 8, 4, 7]
    block = NgramDrafter(max_ngram=1).propose(context, depth=2, top_k=3)
    first = block.candidates[0]
    assert [t for t, _ in first] == [8, 9]
    assert math.isclose(first[0][1], math.log(2 / 3)) and math.isclose(first[1][1], math.log(1 / 3))
    # After "7 8": followed by 4 (most recent) and 5, one each: most recent first.
    assert [t for t, _ in block.candidates[1]] == [4, 5]
    assert NgramDrafter(max_ngram=1).propose(context, depth=2, top_k=1).candidates[0] == [first[0]]


def test_the_longest_suffix_wins() -> None:
    # Suffix "1 2" was followed by 3; "2" alone was more often followed by 9.
    context = [2, 9, 2, 9, 1, 2, 3, 0, 1, 2]
    block = NgramDrafter().propose(context, depth=1, top_k=4)
    assert block.candidates == [[(3, 0.0)]]


@pytest.mark.parametrize("seed", range(5))
def test_incremental_index_equals_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    context = [rng.randrange(6) for _ in range(200)]
    incremental = NgramDrafter(max_ngram=3)
    for length in range(1, len(context), 7):
        assert (incremental.propose(context[:length], 5, 3)
                == NgramDrafter(max_ngram=3).propose(context[:length], 5, 3))
    # A context that is not an extension of the last one (a new sequence) rebuilds the index.
    other = [rng.randrange(6) for _ in range(50)]
    assert incremental.propose(other, 5, 3) == NgramDrafter(max_ngram=3).propose(other, 5, 3)
