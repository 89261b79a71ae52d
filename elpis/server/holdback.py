"""How much of a streamed text tail must wait because it may be the start of a marker."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper, non-empty prefix of one of `markers`.

    That suffix is held back: the next delta decides whether it is a marker or plain text. Nothing longer
    is ever held, so text streams as soon as it cannot be part of a marker.
    """
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def trailing_space_len(text: str) -> int:
    return len(text) - len(text.rstrip())
