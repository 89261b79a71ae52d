"""The load-time checks of the round's kernels (elpis.exl3.round_check), on the CPU: right builds pass them
(each kernel's CPU emulation, and its PTX as nvcc compiles it, interpreted), a build that writes one wrong
element fails them naming the round and the output, and the miscompiled decision kernel of sessions 36-37
(round_tail.cu with gdn_tree_plan.cuh's scratch arrays first written after its checks, the order before the
fix) is refused wherever this nvcc still miscompiles that order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from elpis import nvcc
from elpis.exl3 import round_check, round_plan, round_tail
from tests.kernels.ptx_interp import PtxProgram
from tests.kernels.round_plan_cases import (
    emulated_plan_launch,
    emulated_tail_launch,
    interpreted_plan_launch,
    interpreted_tail_launch,
)
from tests.nvcc_marks import needs_nvcc

# The header in the order nvcc 13.0 miscompiled (the scratch arrays first written after the mask checks), kept
# as it was when session 37 fixed it; round_tail.cu includes it in place of the served one.
SESSION36_HEADER = Path(__file__).parent / "data" / "gdn_tree_plan_session36.cuh"


def test_the_kernels_emulation_passes_and_the_rounds_cover_commits_and_refusals(round_tail_emu) -> None:
    statuses, lengths = [], set()
    launch = emulated_tail_launch(round_tail_emu)

    def watched(b: round_check.Buffers) -> None:
        launch(b)
        got = round_tail.read_record(b["record"].tolist())
        statuses.append(got.status)
        lengths.add(got.count)

    assert round_check.check_round_tail(watched) == len(statuses) >= 20
    assert {round_tail.STATUS_FLAGGED_ROW, round_tail.STATUS_NON_FINITE, 0} <= set(statuses)
    assert any(s < 0 for s in statuses) and len(lengths) >= 4, (statuses, lengths)


@pytest.mark.parametrize("name", ["record", "moves_out", "plan_out", "cond_index", "state"])
def test_one_wrong_output_fails_the_check_naming_it(round_tail_emu, name: str) -> None:
    launch = emulated_tail_launch(round_tail_emu)
    rounds = 0

    def wrong(b: round_check.Buffers) -> None:
        nonlocal rounds
        launch(b)
        rounds += 1
        if rounds == 5:  # one round's one output, one element
            b[name].reshape(-1)[1] ^= 1

    with pytest.raises(round_check.RoundKernelMismatch, match=f"check round 4: its {name} is"):
        round_check.check_round_tail(wrong)


@needs_nvcc
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_kernels_ptx_passes(arch: str) -> None:
    program = PtxProgram(nvcc.compile_to(round_tail.SOURCE, "ptx", arch=arch).read_text())
    assert round_check.check_round_tail(interpreted_tail_launch(program)) >= 20


@needs_nvcc
def test_the_miscompiled_kernel_of_sessions_36_37_is_refused(tmp_path: Path) -> None:
    # the kernel's source beside the old order: a quoted include looks in the source's own directory first
    shutil.copy(round_tail.SOURCE, tmp_path / round_tail.SOURCE.name)
    shutil.copy(SESSION36_HEADER, tmp_path / "gdn_tree_plan.cuh")
    ptx = nvcc.compile_to(tmp_path / round_tail.SOURCE.name, "ptx", arch="sm_86", out_dir=tmp_path)
    try:
        round_check.check_round_tail(interpreted_tail_launch(PtxProgram(ptx.read_text())))
    except round_check.RoundKernelMismatch as refused:
        assert "check round 0: its record is [-6" in str(refused), refused  # the GPU's status on every round
    else:
        version = nvcc.nvcc_version().strip().splitlines()[-1]
        pytest.skip(f"this nvcc ({version}) builds the old order right: nothing to catch")


def test_the_plan_kernels_emulation_passes_over_trees_idle_rounds_and_refusals(round_plan_emu) -> None:
    statuses = []
    launch = emulated_plan_launch(round_plan_emu)

    def watched(packed, vocab, state, inputs, cells, record) -> None:
        launch(packed, vocab, state, inputs, cells, record)
        statuses.append(int(record[0]))

    assert round_check.check_round_plan(watched) == len(statuses) == round_check.PLAN_ROUNDS
    assert 0 in statuses and len(set(statuses)) >= 2, statuses


@pytest.mark.parametrize("name", ["masks", "plan", "ids", "cells", "record"])
def test_one_wrong_plan_output_fails_the_check(round_plan_emu, name: str) -> None:
    launch = emulated_plan_launch(round_plan_emu)
    rounds = 0

    def wrong(packed, vocab, state, inputs, cells, record) -> None:
        nonlocal rounds
        launch(packed, vocab, state, inputs, cells, record)
        rounds += 1
        if rounds == 3:
            target = {"cells": cells, "record": record}.get(name, inputs.get(name))
            target.reshape(-1)[2] ^= 1  # record word 2: the first tree token

    with pytest.raises(round_check.RoundKernelMismatch, match="plan check round 2: its "):
        round_check.check_round_plan(wrong)


@needs_nvcc
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_plan_kernels_ptx_passes(arch: str) -> None:
    program = PtxProgram(nvcc.compile_to(round_plan.SOURCE, "ptx", arch=arch).read_text())
    assert round_check.check_round_plan(interpreted_plan_launch(program)) == round_check.PLAN_ROUNDS
