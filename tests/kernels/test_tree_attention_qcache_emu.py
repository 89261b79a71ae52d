"""The quantized-cache build of patches/kernels/tree_attention.cu (ELPIS_TREE_ATTN_QCACHE), run on the CPU
through the CUDA emulation of tests/kernels/cuda_emu.py.

Random packed K/V pages and scales (shuffled block table): the quantized-read build must equal, bit for
bit, the fp16 staged build run on the pages dequantised by elpis/exl3/qcache_ref.py (so the in-register
dequant reproduces the reference's fp16 values and nothing after the loads changed), and both must agree
with the float64 attention reference.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from elpis import accept
from elpis.exl3 import qcache_ref as qr
from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import cuda_emu
from tests.kernels.tree_cases import call_emulated

GROUPS = ta.KV_HEADS * ta.HEAD_DIM // qr.GROUP
_ENTRY = [ctypes.c_void_p] * 6 + [ctypes.c_uint32] * 3 + [ctypes.c_float] + [ctypes.c_void_p] * 3
_ENTRY += [ctypes.c_uint64, ctypes.c_void_p]


def _build(tmp: Path, defines: dict[str, int], entry: str, extra_ptrs: int) -> ctypes.CDLL:
    lib = cuda_emu.build_emulated(ta.SOURCE, tmp, launches=2, needs=("verify_schedule.h",), defines=defines)
    getattr(lib, entry).argtypes = [ctypes.c_void_p] * extra_ptrs + _ENTRY
    getattr(lib, entry).restype = ctypes.c_int
    lib.elpis_tree_attention_workspace_floats.argtypes = [ctypes.c_uint32] * 3
    lib.elpis_tree_attention_workspace_floats.restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module")
def fp16_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    tmp = tmp_path_factory.mktemp("tree_attention_fp16_emu")
    return _build(tmp, {"ELPIS_TREE_ATTN_STAGED": 1}, "elpis_tree_attention", 0)


def _qcache_lib(tmp: Path, k_bits: int, v_bits: int) -> ctypes.CDLL:
    defines = {
        "ELPIS_TREE_ATTN_STAGED": 1,
        "ELPIS_TREE_ATTN_QCACHE": 1,
        "ELPIS_QCACHE_K_BITS": k_bits,
        "ELPIS_QCACHE_V_BITS": v_bits,
    }
    lib = _build(tmp, defines, "elpis_tree_attention_qcache", 2)
    lib.elpis_tree_attention_qcache_bits.restype = ctypes.c_uint32
    assert lib.elpis_tree_attention_qcache_bits() == k_bits * 16 + v_bits
    return lib


def _random_qcache(pool: int, bits: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    codes = rng.integers(0, 2**bits, size=(pool, ref.PAGE, GROUPS, qr.GROUP), dtype=np.uint32)
    scales = rng.uniform(0.05, 6.0, size=(pool, ref.PAGE, GROUPS)).astype(np.float16)
    scales[0, 0, :4] = 0  # all-zero groups (scale fp16(1e-10) = 0): signed zeros
    return torch.from_numpy(qr.pack_codes(codes, bits)), torch.from_numpy(scales)


def _check(fp16_lib: ctypes.CDLL, qlib: ctypes.CDLL, k_bits: int, v_bits: int, ctx: int, parents: list[int]):
    rng = np.random.default_rng(ctx * 100 + k_bits * 10 + v_bits)
    rows = len(parents)
    pages = (ctx + rows + ref.PAGE - 1) // ref.PAGE
    pool = pages + 2
    qk, sk = _random_qcache(pool, k_bits, rng)
    qv, sv = _random_qcache(pool, v_bits, rng)
    k = torch.from_numpy(qr.dequant_pages(qk, sk, k_bits, ta.KV_HEADS, ta.HEAD_DIM)).contiguous()
    v = torch.from_numpy(qr.dequant_pages(qv, sv, v_bits, ta.KV_HEADS, ta.HEAD_DIM)).contiguous()
    q = torch.from_numpy(rng.standard_normal((rows, ta.Q_HEADS, ta.HEAD_DIM)).astype(np.float16))
    table = torch.from_numpy(rng.permutation(pool)[:pages].astype(np.int32))
    masks = accept.tree_masks(parents)
    args = (q, table, ctx, masks.depth, masks.ancestors)
    want, want_lse = call_emulated(fp16_lib, "elpis_tree_attention", (k, v), *args)
    got, got_lse = call_emulated(qlib, "elpis_tree_attention_qcache", (qk, sk, qv, sv), *args)
    assert torch.isfinite(got).all() and torch.isfinite(got_lse).all()
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse), "quantized read != fp16 read"
    f64, f64_lse = ref.reference_fp64(q, k, v, table, ctx, masks.ancestors, ta.DEFAULT_SCALE)
    # fp16 output: half an ulp (2^-11 relative) plus fp32 accumulation error.
    assert ((got.double() - f64).abs() <= f64.abs() * 2.0**-11 + 2e-4).all()
    assert (got_lse.double() - f64_lse).abs().max().item() < 1e-5


def test_quantized_read_equals_fp16_read_of_the_reference_dequant(
    fp16_lib: ctypes.CDLL, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """3-bit K and V (the served cache), spans of 38..41 positions over a shuffled block table."""
    qlib = _qcache_lib(tmp_path_factory.mktemp("tree_attention_q33_emu"), 3, 3)
    _check(fp16_lib, qlib, 3, 3, 37, [-1, 0, 1, 0, 3])


@pytest.mark.slow
def test_other_bit_widths_and_a_page_boundary(
    fp16_lib: ctypes.CDLL, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """K at 4 bits (one plane), V at 7 bits (three planes); spans 254..257 cross a page of the table."""
    qlib = _qcache_lib(tmp_path_factory.mktemp("tree_attention_q47_emu"), 4, 7)
    _check(fp16_lib, qlib, 4, 7, 253, [-1, 0, 1, 2])
