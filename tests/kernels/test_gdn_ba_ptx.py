"""The Gated DeltaNet gate projections' kernels (patches/kernels/gdn_ba_rows.cu: launch 1 a block of 128
threads per (group of 4 columns, span of 1024 of k), each thread's chunk of 8 by fmaf, a shfl.sync xor
butterfly in each warp, the warps through shared memory; launch 2 the spans) as nvcc compiles them for
sm_86 and sm_90, run block by block, every thread, by the PTX interpreter's block mode
(tests/kernels/ptx_interp.py).

On fp16 inputs of mixed magnitudes (so that the fp32 sums round and their order shows in the bits), read
through a row stride padded with NaNs, for k = 2600 (three spans, the last partial: 69 threads hold values,
warp 2 partly), k = 5120 (the model's: five full spans), k = 8 (one thread holds values) and 1, 2, 3, 5 and 16
rows over one and two column blocks (4 and 8 columns), and at the model's shape (k = 5120, 2 x 48 columns,
16 rows: launch 1 whole at 1 row, on its first and last column blocks at 16; see the served-shape test):
- every block's threads meet at its barrier and at every shuffle (all 32 lanes of the full mask), the race
  detector finds nothing between two barriers, no shared byte is read before a thread wrote it;
- b and a are, bit for bit, a reference written here from the kernel's documented order of every sum (a
  thread's 8 products fmaf'd in ascending order from +0, the butterfly over xor distances 16, 8, 4, 2, 1, the
  4 warp sums in ascending warp order, the spans in ascending order), each operation rounded once;
- a row of a 16-row call has the bits of a 1-row call on that row alone.
The comparison can fail: the reference summed with the spans descending, the warps as a pairwise tree, a
chunk descending or the butterfly's distances ascending gives other bits on these inputs, and so does the
PTX with two warps' shared loads swapped. So the PTX matching the documented order's bits is evidence that
it keeps that order (on these inputs, as this interpreter reads PTX; ptxas and SASS are not run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np
import pytest

from elpis import nvcc
from elpis.exl3 import gdn_ba
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, entry_lines
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

THREADS, CHUNK, WARPS = 128, 8, 4  # launch 1's block, a thread's chunk, warps of a block
SUM_THREADS = 128  # launch 2's block
DISTANCES = (16, 8, 4, 2, 1)  # the butterfly's xor distances, in the kernel's order


@dataclass(frozen=True)
class Case:
    k: int
    nv: int  # 2 * nv columns: b's nv, then a's
    rows: int
    seed: int


CASES = [
    Case(2600, 2, 16, 1),
    Case(2600, 4, 3, 2),
    Case(8, 2, 5, 3),
    Case(2600, 2, 1, 4),
    Case(5120, 2, 2, 5),
]


@cache
def _ptx_text(arch: str) -> str:
    return nvcc.compile_to(gdn_ba.SOURCE, "ptx", arch=arch).read_text()


@cache
def _program(arch: str) -> PtxProgram:
    return PtxProgram(_ptx_text(arch))


def _inputs(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """x fp16 [rows, k] and wt fp16 [2 * nv, k] (b's columns, then a's, as transposed_weights lays them
    out), each value a normal sample scaled by 2^e, e uniform in [-8, 8]: sums that round."""
    rng = np.random.default_rng(case.seed)

    def mixed(shape: tuple[int, int]) -> np.ndarray:
        return (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 9, shape))).astype(np.float16)

    wb, wa = mixed((case.k, case.nv)), mixed((case.k, case.nv))
    return mixed((case.rows, case.k)), np.ascontiguousarray(np.concatenate((wb.T, wa.T), axis=0))


@dataclass
class Outputs:
    b: np.ndarray  # fp32 [rows, nv]
    a: np.ndarray
    span_reports: list[BlockReport]
    sum_reports: list[BlockReport]


Blocks = list[tuple[int, int]]  # launch 1's blocks (column block, span), in the order they are run


def _grid(k: int, columns: int) -> Blocks:
    """Every block of launch 1 in grid order (x fastest): grid (column blocks, spans)."""
    spans = -(-k // gdn_ba.SPAN)
    return [(c, s) for s in range(spans) for c in range(columns // gdn_ba.COLUMNS_PER_BLOCK)]


def _span_launch(
    program: PtxProgram, x: np.ndarray, wt: np.ndarray, blocks: Blocks, start: np.ndarray
) -> tuple[np.ndarray, list[BlockReport]]:
    """Launch 1 as elpis_gdn_ba_rows makes it (grid (column blocks, spans) of 128 threads), of which the
    blocks `blocks` are run by the interpreter: the scratch partials fp32 [spans, rows, columns] after
    them, starting as `start`, and their reports. x is read through a stride of k + 8 whose last 8 values
    are NaN."""
    rows, k = x.shape
    columns = wt.shape[0]
    padded = np.full((rows, k + 8), np.nan, dtype=np.float16)
    padded[:, :k] = x
    m = Machine()
    at_x, at_wt = m.put(padded.view(np.int16)), m.put(wt.view(np.int16))
    at_partials = m.put(start)
    grid = (columns // gdn_ba.COLUMNS_PER_BLOCK, start.shape[0])
    kernel = program.entry("gdn_ba_span_kernel")
    reports = [
        m.run_block(kernel, [at_x, k + 8, at_wt, k, columns, rows, at_partials], threads=THREADS,
                    block=block, grid=grid)
        for block in blocks
    ]  # fmt: skip
    return m.get(at_partials, start), reports


def _sum_launch(
    program: PtxProgram, partials: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[BlockReport]]:
    """Launch 2 as elpis_gdn_ba_rows makes it, every one of its ceil(rows * columns / 128) blocks, on the
    scratch `partials` [spans, rows, columns]: b and a (outputs starting as NaN) and the blocks' reports."""
    spans, rows, columns = partials.shape
    nv = columns // 2
    m = Machine()
    at_partials = m.put(partials)
    b, a = np.full((rows, nv), np.nan, dtype=np.float32), np.full((rows, nv), np.nan, dtype=np.float32)
    at_b, at_a = m.put(b), m.put(a)
    kernel = program.entry("gdn_ba_sum_kernel")
    blocks = -(-rows * columns // SUM_THREADS)
    reports = [
        m.run_block(kernel, [at_partials, spans, nv, rows, at_b, at_a], threads=SUM_THREADS, block=(i, 0),
                    grid=(blocks, 1))
        for i in range(blocks)
    ]  # fmt: skip
    return m.get(at_b, b), m.get(at_a, a), reports


def _run(program: PtxProgram, x: np.ndarray, wt: np.ndarray) -> Outputs:
    """Both launches whole, every block run by the interpreter in grid order; scratch and outputs start as
    NaN."""
    rows, k = x.shape
    columns = wt.shape[0]
    start = np.full((-(-k // gdn_ba.SPAN), rows, columns), np.nan, dtype=np.float32)
    partials, span_reports = _span_launch(program, x, wt, _grid(k, columns), start)
    b, a, sum_reports = _sum_launch(program, partials)
    return Outputs(b, a, span_reports, sum_reports)


@cache
def _run_case(arch: str, case: Case) -> Outputs:
    """A case's run on an arch's PTX, kept: the row invariance test reuses the 16-row one."""
    return _run(_program(arch), *_inputs(case))


# ---- the reference: the documented order, each operation rounded once -------------------------------------


def _nearest_f32(q: Fraction) -> np.float32:
    """The float32 nearest the rational q, ties to an even significand (q finite, well inside the range)."""
    guess = np.float32(float(q))  # float() rounds once to float64, the cast again: at most one step off
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    return min(candidates, key=lambda f: (abs(Fraction(float(f)) - q), int(f.view(np.uint32)) & 1))


def _fmaf(p: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(p, q, c) elementwise (float32 arrays of one shape): p * q + c rounded once to float32. The product
    is exact in float64; where the float64 sum is exact too (TwoSum's error is 0) it is cast once, elsewhere
    the exact rational is rounded."""
    product = p.astype(np.float64) * q.astype(np.float64)
    c64 = c.astype(np.float64)
    total = product + c64
    back = total - product
    exact = (product - (total - back)) + (c64 - back) == 0
    out = total.astype(np.float32)
    for i in zip(*np.nonzero(~exact), strict=True):
        out[i] = _nearest_f32(Fraction(float(product[i])) + Fraction(float(c64[i])))
    return out


@dataclass(frozen=True)
class Order:
    chunk_ascending: bool = True
    distances: tuple[int, ...] = DISTANCES
    warps: str = "ascending"  # or "tree": (w0 + w1) + (w2 + w3)
    spans_ascending: bool = True


DOCUMENTED = Order()
OTHER_ORDERS = {
    "a chunk descending": Order(chunk_ascending=False),
    "the butterfly's distances ascending": Order(distances=(1, 2, 4, 8, 16)),
    "the warps as a pairwise tree": Order(warps="tree"),
    "the spans descending": Order(spans_ascending=False),
}


def _span_sums(x: np.ndarray, wt: np.ndarray, order: Order = DOCUMENTED) -> np.ndarray:
    """Launch 1's partials, fp32 [spans, rows, columns], summed in `order`: thread t of span s takes k's
    values 1024 s + 8 t .. + 7 (zeros past k, as the kernel loads them), fmaf'd into +0; each warp's 32 thread
    sums fold by the xor butterfly (lane l adds lane l ^ d's value to its own, for each distance d), lane 0's
    result is the warp's sum; the block adds its warps' sums."""
    rows, k = x.shape
    columns = wt.shape[0]
    spans = -(-k // gdn_ba.SPAN)
    xs = np.zeros((rows, spans * gdn_ba.SPAN), dtype=np.float32)
    ws = np.zeros((columns, spans * gdn_ba.SPAN), dtype=np.float32)
    xs[:, :k], ws[:, :k] = x, wt  # fp16 to fp32: exact
    # [rows, columns, span, thread, place]
    xv = np.broadcast_to(xs.reshape(rows, 1, spans, THREADS, CHUNK), (rows, columns, spans, THREADS, CHUNK))
    wv = np.broadcast_to(
        ws.reshape(1, columns, spans, THREADS, CHUNK), (rows, columns, spans, THREADS, CHUNK)
    )
    v = np.zeros((rows, columns, spans, THREADS), dtype=np.float32)
    for i in range(CHUNK) if order.chunk_ascending else reversed(range(CHUNK)):
        v = _fmaf(np.ascontiguousarray(xv[..., i]), np.ascontiguousarray(wv[..., i]), v)
    lanes = v.reshape(rows, columns, spans, WARPS, 32)
    for d in order.distances:
        lanes = lanes + lanes[..., np.arange(32) ^ d]  # float32 adds: each rounded once
    w = lanes[..., 0]  # [rows, columns, span, warp]
    if order.warps == "tree":
        per_span = (w[..., 0] + w[..., 1]) + (w[..., 2] + w[..., 3])
    else:
        per_span = w[..., 0]
        for i in range(1, WARPS):
            per_span = per_span + w[..., i]
    return np.ascontiguousarray(per_span.transpose(2, 0, 1))


def _reference(x: np.ndarray, wt: np.ndarray, order: Order = DOCUMENTED) -> tuple[np.ndarray, np.ndarray]:
    """b and a summed in `order`: launch 1's partials (`_span_sums`), then launch 2 adds the spans."""
    per_span = _span_sums(x, wt, order)
    span_order = range(per_span.shape[0]) if order.spans_ascending else reversed(range(per_span.shape[0]))
    total = None
    for s in span_order:
        total = per_span[s] if total is None else total + per_span[s]
    nv = wt.shape[0] // 2
    return total[:, :nv], total[:, nv:]


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).ravel().tolist()


# ---- the tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c.k}-nv{c.nv}-rows{c.rows}")
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_kernels_ptx_sums_in_the_documented_order_without_races(arch: str, case: Case) -> None:
    got = _run_case(arch, case)
    want_b, want_a = _reference(*_inputs(case))
    assert _bits(got.b) == _bits(want_b) and _bits(got.a) == _bits(want_a)
    for report in got.span_reports:
        assert report.races == [], [str(r) for r in report.races[:3]]
        assert report.unwritten_reads == []
        assert report.barriers == 1
        assert report.shuffles == case.rows * gdn_ba.COLUMNS_PER_BLOCK * len(DISTANCES) * WARPS
    for report in got.sum_reports:
        assert report.races == [] and report.unwritten_reads == []
        assert (report.barriers, report.shuffles) == (0, 0)


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_row_of_sixteen_has_the_bits_of_a_one_row_call(arch: str) -> None:
    x, wt = _inputs(CASES[0])
    many = _run_case(arch, CASES[0])
    for r in (0, 11):
        one = _run(_program(arch), x[r : r + 1], wt)
        assert _bits(one.b) == _bits(many.b[r]) and _bits(one.a) == _bits(many.a[r]), f"row {r}"


@pytest.mark.parametrize("name", sorted(OTHER_ORDERS))
def test_another_order_gives_other_bits_on_these_inputs(name: str) -> None:
    """The bitwise check above can fail: summed in another order, the reference differs from the documented
    order's somewhere on the cases' inputs."""
    differs = []
    for case in CASES:
        x, wt = _inputs(case)
        b, a = _reference(x, wt)
        ob, oa = _reference(x, wt, OTHER_ORDERS[name])
        differs.append(_bits(ob) != _bits(b) or _bits(oa) != _bits(a))
    assert any(differs), f"{name}: the same bits as the documented order on every case"


def test_the_reference_is_close_to_float64() -> None:
    """The reference itself is a sum of the products: within fp32 accumulation of the exact dot products."""
    for case in CASES:
        x, wt = _inputs(case)
        b, a = _reference(x, wt)
        x64, w64 = x.astype(np.float64), wt.astype(np.float64)
        exact, scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
        got = np.concatenate((b, a), axis=1).astype(np.float64)
        assert np.all(np.abs(got - exact) <= 1e-5 * scale), case


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_ptx_adding_its_warps_in_another_order_gives_other_bits(arch: str) -> None:
    """The comparison catches a PTX that sums in another order: with the addresses of warp 1's and warp 3's
    sums swapped in the span kernel's four shared loads (so it adds w0 + w3 + w2 + w1), the 1-row case's
    outputs are no longer the reference's."""
    lines = _ptx_text(arch).splitlines()
    loads = [i for i, line in enumerate(lines) if line.strip().startswith("ld.shared.f32")]
    offsets = sorted(re.search(r"\[%r\d+(\+\d+)?\]", lines[i]).group(1) or "" for i in loads)
    assert offsets == ["", "+256", "+512", "+768"]  # warp_sums[w][r][c]: 16 rows x 4 columns x 4 bytes a warp
    swap = {"+256]": "+768]", "+768]": "+256]"}
    for i in loads:
        lines[i] = re.sub(r"\+(256|768)\]", lambda m: swap[m.group(0)], lines[i])
    case = CASES[3]
    x, wt = _inputs(case)
    got = _run(PtxProgram("\n".join(lines)), x, wt)
    assert all(r.races == [] for r in got.span_reports)
    want_b, want_a = _reference(x, wt)
    assert _bits(got.b) != _bits(want_b) or _bits(got.a) != _bits(want_a)


# ---- the served shape: the model's 2 x 48 columns, k = 5120, 16 rows ---------------------------------------

SERVED = Case(5120, 48, 16, 6)  # 24 column blocks x 5 full spans = launch 1's 120 blocks; b columns 0-47
SERVED_ALONE = (0, 15)  # rows of the 16 also run as 1-row calls


def _served_column_blocks(nv: int) -> tuple[int, ...]:
    """Launch 1's column blocks run at 16 rows: the first and the last (the ends of the grid, of wt and of
    each row of the scratch), and a block holding both b's last column and a's first if there is one. At
    nv = 48 there is none: b|a falls between blocks 11 and 12, and launch 1 does not see it (a block reads
    its 4 rows of wt whichever half they are in); launch 2, which splits the columns at nv, is run whole."""
    per = gdn_ba.COLUMNS_PER_BLOCK
    straddles = {(nv - 1) // per} if (nv - 1) // per == nv // per else set()
    return tuple(sorted({0, 2 * nv // per - 1} | straddles))


def _same_entry(a: str, b: str, name: str) -> bool:
    """Whether PTX texts a and b hold the same text for the one entry named like `name`."""

    def body(text: str) -> list[str]:
        lines = text.splitlines()
        return [lines[i] for i in entry_lines(text, name)]

    return body(a) == body(b)


@cache
def _served_launch_1(rows: tuple[int, ...], whole: bool) -> tuple[np.ndarray, list[BlockReport], Blocks]:
    """Launch 1 on sm_86's PTX for SERVED's `rows` alone: every block (`whole`), or every span of the column
    blocks of `_served_column_blocks`. The scratch starts as the reference's partials with the run blocks'
    entries NaN, so launch 2 reads the PTX's partials where run and the reference's elsewhere. Returns the
    scratch after it, the run blocks' reports and which blocks ran."""
    x, wt = _inputs(SERVED)
    x = x[list(rows)]
    grid = _grid(SERVED.k, 2 * SERVED.nv)
    chosen = set(_served_column_blocks(SERVED.nv))
    blocks = grid if whole else [(c, s) for c, s in grid if c in chosen]
    start = _span_sums(x, wt)
    per = gdn_ba.COLUMNS_PER_BLOCK
    for c, s in blocks:
        start[s, :, c * per : (c + 1) * per] = np.nan
    partials, reports = _span_launch(_program("sm_86"), x, wt, blocks, start)
    return partials, reports, blocks


def test_launch_1s_ptx_is_the_same_for_both_archs() -> None:
    """The served-shape test runs launch 1 on sm_86's PTX only (its sm_90 run would double the longest test
    of this file): nvcc makes the span kernel's entry the same text for sm_90, so the run stands for both.
    (The sum kernel's PTX differs between them, in its registers' order: it is run on both.) The comparison
    can fail: one fma's rounding changed in the entry is another text."""
    sm86, sm90 = _ptx_text("sm_86"), _ptx_text("sm_90")
    assert _same_entry(sm86, sm90, "gdn_ba_span_kernel")
    assert not _same_entry(sm86, sm86.replace("fma.rn.f32", "fma.rz.f32", 1), "gdn_ba_span_kernel")


@pytest.mark.slow
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_served_shape_sums_in_the_documented_order_without_races(arch: str) -> None:
    """At the model's shape (k = 5120, 2 x 48 columns: launch 1's grid of 24 column blocks x 5 spans), on
    sm_86's PTX for launch 1 (the same text as sm_90's: the test above) and `arch`'s for launch 2, three
    calls (about 40 s of the interpreter):
    - the 16 rows, launch 1 run on its first and last column blocks, 0 and 23 (b's columns 0-3, a's 44-47),
      every span of each: 10 of its 120 blocks (`_served_column_blocks` says why no other);
    - row 0 alone, launch 1 whole (all 120 blocks);
    - row 15 alone, launch 1 on the same 10 blocks as the 16 rows.
    Launch 2 is run whole (12 blocks at 16 rows, 1 at one), over scratch that is the PTX's partials where
    launch 1 ran and the reference's elsewhere. Checked: every run block meets its barrier and every
    shuffle, no race, no unwritten shared read; the run blocks' partials are, bit for bit, the documented
    order's span sums; b and a are the reference's bits on every column (where launch 1 did not run, that
    checks launch 2 alone); on the run columns, rows 0 and 15 of the 16-row call have the bits of the 1-row
    calls. Not run at 16 rows: launch 1's other 110 blocks (they differ from those run only in blockIdx.x,
    the rows of wt they read and the scratch places they write; each is run at 1 row)."""
    x, wt = _inputs(SERVED)
    nv = SERVED.nv
    calls = {"16 rows": (tuple(range(SERVED.rows)), False), "row 0": ((0,), True), "row 15": ((15,), False)}
    outputs = {}
    for name, (rows, whole) in calls.items():
        partials, reports, blocks = _served_launch_1(rows, whole)
        assert len(blocks) == (120 if whole else 10)
        assert _bits(partials) == _bits(_span_sums(x[list(rows)], wt)), name
        for report in reports:
            assert report.races == [] and report.unwritten_reads == [], [str(r) for r in report.races[:3]]
            assert report.barriers == 1
            assert report.shuffles == len(rows) * gdn_ba.COLUMNS_PER_BLOCK * len(DISTANCES) * WARPS
        b, a, sum_reports = _sum_launch(_program(arch), partials)
        assert len(sum_reports) == -(-len(rows) * 2 * nv // SUM_THREADS)
        for report in sum_reports:
            assert report.races == [] and report.unwritten_reads == []
        want_b, want_a = _reference(x[list(rows)], wt)
        assert _bits(b) == _bits(want_b) and _bits(a) == _bits(want_a), name
        outputs[name] = (b, a)
    per = gdn_ba.COLUMNS_PER_BLOCK
    run = [c * per + i for c in _served_column_blocks(nv) for i in range(per)]
    in_b, in_a = [c for c in run if c < nv], [c - nv for c in run if c >= nv]

    def on_run_columns(b: np.ndarray, a: np.ndarray, r: int) -> list[int]:
        return _bits(b[r, in_b]) + _bits(a[r, in_a])

    many = outputs["16 rows"]
    for r in SERVED_ALONE:
        assert on_run_columns(*outputs[f"row {r}"], 0) == on_run_columns(*many, r), f"row {r}"
    # the comparison can fail: the two rows' outputs differ on those columns
    assert on_run_columns(*many, 0) != on_run_columns(*many, 15)


@pytest.mark.parametrize("name", sorted(OTHER_ORDERS))
def test_another_order_gives_other_bits_at_the_served_shape(name: str) -> None:
    """The served-shape comparisons can fail: on its 16 rows, summed in another order the reference's b and a
    differ from the documented order's, and so do its partials for every order inside a span."""
    x, wt = _inputs(SERVED)
    order = OTHER_ORDERS[name]
    assert _bits(np.hstack(_reference(x, wt, order))) != _bits(np.hstack(_reference(x, wt)))
    if order.spans_ascending:
        assert _bits(_span_sums(x, wt, order)) != _bits(_span_sums(x, wt))
