"""The round's decision on the GPU (patches/kernels/round_tail.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: its record is `elpis.accept.tree`'s decision on the same tree, targets, stops and
budget; it copies the commit inputs of the path's end row, or the no-op ones when a row failed its checks, a
greedy maximum was not finite or the acceptor refused the cells; bad arguments are refused. And the host
half, `commit_candidates`: each candidate is the commit of the path from the root to its row.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from elpis import accept
from elpis.accept import abi
from elpis.exl3 import gdn_tree, round_tail
from elpis.exl3.tree_verify import PAGE, kv_moves
from tests.kernels import cuda_emu

COLS = 15  # a verify of 16 rows: 15 moves per commit
PLAN = 64  # plan bytes per candidate in the kernel tests (any size the kernel copies)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    built = cuda_emu.build_emulated(round_tail.SOURCE, tmp_path_factory.mktemp("round_tail_emu"), launches=1)
    return round_tail.bind(built)


def _candidates(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct made-up commit inputs per candidate, so a copy of the wrong one shows."""
    rng = np.random.default_rng(seed)
    moves = rng.integers(0, 1 << 40, size=(round_tail.CANDIDATES, 4, COLS), dtype=np.int64)
    plans = rng.integers(0, 256, size=(round_tail.CANDIDATES, PLAN), dtype=np.uint8)
    return moves, plans


def _decide(lib, cells, ids, bad, moves, plans) -> tuple[round_tail.RoundTail, np.ndarray, np.ndarray]:
    rows = len(ids)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bad = np.ascontiguousarray(bad, dtype=np.int32)
    record = np.full(round_tail.RECORD_WORDS, -7, dtype=np.int32)
    moves_out = np.full((4, COLS), -7, dtype=np.int64)
    plan_out = np.zeros(PLAN, dtype=np.uint8)
    err = lib.elpis_round_tail(
        cells.ctypes.data, ids.ctypes.data, bad.ctypes.data, rows, moves.ctypes.data, COLS, plans.ctypes.data,
        PLAN, record.ctypes.data, moves_out.ctypes.data, plan_out.ctypes.data, None,
    )  # fmt: skip
    assert err == 0
    return round_tail.read_record(record.tolist()), moves_out, plan_out


def _random_round(rng: random.Random) -> tuple[list[int], list[int], list[int], list[int], int]:
    """A tree whose targets follow some drafts (so paths of several rows get accepted), stops, a budget."""
    rows = rng.randint(1, 16)
    parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
    vocab = 12  # small, so stops and matches happen
    draft = [rng.randrange(vocab) for _ in range(rows)]
    target = [rng.randrange(vocab) for _ in range(rows)]
    for r in range(1, rows):
        if rng.random() < 0.6:
            target[parents[r]] = draft[r]  # the parent's target is this child's draft: accepted
    stops = rng.sample(range(vocab), rng.randint(0, 2))
    budget = rng.randint(1, 20)
    return parents, draft, target, stops, budget


def test_the_record_is_the_proven_acceptors_decision_and_the_end_rows_inputs_are_copied(lib) -> None:
    rng = random.Random(5)
    moves, plans = _candidates(1)
    seen_lengths = set()
    for _ in range(200):
        parents, draft, target, stops, budget = _random_round(rng)
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        got, moves_out, plan_out = _decide(lib, cells, target, [0] * len(parents), moves, plans)
        want = accept.tree(parents, draft, target, stops, budget)
        assert got.status == 0
        assert (got.path, got.count, got.ends) == (tuple(want.rows), want.count, want.ends)
        assert got.tokens == tuple(target[r] for r in want.rows) and got.end == want.rows[-1]
        assert np.array_equal(moves_out, moves[got.end]) and np.array_equal(plan_out, plans[got.end])
        seen_lengths.add(got.count)
    assert len(seen_lengths) >= 4, f"the random rounds accepted too few path lengths: {seen_lengths}"


