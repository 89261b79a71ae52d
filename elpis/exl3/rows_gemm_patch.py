"""Patch `exl3-rows-gemm`: the EXL3 linears of a model loaded with it run elpis's GEMM for 1-16 rows
(`elpis.exl3.rows_gemm`).

The registry entry installs two wrappers (`install`); they act only on models loaded inside `loading(True)`
(`load_engine(..., rows_gemm=True)`), so other models in the same process, stock ExLlamaV3's among them, run
untouched:
- `InferParams.use_mgemm` answers False while such a model loads: ExLlamaV3 then builds no multi-projection
  bundles (attention Q/K/V(+gate), Gated DeltaNet qkv+z, MLP gate+up), whose fused GEMMs run in C++ where no
  wrapper reaches, so every projection is a Linear of its own;
- `LinearEXL3.forward` of a linear of such a model runs `rows_gemm` for a call the kernel takes
  (`eligible`: 1-16 rows of fp16, 4-bit mul1 trellis, no bias, no reconstruct or override request) and the
  original for any other (prefill, the 6-bit head).
Where it reaches (device call 36, `elpis/bench/scripts/rows_gemm_reach.py`): in tree mode (elpis serve's
default with a draft) every EXL3 linear of a verify but the 6-bit head runs the kernel; chain mode keeps
ExLlamaV3's C++ block graphs (`bc` objects of the MLP and Gated DeltaNet layers, whose GEMMs no Python
wrapper reaches), so there the patch changes little. Either way a verify and plain decoding of one backend run
the same kernels.
Numerics change (fp32 transforms, one fp16 rounding of the activations and of the output; error against fp64
below ExLlamaV3's own GEMM's, `bench/results/rows_gemm/README.md`), so the served default stays off until a
quality-gate verdict on the final build passes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from elpis.exl3 import rows_gemm

PATCH = "exl3-rows-gemm"
MARK = "_elpis_rows_gemm"
_originals: dict[str, Any] = {}
_state = threading.local()
calls = {"rows_gemm": 0}  # linears served by the kernel in this process (tests check the patch took effect)


def eligible(linear: Any, x: Any, params: dict, out_dtype: Any) -> bool:
    """Whether `rows_gemm` computes this `LinearEXL3.forward` call exactly as asked."""
    import torch

    if "ovr" in params or params.get("reconstruct"):
        return False
    if x.dtype != torch.half or x.dim() < 1 or x.shape[-1] != linear.in_features or not x.is_cuda:
        return False
    rows = x.numel() // max(x.shape[-1], 1)
    dtype = out_dtype or linear.default_out_dtype
    shape = (linear.in_features // 16, linear.out_features // 16, 16 * rows_gemm.BITS)
    return (
        dtype in (torch.half, torch.float)
        and linear.bias is None
        and linear.mul1
        and not linear.mcg
        and linear.K == rows_gemm.BITS
        and linear.suh is not None
        and linear.svh is not None
        and linear.trellis.dtype == torch.int16
        and tuple(linear.trellis.shape) == shape
        and rows_gemm.supported(rows, linear.in_features, linear.out_features)
    )


def _forward(self: Any, x: Any, params: dict, out_dtype: Any = None) -> Any:
    if not getattr(self, MARK, False) or not eligible(self, x, params, out_dtype):
        return _originals["forward"](self, x, params, out_dtype)
    calls["rows_gemm"] += 1
    return run(self, x, out_dtype)


def run(linear: Any, x: Any, out_dtype: Any = None) -> Any:
    """`rows_gemm` of an `eligible` call of `LinearEXL3.forward`, shaped as that call returns it."""
    y = rows_gemm.rows_gemm(
        x.reshape(-1, linear.in_features).contiguous(), linear.trellis, linear.suh, linear.svh,
        out_dtype or linear.default_out_dtype,
    )  # fmt: skip
    return y.view(*x.shape[:-1], linear.out_features)


def _use_mgemm(self: Any, *args: Any, **kwargs: Any) -> bool:
    if getattr(_state, "loading", False):
        return False
    return _originals["use_mgemm"](self, *args, **kwargs)


def install() -> None:
    """Install the wrappers (idempotent). Refuses, with the reason, when the kernel's schedule header is not
    built or ExLlamaV3 lacks a name it wraps."""
    from exllamav3.model.config import InferParams
    from exllamav3.modules.quant.exl3 import LinearEXL3

    if _originals:
        return
    if not rows_gemm.SCHEDULE_HEADER.is_file():
        raise RuntimeError(f"patch {PATCH}: {rows_gemm.SCHEDULE_HEADER} missing: run make build")
    for owner, name in ((LinearEXL3, "forward"), (InferParams, "use_mgemm")):
        if not callable(getattr(owner, name, None)):
            raise RuntimeError(f"patch {PATCH}: exllamav3 has no {owner.__name__}.{name} to wrap")
    _originals["forward"] = LinearEXL3.forward
    _originals["use_mgemm"] = InferParams.use_mgemm
    LinearEXL3.forward = _forward
    InferParams.use_mgemm = _use_mgemm


def installed() -> bool:
    return bool(_originals)


def require_patch() -> None:
    """Refuse a model that asks for the kernel in a process where the registry patch is switched off."""
    from elpis.exl3 import patches

    if not installed():
        on = patches.enabled(PATCH)
        why = "switched off (ELPIS_PATCH_ROWS_GEMM=0)" if not on else "not applied (patches.apply_all)"
        raise RuntimeError(f"rows_gemm=True needs the registry patch {PATCH}, which is {why}")


@contextlib.contextmanager
def loading(enabled: bool) -> Iterator[None]:
    """Load models inside this: with `enabled`, ExLlamaV3 builds no multi-projection bundles for them."""
    if enabled:
        require_patch()
    before = getattr(_state, "loading", False)
    _state.loading = enabled
    try:
        yield
    finally:
        _state.loading = before


def mark(model: Any) -> int:
    """Route every EXL3 linear of `model` through the kernel; returns how many were marked."""
    from elpis.exl3 import walk_modules

    require_patch()
    count = 0
    for module in walk_modules(model):
        inner = getattr(module, "inner", None)
        if inner is not None and hasattr(inner, "trellis") and hasattr(inner, "svh"):
            setattr(inner, MARK, True)
            count += 1
    return count
