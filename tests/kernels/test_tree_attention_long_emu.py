"""The long-context tree attention (patches/kernels/tree_attention_long.cu) against the served fold build of
the tensor-core kernel (tree_attention_mma.cu, ELPIS_MMA_HADAMARD_FOLD 1), both run on the CPU through the
CUDA emulation (tests/kernels/cuda_emu.py): every output and log-sum-exp bit for bit.

The long form decodes the cache's values straight into the fragments and runs the softmax of a 128-position
pass's four tiles after their scores; its claim is that every mma.sync sees the served operands in the served
order. The emulated mma is not the tensor cores' arithmetic, but it is a function of the fragments and the
chain order, so a fragment off by one lane, position or dimension, or a tile's statistics out of order, shows
here. The GPU test (test_tree_attention_long.py) repeats the comparison on the tensor cores.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from tests.kernels.test_tree_attention_mma_emu import PARENTS, Pages, _queries, attend, check_float64
from tests.kernels.test_tree_attention_mma_emu import _build as build_mma


def _build(tmp: object, source: object, **extra: int) -> ctypes.CDLL:
    """An emulated fold build of `source`."""
    return build_mma(tmp, source, ELPIS_MMA_HADAMARD_FOLD=1, **extra)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return _build(tmp_path_factory.mktemp("long_served_fold"), ta.SOURCE_MMA)


@pytest.fixture(
    scope="module",
    params=[(4, 1), (1, 1), (4, 2)],
    ids=["4-tile passes", "1-tile passes", "two score warps per 16 positions"],
)
def long_lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The default build (passes of 4 tiles, one score warp per 16 positions), passes of one tile (several
    passes a split at these contexts, so the copies issued a pass ahead and the tables of each pass are
    exercised), and the build whose warps 8..15 score rows 4..7."""
    tiles, classes = request.param
    out = tmp_path_factory.mktemp(f"long_{tiles}_{classes}")
    return _build(out, ta.SOURCE_LONG, ELPIS_LONG_TILES=tiles, ELPIS_LONG_SCORE_CLASSES=classes)


CASES = [
    (70, [-1, 0, 1, 0, 3, 4], 41),  # two tiles below ctx, then the tails (a pass that reaches ctx)
    (90, PARENTS, 42),  # 16 rows: two blocks of 8 per (split, head); tails straddle the tile boundary at 96
    (31, [-1, 0, 0, 1], 43),  # the first tile already reaches ctx
    (129, [-1], 44),  # one row, a full split of 128 below ctx, then a pass of one tile
    (200, PARENTS, 45),  # two splits: a whole pass below ctx, then a pass with tiles below and tails
    (100, PARENTS[:9], 46),  # 9 rows: 5 and 4 in two blocks
    (250, PARENTS[:8], 47),  # 8 rows in one block: score warps with 4 rows each
]


@pytest.mark.parametrize(("ctx", "parents", "seed"), CASES)
def test_long_form_keeps_the_fold_builds_bits(
    served: ctypes.CDLL, long_lib: ctypes.CDLL, ctx: int, parents: list[int], seed: int
) -> None:
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), seed)
    q = _queries(len(parents), seed)
    want, want_lse = attend(served, pages, q, ctx, masks.depth, masks.ancestors)
    got, got_lse = attend(long_lib, pages, q, ctx, masks.depth, masks.ancestors)
    assert torch.isfinite(got).all() and torch.isfinite(got_lse).all()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(got_lse, want_lse)


def test_long_form_matches_float64(long_lib: ctypes.CDLL) -> None:
    """Within the fold build's bound against the float64 attention (so the comparison above is not between two
    equally wrong builds)."""
    check_float64(long_lib, slack=2.0)


def test_zero_scales_keep_signed_zeros(served: ctypes.CDLL, long_lib: ctypes.CDLL) -> None:
    """Groups with scale 0 decode to signed zeros ((code - mid) * 0): the long form gives the served bits."""
    ctx, parents = 100, [-1, 0, 1]
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), 48)
    for scales in (pages.caches[1], pages.caches[3]):
        scales[:, :40] = 0.0
    q = _queries(len(parents), 48)
    want, want_lse = attend(served, pages, q, ctx, masks.depth, masks.ancestors)
    got, got_lse = attend(long_lib, pages, q, ctx, masks.depth, masks.ancestors)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(got_lse, want_lse)


def test_steps_below_fp16_take_the_fp32_decoding(served: ctypes.CDLL, long_lib: ctypes.CDLL) -> None:
    """Scales whose step (scale / 4) is not an fp16 - subnormal scales with low bits set - are decoded in
    fp32, others in fp16 pairs; both give the served bits (scales 1..7 x 2^-24 beside normal ones)."""
    ctx, parents = 100, [-1, 0, 1, 1]
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), 49)
    tiny = torch.tensor([k * 2.0**-24 for k in range(1, 8)], dtype=torch.float16)
    for scales in (pages.caches[1], pages.caches[3]):
        flat = scales.view(-1)
        flat[: flat.numel() // 2] = tiny.repeat(flat.numel() // 14 + 1)[: flat.numel() // 2]
    q = _queries(len(parents), 49)
    want, want_lse = attend(served, pages, q, ctx, masks.depth, masks.ancestors)
    got, got_lse = attend(long_lib, pages, q, ctx, masks.depth, masks.ancestors)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(got_lse, want_lse)


MUTATIONS = {
    "K rows g and g+8 swapped": ("a[h][1] = hi[h][0];", "a[h][1] = lo[h][0];"),
    "V positions 2t and 2t+1 swapped": ("lo.c0 | (hi.c0 << 16)", "hi.c0 | (lo.c0 << 16)"),
    "a tile's incoming max taken after it": ("i < tile; i++) m_old", "i <= tile; i++) m_old"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_wrong_fragment_is_seen(
    tmp_path_factory: pytest.TempPathFactory, served: ctypes.CDLL, mutation: str
) -> None:
    """The comparison can fail: each mutant build differs from the served bits."""
    old, new = MUTATIONS[mutation]
    source = ta.SOURCE_LONG.read_text()
    assert source.count(old) == 1
    path = tmp_path_factory.mktemp("long_wrong") / "tree_attention_long_wrong.cu"
    path.write_text(source.replace(old, new))
    lib = _build(path.parent, path)
    ctx, parents, seed = CASES[0]
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), seed)
    q = _queries(len(parents), seed)
    want, _ = attend(served, pages, q, ctx, masks.depth, masks.ancestors)
    got, _ = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    assert not torch.equal(got.view(torch.int16), want.view(torch.int16))
