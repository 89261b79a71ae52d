"""The long-context form of the fold build (`tree_attention_mma(..., long_context=True)`,
patches/kernels/tree_attention_long.cu) on the GPU: its outputs and log-sum-exps equal the served fold build's
bit for bit, on cache pages written by ExLlamaV3 (tests/kernels/tree_cases.QuantPool), for 1, 8 and 16 rows at
contexts whose spans cross every kind of split boundary, and at 262,000 positions. Equal bits make it a
drop-in for the served kernel at any context and row count: the served build's own tests (row invariance,
error against float64) then hold for it. Run with `-m gpu`; results go to $ELPIS_KERNEL_LOG when set.
"""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from tests.kernels import tree_cases as tc
from tests.kernels.test_tree_attention_mma import PARENTS


def _same_bits(ctx: int, row_counts: tuple[int, ...]) -> None:
    pool = tc.QuantPool(ctx + 16, seed=ctx + 7)
    caches = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv, pool.table)
    served = partial(ta.tree_attention_mma, fold=True)
    long_form = partial(ta.tree_attention_mma, fold=True, long_context=True)
    for rows in row_counts:
        parents = PARENTS if rows == 16 else tc.random_parents(rows, random.Random(ctx + rows))
        masks = accept.tree_masks(parents)
        gen = torch.Generator().manual_seed(ctx * 17 + rows)
        q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=gen).half().cuda()
        args = (*caches, ctx, masks.depth, masks.ancestors)
        want, want_lse = served(q, *args, return_lse=True)
        got, got_lse = long_form(q, *args, return_lse=True)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(
            got_lse.view(torch.int32), want_lse.view(torch.int32)
        )
        record = {"check": "bits vs fold build", "ctx": ctx, "rows": rows, "ok": same}
        tc.log_kernel("tree_attention_long", record)
        assert same, f"ctx {ctx}, {rows} rows: the long form differs from the fold build"


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [31, 1019, 4091, 16379, 32760, 65531, 69627])
def test_long_form_is_the_fold_build(ctx: int) -> None:
    _same_bits(ctx, (1, 3, 8, 9, 16))


@pytest.mark.gpu
def test_long_form_is_the_fold_build_at_262k() -> None:
    _same_bits(262000, (1, 8, 16))


@pytest.mark.gpu
def test_graph_form_is_the_fold_builds() -> None:
    """The graph form (context and masks read from device memory, grid sized for max_ctx) gives the fold
    build's graph-form bits."""
    ctx, max_ctx, parents = 40000, 50000, [-1, 0, 1, 1, 3, 0, 5, 6]
    pool = tc.QuantPool(max_ctx + 16, seed=3)
    masks = accept.tree_masks(parents)
    words = torch.tensor([*masks.depth, *masks.ancestors], dtype=torch.int32, device="cuda")
    ctx_dev = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    q = torch.randn((len(parents), ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
    caches = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv)
    want = ta.tree_attention_mma_graph(q, caches, pool.table, ctx_dev, max_ctx, words, fold=True)
    got = ta.tree_attention_mma_graph(
        q, caches, pool.table, ctx_dev, max_ctx, words, fold=True, long_context=True
    )
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_steps_below_fp16_keep_the_fold_builds_bits() -> None:
    """Groups whose step (scale / 4) is not an fp16 take the fp32 decoding; the bits stay the fold build's
    (scales 1..7 x 2^-24 written over half of the pool's K and V scales)."""
    ctx, parents = 32760, [-1, 0, 1, 1, 0, 4, 5, 2]
    pool = tc.QuantPool(ctx + 16, seed=11)
    tiny = torch.tensor([k * 2.0**-24 for k in range(1, 8)], dtype=torch.float16, device="cuda")
    for scales in (pool.layer.sk, pool.layer.sv):
        flat = scales.view(-1)
        half = flat.numel() // 2
        flat[:half] = tiny.repeat(half // 7 + 1)[:half]
    masks = accept.tree_masks(parents)
    q = torch.randn((len(parents), ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
    args = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv, pool.table, ctx, masks.depth,
            masks.ancestors)  # fmt: skip
    want, want_lse = ta.tree_attention_mma(q, *args, fold=True, return_lse=True)
    got, got_lse = ta.tree_attention_mma(q, *args, fold=True, long_context=True, return_lse=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(got_lse.view(torch.int32), want_lse.view(torch.int32))
