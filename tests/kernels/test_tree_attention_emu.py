"""The tree-verify attention kernel's own source, run on the CPU before any GPU run.

patches/kernels/tree_attention.cu is compiled by g++ against the CUDA emulation of tests/kernels/cuda_emu.py
(every block of the grid in turn, its threads as fibers, fp16 as _Float16). exp and log are the
CPU's, so the numbers are not the GPU's bits; what this checks is the kernel's indexing, its use of the
generated schedule, its agreement with float64, and bitwise row invariance of its own code.
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import pytest
import torch

from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import cuda_emu
from tests.kernels import tree_cases as tc


def _build(tmp: Path, staged: int) -> ctypes.CDLL:
    lib = cuda_emu.build_emulated(
        ta.SOURCE, tmp, launches=2, needs=("verify_schedule.h",), defines={"ELPIS_TREE_ATTN_STAGED": staged}
    )
    u32, u64, vp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    lib.elpis_tree_attention.argtypes = [
        vp,
        vp,
        vp,
        vp,
        vp,
        vp,
        u32,
        u32,
        u32,
        ctypes.c_float,
        vp,
        vp,
        vp,
        u64,
        vp,
    ]
    lib.elpis_tree_attention.restype = ctypes.c_int
    lib.elpis_tree_attention_workspace_floats.argtypes = [u32, u32, u32]
    lib.elpis_tree_attention_workspace_floats.restype = u64
    return lib


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> dict[int, ctypes.CDLL]:
    tmp = tmp_path_factory.mktemp("tree_attention_emu")
    return {staged: _build(tmp, staged) for staged in (1, 0)}


def _attend(lib: ctypes.CDLL):
    def attend(q, k, v, table, ctx, depth, ancestors):
        ta.check_masks(depth, ancestors)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        table = table.to(torch.int32).contiguous()
        return tc.call_emulated(lib, "elpis_tree_attention", (k, v), q, table, ctx, depth, ancestors)

    return attend


def _check_against_float64(emulated: dict[int, ctypes.CDLL], ctx: int, parents: list[int]) -> None:
    case = tc.make_case(ctx, parents, seed=ctx + 3)
    want, want_lse = ref.reference_fp64(
        case.q, case.k, case.v, case.table, ctx, case.ancestors, ta.DEFAULT_SCALE
    )
    outs = {}
    for staged, lib in emulated.items():
        out, lse = case.run(_attend(lib))
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        assert (out.double() - want).abs().max().item() < 2e-3
        assert (lse.double() - want_lse).abs().max().item() < 1e-5
        outs[staged] = (out, lse)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), "staged != direct"


def test_kernel_source_matches_float64(emulated: dict[int, ctypes.CDLL]) -> None:
    """Both builds (staged and direct) agree with float64 and with each other bit for bit; a tree past the
    first page of the block table (shuffled pages), spans of 38..41 positions (two 32-position tiles)."""
    _check_against_float64(emulated, 37, [-1, 0, 1, 0, 3])


@pytest.mark.slow
def test_kernel_source_across_a_split_boundary(emulated: dict[int, ctypes.CDLL]) -> None:
    """Spans of 127..129: rows whose last positions fall in the second split (the first boundary of the
    layout; every emulated shuffle is two thread barriers, so this takes a while here)."""
    _check_against_float64(emulated, 126, [-1, 0, 1, 0])


@pytest.mark.slow
def test_kernel_source_is_row_invariant(emulated: dict[int, ctypes.CDLL]) -> None:
    """Renumbered rows, rewritten siblings, the path in another tree, and every row against a 1-row call at
    ctx+depth, bit for bit (spans of 6..8 positions; the GPU tests cover split boundaries)."""
    attend = _attend(emulated[1])
    ctx, rng = 5, random.Random(4)
    case = tc.make_case(ctx, [-1, 0, 1, 0], seed=9)
    tc.check_relabel_rows(attend, case, rng)
    tc.check_siblings_do_not_matter(attend, case, seed=9)
    tc.check_other_tree_same_path(attend, case, rng, seed=9)
    tc.check_equals_plain_decoding(attend, case)
