"""Python entry to the Gated DeltaNet gate projections kernel (`patches/kernels/gdn_ba_rows.cu`).

`gdn_ba(x, wt)` computes both gate projections of a GDN layer, b = x W_b and a = x W_a (fp16 weights
[k, nv], fp32 outputs), for 1-16 rows in two launches (spans of k, then their sums), from the weights
stored transposed once (`transposed_weights`). Each output is one fixed sequence of fp32 operations on its
own row (the kernel's header says which), so a row's result does not depend on the other rows or on how many
there are.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device
pointers on the current stream; `bind` sets the entries' types on any build (the GPU's, or the CPU emulation
of tests/kernels/cuda_emu.py).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING

from elpis import nvcc
from elpis.exl3.tensors import check_tensor
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "gdn_ba_rows.cu"
MAX_ROWS = 16
COLUMNS_PER_BLOCK = 4  # the kernel's kColumns: 2 * nv must be a multiple
SPAN = 1024  # the kernel's kSpan: elements of k per block, each span's sums kept in a scratch of partials
ALIGN = 8  # fp16 elements per 16-byte load: k, the row stride and the operands' addresses are multiples

_I32, _U32, _VP = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
# ctypes signatures of the library's C entries (a CPU test checks them against the kernel source)
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_gdn_ba_rows": (_VP, _I32, _VP, _I32, _I32, _U32, _VP, _VP, _VP, _VP),
    "elpis_gdn_ba_columns_per_block": (),
    "elpis_gdn_ba_max_rows": (),
    "elpis_gdn_ba_span": (),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every entry of a build (GPU or emulated), and check that its
    constants are this module's."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    got = (lib.elpis_gdn_ba_columns_per_block(), lib.elpis_gdn_ba_max_rows(), lib.elpis_gdn_ba_span())
    want = (COLUMNS_PER_BLOCK, MAX_ROWS, SPAN)
    if got != want:
        raise RuntimeError(f"gdn ba kernel: columns per block, max rows, span {got}, expected {want}")
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def transposed_weights(b_weight: torch.Tensor, a_weight: torch.Tensor) -> torch.Tensor:
    """The kernel's weight operand from the two projections' weights (fp16 [k, nv] each, as ExLlamaV3's
    fp16 linears hold them): fp16 [2 * nv, k], b's columns then a's, each contiguous along k."""
    import torch

    check_tensor("b_weight", b_weight, torch.half, (None, None))
    check_tensor("a_weight", a_weight, torch.half, tuple(b_weight.shape))
    if (2 * b_weight.shape[1]) % COLUMNS_PER_BLOCK:
        raise ValueError(f"2 x {b_weight.shape[1]} gate columns are not a multiple of {COLUMNS_PER_BLOCK}")
    if b_weight.shape[0] % ALIGN:
        raise ValueError(f"the gate projections' input size {b_weight.shape[0]} is not a multiple of {ALIGN}")
    return torch.cat((b_weight.t(), a_weight.t()), dim=0).contiguous()


def gdn_ba(x: torch.Tensor, wt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """b and a, fp32 [rows, nv] each, of x fp16 [rows, k] (1-16 rows) and wt from `transposed_weights`."""
    import torch

    check_tensor("x", x, torch.half, (None, None), align=16)
    rows, k = x.shape
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"x must have 1..{MAX_ROWS} rows, got {rows}")
    check_tensor("wt", wt, torch.half, (None, k), align=16)
    if k % ALIGN:
        raise ValueError(f"x's rows must have a multiple of {ALIGN} elements, got {k}")
    if wt.shape[0] % COLUMNS_PER_BLOCK or wt.shape[0] == 0:
        raise ValueError(f"wt must have a positive multiple of {COLUMNS_PER_BLOCK} rows, got {wt.shape[0]}")
    if wt.device != x.device:
        raise ValueError("x and wt must be on the same device")
    nv = wt.shape[0] // 2
    spans = -(-k // SPAN)
    partials = torch.empty((spans, rows, 2 * nv), dtype=torch.float32, device=x.device)
    b = torch.empty((rows, nv), dtype=torch.float32, device=x.device)
    a = torch.empty((rows, nv), dtype=torch.float32, device=x.device)
    err = _library().elpis_gdn_ba_rows(
        x.data_ptr(), k, wt.data_ptr(), k, nv, rows, partials.data_ptr(), b.data_ptr(), a.data_ptr(),
        torch.cuda.current_stream(x.device).cuda_stream,
    )  # fmt: skip
    if err:
        raise RuntimeError(f"gdn ba kernel: {'arguments refused' if err < 0 else f'CUDA error {err}'}")
    return b, a
