"""One check of a tensor handed to one of elpis's CUDA kernels through ctypes, where a wrong dtype, shape,
layout or device would not fail but be misread: each binding (tree attention, the GDN tree kernel, the
1-16-row EXL3 GEMM) calls `check_tensor` on every argument before the launch."""

from __future__ import annotations

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
