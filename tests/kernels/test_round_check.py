"""The load-time check of the round's decision kernel (elpis.exl3.round_check), on the CPU: a right build
passes it (the kernel's CPU emulation, and its PTX as nvcc compiles it, interpreted), a build that writes one
wrong byte fails it naming the round, and the miscompiled kernel of sessions 36-37 (round_tail.cu built with
the old gdn_tree_plan.cuh) fails it wherever this nvcc still miscompiles that header."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest

from elpis import nvcc
from elpis.exl3 import round_check, round_tail
from tests.kernels.ptx_interp import Machine, PtxProgram

HERE = Path(__file__).resolve().parent
needs_nvcc = pytest.mark.skipif(
    nvcc.nvcc_path() is None and os.environ.get("ELPIS_REQUIRE_NVCC") != "1",
    reason="nvcc not installed (CI sets ELPIS_REQUIRE_NVCC=1 and has it)",
)


def emulated_launch(lib: ctypes.CDLL) -> round_check.Launch:
    def launch(b: round_check.Buffers) -> None:
        err = lib.elpis_round_tail(
            b["cells"].ctypes.data, b["ids"].ctypes.data, b["bad"].ctypes.data, round_check.RUN,
            b["state"].ctypes.data, b["pages"].ctypes.data, len(b["pages"]), b["record"].ctypes.data,
            b["moves_out"].ctypes.data, b["plan_out"].ctypes.data, b["cond_index"].ctypes.data,
            round_check.RUN, b["cond_kvp"].ctypes.data, None,
        )  # fmt: skip
        assert err == 0

    return launch


def interpreted_launch(program: PtxProgram) -> round_check.Launch:
    def launch(b: round_check.Buffers) -> None:
        Machine().call(
            program.entry("round_tail_kernel"), b["cells"], b["ids"], b["bad"], round_check.RUN, b["state"],
            b["pages"], len(b["pages"]), b["record"], b["moves_out"], b["plan_out"], b["cond_index"],
            round_check.RUN, b["cond_kvp"],
        )  # fmt: skip

    return launch


def test_the_kernels_emulation_passes_and_the_rounds_cover_commits_and_refusals(round_tail_emu) -> None:
    statuses, lengths = [], set()
    launch = emulated_launch(round_tail_emu)

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
    launch = emulated_launch(round_tail_emu)
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
    assert round_check.check_round_tail(interpreted_launch(program)) >= 20


@needs_nvcc
def test_the_miscompiled_kernel_of_sessions_36_37_is_refused(tmp_path: Path) -> None:
    # the kernel's source beside the old header: a quoted include looks in the source's own directory first
    shutil.copy(round_tail.SOURCE, tmp_path / round_tail.SOURCE.name)
    shutil.copy(HERE / "data" / "gdn_tree_plan_miscompiled.cuh", tmp_path / "gdn_tree_plan.cuh")
    ptx = nvcc.compile_to(tmp_path / round_tail.SOURCE.name, "ptx", arch="sm_86", out_dir=tmp_path)
    program = PtxProgram(ptx.read_text())
    try:
        round_check.check_round_tail(interpreted_launch(program))
    except round_check.RoundKernelMismatch as refused:
        assert "check round 0: its record is [-6" in str(refused), refused  # the GPU's status on every round
    else:
        version = nvcc.nvcc_version().strip().splitlines()[-1]
        pytest.skip(f"this nvcc ({version}) builds the old header right: nothing to catch")
