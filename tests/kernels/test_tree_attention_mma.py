"""The tensor-core tree attention (`tree_attention_mma`, patches/kernels/tree_attention_mma.cu) on the GPU,
on cache pages written by ExLlamaV3 itself (`CacheLayer_quant.update_kv_direct` of random K/V, shuffled
block table). Run with `-m gpu`; results go to $ELPIS_KERNEL_LOG (JSON lines) when set.

- Row invariance, bit for bit: every row of a 16-row tree equals a 1-row call at ctx + depth over a cache
  holding its path (the path's packed words and scales moved as the engine's commit moves them), at a
  context whose tails straddle a tile and at 32K.
- Error against float64 attention over the same fp16 pages, next to the fp32 SIMT build's error (the
  numbers this kernel's P-in-fp16 costs); the mma build must stay within 2^-11 * max|v| + 2^-10 * |out|.
- The pipelined staging (groups loaded a tile ahead, half-groups on every thread) gives the direct
  staging's bits at 1K, 32K and 128K, 1, 8 and 16 rows.
- One timing line against the SIMT build and the direct staging at 32K and 128K, 8 and 16 rows.
- The fold build (ELPIS_MMA_HADAMARD_FOLD, registry switch exl3-attn-hadamard-fold) passes the same row
  invariance and staging checks, and its error against float64 is logged beside the others, within twice
  the mma build's bound (its operands are rounded elsewhere than the fp16 pages the reference reads).
- The diagnostic 8-row build with a two-block launch bound gives its rows the served build's bits (1K-262K).
"""

from __future__ import annotations

import ctypes
import random
from functools import partial

import pytest
import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import tree_cases as tc
from tests.kernels.tree_cases import PAGE, QuantPool

PARENTS = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10, 2, 12, 13]


def _log(record: dict) -> None:
    tc.log_kernel("tree_attention_mma", record)


def _layer_args(pool: QuantPool) -> tuple:
    layer = pool.layer
    return layer.qk, layer.sk, layer.qv, layer.sv, pool.table


# Contexts whose rows' spans cross a split boundary: between 128-position splits, where the splits turn to 256
# (4096), to 512 (16384) and to 2048 (65536), between 512-position ones and between 2048-position ones.
@pytest.mark.gpu
@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "fold"])
@pytest.mark.parametrize("ctx", [1019, 4091, 16379, 32760, 65531, 69627])
def test_rows_are_plain_decoding(ctx: int, fold: bool) -> None:
    masks = accept.tree_masks(PARENTS)
    rows = len(PARENTS)
    pool = QuantPool(ctx + 2 * rows, seed=ctx)
    gen = torch.Generator().manual_seed(ctx)
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=gen).half().cuda()
    args = (*_layer_args(pool), ctx, masks.depth, masks.ancestors)
    attend = partial(ta.tree_attention_mma, fold=fold)
    out, lse = attend(q, *args, return_lse=True)
    assert torch.isfinite(out).all()
    caches = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv)
    saved = [t.clone() for t in caches]

    def loc(slot: int) -> tuple[int, int]:
        return int(pool.table[slot // PAGE]), slot % PAGE

    for r in range(rows):
        path = [a for a in range(rows) if (masks.ancestors[r] >> a) & 1]
        for e, row in enumerate(path):
            for cur, orig in zip(caches, saved, strict=True):
                cur[loc(ctx + e)] = orig[loc(ctx + row)]
        one, one_lse = attend(q[r : r + 1].contiguous(), *_layer_args(pool),
                              ctx + masks.depth[r], (0,), (1,), return_lse=True)  # fmt: skip
        assert torch.equal(out[r].view(torch.int16), one[0].view(torch.int16)), f"row {r} != plain decoding"
        assert torch.equal(lse[r], one_lse[0]), f"row {r}: lse != plain decoding"
        for cur, orig in zip(caches, saved, strict=True):
            cur.copy_(orig)
    _log({"check": "mma row invariance", "ctx": ctx, "rows": rows, "fold": fold, "ok": True})


@pytest.mark.gpu
def test_error_against_float64_next_to_the_simt_build() -> None:
    ctx, parents = 4093, tc.random_parents(16, random.Random(7))
    masks = accept.tree_masks(parents)
    pool = QuantPool(ctx + 16, seed=7)
    q = torch.randn((16, ta.Q_HEADS, ta.HEAD_DIM), generator=torch.Generator().manual_seed(7)).half().cuda()
    args = (*_layer_args(pool), ctx, masks.depth, masks.ancestors)
    mma = ta.tree_attention_mma(q, *args, fold=False).double().cpu()
    fold = ta.tree_attention_mma(q, *args, fold=True).double().cpu()
    simt = ta.tree_attention_qcache(q, *args).double().cpu()
    k, v = pool.k.cpu(), pool.v.cpu()
    f64, _ = ref.reference_fp64(q.cpu(), k, v, pool.table.cpu(), ctx, masks.ancestors, ta.DEFAULT_SCALE)
    # the written slots only (the pool's other slots were never written)
    vmax = v[pool.table.cpu().long()].reshape(-1, ta.KV_HEADS, ta.HEAD_DIM)[: ctx + 16].abs().max().item()
    err_mma, err_simt, err_fold = (mma - f64).abs(), (simt - f64).abs(), (fold - f64).abs()
    _log({"check": "error vs fp64", "ctx": ctx, "rows": 16, "max_abs_v": vmax,
          "mma_max_abs": err_mma.max().item(), "mma_mean_abs": err_mma.mean().item(),
          "fold_max_abs": err_fold.max().item(), "fold_mean_abs": err_fold.mean().item(),
          "simt_max_abs": err_simt.max().item(), "simt_mean_abs": err_simt.mean().item()})  # fmt: skip
    bound = 2.0**-11 * vmax + 2.0**-10 * f64.abs()
    assert (err_mma <= bound).all()
    assert (err_fold <= 2.0 * bound).all()
    assert not torch.equal(fold, mma)  # the fold build rounds elsewhere: the define took effect


@pytest.mark.gpu
def test_timing_against_the_simt_build() -> None:
    record: dict = {"check": "timing"}
    for ctx in (32768 - 16, 131072 - 16):
        pool = QuantPool(ctx + 16, seed=ctx)
        for rows in (8, 16):
            masks = accept.tree_masks(tc.random_parents(rows, random.Random(rows)))
            q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
            args = (*_layer_args(pool), ctx, masks.depth, masks.ancestors)
            key = f"{ctx // 1024 + 1}k_{rows}"
            unfolded = partial(ta.tree_attention_mma, fold=False)
            direct = partial(ta.tree_attention_mma, pipelined=False, fold=False)
            fold = partial(ta.tree_attention_mma, fold=True)
            builds = (("mma", unfolded, 20), ("direct", direct, 20), ("fold", fold, 20),
                      ("simt", ta.tree_attention_qcache, 10))  # fmt: skip
            for name, fn, reps in builds:
                ms = tc.median_ms(lambda fn=fn, q=q, a=args: fn(q, *a), reps)
                record[f"{name}_ms_{key}"] = round(ms, 4)
        del pool
        torch.cuda.empty_cache()
    _log(record)


@pytest.mark.gpu
@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "fold"])
@pytest.mark.parametrize("ctx", [1000, 32760, 131050])
def test_pipelined_staging_keeps_the_direct_stagings_bits(ctx: int, fold: bool) -> None:
    pool = QuantPool(ctx + 16, seed=ctx + 1)
    for rows in (1, 8, 16):
        masks = accept.tree_masks(tc.random_parents(rows, random.Random(ctx + rows)))
        gen = torch.Generator().manual_seed(ctx + rows)
        q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=gen).half().cuda()
        args = (*_layer_args(pool), ctx, masks.depth, masks.ancestors)
        out, lse = ta.tree_attention_mma(q, *args, return_lse=True, fold=fold)
        want, want_lse = ta.tree_attention_mma(q, *args, return_lse=True, pipelined=False, fold=fold)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), f"{rows} rows at {ctx}"
        assert torch.equal(lse, want_lse), f"{rows} rows at {ctx}: lse"
    record = {"check": "pipelined staging == direct staging", "ctx": ctx, "rows": [1, 8, 16], "fold": fold}
    _log({**record, "ok": True})


