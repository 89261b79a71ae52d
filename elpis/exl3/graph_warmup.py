"""Capture at load every CUDA graph a round can need (issue 10: the first round after a prefill).

Tree verifies and their commits are captured per (rows, context bucket, recurrent slot, state row), the
draft's conditionings per (accepted rows, verify key) and draft blocks per context bucket
(`elpis.exl3.tree_graph`, `elpis.exl3.draft_graph`). Captured lazily, the first round in a new bucket pays for
its keys' warm-ups and captures: 150-190 ms on the H200 (device calls 64-65), inside the time to first token
of every prompt that reaches a bucket not seen before. `capture_graphs` creates every key at load instead.

It runs the lazy path itself, key by key, on a throwaway sequence: a fresh recurrent slot (the next sequence's
`get_new_state` clears it again) and one scratch K/V page that every column of the block tables points at. The
warm-ups write their K/V rows and commits into that page and attention reads it at every position; nothing
computed is kept. Each key therefore gets the buffers, warm-up and capture the lazy path would have given it,
and later replays compute what they would have computed (tests/exl3/test_tree_graph.py runs a generation
after a load-time capture against plain decoding and checks that it captured nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from elpis.backend import BackendError

if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend
    from elpis.exl3.draft_graph import DraftGraphs


@dataclass(frozen=True)
class WarmupReport:
    buckets: list[int]  # the verify buckets captured, smallest first
    tree: int  # tree-verify forwards and their commits captured
    conditions: int  # draft conditionings
    blocks: int  # draft blocks
    seconds: float
    bytes: int  # device memory the captures keep (allocated after minus before)
    # seconds of a round's captured graphs by (run, bucket): the verify's replay and the draft block's, the
    # medians of TIMED_REPLAYS each (the costs `elpis.spec.run_choice` weighs the backend's runs by)
    round_seconds: dict[tuple[int, int], float]


TIMED_REPLAYS = 5


def replay_seconds(graph: torch.cuda.CUDAGraph, device: torch.device) -> float:
    """The median time of TIMED_REPLAYS replays of a captured graph, each between two CUDA events."""
    times = []
    for _ in range(TIMED_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def capture_graphs(backend: Exl3Backend, *, device_rounds: bool | None = None) -> WarmupReport:
    """Capture every graph key a round of `backend` can reach (each of its tree runs, contexts up to its
    max_context), before any request, and time each run's round graphs per context bucket. Keys captured
    before are replayed once, harmlessly. With `device_rounds` (None: whether the backend has rounds on the
    GPU attached), also each verify key's conditioning from device inputs (`DraftGraphs.condition_from` on
    the tree run's rows through the key's own block table), which rounds on the GPU replay after each commit:
    captured lazily, the first such round in a bucket would stop for a capture mid-request."""
    from elpis.exl3 import draft_graph, tree_graph
    from elpis.exl3.backend import MAX_ROWS

    if device_rounds is None:
        device_rounds = backend.device_rounds is not None
    graphs = backend.graphs
    if graphs is None:
        raise ValueError("capture_graphs needs tree graphs (load_backend(tree=True, tree_graphs=True))")
    if backend.active:
        raise BackendError("capture_graphs() while a sequence is active")
    engine = backend.engine
    runs = backend.tree_runs()  # host rounds and rounds on the GPU verify at any of them
    end = backend.info.max_context + MAX_ROWS  # the furthest a verify (and a draft block) can reach
    buckets = tree_graph.context_buckets(end, engine.cache_tokens)
    blocks = backend.drafter.graphs if backend.drafter is not None else None
    conditioning = blocks is not None and blocks.conditioning and bool(backend.export_layers)
    depth = backend.block_size  # longest accepted path: the anchor and the draft's block - 1 tokens
    keys = 2 * len(buckets) * len(runs)
    if keys > tree_graph.MAX_GRAPHS or (blocks is not None and len(buckets) > draft_graph.MAX_GRAPHS):
        raise ValueError(f"{len(buckets)} context buckets do not fit the graph caches' bounds")
    conditions = keys * depth + (keys if device_rounds else 0)
    if conditioning and conditions > draft_graph.MAX_CONDITIONS:
        raise ValueError(f"{conditions} conditionings do not fit MAX_CONDITIONS")
    counts = (graphs.captures, blocks.captures if blocks else 0, blocks.condition_captures if blocks else 0)
    torch.cuda.synchronize(engine.device)
    allocated = torch.cuda.memory_allocated(engine.device)
    t0 = time.perf_counter()
    state = engine.cache.get_new_state()
    page = backend.prefix.allocate()
    seconds: dict[tuple[int, int], float] = {}
    try:
        for bucket in buckets:
            width = tree_graph.bucket_pages(bucket, engine.cache_tokens)  # each run's verify table there
            for run in runs:
                verify = _capture_bucket(backend, state, page, bucket, run, depth, device_rounds,
                                         blocks if conditioning else None)  # fmt: skip
                seconds[(run, bucket)] = replay_seconds(verify, engine.device)
            kvp = bucket - 1 - depth
            draft = 0.0
            if blocks is not None and kvp >= 0:
                if blocks.width(kvp) != width:
                    raise RuntimeError(f"graph warm-up: the draft's bucket at {kvp} is not {bucket}")
                blocks.block(0, [page] * width, kvp, width)
                captured = blocks.captured_block(width)
                if captured is None or captured.graph is None:
                    raise RuntimeError(f"graph warm-up: the draft block of bucket {bucket} was not captured")
                draft = replay_seconds(captured.graph, engine.device)
            for run in runs:
                seconds[(run, bucket)] += draft
        torch.cuda.synchronize(engine.device)
    finally:
        backend.prefix.release([page])
        state.free()
    return WarmupReport(
        buckets=buckets,
        tree=graphs.captures - counts[0],
        conditions=(blocks.condition_captures - counts[2]) if blocks else 0,
        blocks=(blocks.captures - counts[1]) if blocks else 0,
        seconds=time.perf_counter() - t0,
        bytes=torch.cuda.memory_allocated(engine.device) - allocated,
        round_seconds=seconds,
    )


def _capture_bucket(backend: Exl3Backend, state: object, page: int, bucket: int, run: int, depth: int,
                    device_rounds: bool, blocks: DraftGraphs | None) -> torch.cuda.CUDAGraph:  # fmt: skip
    """Capture the keys of `run` rows at the top of `bucket` (both state rows: verify, commit, and with the
    draft's graphs `blocks` (None: no conditioning) its conditionings: the host rounds' for each accepted row
    count, and the one a round on the GPU names), and return the verify graph of the last."""
    from elpis.exl3.tree_verify import layout_tree
    from elpis.exl3.upload import padded_table

    graphs, engine = backend.graphs, backend.engine
    assert graphs is not None
    layout = layout_tree([-1], run)  # the root alone: the keys do not depend on the tree
    ids = [0] * run
    kvp = bucket - run
    width = graphs.table_width(kvp, run)
    pages = [page] * width
    table = torch.tensor([padded_table(pages, width, "graph warm-up")], dtype=torch.int32).pin_memory()
    c = None
    for parity in (0, 1):
        state.parity, state.position = parity, kvp  # type: ignore[attr-defined]
        graphs.verify(state, pages, ids, layout, kvp)  # a new key: warm-up, then capture
        state.position = kvp  # type: ignore[attr-defined]
        _, export, call = graphs.verify(state, pages, ids, layout, kvp)  # a replay: commits capture
        if not graphs.commit(call, [0], pages):
            raise RuntimeError(f"graph warm-up: the verify of bucket {bucket} did not replay")
        c = graphs.captured(state, kvp, run)
        assert c is not None and c.graph is not None
        if blocks is not None and export is not None:
            for rows in range(1, depth + 1):
                blocks.condition(export, list(range(rows)), table, kvp)
            if device_rounds:  # the key a round on the GPU names: its verify's export and table
                assert c.export is not None
                index = torch.zeros((run,), dtype=torch.long, device=engine.device)
                at = torch.tensor([kvp], dtype=torch.int32, device=engine.device)
                blocks.condition_from(c.export, index, at, c.block_table)
    assert c is not None and c.graph is not None
    return c.graph
