"""KL / top-1 / NLL and relative-error math against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elpis.gate.metrics import compare_logits, error_stats, nearest_rank, relative_errors, summarize


def test_kl_top1_nll_match_hand_computed_values() -> None:
    # Row 0: P = (1/2, 1/2), Q = (3/4, 1/4).  Row 1: P = (1, 0) (a masked id), Q = (1/2, 1/2).
    ref = torch.tensor([[0.0, 0.0], [0.0, -math.inf]])
    arm = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]], dtype=torch.float64)
    got = compare_logits(ref, arm, targets=[1, 0])
    assert got.kl[0] == pytest.approx(0.5 * math.log(4.0 / 3.0), rel=1e-12)
    assert got.kl[1] == pytest.approx(math.log(2.0), rel=1e-12)
    assert got.nll_ref.tolist() == pytest.approx([math.log(2.0), 0.0])
    assert got.nll_arm.tolist() == pytest.approx([math.log(4.0), math.log(2.0)])
    assert got.top1.tolist() == [True, True]


def test_top1_disagreement_and_identical_rows() -> None:
    ref = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.25, 3.0]])
    arm = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.25, 3.0]])
    got = compare_logits(ref, arm, targets=[0, 2])
    assert got.top1.tolist() == [False, True]
    assert got.kl[1] == 0.0  # identical rows: exactly zero, never a rounding negative
    # KL of row 0 by hand: P = softmax(2,1,0), Q = softmax(1,2,0)
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    q = np.exp([1.0, 2.0, 0.0]) / np.exp([1.0, 2.0, 0.0]).sum()
    assert got.kl[0] == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-12)


def test_compare_logits_rejects_bad_shapes_and_targets() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        compare_logits(torch.zeros(2, 3), torch.zeros(2, 4), [0, 0])
    with pytest.raises(ValueError, match="targets"):
        compare_logits(torch.zeros(2, 3), torch.zeros(2, 3), [0])
    with pytest.raises(ValueError, match="outside the logit width"):
        compare_logits(torch.zeros(2, 3), torch.zeros(2, 3), [0, 3])


def test_summarize_and_nearest_rank() -> None:
    kl = np.arange(1, 101, dtype=np.float64)  # 1..100
    top1 = np.array([True] * 75 + [False] * 25)
    nll_ref, nll_arm = np.full(100, 2.0), np.full(100, 2.5)
    s = summarize(kl, top1, nll_ref, nll_arm)
    assert s["mean_kl"] == 50.5
    assert s["p99_kl"] == 99.0  # ceil(0.99 * 100) = 99th smallest
    assert s["top1"] == 0.75
    assert s["dnll"] == pytest.approx(0.5) and s["abs_dnll"] == pytest.approx(0.5)
    assert nearest_rank(np.array([3.0, 1.0, 2.0]), 0.5) == 2.0  # ceil(1.5) = 2nd smallest
    assert nearest_rank(torch.tensor([3.0, 1.0, 2.0]), 1.0) == 3.0
    with pytest.raises(ValueError):
        nearest_rank(np.array([]), 0.5)


def test_relative_error_uses_row_rms() -> None:
    exact = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)  # row RMS: sqrt(12.5), 0
    out = torch.tensor([[3.0, 5.0], [0.0, 0.0]], dtype=torch.float32)
    errors = relative_errors(out, exact)
    assert errors.tolist() == pytest.approx([0.0, 1.0 / math.sqrt(12.5), 0.0, 0.0])
    stats = error_stats(errors)
    assert stats.max == pytest.approx(1.0 / math.sqrt(12.5))
    assert stats.mean == pytest.approx(0.25 / math.sqrt(12.5))
    assert stats.count == 4


def test_relative_error_nan_and_zero_scale_count_as_infinite() -> None:
    exact = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    out = torch.tensor([[float("nan"), 1.0], [0.0, 1e-9]])
    errors = relative_errors(out, exact)
    assert math.isinf(errors[0]) and errors[1] == 0.0 and errors[2] == 0.0 and math.isinf(errors[3])


def test_no_worse_than_is_strict_per_statistic() -> None:
    base = error_stats(torch.tensor([1.0, 2.0, 3.0]))
    assert base.no_worse_than(base)
    worse_max = error_stats(torch.tensor([1.0, 1.0, 3.5]))  # lower mean, higher max
    assert worse_max.mean < base.mean and not worse_max.no_worse_than(base)
