"""Patch `exl3-async-slice-pointers` (`elpis.exl3.slice_pointers`): the same output pointers as ExLlamaV3's
own `SlicedMultiLinear.c_ptrs`, uploaded without a stream synchronisation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from elpis.exl3 import patches
from elpis.exl3.slice_pointers import slice_addresses


@dataclass
class Linear:
    out_features: int


@dataclass
class Bundle:
    """The attributes of a SlicedMultiLinear that the table is built from (Q 12288, K 1024, V 1024 wide,
    cut into 1024-column slices, like a Qwen3.8 attention layer's bundle)."""

    linears: list[Linear]
    slice_targets: list[int]
    slice_offsets: list[int]

    @property
    def num_src(self) -> int:
        return len(self.linears)


def qkv_bundle() -> Bundle:
    widths = (12288, 1024, 1024)
    targets, offsets = [], []
    for t, w in enumerate(widths):
        for n0 in range(0, w, 1024):
            targets.append(t)
            offsets.append(n0)
    return Bundle([Linear(w) for w in widths], targets, offsets)


def test_addresses_step_through_each_output_by_slice_offset():
    bundle = qkv_bundle()
    outs = [torch.empty(8, lin.out_features, dtype=torch.half) for lin in bundle.linears]
    got = slice_addresses(bundle, outs)
    assert len(got) == 14
    assert got[0] == outs[0].data_ptr() and got[11] == outs[0].data_ptr() + 11 * 1024 * 2
    assert got[12:] == [outs[1].data_ptr(), outs[2].data_ptr()]


def test_bad_outputs_are_refused():
    bundle = qkv_bundle()
    outs = [torch.empty(8, lin.out_features, dtype=torch.half) for lin in bundle.linears]
    with pytest.raises(ValueError, match="3 linears"):
        slice_addresses(bundle, outs[:2])
    with pytest.raises(ValueError, match="1024 columns"):
        slice_addresses(bundle, [outs[0], outs[1], torch.empty(8, 512, dtype=torch.half)])
    with pytest.raises(ValueError, match="contiguous"):
        slice_addresses(bundle, [outs[0], outs[1], torch.empty(1024, 8, dtype=torch.half).t()])


def test_registry_installs_it_by_default():
    entry = next(p for p in patches.load_registry() if p.id == "exl3-async-slice-pointers")
    assert entry.default and entry.kind == "wrap" and entry.module == "elpis.exl3.slice_pointers:install"


@pytest.mark.gpu
def test_same_pointers_as_exllamav3_without_a_sync(small):
    """On every sliced bundle of the small model: ExLlamaV3's table and ours hold the same addresses, and
    ours is built under torch's sync debug mode set to error."""
    from exllamav3.modules.multilinear import SlicedMultiLinear

    from elpis.exl3 import walk_modules
    from elpis.exl3.engine import load_engine

    engine = load_engine(small / "target", None, cache_tokens=4096, warmup=False, progress=False)
    ours = SlicedMultiLinear.c_ptrs
    assert getattr(ours, "original", None) is not None, "the patch is not installed"
    bundles = {
        id(v): v
        for m in walk_modules(engine.model)
        for v in vars(m).values()
        if isinstance(v, SlicedMultiLinear)
    }
    assert bundles, "the small model has no sliced GEMM bundle"
    for bundle in bundles.values():
        outs = [
            torch.empty(5, lin.out_features, dtype=torch.half, device=bundle.device) for lin in bundle.linears
        ]
        stock = ours.original(bundle, outs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            mine = bundle.c_ptrs(outs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert mine.dtype == stock.dtype and mine.device == stock.device
        assert torch.equal(mine, stock)
