"""The vocab draw's nucleus (patches/kernels/vocab_draw.cu) as nvcc compiles it, run block by block on the CPU
by the PTX interpreter (tests/kernels/ptx_interp.py) with its race detector: the mass, then the nucleus's four
launches (first digit, cut, kept weights, draw) for rows the head left undecided, for the sm_86 and sm_90 PTX.

The CUDA emulation (test_vocab_draw_emu.py) runs the source's threads as fibers that switch only at barriers,
so it cannot see a missing barrier or two threads touching one shared word between barriers. Here every
block's shared and global accesses are checked for races (atomics may meet atomics only) and for shared reads
before any write, and the tokens must be the host sampler's (`sampling._kept_fixed`, `_fixed_draws`): every
row is handed to the nucleus, peaked ones too. The interpreter runs CUDA's own exp (libdevice's instructions,
exact fma), the host the CPU's; the rows here are not placed where the two could round a weight differently.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
import torch

from elpis import nvcc
from elpis.exl3 import sample_draw, vocab_draw
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams
from tests.kernels import test_vocab_draw_emu
from tests.kernels.ptx_interp import BlockReport, Machine, PtxProgram
from tests.nvcc_marks import needs_nvcc
from tests.spec.sampling_rows import rows_of_every_kind

pytestmark = needs_nvcc

THREADS, SPAN_VALUES, MAX_SPANS = 32, 256, 64  # the emulation's small build: several spans a short row
DEFINES = {"ELPIS_VOCAB_DRAW_THREADS": THREADS, "ELPIS_VOCAB_DRAW_SPAN_VALUES": SPAN_VALUES,
           "ELPIS_VOCAB_DRAW_MAX_SPANS": MAX_SPANS}  # fmt: skip
MANGLED = {torch.float16: "I6__half", torch.float32: "If", torch.float64: "Id"}
UNIT = {torch.float16: 8, torch.float32: 4, torch.float64: 1}  # values a span's unit holds (16-byte vectors)
CUT_WORDS = 6


@pytest.fixture(scope="module", params=nvcc.ARCHS)
def program(request: pytest.FixtureRequest) -> PtxProgram:
    ptx = nvcc.compile_to(vocab_draw.SOURCE, "ptx", arch=request.param, defines=DEFINES)
    return PtxProgram(ptx.read_text())


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The same build emulated: the spans it cuts a row into (the launches' argument) and its workspace."""
    return test_vocab_draw_emu.build(tmp_path_factory, THREADS, SPAN_VALUES, MAX_SPANS)


