"""The draft candidates' kernels (patches/kernels/draft_candidates.cu: warp butterflies of shfl.sync, then
warp 0 over the warps, and barriers between) as nvcc compiles them for sm_86 and sm_90, run block by block,
every thread, by the PTX interpreter's block mode (tests/kernels/ptx_interp.py).

expf and logf compile to exact fma/mul/add sequences around one ex2.approx.ftz.f32, an approximate
instruction: the interpreter refuses it by default, and these runs opt in (`Machine(approximate=True)`,
2^x correctly rounded, which PTX allows but need not be the GPU's bits). So what is compared is split:
- checked exactly: every block's threads meet at every barrier and every shuffle (all 32 lanes of the full
  mask at the same shfl.sync, each reading its partner's value as it was at the shuffle), no race between
  two barriers, no shared byte read before written, the barriers' count, and the ids (the chain's and the k
  candidates', from integer keys alone) against the exact order (draft_candidates_cases.expected_ids);
- within draft_candidates_cases.LP_TOLERANCE of an fp64 log-softmax, with NaN exactly where it is NaN: the
  log-probabilities, which go through ex2.approx.

The served build (the source's defaults: 256 threads, spans of 1,024 vectors, at most 64 a row) is run on
sm_86's PTX (sm_90's is the same text but for .target, asserted) as the drafter calls it, fp16 and k = 4, on
7 rows of 10,752 logits: a whole span and a last span of 320 vectors, as the model's rows end (their 31 spans
are not run: ~75 s a row); and deleting any of its merge's four bar.sync is reported as a race there too.
"""

from __future__ import annotations

import struct
from functools import cache

import numpy as np
import pytest
import torch

from elpis import nvcc
from elpis.bend import row_spans as rs
from elpis.exl3 import draft_candidates
from tests.kernels.draft_candidates_cases import LP_TOLERANCE, check_packed, one_threads_row, rows
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, PtxUnsupported, barrier_lines
from tests.kernels.served_build import ServedBuild, assert_same_for_both_archs
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

SPAN_VECTORS = 8  # a row of 77 logits: 3 fp32 spans (the last with a single value), 2 fp16 ones
MAX_SPANS = 64  # the source's default: the test builds do not change it
VOCAB = 77
# rows of draft_candidates_cases.rows: random, ties at the top, a NaN, +inf, every logit -inf, -inf among
# numbers, ties across the k-th place
SOME_ROWS = [0, 1, 2, 4, 5, 6, 9]


@cache
def _ptx_text(arch: str, threads: int) -> str:
    defines = {"ELPIS_DRAFT_CANDIDATES_THREADS": threads, "ELPIS_DRAFT_CANDIDATES_SPAN_VECTORS": SPAN_VECTORS}
    return nvcc.compile_to(draft_candidates.SOURCE, "ptx", arch=arch, defines=defines).read_text()


def _padded_rows(dtype: torch.dtype, which: list[int], k: int) -> torch.Tensor:
    """The chosen rows in a stride of a few NaNs more (a multiple of 8 logits: rows 16-byte aligned)."""
    padded = torch.full((len(which), VOCAB + 8 + (-VOCAB) % 8), float("nan"), dtype=dtype)
    padded[:, :VOCAB] = rows(VOCAB, seed=VOCAB + k)[which].to(dtype)
    return padded


def _spans(vocab: int, fp16: bool, span_vectors: int, max_spans: int) -> tuple[int, int]:
    """(count, shift) of a row's spans, as spans_of computes them for a build's span length and cap."""
    total = rs.vectors_of(vocab, fp16)
    shift = rs.shift_of(total, span_vectors.bit_length() - 1, max_spans.bit_length() - 1)
    return rs.count_of(total, shift), shift


def _run(
    program: PtxProgram, threads: int, padded: torch.Tensor, chain: torch.Tensor, k: int, machine: Machine,
    vocab: int = VOCAB, span_vectors: int = SPAN_VECTORS, max_spans: int = MAX_SPANS,
) -> tuple[torch.Tensor, list[BlockReport]]:  # fmt: skip
    """Both launches as elpis_draft_candidates makes them (grid (spans, rows), then a block a row) for rows
    of `vocab` logits and a build of `span_vectors` and `max_spans`: the packed rows [rows, 2 + 2k] and every
    block's report."""
    fp16 = padded.dtype == torch.float16
    n, stride = padded.shape
    count, shift = _spans(vocab, fp16, span_vectors, max_spans)
    m = machine
    logits = m.put(padded.view(torch.int16 if fp16 else torch.int32).numpy())
    at_chain, keys, sums = m.put(chain.numpy()), m.alloc(8 * n * count * k), m.alloc(4 * n * count)
    out = np.full((n, 2 + 2 * k), -7, dtype=np.float32)
    at_out = m.put(out)
    kind = "I6__half" if fp16 else "If"
    span, merge = program.entry(f"span_kernel{kind}"), program.entry(f"merge_kernel{kind}")
    spans = struct.pack("<II", count, shift)  # row_scan::Spans, by value
    reports = [
        m.run_block(span, [logits, stride, vocab, k, spans, keys, sums], threads=threads, block=(s, r),
                    grid=(count, n))
        for r in range(n) for s in range(count)
    ]  # fmt: skip
    reports += [
        m.run_block(merge, [logits, stride, vocab, at_chain, k, count, keys, sums, at_out], threads=threads,
                    block=(r, 0), grid=(n, 1))
        for r in range(n)
    ]  # fmt: skip
    return torch.from_numpy(m.get(at_out, out)), reports


