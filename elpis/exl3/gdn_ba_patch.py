"""Patch `exl3-gdn-ba`: inside a tree verify, the Gated DeltaNet layers' gate projections b and a run as two
launches of elpis's kernel (`elpis.exl3.gdn_ba`, patches/kernels/gdn_ba_rows.cu) instead of ExLlamaV3's two
fp16 GEMMs with fp32 outputs (cuBLAS split-K and its reductions, 0.63 ms of a 16-row round on the H200).

`mark(model)` (`load_backend(gdn_ba=True)`, tree mode only) stores on every split-projection GatedDeltaNet
layer its two gate weights transposed into the kernel's operand (about 1 MB per layer; ExLlamaV3's own
merged b/a buffer of the same layout where the layer has one, so no second copy). Inside a tree verify,
`elpis.exl3.tree_verify` runs the layer's forward within `projections(layer)`: there the layer's b_proj
computes both projections and keeps a, and its a_proj returns the kept a for that same input tensor
(ExLlamaV3's torch path calls b_proj, then a_proj, with one input). Outside a tree verify, and for layers not
marked, nothing changes. The kernel's arithmetic is row-invariant, so a verify and plain decoding of one
backend (both tree verifies) still compute the same bits.

Numerics change (another fp32 summation order than cuBLAS's): on by default since session 14, with its GPU
tests, a PASS under the rule pre-registered for it (elpis/gate/rules/exl3-small-gdn-ba-r1.toml), a round A/B
(1.2 ms per tree-16 round) and the 24 GiB test in (bench/results/tree/README.md).
The registry entry only checks, when applied, that the kernel's source is present; `load_backend` refuses
gdn_ba=True while the switch is off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from elpis.exl3 import gdn_ba

PATCH = "exl3-gdn-ba"
MARK = "_elpis_gdn_ba_weights"
_installed: list[bool] = []
# kernel calls made in this process (tests check the patch took effect)
calls = {"gdn_ba": 0}


def install() -> None:
    """The registry entry: nothing of ExLlamaV3 is replaced here (the tree verify's GDN hook applies the patch
    to marked layers); refuses when the kernel's source is missing."""
    if not gdn_ba.SOURCE.is_file():
        raise RuntimeError(f"patch {PATCH}: {gdn_ba.SOURCE} missing")
    if not _installed:
        _installed.append(True)


def installed() -> bool:
    return bool(_installed)


def require_patch() -> None:
    """Refuse a model that asks for the kernel in a process where the registry patch is switched off."""
    from elpis.exl3 import patches

    patches.require_installed(PATCH, installed(), "gdn_ba=True")


def _gate_weights(module: Any) -> tuple[Any, Any]:
    """The layer's b and a weights (fp16 [hidden, heads]), or RuntimeError saying why the kernel cannot serve
    the layer."""
    name = f"layer {getattr(module, 'layer_idx', '?')}"
    if getattr(module, "kda", False) or getattr(module, "ba_proj", None) is not None:
        raise RuntimeError(f"patch {PATCH}: {name} is not a split-projection (Qwen3.5-style) Gated DeltaNet")
    weights = []
    for proj in ("b_proj", "a_proj"):
        linear = getattr(module, proj, None)
        inner = getattr(linear, "inner", None)
        kind = type(inner).__name__
        if inner is None or kind != "LinearFP16":
            raise RuntimeError(f"patch {PATCH}: {name}'s {proj} is not an fp16 linear ({kind})")
        if inner.get_bias_tensor() is not None:
            raise RuntimeError(f"patch {PATCH}: {name}'s {proj} has a bias, which the kernel does not add")
        weights.append(inner.get_weight_tensor())
    return weights[0], weights[1]


def mark(model: Any) -> int:
    """Store the kernel's weight operand on every Gated DeltaNet layer of `model`; returns how many. A model
    without such layers, or with one the kernel cannot serve, is refused."""
    from elpis.exl3 import walk_modules

    require_patch()
    layers = [m for m in walk_modules(model) if type(m).__name__ == "GatedDeltaNet" and m.num_k_heads]
    if not layers:
        raise RuntimeError(f"patch {PATCH}: the model has no Gated DeltaNet layers")
    for module in layers:
        setattr(module, MARK, _operand(module))
    return len(layers)


def _operand(module: Any) -> Any:
    """The layer's kernel operand. ExLlamaV3 allocates, for a quantized split-projection layer, a merged b/a
    weight `ba_weight_t` of exactly this layout ([2 * heads, hidden] fp16, b's rows then a's), which its
    fused decode fills on the first forward that takes it; it is filled here instead and shared, rather than
    holding a second copy (~1 MB per layer, 47 MB for the model). Without that buffer, a tensor of our own."""
    import torch

    wt = gdn_ba.transposed_weights(*_gate_weights(module))
    stock = getattr(module, "ba_weight_t", None)
    if stock is None or getattr(module, "ba_bias", None) is not None:
        return wt
    same = (tuple(stock.shape), stock.dtype, stock.device) == (tuple(wt.shape), wt.dtype, wt.device)
    if not same or not stock.is_contiguous():
        return wt
    with torch.inference_mode():  # ExLlamaV3 allocates its buffers as inference tensors
        stock.copy_(wt)
    module.ba_weight_filled = True  # the values its own fill would write (it has no bias to fill)
    return stock


@contextlib.contextmanager
def projections(module: Any) -> Iterator[None]:
    """Within the block, a marked layer's b_proj computes b and a in one kernel call and its a_proj returns
    that a for the same input tensor; an unmarked layer is left alone."""
    import torch

    wt = getattr(module, MARK, None)
    if wt is None:
        yield
        return
    kept: list[Any] = []

    def b_forward(x: Any, params: dict, out_dtype: Any = None) -> Any:
        if out_dtype not in (None, torch.float):
            raise RuntimeError(f"patch {PATCH}: b_proj asked for {out_dtype}; the kernel writes fp32")
        b, a = gdn_ba.gdn_ba(x.reshape(-1, x.shape[-1]), wt)
        calls["gdn_ba"] += 1
        kept[:] = [x, a]
        return b.view(*x.shape[:-1], b.shape[-1])

    def a_forward(x: Any, params: dict, out_dtype: Any = None) -> Any:
        if not kept or kept[0] is not x or out_dtype not in (None, torch.float):
            raise RuntimeError(f"patch {PATCH}: a_proj called without b_proj on the same input before it")
        a = kept[1]
        kept.clear()
        return a.view(*x.shape[:-1], a.shape[-1])

    module.b_proj.forward, module.a_proj.forward = b_forward, a_forward
    try:
        yield
    finally:
        vars(module.b_proj).pop("forward", None)
        vars(module.a_proj).pop("forward", None)
        kept.clear()
