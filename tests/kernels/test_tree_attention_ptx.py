"""One block of the tensor-core tree attention (patches/kernels/tree_attention_mma.cu, the served build:
3-bit K/V cache, the rotation folded, pipelined staging) run on the PTX nvcc makes for sm_86 (and sm_90 for
one case), every one of its 512 threads, by the PTX interpreter's block mode (tests/kernels/ptx_interp.py).

One block is one split and one K/V head: the score warps and staging warps of each tile meet at the
tile's barriers, the warps' shuffles, ldmatrix and mma run with all their lanes (else SyncFault), no byte of
shared or global memory is raced on between barriers and no shared byte is read before it is written. The
block's partials (acc[256] and the max and sum per row and query head) agree with the CPU emulation's
(tests/kernels/cuda_emu.py) within the bound `_check_partials` derives. Deleting one barrier of the tile loop
is reported as a race, and another head's partials break the bound: the checks can fail.

The interpreter's mma is one admissible model (each element its exact value rounded once), not the tensor
cores' bits, and its ex2.approx is 2^x correctly rounded: so the partials are compared within a bound, and
the GPU's own bits are the GPU tests' to check.
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pytest
import torch

from elpis import accept, nvcc
from elpis.exl3 import tree_attention as ta
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, barrier_lines
from tests.kernels.test_tree_attention_mma_emu import BITS, Pages, _build, _queries
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

SERVED = {"ELPIS_QCACHE_K_BITS": BITS, "ELPIS_QCACHE_V_BITS": BITS, "ELPIS_MMA_HADAMARD_FOLD": 1}
ENTRY = "tree_attention_mma_split"
THREADS = 512
TILE = 32
HEAD = 1  # the K/V head the block serves (not 0: a head index that is ignored would show)
GROUP = ta.Q_HEADS // ta.KV_HEADS  # query heads per K/V head
# a 16-row tree: a 15-deep chain, branches and leaves (test_tree_attention_mma_emu's)
PARENTS = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10, 2, 12, 13]


@pytest.fixture(scope="module")
def ptx_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """The served build's PTX for an architecture (built once)."""
    out = tmp_path_factory.mktemp("tree_attention_ptx")
    return lru_cache(maxsize=None)(
        lambda arch: nvcc.compile_to(ta.SOURCE_MMA, "ptx", arch=arch, defines=SERVED, out_dir=out).read_text()
    )


@pytest.fixture(scope="module")
def ptx(ptx_of: Callable[[str], str]) -> str:
    return ptx_of("sm_86")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = _build(tmp_path_factory.mktemp("tree_attention_ptx_emu"), ELPIS_MMA_HADAMARD_FOLD=1)
    lib.elpis_tree_attention_mma_smem_bytes.restype = ctypes.c_uint32
    lib.elpis_tree_attention_max_splits.argtypes = [ctypes.c_uint32] * 2
    lib.elpis_tree_attention_max_splits.restype = ctypes.c_uint32
    return lib


