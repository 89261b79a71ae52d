"""The Gated DeltaNet tree kernel's commit and bf16 output (patches/kernels/gdn_tree.cu) as nvcc compiles
them for sm_86 and sm_90, run every thread of one block by the PTX interpreter's block mode
(tests/kernels/ptx_interp.py, approximate math opted in as in tests/kernels/test_gdn_tree_ptx.py, which
checks the tree walk itself).

The commit of `gdn_tree_kernel` (GdnTreeArgs.state_out = state_in = `state`, as elpis_gdn_tree_commit and
elpis_gdn_tree_commit_dev launch it: the path's plan is a chain, and the block writes its 16 columns of the
state back in place after two more barriers), on the path [0, 2, 3, 4] (4 rows, input rows not 0..n-1) of the
7-row tree below, one block per case:
- every thread meets the 4 barriers and every shuffle; no race, no shared byte read before it was written;
- the block reads and writes the state only at its own 128 x 16 elements (head, slice columns), each once,
  every read before the first barrier and every write after the fourth, so blocks commit in place without
  touching each other's bytes; nothing else of the state changes;
- the state it writes and its outputs equal the kernel's source run on the CPU (tests/kernels/cuda_emu.py):
  bit for bit on inputs where every expf the kernel evaluates is exact (`_exact_inputs`: g = 0, so the decay
  is expf(0) = 1, as ex2.approx(+0) = 1 by PTX's special cases; every conv sum beyond +-110, so SiLU's expf
  scales 2^r into 0 or +inf whatever ex2's last bits), and within `_close` (the expf tolerance of
  test_gdn_tree_ptx.py) on `ref.random_inputs`, where about 95% of the state's bits agree as well;
- the committed state is the state the tree walk reaches at the path's last row, bit for bit, on the PTX:
  the verify of the tree (-1, 0, 0, 2, 3, 4, 4) parks row 4's state (it has two children) in stack slot 0,
  where it stays until the block ends, and the interpreter's shared memory is read there after the run. The
  commit's 4 rows normalise q/k with normalise_pairs<1>, the 7-row tree with <4>, and the tree reaches row 4
  through a stack load (row 0 is parked and taken back by row 2): different code, the same bits. The commit's
  outputs are the tree rows' 0, 2, 3, 4, bit for bit, fp32 and bf16.
The graph form's commit (gdn_tree_kernel_dev, the plan from memory, a fifth barrier) writes the by-value
commit's state and outputs, bit for bit (sm_86, random inputs).

The conv window commit, gdn_conv_commit_kernel and gdn_conv_commit_kernel_dev (one block of 256 channels),
for commits of 1, 2, 3, 4, 5, 7 and 16 rows (paths of distinct input rows in shuffled order) and both qkv
layouts (token-major; channel-major, a [10240, 19] buffer read with strides (1, 19), junk past the 16 input
rows): conv_state's columns 0..3 become the last 4
of [old columns 0..3, qkv rows of the path] (Python reference `_conv_after`), bit for bit; columns >= 4 and
other channels untouched; each thread reads its own channel's columns 0..3 before it writes them, reads only
qkv elements (path[e], channel) for the last min(n, 4) path rows, and writes only its channel's columns
0..3, once each; no race.

The bf16 output: in every tree-kernel run here, each bf16 the block writes is the round-to-nearest-even of
the fp32 output it writes in the same run (within one run, so no expf tolerance), and nothing else.

The checks can fail: a PTX whose commit staging stores one state element at another's place, a conv commit
PTX that stores column 2 into column 4, or reads column 1's qkv row from the next path row, are rejected; so
are a truncating bf16 reference, a conv reference one path row off, and the state accesses of the next slice's
block.

Not run here: the other blocks of each launch, other paths and trees, the verify's fp32-only runs (in
test_gdn_tree_ptx.py), expf's bits outside the exact inputs (a tolerance there); ptxas and SASS; the
ordering between the two launches of a commit (stream order) and the blocks' concurrency beyond the
disjointness of what each block touches. No fp32 output here falls exactly halfway between two bf16
values, so ties to even and ties away are not told apart by these runs (the PTX rounds with cvt.rn.bf16.f32).
"""

