"""The Gated DeltaNet tree kernel (patches/kernels/gdn_tree.cu, entry gdn_tree_kernel: one block of 256
threads per (16-column slice, value head)) as nvcc compiles it for sm_86 and sm_90, run block by block, every
thread, by the PTX interpreter's block mode (tests/kernels/ptx_interp.py) with approximate math opted in
(expf, in the conv's SiLU and the decay, is ex2.approx there: correctly rounded by the interpreter, which is
one result PTX allows, not necessarily the GPU's bits).

One block per tree (the blocks' arithmetic differs only in the head and columns it reads): on sm_86 and sm_90
the four first trees, of 4, 5, 6 and 16 rows (a chain, a star, a branching tree that parks one state and the
16-row tree that parks 3 at once); on sm_86 17 further trees, on sm_90 3 of them (t1, rev8-51, seeded16-1;
CPU time): every legal tree of 1 to 4 rows (10), three of the build check's 60 seeded 16-row trees
(elpis.bend.gdn_plan.table_trees: the first uniform one, the first parking 2 states, the first deep one), the
16-row star and chain, and the first 7- and 8-row shapes whose reversed numbering (the build check's) parks 2
states. Each further tree runs on a block of its own; together they take every slice 0..7, every key head
(head // 3) 0..15, every place of a value head in its group of 3 and head 47 (21 distinct blocks in all):
- every thread meets both barriers and every shuffle; no shared byte is read before a thread wrote it; the
  race detector finds no race (see below for the one it found);
- the walk executes the plan: each thread's loads and stores of the on-chip stack (`s_stack`) and the rows
  whose gates and q/k/v it reads, in program order between the second barrier and the end, are, visit by
  visit, the 8 loads of slot `load[v]` (none for -1), row `order[v]`, the 8 stores into slot `store[v]` (none
  for -1), every stack access at the thread's own lane-private place (the plan from build/kernels/gdn_plan.h
  through the kernel's host glue, packed as the launch argument);
- the outputs of the block's 16 columns agree with the kernel's source run on the CPU (tests/kernels/
  cuda_emu.py, whose expf is the CPU's) within a bound that the approximate expf explains (see `_close`), and
  nothing outside them is written.
The graph form (gdn_tree_kernel_dev, the plan read from device memory) walks the star the same way on sm_86,
with the by-value launch's output bits. The trace check can fail: a plan with two visits swapped is not what
the PTX ran, and a PTX with the walk's store of one state element moved to another element's place is caught.
The output check can fail where the walk is right: a PTX taking the q/k head as head // 4, and one reading the
state and v channels of slice s ^ 1 while writing slice s, are caught.

Not run here: the commit (state_out, the conv commit kernels) and the bf16 output, which
tests/kernels/test_gdn_commit_ptx.py runs; the channel-major qkv layout in the walk (only token-major strides
(10240, 1)); per call one block, never two together (363 of the 384 blocks run in no
call, and no tree runs on more than one block); other trees: trees of 5 to 15 rows but the 5-row star, the
6-row branch and the two 7- and 8-row trees, 16-row trees but the 6 here, on sm_90 every further tree but 3;
the graph form on any tree but the star, and on sm_90; expf's bits (the comparison is a tolerance, not bits);
ptxas and SASS.

The race this check found: until session 46, with rows other than 4 and 16, the warps whose (row, q|k) pair
is past 2 rows read row 0 of `s_qk` as a dummy (`normalise_pairs`, `pair < 2 * rows ? pair >> 1 : 0`) while
warps 0 and 1 normalised row 0 in place, between the same two barriers. The values read were never used, but
it was a data race in PTX's memory model. Those pairs now run on zeros and read nothing; the test asserts no
race for every tree.
"""

from __future__ import annotations

import ctypes
import re
import struct
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
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, Touch
from tests.nvcc_marks import needs_nvcc

pytestmark = [needs_nvcc, pytest.mark.usefixtures("one_torch_thread")]

THREADS, SLICE, PER_LANE, SLOTS = 256, 16, 8, 3  # the kernel's block, columns a block, state rows a lane
SOURCE_TEXT = gdn_tree.SOURCE.read_text()


