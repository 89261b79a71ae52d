"""One check of a tensor handed to one of elpis's CUDA kernels through ctypes, where a wrong dtype, shape,
layout or device would not fail but be misread: each binding (tree attention, the GDN tree kernel, the
1-16-row EXL3 GEMM) calls `check_tensor` on every argument before the launch. And `float64_word`, how a float
travels in an int64 parameters block that a captured kernel reads from device memory."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# The device type the kernels' operands live on. A CPU test of a binding's caller sets "cpu", where the
# kernels are their CPU emulation (tests/kernels/cuda_emu.py), so every other check here still runs.
KERNEL_DEVICE_TYPE = "cuda"


def on_kernel_device(t: torch.Tensor) -> bool:
    return t.device.type == KERNEL_DEVICE_TYPE


def check_tensor(
    name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int | None, ...], *, align: int = 0
) -> None:
    """Refuse, naming `name`, anything but a contiguous CUDA tensor of `dtype` and `shape` (None: any size)
    whose data address is a multiple of `align` bytes (0: any)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not on_kernel_device(t):
        raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(w is not None and w != s for w, s in zip(shape, t.shape, strict=True)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} must have shape [{want}], got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if align and t.data_ptr() % align:
        raise ValueError(f"{name} must be {align}-byte aligned")


def check_one_device(who: str, tensors: Iterable[torch.Tensor]) -> None:
    """Refuse, naming `who`, operands of one launch that lie on more than one device."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{who} operands on several devices: {sorted(map(str, devices))}")


def check_logit_rows(who: str, logits: torch.Tensor, *, max_rows: int, max_vocab: int) -> None:
    """Refuse, naming `who`, anything but fp16 or fp32 logits [rows, vocab] on the kernels' device whose rows
    are contiguous and 16-byte aligned: the rule of patches/kernels/row_scan.cuh, which the per-row kernels
    (verify_epilogue.cu, draft_candidates.cu) read rows by, 16 bytes a load, with a uint32 row stride, in the
    spans of the proved schedule bend/row_spans.bend (rows of fewer than 2^24 vectors)."""
    import torch

    from elpis.bend.row_spans import MAX_TOTAL, vectors_of

    if not isinstance(logits, torch.Tensor) or logits.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"{who}: logits must be a float16 or float32 tensor [rows, vocab]")
    if logits.dim() != 2:
        raise ValueError(f"{who}: logits must be [rows, vocab], got {list(logits.shape)}")
    if not on_kernel_device(logits):
        raise ValueError(f"{who}: logits must be on a CUDA device, got {logits.device}")
    rows, vocab = logits.shape
    stride = logits.stride(0)
    shape, strides = list(logits.shape), list(logits.stride())
    if not 1 <= rows <= max_rows or not 1 <= vocab <= max_vocab or logits.stride(1) != 1 or stride < vocab:
        rule = f"1..{max_rows} contiguous rows of 1..{max_vocab} values"
        raise ValueError(f"{who}: logits {shape}, strides {strides}: {rule}")
    if vectors_of(vocab, logits.dtype == torch.float16) >= MAX_TOTAL:
        raise ValueError(f"{who}: a row of {vocab} logits is past the proved row spans' domain")
    if stride >= 2**32:
        raise ValueError(f"{who}: logits {shape}, strides {strides}: a row stride past uint32")
    if logits.data_ptr() % 16 or (stride * logits.element_size()) % 16:
        raise ValueError(f"{who}: logits {shape}, strides {strides}: rows must be 16-byte aligned")


def float64_word(x: float) -> int:
    """`x`'s IEEE-754 float64 bits as a signed int64 (a kernel reads them with __longlong_as_double)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]
