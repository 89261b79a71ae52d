"""CUDA-graph-captured tree verifies (issue 8's round time; issue 9's host time per round).

An eager tree verify runs ExLlamaV3's forward module by module: about 30 ms of host time (Python and some
two thousand kernel launches) against about 26 ms of GPU work per round (bench/results/tree/README.md). Here
the forward after the embedding is captured once per key and replayed. The key is (rows, context bucket,
recurrent slot, committed-state row): what a captured forward cannot change between replays. Everything that
does change lives in device buffers filled before each replay, in stream order from pinned memory:

- the embedding output: looked up on the host, as ExLlamaV3 does, then uploaded; or, with the registry switch
  `exl3-embed-gather` (`embed_gather=True`), gathered by the graph's first kernel from ExLlamaV3's host table
  mapped for the device (`elpis.exl3.embed_gather`), from the ids in the integer upload: the same values;
- the block table (the sequence's pages, zero-padded to the bucket's width), `cache_seqlens` (kvp) and the
  position ids (kvp + depth);
- the tree kernels' inputs (`tree_verify.GraphInputs`): kvp, the masks and the GDN plan, which the graph forms
  of the kernels read when they run. The attention grid is sized for the bucket's largest context.

Bit-identity: a replay runs the recorded kernels on the buffers' current contents, and the graph forms of the
tree kernels do the arithmetic of the eager forms (only where the context and the tree come from differs);
tests/exl3/test_tree_graph.py compares replays with eager tree verifies bit for bit on the GPU. The first call
of a key runs the same forward eagerly on the same buffers (the warm-up a capture needs: lazy kernel builds,
autotuning, ExLlamaV3's own per-module graphs) and returns that result; the capture follows, and every later
call of the key replays. `load_backend` creates every key up to its max_context this way at load
(`elpis.exl3.graph_warmup`), so no request pays for a capture.

The commit of a replayed verify is captured too (once per key, after an eager first commit with the same
buffers): the accepted rows' K/V moves (padded to run - 1 moves with a slot copied onto itself) and the GDN
path replay (`gdn_tree_commit_graph`, the path's plan read from device memory). The draft's conditioning on
the accepted rows is replayed by `elpis.exl3.draft_graph.DraftGraphs.condition` (the backend calls it for a
replayed verify, whose export states stay in this key's buffers).

The integer inputs of a replay (block table, kvp, position ids, masks, GDN plan, token ids) are views of one
device buffer per key, filled by one upload from a pinned host twin the key keeps (`upload.Staged`: each
upload costs host time while the GPU waits for the verify, and a fresh pinned block per upload costs more).

With the verify gate (`prelaunch=True`, `elpis.exl3.verify_gate`), `arm` queues the next verify of a captured
key before its tree is known: a harmless input set (a star-shaped dummy tree at the same position and pages),
the gate, the replay. `verify` then writes the real inputs into the key's pinned staging and opens the gate,
and the GPU copies them over the harmless set: the same buffers receive the same values as in a replay.
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from elpis.exl3.capture import forward_after_input, kept_graph
from elpis.exl3.embed_gather import check_ids
from elpis.exl3.tree_verify import (
    PAGE,
    GraphInputs,
    TreeCall,
    TreeLayout,
    commit_moves,
    layout_tree,
    tree_forward,
)
from elpis.exl3.upload import Staged, TableUpload, fill, padded_table, static_input

if TYPE_CHECKING:
    from elpis.exl3.embed_gather import HostTable
    from elpis.exl3.verify_gate import VerifyGate

if sys.byteorder != "little":  # plan_words lays the plan's bytes out as the GPU reads them
    raise ImportError("tree graphs: a little-endian host is required")

MIN_BUCKET = 4096  # smallest context bucket (the attention grid of a capture covers contexts up to it)
# captured forwards kept; the least recently used is dropped past this. Room for both state rows of every
# bucket of the full cache (4K .. 256K and the cap: 8 buckets) at both run sizes, as `elpis.exl3.graph_warmup`
# captures them at load with a run choice (`elpis.spec.run_choice`), and a few spare.
MAX_GRAPHS = 36


PACKED_ALIGN_WORDS = 4  # each input starts on a 16-byte boundary (the tree kernels' alignment rule)


def packed_sizes(width: int, run: int, plan_capacity: int) -> list[tuple[int, int]]:
    """(words, words with padding) of a key's integer inputs, in buffer order: block table, cache_seqlens,
    position ids, ctx, masks (depth then ancestors), GDN plan, token ids (read by the embedding gather only).
    Each is padded to PACKED_ALIGN_WORDS so the next starts 16-byte aligned."""
    if plan_capacity % 4:
        raise ValueError(f"the GDN plan's capacity ({plan_capacity} bytes) is not a whole number of words")
    words = [width, 1, run, 1, 2 * run, plan_capacity // 4, run]
    return [(n, -(-n // PACKED_ALIGN_WORDS) * PACKED_ALIGN_WORDS) for n in words]


def packed_values(segments: Sequence[Sequence[int]], sizes: Sequence[tuple[int, int]]) -> list[int]:
    """The host words of one upload: each segment's values, zero-padded to its padded size."""
    if len(segments) != len(sizes):
        raise ValueError(f"{len(segments)} segments for {len(sizes)} inputs")
    out: list[int] = []
    for values, (n, padded) in zip(segments, sizes, strict=True):
        if len(values) != n:
            raise ValueError(f"an input of {n} words got {len(values)}")
        out += [*values, *([0] * (padded - n))]
    return out


