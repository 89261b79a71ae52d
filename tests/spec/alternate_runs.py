"""A stand-in run choice for tests (`elpis.spec.run_choice.RunChoice`'s interface): 16 and 8 rows in turn, so
that every round's row count differs from the one before; it keeps what it is told."""

from __future__ import annotations

from collections.abc import Sequence


class Alternate:
    runs = (8, 16)

    def __init__(self) -> None:
        self.next = 16
        self.queued: list[int] = []  # each round's row count, as the driver queued it
        self.seen: list[tuple[int, int, list[int]]] = []  # (row count, tree rows, accepted path) a round

    def choose(self, kvp: int, budget: int) -> int:
        return self.next

    def budget_at(self, run: int, budget: int) -> int:
        return min(run, budget)

    def chose(self, run: int, budget: int) -> None:
        self.queued.append(run)
        self.next = 8 if run == 16 else 16

    def observe(self, run: int, budget: int, parents: Sequence[int], path: Sequence[int]) -> None:
        self.seen.append((run, len(parents), list(path)))
