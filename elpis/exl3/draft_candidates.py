"""Python entry to a draft block's candidates from two launches (`patches/kernels/draft_candidates.cu`: a
block per span of each row, then a block per row merging its spans).

`candidates(chain, logits, top_k)` returns what `drafter.block_candidates` returns, in
`drafter.pack_candidates`' layout: per row the selector's chain token and its log-probability under the row's
log-softmax, then the k most likely tokens with theirs. The ids are torch's (ties, which torch leaves
unordered, by lower id); the log-probabilities differ from torch's in the last bits at most (the softmax sum's
order), bounded against fp64 by tests/kernels/test_draft_candidates_emu.py. They only shape the tree: the
acceptor commits the target's own tokens, so the output does not depend on them. Registry switch
`exl3-draft-candidates` (kind switch, read when a DFlash2 drafter is made); off, the drafter keeps torch's
composition.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device pointers
on the current stream; `bind` sets the entries' types on any build (the GPU's, or the CPU emulation).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING

from elpis import nvcc
from elpis.exl3.tensors import check_logit_rows, check_one_device, check_tensor
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

PATCH = "exl3-draft-candidates"
SOURCE = PATCHES_DIR / "kernels" / "draft_candidates.cu"
THREADS = 256  # the kernel's block: one per span of a row, and one per row for the merge
MAX_ROWS = 65535
MAX_K = 16  # the kernel's per-thread lists
MAX_VOCAB = (1 << 24) - 1  # ids travel as float32 in the packed rows

_U32, _U64, _VP = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
# ctypes signatures of the library's C entries (a CPU test checks them against the kernel source)
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_draft_candidates": (_VP, _U32, _U32, _U32, _U32, _VP, _U32, _VP, _U64, _VP, _VP),
    "elpis_draft_candidates_spans": (_U32, _U32),
    "elpis_draft_candidates_threads": (),
}


def bind(lib: ctypes.CDLL, threads: int = THREADS) -> ctypes.CDLL:
    """Set the argument and result types of every entry of a build (GPU or emulated), and check its block (a
    test build may be made with fewer threads: ELPIS_DRAFT_CANDIDATES_THREADS)."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    return nvcc.check_block(lib, "elpis_draft_candidates_threads", threads, "draft candidates")


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def load() -> None:
    """Build (or find built) and bind the kernel now: a drafter that will use it calls this when it is made,
    so a build, or its failure, comes at load rather than inside the first request."""
    _library()


def check_logits(logits: torch.Tensor) -> None:
    """Refuse logits the kernel cannot read (`tensors.check_logit_rows`), or ids past float32's exact
    integers."""
    check_logit_rows("draft candidates", logits, max_rows=MAX_ROWS, max_vocab=MAX_VOCAB)


def candidates(chain: torch.Tensor, logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """float32 [rows, 2 + 2k], k = min(top_k, vocab) (`drafter.pack_candidates`' layout), from the chain int64
    [rows] and the rows' logits, in stream order on the logits' device."""
    import torch

    check_logits(logits)
    rows, vocab = logits.shape
    if top_k < 1:
        raise ValueError(f"draft candidates: top_k must be at least 1, got {top_k}")
    k = min(top_k, vocab)
    if k > MAX_K:
        raise ValueError(f"draft candidates: at most {MAX_K} candidates a row, asked for {k}")
    check_tensor("chain", chain, torch.long, (rows,))
    check_one_device("draft candidates", (logits, chain))
    lib, fp16 = _library(), int(logits.dtype == torch.float16)
    out = torch.empty((rows, 2 + 2 * k), dtype=torch.float32, device=logits.device)
    # the spans' k best keys (8 bytes each) and sums (4 bytes), in 8-byte words
    words = (rows * lib.elpis_draft_candidates_spans(fp16, vocab) * (8 * k + 4) + 7) // 8
    workspace = torch.empty(words, dtype=torch.int64, device=logits.device)
    err = lib.elpis_draft_candidates(
        logits.data_ptr(), fp16, logits.stride(0), vocab, rows, chain.data_ptr(), k, workspace.data_ptr(),
        8 * words, out.data_ptr(), torch.cuda.current_stream(logits.device).cuda_stream,
    )  # fmt: skip
    if err:
        why = "arguments refused" if err < 0 else f"CUDA error {err}"
        raise RuntimeError(f"draft candidates kernel: {why}")
    return out