def plan_words(plan: bytes, capacity: int) -> list[int]:
    """A packed GDN plan, zero-padded to `capacity` bytes, as the int32 words that hold its bytes on the
    device (little-endian, as both the host and the GPU are)."""
    if len(plan) > capacity:
        raise ValueError(f"a GDN plan of {len(plan)} bytes does not fit {capacity}")
    padded = plan + bytes(capacity - len(plan))
    return list(struct.unpack(f"<{capacity // 4}i", padded))


def context_bucket(end: int, limit: int) -> int:
    """The smallest power of two >= `end` (at least MIN_BUCKET), capped at `limit` (the cache's tokens)."""
    if not 1 <= end <= limit:
        raise ValueError(f"a verify ending at position {end} is outside the {limit}-token cache")
    bucket = MIN_BUCKET
    while bucket < end:
        bucket *= 2
    return min(bucket, limit)


def bucket_pages(end: int, limit: int) -> int:
    """The block-table width (pages) of the context bucket holding positions < `end`."""
    return -(-context_bucket(end, limit) // PAGE)


def verify_pages(pages: Sequence[int], kvp: int, run: int) -> Sequence[int]:
    """The sequence's pages that a verify of `run` rows from kvp reads and writes (positions below kvp + run):
    a verify of more rows may have allocated pages past this key's context bucket, which its table, one bucket
    narrower, does not hold."""
    return pages[: -(-(kvp + run) // PAGE)]


def context_buckets(end: int, limit: int) -> list[int]:
    """Every bucket a verify ending at a position in 1..`end` falls in, smallest first."""
    last = context_bucket(end, limit)
    out = [context_bucket(1, limit)]
    while out[-1] < last:
        out.append(min(2 * out[-1], limit))
    return out


@dataclass
class Captured:
    """One key's buffers, params and (once captured) graph, with the tensors the graph writes."""

    x: torch.Tensor | None  # [1, run, hidden]: the embedding output (allocated at the first fill)
    ids: torch.Tensor  # int32 [run]: the tree's tokens (the embedding gather's input)
    block_table: torch.Tensor  # int32 [1, pages of the bucket]
    seqlens: torch.Tensor  # int32 [1]
    position_ids: torch.Tensor  # int32 [1, run]
    inputs: GraphInputs
    ints: torch.Tensor  # int32: the storage of every integer input above (`_fill` uploads it at once)
    graph: torch.cuda.CUDAGraph | None = None
    call: TreeCall | None = None  # the captured call: its GDN records point into the graph's memory
    out: torch.Tensor | None = None
    export: list[torch.Tensor] | None = None
    moves: torch.Tensor | None = (
        None  # int64 [4, run - 1]: source page, source offset, dest page, dest offset
    )
    commit_plan: torch.Tensor | None = None  # uint8 [PLAN_CAPACITY]: the GDN path replay's plan
    commit_graph: torch.cuda.CUDAGraph | None = None
    uploads: Staged | None = None  # the verify's inputs: (x, ints), or (ints,) where the graph gathers x
    commit_uploads: Staged | None = None  # (moves, commit_plan)
    table_upload: TableUpload | None = None  # the block table alone, for rounds on the GPU (`put_table`)
    page_count: torch.Tensor | None = None  # int32 [1]: the sequence's columns of the table (`put_table`)
    staging: Staging | None = None  # pinned inputs of verifies queued behind the gate (`TreeGraphs.arm`)


@dataclass
class Staging:
    """A key's pinned host inputs for verifies queued behind the gate, shaped like its device buffers."""

    x: torch.Tensor | None  # the real embedding output, written once the tree is known (None: gathered)
    ints: torch.Tensor  # the real integer inputs
    harmless_x: torch.Tensor | None  # zeros (None: gathered, from the harmless set's ids)
    harmless_ints: torch.Tensor  # a star-shaped dummy tree at the armed position and pages


@dataclass(frozen=True)
class Armed:
    """A verify queued behind the gate: its key, the gate's launch, and the position and table it was armed
    for (the verify that opens it must match them)."""

    key: tuple[int, int, int, int]
    seq: int
    kvp: int
    table: tuple[int, ...]


def harmless_layout(run: int) -> TreeLayout:
    """A star of `run` rows (every row a child of row 0): the dummy tree of an armed verify's harmless set."""
    return layout_tree([-1] + [0] * (run - 1), run)


class TreeGraphs:
    """Captured tree-verify forwards of one engine (one sequence at a time, like the backend)."""

    def __init__(
        self,
        engine: Any,
        export_layers: set[int] | None,
        *,
        prelaunch: bool = False,
        embed_gather: bool = False,
    ) -> None:
        from exllamav3.modules.embedding import Embedding

        self.engine = engine
        self.export_layers = export_layers
        self.device = engine.device
        self.graphs: OrderedDict[tuple[int, int, int, int], Captured] = OrderedDict()
        # One memory pool for every key's forward: a capture's transients are reused by the next capture,
        # so the keys cost their outputs (logits, exports, GDN records) and one set of transients. Safe as
        # long as what a replay writes is consumed before another key replays: a round reads its verify's
        # outputs, commits and conditions the draft before the next verify (`Exl3Backend`).
        self.pool = torch.cuda.graph_pool_handle()
        self.commit_pool = torch.cuda.graph_pool_handle()  # commits leave transients only
        self.captures = 0  # forwards captured so far (tests bound this)
        self.replays = 0
        model = engine.model
        if model.loaded_tp:
            raise RuntimeError("tree graphs: tensor-parallel models are not supported")
        if model._get_prefetch_layers:
            raise RuntimeError("tree graphs: models with prefetching layers are not supported")
        first = model.fwd_modules[0][0]
        if not isinstance(first, Embedding):
            raise RuntimeError(f"tree graphs: the first module is {type(first).__name__}, not the embedding")
        self.embedding = first
        self.table: HostTable | None = None
        if embed_gather:
            from elpis.exl3.embed_gather import host_table

            self.table = host_table(engine)  # registers the table now: a refusal fails the load, not a round
        self.gate: VerifyGate | None = None
        if prelaunch:
            from elpis.exl3.verify_gate import VerifyGate

            self.gate = VerifyGate()  # builds and loads the kernel now: a load fails, not a round
        self.armed: Armed | None = None
        self.gated: int | None = None  # the gate launch the last verify went through, if it did
        self.gated_verifies = 0  # verifies served through the gate (tests and the bench read it)

    def table_width(self, kvp: int, run: int) -> int:
        """The block-table width (pages) of a verify of `run` rows at kvp: its context bucket's."""
        return bucket_pages(kvp + run, self.engine.cache_tokens)

    # -- one verify -------------------------------------------------------------------------------------
    def verify(
        self, state: Any, pages: Sequence[int], ids: Sequence[int], layout: TreeLayout, kvp: int
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, TreeCall]:
        """Logits [1, run, vocab], the export states and the call (GDN records for the commit) of a tree
        verify of `ids` (run rows) at kvp, through a replay when the key was captured before: the armed one,
        opened with this verify's inputs, when `arm` queued it for this key, position and table."""
        run = layout.run
        key = self._key(state, kvp, run)
        captured = self.graphs.get(key)
        armed, self.armed, self.gated = self.armed, None, None
        if armed is not None:
            assert self.gate is not None
            if self._opens(armed, captured, key, kvp, pages):
                assert captured is not None and captured.staging is not None
                self._stage(captured, captured.staging, list(armed.table), ids, layout, kvp)
                self.gate.release(armed.seq)
                self.gated = armed.seq
                self.gated_verifies += 1
                return self._replayed(captured, layout, kvp, key)
            self.gate.release(armed.seq)  # the harmless set runs; this verify is queued after it
        fresh = captured is None
        if captured is None:
            captured = self._buffers(run, key[1])
        self._fill(captured, pages, ids, layout, kvp)
        if fresh:
            # First call of the key: the eager warm-up on the same buffers gives this verify's result.
            call = TreeCall(layout, kvp, key[2], key[3], graph=captured.inputs)
            out, export = self._forward(captured, state, call)
            self._capture(captured, state, layout, kvp, key)
            self.graphs[key] = captured
            while len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
            return out, export, call
        assert captured.graph is not None
        captured.graph.replay()
        return self._replayed(captured, layout, kvp, key)

    def _key(self, state: Any, kvp: int, run: int) -> tuple[int, int, int, int]:
        """(rows, context bucket, recurrent slot, committed-state row) of a verify of `run` rows at kvp."""
        bucket = context_bucket(kvp + run, self.engine.cache_tokens)
        return (run, bucket, int(state.slot), int(state.base_row()))

    def _replayed(
        self, captured: Captured, layout: TreeLayout, kvp: int, key: tuple[int, int, int, int]
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, TreeCall]:
        """The result of a replay of `captured` (queued by the caller) for this layout and position."""
        self.graphs.move_to_end(key)
        assert captured.call is not None and captured.out is not None
        self.replays += 1
        call = TreeCall(layout, kvp, key[2], key[3], gdn=captured.call.gdn, graph=captured.inputs)
        call.attention_layers = captured.call.attention_layers
        call.source = captured
        return captured.out, captured.export, call

    # -- the verify gate --------------------------------------------------------------------------------
    def arm(self, state: Any, pages: Sequence[int], kvp: int, run: int) -> bool:
        """Queue the next verify of `run` rows at kvp behind the gate, on the current stream: the harmless
        input set's copies, the gate, the key's replay. The `verify` that follows opens it. False (nothing
        queued) where the key has no graph yet: its first verify captures it."""
        if self.gate is None:
            raise RuntimeError("tree graphs: arm() needs the verify gate (loaded with prelaunch=False)")
        self.disarm()
        key = self._key(state, kvp, run)
        c = self.graphs.get(key)
        if c is None or c.graph is None or c.x is None:
            return False
        s = c.staging
        if s is None:
            host_x = self.table is None  # a gathered x is written by the graph, never staged
            s = c.staging = Staging(
                torch.empty(c.x.shape, dtype=c.x.dtype, pin_memory=True) if host_x else None,
                torch.empty(c.ints.shape, dtype=c.ints.dtype, pin_memory=True),
                torch.zeros(c.x.shape, dtype=c.x.dtype, pin_memory=True) if host_x else None,
                torch.empty(c.ints.shape, dtype=c.ints.dtype, pin_memory=True),
            )
        table = padded_table(pages, c.block_table.shape[1], "tree graphs")
        if c.table_upload is not None:  # both input sets below write the key's table
            c.table_upload.forget()
        s.harmless_ints.numpy()[:] = self._int_values(table, harmless_layout(run), kvp, [0] * run)
        harmless = [(c.ints, s.harmless_ints)]
        real = [(c.ints, s.ints)]
        if s.x is not None:
            assert s.harmless_x is not None
            harmless.insert(0, (c.x, s.harmless_x))
            real.insert(0, (c.x, s.x))
        fill(harmless)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        seq = self.gate.launch(real, stream)
        c.graph.replay()
        self.armed = Armed(key, seq, kvp, tuple(table))
        return True

    def disarm(self) -> None:
        """Open an armed gate on the harmless set (nothing reads what that verify writes), so that work queued
        after it runs."""
        armed, self.armed = self.armed, None
        if armed is not None:
            assert self.gate is not None
            self.gate.release(armed.seq)

    def _opens(
        self, armed: Armed, c: Captured | None, key: tuple[int, int, int, int], kvp: int, pages: Sequence[int]
    ) -> bool:
        """Whether this verify is the one `armed` was queued for and its gate still waits."""
        assert self.gate is not None
        if c is None or c.staging is None or armed.key != key or armed.kvp != kvp:
            return False
        if tuple(padded_table(pages, c.block_table.shape[1], "tree graphs")) != armed.table:
            return False
        return self.gate.state(armed.seq) == "waiting"

    def inputs_arrived(self) -> bool:
        """False when the last verify went through a gate that has not opened on the host's word (it timed
        out, so the verify ran the harmless set, not its tree): that round must not be committed."""
        if self.gated is None:
            return True
        assert self.gate is not None
        return self.gate.state(self.gated) == "open"

    def commit(self, call: TreeCall, path: Sequence[int], pages: Sequence[int]) -> bool:
        """Commit a replayed verify's accepted `path` (checked by the caller) through its key's commit graph.
        Returns False for a call that did not come from a replay: the caller commits it eagerly."""
        from elpis.exl3 import gdn_tree

        c = call.source
        if c is None:
            return False
        run, kvp = call.layout.run, call.kvp
        plan = gdn_tree.packed_commit_plan(tuple(path))
        self.commit_inputs(c)
        padded = np.frombuffer(plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan)), dtype=np.uint8)
        assert c.commit_uploads is not None
        c.commit_uploads.put(commit_moves(kvp, path, run, pages), padded)
        self.run_commit(c)
        return True

    def commit_inputs(self, c: Captured) -> tuple[torch.Tensor, torch.Tensor]:
        """The key's commit graph inputs (int64 [4, run - 1] K/V moves, uint8 [PLAN_CAPACITY] GDN plan),
        allocated on first use: the host uploads them (`commit`) or a kernel writes them
        (`elpis.exl3.round_tail`)."""
        from elpis.exl3 import gdn_tree

        if c.moves is None or c.commit_plan is None or c.commit_uploads is None:
            run = c.position_ids.shape[1]
            c.moves = torch.zeros((4, run - 1), dtype=torch.long, device=self.device)
            c.commit_plan = torch.zeros((gdn_tree.PLAN_CAPACITY,), dtype=torch.uint8, device=self.device)
            c.commit_uploads = Staged(c.moves, c.commit_plan)
        return c.moves, c.commit_plan

    def run_commit(self, c: Captured) -> None:
        """Commit from the key's commit inputs as they stand (in stream order): the commit graph's replay, or
        on the key's first commit the operations eagerly and then their capture."""
        if c.commit_graph is None:
            self._commit_ops(c)  # this commit, eagerly; the capture below records the same operations
            with kept_graph(self.commit_pool) as graph:
                self._commit_ops(c)
            c.commit_graph = graph
            self.captures += 1
        else:
            c.commit_graph.replay()
            self.replays += 1

    def captured(self, state: Any, kvp: int, run: int) -> Captured | None:
        """The captured key of a verify of `run` rows at kvp (None before its first verify)."""
        c = self.graphs.get(self._key(state, kvp, run))
        return c if c is not None and c.graph is not None else None

    def put_table(self, c: Captured, pages: Sequence[int]) -> None:
        """The sequence's pages into the key's block table alone, and their count into `c.page_count`, in
        stream order (a round on the GPU writes the verify's other inputs itself; its tail reads the
        count)."""
        if c.table_upload is None:
            c.page_count = torch.zeros((1,), dtype=torch.int32, device=self.device)
            c.table_upload = TableUpload(c.block_table, "tree graphs", c.page_count)
        c.table_upload.put(pages)

    def _commit_ops(self, c: Captured) -> None:
        from elpis.exl3.gdn_tree import gdn_tree_commit_graph

        assert c.moves is not None and c.commit_plan is not None and c.call is not None
        sp, so, dp, do = c.moves
        for layer in self.engine.cache.layers.values():
            for t in layer.get_tensors():
                if t is not None:
                    t[dp, do] = t[sp, so]  # the gather completes before the scatter: bitwise row copies
        for r in c.call.gdn.values():
            gdn_tree_commit_graph(r.qkv, r.beta, r.g, r.conv_weight, r.conv_state, r.state, c.commit_plan)

    # -- buffers ----------------------------------------------------------------------------------------
    def _buffers(self, run: int, bucket: int) -> Captured:
        from elpis.exl3 import gdn_tree

        width = -(-bucket // PAGE)
        sizes = packed_sizes(width, run, gdn_tree.PLAN_CAPACITY)
        ints = torch.zeros((sum(padded for _, padded in sizes),), dtype=torch.int32, device=self.device)
        parts = torch.split(ints, [padded for _, padded in sizes])
        views = (t[:n] for t, (n, _) in zip(parts, sizes, strict=True))
        table, seqlens, position_ids, ctx, masks, plan, ids = views
        x = None
        if self.table is not None:  # the gather writes x: allocated now, shaped as ExLlamaV3's output
            x = torch.empty((1, run, self.table.hidden), dtype=torch.float32, device=self.device)
        return Captured(
            x=x,
            ids=ids,
            block_table=table.view(1, width),
            seqlens=seqlens,
            position_ids=position_ids.view(1, run),
            inputs=GraphInputs(ctx=ctx, masks=masks, plan=plan.view(torch.uint8), max_ctx=bucket),
            ints=ints,
        )

    def _int_values(self, table: list[int], layout: TreeLayout, kvp: int, ids: Sequence[int]) -> list[int]:
        """The host words of a key's integer inputs (the layout of `_buffers`) for tree `ids` at kvp."""
        from elpis.exl3 import gdn_tree

        plan = plan_words(gdn_tree.packed_plan(layout.depth, layout.ancestors), gdn_tree.PLAN_CAPACITY)
        masks = [*layout.depth, *layout.ancestors]
        segments = (table, [kvp], layout.position_ids(kvp), [kvp], masks, plan, list(ids))
        return packed_values(segments, packed_sizes(len(table), layout.run, gdn_tree.PLAN_CAPACITY))

    def _embed(self, ids: Sequence[int]) -> torch.Tensor:
        """The embedding output of `ids` on the host, as ExLlamaV3 computes it."""
        return self.embedding.forward(torch.tensor([list(ids)], dtype=torch.long), {})

    def _fill(
        self, c: Captured, pages: Sequence[int], ids: Sequence[int], layout: TreeLayout, kvp: int
    ) -> None:
        """This verify's values into the key's buffers, in stream order (no synchronisation): the embedding
        output, and every integer input in one upload (the layout of `_buffers`)."""
        table = padded_table(pages, c.block_table.shape[1], "tree graphs")
        ints = self._int_values(table, layout, kvp, ids)
        if c.table_upload is not None:  # the upload below writes the table with the rest
            c.table_upload.forget()
        if self.table is not None:
            check_ids(ids, self.table.vocab)
            if c.uploads is None:
                c.uploads = Staged(c.ints)
            c.uploads.put(ints)  # the graph's first kernel gathers x from the ids among them
            return
        x = self._embed(ids)
        c.x = static_input(c.x, x, self.device, "tree graphs")
        if c.uploads is None:
            c.uploads = Staged(c.x, c.ints)
        c.uploads.put(x, ints)

    def _stage(
        self, c: Captured, s: Staging, table: list[int], ids: Sequence[int], layout: TreeLayout, kvp: int
    ) -> None:
        """The same values into the key's pinned staging, for the gate to copy once it opens (`table`: the
        padded block table `_opens` found equal to the armed one)."""
        if s.x is not None:
            x = self._embed(ids)
            static_input(c.x, x, self.device, "tree graphs")  # the shape and dtype the buffers were made for
            s.x.copy_(x)
        else:
            assert self.table is not None
            check_ids(ids, self.table.vocab)
        s.ints.numpy()[:] = self._int_values(table, layout, kvp, ids)

    # -- forward, capture -------------------------------------------------------------------------------
    def _params(self, c: Captured, state: Any, run: int) -> dict[str, Any]:
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": c.block_table,
            "cache": self.engine.cache,
            "cache_seqlens": c.seqlens,
            "position_ids": c.position_ids,
            "recurrent_states": [state],
            "recurrent_history": False,
        }
        if self.export_layers:
            params["export_state_layers"] = self.export_layers
        # attention and recurrence parameters, host-side only (slot tensors are uploaded once, cached)
        self.engine.model.prepare_inputs(torch.zeros((1, run), dtype=torch.long), params)
        return params

    def _layers(self, c: Captured, params: dict[str, Any]) -> torch.Tensor:
        """The embedding gather (with `embed_gather`), then every module after the embedding
        (`elpis.exl3.capture`); the warm-up and the capture both run this, so a key's replays equal its
        warm-up. Inside a tree verify the attention layers take the tree kernels whatever BC attention's
        switch says."""
        assert c.x is not None
        if self.table is not None:
            self.table.gather(c.x, c.ids)
        return forward_after_input(self.engine.model, c.x, params)

    def _forward(
        self, c: Captured, state: Any, call: TreeCall
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        params = self._params(c, state, call.layout.run)
        with tree_forward(call):
            out = self._layers(c, params)
        return out, params.get("export_states")

    def _capture(self, c: Captured, state: Any, layout: TreeLayout, kvp: int, key: tuple) -> None:
        call = TreeCall(layout, kvp, key[2], key[3], graph=c.inputs)
        params = self._params(c, state, layout.run)
        with kept_graph(self.pool) as graph, tree_forward(call):
            out = self._layers(c, params)
        c.graph, c.call, c.out, c.export = graph, call, out, params.get("export_states")
        self.captures += 1
