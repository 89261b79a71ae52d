"""A sampled request's draw without top_k on the GPU (`patches/kernels/vocab_draw.cu`; issue 9: sampled rounds
on the GPU; registry switch `exl3-vocab-draw`).

OpenAI clients send temperature and top_p but no top_k, and `elpis.spec.sampling` draws such a request from
its whole vocabulary: every weight, a stable sort of them for top_p, and a read-back of each row's mass for
top_p's exact reach, so its rounds stayed on the host. Here the kernels draw the same tokens with nothing
read back: the whole row's fixed-point mass, summed span by span, then either the head's draw (top_p < 1 or
min_p > 0: the row's HEAD_WIDTH + TOP_PAD largest weights, `sampling.top_weights`, ranked and cut against that
mass, as `sample_draw`'s kernel does for top_k) or the pick (top_p = 1 and min_p = 0: every token kept, found
in id order from the spans' sums). A row the head cannot decide (its top_p prefix runs past the weights read,
or its smallest weight read is not clear below min_p: a flat row) is left to the host, or with the switch
`exl3-vocab-draw-nucleus` goes to the nucleus: an exact radix select of top_p's prefix over the whole row,
then the pick's draw over the kept tokens (only rows whose spans the pick's shared memory does not hold, past
the model's vocabulary, are then left to the host).

`queue` runs inside a round's graph (`elpis.exl3.device_round`), its parameters read from device memory;
`draw` serves host rounds on a CUDA device (`sampling.use_vocab_draw`). The tokens equal the host's under the
CPU emulation (tests/kernels/test_vocab_draw_emu.py) and on the GPU (tests/kernels/test_vocab_draw.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache, partial

import torch

from elpis import nvcc
from elpis.exl3 import patches, sample_draw, tensors
from elpis.paths import PATCHES_DIR
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams

PATCH = "exl3-vocab-draw"
# the head's launch in rounds on the GPU (top_p < 1 or min_p > 0 without top_k), a switch of its own
HEADS_PATCH = "exl3-vocab-draw-heads"
# the nucleus: rows the head's weights leave undecided (flat rows) decided over the whole row on the GPU
# instead of by the host, in rounds on the GPU and in host rounds' draws alike
NUCLEUS_PATCH = "exl3-vocab-draw-nucleus"
SOURCE = PATCHES_DIR / "kernels" / "vocab_draw.cu"
THREADS = 256  # the mass's and the pick's block
HEAD_WIDTH = sample_draw.MAX_COUNT - sampling.TOP_PAD  # the head's weights read: the kernel's most, 256
KINDS = {torch.float16: 0, torch.float32: 1, torch.float64: 2}  # the row kinds the kernels read
# the kernels' answers for a row they do not draw (sample_draw's)
EDGE_UNCLEAR, NOT_FINITE = sample_draw.EDGE_UNCLEAR, sample_draw.NOT_FINITE
PARAMS_REFUSED = sample_draw.PARAMS_REFUSED

_VP, _U32, _U64, _I64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_vocab_draw_head": (_VP, _U32, _U32, _U32, _U32, _VP, _VP, _VP, _VP, _U32, _U32, _VP, _VP, _I64,
                              _VP, _U64, _VP, _VP),
    "elpis_vocab_draw_pick": (_VP, _U32, _U32, _U32, _U32, _VP, _VP, _VP, _VP, _I64, _VP, _U64, _VP, _VP),
    "elpis_vocab_draw_spans": (_U32, _U32),
    "elpis_vocab_draw_picks": (_U32, _U32),
    "elpis_vocab_draw_head_words": (_U32, _U32, _U32),
    "elpis_vocab_draw_threads": (),
    "elpis_vocab_draw_max_count": (),
}  # fmt: skip
RESTYPES = {"elpis_vocab_draw_max_count": _U32, "elpis_vocab_draw_head_words": _U64}


def bind(lib: ctypes.CDLL, threads: int = THREADS) -> ctypes.CDLL:
    """Set the entries' types on a build (GPU or emulated), and check its block (a test build may take fewer
    threads: ELPIS_VOCAB_DRAW_THREADS) and its head's capacity."""
    nvcc.set_signatures(lib, ENTRY_ARGS, RESTYPES)
    got = lib.elpis_vocab_draw_max_count()
    if got != sample_draw.MAX_COUNT:
        raise RuntimeError(f"vocab draw kernel: {got} weights a row, expected {sample_draw.MAX_COUNT}")
    return nvcc.check_block(lib, "elpis_vocab_draw_threads", threads, "vocab draw")


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def load() -> None:
    """Build (or find built) and bind the kernels now, so their build, or its failure, meets the caller at
    load rather than inside a request."""
    _library()


def takes(params: SamplingParams) -> bool:
    """Whether these kernels draw `params`' rows: sampled requests without top_k."""
    return not params.greedy and not params.top_k


def reads_head(params: SamplingParams) -> bool:
    """Whether the draw reads the rows' largest weights (top_p < 1 or min_p > 0: the head's launch) rather
    than keeping every token (the pick's). A round's graph bakes in which."""
    return params.top_p < 1.0 or params.min_p > 0.0


def fits(params: SamplingParams, dtype: torch.dtype, vocab: int) -> bool:
    """Whether the kernels draw `params`' rows of `vocab` values of `dtype`: a row inside the proved spans'
    domain, and for the pick (`reads_head` false) spans its shared memory holds (the model's 248,320 values
    are 61 spans of 4,096)."""
    if not takes(params) or dtype not in KINDS:
        return False
    lib = _library()
    kind = KINDS[dtype]
    return lib.elpis_vocab_draw_spans(kind, vocab) > 0 and (reads_head(params) or
                                                            lib.elpis_vocab_draw_picks(kind, vocab) == 1)


