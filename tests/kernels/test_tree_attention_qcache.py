"""The tree-verify attention reading ExLlamaV3's quantized paged cache directly
(`tree_attention_qcache`, the ELPIS_TREE_ATTN_QCACHE build of patches/kernels/tree_attention.cu).

CPU: the build compiles for sm_86 and sm_90 (Ampere instructions only) and bad calls are refused. GPU
(`-m gpu`), on cache pages written by ExLlamaV3 itself (`CacheLayer_quant.update_kv_direct` of random
K/V, shuffled block table): our dequant reference equals `CacheLayer_quant.get_kv` bit for bit, and the
quantized-read kernel equals the fp16 kernel over `get_kv`'s pages bit for bit (out and lse), at 2/9/16
rows and contexts 503..32760; one timing JSON line against the fp16 build (whose fp16 pages the engine
dequantises per layer today) at 32K. Results go to $ELPIS_KERNEL_LOG (JSON lines) when set.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from elpis import accept, nvcc
from elpis.exl3 import qcache_ref as qr
from elpis.exl3 import tree_attention as ta
from tests.kernels import tree_cases as tc
from tests.kernels.tree_cases import QuantPool
from tests.nvcc_marks import nvcc_missing

BITS = 3  # elpis.exl3.engine.KV_BITS: the served cache


def _log(record: dict) -> None:
    tc.log_kernel("tree_attention_qcache", record)


@pytest.mark.parametrize(("k_bits", "v_bits"), [(3, 3), (8, 2)])
def test_qcache_build_compiles_for_ampere_and_hopper(k_bits: int, v_bits: int) -> None:
    if nvcc_missing():
        pytest.skip("nvcc not installed")
    if not (nvcc.REPO_ROOT / "build" / "kernels" / "verify_schedule.h").is_file():
        pytest.fail("build/kernels/verify_schedule.h missing: run make build")
    defines = {"ELPIS_TREE_ATTN_QCACHE": 1, "ELPIS_QCACHE_K_BITS": k_bits, "ELPIS_QCACHE_V_BITS": v_bits}
    nvcc.check_ampere_only(ta.SOURCE, defines=defines)


def test_qcache_build_needs_the_staged_build(tmp_path: Path) -> None:
    if nvcc_missing():
        pytest.skip("nvcc not installed")
    with pytest.raises(nvcc.NvccError, match="needs ELPIS_TREE_ATTN_STAGED=1"):
        nvcc.compile_to(
            ta.SOURCE, "ptx", arch="sm_86", out_dir=tmp_path,
            defines={"ELPIS_TREE_ATTN_QCACHE": 1, "ELPIS_TREE_ATTN_STAGED": 0},
        )  # fmt: skip


def test_bad_calls_are_refused_before_any_launch() -> None:
    masks = accept.tree_masks([-1, 0])
    q = torch.zeros((2, ta.Q_HEADS, ta.HEAD_DIM), dtype=torch.half)
    qk = torch.zeros((1, 256, 32 * BITS), dtype=torch.int32)
    s = torch.zeros((1, 256, 32), dtype=torch.half)
    table = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="2 rows but ancestors has 1"):
        ta.tree_attention_qcache(q, qk, s, qk, s, table, 5, masks.depth, masks.ancestors[:1])
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ta.tree_attention_qcache(q, qk, s, qk, s, table, 5, masks.depth, masks.ancestors)
    with pytest.raises(TypeError, match=r"q must be a torch\.Tensor"):
        ta.tree_attention_qcache(q.numpy(), qk, s, qk, s, table, 5, masks.depth, masks.ancestors)


# --- GPU ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [700, 32768])
def test_reference_dequant_equals_get_kv_bit_for_bit(tokens: int) -> None:
    pool = QuantPool(tokens, seed=tokens)
    layer = pool.layer
    pages = list(range(pool.pages))  # every page (about 11 ms of numpy per page)
    for phys, n in pool.slots_of_pages(pages):
        for q, s, got in ((layer.qk, layer.sk, pool.k), (layer.qv, layer.sv, pool.v)):
            want = qr.dequant_pages(q[phys, :n].cpu(), s[phys, :n].cpu(), BITS, ta.KV_HEADS, ta.HEAD_DIM)
            mine = torch.from_numpy(want).view(torch.int16)
            theirs = got[phys, :n].cpu().view(torch.int16)
            assert torch.equal(mine, theirs), f"page {phys}: reference dequant differs from get_kv"
    _log({"check": "ref==get_kv", "tokens": tokens, "pages_checked": len(pages), "ok": True})


CASES = [(ctx, rows) for ctx in (503, 1021, 4093, 32760) for rows in (2, 9, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize(("ctx", "rows"), CASES)
def test_quantized_read_equals_fp16_read_of_get_kv(ctx: int, rows: int) -> None:
    rng = random.Random(ctx * 31 + rows)
    parents = tc.random_parents(rows, rng)
    masks = accept.tree_masks(parents)
    pool = QuantPool(ctx + rows, seed=ctx + rows)
    layer = pool.layer
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=torch.Generator().manual_seed(rows))
    q = q.half().cuda()
    args = (pool.table, ctx, masks.depth, masks.ancestors)
    want, want_lse = ta.tree_attention(q, pool.k, pool.v, *args, return_lse=True)
    got, got_lse = ta.tree_attention_qcache(q, layer.qk, layer.sk, layer.qv, layer.sv, *args, return_lse=True)
    assert torch.isfinite(got).all()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "out: quantized read != fp16 read"
    assert torch.equal(got_lse, want_lse), "lse: quantized read != fp16 read"
    _log({"check": "qcache==fp16(get_kv)", "ctx": ctx, "rows": rows, "ok": True})


@pytest.mark.gpu
def test_rows_are_invariant_with_the_quantized_read() -> None:
    """Every row of a 16-row tree equals a 1-row call at ctx + depth over a cache holding its path, bit for
    bit (the path's K/V moved as packed words and scales, as the engine's commit moves them)."""
    ctx, rows = 1021, 16
    parents = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14]
    masks = accept.tree_masks(parents)
    pool = QuantPool(ctx + 2 * rows, seed=5)
    layer = pool.layer
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=torch.Generator().manual_seed(5)).half().cuda()
    out = ta.tree_attention_qcache(q, layer.qk, layer.sk, layer.qv, layer.sv, pool.table, ctx, masks.depth,
                                   masks.ancestors)  # fmt: skip

    def loc(slot: int) -> tuple[int, int]:
        return int(pool.table[slot // qr.PAGE]), slot % qr.PAGE

    saved = [t.clone() for t in (layer.qk, layer.sk, layer.qv, layer.sv)]
    for t in range(rows):
        for e, row in enumerate(r for r in range(rows) if (masks.ancestors[t] >> r) & 1):
            dst, src = loc(ctx + e), loc(ctx + row)
            for cur, orig in zip((layer.qk, layer.sk, layer.qv, layer.sv), saved, strict=True):
                cur[dst] = orig[src]
        one = ta.tree_attention_qcache(q[t : t + 1].contiguous(), layer.qk, layer.sk, layer.qv, layer.sv,
                                       pool.table, ctx + masks.depth[t], (0,), (1,))  # fmt: skip
        assert torch.equal(out[t].view(torch.int16), one[0].view(torch.int16)), f"row {t} != plain decoding"
        for cur, orig in zip((layer.qk, layer.sk, layer.qv, layer.sv), saved, strict=True):
            cur.copy_(orig)
    _log({"check": "qcache row invariance", "ctx": ctx, "rows": rows, "ok": True})


def _timings(pool: QuantPool, ctx: int, rows: int) -> dict[str, float]:
    from exllamav3.ext import exllamav3_ext as ext

    layer = pool.layer
    masks = accept.tree_masks(tc.random_parents(rows, random.Random(rows)))
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
    args = (pool.table, ctx, masks.depth, masks.ancestors)
    seqlens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    window = pool.table[None].contiguous()
    identity = torch.arange(pool.pages, dtype=torch.int32, device="cuda")
    shape = (pool.pages, qr.PAGE, ta.KV_HEADS, ta.HEAD_DIM)

    def quantized_read() -> None:
        ta.tree_attention_qcache(q, layer.qk, layer.sk, layer.qv, layer.sv, *args)

    def fp16_kernel() -> None:
        ta.tree_attention(q, pool.k, pool.v, *args)

    def engine_today() -> None:  # tree_verify._tree_attention: fp16 window of the pages, then the kernel
        k16 = torch.empty(shape, dtype=torch.half, device="cuda")
        v16 = torch.empty(shape, dtype=torch.half, device="cuda")
        ext.dequant_cache_paged_window(
            layer.qk, layer.sk, k16, layer.qv, layer.sv, v16, seqlens, window, qr.PAGE, rows, 0.0
        )
        ta.tree_attention(q, k16, v16, identity, ctx, masks.depth, masks.ancestors)

    return {
        f"qcache_ms_{rows}": round(tc.median_ms(quantized_read, reps=20), 4),
        f"fp16_kernel_ms_{rows}": round(tc.median_ms(fp16_kernel, reps=20), 4),
        f"window_dequant_plus_fp16_ms_{rows}": round(tc.median_ms(engine_today, reps=20), 4),
    }


@pytest.mark.gpu
def test_timing_against_the_fp16_build_at_32k() -> None:
    """One JSON line: ms per call of the quantized read, of the fp16 kernel alone over fp16 pages, and of
    the engine's path today (window dequant by ExLlamaV3 + the fp16 kernel), 8 and 16 rows at 32K."""
    ctx = 32768 - 16
    pool = QuantPool(ctx + 16, seed=11)
    record: dict = {"check": "timing", "ctx": ctx, "bits": BITS}
    for rows in (8, 16):
        record.update(_timings(pool, ctx, rows))
    _log(record)
