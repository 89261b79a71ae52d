"""Logit rows that test what the verify epilogue must agree on with torch's compositions (greedy_ids,
nonfinite_rows, logits_digest): ties at the maximum, NaN and infinities anywhere, every logit -inf, signed
zeros tied at the maximum, the maximum first or last, fewer values than the kernel's threads. Shared by the
CPU emulation test and the GPU test."""

from __future__ import annotations

import math

import torch


def rows(vocab: int, seed: int) -> torch.Tensor:
    """float32 [24, vocab] (vocab >= 8): random rows and one of each edge case."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((24, vocab), generator=g, dtype=torch.float32)
    ninf, inf, nan = -math.inf, math.inf, math.nan
    x[1, [3, vocab // 2, vocab - 1]] = 50.0  # a three-way tie: the lowest id
    x[2, vocab // 3] = nan  # a NaN: flagged, no target
    x[3, [1, vocab - 2]] = nan  # two NaNs
    x[4, vocab - 1] = inf  # +inf: flagged, no target
    x[5, :] = ninf  # every logit -inf: not flagged, no target
    x[6, [0, 5]] = ninf  # -inf is a legal masked token
    x[7, :] = -1.0
    x[7, [2, 6]] = torch.tensor([-0.0, 0.0])  # signed zeros tied at the maximum: the lower id
    x[8, 0] = 99.0  # the maximum first
    x[9, vocab - 1] = 99.0  # the maximum last
    x[10, :] = 7.0  # all equal: id 0
    x[11, [4, vocab - 3]] = torch.tensor([inf, nan])  # +inf and NaN
    x[12, [vocab - 4]] = ninf
    x[12, [vocab - 5]] = 1e30  # a large finite maximum
    x[13, :] = ninf
    x[13, vocab - 1] = -1e30  # one finite value among -inf
    return x
