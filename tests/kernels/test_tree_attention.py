"""GPU tests of the tree-verify attention kernel (patches/kernels/tree_attention.cu).

Accuracy against float64 (max errors recorded), agreement with the CPU float32 emulation of its algorithm,
and bitwise row invariance: renumbered rows, rewritten siblings, the path in another tree, and every row
against a 1-row call (plain decoding) at ctx+depth, at contexts around split boundaries, 1K and 32K.
Results go to $ELPIS_KERNEL_LOG (JSON lines) when set.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from elpis import nvcc
from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import tree_cases as tc
from tests.nvcc_marks import nvcc_missing

FIRST = tc.FIRST_SPLIT


def _log(record: dict) -> None:
    path = os.environ.get("ELPIS_KERNEL_LOG")
    line = json.dumps({"test": "tree_attention", **record}, sort_keys=True)
    print(line)
    if path:
        with Path(path).open("a") as fh:
            fh.write(line + "\n")


def kernel(q, k, v, table, ctx, depth, ancestors):  # the tree_cases signature
    return ta.tree_attention(q, k, v, table, ctx, depth, ancestors, return_lse=True)


def direct_kernel(q, k, v, table, ctx, depth, ancestors):
    return ta.tree_attention(q, k, v, table, ctx, depth, ancestors, return_lse=True, staged=False)


def test_kernel_builds_for_ampere_and_hopper() -> None:
    """Runs on CPU too: the kernel with the generated schedule compiles for sm_86 and sm_90, Ampere-only."""
    if nvcc_missing():
        pytest.skip("nvcc not installed")
    if not (nvcc.REPO_ROOT / "build" / "kernels" / "verify_schedule.h").is_file():
        pytest.fail("build/kernels/verify_schedule.h missing: run make build")
    nvcc.check_ampere_only(ta.SOURCE)
    nvcc.check_ampere_only(ta.SOURCE, defines={"ELPIS_TREE_ATTN_STAGED": 0})


@pytest.mark.gpu
@pytest.mark.parametrize(("ctx", "rows"), [(FIRST - 3, 16), (1000, 5), (32768 - 8, 16)])
def test_staged_build_equals_the_direct_build(ctx: int, rows: int) -> None:
    """Same arithmetic in the same order, K/V through shared memory or not: the same bits."""
    rng = random.Random(ctx)
    case = tc.make_case(ctx, tc.random_parents(rows, rng), seed=ctx, device="cuda")
    staged, staged_lse = case.run(kernel)
    direct, direct_lse = case.run(direct_kernel)
    assert torch.equal(staged, direct) and torch.equal(staged_lse, direct_lse)
    _log({"check": "staged==direct", "ctx": ctx, "rows": rows, "ok": True})


# Spans that end just before, on and just after split boundaries, for the depths of the trees below: the first
# ones (128 positions a split), where the splits turn to 256 (4096), to 512 (16384) and to 2048 (65536), at
# 32K, and between two 2048-position splits (69632).
INVARIANCE_CTX = [
    FIRST - 9,
    FIRST - 1,
    2 * FIRST - 4,
    1024,
    4096 - 6,
    16384 - 9,
    32768 - 8,
    65536 - 7,
    69632 - 9,
]


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", INVARIANCE_CTX)
@pytest.mark.parametrize("rows", [2, 9, 16])
def test_rows_are_invariant_bit_for_bit(ctx: int, rows: int) -> None:
    rng = random.Random(ctx + rows)
    parents = (
        tc.random_parents(rows, rng) if rows < 16 else [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14]
    )
    case = tc.make_case(ctx, parents, seed=ctx + 7 * rows, device="cuda")
    tc.check_relabel_rows(kernel, case, rng)
    tc.check_siblings_do_not_matter(kernel, case, seed=ctx)
    tc.check_other_tree_same_path(kernel, case, rng, seed=ctx)
    tc.check_equals_plain_decoding(kernel, case)
    _log({"check": "bitwise-invariance", "ctx": ctx, "rows": rows, "depth": max(case.depth), "ok": True})


@pytest.mark.gpu
def test_direct_build_rows_are_invariant_bit_for_bit() -> None:
    """The same invariance checks on the build that reads K/V straight from global memory."""
    ctx, rng = FIRST - 1, random.Random(5)
    case = tc.make_case(ctx, [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14], seed=5, device="cuda")
    tc.check_relabel_rows(direct_kernel, case, rng)
    tc.check_siblings_do_not_matter(direct_kernel, case, seed=ctx)
    tc.check_other_tree_same_path(direct_kernel, case, rng, seed=ctx)
    tc.check_equals_plain_decoding(direct_kernel, case)
    _log({"check": "bitwise-invariance-direct", "ctx": ctx, "rows": 16, "ok": True})


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [1000, 32768 - 9])
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 12, 16])
def test_matches_float64(ctx: int, rows: int) -> None:
    rng = random.Random(ctx * 31 + rows)
    case = tc.make_case(ctx, tc.random_parents(rows, rng), seed=rows, device="cuda")
    out, lse = case.run(kernel)
    want, want_lse = ref.reference_fp64(
        case.q, case.k, case.v, case.table, ctx, case.ancestors, ta.DEFAULT_SCALE
    )
    err = (out.double() - want).abs().max().item()
    lse_err = (lse.double() - want_lse).abs().max().item()
    _log({"check": "fp64", "ctx": ctx, "rows": rows, "max_abs_err": err, "lse_max_abs_err": lse_err})
    assert torch.isfinite(out).all()
    assert err < 2e-3, f"max |out - fp64| = {err}"
    assert lse_err < 1e-4, f"max |lse - fp64| = {lse_err}"


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [0, FIRST - 5, 2 * FIRST + 3])
def test_matches_the_float32_emulation(ctx: int) -> None:
    case = tc.make_case(ctx, [-1, 0, 1, 0, 3, 1, 5, 6], seed=ctx + 1, device="cuda")
    out, lse = case.run(kernel)
    cpu = tc.Case(case.q.cpu(), case.k.cpu(), case.v.cpu(), case.table.cpu(), ctx, case.parents, case.depth,
                  case.ancestors)  # fmt: skip
    want, want_lse = ref.emulate_fp32(cpu.q, cpu.k, cpu.v, cpu.table, ctx, cpu.ancestors, ta.DEFAULT_SCALE)
    err = (out.cpu().float() - want.float()).abs().max().item()
    _log({"check": "fp32-emulation", "ctx": ctx, "max_abs_err": err})
    assert err <= 2e-3
    assert (lse.cpu() - want_lse).abs().max().item() < 1e-5


@pytest.mark.gpu
def test_bad_inputs_are_refused() -> None:
    case = tc.make_case(10, [-1, 0], seed=1, device="cuda")
    with pytest.raises(ValueError, match="q must have shape"):
        ta.tree_attention(case.q[:1], case.k, case.v, case.table, 10, case.depth, case.ancestors)
    with pytest.raises(ValueError, match=r"k_cache must be torch\.float16"):
        ta.tree_attention(case.q, case.k.float(), case.v, case.table, 10, case.depth, case.ancestors)
    with pytest.raises(ValueError, match="block_table covers"):
        ta.tree_attention(case.q, case.k, case.v, case.table, 10_000, case.depth, case.ancestors)
    with pytest.raises(ValueError, match=r"block_table must be torch\.int32"):
        ta.tree_attention(case.q, case.k, case.v, case.table.long(), 10, case.depth, case.ancestors)


@pytest.mark.gpu
def test_timing_line() -> None:
    """Median ms per call for 8 and 16 rows at 1K and 32K (staged and direct builds), next to torch SDPA
    over the same keys gathered densely (non-causal, GQA) and flash_attn's paged kvcache call (a causal
    chain of the same rows) when flash_attn is importable. Recorded, not asserted."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except Exception:
        flash_attn_with_kvcache = None
    for ctx in (1024, 32768):
        for rows in (8, 16):
            parents = [-1, *range(rows - 1)]  # a chain: comparable with a causal kvcache call
            case = tc.make_case(ctx, parents, seed=rows, device="cuda")
            record = {"check": "timing", "ctx": ctx, "rows": rows}
            record["elpis_direct_ms"] = tc.median_ms(
                lambda c=case: ta.tree_attention(
                    c.q, c.k, c.v, c.table, c.ctx, c.depth, c.ancestors, staged=False
                )
            )
            record["elpis_ms"] = tc.median_ms(
                lambda c=case: ta.tree_attention(c.q, c.k, c.v, c.table, c.ctx, c.depth, c.ancestors)
            )
            # a dense baseline that needs no extra package: torch SDPA (GQA) over the same keys, gathered
            k, v = ref.row_kv(case.k, case.v, case.table, ctx, (1 << rows) - 1)
            kd, vd = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()
            qd = case.q.transpose(0, 1)[None].contiguous()
            try:
                record["sdpa_dense_ms"] = tc.median_ms(
                    lambda q=qd, k=kd, v=vd: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, enable_gqa=True
                    )
                )
            except Exception as exc:  # recorded: the timing line is informational
                record["sdpa_error"] = f"{type(exc).__name__}: {exc}"[:200]
            if flash_attn_with_kvcache is not None:
                q = case.q[None]
                seqlens = torch.tensor([ctx + rows], dtype=torch.int32, device="cuda")
                table = case.table[None]
                try:
                    record["flash_attn_ms"] = tc.median_ms(
                        lambda q=q, c=case, s=seqlens, t=table: flash_attn_with_kvcache(
                            q, c.k, c.v, cache_seqlens=s, block_table=t, causal=True
                        )
                    )
                except Exception as exc:
                    record["flash_attn_error"] = f"{type(exc).__name__}: {exc}"[:200]
            _log(record)