def test_a_round_that_fails_its_checks_commits_nothing(lib) -> None:
    moves, plans = _candidates(2)
    parents, draft, target = [-1, 0, 1], [5, 6, 7], [6, 7, 8]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    noop = (moves[round_tail.NOOP], plans[round_tail.NOOP])
    cases = [
        (target, [0, 1, 0], round_tail.STATUS_FLAGGED_ROW),  # a NaN/+inf row or a changed digest
        ([6, -1, 8], [0, 0, 0], round_tail.STATUS_NON_FINITE),  # a row whose maximum was not finite
        ([6, 7, 2**32], [0, 0, 0], abi.ERR_ID),  # the acceptor's own refusal, with its code
    ]
    for ids, bad, status in cases:
        got, moves_out, plan_out = _decide(lib, cells, ids, bad, moves, plans)
        assert (got.status, got.count, got.path, got.tokens, got.end) == (status, 0, (), (), -1)
        assert np.array_equal(moves_out, noop[0]) and np.array_equal(plan_out, noop[1])
    wrong_rows = round_tail.tree_cells([-1, 0], [5, 6], [], 10)  # cells of another tree than the 3 ids
    assert _decide(lib, wrong_rows, target, [0, 0, 0], moves, plans)[0].status == abi.ERR_SIZE
    bad_parent = cells.copy()
    bad_parent[abi.TREE_PARENTS + 2] = 2
    assert _decide(lib, bad_parent, target, [0, 0, 0], moves, plans)[0].status == abi.ERR_PARENT


def test_bad_arguments_are_refused(lib) -> None:
    moves, plans = _candidates(3)
    cells = round_tail.tree_cells([-1], [1], [], 1)
    ids, bad = np.zeros(17, dtype=np.int64), np.zeros(17, dtype=np.int32)
    out = np.zeros(8192, dtype=np.int64)

    def call(rows: int, cols: int, plan_bytes: int) -> int:
        return lib.elpis_round_tail(
            cells.ctypes.data, ids.ctypes.data, bad.ctypes.data, rows, moves.ctypes.data, cols,
            plans.ctypes.data, plan_bytes, out.ctypes.data, out.ctypes.data, out.ctypes.data, None,
        )  # fmt: skip

    assert call(0, COLS, PLAN) == -1 and call(17, COLS, PLAN) == -1
    assert call(1, 16, PLAN) == -1
    assert call(1, COLS, 0) == -1 and call(1, COLS, 4097) == -1


def test_tree_cells_refuse_what_the_layout_cannot_hold() -> None:
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        round_tail.tree_cells([], [], [], 1)
    with pytest.raises(ValueError, match="draft token per row"):
        round_tail.tree_cells([-1, 0], [1], [], 1)
    with pytest.raises(ValueError, match="at most 4 stop ids"):
        round_tail.tree_cells([-1], [1], [1, 2, 3, 4, 5], 1)


def test_each_candidate_commits_the_path_from_the_root_to_its_row() -> None:
    parents = [-1, 0, 0, 1, 3, 2]
    kvp, run = 3 * PAGE - 5, 16  # the verify's slots straddle a page boundary
    pages = [40, 41, 42, 43]
    moves, plans = round_tail.commit_candidates(parents, kvp, run, pages)
    assert moves.shape == (round_tail.CANDIDATES, 4, run - 1)
    assert plans.shape == (round_tail.CANDIDATES, gdn_tree.PLAN_CAPACITY)
    assert round_tail.root_path(parents, 4) == [0, 1, 3, 4] and round_tail.root_path(parents, 0) == [0]
    pad = kvp + run - 1

    def slots(page_row: np.ndarray, offset_row: np.ndarray) -> list[int]:
        return [pages.index(int(p)) * PAGE + int(o) for p, o in zip(page_row, offset_row, strict=True)]

    for e in range(round_tail.CANDIDATES):
        path = round_tail.root_path(parents, e) if e < len(parents) else []
        real = kv_moves(kvp, path)
        src, dst = slots(moves[e, 0], moves[e, 1]), slots(moves[e, 2], moves[e, 3])
        assert list(zip(src, dst, strict=True)) == real + [(pad, pad)] * (run - 1 - len(real)), e
        plan = gdn_tree.packed_commit_plan(tuple(path)) if path else b""
        assert plans[e].tobytes() == plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan)), e
    with pytest.raises(ValueError, match="cannot hold a tree"):
        round_tail.commit_candidates(parents, kvp, 4, pages)
