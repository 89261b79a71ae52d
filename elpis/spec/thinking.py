"""A thinking budget: at most `limit` tokens of reasoning, then the reasoning is closed for the model.

Qwen3.8 thinks inside a `<think>` block that its chat template opens at the end of the prompt, and closes it
with `</think>` when it is done; a long problem can think until max_tokens is spent, leaving no answer. With
a budget, the generator counts the tokens generated while the block is open. When `limit` of them have been
generated and the model has not closed it, the budget's `close` tokens (the server's: "\n</think>", the
form the template renders reasoning in) are committed as if the model had generated them, and the model
answers after them. The tokens are the same with and without a drafter: every round is capped at the
tokens the budget has left (`cap`), so no round commits past it, and the closing tokens are committed by
one rule (`SpeculativeGenerator`'s forced rounds), whatever ran before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkingBudget:
    """`limit`: reasoning tokens at most (0: close at once); `close`: the tokens that close the block, the
    last of them the block's end token (`</think>`), which is also how the model closes it itself."""

    limit: int
    close: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ValueError(f"a thinking budget must be an integer >= 0, got {self.limit!r}")
        object.__setattr__(self, "close", tuple(self.close))
        if not self.close:
            raise ValueError("a thinking budget needs the tokens that close the reasoning")
        for token in self.close:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"closing tokens must be non-negative integer ids, got {token!r}")

    @property
    def end(self) -> int:
        return self.close[-1]


class ThinkingTracker:
    """One request's reasoning against its budget: open from the prompt until the end token is committed."""

    def __init__(self, budget: ThinkingBudget) -> None:
        self.budget = budget
        self.open = True
        self.used = 0  # tokens committed while the block was open, the end token excluded
        self.forced = 0  # closing tokens committed so far

    def cap(self, remaining: int) -> int:
        """The tokens a round may commit: `remaining`, and while the block is open no more than the budget
        has left (at least 1: a budget that is spent is closed by forced rounds, not by rounds)."""
        if not self.open:
            return remaining
        return max(1, min(remaining, self.budget.limit - self.used))

    def due(self) -> tuple[int, ...]:
        """The closing tokens still to commit: the budget is spent and the block still open; else ()."""
        if not self.open or self.used < self.budget.limit:
            return ()
        return self.budget.close[self.forced :]

    def saw(self, tokens: Sequence[int], *, forced: bool = False) -> None:
        """Count a round's committed tokens (`forced`: a forced round's, taken from `due`)."""
        if forced:
            self.forced += len(tokens)
        for token in tokens:
            if not self.open:
                return
            if token == self.budget.end:
                self.open = False
            else:
                self.used += 1
