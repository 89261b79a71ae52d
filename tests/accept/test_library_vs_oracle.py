"""The admitted library against the oracle on fresh random inputs (seeds the table never used), and the
single-call Python path against the batch path."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from elpis import accept
from elpis.accept import abi, oracle, table

FRESH_SEEDS = (0x7E57_0001, 0x7E57_0002, 0x7E57_0003)


@pytest.mark.parametrize("seed", FRESH_SEEDS)
def test_chain_batch_matches_oracle_on_fresh_inputs(acceptor: Any, seed: int) -> None:
    cells = table.random_chain_block(seed, 0, 20_000)
    got = accept.batch("chain", cells)
    assert np.array_equal(got["codes"], oracle.chain(cells))


@pytest.mark.parametrize("seed", FRESH_SEEDS)
def test_tree_batch_matches_oracle_on_fresh_inputs(acceptor: Any, seed: int) -> None:
    cells = table.random_tree_block(seed, 0, 20_000)
    got = accept.batch("tree", cells)
    codes, paths = oracle.tree(cells)
    assert np.array_equal(got["codes"], codes)
    assert np.array_equal(got["paths"], paths)


@pytest.mark.parametrize("seed", FRESH_SEEDS)
def test_masks_batch_matches_oracle_on_fresh_inputs(acceptor: Any, seed: int) -> None:
    cells = table.random_masks_block(seed, 0, 5_000)
    got = accept.batch("masks", cells)
    depth, ancestors = oracle.masks(cells)
    assert not got["codes"].any()
    assert np.array_equal(got["depth"], depth)
    assert np.array_equal(got["ancestors"], ancestors)


def _unpacked_chain(row: np.ndarray) -> tuple[list[int], list[int], list[int], int]:
    k, ns = int(row[abi.CHAIN_K]), int(row[abi.CHAIN_NSTOPS])
    return (
        row[abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + k].tolist(),
        row[abi.CHAIN_TARGET : abi.CHAIN_TARGET + k + 1].tolist(),
        row[abi.CHAIN_STOPS : abi.CHAIN_STOPS + ns].tolist(),
        int(row[abi.CHAIN_BUDGET]),
    )


def test_python_binding_agrees_with_the_batch_entry(acceptor: Any) -> None:
    chain_cells = table.random_chain_block(0x7E57_0004, 0, 3_000)
    codes = accept.batch("chain", chain_cells)["codes"]
    for row, code in zip(chain_cells, codes, strict=True):
        d = accept.chain(*_unpacked_chain(row))
        assert (d.count << 1 | d.ends) == code
    tree_cells = table.random_tree_block(0x7E57_0005, 0, 3_000)
    out = accept.batch("tree", tree_cells)
    for row, code, path in zip(tree_cells, out["codes"], out["paths"], strict=True):
        rows, ns = int(row[abi.TREE_ROWS]), int(row[abi.TREE_NSTOPS])
        d = accept.tree(
            row[abi.TREE_PARENTS : abi.TREE_PARENTS + rows].tolist(),
            row[abi.TREE_DRAFT : abi.TREE_DRAFT + rows].tolist(),
            row[abi.TREE_TARGET : abi.TREE_TARGET + rows].tolist(),
            row[abi.TREE_STOPS : abi.TREE_STOPS + ns].tolist(),
            int(row[abi.TREE_BUDGET]),
        )
        assert (d.count << 1 | d.ends) == code
        assert sum(r << (4 * i) for i, r in enumerate(d.rows)) == int(path)


def test_batch_reports_invalid_rows_with_the_glue_codes(acceptor: Any) -> None:
    """The batch entry validates every row like the single call: random int64 cells are almost all
    invalid, and each gets the code of the first failing check."""
    rng = np.random.default_rng(7)
    cells = rng.integers(-3, 20, size=(2_000, abi.CHAIN_CELLS), dtype=np.int64)
    codes = accept.batch("chain", cells)["codes"]
    k, ns, budget = cells[:, abi.CHAIN_K], cells[:, abi.CHAIN_NSTOPS], cells[:, abi.CHAIN_BUDGET]
    bad_k = (k < 0) | (k > 15)
    assert (codes[bad_k] == abi.ERR_SIZE).all()
    bad_ns = ~bad_k & ((ns < 0) | (ns > 4))
    assert (codes[bad_ns] == abi.ERR_STOPS).all()
    bad_budget = ~bad_k & ~bad_ns & (budget < 1)
    assert (codes[bad_budget] == abi.ERR_BUDGET).all()
    assert bad_k.any() and bad_ns.any() and bad_budget.any()


def test_a_wrong_shape_is_refused_before_c_sees_it(acceptor: Any) -> None:
    with pytest.raises(ValueError, match="shape"):
        accept.batch("chain", np.zeros((3, abi.TREE_CELLS), dtype=np.int64))


def test_random_single_calls_against_the_oracle(acceptor: Any) -> None:
    """Small alphabets make matches, stops and caps frequent; the oracle is the yardstick."""
    rnd = random.Random(0x7E57)
    for _ in range(2_000):
        k = rnd.randrange(16)
        target = [rnd.choice([0, 1, 2, 2**32 - 1]) for _ in range(k + 1)]
        draft = [t if rnd.random() < 0.85 else rnd.choice([0, 1, 2]) for t in target[:k]]
        stops = rnd.sample([0, 1, 2, 5, 2**32 - 1], rnd.randrange(5))
        budget = rnd.choice([1, 2, 3, 4, 8, 16, 17, abi.BUDGET_MAX])
        d = accept.chain(draft, target, stops, budget)
        cells = np.zeros((1, abi.CHAIN_CELLS), dtype=np.int64)
        cells[0, :3] = k, budget, len(stops)
        cells[0, abi.CHAIN_STOPS : abi.CHAIN_STOPS + len(stops)] = stops
        cells[0, abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + k] = draft
        cells[0, abi.CHAIN_TARGET : abi.CHAIN_TARGET + k + 1] = target
        assert (d.count << 1 | d.ends) == int(oracle.chain(cells)[0])
