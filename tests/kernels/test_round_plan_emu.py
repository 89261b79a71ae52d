"""The head of a greedy tree round on the GPU (patches/kernels/round_plan.cu) on the CPU, through the CUDA
emulation of tests/kernels/cuda_emu.py: for a draft block's candidates and a request's state, the kernel's
tree, the verify's inputs and the acceptor's cells are the host's (tests/kernels/round_plan_cases.py composes
the served Python), it refuses where the host's builder raises, it idles without room or budget, and its
arguments and state are checked.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from elpis.accept import abi
from elpis.exl3 import round_check, round_plan
from tests.kernels.round_plan_cases import (
    SCRATCH_BYTES,
    Request,
    emulated_plan,
    host_plan,
    random_block,
    random_request,
)

VOCAB = 248_320


@pytest.fixture
def lib(round_plan_emu: ctypes.CDLL) -> ctypes.CDLL:
    return round_plan_emu


def _plan(lib, packed: np.ndarray, run: int, vocab: int, req: Request, *, k: int | None = None):
    return emulated_plan(lib, packed, run, vocab, req.state(), k=k)


def _check(lib, packed: np.ndarray, run: int, vocab: int, req: Request) -> round_plan.PlannedTree:
    want = host_plan(packed, run, vocab, req)
    err, got, inputs, cells = _plan(lib, packed, run, vocab, req)
    assert err == 0
    # a refused round's cells hold 0 rows, which the acceptor refuses: round_tail commits nothing
    assert round_check.plan_difference(got, inputs, cells, want) is None
    return got


@pytest.mark.parametrize("run", [8, 16])
def test_random_blocks_plan_the_hosts_tree_and_verify_inputs(lib, run: int) -> None:
    rng = random.Random(run)
    shapes = set()
    for _ in range(400):
        k = rng.choice((1, 2, 4, 8, 16))
        vocab = rng.choice((16, VOCAB))
        packed = random_block(rng, 7, k, vocab)
        req = random_request(rng, run, vocab)
        got = _check(lib, packed, run, vocab, req)
        shapes.add((got.status, got.rows > 1, max(_depths(got.parents)) > 1))
    # the cases reach deep trees, anchor-only rounds and idle rounds
    assert {(0, True, True), (0, False, False), (round_plan.STATUS_IDLE, False, False)} <= shapes


def _depths(parents: tuple[int, ...]) -> list[int]:
    depth = [0] * len(parents)
    for r in range(1, len(parents)):
        depth[r] = depth[parents[r]] + 1
    return depth


def test_ties_go_to_the_smaller_rank_path_and_duplicates_keep_the_first(lib) -> None:
    # every log-probability equal: best-first order is then the rank paths' lexicographic order
    packed = np.zeros((3, 2 + 2 * 3), dtype=np.float32)
    for d in range(3):
        packed[d, 0] = 10 + d
        packed[d, 2:5] = [10 + d, 20 + d, 20 + d]  # the chain token again, then a duplicate
        packed[d, 1], packed[d, 5:8] = -1.0, -1.0
    req = Request(anchor=5, kvp=100, remaining=50, max_context=10_000, tree_budget=8, stops=())
    got = _check(lib, packed, 8, VOCAB, req)
    # depth 1 keeps 10 and 20 (the chain token and the second 20 dropped); a row at depth d scores -d, so
    # both depth-1 rows come first, then the depth-2 rows by rank path: (0, 0) and (0, 1) under 10 before
    # (1, 0) under 20
    assert got.tokens[:6] == (5, 10, 20, 11, 21, 11) and got.parents[:6] == (-1, 0, 0, 1, 1, 2)


def test_a_depth_without_candidates_ends_the_block_before_later_depths_are_checked(lib) -> None:
    packed = np.full((3, 2 + 2 * 2), -1.0, dtype=np.float32)
    packed[:, 0] = [3, 4, 5]
    packed[:, 2:4] = [[3, 7], [4, 8], [5, 9]]
    packed[1, 1], packed[1, 4:6] = -np.inf, -np.inf  # depth 2: nothing left after -inf is dropped
    packed[2, 2] = VOCAB + 5  # outside the vocabulary, but past the empty depth: never checked by the host
    req = Request(anchor=1, kvp=0, remaining=20, max_context=100, tree_budget=16, stops=())
    got = _check(lib, packed, 16, VOCAB, req)
    assert got.status == 0 and max(_depths(got.parents)) == 1


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param((0, 3, float(1 << 24)), id="unused-id-2^24"),  # unpacking checks every id it reads back
        pytest.param((1, 0, float("nan")), id="nan-id"),
        pytest.param((0, 2, float(VOCAB)), id="id-outside-vocab"),
        pytest.param((2, 2, -1.0), id="negative-id"),
    ],
)
def test_candidates_the_host_refuses_are_refused(lib, bad: tuple[int, int, float]) -> None:
    packed = random_block(random.Random(3), 7, 2, VOCAB)
    packed[:, 1] = -1.0  # finite log-probabilities: every depth has candidates
    packed[:, 4:6] = [-2.0, -3.0]
    row, col, value = bad
    packed[row, col] = value
    req = Request(anchor=1, kvp=10, remaining=20, max_context=1000, tree_budget=16, stops=(2,))
    got = _check(lib, packed, 16, VOCAB, req)
    assert got.status < 0 and got.rows == 1
    assert got.status in round_plan.STATUS_MESSAGES


@pytest.mark.parametrize(
    "req",
    [
        pytest.param(Request(1, 10, 5, 1000, 8, (), done=True), id="done"),
        pytest.param(Request(1, 10, 0, 1000, 8, ()), id="no-budget"),
        pytest.param(Request(1, 1000, 5, 1000, 8, ()), id="no-room"),
    ],
)
def test_an_idle_round_verifies_the_anchor_alone_and_commits_nothing(lib, req: Request) -> None:
    got = _check(lib, random_block(random.Random(4), 7, 4, VOCAB), 8, VOCAB, req)
    assert got.status == round_plan.STATUS_IDLE and got.rows == 1


@pytest.mark.parametrize(
    "req",
    [
        pytest.param(Request(1, 10, 5, 1000, 9, ()), id="tree-budget-over-run"),
        pytest.param(Request(1, 10, 5, 1000, 0, ()), id="no-tree-budget"),
        pytest.param(Request(VOCAB, 10, 5, 1000, 8, ()), id="anchor-outside-vocab"),
        pytest.param(Request(1, -1, 5, 1000, 8, ()), id="negative-kvp"),
    ],
)
def test_a_state_out_of_range_is_refused(lib, req: Request) -> None:
    err, got, inputs, cells = _plan(lib, random_block(random.Random(5), 7, 4, VOCAB), 8, VOCAB, req)
    assert err == 0 and got.status == -1 and got.rows == 1 and cells[abi.TREE_ROWS] == 0
    # the anchor alone at position 0; an anchor outside the vocabulary leaves id 0 in every row
    assert inputs["ids"] == [req.anchor if 0 <= req.anchor < VOCAB else 0] * 8
    assert inputs["seqlens"] == inputs["ctx"] == [0] and inputs["masks"][:8] == [0] + [1] * 7


@pytest.mark.parametrize(
    ("block_rows", "k", "run", "vocab", "scratch"),
    [(0, 4, 8, VOCAB, 0), (16, 4, 8, VOCAB, 0), (7, 0, 8, VOCAB, 0), (7, 17, 8, VOCAB, 0),
     (7, 4, 0, VOCAB, 0), (7, 4, 17, VOCAB, 0), (7, 4, 8, 0, 0), (7, 4, 8, (1 << 24) + 1, 0),
     (7, 4, 8, VOCAB, -8), (7, 4, 8, VOCAB, 4), (7, 4, 8, VOCAB, None)],
)  # fmt: skip
def test_arguments_out_of_range_are_refused(
    lib, block_rows: int, k: int, run: int, vocab: int, scratch: int | None
) -> None:
    """Each case changes one thing of a call that runs (the last argument: the scratch block's size short by 8
    bytes, its address off 8 bytes, or none)."""
    packed = np.zeros((max(block_rows, 1), 2 + 2 * max(k, 1)), dtype=np.float32)
    state = Request(1, 10, 5, 1000, 1, ()).state()
    out = [np.zeros(n, dtype=t) for n, t in ((1, np.int32), (17, np.int32), (1, np.int32), (34, np.int32),
                                              (256, np.uint8), (17, np.int32))]  # fmt: skip
    cells = np.zeros(abi.TREE_CELLS, dtype=np.int64)
    record = np.zeros(round_plan.RECORD_WORDS, dtype=np.int32)
    need = lib.elpis_round_plan_scratch_bytes()
    assert need <= SCRATCH_BYTES  # the interpreted launches' scratch holds the kernel's
    block = np.zeros(need // 8 + 2, dtype=np.int64)
    at = None if scratch is None else block.ctypes.data + (4 if scratch == 4 else 0)
    size = need - 8 if scratch == -8 else need
    args = (packed.ctypes.data, block_rows, k, run, vocab, state.ctypes.data, *[o.ctypes.data for o in out])
    assert lib.elpis_round_plan(*args, cells.ctypes.data, record.ctypes.data, at, size, None) == -1
    assert not record.any()  # nothing launched
    if (block_rows, k, run, vocab) == (7, 4, 8, VOCAB):  # the same call with the scratch it needs runs
        outputs = (cells.ctypes.data, record.ctypes.data, block.ctypes.data)
        assert lib.elpis_round_plan(*args, *outputs, need, None) == 0
