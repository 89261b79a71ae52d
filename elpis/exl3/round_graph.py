"""A round on the GPU as one graph launch (issue 9: the host's time per round), registry switch
exl3-round-graph.

Queued piece by piece (`elpis.exl3.device_round`), a round is about ten launches and copies from Python: the
draft block's inputs and graph, its candidates and the round plan, the verify's graph, its epilogue and the
round tail, the commit's graph, the conditioning's inputs and graph, the records' copy to the host; 2.3 ms of
host time a round at 1K (call 157). Every input of those pieces is already in device memory but the two block
tables. So once a round key's pieces have run (its first round, eagerly, capturing what was not captured),
the eager pieces are captured too (`capture.capture_piece`, without a device synchronisation) and every piece
is chained as a child graph into one executable graph (`graph_compose.ComposedGraph`). Later rounds of the key
put the two block tables and launch it.

The composed graph runs the same kernels on the same addresses in the same order as the pieces, so its bits
are theirs. A key is everything a piece's capture bakes in: the verify's, the draft block's and the
conditioning's captured keys (held here, so that their memory and identities stay while the graph lives), the
record slot and the draft's top-k. Not the sequence's page count: the tail reads it from device memory,
uploaded with the verify's block table, so a key serves every page count of its context bucket. The
composed graphs live in a small LRU; one evicted while a round that may have launched it is in flight is
retired and dropped only once that round has been read back.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

PATCH = "exl3-round-graph"  # the registry switch (patches/registry.json), read by DeviceRounds
LIMIT = 8  # composed graphs kept: two record slots of a few keys


class Launchable(Protocol):
    def launch(self) -> None: ...


class Composer(Protocol):
    """How pieces become one launch: `capture` turns a function's launches into a piece, `compose` chains
    pieces (captured ones and the keys' own graphs) into one launchable graph."""

    def capture(self, fn: Callable[[], None]) -> Any: ...

    def compose(self, pieces: Sequence[Any]) -> Launchable: ...


class _Launch:
    """A composed graph launched on the current stream."""

    def __init__(self, graph: Any, device: torch.device) -> None:
        self.graph, self.device = graph, device

    def launch(self) -> None:
        self.graph.launch(torch.cuda.current_stream(self.device).cuda_stream)


class CudaComposer:
    """Pieces as kept CUDA graphs captured on a side stream into one shared pool (a round's pieces run one
    after another, and rounds run one after another on one stream, so their transients may share memory),
    composed through the driver."""

    def __init__(self, device: torch.device | str) -> None:
        from elpis.exl3.graph_compose import driver

        driver()  # the driver now: a machine without it fails the load, not a round
        self.device = torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(self.device)

    def capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        from elpis.exl3.capture import capture_piece

        return capture_piece(fn, self.pool, self.stream)

    def compose(self, pieces: Sequence[torch.cuda.CUDAGraph]) -> Launchable:
        from elpis.exl3.graph_compose import ComposedGraph

        stream = torch.cuda.current_stream(self.device).cuda_stream
        return _Launch(ComposedGraph([p.raw_cuda_graph() for p in pieces], stream), self.device)


@dataclass
class RoundGraph:
    """One key's composed round, and what it needs kept: the pieces it was composed of (their graphs) and the
    three captured keys whose buffers the pieces address (the draft block's and the verify's block tables the
    host also puts before each launch). Held here, an evicted key's buffers are not freed under the graph."""

    launchable: Launchable
    draft: Any  # DraftCaptured
    verify: Any  # Captured
    condition: Any  # ConditionCaptured
    pieces: tuple[Any, ...]


class RoundGraphs:
    """The composed rounds of one driver, by key (LRU)."""

    def __init__(self, composer: Composer, limit: int = LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"round graphs: keep at least one composed graph, got {limit}")
        self.composer = composer
        self.limit = limit
        self.graphs: OrderedDict[Hashable, RoundGraph] = OrderedDict()
        self.retired: list[tuple[int, RoundGraph]] = []  # (the last round that may launch it, the graph)
        self.composed = 0
        self.launches = 0
        self.compose_seconds = 0.0  # the host's time composing (a cost per key, not per round)

    def get(self, key: Hashable) -> RoundGraph | None:
        g = self.graphs.get(key)
        if g is not None:
            self.graphs.move_to_end(key)
        return g

    def compose(
        self,
        key: Hashable,
        steps: Sequence[Callable[[], None] | Any],
        keys: tuple[Any, Any, Any],
        number: int,
    ) -> RoundGraph:
        """Compose `steps` (functions, whose launches are captured as pieces, and graphs, taken as they are)
        under `key`; `keys` are the captured (draft block, verify, conditioning) keys the steps address;
        `number` is the round being queued, the last that may have launched a graph this evicts."""
        start = time.perf_counter()
        pieces = tuple(self.composer.capture(s) if callable(s) else s for s in steps)
        graph = RoundGraph(self.composer.compose(pieces), *keys, pieces)
        self.graphs[key] = graph
        while len(self.graphs) > self.limit:
            _, old = self.graphs.popitem(last=False)
            self.retired.append((number, old))
        self.composed += 1
        self.compose_seconds += time.perf_counter() - start
        return graph

    def launch(self, graph: RoundGraph) -> None:
        graph.launchable.launch()
        self.launches += 1

    def release(self, read: int) -> None:
        """Round `read` was read back: drop the retired graphs no round still in flight may have launched."""
        self.retired = [(n, g) for n, g in self.retired if n > read]
