"""Token trees from a draft block, in the acceptor's format.

A draft block gives, for each depth after the anchor, candidates best first with log-probabilities. The
tree is a best-first selection over paths: a node is a sequence of candidate ranks (one per depth), its
score is the sum of its candidates' log-probabilities. Starting from the top-1 candidate at depth 1, we
repeatedly pop the best node, make it a row, and push its next sibling and its best child. Scores never
increase along a path, so a node is always popped after its parent and the rows come out topologically
ordered. Ties go to the lexicographically smaller rank path, so the top-1 chain wins every tie (it is the
seed of the search and is extended before any equal-scored alternative).

If the draft's probabilities were the true acceptance probabilities, the rows picked this way maximise the
expected number of committed tokens for the row budget; `choose_row_count` trades that expectation against
the backend's measured verify cost.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elpis.backend import DraftBlock

MAX_ROWS = 16  # the acceptor's limit, anchor included


@dataclass(frozen=True)
class DraftTree:
    """Rows of one verify call: row 0 is the anchor, parents[0] == -1, parents[r] < r."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]  # depth of each row below the anchor (anchor 0)
    scores: tuple[float, ...]  # summed log-probability of each row's path (anchor 0.0)

    def __len__(self) -> int:
        return len(self.tokens)

    def prefix(self, rows: int) -> DraftTree:
        """The first `rows` rows: still a tree, since rows are topologically ordered."""
        return DraftTree(self.tokens[:rows], self.parents[:rows], self.depths[:rows], self.scores[:rows])


def tree_shape(tree_budget: int, room: int, remaining: int) -> tuple[int, int]:
    """(row budget, deepest depth) of a round's tree: at most `tree_budget` rows and no more than the
    context's `room`, and no deeper than the `remaining` max_tokens allow (a row at depth d commits the
    round's (d+1)-th token). A depth below 1 means the anchor alone."""
    rows = min(tree_budget, room)
    return rows, min(rows - 1, remaining - 1)


def _clean_candidates(block: DraftBlock, max_depth: int, vocab_size: int) -> list[list[tuple[int, float]]]:
    """Per-depth candidates sorted best first (stable), duplicates and impossible ones dropped."""
    levels: list[list[tuple[int, float]]] = []
    for depth, candidates in enumerate(block.candidates[:max_depth], start=1):
        seen: set[int] = set()
        level: list[tuple[int, float]] = []
        for token, log_prob in candidates:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise ValueError(f"draft token {token!r} at depth {depth} is outside the vocabulary "
                                 f"(0..{vocab_size - 1})")
            log_prob = float(log_prob)
            if math.isnan(log_prob) or log_prob > 0.0:
                raise ValueError(f"draft log-probability {log_prob} at depth {depth} is not in [-inf, 0]")
            if token in seen or log_prob == -math.inf:
                continue
            seen.add(token)
            level.append((token, log_prob))
        if not level:
            break  # a depth with no candidate ends the block: deeper nodes would have no parent
        level.sort(key=lambda c: -c[1])
        levels.append(level)
    return levels


def with_forced(block: DraftBlock, forced: Sequence[int]) -> DraftBlock:
    """`block` with `forced` (tokens a grammar forces next) proposed first, as certain, at depths 1 to
    len(forced); the drafter's own candidates follow them at each depth, and its deeper depths stay."""
    if not forced:
        return block
    levels = [list(level) for level in block.candidates]
    levels += [[] for _ in range(len(forced) - len(levels))]
    for depth, token in enumerate(forced):
        levels[depth] = [(token, 0.0), *(c for c in levels[depth] if c[0] != token)]
    return DraftBlock(levels)


def build_tree(anchor: int, block: DraftBlock, max_rows: int, *, max_depth: int = MAX_ROWS - 1,
               vocab_size: int) -> DraftTree:
    """Best-first tree of at most `max_rows` rows (anchor included) and depth at most `max_depth`."""
    if not 1 <= max_rows <= MAX_ROWS:
        raise ValueError(f"tree row budget must be in 1..{MAX_ROWS}, got {max_rows}")
    levels = _clean_candidates(block, max(0, max_depth), vocab_size)
    tokens, parents, depths, scores = [anchor], [-1], [0], [0.0]
    # Heap entries: (-score, rank path, parent row). The rank path breaks ties deterministically.
    frontier: list[tuple[float, tuple[int, ...], int]] = []
    if levels:
        frontier.append((-levels[0][0][1], (0,), 0))
    while frontier and len(tokens) < max_rows:
        neg_score, ranks, parent = heapq.heappop(frontier)
        depth = len(ranks)
        row = len(tokens)
        tokens.append(levels[depth - 1][ranks[-1]][0])
        parents.append(parent)
        depths.append(depth)
        scores.append(-neg_score)
        parent_score = scores[parent]
        sibling = ranks[-1] + 1
        if sibling < len(levels[depth - 1]):
            score = parent_score + levels[depth - 1][sibling][1]
            heapq.heappush(frontier, (-score, (*ranks[:-1], sibling), parent))
        if depth < len(levels):
            heapq.heappush(frontier, (-(-neg_score + levels[depth][0][1]), (*ranks, 0), row))
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(scores))


def expected_tokens(tree: DraftTree, rows: int) -> float:
    """Expected committed tokens of the first `rows` rows if the draft's probabilities are calibrated:
    the anchor always commits one, each other row adds the probability that its whole path matches."""
    return 1.0 + sum(math.exp(s) for s in tree.scores[1:rows])


def verify_costs(cost: Callable[[int], float | None] | None, max_rows: int) -> list[float] | None:
    """The backend's verify cost for 1..max_rows rows, or None when it does not report costs."""
    if cost is None:
        return None
    table: list[float] = []
    for rows in range(1, max_rows + 1):
        value = cost(rows)
        if value is None:
            return None
        value = float(value)
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(f"backend verify_cost({rows}) = {value} is not a positive finite number")
        table.append(value)
    return table


def choose_row_count(tree: DraftTree, costs: Sequence[float] | None) -> int:
    """Rows to verify: all of them without costs; else the count maximising expected tokens per cost
    (fewer rows on ties)."""
    if costs is None:
        return len(tree)
    best_rows, best_rate = 1, -1.0
    for rows in range(1, len(tree) + 1):
        rate = expected_tokens(tree, rows) / costs[rows - 1]
        if rate > best_rate:
            best_rows, best_rate = rows, rate
    return best_rows
