"""Logit rows of every kind a sampler meets, for the host sampler's tests (tests/spec/test_sampling.py) and
the device draw's (tests/kernels/test_sample_draw*.py)."""

from __future__ import annotations

import torch


def rows_of_every_kind(vocab: int, seed: int) -> torch.Tensor:
    """12 rows: random, coarse (ties across any edge), ties near the top, nearly flat, a grammar's mask
    with fewer tokens than top_k, every third token masked, forty equal maxima, fp16-valued, peaked, then
    random ones."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, vocab, generator=generator) * 3
    logits[1] = torch.randint(-3, 3, (vocab,), generator=generator).float()
    logits[2] = torch.randint(-400, 400, (vocab,), generator=generator).float() / 40
    logits[3] *= 0.001
    logits[4, 5:] = float("-inf")
    logits[5, ::3] = float("-inf")
    logits[6, :40] = logits[6].max() + 1
    logits[7] = logits[7].half().float()
    logits[8] *= 12  # top_p keeps one or two
    return logits
