"""Patch `exl3-async-slice-pointers`: ExLlamaV3's sliced multi-projection GEMM gets its output pointer table
without stopping the host.

`SlicedMultiLinear.c_ptrs` (the Q/K/V(+gate) bundle of every attention layer and the qkv+z bundle of every
Gated DeltaNet layer) builds a table of output addresses and uploads it from pageable memory, which
synchronises the stream. Its graph-captured decode blocks never call it per step, but every eager forward
does: measured on the H200 (bench/results/tree/README.md, round sync diagnosis), 64 synchronisations per
tree verify, one per layer, each letting the GPU run dry while the host queues the next layer. The
replacement computes the same addresses (slice i of output t starts `offset * element_size` bytes into it)
and uploads them from pinned memory in stream order: the kernel reads identical pointers, so no arithmetic
changes. Installed by `elpis.exl3.patches.apply_all()` (registry entry).
"""

from __future__ import annotations

from typing import Any

MARK = "_elpis_async_slice_pointers"
_CAPTURED_SOURCES: list[Any] = []  # pinned tables a CUDA graph copies from: kept for the process


def slice_addresses(bundle: Any, outputs: list[Any]) -> list[int]:
    """Address of every slice's first output column, checked against the bundle's shapes."""
    if len(outputs) != bundle.num_src:
        raise ValueError(f"sliced GEMM: {len(outputs)} outputs for a bundle of {bundle.num_src} linears")
    addresses = []
    for target, offset in zip(bundle.slice_targets, bundle.slice_offsets, strict=True):
        out = outputs[target]
        width = bundle.linears[target].out_features
        if not out.is_contiguous() or out.shape[-1] != width:
            raise ValueError(
                f"sliced GEMM: output {target} must be contiguous with {width} columns, got "
                f"{list(out.shape)} (contiguous: {out.is_contiguous()})"
            )
        addresses.append(out.data_ptr() + offset * out.element_size())
    return addresses


def install() -> None:
    import torch
    from exllamav3.modules import multilinear

    from elpis.exl3.upload import pinned

    cls = multilinear.SlicedMultiLinear
    if getattr(cls.c_ptrs, MARK, False):
        return

    def c_ptrs(self: Any, outputs: list[Any]) -> Any:
        host = pinned(slice_addresses(self, outputs), torch.long)
        if torch.cuda.is_current_stream_capturing():
            _CAPTURED_SOURCES.append(host)  # a captured copy re-reads its host source at every replay
        return host.to(self.device, non_blocking=True)

    setattr(c_ptrs, MARK, True)
    c_ptrs.original = cls.c_ptrs  # type: ignore[attr-defined]  # for the GPU test that compares both
    cls.c_ptrs = c_ptrs
