"""The tensor-core tree attention (patches/kernels/tree_attention_mma.cu) run on the CPU through the CUDA
emulation of tests/kernels/cuda_emu.py (mma.sync emulated per warp in fp32: the indexing, the tile plan and
the per-row operands are the kernel's own; the tensor cores' bits are checked on the GPU).

On random 3-bit pages (shuffled block table): every row agrees with the float64 attention reference within
the error of fp16 P, and every row of a 16-row tree is bit-identical to a 1-row call at ctx + depth over a
cache holding its path (plain decoding) - across shared tiles, tail tiles that straddle a tile boundary,
and (slow) a tail that crosses a split.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from elpis import accept
from elpis.exl3 import qcache_ref as qr
from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import cuda_emu
from tests.kernels.tree_cases import call_emulated

BITS = 3
GROUPS = ta.KV_HEADS * ta.HEAD_DIM // qr.GROUP
# a 16-row tree with a 15-deep chain (rows 0..8 then 10, 12, ...), branches and leaves
PARENTS = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10, 2, 12, 13]


def _build(tmp: object, **extra: int) -> ctypes.CDLL:
    defines = {"ELPIS_QCACHE_K_BITS": BITS, "ELPIS_QCACHE_V_BITS": BITS, **extra}
    lib = cuda_emu.build_emulated(
        ta.SOURCE_MMA, tmp, launches=2, needs=("verify_schedule.h",), defines=defines
    )
    for name, argtypes in ta.MMA_ENTRY_ARGS.items():
        getattr(lib, name).argtypes = list(argtypes)
        getattr(lib, name).restype = ctypes.c_int
    lib.elpis_tree_attention_workspace_floats.argtypes = [ctypes.c_uint32] * 3
    lib.elpis_tree_attention_workspace_floats.restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return _build(tmp_path_factory.mktemp("tree_attention_mma_emu"))


@pytest.fixture(scope="module")
def direct_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The build with the direct staging (ELPIS_MMA_PREFETCH=0) that the pipelined staging replaced."""
    return _build(tmp_path_factory.mktemp("tree_attention_mma_emu_direct"), ELPIS_MMA_PREFETCH=0)


@pytest.fixture(scope="module")
def fold_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The build that folds the cache's rotation into the queries and outputs (ELPIS_MMA_HADAMARD_FOLD)."""
    return _build(tmp_path_factory.mktemp("tree_attention_mma_emu_fold"), ELPIS_MMA_HADAMARD_FOLD=1)


