"""The numbers every gate is made of: next-token distribution comparisons and error against fp64.

Definitions (used everywhere, tested against hand-computed values):
  - KL at a position is KL(P_ref || P_arm) = sum_v P_ref(v) (log P_ref(v) - log P_arm(v)), natural log,
    computed in float64 from the two logit rows (the reference is the distribution we trust).
  - top-1 agreement: argmax of the two rows is the same token id (ties resolve to the lowest id).
  - NLL of the arm at a position: -log P_arm(actual next token). ΔNLL = mean NLL(arm) - mean NLL(ref).
  - p99 is the nearest-rank percentile: the ceil(0.99 n)-th smallest value (no interpolation).
  - relative error of an output element: |y - y64| / rms(y64 row), where the row is the last dimension
    of the fp64 output. Dividing by the row RMS rather than |y64| keeps elements near zero from turning
    into huge ratios while staying scale-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch


def nearest_rank(values: np.ndarray | torch.Tensor, q: float) -> float:
    """The ceil(q n)-th smallest value (nearest-rank percentile), q in (0, 1]."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"percentile {q} outside (0, 1]")
    if isinstance(values, torch.Tensor):
        flat = values.detach().reshape(-1)
        n = flat.numel()
        if n == 0:
            raise ValueError("percentile of an empty set")
        k = max(1, math.ceil(q * n))
        return float(torch.kthvalue(flat.double().cpu(), k).values)
    flat_np = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat_np.size == 0:
        raise ValueError("percentile of an empty set")
    k = max(1, math.ceil(q * flat_np.size))
    return float(np.partition(flat_np, k - 1)[k - 1])


@dataclass(frozen=True)
class PositionMetrics:
    """Per-position comparison of one arm with the reference over one token sequence."""

    kl: np.ndarray  # float64 [n]
    top1: np.ndarray  # bool [n]
    nll_ref: np.ndarray  # float64 [n]
    nll_arm: np.ndarray  # float64 [n]

    def __len__(self) -> int:
        return int(self.kl.shape[0])


def compare_logits(
    ref: torch.Tensor, arm: torch.Tensor, targets: Sequence[int], *, block: int = 32
) -> PositionMetrics:
    """Compare two `[n, vocab]` logit blocks position by position; `targets[i]` follows position i.

    Rows are processed `block` at a time so float64 temporaries stay small with a 248K vocabulary.
    """
    if ref.shape != arm.shape or ref.dim() != 2:
        raise ValueError(
            f"logit shapes differ or are not [n, vocab]: {tuple(ref.shape)} vs {tuple(arm.shape)}"
        )
    n = ref.shape[0]
    if len(targets) != n:
        raise ValueError(f"{len(targets)} targets for {n} logit rows")
    idx = torch.as_tensor(list(targets), dtype=torch.long).unsqueeze(1)
    if n and (int(idx.min()) < 0 or int(idx.max()) >= ref.shape[1]):
        raise ValueError("a target id lies outside the logit width")
    kl, top1, nll_ref, nll_arm = [], [], [], []
    for start in range(0, n, block):
        rows = slice(start, start + block)
        ref_logp = torch.log_softmax(ref[rows].detach().to(device="cpu", dtype=torch.float64), dim=-1)
        arm_logp = torch.log_softmax(arm[rows].detach().to(device="cpu", dtype=torch.float64), dim=-1)
        ref_p = ref_logp.exp()
        terms = ref_p * (ref_logp - arm_logp)
        terms.masked_fill_(ref_p == 0, 0.0)  # 0 log 0 = 0: ids the reference rules out contribute nothing
        kl.append(terms.sum(dim=-1).clamp_min(0.0))  # rounding can leave -1e-17 on identical rows
        top1.append(ref_logp.argmax(dim=-1) == arm_logp.argmax(dim=-1))
        nll_ref.append(-ref_logp.gather(1, idx[rows]).squeeze(1))
        nll_arm.append(-arm_logp.gather(1, idx[rows]).squeeze(1))
    if not n:
        empty = np.zeros(0)
        return PositionMetrics(empty, np.zeros(0, dtype=bool), empty, empty)
    return PositionMetrics(
        kl=torch.cat(kl).numpy(),
        top1=torch.cat(top1).numpy(),
        nll_ref=torch.cat(nll_ref).numpy(),
        nll_arm=torch.cat(nll_arm).numpy(),
    )


# The statistics a rule can check, each a function of per-position arrays (all arms share positions).
METRICS = ("mean_kl", "p99_kl", "top1", "abs_dnll")


def summarize(kl: np.ndarray, top1: np.ndarray, nll_ref: np.ndarray, nll_arm: np.ndarray) -> dict[str, float]:
    """Summary statistics over a set of positions (named as in `METRICS`, plus the signed ΔNLL)."""
    if kl.size == 0:
        raise ValueError("no positions to summarize")
    dnll = float(np.mean(nll_arm) - np.mean(nll_ref))
    return {
        "mean_kl": float(np.mean(kl)),
        "p99_kl": nearest_rank(kl, 0.99),
        "top1": float(np.mean(top1)),
        "dnll": dnll,
        "abs_dnll": abs(dnll),
        "positions": int(kl.size),
    }


@dataclass(frozen=True)
class ErrorStats:
    """Relative error of one implementation against fp64 over a cell (see the module docstring)."""

    mean: float
    p99: float
    max: float
    count: int

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    def no_worse_than(self, other: ErrorStats) -> bool:
        """The "never less precise than stock" bar for one cell: no epsilon, every statistic."""
        return self.mean <= other.mean and self.p99 <= other.p99 and self.max <= other.max


def relative_errors(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Element errors |out - exact| / rms(exact row), float64, flattened.

    A row whose exact value is all zeros has no scale: its errors are 0 where out is also 0, else inf.
    A NaN output element counts as an infinite error (it is infinitely wrong, and must fail the bar).
    """
    if out.shape != exact.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the fp64 shape {tuple(exact.shape)}")
    exact64 = exact.detach().to(torch.float64)
    diff = (out.detach().to(device=exact64.device, dtype=torch.float64) - exact64).abs()
    if exact64.dim() == 0:
        exact64, diff = exact64.reshape(1, 1), diff.reshape(1, 1)
    rms = exact64.pow(2).mean(dim=-1, keepdim=True).sqrt()
    scaled = torch.where(rms > 0, diff / torch.where(rms > 0, rms, torch.ones_like(rms)), diff * math.inf)
    scaled = torch.where(diff == 0, torch.zeros_like(scaled), scaled)
    return torch.nan_to_num(scaled, nan=math.inf, posinf=math.inf).reshape(-1)


def error_stats(errors: Sequence[torch.Tensor] | torch.Tensor) -> ErrorStats:
    """Mean, nearest-rank p99 and max over all element errors of a cell."""
    flat = errors if isinstance(errors, torch.Tensor) else torch.cat([e.reshape(-1) for e in errors])
    flat = flat.detach().to(torch.float64).cpu()
    if flat.numel() == 0:
        raise ValueError("no errors to summarize")
    return ErrorStats(
        mean=float(flat.mean()),
        p99=nearest_rank(flat, 0.99),
        max=float(flat.max()),
        count=int(flat.numel()),
    )
