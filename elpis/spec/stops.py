"""Stop strings over a growing text: find the first one exactly and hold back only what could start one.

Text is fed as it is detokenised, one token's delta at a time, so a stop string is found at the same place
whether the tokens arrived one per round or many per round. A match is searched only where it could end in
the newest delta; among matches completed by the same delta the earliest start wins.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringScanner:
    def __init__(self, stop_strings: Sequence[str]) -> None:
        for stop in stop_strings:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        self._stops = tuple(dict.fromkeys(stop_strings))
        self._text = ""
        self._released = 0
        self.cut: int | None = None  # index of the first stop string's start, once found
        self.matched: str | None = None  # the stop string found there (the shorter of two starting there)

    @property
    def text(self) -> str:
        """All text fed so far (up to the cut once a stop string was found)."""
        return self._text if self.cut is None else self._text[: self.cut]

    def feed(self, delta: str) -> bool:
        """Append a delta; True if it completes a stop string (the text then ends at that string's start)."""
        if self.cut is not None:
            raise RuntimeError("stop string already found: the sequence has ended")
        old_length = len(self._text)
        self._text += delta
        if not delta:
            return False
        found = [
            (start, len(stop), stop)
            for stop in self._stops
            if (start := self._text.find(stop, max(0, old_length - len(stop) + 1))) != -1
        ]
        if found:
            # the first to start is the cut; of two starting there, the shorter was complete first
            self.cut, _, self.matched = min(found)
            return True
        return False

    def _held(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._text) - self._released), longest, -1):
                if self._text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def release(self, *, final: bool) -> str:
        """Text that can be handed out now: everything up to the cut, or all that cannot start a stop
        string; at the end of the sequence (`final`) everything."""
        if self.cut is not None:
            end = self.cut
        elif final:
            end = len(self._text)
        else:
            end = len(self._text) - self._held()
        end = max(end, self._released)
        out = self._text[self._released : end]
        self._released = end
        return out