def _source_line(statement: str) -> int:
    """The 1-based line of gdn_tree.cu holding `statement` (exactly one)."""
    found = [i + 1 for i, line in enumerate(SOURCE_TEXT.splitlines()) if statement in line]
    assert len(found) == 1, (statement, found)
    return found[0]


STACK_STORE = _source_line("s_stack[(store * kPerLane + i) * kThreads + t] = st[i];")


@dataclass(frozen=True)
class Case:
    name: str
    parents: tuple[int, ...]
    block: tuple[int, int]  # (slice, value head)
    seed: int
    slots: int | None = None  # the stack slots its plan parks in at once (None: not asserted)


CASES = [
    Case("chain4", (-1, 0, 1, 2), (0, 0), 1),
    Case("star5", (-1, 0, 0, 0, 0), (3, 25), 2),
    Case("branch6", (-1, 0, 0, 1, 1, 2), (7, 47), 3),
    Case("stack3-16", (-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14), (5, 10), 4, slots=3),
]

# ---- more trees, each on a block of its own -------------------------------------------------------------
# The build check's trees (elpis.bend.gdn_plan.table_trees): its 16-row trees are 48 uniform then 12 deep
# seeded ones, then 4 named ones (the tree parking 3, a binary tree, the star, the chain).
TABLE_16 = [tuple(t) for t in gdn_plan.table_trees() if len(t) == gdn_plan.MAX_ROWS]
SEEDED_16, NAMED_16 = TABLE_16[:60], TABLE_16[60:]
STAR_16, CHAIN_16 = (-1, *[0] * 15), (-1, *range(15))
assert len(TABLE_16) == 64 and NAMED_16[2:] == [STAR_16, CHAIN_16], NAMED_16


def _reversed(rows: int, shape: int) -> tuple[int, ...]:
    """Shape `shape` of `rows` rows in the build check's reversed numbering (children last to first)."""
    return tuple(gdn_plan._renumbered_reversed(gdn_plan.shapes(rows)[shape]))


def _small_name(parents: list[int]) -> str:
    """t<rows>-<parents of rows 1..>: t4-001 is [-1, 0, 0, 1]."""
    return f"t{len(parents)}" + (f"-{''.join(map(str, parents[1:]))}" if len(parents) > 1 else "")


# (name, parents, slots): every legal tree of 1 to 4 rows; the first uniform seeded 16-row tree, the first
# that parks 2 states and the first deep one (depth 9); the 16-row star and chain; the first 7- and 8-row
# shapes (gdn_plan.shapes) whose reversed numbering parks 2 states (their preorder numbering parks 1)
MORE_TREES = [
    *((_small_name(t), tuple(t), None) for rows in range(1, 5) for t in gdn_plan.every_tree(rows)),
    ("seeded16-0", SEEDED_16[0], 1),
    ("seeded16-1", SEEDED_16[1], 2),
    ("deep16-48", SEEDED_16[48], 1),
    ("star16", STAR_16, 1),
    ("chain16", CHAIN_16, 0),
    ("rev7-34", _reversed(7, 34), 2),
    ("rev8-51", _reversed(8, 51), 2),
]


def _spread(i: int) -> tuple[int, int]:
    """The block of the i-th further tree: key heads 0..15 in turn, each at place (i + 2) % 3 of its group of
    3 value heads (so head 47 is the 16th), slices 7 down to 0 in turn."""
    return 7 - i % 8, 3 * (i % ref.KEY_HEADS) + (i + 2) % 3


MORE = [Case(name, parents, _spread(i), 10 + i, slots) for i, (name, parents, slots) in enumerate(MORE_TREES)]
# sm_90 runs a subset (CPU time): the 1-row tree, the 8-row tree and a 16-row tree that park 2 states
SM90_MORE = ("t1", "rev8-51", "seeded16-1")
RUNS = [(arch, c) for c in CASES for arch in nvcc.ARCHS] + [
    (arch, c) for c in MORE for arch in nvcc.ARCHS if arch == "sm_86" or c.name in SM90_MORE
]