from __future__ import annotations

import ctypes
import random
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
import torch

from elpis import accept, nvcc
from elpis.bend import gdn_plan
from elpis.exl3 import gdn_tree
from elpis.exl3 import gdn_tree_ref as ref
from tests.kernels import cuda_emu
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, Touch, entry_lines
from tests.kernels.test_gdn_tree_ptx import (
    PER_LANE,
    SLICE,
    THREADS,
    _close,
    _i16,
    _program,
    _ptx_text,
    _source_line,
    _source_of,
)
from tests.nvcc_marks import needs_nvcc

pytestmark = [needs_nvcc, pytest.mark.usefixtures("one_torch_thread")]

TREE = (-1, 0, 0, 2, 3, 4, 4)  # row 4 (path 0, 2, 3, 4) has two children: its state is parked
PATH = (0, 2, 3, 4)
C, TAPS, HEADS, DIM = ref.CONV_DIM, ref.TAPS, ref.VALUE_HEADS, ref.HEAD_DIM
ARGS = "<QiiQQQQi4xQQQQ"  # GdnTreeArgs (see test_gdn_tree_ptx.py)
BF16_UNWRITTEN = 0xFFFF  # a NaN pattern no rounding of a finite output gives
COMMIT_STAGE = _source_line(
    "for (int i = 0; i < kPerLane; i++) stage[(16 * i + sub) * kStagePitch + col] = st[i];"
)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The kernel's source built for the CPU: its host glue packs the plans, its kernels give references."""
    build = tmp_path_factory.mktemp("gdn_commit_emu")
    return gdn_tree.bind(
        cuda_emu.build_emulated(gdn_tree.SOURCE, build, launches=5, needs=(gdn_plan.HEADER,))
    )


def _tree_plan(lib: ctypes.CDLL, parents: tuple[int, ...]) -> tuple[gdn_tree.Plan, bytes]:
    masks = accept.tree_masks(list(parents))
    buf = (ctypes.c_uint8 * gdn_tree.PLAN_CAPACITY)()
    size = lib.elpis_gdn_tree_plan_pack(
        len(parents), gdn_tree._i32(masks.depth), gdn_tree._u32(masks.ancestors), buf, gdn_tree.PLAN_CAPACITY
    )
    assert size == 136, size
    return gdn_tree.plan(masks.depth, masks.ancestors, lib=lib), bytes(buf)[:size]


def _commit_plan(lib: ctypes.CDLL, path: tuple[int, ...]) -> bytes:
    buf = (ctypes.c_uint8 * gdn_tree.PLAN_CAPACITY)()
    size = lib.elpis_gdn_tree_commit_plan_pack(
        len(path), gdn_tree._i32(list(path)), buf, gdn_tree.PLAN_CAPACITY
    )
    assert size == 136, size
    return bytes(buf)[:size]


# ---- inputs ------------------------------------------------------------------------------------------------


