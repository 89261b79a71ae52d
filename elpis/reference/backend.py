"""`ReferenceBackend`: the `elpis.backend.Backend` protocol over the exact-numerics PyTorch model.

One sequence at a time (the caller serialises calls). Bit-exactness, as documented in `model.py`: with
`exact_rows=True` (the default) every verify row is computed exactly as a plain decode step of its path,
so speculation cannot change a single bit of the logits or of the committed state. What is not
bit-identical: prefill versus decoding the same tokens (batched matmuls and the chunked DeltaNet form), so
the state after `begin(prompt)` may differ in the last bits depending on which prefix came from the cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from elpis.backend import BackendError, BackendInfo
from elpis.reference.model import ReferenceModel, TreeRows
from elpis.reference.prefix_cache import PrefixCache
from elpis.reference.state import SequenceState

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


class ReferenceBackend:
    def __init__(
        self,
        model: ReferenceModel,
        *,
        model_id: str,
        max_context: int,
        stop_token_ids: Sequence[int],
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        exact_rows: bool = True,
    ) -> None:
        if max_context < 2:
            raise ValueError("max_context must be at least 2")
        self.model = model
        self.exact_rows = exact_rows
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.info = BackendInfo(
            name="reference",
            model_id=model_id,
            vocab_size=model.config.vocab_size,
            max_context=max_context,
            stop_token_ids=tuple(stop_token_ids),
            device=str(model.device),
        )
        self._state: SequenceState | None = None
        self._anchor: int | None = None  # known after begin(); the caller supplies it after a commit
        self._tree: TreeRows | None = None

    # --- the Backend protocol ------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> int:
        prompt = self._check_tokens(prompt, "prompt")
        if not prompt:
            raise ValueError("prompt must hold at least one token (the anchor)")
        if len(prompt) > self.info.max_context:
            raise ValueError(f"prompt of {len(prompt)} tokens exceeds max_context {self.info.max_context}")
        if self._state is not None:
            self.finish()
        context = prompt[:-1]
        cached = self.prefix_cache.longest_prefix(context, len(context))
        headroom = len(context) + 64
        if cached is None:
            state, reused = self.model.new_state(min(self.info.max_context, headroom)), 0
        else:
            state, reused = cached.restore(headroom), len(cached.tokens)
        if reused < len(context):
            with torch.inference_mode():
                self.model.prefill(state, context[reused:])
            self.prefix_cache.store(state.snapshot())
        self._state, self._anchor, self._tree = state, prompt[-1], None
        return reused

    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        state = self._active()
        tokens = self._check_tokens(tokens, "tokens")
        parents = [int(p) for p in parents]
        if not tokens or len(parents) != len(tokens):
            raise ValueError(f"need one parent per row: {len(tokens)} tokens, {len(parents)} parents")
        if parents[0] != -1:
            raise ValueError("parents[0] must be -1 (row 0 is the anchor)")
        for r in range(1, len(parents)):
            if not 0 <= parents[r] < r:
                raise ValueError(f"parents[{r}] = {parents[r]} must be in [0, {r})")
        if self._anchor is not None and tokens[0] != self._anchor:
            raise ValueError(f"tokens[0] = {tokens[0]} is not the anchor {self._anchor}")
        if len(state.tokens) + len(tokens) > self.info.max_context:
            raise ValueError(
                f"{len(state.tokens)} committed + {len(tokens)} rows exceed max_context "
                f"{self.info.max_context}"
            )
        with torch.inference_mode():
            logits, self._tree = self.model.verify(state, tokens, parents, exact_rows=self.exact_rows)
            logits = logits.to(torch.float32)
            if not bool(torch.isfinite(logits).all()):
                self._tree = None
                raise BackendError("non-finite logits from the reference model")
        return logits

    def commit(self, rows: Sequence[int]) -> None:
        state = self._active()
        tree = self._tree
        if tree is None:
            raise RuntimeError("commit() needs a verify() first (each verify can be committed once)")
        rows = [int(r) for r in rows]
        if not rows or rows[0] != 0:
            raise ValueError("rows must be a root-first path starting at row 0")
        for prev, row in itertools.pairwise(rows):
            if not 0 < row < len(tree.tokens) or tree.parents[row] != prev:
                raise ValueError(f"rows {rows} is not a root-first path of the verified tree")
        with torch.inference_mode():
            self.model.commit(state, tree, rows)
        self._tree, self._anchor = None, None

    def abandon(self) -> None:
        """Drop the last verify without committing it (a discarded round). Verify never changes the
        committed state, so forgetting its rows is enough; the anchor stays the one the verify took."""
        self._active()
        self._tree = None

    def finish(self) -> None:
        state = self._state
        self._state, self._anchor, self._tree = None, None, None
        if state is not None and state.tokens:
            self.prefix_cache.store(state.snapshot())

    def position(self) -> int:
        return len(self._active().tokens)

    # --- extras for tests and gates ------------------------------------------------------------------

    def prompt_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """float32 logits [T, V] after each token of `tokens` (a fresh prefill; no cache, no sequence)."""
        tokens = self._check_tokens(tokens, "tokens")
        with torch.inference_mode():
            return self.model.prefill(self.model.new_state(len(tokens)), tokens, logits="all").to(
                torch.float32
            )

    def committed_state(self) -> SequenceState:
        """A snapshot of the active sequence's state (for equality tests)."""
        return self._active().snapshot()

    def _active(self) -> SequenceState:
        if self._state is None:
            raise RuntimeError("no active sequence: call begin() first")
        return self._state

    def _check_tokens(self, tokens: Sequence[int], what: str) -> list[int]:
        ids = [int(t) for t in tokens]
        vocab = self.info.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise ValueError(f"{what}: token id {t} outside [0, {vocab})")
        return ids