class Pages:
    """Random packed 3-bit K/V pages and scales, and their fp16 values by the reference dequant."""

    def __init__(self, tokens: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        pages = -(-tokens // ref.PAGE)
        pool = pages + 2
        self.caches = []
        for _ in range(2):
            codes = rng.integers(0, 2**BITS, size=(pool, ref.PAGE, GROUPS, qr.GROUP), dtype=np.uint32)
            scales = rng.uniform(0.05, 2.0, size=(pool, ref.PAGE, GROUPS)).astype(np.float16)
            self.caches += [torch.from_numpy(qr.pack_codes(codes, BITS)), torch.from_numpy(scales)]
        self.table = torch.from_numpy(rng.permutation(pool)[:pages].astype(np.int32))

    def fp16(self) -> tuple[torch.Tensor, torch.Tensor]:
        qk, sk, qv, sv = self.caches
        return (torch.from_numpy(qr.dequant_pages(qk, sk, BITS, ta.KV_HEADS, ta.HEAD_DIM)),
                torch.from_numpy(qr.dequant_pages(qv, sv, BITS, ta.KV_HEADS, ta.HEAD_DIM)))  # fmt: skip

    def move(self, src_slot: int, dst_slot: int) -> None:
        """Copy one slot's packed words and scales (what the engine's commit does)."""
        src = (int(self.table[src_slot // ref.PAGE]), src_slot % ref.PAGE)
        dst = (int(self.table[dst_slot // ref.PAGE]), dst_slot % ref.PAGE)
        for t in self.caches:
            t[dst] = t[src]


def attend(lib: ctypes.CDLL, pages: Pages, q: torch.Tensor, ctx: int, depth, ancestors):
    return call_emulated(lib, "elpis_tree_attention_mma", pages.caches, q, pages.table, ctx, depth, ancestors)


def _queries(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), generator=gen).half()


def check_rows_against_plain_decoding(lib: ctypes.CDLL, ctx: int, parents: list[int], seed: int) -> None:
    masks = accept.tree_masks(parents)
    rows = len(parents)
    pages = Pages(ctx + 2 * rows, seed)
    q = _queries(rows, seed)
    out, lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    saved = [t.clone() for t in pages.caches]
    for r in range(rows):
        path = [a for a in range(rows) if (masks.ancestors[r] >> a) & 1]
        for e, row in enumerate(path):
            pages.move(ctx + row, ctx + e)
        one, one_lse = attend(lib, pages, q[r : r + 1].contiguous(), ctx + masks.depth[r], (0,), (1,))
        assert torch.equal(out[r].view(torch.int16), one[0].view(torch.int16)), f"row {r} != plain decoding"
        assert torch.equal(lse[r], one_lse[0]), f"row {r}: lse != plain decoding"
        for cur, orig in zip(pages.caches, saved, strict=True):
            cur.copy_(orig)


def test_rows_match_float64(lib: ctypes.CDLL) -> None:
    """Shared tiles (positions < 64) and a tail tile per row; error within fp16 P's rounding."""
    check_float64(lib)


def check_float64(lib: ctypes.CDLL, slack: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The case's output and its float64 reference, checked within `slack` times fp16 P's rounding."""
    ctx, parents = 70, [-1, 0, 1, 0, 3, 4]
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), 3)
    q = _queries(len(parents), 3)
    out, lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    k, v = pages.fp16()
    f64, f64_lse = ref.reference_fp64(q, k, v, pages.table, ctx, masks.ancestors, ta.DEFAULT_SCALE)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    vmax = v.abs().max().item()
    # P in fp16: each weight off by <= 2^-11 relative, so the output by <= 2^-11 * max|v| (and fp16 output)
    assert ((out.double() - f64).abs() <= slack * (2.0**-11 * vmax + 2.0**-10 * f64.abs())).all()
    assert (lse.double() - f64_lse).abs().max().item() < slack * 1e-3
    return out, f64


def test_folded_rotation_matches_float64(lib: ctypes.CDLL, fold_lib: ctypes.CDLL) -> None:
    """Folding the rotation into the queries and outputs rounds elsewhere: the reference's operands are the
    fp16 values ExLlamaV3 dequantises (rotated, then rounded), the fold's the unrotated values rounded and
    a rotated query. Its error stays within twice fp16 P's bound, its largest error within twice the
    unfolded build's, and its bits differ from the unfolded build's (the build define took effect)."""
    unfolded, f64 = check_float64(lib)
    folded, _ = check_float64(fold_lib, slack=2.0)
    assert not torch.equal(folded, unfolded)
    unfolded_err = (unfolded.double() - f64).abs().max().item()
    assert (folded.double() - f64).abs().max().item() <= 2.0 * unfolded_err


def test_fold_needs_no_more_memory(lib: ctypes.CDLL, fold_lib: ctypes.CDLL) -> None:
    """The fold changes arithmetic, not allocation: the same shared memory per block and the same workspace
    for every row count and context (so the 24 GiB test's figures hold for either build)."""
    for build in (lib, fold_lib):
        build.elpis_tree_attention_mma_smem_bytes.restype = ctypes.c_uint32
    assert lib.elpis_tree_attention_mma_smem_bytes() == fold_lib.elpis_tree_attention_mma_smem_bytes()
    for rows, ctx in ((1, 1000), (8, 32760), (16, 262128)):
        floats = [b.elpis_tree_attention_workspace_floats(rows, ctx, rows - 1) for b in (lib, fold_lib)]
        assert floats[0] == floats[1] > 0


def test_folded_rows_are_plain_decoding(fold_lib: ctypes.CDLL) -> None:
    """The fold's rotations are per query and per output, so its rows keep plain decoding's bits (ctx 90:
    shared tiles, tails straddling the tile boundary at 96)."""
    check_rows_against_plain_decoding(fold_lib, 90, PARENTS, 13)


def test_rows_are_plain_decoding_across_a_tile_boundary(lib: ctypes.CDLL) -> None:
    """ctx 90: tiles [0, 32) and [32, 64) shared, the tails 90..105 straddle the tile boundary at 96."""
    check_rows_against_plain_decoding(lib, 90, PARENTS, 11)


@pytest.mark.slow
def test_rows_are_plain_decoding_across_a_split(lib: ctypes.CDLL) -> None:
    """ctx 121: the deep rows' tails cross the first split boundary, 128 (two partials, then the combine)."""
    check_rows_against_plain_decoding(lib, 121, PARENTS, 12)


def test_graph_form_reads_the_context_from_memory(lib: ctypes.CDLL) -> None:
    """The graph form (ctx from memory, grid and workspace sized for a larger max_ctx, so splits past the
    context run empty) gives the bits of the ordinary entry at the same context."""
    ctx, parents = 70, [-1, 0, 1, 0]
    masks = accept.tree_masks(parents)
    pages = Pages(1100, 5)
    q = _queries(len(parents), 5)
    want, _ = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    rows, max_ctx = len(parents), 1100
    mask_words = torch.tensor([*masks.depth, *masks.ancestors], dtype=torch.int32)
    ctx_word = torch.tensor([ctx], dtype=torch.int32)
    floats = lib.elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1)
    work = torch.full((floats,), float("nan"), dtype=torch.float32)
    out = torch.full((rows, ta.Q_HEADS, ta.HEAD_DIM), float("nan"), dtype=torch.half)

    def call(workspace_floats: int) -> int:
        return lib.elpis_tree_attention_mma_dev(
            q.data_ptr(), *(t.data_ptr() for t in pages.caches), pages.table.data_ptr(),
            mask_words.data_ptr(), mask_words.data_ptr() + 4 * rows, rows, ctx_word.data_ptr(), max_ctx,
            ta.DEFAULT_SCALE, out.data_ptr(), None, work.data_ptr(), workspace_floats, None,
        )  # fmt: skip

    assert call(floats) == 0
    assert torch.equal(out, want)
    assert call(floats - 1) != 0  # too small a workspace for max_ctx is refused


def test_rows_dealt_to_several_blocks_keep_their_bits(lib: ctypes.CDLL) -> None:
    """On a GPU with many multiprocessors a short context deals the rows to several blocks per (split,
    head); every row keeps the bits it has when one block serves all rows."""
    ctx = 90
    masks = accept.tree_masks(PARENTS)
    pages = Pages(ctx + len(PARENTS), 21)
    q = _queries(len(PARENTS), 21)
    lib.emu_set_sms(1)  # 1 split x 4 heads: one block per head serves the 16 rows
    one, one_lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    lib.emu_set_sms(24)  # 24 multiprocessors over 4 blocks: the rows dealt to 6 blocks per head
    try:
        dealt, dealt_lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    finally:
        lib.emu_set_sms(1)
    assert torch.equal(dealt, one) and torch.equal(dealt_lse, one_lse)


@pytest.mark.parametrize(
    ("ctx", "parents", "seed"),
    [
        (70, [-1, 0, 1, 0, 3, 4], 31),  # two shared tiles, then tails in the third
        (90, PARENTS, 32),  # 16 rows, tails straddling the tile boundary at 96
        (31, [-1, 0, 0, 1], 33),  # the first tile is already the tail
        (129, [-1], 34),  # one row, five tiles: every tile's groups loaded one tile ahead
        # 16 rows over two splits of 128: the first split's four tiles stage each next K during the output
        # and its last stops at the split's end; the second's tiles 128 and 160 overlap, then two tail tiles
        (200, PARENTS, 35),
        # 9 rows: past 8 rows a score warp takes two, and the fifth warp's second row is not in the block
        (100, PARENTS[:9], 36),
    ],
)
def test_pipelined_staging_keeps_the_direct_stagings_bits(
    lib: ctypes.CDLL, direct_lib: ctypes.CDLL, ctx: int, parents: list[int], seed: int
) -> None:
    """Loading groups a tile ahead, decoding half-groups on every thread and overlapping the staging with the
    tensor-core phases (K and V in rows of their own below ctx) change no output bit."""
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), seed)
    q = _queries(len(parents), seed)
    out, lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    want, want_lse = attend(direct_lib, pages, q, ctx, masks.depth, masks.ancestors)
    assert torch.isfinite(out).all()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(lse, want_lse)


@pytest.fixture(scope="module")
def rows8_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The 8-row build (ELPIS_BUILD_MAX_ROWS=8: half the output accumulators, for two blocks an SM)."""
    return _build(tmp_path_factory.mktemp("tree_attention_mma_emu_rows8"), ELPIS_BUILD_MAX_ROWS=8)


@pytest.mark.parametrize(
    ("ctx", "parents", "seed", "sms"),
    [
        (70, [-1, 0, 1, 0, 3, 4], 41, 1),  # two shared tiles, then tails in the third
        (31, [-1, 0, 0, 1], 42, 1),  # the first tile is already the tail
        (129, [-1], 43, 1),  # one row, five tiles
        (200, PARENTS[:8], 44, 1),  # 8 rows over two splits of 128
        (90, PARENTS[:8], 45, 24),  # the rows dealt to several blocks per (split, head)
    ],
)
def test_eight_row_build_keeps_the_served_bits(
    lib: ctypes.CDLL, rows8_lib: ctypes.CDLL, ctx: int, parents: list[int], seed: int, sms: int
) -> None:
    """A build for at most 8 rows (one row a score warp, never two) gives each row the served build's bits."""
    masks = accept.tree_masks(parents)
    pages = Pages(ctx + len(parents), seed)
    q = _queries(len(parents), seed)
    for build in (lib, rows8_lib):
        build.emu_set_sms(sms)
    try:
        out, lse = attend(rows8_lib, pages, q, ctx, masks.depth, masks.ancestors)
        want, want_lse = attend(lib, pages, q, ctx, masks.depth, masks.ancestors)
    finally:
        for build in (lib, rows8_lib):
            build.emu_set_sms(1)
    assert torch.isfinite(out).all()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(lse, want_lse)


def test_eight_row_build_refuses_nine_rows(lib: ctypes.CDLL, rows8_lib: ctypes.CDLL) -> None:
    """Past its rows the 8-row build refuses the call (cudaErrorInvalidValue) before it reads a pointer."""
    def call(build: ctypes.CDLL, rows: int) -> int:
        return build.elpis_tree_attention_mma(
            *([None] * 8), rows, 30, 0, ta.DEFAULT_SCALE, None, None, None, 0, None
        )

    assert call(rows8_lib, 9) == 1 and call(rows8_lib, 16) == 1
    assert call(lib, 17) == 1  # the served build's own limit, by the same check