def _exact_inputs(rows: int, seed: int) -> ref.Inputs:
    """Inputs on which every expf of the kernel is exact, on the CPU and in the PTX alike: g = 0 (the decay is
    expf(0) = 1) and, per channel, inputs and committed columns of one sign and magnitudes 120..400 with taps
    0.25..1, so every conv sum is beyond +-110: SiLU's expf(-acc) is 0 (acc > 0) or +inf (acc < 0), SiLU
    itself acc or -0. All other arithmetic is _rn, so the PTX must give the source's bits."""
    inp = ref.random_inputs(rows, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    sign = torch.where(torch.rand(C, generator=gen) < 0.5, -1.0, 1.0)

    def magnitude(*shape: int) -> torch.Tensor:
        return 120.0 + 280.0 * torch.rand(*shape, generator=gen)

    qkv = (magnitude(rows, C) * sign).bfloat16()
    conv_state = inp.conv_state.clone()
    conv_state[:, :TAPS] = (magnitude(C, TAPS) * sign[:, None]).bfloat16()
    conv_weight = (0.25 + 0.75 * torch.rand(C, TAPS, generator=gen)).bfloat16()
    inputs = torch.cat([conv_state[:, 1:TAPS].t(), qkv]).double()  # all a conv can read, any path
    assert ((inputs * sign) > 0).all()
    # |sum_j w_j x_j| >= (sum_j w_j) * min |x| for inputs of one sign, whichever 4 a row's path picks
    bound = (conv_weight.double().sum(1) * inputs.abs().min(0).values).min().item()
    assert bound > 110, bound
    return ref.Inputs(qkv, inp.beta, torch.zeros_like(inp.g), conv_weight, conv_state, inp.state)


INPUTS = {
    "exact": lambda: _exact_inputs(len(TREE), seed=21),
    "random": lambda: ref.random_inputs(len(TREE), 22),
}
BLOCKS = {"exact": (2, 17), "random": (6, 40)}  # (slice, value head)


@cache
def _inputs(regime: str) -> ref.Inputs:
    return INPUTS[regime]()


# ---- the tree kernel on the interpreter ----------------------------------------------------------------


@dataclass
class TreeRun:
    out: np.ndarray  # fp32 [rows, 48, 128]: NaN where the block wrote nothing
    out_bf16: np.ndarray  # uint16 [rows, 48, 128]: BF16_UNWRITTEN where the block wrote nothing
    state: np.ndarray  # fp32 [48, 128, 128]: the state buffer after the run
    stack: np.ndarray  # fp32: s_stack after the run
    report: BlockReport
    state_touches: list[Touch]
    state_base: int


def _run_tree(program: PtxProgram, inp: ref.Inputs, packed: bytes, block: tuple[int, int], rows: int, *,
              commit: bool, graph: bool = False) -> TreeRun:  # fmt: skip
    """Block `block` of gdn_tree_kernel (or _dev) with fp32 and bf16 outputs; with `commit`, state_out is
    state_in, as the commit launches it."""
    entry = program.entry("gdn_tree_kernel_devENS" if graph else "gdn_tree_kernelENS")
    m = Machine(size=1 << 23, approximate=True)
    at = [m.put(a) for a in (_i16(inp.qkv), _i16(inp.beta), inp.g.numpy(), _i16(inp.conv_weight),
                             _i16(inp.conv_state))]  # fmt: skip
    state = inp.state.numpy()
    at_state = m.put(state)
    out = np.full((rows, HEADS, DIM), np.nan, dtype=np.float32)
    out_bf16 = np.full((rows, HEADS, DIM), BF16_UNWRITTEN, dtype=np.uint16)
    at_out, at_bf16 = m.put(out), m.put(out_bf16)
    args = struct.pack(ARGS, at[0], C, 1, *at[1:5], inp.conv_state.shape[1], at_state,
                       at_state if commit else 0, at_out, at_bf16)  # fmt: skip
    assert len(args) == entry.params[0][1]
    stack_at, stack_bytes = m.symbol(entry, "s_stack")
    watch = m.watch(at_state, state.nbytes)
    plan_arg = m.put(np.frombuffer(packed, dtype=np.uint8)) if graph else packed
    report = m.run_block(entry, [args, plan_arg], threads=THREADS, block=block, grid=(8, HEADS))
    stack = m.get(stack_at, np.empty(stack_bytes // 4, dtype=np.float32))
    return TreeRun(m.get(at_out, out), m.get(at_bf16, out_bf16), m.get(at_state, state), stack, report,
                   watch.touches, at_state)  # fmt: skip


@cache
def _commit_run(arch: str, regime: str, packed: bytes, graph: bool = False) -> TreeRun:
    return _run_tree(
        _program(arch), _inputs(regime), packed, BLOCKS[regime], len(PATH), commit=True, graph=graph
    )


@cache
def _tree_run(arch: str, regime: str, packed: bytes) -> TreeRun:
    return _run_tree(_program(arch), _inputs(regime), packed, BLOCKS[regime], len(TREE), commit=False)


def _out_cols(x: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """The block's part of outputs [rows, 48, 128]: its head's 16 columns."""
    s, h = block
    return x[:, h, s * SLICE : (s + 1) * SLICE]


def _state_cols(x: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """The block's part of a state [48, 128 k, 128 v]: its head's 16 v columns, [128, 16]."""
    s, h = block
    return x[h, :, s * SLICE : (s + 1) * SLICE]


def _outside(
    x: np.ndarray,
    block: tuple[int, int],
    part: Callable[[np.ndarray, tuple[int, int]], np.ndarray],
    fill: float,
) -> np.ndarray:
    """`x` with the block's part (`_out_cols` or `_state_cols`) set to `fill`."""
    rest = x.copy()
    part(rest, block)[...] = fill
    return rest


def _parked(stack: np.ndarray, slot: int) -> np.ndarray:
    """The state [128 k, 16 v] parked in stack slot `slot`: element (slot * 8 + i) * 256 + t holds thread t's
    st[i], row k = 16 i + (lane % 16) of column 2 warp + lane / 16 (the kernel's walk)."""
    parked = np.empty((DIM, SLICE), dtype=np.float32)
    for t in range(THREADS):
        warp, lane = divmod(t, 32)
        for i in range(PER_LANE):
            parked[16 * i + lane % 16, 2 * warp + lane // 16] = stack[(slot * PER_LANE + i) * THREADS + t]
    return parked


def _last_slot(plan: gdn_tree.Plan, row: int) -> int:
    """The slot holding `row`'s state when the walk ends (row's store, never stored over after it)."""
    slot = None
    for r, store in zip(plan.order, plan.store, strict=True):
        if r == row:
            slot = store
        elif store >= 0 and store == slot:
            slot = None
    assert slot is not None and slot >= 0, (plan, row)
    return slot


def _emulated_commit(
    lib: ctypes.CDLL, inp: ref.Inputs, block: tuple[int, int], path: tuple[int, ...] = PATH
) -> tuple[np.ndarray, ...]:
    """The source's commit of `path` on the CPU (block `block` of the state kernel): state, fp32 and bf16
    outputs."""
    lib.emu_set_blocks(1, gdn_tree._i32(list(block)))
    state, conv = inp.state.clone(), inp.conv_state.clone()
    out = torch.full((len(path), HEADS, DIM), float("nan"))
    out_bf16 = torch.zeros((len(path), HEADS, DIM), dtype=torch.bfloat16)
    err = lib.elpis_gdn_tree_commit(
        inp.qkv.data_ptr(), C, 1, inp.beta.data_ptr(), inp.g.data_ptr(), inp.conv_weight.data_ptr(),
        conv.data_ptr(), conv.shape[1], state.data_ptr(), len(path), gdn_tree._i32(list(path)),
        out.data_ptr(), out_bf16.data_ptr(), None,
    )  # fmt: skip
    assert err == 0
    return state.numpy(), out.numpy(), _i16(out_bf16).view(np.uint16)


def _rne_bf16(x: np.ndarray) -> np.ndarray:
    """bf16 bits of finite fp32 values, rounded to nearest, ties to even."""
    assert np.isfinite(x).all()
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _truncated_bf16(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _check_sync(run: TreeRun, rows: int, barriers: int) -> None:
    assert run.report.barriers == barriers
    norms = 5 * (1 if 2 * rows <= 8 else 4)  # as test_gdn_tree_ptx.py counts them
    assert run.report.shuffles == (THREADS // 32) * (8 * rows + 4 + norms)
    assert run.report.races == [], run.report.races[:3]
    assert run.report.unwritten_reads == []


def _state_faults(run: TreeRun, block: tuple[int, int], *, commit: bool) -> list[str]:
    """What the block did to the state buffer beyond reading (and, committing, writing back) its own
    elements once each: reads before the first barrier, writes after the fourth."""
    s, h = block
    mine = {(h * DIM + k) * DIM + s * SLICE + c for k in range(DIM) for c in range(SLICE)}
    faults = []
    reads = [x for x in run.state_touches if not x.write]
    writes = [x for x in run.state_touches if x.write]
    for kind, xs, barriers in (("read", reads, 0), ("write", writes, 4)):
        if any(x.nbytes != 4 or (x.addr - run.state_base) % 4 for x in xs):
            faults.append(f"a {kind} that is not one aligned float")
        places = [(x.addr - run.state_base) // 4 for x in xs]
        want = mine if kind == "read" or commit else set()
        if sorted(places) != sorted(want):
            faults.append(f"{kind}s of {len(places)} places, not the block's {len(want)} once each")
        if any(x.barriers != barriers for x in xs):
            faults.append(f"a {kind} outside its phase")
    return faults


def _check_bf16(run: TreeRun, block: tuple[int, int]) -> None:
    """The block's bf16 outputs are the round-to-nearest-even of its fp32 outputs of the same run; nothing
    else of out_bf16 is written. A truncating kernel would be rejected: its bits differ somewhere."""
    mine, bits = _out_cols(run.out, block), _out_cols(run.out_bf16, block)
    assert np.isfinite(mine).all()
    assert np.array_equal(bits, _rne_bf16(mine))
    assert np.array_equal(_rne_bf16(mine), _i16(torch.from_numpy(mine).bfloat16()).view(np.uint16))
    assert not np.array_equal(bits, _truncated_bf16(mine))
    assert (_outside(run.out_bf16, block, _out_cols, BF16_UNWRITTEN) == BF16_UNWRITTEN).all()


# ---- the tests: the state commit ---------------------------------------------------------------------------


@pytest.mark.parametrize("regime", ["exact", "random"])
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_commits_ptx_writes_the_sources_state(arch: str, regime: str, emulated) -> None:
    inp, block = _inputs(regime), BLOCKS[regime]
    got = _commit_run(arch, regime, _commit_plan(emulated, PATH))
    _check_sync(got, len(PATH), barriers=4)
    assert _state_faults(got, block, commit=True) == []
    assert _state_faults(got, ((block[0] + 1) % 8, block[1]), commit=True) != []  # the next slice's: rejected
    before = inp.state.numpy()
    assert np.array_equal(_outside(got.state, block, _state_cols, 0), _outside(before, block, _state_cols, 0))
    state, out, out_bf16 = _emulated_commit(emulated, inp, block)
    mine, theirs = _state_cols(got.state, block), _state_cols(state, block)
    assert not np.array_equal(mine, _state_cols(before, block))
    if regime == "exact":
        assert mine.tobytes() == theirs.tobytes()
        assert _out_cols(got.out, block).tobytes() == _out_cols(out, block).tobytes()
        assert np.array_equal(_out_cols(got.out_bf16, block), _out_cols(out_bf16, block))
    else:
        assert _close(mine, theirs), np.abs(mine - theirs).max()
        assert _close(_out_cols(got.out, block), _out_cols(out, block))
    _check_bf16(got, block)
    assert np.isnan(_outside(got.out, block, _out_cols, 0)).sum() == got.out.size - len(PATH) * SLICE


@pytest.mark.parametrize("regime", ["exact", "random"])
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_commit_is_the_state_the_tree_walk_parks_for_the_paths_last_row(
    arch: str, regime: str, emulated
) -> None:
    """Verify of TREE on the PTX: row 4's state, parked in the stack and never stored over, is the commit of
    its path, bit for bit; the path rows' outputs are the commit's, fp32 and bf16."""
    plan, packed = _tree_plan(emulated, TREE)
    assert tuple(ref.path_rows(accept.tree_masks(list(TREE)).ancestors[PATH[-1]])) == PATH
    block = BLOCKS[regime]
    tree = _tree_run(arch, regime, packed)
    _check_sync(tree, len(TREE), barriers=2)
    assert _state_faults(tree, block, commit=False) == []
    _check_bf16(tree, block)
    # row 2 starts from row 0's state through the stack
    assert any(load >= 0 for r, load in zip(plan.order, plan.load, strict=True) if r == PATH[1])
    commit = _commit_run(arch, regime, _commit_plan(emulated, PATH))
    parked = _parked(tree.stack, _last_slot(plan, PATH[-1]))
    assert parked.tobytes() == _state_cols(commit.state, block).tobytes()
    assert _out_cols(tree.out, block)[list(PATH)].tobytes() == _out_cols(commit.out, block).tobytes()
    assert np.array_equal(_out_cols(tree.out_bf16, block)[list(PATH)], _out_cols(commit.out_bf16, block))
    # the comparison can fail: the state parked for row 4 is neither the state before the commit nor (even
    # within _close) the source's commit of the path without its last row
    assert parked.tobytes() != _state_cols(_inputs(regime).state.numpy(), block).tobytes()
    parent, _, _ = _emulated_commit(emulated, _inputs(regime), block, PATH[:-1])
    assert not _close(parked, _state_cols(parent, block))


def test_the_graph_forms_commit_writes_the_same_state(emulated) -> None:
    """gdn_tree_kernel_dev (the plan read from memory), as elpis_gdn_tree_commit_dev launches it (state in
    place), sm_86: the by-value commit's state and outputs, bit for bit, with 5 barriers (the plan's)."""
    packed = _commit_plan(emulated, PATH)
    got = _commit_run("sm_86", "random", packed, graph=True)
    _check_sync(got, len(PATH), barriers=5)
    by_value = _commit_run("sm_86", "random", packed)
    assert got.state.tobytes() == by_value.state.tobytes()
    assert got.out.tobytes() == by_value.out.tobytes() and np.array_equal(got.out_bf16, by_value.out_bf16)


def test_a_commit_storing_one_state_element_elsewhere_is_caught(emulated) -> None:
    """The sm_86 PTX with the commit's staging store of element i = 3 (+3264 bytes) moved to element 4's place
    (+4352): the state it writes is not the source's (exact inputs, bits) nor the tree walk's parked state."""
    text = _ptx_text("sm_86")
    lines, where = text.splitlines(), _source_of(text)
    entry = entry_lines(text, "gdn_tree_kernelENS")
    stores = [
        i for i in entry if lines[i].strip().startswith("st.shared.f32") and where[i + 1] == COMMIT_STAGE
    ]
    assert len(stores) == PER_LANE, [lines[i] for i in stores]
    (moved,) = [i for i in stores if "+3264]" in lines[i]]
    lines[moved] = lines[moved].replace("+3264]", "+4352]")
    block = BLOCKS["exact"]
    got = _run_tree(PtxProgram("\n".join(lines)), _inputs("exact"), _commit_plan(emulated, PATH), block,
                    len(PATH), commit=True)  # fmt: skip
    state, _, _ = _emulated_commit(emulated, _inputs("exact"), block)
    assert _state_cols(got.state, block).tobytes() != _state_cols(state, block).tobytes()
    plan, packed = _tree_plan(emulated, TREE)
    parked = _parked(_tree_run("sm_86", "exact", packed).stack, _last_slot(plan, PATH[-1]))
    assert parked.tobytes() != _state_cols(got.state, block).tobytes()


# ---- the tests: the conv window commit ---------------------------------------------------------------------

CONV_COLUMNS = TAPS + 3  # columns >= 4 exist and must be left alone
INPUT_ROWS = 16
LENGTHS = (1, 2, 3, 4, 5, 7, 16)
LAYOUTS = ("token", "channel")
CHANNEL_PITCH = 19  # the channel-major buffer's row stride: more columns than input rows


@dataclass(frozen=True)
class ConvCase:
    layout: str
    path: tuple[int, ...]
    block: int  # of the launch's 40 blocks of 256 channels

    @property
    def strides(self) -> tuple[int, int]:
        return (C, 1) if self.layout == "token" else (1, CHANNEL_PITCH)


def _conv_case(layout: str, n: int) -> ConvCase:
    rng = random.Random(100 * n + len(layout))
    return ConvCase(layout, tuple(rng.sample(range(INPUT_ROWS), n)), rng.randrange(C // 256))


@cache
def _conv_inputs() -> tuple[np.ndarray, np.ndarray]:
    """qkv as input rows [16, 10240] and conv_state [10240, 7], bf16 bits."""
    gen = torch.Generator().manual_seed(9)
    qkv = _i16(torch.randn(INPUT_ROWS, C, generator=gen).bfloat16()).view(np.uint16)
    conv = _i16(torch.randn(C, CONV_COLUMNS, generator=gen).bfloat16()).view(np.uint16)
    return qkv, conv


def _qkv_buffer(case: ConvCase, rows: np.ndarray) -> np.ndarray:
    """qkv in the case's layout: token-major [16, 10240], or channel-major [10240, 19] with junk columns."""
    if case.layout == "token":
        return rows.copy()
    buffer = np.random.default_rng(3).integers(0, 1 << 16, (C, CHANNEL_PITCH), dtype=np.uint16)
    buffer[:, :INPUT_ROWS] = rows.T
    return buffer


def _conv_after(conv: np.ndarray, rows: np.ndarray, path: tuple[int, ...]) -> np.ndarray:
    """The documented commit: columns 0..3 shift by the committed inputs, keeping the last 4 of [old columns
    0..3, the path's rows], oldest first; columns >= 4 as they were."""
    window = [conv[:, j] for j in range(TAPS)] + [rows[r] for r in path]
    new = conv.copy()
    new[:, :TAPS] = np.stack(window[-TAPS:], axis=1)
    return new


@dataclass
class ConvRun:
    conv: np.ndarray
    report: BlockReport
    conv_touches: list[Touch]
    qkv_touches: list[Touch]
    conv_base: int
    qkv_base: int


def _run_conv(program: PtxProgram, case: ConvCase, packed: bytes, *, graph: bool = False) -> ConvRun:
    rows, conv = _conv_inputs()
    qkv = _qkv_buffer(case, rows)
    entry = program.entry("gdn_conv_commit_kernel_devE" if graph else "gdn_conv_commit_kernelE")
    m = Machine()
    at_qkv, at_conv = m.put(qkv), m.put(conv)
    watches = m.watch(at_conv, conv.nbytes), m.watch(at_qkv, qkv.nbytes)
    plan_arg = m.put(np.frombuffer(packed, dtype=np.uint8)) if graph else packed
    layout = struct.pack("<ii", *case.strides)
    report = m.run_block(entry, [at_qkv, layout, at_conv, CONV_COLUMNS, plan_arg], threads=256,
                         block=(case.block, 0), grid=(C // 256, 1))  # fmt: skip
    return ConvRun(m.get(at_conv, conv), report, watches[0].touches, watches[1].touches, at_conv, at_qkv)


def _conv_faults(run: ConvRun, case: ConvCase, rows: np.ndarray, conv: np.ndarray) -> list[str]:
    """Where the run differs from the documented commit of `case.path` on its block: the bits, and what each
    thread read and wrote (its own channel's columns 0..3, read before written; the qkv rows that enter the
    window)."""
    faults = []
    first = case.block * 256
    want = conv.copy()
    want[first : first + 256] = _conv_after(conv, rows, case.path)[first : first + 256]
    if not np.array_equal(run.conv, want):
        bad = np.argwhere(run.conv != want)
        faults.append(f"{len(bad)} conv_state elements differ, first (channel, column) {tuple(bad[0])}")
    if run.report.races or run.report.unwritten_reads or run.report.barriers or run.report.shuffles:
        faults.append(f"a race, unwritten read, barrier or shuffle: {run.report}")
    rs, cs = case.strides
    n = len(case.path)
    for t in range(256):
        ch = first + t
        own = [(run.conv_base + 2 * (ch * CONV_COLUMNS + j), 2) for j in range(TAPS)]
        mine = [x for x in run.conv_touches if x.thread == t]
        reads = [(x.addr, x.nbytes) for x in mine if not x.write]
        writes = [(x.addr, x.nbytes) for x in mine if x.write]
        if sorted(reads) != own or sorted(writes) != own:
            faults.append(f"thread {t} reads {reads} and writes {writes} of conv_state, not {own} once each")
        elif max(x.seq for x in mine if not x.write) > min(x.seq for x in mine if x.write):
            faults.append(f"thread {t} writes a column before reading them all")
        entering = [case.path[e] for e in range(max(0, n - TAPS), n)]
        qkv_want = sorted((run.qkv_base + 2 * (r * rs + ch * cs), 2) for r in entering)
        qkv_got = sorted((x.addr, x.nbytes) for x in run.qkv_touches if x.thread == t and not x.write)
        if qkv_got != qkv_want:
            faults.append(f"thread {t} reads qkv at {qkv_got}, not {qkv_want}")
        if len(faults) > 4:
            break
    if any(x.write for x in run.qkv_touches):
        faults.append("qkv written")
    return faults


@cache
def _conv_run(arch: str, case: ConvCase, packed: bytes, graph: bool = False) -> ConvRun:
    return _run_conv(_program(arch), case, packed, graph=graph)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_conv_commits_ptx_shifts_the_window_by_the_path(arch: str, layout: str, n: int, emulated) -> None:
    case = _conv_case(layout, n)
    rows, conv = _conv_inputs()
    got = _conv_run(arch, case, _commit_plan(emulated, case.path))
    assert _conv_faults(got, case, rows, conv) == []
    # the check can fail: the same commit one path row off (the rows shifted by one input row) is rejected
    off = ConvCase(case.layout, tuple((r + 1) % INPUT_ROWS for r in case.path), case.block)
    assert _conv_faults(got, off, rows, conv) != []


def test_the_conv_commit_reference_is_the_repositorys() -> None:
    """`_conv_after` is elpis.exl3.gdn_tree_ref.reference_commit's window, for a commit past the window."""
    inp = ref.random_inputs(6, seed=5)
    path = [0, 3, 1, 5, 2]
    _, _, want = ref.reference_commit(*inp.tensors(), path)
    rows = _i16(inp.qkv).view(np.uint16)
    got = _conv_after(_i16(inp.conv_state).view(np.uint16), rows, tuple(path))
    assert np.array_equal(got, _i16(want).view(np.uint16))


def test_the_conv_commits_graph_form_reads_the_plan_from_memory(emulated) -> None:
    """gdn_conv_commit_kernel_dev (the plan through a pointer), sm_86 and sm_90, 5 rows channel-major and 2
    token-major: the same bits and accesses as the by-value launch."""
    for arch in nvcc.ARCHS:
        for case in (_conv_case("channel", 5), _conv_case("token", 2)):
            rows, conv = _conv_inputs()
            packed = _commit_plan(emulated, case.path)
            got = _conv_run(arch, case, packed, graph=True)
            assert _conv_faults(got, case, rows, conv) == []
            assert np.array_equal(got.conv, _conv_run(arch, case, packed).conv)


@pytest.mark.parametrize(
    ("what", "pattern", "old", "new"),
    [("column 2 stored into column 4", r"st\.global\.u16\s+\[%rd\d+\+4\]", "+4]", "+8]"),
     ("column 1 read from the next path row", r"ld\.param\.s8\s+%rd\d+, \[%rd\d+\+1\]", "+1]", "+2]")],
)  # fmt: skip
def test_a_conv_commit_ptx_with_a_wrong_column_or_row_is_caught(
    what: str, pattern: str, old: str, new: str, emulated
) -> None:
    """sm_86 PTX of gdn_conv_commit_kernel with one store or one in_row read moved (`what`; the one line of
    the entry matching `pattern`), 5 rows channel-major: `_conv_faults` rejects it."""
    text = _ptx_text("sm_86")
    lines = text.splitlines()
    (hit,) = [i for i in entry_lines(text, "gdn_conv_commit_kernelE") if re.search(pattern, lines[i])]
    lines[hit] = lines[hit].replace(old, new)
    case = _conv_case("channel", 5)
    rows, conv = _conv_inputs()
    got = _run_conv(PtxProgram("\n".join(lines)), case, _commit_plan(emulated, case.path))
    assert _conv_faults(got, case, rows, conv) != [], what
