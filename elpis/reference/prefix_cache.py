"""Prefix cache: full-state snapshots at token positions, least recently used evicted first.

A DeltaNet state cannot be rewound, so a snapshot serves only prompts that extend *exactly* its tokens;
the longest such snapshot wins. Memory is bounded by a byte budget over all snapshots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from elpis.reference.state import SequenceState


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("prefix cache budget must be >= 0 bytes")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[SequenceState, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def store(self, snapshot: SequenceState) -> None:
        """Keep `snapshot` (not copied: the caller hands over an independent snapshot)."""
        key = tuple(snapshot.tokens)
        if not key:
            return
        size = snapshot.nbytes()
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._bytes -= self._entries.pop(key)[1]
        self._entries[key] = (snapshot, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted

    def longest_prefix(self, tokens: Sequence[int], limit: int) -> SequenceState | None:
        """The snapshot with the most tokens that equal tokens[:n], n <= limit (marked as recently used)."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            n = len(key)
            if n <= limit and (best is None or n > len(best)) and tuple(tokens[:n]) == key:
                best = key
        if best is None:
            return None
        self._entries.move_to_end(best)
        return self._entries[best][0]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
