"""What every CUDA-graph capture of an ExLlamaV3 forward in elpis runs (`elpis.exl3.tree_graph` for tree
verifies, `elpis.exl3.draft_graph` for DFlash2 draft blocks), and the eager warm-up before it, so that a
key's replays equal its warm-up.

ExLlamaV3 captures graphs of its own: its MLP blocks (`bc`, at most 8 rows) and its BC attention capture
on a later call and then launch their graph, neither of which may happen inside our capture. Both are
switched off for the duration and restored after; the eager paths they fall back to are ExLlamaV3's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


class Segments:
    """One forward captured as consecutive CUDA graphs on one memory pool, replayed in capture order.

    Why: launching a graph costs host time roughly in proportion to its kernels, and the GPU starts on a graph
    only once its launch returns. A tree verify follows a host synchronisation (the draft's read-back), so
    the whole launch of its ~1,000-kernel graph, ~1.0-1.3 ms on the H200 (device call 65's trace), is GPU idle
    time. With a short first segment (a few blocks) the GPU starts at once and runs it while the host
    launches the rest. The kernels, their order and their inputs are those of one graph: replays are
    bit-identical to the single graph's (tests/exl3/test_tree_graph.py)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a capture has at least one segment, got {count}")
        self.graphs = [torch.cuda.CUDAGraph() for _ in range(count)]
        self.pool = torch.cuda.graph_pool_handle()  # shared: replayed in capture order, never concurrently
        self.active = 0

    def next(self) -> None:
        """End the segment being captured and start the next one (between two kernels of the forward)."""
        if self.active + 1 >= len(self.graphs):
            raise RuntimeError(f"capture segments: all {len(self.graphs)} segments are already used")
        self.graphs[self.active].capture_end()
        self.active += 1
        self.graphs[self.active].capture_begin(pool=self.pool)

    def replay(self) -> None:
        for graph in self.graphs:
            graph.replay()


@contextmanager
def capture_segments(count: int) -> Iterator[Segments]:
    """Capture on a side stream (as `torch.cuda.graph` does) into `count` segments; the body calls `next()`
    between segments and must use every one."""
    segments = Segments(count)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        segments.graphs[0].capture_begin(pool=segments.pool)
        try:
            yield segments
        except BaseException:
            with suppress(RuntimeError):  # the capture may already be invalid; the body's error is the news
                segments.graphs[segments.active].capture_end()
            raise
        segments.graphs[segments.active].capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    if segments.active != count - 1:
        raise RuntimeError(f"capture segments: {segments.active + 1} of {count} segments captured")


@contextmanager
def before_module(module: Any, action: Callable[[], None]) -> Iterator[None]:
    """Run `action` each time `module.forward` is called, just before it (a segment boundary)."""
    own = "forward" in vars(module)  # an instance attribute already (another wrapper): put it back after
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        action()
        return original(*args, **kwargs)

    module.forward = forward
    try:
        yield
    finally:
        if own:
            module.forward = original
        else:
            del module.forward  # the class's method again
