"""The Gated DeltaNet gate projections' kernels (patches/kernels/gdn_ba_rows.cu: launch 1 a block of 128
threads per (group of 4 columns, span of 1024 of k), each thread's chunk of 8 by fmaf, a shfl.sync xor
butterfly in each warp, the warps through shared memory; launch 2 the spans) as nvcc compiles them for
sm_86 and sm_90, run block by block, every thread, by the PTX interpreter's block mode
(tests/kernels/ptx_interp.py).

On fp16 inputs of mixed magnitudes (so that the fp32 sums round and their order shows in the bits), read
through a row stride padded with NaNs, for k = 2600 (three spans, the last partial: 69 threads hold values,
warp 2 partly), k = 5120 (the model's: five full spans), k = 8 (one thread holds values) and 1, 2, 3, 5 and 16
rows over one and two column blocks (4 and 8 columns, not the model's 96):
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
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram
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


def _run(program: PtxProgram, x: np.ndarray, wt: np.ndarray) -> Outputs:
    """Both launches as elpis_gdn_ba_rows makes them: grid (column blocks, spans) of span blocks, then
    ceil(rows * columns / 128) sum blocks, every block run by the interpreter in grid order. x is read
    through a stride of k + 8 whose last 8 values are NaN; scratch and outputs start as NaN."""
    rows, k = x.shape
    columns = wt.shape[0]
    nv = columns // 2
    spans = -(-k // gdn_ba.SPAN)
    column_blocks = columns // gdn_ba.COLUMNS_PER_BLOCK
    padded = np.full((rows, k + 8), np.nan, dtype=np.float16)
    padded[:, :k] = x
    m = Machine()
    at_x, at_wt = m.put(padded.view(np.int16)), m.put(wt.view(np.int16))
    at_partials = m.put(np.full((spans, rows, columns), np.nan, dtype=np.float32))
    b, a = np.full((rows, nv), np.nan, dtype=np.float32), np.full((rows, nv), np.nan, dtype=np.float32)
    at_b, at_a = m.put(b), m.put(a)
    span_kernel, sum_kernel = program.entry("gdn_ba_span_kernel"), program.entry("gdn_ba_sum_kernel")
    span_reports = [
        m.run_block(span_kernel, [at_x, k + 8, at_wt, k, columns, rows, at_partials], threads=THREADS,
                    block=(c, s), grid=(column_blocks, spans))
        for s in range(spans) for c in range(column_blocks)
    ]  # fmt: skip
    sum_blocks = -(-rows * columns // SUM_THREADS)
    sum_reports = [
        m.run_block(sum_kernel, [at_partials, spans, nv, rows, at_b, at_a], threads=SUM_THREADS,
                    block=(i, 0), grid=(sum_blocks, 1))
        for i in range(sum_blocks)
    ]  # fmt: skip
    return Outputs(m.get(at_b, b), m.get(at_a, a), span_reports, sum_reports)


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


def _reference(x: np.ndarray, wt: np.ndarray, order: Order = DOCUMENTED) -> tuple[np.ndarray, np.ndarray]:
    """b and a summed in `order`: thread t of span s takes k's values 1024 s + 8 t .. + 7 (zeros past k, as
    the kernel loads them), fmaf'd into +0; each warp's 32 thread sums fold by the xor butterfly (lane l adds
    lane l ^ d's value to its own, for each distance d), lane 0's result is the warp's sum; the block adds
    its warps' sums; launch 2 the spans'."""
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
    span_order = range(spans) if order.spans_ascending else reversed(range(spans))
    total = None
    for s in span_order:
        total = per_span[..., s] if total is None else total + per_span[..., s]
    nv = columns // 2
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