def _chain(n: int, vocab: int = VOCAB) -> torch.Tensor:
    chain = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n))
    chain[-1] = vocab  # outside the vocabulary: a NaN log-probability
    return chain


def _assert_block_reports(reports: list[BlockReport], threads: int, k: int) -> None:
    """Every block: no race, no unwritten read, and the barriers and shuffles its loops imply."""
    warps = threads // 32
    for report in reports:
        assert report.races == [], [str(r) for r in report.races[:3]]
        assert report.unwritten_reads == []
        # block_top: 2 barriers a round, k rounds (twice in a span block), then block_sum's 2
        assert report.barriers in (2 * k + 2, 4 * k + 2)
        # each round: every warp's two 5-level butterflies (a key's two words), then warp 0's; block_sum's
        rounds = (report.barriers - 2) // 2
        assert report.shuffles == rounds * 10 * (warps + 1) + 5 * (warps + 1)


@pytest.mark.parametrize(
    ("threads", "dtype", "k", "which"),
    [(32, torch.float16, 4, SOME_ROWS), (64, torch.float32, 3, SOME_ROWS), (256, torch.float32, 2, [2, 9])],
)
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_kernels_ptx_meets_at_every_barrier_and_shuffle_without_races(
    arch: str, threads: int, dtype: torch.dtype, k: int, which: list[int]
) -> None:
    padded = _padded_rows(dtype, which, k)
    chain = _chain(len(which))
    packed, reports = _run(
        PtxProgram(_ptx_text(arch, threads)), threads, padded, chain, k, Machine(approximate=True)
    )
    assert (
        check_packed(packed, padded[:, :VOCAB], chain, k) <= LP_TOLERANCE
    )  # ids exact, log-probabilities not
    _assert_block_reports(reports, threads, k)


def test_approximate_math_is_refused_by_default() -> None:
    padded = _padded_rows(torch.float32, [0], 1)
    with pytest.raises(PtxUnsupported, match="ex2"):
        _run(PtxProgram(_ptx_text("sm_86", 32)), 32, padded, _chain(1), 1, Machine())


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_deleted_barrier_of_the_merge_is_reported_as_a_race(arch: str) -> None:
    """The merge kernel's four bar.sync (block_top's two, block_sum's two), at two warps: deleting any one
    lets a thread read a shared word another wrote with no barrier between."""
    text = _ptx_text(arch, 64)
    lines = text.splitlines()
    bars = barrier_lines(text, "merge_kernelIf")
    assert len(bars) == 4
    padded = _padded_rows(torch.float32, [0], 2)
    for line in bars:
        cut = lines[:line] + lines[line + 1 :]
        _, reports = _run(PtxProgram("\n".join(cut)), 64, padded, _chain(1), 2, Machine(approximate=True))
        assert any(r.races for r in reports[-1:]), f"{arch}: bar.sync at line {line + 1} deleted, no race"


# ---- the served build: blocks of 256 threads, spans of 1024 vectors, at most 64 a row ----------------------

# A slice of the model's fp16 rows: one whole span (8,192 logits) and a last span of 320 vectors, as long as
# the last of the model's 248,320 (31 spans: 30 whole, the last of 320; no single values, as here).
SERVED_VOCAB = 1024 * 8 + 320 * 8
SERVED_K = 4  # elpis.spec.generate.DEFAULT_DRAFT_TOP_K, what the served trees ask for
# 7 rows, as the drafter's block (elpis.exl3.drafter: depth 7). Of draft_candidates_cases.rows: random; five
# ties at the top (ids 3, 7, 11, 5376 in span 0 beat 10751 in span 1); a NaN; +inf at the last logit; every
# logit -inf; ties across the k-th place. And one_threads_row's: the 16 largest logits are all thread 0's
# (its 16-key list full), so the 4 best come from one thread's list, popped 4 times.
SERVED_ROWS = [0, 1, 2, 4, 5, 9]