@cache
def _ptx_text(arch: str) -> str:
    return nvcc.compile_to(gdn_tree.SOURCE, "ptx", arch=arch).read_text()


@cache
def _program(arch: str) -> PtxProgram:
    return PtxProgram(_ptx_text(arch))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The kernel's source built for the CPU (cuda_emu): its host glue gives the plan, its kernel the
    reference outputs."""
    build = tmp_path_factory.mktemp("gdn_ptx_emu")
    return gdn_tree.bind(
        cuda_emu.build_emulated(gdn_tree.SOURCE, build, launches=5, needs=(gdn_plan.HEADER,))
    )


@dataclass(frozen=True)
class PlanBytes:
    plan: gdn_tree.Plan
    packed: bytes  # the GdnTreePlan struct, as the launch passes it by value


def _plan(lib: ctypes.CDLL, parents: tuple[int, ...]) -> PlanBytes:
    masks = accept.tree_masks(list(parents))
    buf = (ctypes.c_uint8 * gdn_tree.PLAN_CAPACITY)()
    size = lib.elpis_gdn_tree_plan_pack(
        len(parents), gdn_tree._i32(masks.depth), gdn_tree._u32(masks.ancestors), buf, gdn_tree.PLAN_CAPACITY
    )
    assert size == 136, size
    return PlanBytes(gdn_tree.plan(masks.depth, masks.ancestors, lib=lib), bytes(buf)[:size])


def _i16(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.int16).numpy()


@dataclass
class Run:
    out: np.ndarray  # fp32 [rows, 48, 128]: NaN outside the block's columns
    report: BlockReport
    walk: dict[int, list[tuple]]  # thread: its walk's events (`_events`)


def _run(program: PtxProgram, case: Case, packed: bytes, *, graph: bool = False) -> Run:
    """Block `case.block` of gdn_tree_kernel on random_inputs (token-major qkv, fp32 out only), with the
    shared arrays the walk reads watched."""
    rows = len(case.parents)
    inp = ref.random_inputs(rows, seed=case.seed)
    entry = program.entry("gdn_tree_kernel_devENS" if graph else "gdn_tree_kernelENS")
    m = Machine(size=1 << 23, approximate=True)
    at = [m.put(a) for a in (_i16(inp.qkv), _i16(inp.beta), inp.g.numpy(), _i16(inp.conv_weight),
                             _i16(inp.conv_state), inp.state.numpy())]  # fmt: skip
    out = np.full((rows, ref.VALUE_HEADS, ref.HEAD_DIM), np.nan, dtype=np.float32)
    at_out = m.put(out)
    # GdnTreeArgs: qkv, layout (row, channel strides), beta, g, conv_weight, conv_state, conv_stride,
    # state_in, state_out (null: no commit), out, out_bf16 (null)
    args = struct.pack("<QiiQQQQi4xQQQQ", at[0], ref.CONV_DIM, 1, *at[1:5], inp.conv_state.shape[1], at[5], 0,
                       at_out, 0)  # fmt: skip
    assert len(args) == entry.params[0][1]
    arrays = {name: m.symbol(entry, name) for name in ("s_stack", "s_decay", "s_beta", "s_qk", "s_v")}
    watches = {name: m.watch(*where) for name, where in arrays.items()}
    plan_arg = m.put(np.frombuffer(packed, dtype=np.uint8)) if graph else packed  # the graph form: a pointer
    report = m.run_block(
        entry, [args, plan_arg], threads=THREADS, block=case.block, grid=(8, ref.VALUE_HEADS)
    )
    touches = {name: w.touches for name, w in watches.items()}
    # the walk runs after the body's second barrier (the graph form's first barrier publishes the plan)
    walk = _events(touches, {n: a for n, (a, _) in arrays.items()}, 3 if graph else 2)
    return Run(m.get(at_out, out), report, walk)


# row-major pitch in bytes of the arrays the walk reads by row: s_qk [16][256], s_v [16][16], s_decay/s_beta
ROW_BYTES = {"s_qk": 4 * 2 * ref.HEAD_DIM, "s_v": 4 * SLICE, "s_decay": 4, "s_beta": 4}


def _events(touches: dict[str, list[Touch]], base: dict[str, int], walk: int) -> dict[int, list[tuple]]:
    """Per thread, in its program order, what the walk (after the block's `walk`-th barrier) touched:
    ("load" | "store", slot, i) for s_stack element (slot * 8 + i) * 256 + thread (an access at another
    thread's place is kept as ("foreign", ...)), and ("row", r) for a read of row r of s_qk, s_v, s_decay or
    s_beta, consecutive reads of one row as one event."""
    per: dict[int, list[tuple]] = {}
    stamped = sorted(
        ((x, name) for name, xs in touches.items() for x in xs if x.barriers == walk), key=lambda p: p[0].seq
    )
    for x, name in stamped:
        off = x.addr - base[name]
        if name == "s_stack":
            assert x.nbytes == 4 and off % 4 == 0
            element = off // 4
            slot, i, place = element // (PER_LANE * THREADS), element // THREADS % PER_LANE, element % THREADS
            kind = ("store" if x.write else "load") if place == x.thread else "foreign"
            per.setdefault(x.thread, []).append((kind, slot, i))
        else:
            assert not x.write, (name, x)
            event = ("row", off // ROW_BYTES[name])
            per.setdefault(x.thread, [])
            if not per[x.thread] or per[x.thread][-1] != event:
                per[x.thread].append(event)
    return per


def _prescribed(plan: gdn_tree.Plan) -> list[tuple]:
    """The walk's events the plan prescribes for every thread: per visit v, the loads of slot load[v], row
    order[v], the stores into slot store[v]."""
    events: list[tuple] = []
    for r, load, store in zip(plan.order, plan.load, plan.store, strict=True):
        events += [("load", load, i) for i in range(PER_LANE)] if load >= 0 else []
        events.append(("row", r))
        events += [("store", store, i) for i in range(PER_LANE)] if store >= 0 else []
    return events


def _source_of(ptx: str) -> dict[int, int]:
    """PTX line (1-based) -> the gdn_tree.cu line of the last `.loc 1 N` before it."""
    out, current = {}, 0
    for i, line in enumerate(ptx.splitlines(), start=1):
        m = re.match(r"\s*\.loc\s+1\s+(\d+)\s", line)
        if m:
            current = int(m.group(1))
        out[i] = current
    return out


def _check_races(arch: str, case: Case, report: BlockReport) -> None:
    """No race between any two threads, and no shared read before a write."""
    assert report.races == [], (arch, len(case.parents), report.races[:3])
    assert report.unwritten_reads == []


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    """The interpreter's expf (2^x correctly rounded inside nvcc's expf sequence) and the CPU's differ by a
    few ulp of each SiLU and decay; carried through the conv's normalisation and at most 16 steps of the
    rule that is a relative change of order 1e-6 of each row's inputs, so the outputs (|o| ~ 0.03) agree to
    2e-6 absolute plus 1e-4 relative; a wrong slot, row or order moves them by their own size."""
    return bool(np.all(np.abs(got - want) <= 2e-6 + 1e-4 * np.abs(want)))


def _emulated_out(lib: ctypes.CDLL, case: Case) -> np.ndarray:
    rows = len(case.parents)
    inp = ref.random_inputs(rows, seed=case.seed)
    masks = accept.tree_masks(list(case.parents))
    lib.emu_set_blocks(1, gdn_tree._i32(list(case.block)))
    out = torch.full((rows, ref.VALUE_HEADS, ref.HEAD_DIM), float("nan"))
    err = lib.elpis_gdn_tree_verify(
        inp.qkv.data_ptr(), ref.CONV_DIM, 1, inp.beta.data_ptr(), inp.g.data_ptr(),
        inp.conv_weight.data_ptr(),
        inp.conv_state.data_ptr(), inp.conv_state.shape[1], inp.state.data_ptr(), rows,
        gdn_tree._i32(masks.depth), gdn_tree._u32(masks.ancestors), out.data_ptr(), None, None,
    )  # fmt: skip
    assert err == 0
    return out.numpy()


def _columns(x: np.ndarray, case: Case) -> np.ndarray:
    s, h = case.block
    return x[:, h, s * SLICE : (s + 1) * SLICE]


@cache
def _run_case(arch: str, case: Case, packed: bytes) -> Run:
    return _run(_program(arch), case, packed)


# ---- the tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "case"), [pytest.param(a, c, id=f"{a}-{c.name}") for a, c in RUNS])
def test_the_kernels_ptx_walks_the_plan(arch: str, case: Case, emulated) -> None:
    plan = _plan(emulated, case.parents)
    got = _run_case(arch, case, plan.packed)
    assert got.report.barriers == 2
    # 8 shuffles a visit (dot and output, distances 8 4 2 1) + the last output's 4; the norms' 5 a pair it
    # holds; counted once per warp
    norms = 5 * (1 if 2 * len(case.parents) <= 8 else 4)
    assert got.report.shuffles == (THREADS // 32) * (8 * len(case.parents) + 4 + norms)
    _check_races(arch, case, got.report)
    want = _prescribed(plan.plan)
    assert sorted(got.walk) == list(range(THREADS))
    for t in range(THREADS):
        assert got.walk[t] == want, f"thread {t}: {got.walk[t][:12]} != {want[:12]}"
    if case.slots is not None:  # stack3-16: every slot of the stack is parked in and taken back
        assert plan.plan.max_stack == case.slots <= SLOTS
    emu = _emulated_out(emulated, case)
    mine, theirs = _columns(got.out, case), _columns(emu, case)
    assert np.isfinite(mine).all() and _close(mine, theirs), np.abs(mine - theirs).max()
    # outside the block's columns nothing was written
    rest = got.out.copy()
    s, h = case.block
    rest[:, h, s * SLICE : (s + 1) * SLICE] = 0
    assert np.isnan(rest).sum() == rest.size - len(case.parents) * SLICE


def test_the_graph_forms_ptx_walks_the_plan_it_reads_from_memory(emulated) -> None:
    """gdn_tree_kernel_dev (the CUDA-graph form: thread 0 copies the plan from device memory into shared
    memory, a barrier publishes it) on sm_86, the star: the same walk, the same outputs as the launch with the
    plan as its argument, bit for bit."""
    case = CASES[1]
    plan = _plan(emulated, case.parents)
    got = _run(_program("sm_86"), case, plan.packed, graph=True)
    assert got.report.barriers == 3
    _check_races("sm_86", case, got.report)
    assert all(got.walk[t] == _prescribed(plan.plan) for t in range(THREADS))
    by_value = _run_case("sm_86", case, plan.packed).out
    assert got.out.tobytes() == by_value.tobytes()


def test_a_plan_with_two_visits_swapped_is_not_what_the_ptx_ran(emulated) -> None:
    """The trace comparison can fail: the branching tree's plan with visits 1 and 2 swapped (their rows,
    loads and stores) differs from what the sm_86 PTX executed, for every thread."""
    case = CASES[2]
    plan = _plan(emulated, case.parents)
    got = _run_case("sm_86", case, plan.packed)
    p = plan.plan
    swap = [0, 2, 1, *range(3, len(p.order))]
    swapped = gdn_tree.Plan(
        *(tuple(x[i] for i in swap) for x in (p.order, p.load, p.store)), p.src, p.max_stack
    )
    assert swapped != p
    assert all(got.walk[t] != _prescribed(swapped) for t in range(THREADS))
    assert all(got.walk[t] == _prescribed(p) for t in range(THREADS))


def test_a_ptx_storing_one_state_element_elsewhere_is_caught(emulated) -> None:
    """The trace comparison catches a PTX whose walk parks one element of a state at another place: the sm_86
    PTX with the walk's store of element 3 (offset +3072 from element 0) moved to element 4's place (+4096).
    nvcc emits the walk's 8 stores in 4 copies (the loop is duplicated); the move is made in each, so that the
    copy the case runs has it."""
    text = _ptx_text("sm_86")
    lines, where = text.splitlines(), _source_of(text)
    stores = [i for i, line in enumerate(lines) if line.strip().startswith("st.shared.f32") and
              where[i + 1] == STACK_STORE]  # fmt: skip
    assert len(stores) % PER_LANE == 0 and stores, stores
    moved = [i for i in stores if lines[i].strip().endswith(";") and "+3072]" in lines[i]]
    assert len(moved) == len(stores) // PER_LANE, [lines[i] for i in stores]
    for i in moved:
        lines[i] = lines[i].replace("+3072]", "+4096]")
    case = CASES[2]
    plan = _plan(emulated, case.parents)
    got = _run(PtxProgram("\n".join(lines)), case, plan.packed)
    want = _prescribed(plan.plan)
    assert all(got.walk[t] != want for t in range(THREADS))
    assert all(("store", 0, 3) not in got.walk[t] for t in range(THREADS))


def test_the_further_blocks_cover_every_slice_key_head_and_place_in_a_group() -> None:
    """The further trees' blocks: every slice (0..7), every key head (head // 3, 0..15), every place of a
    value head in its group of 3, and the last head, 47."""
    blocks = [c.block for c in MORE]
    assert len(set(blocks)) == len(blocks)
    assert {s for s, _ in blocks} == set(range(8))
    assert {h // 3 for _, h in blocks} == set(range(ref.KEY_HEADS))
    assert {h % 3 for _, h in blocks} == {0, 1, 2} and ref.VALUE_HEADS - 1 in {h for _, h in blocks}


def _mutated(arch: str, old: str, new: str, count: int) -> PtxProgram:
    """The `arch` PTX with each of `count` lines holding `old` (exactly) rewritten to hold `new` instead."""
    lines = _ptx_text(arch).splitlines()
    hits = [i for i, line in enumerate(lines) if old in line]
    assert len(hits) == count, [lines[i] for i in hits]
    for i in hits:
        lines[i] = lines[i].replace(old, new)
    return PtxProgram("\n".join(lines))


def _walks_right_but_computes_wrong(program: PtxProgram, case: Case, emulated) -> None:
    """`program` runs block `case.block` with the plan's walk, no race, and outputs that the check rejects."""
    plan = _plan(emulated, case.parents)
    got = _run(program, case, plan.packed)
    _check_races("sm_86", case, got.report)
    assert all(got.walk[t] == _prescribed(plan.plan) for t in range(THREADS))
    mine, theirs = _columns(got.out, case), _columns(_emulated_out(emulated, case), case)
    assert np.isfinite(mine).all() and not _close(mine, theirs)


