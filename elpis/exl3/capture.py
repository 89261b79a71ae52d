"""What every CUDA-graph capture of an ExLlamaV3 forward in elpis runs (`elpis.exl3.tree_graph` for tree
verifies, `elpis.exl3.draft_graph` for DFlash2 draft blocks), and the eager warm-up before it, so that a
key's replays equal its warm-up.

ExLlamaV3 captures graphs of its own: its MLP blocks (`bc`, at most 8 rows) and its BC attention capture
on a later call and then launch their graph, neither of which may happen inside our capture. Both are
switched off for the duration and restored after; the eager paths they fall back to are ExLlamaV3's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def plain_module_path(model: Any) -> Iterator[None]:
    """Run `model` with its graph-captured MLP blocks and ExLlamaV3's BC attention switched off."""
    import exllamav3.modules.attn as attn

    from elpis.exl3 import walk_modules

    blocks = [(m, m.bc) for m in walk_modules(model) if "MLP" in type(m).__name__ and getattr(m, "bc", None)]
    bc_attn = attn._bc_attn_enable
    for m, _ in blocks:
        m.bc = None
    attn._bc_attn_enable = False
    try:
        yield
    finally:
        attn._bc_attn_enable = bc_attn
        for m, bc in blocks:
            m.bc = bc


def forward_after_input(model: Any, x: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """ExLlamaV3's layer-split forward over every module after the first (the embedding or the draft's
    input layer, which the caller runs on the host into a static buffer `x`), on the plain module path."""
    modules = model.fwd_modules
    model.fwd_modules = modules[1:]
    try:
        with plain_module_path(model):
            return model.forward_ls(x, params)
    finally:
        model.fwd_modules = modules


@contextmanager
def kept_graph(pool: Any) -> Iterator[torch.cuda.CUDAGraph]:
    """`torch.cuda.graph` into `pool`, on a graph that keeps its `cudaGraph_t` (rounds on the GPU compose the
    captured verifies, commits, draft blocks and conditionings as child graphs: `elpis.exl3.round_graph`),
    instantiated at once as a plain capture is, so its replays are what they were."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph, pool=pool):
        yield graph
    graph.instantiate()


def capture_piece(fn: Any, pool: Any, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """A kept graph of the launches `fn()` queues, captured on `stream` into `pool` without the device
    synchronisation of `torch.cuda.graph`: capturing runs nothing, so the rounds in flight on the serving
    stream go on, and what the piece allocates comes from `pool`. Only this thread's unsafe calls fail it."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            fn()
        finally:
            graph.capture_end()
    graph.instantiate()
    return graph