def _spans(emulated: ctypes.CDLL, dtype: torch.dtype, vocab: int) -> tuple[int, int]:
    """(count, shift) of the row spans: spans of SPAN_VALUES values (short rows stay under the cap)."""
    count = emulated.elpis_vocab_draw_spans(vocab_draw.KINDS[dtype], vocab)
    shift = (SPAN_VALUES // UNIT[dtype]).bit_length() - 1
    units = vocab if dtype == torch.float64 else vocab // UNIT[dtype]
    assert count == -(-units // (1 << shift)), "the spans are not the plain cut this test assumes"
    return count, shift


def _clean(name: str, report: BlockReport) -> None:
    assert not report.races, f"{name}: {report.races[:3]}"
    assert not report.unwritten_reads, f"{name}: {report.unwritten_reads[:3]}"


def interpreted_nucleus(program: PtxProgram, emulated: ctypes.CDLL, rows: torch.Tensor,
                        params: SamplingParams, positions: list[int]) -> list[int]:  # fmt: skip
    """Every row of `rows` ([n, vocab], contiguous rows) drawn by the mass and the nucleus's launches on the
    interpreter, each row handed over undecided as the head leaves it; each block race-free."""
    n, vocab = rows.shape
    dtype, stride = rows.dtype, -(-vocab // UNIT[rows.dtype]) * UNIT[rows.dtype]
    wide = torch.zeros(n, stride, dtype=dtype)
    wide[:, :vocab] = rows
    count, shift = _spans(emulated, dtype, vocab)
    spans = struct.pack("<II", count, shift)
    m = Machine()
    logits = m.put(wide.view(torch.int16).numpy().copy() if dtype == torch.float16 else wide.numpy().copy())
    scale = m.put(np.array([params.inverse_temperature], dtype=np.float64))
    best = m.put((rows.to(torch.float64).amax(dim=1) * params.inverse_temperature).numpy())
    block = m.put(np.array(sample_draw.param_words(params), dtype=np.int64))
    at = m.put(np.array(positions, dtype=np.int64))
    out = m.put(np.full(n, vocab_draw.EDGE_UNCLEAR, dtype=np.int64))
    words = n * count * (256 + 2) + n * CUT_WORDS  # the head entry's layout: sums, bins, kept weights, cuts
    assert emulated.elpis_vocab_draw_head_words(vocab_draw.KINDS[dtype], vocab, n) == words
    sums = m.put(np.zeros(words, dtype=np.int64))
    hist = sums + 8 * n * count
    kept = hist + 8 * n * count * 256
    cuts = kept + 8 * n * count
    grid = (count, n)

    def each_span(kernel: str, args: list) -> None:
        entry = program.entry(f"{kernel}{MANGLED[dtype]}")
        for r in range(n):
            for s in range(count):
                _clean(kernel, m.run_block(entry, args, threads=THREADS, block=(s, r), grid=grid))

    def each_row(kernel: str, args: list) -> None:
        entry = program.entry(f"{kernel}{MANGLED[dtype]}")
        for r in range(n):
            _clean(kernel, m.run_block(entry, args, threads=THREADS, block=(r, 0), grid=(n, 1)))

    kind = vocab_draw.KINDS[dtype]
    each_span("vocab_mass_kernel", [logits, stride, vocab, spans, scale, best, sums])
    each_span("nucleus_hist_kernel", [logits, stride, vocab, spans, scale, best, out, hist])
    each_row("nucleus_cut_kernel", [logits, kind, stride, vocab, spans, scale, best, sums, hist, block, at, 0,
                                    out, cuts])  # fmt: skip
    each_span("nucleus_kept_kernel", [logits, stride, vocab, spans, scale, best, block, out, cuts, kept])
    each_row("nucleus_pick_kernel", [logits, kind, stride, vocab, spans, scale, best, block, at, 0, cuts,
                                     kept, out])  # fmt: skip
    return m.get(out, np.zeros(n, dtype=np.int64)).tolist()


def host_tokens(rows: torch.Tensor, params: SamplingParams, positions: list[int]) -> list[int]:
    return sampling._fixed_draws(sampling._kept_fixed(rows, params), params, positions)


def _shared_zero_row(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Ten tokens at 2, then +0 and -0 interleaved: top_p 0.5's prefix ends among the zeros, one weight over
    two logit values, cut by id."""
    row = torch.full((vocab,), -5.0, dtype=torch.float64)
    row[:10] = 2.0
    row[10:810] = torch.tensor([0.0, -0.0]).repeat(400)
    return row.to(dtype)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.8, seed=5),
                                    SamplingParams(temperature=0.7, top_p=0.5, min_p=0.02, seed=6),
                                    SamplingParams(temperature=1.0, min_p=1e-4, seed=7)],
                         ids=["top_p", "top_p-min_p", "min_p"])  # fmt: skip
def test_the_nucleus_on_nvccs_ptx_draws_the_hosts_tokens_without_races(program, emulated, params) -> None:
    """fp16 rows, the verify's kind: nearly flat, coarse (hundreds of tokens a value), ties near the top."""
    rows = rows_of_every_kind(1001, 3)[[3, 1, 2]].half()
    positions = [40, 41, 42]
    got = interpreted_nucleus(program, emulated, rows, params, positions)
    assert got == host_tokens(rows, params, positions)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_every_row_kind_and_a_weight_over_two_logit_values(program, emulated, dtype) -> None:
    """Each kind's select (2, 4 and 8 passes of its digits) on a flat row, and a boundary among +0 and -0."""
    rows = torch.stack([rows_of_every_kind(1001, 4)[3].to(dtype), _shared_zero_row(1001, dtype)])
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=8)
    positions = [70, 71]
    got = interpreted_nucleus(program, emulated, rows, params, positions)
    assert got == host_tokens(rows, params, positions)
    assert got[1] >= 10  # the second row's draw landed among the zeros' kept ids