class Case:
    """Random 3-bit pages and queries for a tree at a context; the emulated call's partials."""

    def __init__(self, lib: ctypes.CDLL, ctx: int, parents: list[int], seed: int) -> None:
        self.ctx, self.masks, self.rows = ctx, accept.tree_masks(parents), len(parents)
        self.pages, self.q = Pages(ctx + self.rows, seed), _queries(self.rows, seed)
        self.max_depth = max(self.masks.depth)
        assert lib.elpis_tree_attention_max_splits(ctx, self.max_depth) == 1  # one split: this block's
        self.acc, self.ml = self._emulated(lib)

    def _emulated(self, lib: ctypes.CDLL) -> tuple[np.ndarray, np.ndarray]:
        """The emulated build's split partials, acc [rows, 24, 256] and (max, sum) [rows, 24, 2], read from
        its workspace (part_acc, then part_ml; one split)."""
        floats = lib.elpis_tree_attention_workspace_floats(self.rows, self.ctx, self.max_depth)
        work = torch.full((floats,), float("nan"))
        depth = torch.tensor(self.masks.depth, dtype=torch.int32)
        ancestors = torch.tensor(self.masks.ancestors, dtype=torch.int32)
        out = torch.full((self.rows, ta.Q_HEADS, ta.HEAD_DIM), float("nan")).half()
        lse = torch.full((self.rows, ta.Q_HEADS), float("nan"))
        err = lib.elpis_tree_attention_mma(
            self.q.data_ptr(), *(t.data_ptr() for t in self.pages.caches), self.pages.table.data_ptr(),
            depth.data_ptr(), ancestors.data_ptr(), self.rows, self.ctx, self.max_depth, ta.DEFAULT_SCALE,
            out.data_ptr(), lse.data_ptr(), work.data_ptr(), floats, None,
        )  # fmt: skip
        assert err == 0
        n = self.rows * ta.Q_HEADS
        w = work.numpy()
        return w[: n * ta.HEAD_DIM].reshape(self.rows, ta.Q_HEADS, ta.HEAD_DIM), w[
            n * ta.HEAD_DIM : n * (ta.HEAD_DIM + 2)
        ].reshape(self.rows, ta.Q_HEADS, 2)

    def run_block(self, text: str, smem: int) -> tuple[BlockReport, np.ndarray, np.ndarray]:
        """Block (HEAD, split 0) of the one-split grid, on the PTX `text`: its report and the partial
        buffers (NaN where the block wrote nothing)."""
        entry = PtxProgram(text).entry(ENTRY)
        m = Machine(size=1 << 25, approximate=True)
        inputs = [m.put(t.numpy()) for t in (self.q, *self.pages.caches, self.pages.table)]
        depth = m.put(np.array(self.masks.depth, dtype=np.uint32))
        ancestors = m.put(np.array(self.masks.ancestors, dtype=np.uint32))
        acc = np.full((self.rows, ta.Q_HEADS, ta.HEAD_DIM), np.nan, dtype=np.float32)
        ml = np.full((self.rows, ta.Q_HEADS, 2), np.nan, dtype=np.float32)
        at_acc, at_ml = m.put(acc), m.put(ml)
        ctx_arg = struct.pack("<IIQ", self.ctx, 0, 0)  # CtxArg{value, ptr = null}
        scale = struct.unpack("<I", struct.pack("<f", ta.DEFAULT_SCALE))[0]
        args = [*inputs, depth, ancestors, self.rows, ctx_arg, scale, 1, at_acc, at_ml]
        report = m.run_block(
            entry, args, threads=THREADS, block=(HEAD, 0), grid=(ta.KV_HEADS, 1), dynamic_shared=smem
        )
        return report, m.get(at_acc, acc), m.get(at_ml, ml)

    def tiles(self) -> int:
        return -(-(self.ctx + self.max_depth + 1) // TILE)


def _norms(x: torch.Tensor) -> float:
    """The largest 2-norm of x's last dimension."""
    return float(x.double().norm(dim=-1).max())


def _check_partials(case: Case, acc: np.ndarray, ml: np.ndarray, head: int = HEAD) -> None:
    """The block's partials against the emulated build's for K/V head `head`.

    Only the tensor-core sums and 2^x may round differently (every other fp32 operation is the same source
    operation in both). A score s = scale q.k over 256 dimensions is off in either by at most
    gamma_257 = 257 u / (1 - 257 u) (u = 2^-24) times scale sum |q_i k_i| <= scale |q| |k| (Cauchy-Schwarz;
    the fold's rotations keep 2-norms, fp16 rounding adds 2^-10 a factor), so two runs differ by
    E = 2 gamma_257 scale |q| |k| log2(e): the max m too. P = fp16(2^((s - m) log2 e)) then differs by
    2 E from the exponent, 2^-21 from 2^x (2 ulp), and one fp16 step, 2^-10, where its rounding flips:
    rho = 2^-10 + 2 E + 2^-21 relative, a tile's rescale factor alike; the sum l over at most 3 tiles by
    (1 + rho)^4 - 1, and acc[d] = sum P v by that times l max |v| plus the value mma's own rounding,
    2 gamma_(ctx + 16) l max |v|. The fold stages V unrotated, (code - mid) scale / 2^(bits - 1) in fp16:
    max |v| < the largest V scale (its partials are rotated by the combine, not here)."""
    hs = slice(GROUP * head, GROUP * head + GROUP)
    k, _ = case.pages.fp16()
    u = 2.0**-24
    gamma = lambda n: n * u / (1 - n * u)  # noqa: E731
    scores = ta.DEFAULT_SCALE * _norms(case.q) * _norms(k) * (1 + 2.0**-10) ** 2  # bounds scale sum |q_i k_i|
    e = 2 * gamma(257) * scores * math.log2(math.e)
    rho = 2.0**-10 + 2 * e + 2.0**-21
    vmax = float(case.pages.caches[3].float().abs().max())  # the V scales
    want_acc, want_ml = case.acc[:, hs], case.ml[:, hs]
    got_acc, got_ml = acc[:, hs], ml[:, hs]
    assert np.isfinite(got_acc).all() and np.isfinite(got_ml).all()
    l_ = want_ml[..., 1]
    assert (np.abs(got_ml[..., 0] - want_ml[..., 0]) <= e).all(), "max"
    assert (np.abs(got_ml[..., 1] - l_) <= ((1 + rho) ** 4 - 1) * l_).all(), "sum"
    bound = (((1 + rho) ** 4 - 1) + 2 * gamma(case.ctx + 16)) * l_ * vmax
    assert (np.abs(got_acc - want_acc) <= bound[..., None]).all(), "acc"


def _check_block(case: Case, report: BlockReport, acc: np.ndarray, ml: np.ndarray) -> None:
    """No race, no unwritten shared read, the tile loop's barriers (two a tile, five outside it) all met
    (run_block raised otherwise), the warps' collectives run, other heads' partials untouched."""
    assert report.races == [], [str(r) for r in report.races[:4]]
    assert report.unwritten_reads == []
    assert report.barriers == 5 + 2 * case.tiles()
    assert report.shuffles > 0 and report.collectives > 0
    others = [h for h in range(ta.Q_HEADS) if not GROUP * HEAD <= h < GROUP * HEAD + GROUP]
    assert np.isnan(acc[:, others]).all() and np.isnan(ml[:, others]).all()


@pytest.mark.parametrize(
    ("arch", "ctx", "parents", "seed"),
    [
        ("sm_86", 40, [-1], 41),  # a full tile [0, 32), the tail tile [32, 41)
        ("sm_86", 50, [-1, 0, 1, 0, 3, 1, 5, 6], 42),  # 8 rows, two branches: tails in [50, 56)
        ("sm_90", 50, [-1, 0, 1, 0, 3, 1, 5, 6], 42),
        pytest.param("sm_86", 70, PARENTS, 43, marks=pytest.mark.slow),  # 16 rows, 3 tiles, tails to 86
    ],
)
def test_one_block_is_race_free_and_matches_the_emulation(
    ptx_of: Callable[[str], str], emulated: ctypes.CDLL, arch: str, ctx: int, parents: list[int], seed: int
) -> None:
    case = Case(emulated, ctx, parents, seed)
    report, acc, ml = case.run_block(ptx_of(arch), emulated.elpis_tree_attention_mma_smem_bytes())
    _check_block(case, report, acc, ml)
    _check_partials(case, acc, ml)
    with pytest.raises(AssertionError):  # another head's partials: the bound can fail
        _check_partials(case, np.roll(acc, GROUP, axis=1), np.roll(ml, GROUP, axis=1))


def test_a_tile_loop_barrier_deleted_is_reported_as_a_race(ptx: str, emulated: ctypes.CDLL) -> None:
    """The first bar.sync after the first mma.sync (in the tile loop, between the score and staging
    warps' phases) deleted: the detector reports a shared-memory race."""
    lines = ptx.splitlines()
    first_mma = next(i for i, line in enumerate(lines) if "mma.sync" in line)
    cut = next(i for i in barrier_lines(ptx, ENTRY) if i > first_mma)
    mutant = "\n".join(line for i, line in enumerate(lines) if i != cut)
    case = Case(emulated, 40, [-1], 41)
    report, _, _ = case.run_block(mutant, emulated.elpis_tree_attention_mma_smem_bytes())
    assert report.races and report.races[0].space == "shared"
    assert report.barriers < 5 + 2 * case.tiles()
