"""A top_k request's draw on the GPU (`patches/kernels/sample_draw.cu`; issue 9: the host's share of a sampled
round; registry switch `exl3-sample-draw`, on since session 56).

`elpis.spec.sampling` draws a top_k request's tokens from each row's largest logits: torch computes their
float64 weights, then the host ranks them, cuts top_k, top_p and min_p and draws. With the switch on, the
weights torch computed (the same tensors) go to one launch, one thread a row, which takes the same steps in
integers and comparisons, and only the tokens are read back. Every token is the host's: the kernel's rows
equal the host's on rows of every kind under the CPU emulation (tests/kernels/test_sample_draw_emu.py) and on
the GPU (tests/kernels/test_sample_draw.py). Where a row's head edge ties past the logits read, the call is
drawn from the whole vocabulary on the host, as without the switch. Rounds on the GPU
(`elpis.exl3.device_round`) queue the same kernel inside a round's graph (`queue`), its parameters read from
device memory.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device pointers
on the current stream; `bind` sets the entries' types on any build (the GPU's, or the CPU emulation).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import lru_cache

import torch

from elpis import nvcc
from elpis.exl3 import round_tail, tensors
from elpis.paths import PATCHES_DIR
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams

PATCH = "exl3-sample-draw"
SOURCE = PATCHES_DIR / "kernels" / "sample_draw.cu"
MAX_COUNT = 256  # the kernel's per-thread arrays: the weights of a row it takes at most
# the kernel's answers for a row it does not draw
EDGE_UNCLEAR, NOT_FINITE, PARAMS_REFUSED = round_tail.UNDECIDED, -2, -4
PARAM_WORDS = 3  # the parameters block: the seed, then top_p's and min_p's float64 bits

_VP, _U32, _I64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int64
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_sample_draw": (_VP, _VP, _VP, _U32, _U32, _U32, _U32, _U32, _VP, _VP, _I64, _VP, _VP),
    "elpis_sample_draw_max_count": (),
}
RESTYPES = {"elpis_sample_draw_max_count": _U32}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated), and check its row capacity."""
    nvcc.set_signatures(lib, ENTRY_ARGS, RESTYPES)
    got = lib.elpis_sample_draw_max_count()
    if got != MAX_COUNT:
        raise RuntimeError(f"sample draw kernel: {got} weights a row, expected {MAX_COUNT}")
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def load() -> None:
    """Build (or find built) and bind the kernel now, so its build, or its failure, meets the caller at load
    rather than inside a request."""
    _library()


def _signed(bits: int) -> int:
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def param_words(params: SamplingParams) -> list[int]:
    """The parameters block's int64 words for `params`: the seed (64 bits), top_p's and min_p's float64
    bits."""
    top_p, min_p = tensors.float64_word(params.top_p), tensors.float64_word(params.min_p)
    return [_signed(params.seed & sampling.MASK64), top_p, min_p]


def row_count(params: SamplingParams, vocab: int) -> int:
    """How many of a row's largest logits the draw reads (`sampling.top_weights`), or 0 where the kernel does
    not draw `params` (greedy, no top_k, or more weights than it takes): those stay the host's."""
    if params.greedy or not params.top_k:
        return 0
    count = min(vocab, min(params.top_k, vocab) + sampling.TOP_PAD)
    return count if count <= MAX_COUNT else 0


def queue(
    weights: sampling.TopWeights, top_k: int, params: torch.Tensor, positions: torch.Tensor, offset: int,
    out: torch.Tensor,
) -> None:
    """Queue the draws of every row into `out` (int64 [rows]: a token or one of the kernel's answers) in
    stream order, nothing read back: `params` int64 [PARAM_WORDS] (`param_words`) and `positions` (int64
    [rows], each row drawing for positions[r] + offset) are read from device memory when it runs, so a
    captured graph serves any request of its top_k."""
    best, w, ids = weights.best, weights.w, weights.ids
    rows, count = w.shape
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"sample draw: {count} weights a row, the kernel takes 1..{MAX_COUNT}")
    tensors.check_tensor("sample draw weights", w, torch.float64, (rows, count))
    tensors.check_tensor("sample draw ids", ids, torch.int64, (rows, count))
    tensors.check_tensor("sample draw maxima", best, torch.float64, (rows,))
    tensors.check_tensor("sample draw parameters", params, torch.int64, (PARAM_WORDS,))
    tensors.check_tensor("sample draw positions", positions, torch.int64, (rows,))
    tensors.check_tensor("sample draw tokens", out, torch.int64, (rows,))
    tensors.check_one_device("sample draw", (best, w, ids, params, positions, out))
    device = w.device
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    err = _library().elpis_sample_draw(
        w.data_ptr(), ids.data_ptr(), best.data_ptr(), rows, count, weights.vocab, min(top_k, weights.vocab),
        top_k, params.data_ptr(), positions.data_ptr(), offset, out.data_ptr(), stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"sample draw kernel: launch failed (error {err})")


def draw(weights: sampling.TopWeights, params: SamplingParams, positions: Sequence[int]) -> list[int] | None:
    """Every row's token from its top weights (`sampling.top_weights`), in one launch and one read-back;
    None where the host should decide: some row's head edge is not clear of the weights read (the host draws
    from the whole vocabulary), or a row holds more weights than the kernel takes. A row whose maximum is not
    finite is refused with ValueError, as the host refuses it."""
    best, w = weights.best, weights.w
    rows, count = w.shape
    if len(positions) != rows:
        raise ValueError(f"sample draw: {rows} rows for {len(positions)} positions")
    if min(positions, default=0) < 0:
        raise ValueError(f"position must be >= 0, got {min(positions)}")  # as sampling.position_uniform
    if count > MAX_COUNT:
        return None  # a top_k past the kernel's rows: the host draws
    device = w.device
    # the parameters and the positions in one copy
    block = torch.tensor([*param_words(params), *positions], dtype=torch.int64).to(device)
    out = torch.empty(rows, dtype=torch.int64, device=device)
    queue(weights, params.top_k, block[:PARAM_WORDS], block[PARAM_WORDS:], 0, out)
    return read_tokens(out, best.tolist, "sample draw")


def read_tokens(out: torch.Tensor, maxima: Callable[[], list[float]], who: str) -> list[int] | None:
    """The tokens a draw wrote into `out` (this kernel's, or `vocab_draw`'s), read back: None where a row was
    left to the host (EDGE_UNCLEAR); a row whose maximum is not finite is refused as the host refuses it
    (`maxima`: the rows' maxima of x * (1/T), read only then)."""
    tokens = out.tolist()
    if NOT_FINITE in tokens:
        sampling.check_finite(maxima())
    if EDGE_UNCLEAR in tokens:
        return None
    if any(t < 0 for t in tokens):
        raise AssertionError(f"{who} kernel: a row was not drawn ({tokens})")
    return tokens


def install() -> None:
    """The registry patch's entry: top_k draws of rows on a CUDA device go through the kernel."""
    load()  # built (or its failure reported) now, at load, not inside the first request
    sampling.use_device_draw(draw)
