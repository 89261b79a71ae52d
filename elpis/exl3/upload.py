"""Small host-to-GPU uploads that never stall the host.

`torch.tensor(values, device="cuda")` and `.to("cuda")` from ordinary (pageable) host memory synchronise
the stream after the copy: the host waits for every queued kernel, then the GPU idles while the host queues
the next ones. Inside a verify round that serialises host and GPU time. A pinned source copied with
`non_blocking=True` is ordered on the stream instead; PyTorch's pinned allocator keeps the source block
alive until the copy has run, so the host tensor may be dropped at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch


def pinned(values: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A pinned host tensor of `values` (ExLlamaV3's `get_for_device` uploads these asynchronously)."""
    return torch.tensor(list(values), dtype=dtype).pin_memory()


def upload(values: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` on `device`, copied in stream order (no synchronisation)."""
    return pinned(values, dtype).to(device, non_blocking=True)


# -- the static input buffers of captured CUDA graphs (elpis.exl3.tree_graph, elpis.exl3.draft_graph) ------


def padded_table(pages: Sequence[int], width: int, who: str) -> list[int]:
    """A sequence's pages as a block table of `width` columns, zero-padded (columns past the cache lengths
    are never read). Pages past the width must be unused (0)."""
    if len(pages) > width and any(pages[width:]):
        raise RuntimeError(f"{who}: {len(pages)} pages do not fit the key's {width}")
    return list(pages[:width]) + [0] * (width - min(width, len(pages)))


def static_input(
    buffer: torch.Tensor | None, x: torch.Tensor, device: torch.device | str, who: str
) -> torch.Tensor:
    """The key's buffer for the per-call input `x`: allocated like `x` at the first fill, and every later
    `x` must have its shape and dtype (a captured graph reads the buffer as it was captured)."""
    if buffer is None:
        buffer = torch.empty(x.shape, dtype=x.dtype, device=device)
    if buffer.shape != x.shape or buffer.dtype != x.dtype:
        raise RuntimeError(f"{who}: the input is {x.dtype} {list(x.shape)}, the key holds "
                           f"{buffer.dtype} {list(buffer.shape)}")  # fmt: skip
    return buffer


def fill(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each (buffer, host or device value) in stream order; host values are pinned first."""
    for dst, src in pairs:
        if src.device.type == "cpu" and not src.is_pinned():
            src = src.pin_memory()
        dst.copy_(src, non_blocking=True)


class Staged:
    """Device buffers, each with a pinned host twin that is reused: `put` writes the round's values into the
    twins and queues one copy per buffer in stream order, without allocating.

    `pinned(...)` then `copy_` allocate a pinned block per upload, ~0.09 ms of host time each on the H200
    machine, against ~0.05 ms for a reused twin with its event wait and record (device call 120,
    `upload_costs.py`); a round makes about ten uploads on the host's path. Reusing a twin is safe once the
    copy that last read it has run: `put` waits on an event recorded after those copies (in a round they ran
    long before, so the wait returns at once).

    `Staged.wait_seconds` sums, over every instance in the process, the host's time blocked in those waits
    (the host-time measurement of rounds on the GPU reports it apart: `elpis.bench.rounds_ab.host_time`)."""

    wait_seconds = 0.0

    def __init__(self, *buffers: torch.Tensor) -> None:
        for b in buffers:
            if not (b.is_cuda and b.is_contiguous()):
                raise ValueError("staged uploads go into contiguous CUDA tensors")
        self.buffers = buffers
        self.twins = tuple(torch.empty(b.shape, dtype=b.dtype, pin_memory=True) for b in buffers)
        # numpy views of the twins (the host's writes; numpy has no bf16, which no staged input uses)
        self.views = tuple(t.view(-1).numpy() for t in self.twins)
        self.event = torch.cuda.Event()
        self.queued = False

    def put(self, *values: Sequence[int] | np.ndarray | torch.Tensor | None) -> None:
        """One value per buffer (None: leave that buffer alone): a sequence or array of exactly its element
        count, or a host tensor of its shape and dtype."""
        if len(values) != len(self.buffers):
            raise ValueError(f"{len(values)} values for {len(self.buffers)} staged buffers")
        if self.queued:
            start = time.perf_counter()
            self.event.synchronize()
            Staged.wait_seconds += time.perf_counter() - start
        for twin, view, value in zip(self.twins, self.views, values, strict=True):
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                if value.shape != twin.shape or value.dtype != twin.dtype:
                    raise ValueError(f"a {value.dtype} {list(value.shape)} value for a staged "
                                     f"{twin.dtype} {list(twin.shape)} buffer")  # fmt: skip
                twin.copy_(value)
            elif len(value) != view.size:
                raise ValueError(f"{len(value)} values for a staged buffer of {view.size}")
            else:
                view[:] = value
        for dst, twin, value in zip(self.buffers, self.twins, values, strict=True):
            if value is not None:
                dst.copy_(twin, non_blocking=True)
        self.event.record()
        self.queued = True


class TableUpload:
    """A captured key's block table uploaded alone (rounds on the GPU put the tables, their kernels write the
    other inputs), through a `Staged` made at the first put. A put of the pages the table already holds is
    skipped; whatever else writes the table (an upload of all the key's inputs) calls `forget` first.

    With `count` (int32 [1]), each put also uploads how many of the table's columns are the sequence's pages
    (at most its width): a kernel captured once then reads the count from device memory, where an argument
    would be baked into the graph (the round's tail, `elpis.exl3.round_tail`)."""

    def __init__(self, table: torch.Tensor, who: str, count: torch.Tensor | None = None) -> None:
        if count is not None and (count.shape != (1,) or count.dtype != torch.int32):
            got = f"{count.dtype} {list(count.shape)}"
            raise ValueError(f"{who}: a table's page count is int32 [1], got {got}")
        self.table, self.who = table, who
        self.buffers = (table,) if count is None else (table, count)
        self.staged: Staged | None = None
        # what the last put uploaded, a value per buffer, while nothing else wrote them
        self.uploaded: tuple[tuple[int, ...], ...] | None = None

    def put(self, pages: Sequence[int]) -> None:
        width = self.table.shape[1]
        values = (tuple(padded_table(pages, width, self.who)), (min(len(pages), width),))[: len(self.buffers)]
        if values == self.uploaded:
            return
        if self.staged is None:
            self.staged = Staged(*self.buffers)
        self.staged.put(*values)
        self.uploaded = values

    def forget(self) -> None:
        self.uploaded = None