def _kind(rows: torch.Tensor) -> int:
    if rows.dtype not in KINDS:
        raise ValueError(f"vocab draw: rows must be float16, float32 or float64, got {rows.dtype}")
    return KINDS[rows.dtype]


def _maxima(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Each row's max of x * (1/T), as `sampling._weights` computes it (`scale`: 1/T, a float64 [1])."""
    return rows.amax(dim=1).to(torch.float64) * scale


def queue(
    rows: torch.Tensor, params: SamplingParams, scale: torch.Tensor, block: torch.Tensor,
    positions: torch.Tensor, offset: int, out: torch.Tensor, *, nucleus: bool,
) -> None:
    """Queue the draws of every row of `rows` ([n, vocab], rows contiguous: a verify's logits read in place,
    or adjusted float64 rows) into `out` (int64 [n]: a token or one of the kernels' answers) in stream order,
    nothing read back. `scale` (float64 [1], the inverse temperature), `block` (int64 [3],
    `sample_draw.param_words`) and `positions` (int64 [n], row r drawing for positions[r] + offset) are read
    from device memory when it runs; `params` decides only which launch (`reads_head`) and is not read
    otherwise. `nucleus`: the head's launch decides the rows its weights do not (NUCLEUS_PATCH)."""
    if rows.dim() != 2 or rows.stride(1) != 1:
        raise ValueError(f"vocab draw: rows must be [n, vocab] with contiguous rows, got {list(rows.shape)}")
    n, vocab = rows.shape
    kind = _kind(rows)
    tensors.check_tensor("vocab draw scale", scale, torch.float64, (1,))
    tensors.check_tensor("vocab draw parameters", block, torch.int64, (sample_draw.PARAM_WORDS,))
    tensors.check_tensor("vocab draw positions", positions, torch.int64, (n,))
    tensors.check_tensor("vocab draw tokens", out, torch.int64, (n,))
    tensors.check_one_device("vocab draw", (rows, scale, block, positions, out))
    lib = _library()
    spans = lib.elpis_vocab_draw_spans(kind, vocab)
    if spans < 0:
        raise ValueError(f"vocab draw: a row of {vocab} values is past the proved row spans' domain")
    # the head's workspace holds the nucleus's bins, kept weights and cuts after the spans' sums
    words = lib.elpis_vocab_draw_head_words(kind, vocab, n) if reads_head(params) and nucleus else n * spans
    work = torch.empty(words, dtype=torch.int64, device=rows.device)
    stream = torch.cuda.current_stream(rows.device).cuda_stream if rows.device.type == "cuda" else None
    shape = (rows.data_ptr(), kind, rows.stride(0), vocab, n, scale.data_ptr())
    tail = (block.data_ptr(), positions.data_ptr(), offset, work.data_ptr(), 8 * work.numel(), out.data_ptr(),
            stream)  # fmt: skip
    if reads_head(params):
        top = sampling.top_weights(rows, params, min(HEAD_WIDTH, vocab), scale)
        count = top.w.shape[1]
        err = lib.elpis_vocab_draw_head(*shape, top.w.data_ptr(), top.ids.data_ptr(), top.best.data_ptr(),
                                        count, int(nucleus), *tail)  # fmt: skip
    else:
        best = _maxima(rows, scale)  # held while the launch is queued: the kernel reads it
        err = lib.elpis_vocab_draw_pick(*shape, best.data_ptr(), *tail)
    if err != 0:
        why = "arguments refused (rows unaligned, or a row past the spans)" if err < 0 else f"error {err}"
        raise RuntimeError(f"vocab draw kernel: {why}")


def draw(logits: torch.Tensor, params: SamplingParams, positions: Sequence[int], *,
         nucleus: bool = False) -> list[int] | None:
    """Every row's token, in one call and one read-back; None where the host should decide (rows these kernels
    do not read, or a head not clear of the weights read, without the nucleus or on rows too long for it). A
    row whose maximum is not finite is refused with ValueError, as the host refuses it."""
    if not takes(params):
        raise ValueError("vocab draw: a sampled request without top_k only")
    if logits.dim() != 2 or logits.shape[0] != len(positions):
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(positions)} positions")
    if min(positions, default=0) < 0:
        raise ValueError(f"position must be >= 0, got {min(positions)}")  # as sampling.position_uniform
    aligned = logits.data_ptr() % 16 == 0 and logits.stride(0) * logits.element_size() % 16 == 0
    if not fits(params, logits.dtype, logits.shape[1]) or logits.stride(1) != 1 or not aligned:
        return None  # rows the kernels do not read: the host's
    device = logits.device
    block = torch.tensor([*sample_draw.param_words(params), *positions], dtype=torch.int64).to(device)
    scale = torch.tensor([params.inverse_temperature], dtype=torch.float64).to(device)
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=device)
    words = sample_draw.PARAM_WORDS
    queue(logits, params, scale, block[:words], block[words:], 0, out, nucleus=nucleus)
    return sample_draw.read_tokens(out, lambda: _maxima(logits, scale).tolist(), "vocab draw")


def install() -> None:
    """The registry patch's entry: draws without top_k of rows on a CUDA device go through the kernels, with
    the nucleus where its switch is on."""
    load()  # built (or its failure reported) now, at load, not inside the first request
    sampling.use_vocab_draw(partial(draw, nucleus=patches.enabled(NUCLEUS_PATCH)))
