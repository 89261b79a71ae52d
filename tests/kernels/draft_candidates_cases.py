"""What the draft candidates kernel (patches/kernels/draft_candidates.cu) must give, and rows that test it:
the exact candidate order (NaN first, then the larger value, then the lower id; -0 and +0 equal),
log-probabilities against an fp64 log-softmax, and edge rows (ties across the k-th place, signed zeros, NaN,
infinities, every logit -inf). Shared by the CPU emulation test and the GPU test."""

from __future__ import annotations

import math

import torch

# The kernel's log-probability against fp64's: (x - M) - log(S) in fp32, where S's fp32 sum differs from the
# exact one by its rounding (measured: tests/kernels/test_draft_candidates_emu.py, the GPU test's JSON line).
LP_TOLERANCE = 2e-6


def rows(vocab: int, seed: int) -> torch.Tensor:
    """float32 [16, vocab] (vocab >= 24): random rows and one of each edge case."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((16, vocab), generator=g, dtype=torch.float32) * 3.0
    ninf, inf, nan = -math.inf, math.inf, math.nan
    x[1, :] = -2.0
    x[1, [3, vocab // 2, vocab - 1, 7, 11]] = 5.0  # ties at the top: lower ids first
    x[2, vocab // 3] = nan  # a NaN: first, and every log-probability NaN
    x[3, [1, vocab - 2]] = nan
    x[4, vocab - 1] = inf  # +inf: NaN log-probabilities, +inf first
    x[5, :] = ninf  # every logit -inf
    x[6, [0, 5, vocab - 1]] = ninf  # -inf among numbers: last
    x[7, :] = -1.0
    x[7, [2, 6, 9]] = torch.tensor([-0.0, 0.0, -0.0])  # signed zeros tied at the maximum: by id
    x[8, :] = 7.0  # all equal: ids 0, 1, 2, ...
    x[9, :] = 0.0
    x[9, 1::2] = 1.0  # ties across the k-th place
    x[10, :] = ninf
    x[10, [vocab - 1, 2]] = torch.tensor([-1e30, -3.0])  # few finite values among -inf
    x[11, vocab - 5] = 60.0  # one dominant logit: its log-probability near 0
    return x


def expected_ids(row: torch.Tensor, k: int) -> list[int]:
    """The k first ids of the kernel's order: NaN first, then the larger value, then the lower id."""
    values = row.double().tolist()
    order = sorted(range(len(values)), key=lambda i: (not math.isnan(values[i]), -_or0(values[i]), i))
    return order[:k]


def _or0(v: float) -> float:
    return 0.0 if math.isnan(v) else v


def log_softmax64(row: torch.Tensor) -> torch.Tensor:
    """The row's log-softmax in fp64: NaN everywhere where the row holds a NaN or +inf, or only -inf (as
    torch's)."""
    x = row.double()
    m = x.max()
    if torch.isnan(x).any() or not math.isfinite(m.item()):
        return torch.full_like(x, math.nan)
    return (x - m) - torch.log(torch.exp(x - m).sum())


def check_packed(packed: torch.Tensor, logits: torch.Tensor, chain: torch.Tensor, k: int) -> float:
    """Assert that `packed` [rows, 2 + 2k] is the rows' candidates; returns the largest log-probability error
    against fp64."""
    worst = 0.0
    vocab = logits.shape[1]
    for r in range(logits.shape[0]):
        row = logits[r].float()
        ref = log_softmax64(row)
        got = packed[r].double()
        c = int(chain[r])
        assert got[0].item() == c
        ids = [int(v) for v in got[2 : 2 + k].tolist()]
        assert ids == expected_ids(row, k), (r, ids, expected_ids(row, k))
        lps = torch.cat((got[1:2], got[2 + k :]))
        want = torch.cat((ref[c : c + 1] if 0 <= c < vocab else torch.tensor([math.nan]).double(), ref[ids]))
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(lps), nan), (r, lps, want)
        finite = ~nan & torch.isfinite(want)
        assert torch.equal(lps[~nan & ~finite], want[~nan & ~finite]), r  # -inf where exp underflows to 0
        err = (lps[finite] - want[finite]).abs() / want[finite].abs().clamp(min=1.0)
        worst = max(worst, err.max().item() if err.numel() else 0.0)
    return worst


def one_threads_row(vocab: int, threads: int, per_vector: int, seed: int) -> torch.Tensor:
    """float32 [1, vocab]: random values, and the 16 largest where thread 0 of a block of `threads` reads them
    (its vectors 0, threads, 2 * threads, ... of `per_vector` logits): its own 16-key list must hold all of
    them, in an order other than the index order."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((1, vocab), generator=g, dtype=torch.float32)
    vectors = range(0, vocab // per_vector, threads)
    mine = [c * per_vector + j for c in vectors for j in range(per_vector)][:16]
    assert len(mine) == 16 and max(mine) < vocab, "the row is too short for 16 of thread 0's logits"
    x[0, mine] = 20.0 + torch.randperm(16, generator=g).float() / 4.0
    return x
