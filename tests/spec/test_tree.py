"""Tree builder: best-first rows in the acceptor's format, checked against brute-force enumeration."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from elpis.backend import DraftBlock
from elpis.spec.tree import (
    MAX_ROWS,
    DraftTree,
    build_tree,
    choose_row_count,
    expected_tokens,
    verify_costs,
    with_forced,
)

VOCAB = 1000


def _brute_force(levels: list[list[tuple[int, float]]], max_rows: int) -> list[tuple[int, ...]]:
    """Every rank path, ordered by (score desc, rank path), first max_rows - 1 of them."""
    paths = []
    for depth in range(1, len(levels) + 1):
        for ranks in itertools.product(*(range(len(levels[d])) for d in range(depth))):
            score = 0.0
            for d, r in enumerate(ranks):
                score += levels[d][r][1]
            paths.append((-score, ranks))
    paths.sort()
    return [ranks for _, ranks in paths[: max_rows - 1]]


def _rank_paths(tree: DraftTree, levels: list[list[tuple[int, float]]]) -> list[tuple[int, ...]]:
    """Recover each row's rank path from its tokens (tokens are distinct within a level)."""
    out: list[tuple[int, ...]] = [()]
    for row in range(1, len(tree)):
        rank = [t for t, _ in levels[tree.depths[row] - 1]].index(tree.tokens[row])
        out.append((*out[tree.parents[row]], rank))
    return out[1:]


def _check_format(tree: DraftTree, anchor: int) -> None:
    assert tree.tokens[0] == anchor and tree.parents[0] == -1 and tree.depths[0] == 0
    for row in range(1, len(tree)):
        assert 0 <= tree.parents[row] < row
        assert tree.depths[row] == tree.depths[tree.parents[row]] + 1


def test_budget_one_is_the_anchor_alone() -> None:
    block = DraftBlock([[(5, -0.1)], [(6, -0.2)]])
    tree = build_tree(9, block, 1, vocab_size=VOCAB)
    assert (tree.tokens, tree.parents) == ((9,), (-1,))


def test_a_chain_draft_gives_a_chain() -> None:
    block = DraftBlock([[(t, 0.0)] for t in range(10, 30)])
    tree = build_tree(1, block, 16, vocab_size=VOCAB)
    assert tree.parents == tuple(range(-1, 15))
    assert tree.tokens == (1, *range(10, 25))
    assert build_tree(1, block, 16, max_depth=3, vocab_size=VOCAB).tokens == (1, 10, 11, 12)


def test_worked_example() -> None:
    block = DraftBlock([[(10, -0.1), (11, -1.0)], [(20, -0.2), (21, -0.5)], [(30, -2.0)]])
    tree = build_tree(0, block, 6, vocab_size=VOCAB)
    # Scores: 10:-0.1, 10-20:-0.3, 10-21:-0.6, 11:-1.0, 11-20:-1.2, 10-20-30:-2.3 ...
    assert tree.tokens == (0, 10, 20, 21, 11, 20)
    assert tree.parents == (-1, 0, 1, 1, 0, 4)
    assert [round(s, 6) for s in tree.scores] == [0.0, -0.1, -0.3, -0.6, -1.0, -1.2]


def test_ties_go_to_the_top1_chain() -> None:
    block = DraftBlock([[(10, 0.0), (11, 0.0)], [(20, 0.0), (21, 0.0)]])
    tree = build_tree(0, block, 4, vocab_size=VOCAB)
    assert tree.tokens == (0, 10, 20, 21) and tree.parents == (-1, 0, 1, 1)


@pytest.mark.parametrize("seed", range(40))
def test_rows_equal_brute_force_best_first(seed: int) -> None:
    rng = random.Random(seed)
    depth = rng.randint(1, 5)
    levels = []
    for _ in range(depth):
        tokens = rng.sample(range(VOCAB), rng.randint(1, 4))
        # Coarse scores make ties common.
        scores = sorted((-rng.randint(0, 6) / 2 for _ in tokens), reverse=True)
        levels.append(list(zip(tokens, scores, strict=True)))
    max_rows = rng.randint(1, MAX_ROWS)
    tree = build_tree(7, DraftBlock(levels), max_rows, vocab_size=VOCAB)
    _check_format(tree, 7)
    assert _rank_paths(tree, levels) == _brute_force(levels, max_rows)


def test_candidates_are_cleaned_and_checked() -> None:
    # Unsorted input is sorted (stably), duplicates and impossible tokens dropped.
    block = DraftBlock([[(3, -1.0), (4, -0.5), (3, -0.1), (5, -math.inf)], [(8, -0.2)]])
    tree = build_tree(0, block, 16, vocab_size=VOCAB)
    assert tree.tokens == (0, 4, 8, 3, 8)
    # An empty level ends the block.
    assert build_tree(0, DraftBlock([[(1, 0.0)], [], [(2, 0.0)]]), 16, vocab_size=VOCAB).tokens == (0, 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        build_tree(0, DraftBlock([[(VOCAB, 0.0)]]), 4, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="log-probability"):
        build_tree(0, DraftBlock([[(1, 0.5)]]), 4, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="log-probability"):
        build_tree(0, DraftBlock([[(1, float("nan"))]]), 4, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="budget"):
        build_tree(0, DraftBlock([]), 17, vocab_size=VOCAB)


def test_row_count_trades_expected_tokens_against_cost() -> None:
    block = DraftBlock([[(10, math.log(0.9))], [(11, math.log(0.9))], [(12, math.log(0.1))]])
    tree = build_tree(0, block, 4, vocab_size=VOCAB)
    assert math.isclose(expected_tokens(tree, 4), 1 + 0.9 + 0.81 + 0.081)
    assert choose_row_count(tree, None) == 4
    assert choose_row_count(tree, [1.0, 1.0, 1.0, 1.0]) == 4
    # A fourth row that costs 10% more is not worth an 8.1% chance of a token.
    assert choose_row_count(tree, [1.0, 1.0, 1.0, 1.1]) == 3
    assert choose_row_count(tree, [1.0, 3.0, 3.0, 3.0]) == 1
    assert verify_costs(None, 4) is None
    assert verify_costs(lambda rows: None, 4) is None
    assert verify_costs(lambda rows: 1.0 + rows, 3) == [2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="verify_cost"):
        verify_costs(lambda rows: 0.0, 3)


def test_forced_tokens_lead_each_depth_and_the_drafters_follow() -> None:
    block = DraftBlock([[(5, -0.1), (7, -0.5)], [(9, -0.2)]])
    merged = with_forced(block, [7, 3, 4])
    assert merged.candidates == [[(7, 0.0), (5, -0.1)], [(3, 0.0), (9, -0.2)], [(4, 0.0)]]
    assert with_forced(block, []) is block
    tree = build_tree(1, merged, 4, vocab_size=16)
    assert tree.tokens == (1, 7, 3, 4)  # the forced chain first: it is certain
