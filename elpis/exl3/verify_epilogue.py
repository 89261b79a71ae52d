"""Python entry to the verify's row results (`patches/kernels/verify_epilogue.cu`: a block per span of each
row, then a block per row merging its spans).

`row_results(logits, ids, flags)` writes, for every row of a verify's fp32 logits (a row-strided view, read in
place), the greedy target `elpis.spec.sampling.greedy_ids` gives and the row check
`elpis.spec.integrity.nonfinite_rows` gives, and with `digests` the row's `integrity.logits_digest`: the same
integers as those torch compositions (tests/kernels/test_verify_epilogue_emu.py compares them on adversarial
rows under CPU emulation; tests/kernels/test_verify_epilogue.py on the GPU), from two launches instead of
eight.
Rounds on the GPU (`elpis.exl3.device_round`) use it between the verify and the decision kernel.

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

SOURCE = PATCHES_DIR / "kernels" / "verify_epilogue.cu"
THREADS = 256  # the kernels' block: one per span of a row, and one per row for the merge
MAX_ROWS = 65535

_U32, _U64, _VP = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
# ctypes signatures of the library's C entries (a CPU test checks them against the kernel source)
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_verify_epilogue": (_VP, _U32, _U32, _U32, _U32, _VP, _VP, _VP, _VP, _U64, _VP),
    "elpis_verify_epilogue_spans": (_U32, _U32),
    "elpis_verify_epilogue_threads": (),
}


def bind(lib: ctypes.CDLL, threads: int = THREADS) -> ctypes.CDLL:
    """Set the argument and result types of every entry of a build (GPU or emulated), and check its block (a
    test build may be made with fewer threads: ELPIS_VERIFY_EPILOGUE_THREADS)."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    return nvcc.check_block(lib, "elpis_verify_epilogue_threads", threads, "verify epilogue")


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def load() -> None:
    """Build (or find built) and bind the kernel now, so rounds on the GPU meet a build, or its failure, when
    they are made rather than in their first round."""
    _library()


def check_logits(logits: torch.Tensor) -> None:
    """Refuse logits the kernel cannot read (`tensors.check_logit_rows`). ExLlamaV3's head writes fp16 logits
    (the verify graph's output); fp32 is what the host's checks take."""
    check_logit_rows("verify epilogue", logits, max_rows=MAX_ROWS, max_vocab=2**32 - 1)


def row_results(
    logits: torch.Tensor, ids: torch.Tensor, flags: torch.Tensor, digests: torch.Tensor | None = None
) -> None:
    """Write ids int64 [rows] (greedy_ids), flags int32 [rows] (nonfinite_rows) and, if given, digests int32
    [rows] (logits_digest, fp32 logits only) of `logits`, in stream order on the logits' device."""
    import torch

    check_logits(logits)
    rows, vocab = logits.shape
    fp16 = logits.dtype == torch.float16
    if fp16 and digests is not None:
        raise ValueError("verify epilogue: the digest is defined on float32 logits")
    check_tensor("ids", ids, torch.long, (rows,))
    check_tensor("flags", flags, torch.int32, (rows,))
    if digests is not None:
        check_tensor("digests", digests, torch.int32, (rows,))
    check_one_device("verify epilogue", (logits, ids, flags, *(() if digests is None else (digests,))))
    lib = _library()
    # each span's best value, its index and its sum: 12 bytes, in 4-byte words
    words = 3 * rows * lib.elpis_verify_epilogue_spans(int(fp16), vocab)
    workspace = torch.empty(words, dtype=torch.int32, device=logits.device)
    err = lib.elpis_verify_epilogue(
        logits.data_ptr(), int(fp16), logits.stride(0), vocab, rows, ids.data_ptr(), flags.data_ptr(),
        None if digests is None else digests.data_ptr(), workspace.data_ptr(), 4 * words,
        torch.cuda.current_stream(logits.device).cuda_stream,
    )  # fmt: skip
    if err:
        why = "arguments refused" if err < 0 else f"CUDA error {err}"
        raise RuntimeError(f"verify epilogue kernel: {why}")
