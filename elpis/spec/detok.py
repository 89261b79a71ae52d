"""Incremental detokenisation: text deltas that never split a UTF-8 character.

Byte-level tokens can end in the middle of a multi-byte character; decoding such a prefix yields U+FFFD.
We decode a short window (a few already-emitted tokens for context, so spacing rules that depend on the
previous token apply) and hold the new tokens back while the window's text ends in U+FFFD. At the end of
the sequence whatever is pending is flushed as the tokenizer decodes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 4


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int] = (), *, skip_special: bool = True):
        self._tokenizer, self._skip_special = tokenizer, skip_special
        self._ids: list[int] = self._clean_context(list(prompt_ids))
        self._prefix = 0  # window start (context tokens whose text was already emitted or is the prompt)
        self._read = len(self._ids)  # tokens before this index are emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special=self._skip_special)

    def _clean_context(self, prompt_ids: list[int]) -> list[int]:
        # Take the longest prompt tail (up to a few tokens) that decodes to whole characters.
        for count in range(min(_CONTEXT_TOKENS, len(prompt_ids)), 0, -1):
            tail = prompt_ids[-count:]
            text = self._decode(tail)
            if _REPLACEMENT not in text:
                return tail
        return []

    def push(self, token: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self._ids.append(int(token))
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return ""
        # The window now starts at the tokens just emitted: they are the next delta's context.
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still pending at the end of the sequence."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if len(after) > len(before) else ""
