"""The verify epilogue's kernels (patches/kernels/verify_epilogue.cu: a block a span of each row, then a block
a row merging its spans; row_scan.cuh's strides and halving tree) as nvcc compiles them for sm_86 and sm_90,
run block by block, every thread, by the PTX interpreter's block mode (tests/kernels/ptx_interp.py).

On the adversarial rows of verify_epilogue_cases.py (fp32 and fp16, read through a padded stride of NaNs),
for blocks of 32, 64 and 256 threads and spans of 8 vectors (2 or 3 spans a row and single values past the
last vector): every block's threads reach every barrier together (the scheduler refuses otherwise), the race
detector finds no byte written by one thread and read or written by another between two barriers, no shared
byte is read before a thread wrote it, and the ids, flags and digests are greedy_ids', nonfinite_rows' and
logits_digest's. A copy of the PTX with one bar.sync deleted is reported as racing, for every barrier but each
kernel's last one (after its tree's last level only thread 0 reads slot 0, which it wrote itself).

The served build (the source's defaults: 256 threads, spans of 1,024 vectors, at most 64 a row) is run on
sm_86's PTX (sm_90's is the same text but for .target, asserted) on three fp16 rows of the model's whole
vocabulary, 248,320 logits: 31 spans a row, the last of 320 vectors, and the merge over 31; and deleting any
of its kernels' first 8 of 9 bar.sync is reported as a race there too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import pytest
import torch

from elpis import nvcc
from elpis.bend import row_spans as rs
from elpis.exl3 import verify_epilogue
from elpis.spec.integrity import logits_digest, nonfinite_rows
from elpis.spec.sampling import greedy_ids
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, barrier_lines
from tests.kernels.served_build import ServedBuild, assert_same_for_both_archs
from tests.kernels.verify_epilogue_cases import rows
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

SPAN_VECTORS = (
    8  # spans of 2^3 vectors: a row of 77 logits is 3 fp32 spans (19 vectors and a single value), 2 fp16
)
MAX_SPANS = 64
VOCAB = 77
# Rows of verify_epilogue_cases.rows run at 256 threads (every row at 32 and 64): a tie, NaNs, +inf, all -inf,
# signed zeros, the maximum first and last, +inf with NaN, one finite value among -inf.
ROWS_AT_256 = [1, 2, 4, 5, 7, 8, 9, 11, 13]


@cache
def _ptx_text(arch: str, threads: int) -> str:
    defines = {"ELPIS_VERIFY_EPILOGUE_THREADS": threads, "ELPIS_VERIFY_EPILOGUE_SPAN_VECTORS": SPAN_VECTORS}
    return nvcc.compile_to(verify_epilogue.SOURCE, "ptx", arch=arch, defines=defines).read_text()


@dataclass
class Outputs:
    ids: list[int]
    flags: list[int]
    digests: list[int]  # none for fp16 rows
    reports: list[BlockReport] = field(default_factory=list)


def _padded_rows(vocab: int, dtype: torch.dtype, which: list[int] | None = None) -> torch.Tensor:
    """The adversarial rows (or those of `which`) in a stride of a few NaNs more (a multiple of 8 logits, so
    every row starts 16-byte aligned); the kernels must not read past a row."""
    chosen = rows(vocab, seed=vocab) if which is None else rows(vocab, seed=vocab)[which]
    padded = torch.full((len(chosen), vocab + 8 + (-vocab) % 8), float("nan"), dtype=dtype)
    padded[:, :vocab] = chosen.to(dtype)
    return padded


def _spans(vocab: int, fp16: bool, span_vectors: int, max_spans: int) -> tuple[int, int]:
    """(count, shift) of a row's spans, as spans_of computes them for a build's span length and cap."""
    total = rs.vectors_of(vocab, fp16)
    shift = rs.shift_of(total, span_vectors.bit_length() - 1, max_spans.bit_length() - 1)
    return rs.count_of(total, shift), shift


def _run(
    program: PtxProgram, threads: int, padded: torch.Tensor, vocab: int,
    span_vectors: int = SPAN_VECTORS, max_spans: int = MAX_SPANS,
) -> Outputs:  # fmt: skip
    """Both launches as elpis_verify_epilogue makes them (a build of `span_vectors` and `max_spans`): grid
    (spans, rows) of span blocks, then a merge block a row, every block run by the interpreter in grid
    order."""
    fp16 = padded.dtype == torch.float16
    n, stride = padded.shape
    count, shift = _spans(vocab, fp16, span_vectors, max_spans)
    m = Machine()
    logits = m.put(padded.view(torch.int16 if fp16 else torch.int32).numpy())
    span_v, span_i, span_sum = (m.alloc(4 * n * count) for _ in range(3))
    span = program.entry("span_kernelI6__half" if fp16 else "span_kernelIf")
    spans = struct.pack("<II", count, shift)  # row_scan::Spans, passed by value
    reports = [
        m.run_block(span, [logits, stride, vocab, spans, span_v, span_i, span_sum], threads=threads,
                    block=(s, r), grid=(count, n))
        for r in range(n) for s in range(count)
    ]  # fmt: skip
    ids, flags, digests = (np.full(n, -7, dtype=d) for d in (np.int64, np.int32, np.int32))
    at_ids, at_flags, at_digests = m.put(ids), m.put(flags), m.put(digests)
    merge = program.entry("merge_kernel")
    reports += [
        m.run_block(merge, [count, span_v, span_i, span_sum, at_ids, at_flags, 0 if fp16 else at_digests],
                    threads=threads, block=(r, 0), grid=(n, 1))
        for r in range(n)
    ]  # fmt: skip
    got_digests = [] if fp16 else m.get(at_digests, digests).tolist()
    return Outputs(m.get(at_ids, ids).tolist(), m.get(at_flags, flags).tolist(), got_digests, reports)


def _reference(padded: torch.Tensor, vocab: int) -> tuple[list[int], list[int], list[int]]:
    logits = padded[:, :vocab]
    digests = [] if logits.dtype == torch.float16 else logits_digest(logits.contiguous()).tolist()
    return greedy_ids(logits).tolist(), nonfinite_rows(logits).to(torch.int32).tolist(), digests


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("threads", [32, 64, 256])
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_the_kernels_ptx_meets_at_every_barrier_without_races_and_gives_the_reference(
    arch: str, threads: int, dtype: torch.dtype
) -> None:
    padded = _padded_rows(VOCAB, dtype, ROWS_AT_256 if threads == 256 else None)
    got = _run(PtxProgram(_ptx_text(arch, threads)), threads, padded, VOCAB)
    assert (got.ids, got.flags, got.digests) == _reference(padded, VOCAB)
    levels = threads.bit_length() - 1
    for report in got.reports:
        assert report.races == [], [str(r) for r in report.races[:3]]
        assert report.unwritten_reads == []
        assert report.barriers == 1 + levels  # block_best's own barrier, then one a level of the tree


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_deleted_barrier_is_reported_as_a_race(arch: str) -> None:
    """The detector can fail on the real kernels: deleting any one bar.sync of a kernel's PTX but its last
    gives a race; the last is the barrier after the tree's last level, where only thread 0 combines and then
    reads slot 0 itself (so deleting it is not a race, and the outputs stay the reference's)."""
    threads, text = 64, _ptx_text(arch, 64)
    entries = ("merge_kernel", "span_kernelI6__half", "span_kernelIf")
    bars = {name: barrier_lines(text, name) for name in entries}
    for entry, lines in bars.items():
        dtype = torch.float16 if entry == "span_kernelI6__half" else torch.float32
        padded = _padded_rows(VOCAB, dtype, [1])
        assert len(lines) == 1 + 6  # 64 threads: 6 levels
        for k, line in enumerate(lines):
            cut = text.splitlines()
            del cut[line]
            got = _run(PtxProgram("\n".join(cut)), threads, padded, VOCAB)
            races = [r for report in got.reports for r in report.races]
            if k < len(lines) - 1:
                assert races, f"{arch} {entry}: bar.sync {k} deleted, no race reported"
                assert all(r.space == "shared" for r in races)
            else:
                assert races == [] and (got.ids, got.flags, got.digests) == _reference(padded, VOCAB)


# ---- the served build: blocks of 256 threads, spans of 1024 vectors, at most 64 a row ----------------------

SERVED_VOCAB = rs.MODEL_VOCAB  # 248,320 fp16 logits: 31,040 vectors, 31 spans, the last of 320 vectors
# of verify_epilogue_cases.rows: a tie in spans 0, 15 and 30 (id 3); a NaN in span 10 (flagged, no target);
# the maximum at the last logit
SERVED_ROWS = [1, 2, 9]


SERVED = ServedBuild(verify_epilogue.SOURCE, "ELPIS_VERIFY_EPILOGUE", verify_epilogue.THREADS)


def test_the_served_ptx_is_the_same_for_both_archs() -> None:
    """The served-shape tests run sm_86's PTX only (a row of the model's vocabulary takes ~12 s of the
    interpreter): nvcc makes the same text for sm_90 but for its .target line, so the run stands for both.
    The comparison can fail: one instruction changed is another text."""
    assert_same_for_both_archs(SERVED)


@pytest.mark.slow
def test_the_served_build_on_the_models_vocabulary() -> None:
    """The served build (256 threads, spans of 1,024 vectors, at most 64 a row) on fp16 rows of the model's
    248,320 logits: 31 span blocks a row (30 of 1,024 vectors, the last of 320; no single values: 248,320
    is a multiple of 8), then the merge over 31 spans, as device_round calls it (fp16, no digests), on three
    rows of a call, read through a padded stride of NaNs. Every block meets its 9 barriers, no race, no
    unwritten read; ids and flags are greedy_ids' and nonfinite_rows'. Not run at this shape: fp32 rows (61
    spans; the round reads fp16), digests, and rows other than these three (a verify has up to 16)."""
    threads, span_vectors, max_spans = SERVED.geometry()
    assert _spans(SERVED_VOCAB, True, span_vectors, max_spans) == (31, 10)
    padded = _padded_rows(SERVED_VOCAB, torch.float16, SERVED_ROWS)
    got = _run(PtxProgram(SERVED.ptx("sm_86")), threads, padded, SERVED_VOCAB, span_vectors, max_spans)
    ids, flags, _ = _reference(padded, SERVED_VOCAB)
    assert (got.ids, got.flags, got.digests) == (ids, flags, [])
    assert (ids, flags) == ([3, -1, SERVED_VOCAB - 1], [0, 1, 0])  # the rows are what they say
    assert len(got.reports) == 31 * len(SERVED_ROWS) + len(SERVED_ROWS)
    for report in got.reports:
        assert report.races == [], [str(r) for r in report.races[:3]]
        assert report.unwritten_reads == []
        assert report.barriers == 1 + 8  # block_best's own barrier, then one a level of 256 threads' tree


def test_a_deleted_barrier_of_the_served_build_is_reported_as_a_race() -> None:
    """The detector can fail at the served block of 256 threads: deleting any of the first 8 of a kernel's 9
    bar.sync gives a race, in the fp16 span kernel on the model's last span (320 vectors) and in the merge
    over 31 spans (its workspace arbitrary: which bytes a thread touches does not depend on the values)."""
    threads, span_vectors, max_spans = SERVED.geometry()
    text = SERVED.ptx("sm_86")
    count, shift = _spans(SERVED_VOCAB, True, span_vectors, max_spans)
    row = _padded_rows(SERVED_VOCAB, torch.float16, [0])
    for name in ("span_kernelI6__half", "merge_kernel"):
        bars = barrier_lines(text, name)
        assert len(bars) == 9
        for line in bars[:-1]:
            cut = text.splitlines()
            del cut[line]
            kernel = PtxProgram("\n".join(cut)).entry(name)
            m = Machine()
            slots = [m.put(np.arange(count, dtype=np.int32) * 7 + i) for i in range(3)]
            if name == "merge_kernel":
                args, block, grid = [count, *slots, m.alloc(8), m.alloc(4), 0], (0, 0), (1, 1)
            else:
                logits = m.put(row.view(torch.int16).numpy())
                spans = struct.pack("<II", count, shift)
                args, block = [logits, row.shape[1], SERVED_VOCAB, spans, *slots], (count - 1, 0)
                grid = (count, 1)
            report = m.run_block(kernel, args, threads=threads, block=block, grid=grid)
            assert report.races and all(r.space == "shared" for r in report.races), f"{name}: line {line + 1}"