def _build_call(lib, q, pool: QuantPool, ctx: int, masks) -> tuple[torch.Tensor, torch.Tensor]:
    args = _layer_args(pool)
    return tc.call_build(lib, q, args[:4], args[4], ctx, masks.depth, masks.ancestors, return_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "fold"])
@pytest.mark.parametrize("ctx", [1000, 4093, 69627, 262000])
def test_eight_row_build_keeps_the_16_row_builds_bits(ctx: int, fold: bool) -> None:
    """The diagnostic 8-row build with two blocks a multiprocessor (ELPIS_BUILD_MAX_ROWS=8,
    ELPIS_MMA_MIN_BLOCKS=2; measured slower in session 49, not served) gives each of its rows the served
    build's bits; its occupancy and a timing beside the 16-row build are logged."""
    pool = QuantPool(ctx + 16, seed=ctx + 5)
    full = ta._mma_library(3, 3, fold=fold)
    defines = {"ELPIS_QCACHE_K_BITS": 3, "ELPIS_QCACHE_V_BITS": 3, "ELPIS_MMA_HADAMARD_FOLD": int(fold)}
    lib = ta.load_mma({**defines, "ELPIS_BUILD_MAX_ROWS": 8, "ELPIS_MMA_MIN_BLOCKS": 2})
    lib.elpis_tree_attention_mma_max_rows.restype = ctypes.c_uint32
    assert lib.elpis_tree_attention_mma_max_rows() == 8
    blocks = int(lib.elpis_tree_attention_mma_blocks_per_sm())
    assert blocks >= 1 and int(full.elpis_tree_attention_mma_blocks_per_sm()) == 1
    record: dict = {"check": "8-row build == 16-row build", "ctx": ctx, "fold": fold, "blocks_per_sm": blocks}
    for rows in (1, 3, 8):
        masks = accept.tree_masks(tc.random_parents(rows, random.Random(ctx * 7 + rows)))
        gen = torch.Generator().manual_seed(ctx + rows)
        q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=gen).half().cuda()
        out, lse = _build_call(lib, q, pool, ctx, masks)
        want, want_lse = _build_call(full, q, pool, ctx, masks)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), f"{rows} rows"
        assert torch.equal(lse, want_lse), f"{rows} rows: lse"
    if ctx >= 65536:
        masks = accept.tree_masks(tc.random_parents(8, random.Random(8)))
        q = torch.randn((8, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
        for name, build in (("rows8", lib), ("rows16", full)):
            ms = tc.median_ms(lambda b=build, q=q, m=masks, p=pool: _build_call(b, q, p, ctx, m), 20)
            record[f"{name}_ms_8"] = round(ms, 4)
    del pool
    torch.cuda.empty_cache()
    _log({**record, "ok": True})
