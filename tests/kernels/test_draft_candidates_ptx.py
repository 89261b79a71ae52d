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
from tests.kernels.draft_candidates_cases import LP_TOLERANCE, check_packed, rows
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram, PtxUnsupported, barrier_lines
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

SPAN_VECTORS = 8  # a row of 77 logits: 3 fp32 spans (the last with a single value), 2 fp16 ones
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


def _run(
    program: PtxProgram, threads: int, padded: torch.Tensor, chain: torch.Tensor, k: int, machine: Machine
) -> tuple[torch.Tensor, list[BlockReport]]:
    """Both launches as elpis_draft_candidates makes them (grid (spans, rows), then a block a row): the
    packed rows [rows, 2 + 2k] and every block's report."""
    fp16 = padded.dtype == torch.float16
    n, stride = padded.shape
    total = rs.vectors_of(VOCAB, fp16)
    shift = rs.shift_of(total, SPAN_VECTORS.bit_length() - 1, 6)
    count = rs.count_of(total, shift)
    m = machine
    logits = m.put(padded.view(torch.int16 if fp16 else torch.int32).numpy())
    at_chain, keys, sums = m.put(chain.numpy()), m.alloc(8 * n * count * k), m.alloc(4 * n * count)
    out = np.full((n, 2 + 2 * k), -7, dtype=np.float32)
    at_out = m.put(out)
    kind = "I6__half" if fp16 else "If"
    span, merge = program.entry(f"span_kernel{kind}"), program.entry(f"merge_kernel{kind}")
    spans = struct.pack("<II", count, shift)  # row_scan::Spans, by value
    reports = [
        m.run_block(span, [logits, stride, VOCAB, k, spans, keys, sums], threads=threads, block=(s, r),
                    grid=(count, n))
        for r in range(n) for s in range(count)
    ]  # fmt: skip
    reports += [
        m.run_block(merge, [logits, stride, VOCAB, at_chain, k, count, keys, sums, at_out], threads=threads,
                    block=(r, 0), grid=(n, 1))
        for r in range(n)
    ]  # fmt: skip
    return torch.from_numpy(m.get(at_out, out)), reports


def _chain(n: int) -> torch.Tensor:
    chain = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n))
    chain[-1] = VOCAB  # outside the vocabulary: a NaN log-probability
    return chain


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
    warps = threads // 32
    for report in reports:
        assert report.races == [], [str(r) for r in report.races[:3]]
        assert report.unwritten_reads == []
        # block_top: 2 barriers a round, k rounds (twice in a span block), then block_sum's 2
        assert report.barriers in (2 * k + 2, 4 * k + 2)
        # each round: every warp's two 5-level butterflies (a key's two words), then warp 0's; block_sum's
        rounds = (report.barriers - 2) // 2
        assert report.shuffles == rounds * 10 * (warps + 1) + 5 * (warps + 1)


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
