"""The round's single-thread kernels as nvcc compiles them (patches/kernels/round_tail.cu, round_plan.cu), run
on the CPU by the PTX interpreter (tests/kernels/ptx_interp.py), against their CPU emulation (cuda_emu.py, the
same source built by g++): on the same inputs, every output array equal byte for byte, for the sm_86 and sm_90
PTX, and the tail's record the proven acceptor's decision.

The emulation checks the source; this checks the code the GPU runs. nvcc 13.0 compiled gdn_tree_plan.cuh
inside round_tail.cu into a refusal of every round (device calls 142-146, H200) while every host build of the
same source decided right; the interpreter reproduced it on the PTX before any GPU could. CI has nvcc and no
GPU, so this runs there (`.ci/run` sets ELPIS_REQUIRE_NVCC=1).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from elpis import accept, nvcc
from elpis.accept import abi
from elpis.exl3 import round_check, round_plan, round_tail
from elpis.exl3.tree_verify import PAGE
from tests.kernels.ptx_interp import PtxProgram
from tests.kernels.round_plan_cases import (
    Request,
    emulated_plan,
    emulated_tail_launch,
    interpreted_plan_launch,
    interpreted_tail_launch,
    random_block,
    random_request,
    random_round,
)
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

RUN = 16
VOCAB = 248_320


def _ptx(source, arch: str) -> PtxProgram:
    return PtxProgram(nvcc.compile_to(source, "ptx", arch=arch).read_text())


@pytest.fixture(scope="module", params=nvcc.ARCHS)
def tail_ptx(request: pytest.FixtureRequest) -> PtxProgram:
    return _ptx(round_tail.SOURCE, request.param)


@pytest.fixture(scope="module", params=nvcc.ARCHS)
def plan_ptx(request: pytest.FixtureRequest) -> PtxProgram:
    return _ptx(round_plan.SOURCE, request.param)


def _state(kvp: int, remaining: int, anchor: int, stops: tuple[int, ...]) -> np.ndarray:
    return Request(anchor, kvp, remaining, kvp + 1000, RUN, stops).state()


def _tail_both_ways(emu, program: PtxProgram, cells, ids, bad, state) -> round_tail.RoundTail:
    """One round through the tail's emulation and its interpreted PTX: every buffer equal, the record read."""
    emulated, interpreted = (round_check.buffers(cells, ids, bad, state) for _ in range(2))
    emulated_tail_launch(emu)(emulated)
    interpreted_tail_launch(program)(interpreted)
    for name, value in emulated.items():
        assert np.array_equal(interpreted[name], value), (name, cells.tolist(), ids, bad)
    return round_tail.read_record(interpreted["record"].tolist())


def test_the_tails_ptx_decides_as_the_acceptor_and_writes_what_its_emulation_does(
    tail_ptx, round_tail_emu
) -> None:
    rng = random.Random(17)
    lengths = set()
    for _ in range(60):
        parents, draft, target, stops, budget = random_round(rng)
        kvp = rng.choice((0, PAGE - 3, 2 * PAGE - 9, 3 * PAGE + 17))
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        state = _state(kvp, budget, draft[0], tuple(stops))
        got = _tail_both_ways(round_tail_emu, tail_ptx, cells, target, [0] * len(parents), state)
        want = accept.tree(parents, draft, target, stops, budget)
        assert (got.status, got.path, got.count, got.ends) == (0, tuple(want.rows), want.count, want.ends)
        lengths.add(got.count)
    assert len(lengths) >= 4, f"too few committed path lengths to mean much: {lengths}"


def test_the_tails_ptx_writes_the_no_op_inputs_where_its_emulation_does(tail_ptx, round_tail_emu) -> None:
    parents, draft, target = [-1, 0, 1], [5, 6, 7], [6, 7, 8]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    idle = cells.copy()
    idle[abi.TREE_ROWS] = 0
    cases = [
        (cells, target, [0, 1, 0], 300, round_tail.STATUS_FLAGGED_ROW),
        (cells, [6, -1, 8], [0, 0, 0], 300, round_tail.STATUS_NON_FINITE),
        (cells, [6, 7, 2**32], [0, 0, 0], 300, abi.ERR_ID),
        (idle, target, [0, 0, 0], 300, abi.ERR_SIZE),
        (cells, target, [0, 0, 0], len(round_check.PAGES) * PAGE - 2, round_tail.STATUS_SLOT_OUTSIDE_PAGES),
    ]
    for cells_, ids, bad, kvp, status in cases:
        state = _state(kvp, 10, 5, ())
        assert _tail_both_ways(round_tail_emu, tail_ptx, cells_, ids, bad, state).status == status


def test_the_plans_ptx_builds_the_tree_and_inputs_its_emulation_builds(plan_ptx, round_plan_emu) -> None:
    rng = random.Random(23)
    statuses = set()
    for _ in range(24):
        run = rng.choice((8, 16))
        vocab = rng.choice((16, VOCAB))
        packed = random_block(rng, 7, rng.choice((1, 2, 4, 8)), vocab)
        state = random_request(rng, run, vocab).state()
        err, want_record, want_inputs, want_cells = emulated_plan(round_plan_emu, packed, run, vocab, state)
        assert err == 0
        launch = interpreted_plan_launch(plan_ptx)
        words, got_inputs, got_cells = round_check.plan_outputs(launch, packed, run, vocab, state)
        got_record = round_plan.read_record(words)
        assert got_record == want_record
        assert got_inputs == want_inputs
        assert got_cells.tolist() == want_cells.tolist()
        statuses.add(got_record.status)
    assert 0 in statuses and len(statuses) >= 2, f"the random rounds reached too few outcomes: {statuses}"
