"""Python entry to the rows' logit adjustments on the GPU (`patches/kernels/round_adjust.cu`; issue 9:
penalised requests' rounds on the GPU, registry switch `exl3-round-adjust`).

`queue` adjusts every row of a tree verify as `elpis.spec.penalties.History.adjusted` does, each row counting
the tokens of its own path, read from the acceptor's cells the round plan wrote: the same float64 values, so
the same greedy targets and draws. The request's history (generated counts, seen tokens, logit_bias) and its
parameters live in device memory (`DeviceHistory`), written when its rounds start and advanced by the tokens
each round commits, in stream order, so a captured round serves every request.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device pointers
on the current stream; `bind` sets the entries' types on any build (the GPU's, or the CPU emulation).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache

import torch

from elpis import nvcc
from elpis.accept import abi
from elpis.exl3 import tensors
from elpis.paths import PATCHES_DIR
from elpis.spec.penalties import Steps
from elpis.spec.sampling import SamplingParams

PATCH = "exl3-round-adjust"
SOURCE = PATCHES_DIR / "kernels" / "round_adjust.cu"
PARAM_WORDS = 5  # the flags, then the float64 bits of r, 1 / r, f and q
REPETITION, FREQUENCY_PRESENCE, BIAS = 1, 2, 4  # the flags: the steps `penalties.Steps` names

_VP, _U32 = ctypes.c_void_p, ctypes.c_uint32
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_round_adjust": (_VP, _U32, _U32, _U32, _VP, _VP, _VP, _VP, _VP, _VP, _VP),
    "elpis_round_adjust_param_words": (),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated), and check its parameters."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    if lib.elpis_round_adjust_param_words() != PARAM_WORDS:
        raise RuntimeError(f"round adjust kernel: {lib.elpis_round_adjust_param_words()} parameter words, "
                           f"expected {PARAM_WORDS}")  # fmt: skip
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def load() -> None:
    """Build (or find built) and bind the kernel now, at load rather than inside a request."""
    _library()


def param_words(params: SamplingParams) -> list[int]:
    """The parameters block for `params`: which steps it takes (`penalties.Steps`, as History's), then
    r, 1 / r, f and q as float64 bits."""
    r = float(params.repetition_penalty)
    steps = Steps.of(params)
    flags = ((REPETITION if steps.repetition else 0) | (FREQUENCY_PRESENCE if steps.frequency_presence else 0)
             | (BIAS if steps.bias else 0))  # fmt: skip
    values = (r, 1.0 / r, params.frequency_penalty, params.presence_penalty)
    return [flags, *(tensors.float64_word(v) for v in values)]


class DeviceHistory:
    """A request's history for the kernel, in device memory at fixed addresses (a captured round reads them):
    `counts` and `seen` float64 [vocab] (generated tokens counted; prompt and generated tokens seen, > 0),
    `bias` float64 [vocab] and `params` int64 [PARAM_WORDS]."""

    def __init__(self, vocab: int, device: torch.device | str) -> None:
        self.vocab = vocab
        self.counts = torch.zeros(vocab, dtype=torch.float64, device=device)
        self.seen = torch.zeros(vocab, dtype=torch.float64, device=device)
        self.bias = torch.zeros(vocab, dtype=torch.float64, device=device)
        self.params = torch.zeros(PARAM_WORDS, dtype=torch.int64, device=device)

    def start(self, params: SamplingParams, prompt: Sequence[int], generated: Sequence[int]) -> None:
        """Write a request's history: its parameters, its prompt's tokens and those generated so far."""
        named = (*prompt, *generated, *(t for t, _ in params.logit_bias))
        bad = [t for t in named if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token ids {bad[:4]} outside the vocabulary (0..{self.vocab - 1})")
        device = self.counts.device
        self.params.copy_(torch.tensor(param_words(params), dtype=torch.int64))
        for table in (self.counts, self.seen, self.bias):
            table.zero_()
        if generated:
            self.count(torch.tensor(list(generated), dtype=torch.int64, device=device))
        if prompt:
            ids = torch.tensor(list(prompt), dtype=torch.int64, device=device)
            self.seen.index_fill_(0, ids, 1.0)
        if params.logit_bias:
            pairs = params.logit_bias
            ids = torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=device)
            values = torch.tensor([float(b) for _, b in pairs], dtype=torch.float64, device=device)
            self.bias.index_copy_(0, ids, values)

    def count(self, tokens: torch.Tensor) -> None:
        """Count generated tokens (int64 on the device; entries < 0 are not tokens and count nothing), in
        stream order: each adds 1.0, exact whatever the order."""
        valid = tokens >= 0
        at = tokens.clamp(min=0)
        ones = valid.to(torch.float64)
        self.counts.index_add_(0, at, ones)
        self.seen.index_add_(0, at, ones)


def queue(logits: torch.Tensor, cells: torch.Tensor, history: DeviceHistory, out: torch.Tensor) -> None:
    """Queue the adjustment of every row of `logits` (fp16 [run, vocab], a row-strided view read in place)
    into `out` (float64 [run, vocab]), the tree read from `cells` (int64 [abi.TREE_CELLS]), in stream
    order."""
    run, vocab = logits.shape
    if logits.dtype != torch.float16 or logits.stride(1) != 1:
        raise ValueError("round adjust: the verify's fp16 logits, rows contiguous")
    if vocab != history.vocab:
        raise ValueError(f"round adjust: {vocab} logits a row for a history of {history.vocab}")
    tensors.check_tensor("round adjust cells", cells, torch.int64, (abi.TREE_CELLS,))
    tensors.check_tensor("round adjust out", out, torch.float64, (run, vocab))
    tensors.check_one_device(
        "round adjust", (logits, cells, history.counts, history.seen, history.bias, history.params, out)
    )
    device = logits.device
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    err = _library().elpis_round_adjust(
        logits.data_ptr(), logits.stride(0), vocab, run, cells.data_ptr(), history.counts.data_ptr(),
        history.seen.data_ptr(), history.bias.data_ptr(), history.params.data_ptr(), out.data_ptr(), stream,
    )  # fmt: skip
    if err != 0:
        why = "arguments refused" if err < 0 else f"CUDA error {err}"
        raise RuntimeError(f"round adjust kernel: {why}")
