"""A request's logit adjustments: repetition, frequency and presence penalties, then logit_bias.

For the token drawn at absolute position p, with `count[t]` the times token t was generated before p (prompt
tokens excluded, as OpenAI and vLLM count them) and `seen[t]` whether t is in the prompt or was generated
before p (the repetition penalty's set, as in vLLM and Hugging Face), each logit x[t] of the row becomes, in
float64 and in this order:

1. repetition: x * (1 / r) where seen and x > 0, x * r where seen and x <= 0 (a product by the reciprocal,
   what torch computes for x / r on a GPU, written so on every device and in the GPU rounds' kernel);
2. frequency and presence: x - (f * count + q * [count > 0]);
3. bias: x + logit_bias[t].

Speculation keeps it exact. A tree row's tokens before its drawn position are the committed ones plus the
tokens on its own path (its ancestors after the anchor, and itself), so `History.adjusted` counts that path
into the row's counts. The acceptor commits a row's target only when its path is what plain decoding
generated, and then the row's counts are plain decoding's: the same operations on the same values, the same
bits. The rows are adjusted together with elementwise operations only, so no row depends on another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from elpis.spec.sampling import SamplingParams


@dataclass(frozen=True)
class Steps:
    """Which of the three steps a request's adjustment takes (the others would leave every value as it is);
    the host's `History` and the GPU rounds' kernel (elpis.exl3.round_adjust) take the same ones."""

    repetition: bool
    frequency_presence: bool
    bias: bool

    @classmethod
    def of(cls, params: SamplingParams) -> Steps:
        frequency_presence = bool(params.frequency_penalty or params.presence_penalty)
        return cls(params.repetition_penalty != 1.0, frequency_presence, bool(params.logit_bias))


def tree_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Every row's path after the anchor (row 0): its ancestors' tokens then its own, root to row."""
    paths: list[tuple[int, ...]] = []
    for r, parent in enumerate(parents):
        paths.append(() if parent < 0 else (*paths[parent], tokens[r]))
    return paths


class History:
    """What one request's adjustments read: the prompt's tokens and the generated ones, kept as
    full-vocabulary tensors on the logits' device (made at the first row adjusted), extended by `commit`."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int) -> None:
        if not params.adjusts_logits:
            raise ValueError("a History serves requests that adjust their logits")
        bad = [t for t, _ in params.logit_bias if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias names ids {bad[:4]} outside the vocabulary (0..{vocab_size - 1})")
        self.params, self.vocab_size = params, vocab_size
        self._prompt = tuple(prompt_ids)
        self._generated: list[int] = []
        self._device: torch.device | None = None
        self._counts = self._seen = self._bias = torch.empty(0)

    def commit(self, tokens: Sequence[int]) -> None:
        """Tokens generated (committed) after those before."""
        self._generated.extend(tokens)
        if self._device is not None and tokens:
            ids = torch.tensor(list(tokens), dtype=torch.long, device=self._device)
            self._counts.index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64, device=self._device))
            self._seen[ids] = True

    def adjusted(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """float64 [rows, vocab]: row r of `logits` adjusted as if the tokens of `paths[r]` had been generated
        after the committed ones."""
        if logits.dim() != 2 or logits.shape[0] != len(paths) or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(paths)} rows of "
                             f"{self.vocab_size} logits")
        self._ready(logits.device)
        return self._rows(logits, paths)

    def _ready(self, device: torch.device) -> None:
        if self._device == device:
            return
        self._device = device
        vocab = self.vocab_size
        self._counts = torch.zeros(vocab, dtype=torch.float64, device=device)
        self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._bias = torch.zeros(vocab, dtype=torch.float64, device=device)
        if self._prompt:
            self._seen[torch.tensor(self._prompt, dtype=torch.long, device=device)] = True
        for token, bias in self.params.logit_bias:
            self._bias[token] = float(bias)
        generated, self._generated = self._generated, []
        self.commit(generated)

    def _rows(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """All rows at once: every operation is elementwise and correctly rounded (no sums across the
        vocabulary, no fused multiply-add), so a row's values do not depend on the rows beside it."""
        p, x = self.params, logits.to(torch.float64)
        rows, device = len(paths), logits.device
        counts = self._counts.expand(rows, -1)
        seen = self._seen.expand(rows, -1)
        where = [(r, token) for r, path in enumerate(paths) for token in path]
        if where:  # each row's own path, counted into its own copy
            index = torch.tensor(where, dtype=torch.long, device=device)
            at = (index[:, 0], index[:, 1])
            ones = torch.ones(len(where), dtype=torch.float64, device=device)
            counts = counts.clone().index_put_(at, ones, accumulate=True)
            seen = seen.clone().index_put_(at, ones > 0)
        steps = Steps.of(p)
        if steps.repetition:
            r = float(p.repetition_penalty)
            x = torch.where(seen, torch.where(x > 0, x * (1.0 / r), x * r), x)
        if steps.frequency_presence:
            present = (counts > 0).to(torch.float64)
            x = x - (counts * float(p.frequency_penalty) + present * float(p.presence_penalty))
        if steps.bias:
            x = x + self._bias
        return x