def test_a_ptx_reading_the_wrong_key_head_is_caught(emulated) -> None:
    """The output comparison catches a PTX whose q/k head is head // 4 instead of head // 3: the sm_86 PTX
    with the magic of the signed division by 3 in each entry (mul.hi.s32 by ceil(2^32 / 3)) replaced by
    2^32 / 4, on a further tree's block whose head has another key head under // 4."""
    case = next(c for c in MORE if c.name == "t2-0")
    assert case.block[1] // 4 != case.block[1] // 3, case.block
    program = _mutated("sm_86", ", 1431655766;", ", 1073741824;", 2)
    _walks_right_but_computes_wrong(program, case, emulated)


def test_a_ptx_reading_another_slices_state_is_caught(emulated) -> None:
    """The output comparison catches a PTX whose block reads the committed state's columns and the v channels
    of slice s ^ 1 while it writes its outputs to slice s: the sm_86 PTX with the first read of %ctaid.x of
    the by-value entry (the one feeding `s_in` and `v_base`; nvcc reads it again for the outputs) made an xor
    with 1."""
    text = _ptx_text("sm_86")
    lines, where = text.splitlines(), _source_of(text)
    first = next(i for i, line in enumerate(lines) if re.fullmatch(r"\s*mov\.u32\s+%r\d+, %ctaid\.x;", line))
    assert where[first + 2] == _source_line("const float* s_in = a.state_in"), lines[first : first + 3]
    lines[first] = lines[first].replace("mov.u32", "xor.b32").replace("%ctaid.x;", "%ctaid.x, 1;")
    case = next(c for c in MORE if c.name == "t2-0")
    _walks_right_but_computes_wrong(PtxProgram("\n".join(lines)), case, emulated)
