"""Block bootstrap: known distributions give known intervals; seeds make it deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from elpis.gate.bootstrap import bootstrap, percentile_interval, plan_blocks, replicate_indices


def test_blocks_stay_inside_documents() -> None:
    plan = plan_blocks([5, 3], ["a", "b"], block=2)
    assert [b.tolist() for b in plan.blocks] == [[0, 1], [2, 3], [4], [5, 6], [7]]
    assert plan.strata == ("a", "a", "a", "b", "b")
    assert plan.total == 8
    with pytest.raises(ValueError):
        plan_blocks([3], ["a"], block=0)
    with pytest.raises(ValueError):
        plan_blocks([0], ["a"], block=4)


def test_replicates_keep_stratum_sizes_and_are_seeded() -> None:
    plan = plan_blocks([40, 8], ["big", "small"], block=4)
    first = list(replicate_indices(plan, 20, seed=7))
    again = list(replicate_indices(plan, 20, seed=7))
    other = list(replicate_indices(plan, 20, seed=8))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    for idx in first:
        assert np.sum(idx < 40) == 40 and np.sum(idx >= 40) == 8  # each stratum keeps its weight


def test_iid_normal_mean_interval_matches_theory() -> None:
    # n iid N(mu, sigma^2): the bootstrap distribution of the mean has sd sigma / sqrt(n), so the 90 %
    # percentile interval is mu_hat -/+ 1.645 sigma / sqrt(n).
    rng = np.random.default_rng(1)
    n, sigma = 2000, 2.0
    x = rng.normal(3.0, sigma, size=n)
    plan = plan_blocks([n], ["doc"], block=1)
    samples = bootstrap(lambda idx: x[idx].mean(), plan, replicates=4000, seed=11)[:, 0]
    lo, hi = percentile_interval(samples, 0.90)
    half_width = 1.6449 * x.std() / np.sqrt(n)
    assert (hi - lo) / 2 == pytest.approx(half_width, rel=0.08)
    assert (lo + hi) / 2 == pytest.approx(x.mean(), abs=0.15 * half_width)
    assert samples.std() == pytest.approx(sigma / np.sqrt(n), rel=0.08)


def test_block_bootstrap_sees_correlation_iid_bootstrap_misses() -> None:
    # Every block of 50 positions shares one value: only 40 independent draws, not 2000. Blocks of 50
    # give the right sd (sd of the block values / sqrt(40)); blocks of 1 understate it about 7-fold.
    rng = np.random.default_rng(2)
    values = np.repeat(rng.normal(0.0, 1.0, size=40), 50)
    blocked = bootstrap(lambda idx: values[idx].mean(), plan_blocks([2000], ["d"], 50), 3000, seed=3)[:, 0]
    single = bootstrap(lambda idx: values[idx].mean(), plan_blocks([2000], ["d"], 1), 3000, seed=3)[:, 0]
    expected = values[::50].std() / np.sqrt(40)
    assert blocked.std() == pytest.approx(expected, rel=0.1)
    assert single.std() < blocked.std() / 4


def test_bootstrap_returns_one_column_per_statistic() -> None:
    x = np.arange(10.0)
    out = bootstrap(lambda idx: [x[idx].mean(), x[idx].max()], plan_blocks([10], ["d"], 2), 100, seed=0)
    assert out.shape == (100, 2)
    assert np.all(out[:, 1] <= 9.0)
