"""Which verify shape a tree round runs at: the one that commits the most tokens per second (issue 9).

A tree-mode backend runs every verify at one of a few fixed row counts (`tree_verify.TREE_RUNS`: 8 or 16),
each a captured graph, and a row's logits do not depend on which (tests/exl3/test_tree_graph.py's run-size
test), so the choice never changes the text. It changes the speed: sixteen rows commit more tokens a round
than eight, and cost more. How much more they cost grows with the context, since each row's attention reads
the whole cache (H100, session 47: 1.11x at 1K-8K, 1.23x at 262K); how many more tokens they commit depends on
the draft and the text, which no table here knows. So both are measured, as CaDDTree (arXiv:2606.01813) picks
a tree budget per round from expected tokens against a verify-cost model:

- **Cost**: `cost(run, kvp)`, seconds of a round at `run` rows from position kvp; the backend times its
  captured graphs at load (`elpis.exl3.graph_warmup`).
- **Tokens**: what rounds committed. A round at the largest run also says exactly what each smaller run
  would have committed (`tokens_within`): the best-first tree of r rows is the first r rows of the larger
  tree, and every row's target is the same whichever run verified it, so the smaller run's round follows the
  same path until the path leaves its rows. Rounds at a smaller run cannot say what the larger would have
  committed, so while a smaller run is chosen every `explore_every`-th round runs the largest again.

`choose` returns the run with the most estimated tokens per second; until `min_rounds` rounds have been
observed it returns the largest (which measures every run). Estimates are means over the last rounds (an
exponential moving average of weight `1 / window`), kept per tree budget across requests (a server serves one
text mix; a new request does not forget what the last taught).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def tokens_within(parents: Sequence[int], path: Sequence[int], rows: int) -> int:
    """Tokens a round would have committed had its tree been only its first `rows` rows: `path` is the rows
    the round accepted, root first (row 0, then each a child of the one before), so the committed tokens are
    len(path) (each accepted row's target); a tree of the first `rows` rows follows the path while its rows
    are below `rows`."""
    if not path or path[0] != 0:
        raise ValueError(f"an accepted path starts at row 0, got {list(path)}")
    if rows < 1:
        raise ValueError(f"a tree has at least one row, got {rows}")
    count = 1
    for prev, row in itertools.pairwise(path):
        if not 0 <= row < len(parents) or parents[row] != prev:
            raise ValueError(f"path {list(path)} is not a root-first path of parents {list(parents)}")
        if row >= rows:
            break
        count += 1
    return count


def smallest_run(runs: Sequence[int], rows: int) -> int | None:
    """The smallest of `runs` (ascending row counts) that holds `rows` rows; None when none does. The one
    rule behind "which row count does this tree run at" (the kernels', a backend's, a run choice's); each
    caller words its own refusal."""
    return next((run for run in runs if rows <= run), None)


@dataclass
class _Means:
    """Exponential moving averages of each run's committed tokens a round, and the rounds seen."""

    tokens: dict[int, float] = field(default_factory=dict)
    rounds: int = 0


@dataclass
class RunChoice:
    """The run a tree round takes (see the module's docstring). `runs`: the backend's captured row counts;
    `cost(run, kvp)`: seconds of a round at `run` rows from position `kvp`."""

    runs: tuple[int, ...]
    cost: Callable[[int, int], float]
    explore_every: int = 16
    min_rounds: int = 8
    window: int = 64
    chosen: dict[int, int] = field(default_factory=dict)  # rounds run at each run, over the choice's life
    _means: dict[int, _Means] = field(default_factory=dict)  # per tree budget
    _below: int = 0  # rounds run below the largest since the last that ran it

    def __post_init__(self) -> None:
        runs = tuple(sorted(set(self.runs)))
        if not runs or runs[0] < 1:
            raise ValueError(f"run choice needs row counts of at least 1, got {self.runs}")
        if self.explore_every < 2 or self.min_rounds < 1 or self.window < 1:
            raise ValueError("explore_every >= 2, min_rounds >= 1 and window >= 1")
        self.runs = runs

    def largest(self, budget: int) -> int:
        """The run a tree of `budget` rows needs: the smallest that holds it."""
        run = smallest_run(self.runs, budget)
        if run is None:
            raise ValueError(f"a tree budget of {budget} rows is over the largest run, {self.runs[-1]}")
        return run

    def budget_at(self, run: int, budget: int) -> int:
        """The tree budget of a round at `run` rows: the request's, cut to the run."""
        return min(run, budget)

    def estimate(self, budget: int) -> dict[int, float]:
        """Mean committed tokens a round at each run (those measured so far) for trees of `budget` rows."""
        means = self._means.get(budget)
        return dict(means.tokens) if means else {}

    def choose(self, kvp: int, budget: int) -> int:
        """The run of the next round from position `kvp`, for a tree budget of `budget` rows (no state
        changes: `chose` records the round once it is queued)."""
        top = self.largest(budget)
        options = [r for r in self.runs if r <= top]
        means = self._means.get(budget)
        if len(options) < 2 or means is None or means.rounds < self.min_rounds:
            return top
        best = max(options, key=lambda r: (means.tokens[r] / self._cost(r, kvp), -r))
        if best != top and self._below + 1 >= self.explore_every:
            return top  # explore: only the largest run measures what every run would commit
        return best

    def chose(self, run: int, budget: int) -> None:
        """A round was queued at `run` rows (what `choose` returned, or a caller's own pick)."""
        top = self.largest(budget)
        if run not in self.runs or run > top:
            raise ValueError(f"a round at {run} rows is not one of the runs {self.runs} up to {top}")
        self._below = 0 if run == top else self._below + 1
        self.chosen[run] = self.chosen.get(run, 0) + 1

    def observe(self, run: int, budget: int, parents: Sequence[int], path: Sequence[int]) -> None:
        """A round at `run` rows accepted `path` (root first) of a tree with `parents`. Rounds at the budget's
        largest run update every run's mean; rounds at a smaller run only their own (the caller leaves out
        rounds cut short by the request's end: a stop or max_tokens, which no run changes)."""
        top = self.largest(budget)
        if run not in self.runs or run > top:
            raise ValueError(f"a round at {run} rows is not one of the runs {self.runs} up to {top}")
        if len(parents) > run:
            raise ValueError(f"a tree of {len(parents)} rows does not fit a run of {run}")
        means = self._means.setdefault(budget, _Means())
        weight = 1.0 / min(self.window, means.rounds + 1) if run == top else 1.0 / self.window
        measured = [r for r in self.runs if r <= top] if run == top else [run]
        for r in measured:
            got = float(tokens_within(parents, path, r))
            old = means.tokens.get(r)
            means.tokens[r] = got if old is None else old + weight * (got - old)
        if run == top:
            means.rounds += 1

    def _cost(self, run: int, kvp: int) -> float:
        seconds = float(self.cost(run, kvp))
        if not seconds > 0.0:
            raise ValueError(f"round cost at {run} rows from {kvp} is {seconds}: not a positive time")
        return seconds
