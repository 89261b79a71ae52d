"""A top_k request's draw on the GPU (`patches/kernels/sample_draw.cu`; issue 9: the host's share of a sampled
round; registry switch `exl3-sample-draw`, off until its GPU A/B).

`elpis.spec.sampling` draws a top_k request's tokens from each row's largest logits: torch computes their
float64 weights, then the host ranks them, cuts top_k, top_p and min_p and draws. With the switch on, the
weights torch computed (the same tensors) go to one launch, one thread a row, which takes the same steps in
integers and comparisons, and only the tokens are read back. Every token is the host's: the kernel's rows
equal the host's on rows of every kind under the CPU emulation (tests/kernels/test_sample_draw_emu.py) and on
the GPU (tests/kernels/test_sample_draw.py). Where a row's head edge ties past the logits read, the call is
drawn from the whole vocabulary on the host, as without the switch.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device pointers
on the current stream; `bind` sets the entries' types on any build (the GPU's, or the CPU emulation).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache

import torch

from elpis import nvcc
from elpis.exl3 import tensors
from elpis.paths import PATCHES_DIR
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams

PATCH = "exl3-sample-draw"
SOURCE = PATCHES_DIR / "kernels" / "sample_draw.cu"
MAX_COUNT = 256  # the kernel's per-thread arrays: the weights of a row it takes at most
EDGE_UNCLEAR, NOT_FINITE = -1, -2  # the kernel's answers for a row it does not draw

_VP, _U32, _U64, _F64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_double
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_sample_draw": (_VP, _VP, _VP, _U32, _U32, _U32, _U32, _U32, _F64, _F64, _U64, _VP, _VP, _VP),
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


def draw(weights: sampling.TopWeights, params: SamplingParams, positions: Sequence[int]) -> list[int] | None:
    """Every row's token from its top weights (`sampling.top_weights`), in one launch and one read-back;
    None where the host should decide: some row's head edge is not clear of the weights read (the host draws
    from the whole vocabulary), or a row holds more weights than the kernel takes. A row whose maximum is not
    finite is refused with ValueError, as the host refuses it."""
    best, w, ids = weights.best.contiguous(), weights.w.contiguous(), weights.ids.contiguous()
    rows, count = w.shape
    if len(positions) != rows:
        raise ValueError(f"sample draw: {rows} rows for {len(positions)} positions")
    if min(positions, default=0) < 0:
        raise ValueError(f"position must be >= 0, got {min(positions)}")  # as sampling.position_uniform
    if count > MAX_COUNT:
        return None  # a top_k past the kernel's rows: the host draws
    tensors.check_tensor("sample draw weights", w, torch.float64, (rows, count))
    tensors.check_tensor("sample draw ids", ids, torch.int64, (rows, count))
    tensors.check_tensor("sample draw maxima", best, torch.float64, (rows,))
    tensors.check_one_device("sample draw", (best, w, ids))
    device = w.device
    pos = torch.tensor(list(positions), dtype=torch.int64).to(device)
    out = torch.empty(rows, dtype=torch.int64, device=device)
    width = min(params.top_k, weights.vocab)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    err = _library().elpis_sample_draw(
        w.data_ptr(), ids.data_ptr(), best.data_ptr(), rows, count, weights.vocab, width, params.top_k,
        float(params.top_p), float(params.min_p), params.seed & sampling.MASK64, pos.data_ptr(),
        out.data_ptr(), stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"sample draw kernel: launch failed (error {err})")
    tokens = out.tolist()
    if NOT_FINITE in tokens:
        sampling.check_finite(best.tolist())
    if EDGE_UNCLEAR in tokens:
        return None
    if any(t < 0 for t in tokens):
        raise AssertionError(f"sample draw kernel: no token passed a row's draw target ({tokens})")
    return tokens


def install() -> None:
    """The registry patch's entry: top_k draws of rows on a CUDA device go through the kernel."""
    _library()  # built (or its failure reported) now, at load, not inside the first request
    sampling.use_device_draw(draw)