SERVED = ServedBuild(draft_candidates.SOURCE, "ELPIS_DRAFT_CANDIDATES", draft_candidates.THREADS)


def _served_rows() -> torch.Tensor:
    """SERVED_ROWS and one_threads_row's row (fp16 [7, SERVED_VOCAB]) in a stride of 8 NaNs more."""
    threads, _, _ = SERVED.geometry()
    edge = rows(SERVED_VOCAB, seed=SERVED_VOCAB)[SERVED_ROWS]
    chosen = torch.cat((edge, one_threads_row(SERVED_VOCAB, threads, 8, seed=5)))
    padded = torch.full((len(chosen), SERVED_VOCAB + 8), float("nan"), dtype=torch.float16)
    padded[:, :SERVED_VOCAB] = chosen.to(torch.float16)
    return padded


def test_the_served_ptx_is_the_same_for_both_archs() -> None:
    """The served-shape tests run sm_86's PTX only: nvcc makes the same text for sm_90 but for its .target
    line, so the run stands for both. The comparison can fail: one instruction changed is another text."""
    assert_same_for_both_archs(SERVED)


@pytest.mark.slow
def test_the_served_build_on_a_slice_of_the_models_rows() -> None:
    """The served build (256 threads, spans of 1,024 vectors, at most 64 a row) as the drafter calls it (fp16
    logits, k = 4) on 7 rows of SERVED_VOCAB logits: a whole span and a last span of 320 vectors, so every
    span block of the model's rows has its like here (each thread's 4 vectors of a whole span, 2 steps of
    two loads in flight; the last span's 1 or 2 vectors a thread), then the merge over 2 spans. Every block
    meets its 2 + 2k or 2 + 4k barriers and every full-mask shuffle, no race, no unwritten read; ids exact,
    log-probabilities within LP_TOLERANCE of fp64. Not run at this shape: the model's 31 spans a row (a row
    would take ~75 s of the interpreter), hence the merge over 31 spans (here 2: each thread still takes at
    most one span and one key, as at 31 x 4 = 124 keys < 256 threads) and ids past 10,751; fp32 logits;
    single values past the last vector (none in the model's rows)."""
    threads, span_vectors, max_spans = SERVED.geometry()
    assert _spans(rs.MODEL_VOCAB, True, span_vectors, max_spans) == (31, 10)
    assert rs.vectors_of(rs.MODEL_VOCAB, True) - 30 * span_vectors == 320
    assert _spans(SERVED_VOCAB, True, span_vectors, max_spans) == (2, 10)
    padded, k = _served_rows(), SERVED_K
    chain = _chain(len(padded), SERVED_VOCAB)
    program = PtxProgram(SERVED.ptx("sm_86"))
    packed, reports = _run(
        program, threads, padded, chain, k, Machine(approximate=True), SERVED_VOCAB, span_vectors, max_spans
    )
    assert check_packed(packed, padded[:, :SERVED_VOCAB], chain, k) <= LP_TOLERANCE
    assert packed[1, 2 : 2 + k].tolist() == [3, 7, 11, SERVED_VOCAB // 2]  # the rows are what they say
    assert packed[3, 2].item() == SERVED_VOCAB - 1  # +inf, in the last span's last vector
    assert len(reports) == 2 * len(padded) + len(padded)
    _assert_block_reports(reports, threads, k)


def test_a_deleted_barrier_of_the_served_merge_is_reported_as_a_race() -> None:
    """The detector can fail at the served block of 256 threads: deleting any of the fp16 merge kernel's four
    bar.sync gives a race, over 31 spans' keys (the model's rows'; arbitrary keys and sums: which bytes a
    thread touches does not depend on them)."""
    threads, _, _ = SERVED.geometry()
    text = SERVED.ptx("sm_86")
    lines = text.splitlines()
    bars = barrier_lines(text, "merge_kernelI6__half")
    assert len(bars) == 4
    spans, k = 31, SERVED_K
    row = _served_rows()[:1]
    for line in bars:
        merge = PtxProgram("\n".join(lines[:line] + lines[line + 1 :])).entry("merge_kernelI6__half")
        m = Machine(approximate=True)
        keys = m.put((np.arange(spans * k, dtype=np.uint64) * 977 + (1 << 40)).astype(np.uint64))
        sums, chain = m.put(np.ones(spans, dtype=np.float32)), m.put(np.array([5], dtype=np.int64))
        args = [m.put(row.view(torch.int16).numpy()), row.shape[1], SERVED_VOCAB, chain, k, spans, keys, sums,
                m.alloc(4 * (2 + 2 * k))]  # fmt: skip
        report = m.run_block(merge, args, threads=threads)
        assert report.races, f"bar.sync at line {line + 1} deleted, no race"
