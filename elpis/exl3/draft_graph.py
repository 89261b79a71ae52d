"""CUDA-graph-captured DFlash2 draft blocks (issue 9: host time per round).

An eager draft block runs ExLlamaV3's DFlash2 forward module by module: five blocks (norms, two dynamic
convolutions, attention, MLP), the final norm, the target's 6 bpw head over the 7 block rows and the
selector's top-k and walk kernels. On the H200 that is about 3.3 ms of host time per round against
1.8 ms of GPU work (bench/results/tree/README.md, call 15), so the GPU waits on Python. Here everything
after the input layer is captured once per block-table width and replayed.

What changes between replays lives in device buffers filled before each replay, in stream order from
pinned memory: the input layer's output (the anchor's embedding and the mask rows, looked up on the host as
ExLlamaV3 does; with the registry switch `exl3-embed-gather`, the graph itself copies the mask rows from a
device copy made at load and gathers the anchor's row from ExLlamaV3's host table mapped for the device, with
the input layer's scale: `elpis.exl3.embed_gather`, the same values), the block table (the sequence's pages,
zero-padded to the key's width), `cache_seqlens` (kvp; the attention's positions and its cache writes follow
it) and the anchor id the selector walks from.

The key is the block table's width: the pages of the block's context bucket (`DraftGraphs.width`, the
tree verify's power-of-two buckets), so a long generation changes key at 8K, 16K, 32K ... rather than every
4,096 tokens. The attention kernels derive their split count from the width, so a replay's arithmetic is
that of the eager block at the key's width, not necessarily at ExLlamaV3's own width (16-page steps); the
draft only proposes, so that changes no output. The least recently used graph is dropped past MAX_GRAPHS.

The draft's conditioning after a commit (ExLlamaV3's `update_kv_from_target`: the verify's tap states of
the accepted rows through the draft's fc, norm, K/V projections, RoPE and cache writes, about 30 kernels)
is captured too (`condition`): one graph per (accepted rows, block-table width, export tensors), the
accepted rows' indices, the table and kvp filled before each replay. Its key includes the addresses of
the verify's export tensors, so only a replayed tree verify (whose exports live in its graph's buffers)
uses it; a replay writes the draft's cache exactly as its warm-up does (tests/exl3/test_draft_graph.py).

Both the warm-up (the first call of a key, run eagerly on the key's buffers) and the capture run
ExLlamaV3's plain module path (`elpis.exl3.capture`): its own graph-captured attention blocks (BC
attention) and MLP blocks are switched off for the duration, since they capture and launch graphs of their
own. A replay therefore
equals its key's warm-up bit for bit (tests/exl3/test_draft_graph.py), not necessarily the eager draft
with BC attention. Speculation stays lossless either way: the draft only proposes, the target's verify and
the proven acceptor decide what is committed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from elpis.exl3.capture import forward_after_input, kept_graph
from elpis.exl3.embed_gather import check_ids
from elpis.exl3.prefix import PAGE
from elpis.exl3.upload import Staged, TableUpload, padded_table, static_input

if TYPE_CHECKING:
    from elpis.exl3.embed_gather import HostTable

MAX_GRAPHS = 9  # captured draft blocks kept: one per context bucket of the full cache (8), and one spare
# captured conditionings kept: accepted-row counts (1-8) of each verify key (host rounds'), and a round on the
# GPU's one of each (`elpis.exl3.graph_warmup` captures them at load for both state rows of every bucket, at
# each row count: 8 x 36 with two row counts and 8 buckets), and room for a few more
MAX_CONDITIONS = 320


def block_pages(pages: Sequence[int], kvp: int, block: int) -> Sequence[int]:
    """The sequence's pages that a draft block of `block` rows from kvp reads and writes (positions below
    kvp + 1 + block): a verify may have allocated pages past the block's context bucket, which the block's
    table, one bucket narrower, does not hold."""
    return pages[: -(-(kvp + 1 + block) // PAGE)]


def update_draft_kv(engine: Any, hidden: Sequence[Tensor], block_table: Tensor, seqlens: Tensor) -> None:
    """The draft's K/V of committed rows from the target's tap states of those rows (`hidden`: one tensor
    [1, rows, hidden] per tap), written at positions seqlens.. through `block_table` (ExLlamaV3's
    `update_kv_from_target`; host tensors are uploaded in stream order, device ones read where they are)."""
    engine.draft.update_kv_from_target(
        target_hidden=list(hidden),
        cache=engine.draft_cache,
        params={"block_table": block_table, "cache_seqlens": seqlens},
        lengths=[hidden[0].shape[1]],
    )


@dataclass
class DraftCaptured:
    """One width's buffers and (once captured) graph, with the tensors the graph writes."""

    x: torch.Tensor | None  # [1, block, hidden]: the input layer's output (allocated at the first fill)
    block_table: torch.Tensor  # int32 [1, width]
    seqlens: torch.Tensor  # int32 [1]
    anchor: torch.Tensor  # int64 [1]
    graph: torch.cuda.CUDAGraph | None = None
    chain: torch.Tensor | None = None  # int64 [block - 1]: the selector's walk after the anchor
    logits: torch.Tensor | None = None  # [block - 1, vocab]: the head's logits of the block rows
    uploads: Staged | None = None  # (block_table, seqlens, anchor), with x first where the host fills it
    table_upload: TableUpload | None = None  # the block table alone, for blocks whose anchor and kvp are on
    # the device (`put_table`)


@dataclass
class ConditionCaptured:
    """One conditioning key's buffers and (once captured) graph."""

    index: torch.Tensor  # int64 [count]: the accepted rows of the verify, root first
    block_table: torch.Tensor  # int32 [1, width]
    seqlens: torch.Tensor  # int32 [1]: kvp, where the accepted rows' K/V go
    graph: torch.cuda.CUDAGraph | None = None
    uploads: Staged | None = None  # (index, block_table, seqlens)


class DraftGraphs:
    """Captured draft blocks of one engine (one sequence at a time, like the backend)."""

    def __init__(self, engine: Any, *, embed_gather: bool = False) -> None:
        model = engine.draft
        if model is None:
            raise RuntimeError("draft graphs: the engine has no draft model")
        if model.loaded_tp:
            raise RuntimeError("draft graphs: tensor-parallel drafts are not supported")
        if model._get_prefetch_layers:
            raise RuntimeError("draft graphs: drafts with prefetching layers are not supported")
        if model.recurrent_state_cls is not None:
            raise RuntimeError("draft graphs: the draft keeps per-sequence recurrent state (load swa_full)")
        first = model.fwd_modules[0][0]
        if type(first).__name__ != "DFlashInputLayer":
            raise RuntimeError(f"draft graphs: the first module is {type(first).__name__}, not the input")
        self.engine = engine
        self.model = model
        self.input_layer = first
        self.block_size = int(engine.draft_config.block_size)
        self.device = engine.device
        self.table: HostTable | None = None
        # the input layer's output for anchor 0, on the device: its rows 1.. (the mask rows) never change
        self.template: Tensor | None = None
        self.scale = float(getattr(first, "input_embedding_scale", 1.0))
        if embed_gather:
            from elpis.exl3.embed_gather import host_table

            self.table = host_table(engine)  # the target's table, which the input layer looks rows up in
            template = first.forward(torch.tensor([[0]], dtype=torch.long), {})
            expected = (1, self.block_size, self.table.hidden)
            if tuple(template.shape) != expected or template.dtype != torch.float32:
                got = f"{template.dtype} {list(template.shape)}"
                raise RuntimeError(f"draft graphs: input layer output {got}, gathered fp32 {expected}")
            self.template = template.to(self.device)
        self.graphs: OrderedDict[int, DraftCaptured] = OrderedDict()
        self.captures = 0  # draft blocks captured so far (tests bound this)
        self.replays = 0
        self.conditioning = True  # replay conditionings (`condition`); off: the backend conditions eagerly
        # keys: (rows, width, export tensors); ("device", rows, width, export tensors) for `condition_from`
        self.conditions: OrderedDict[tuple, ConditionCaptured] = OrderedDict()
        self.condition_captures = 0
        self.condition_replays = 0
        self._condition_pool = torch.cuda.graph_pool_handle()  # shared: the graphs only leave transients
        # shared by the blocks: a block's chain and logits are read back before the next block replays
        self._block_pool = torch.cuda.graph_pool_handle()

    def width(self, kvp: int) -> int:
        """The block-table width (pages) of a draft block at kvp: its context bucket's."""
        from elpis.exl3.tree_graph import bucket_pages

        return bucket_pages(kvp + 1 + self.block_size, self.engine.cache_tokens)

    def block(self, anchor: int, pages: Sequence[int], kvp: int, width: int) -> tuple[Tensor, Tensor]:
        """The selector's chain (block - 1 ids) and the head's logits of the block rows after the anchor, on
        the GPU, for a draft block at kvp over the sequence's `pages` (a table of `width` pages). The tensors
        belong to the key: they are overwritten by the next call of the same width."""
        return self._block(width, lambda c: self._fill(c, anchor, pages, kvp))

    def block_from(
        self, anchor: Tensor, kvp: Tensor, pages: Sequence[int], width: int
    ) -> tuple[Tensor, Tensor]:
        """`block` with the anchor and kvp read from device memory when the block runs (int64 [1] each;
        rounds on the GPU keep them in their state block), copied into the key's buffers in stream order:
        the embedding gather takes the anchor's row from there, so it is required."""
        if self.table is None:
            raise RuntimeError("draft graphs: an anchor on the device needs the embedding gather")

        def fill(c: DraftCaptured) -> None:
            self.put_table(c, pages)
            self.inputs_from(c, anchor, kvp)

        return self._block(width, fill)

    def captured_block(self, width: int) -> DraftCaptured | None:
        """The captured key of a draft block of `width` table pages (None before its first block)."""
        c = self.graphs.get(width)
        return c if c is not None and c.graph is not None else None

    def put_table(self, c: DraftCaptured, pages: Sequence[int]) -> None:
        """The sequence's pages into the key's block table alone, in stream order (`block_from`; a round
        graph runs `inputs_from` itself)."""
        if c.table_upload is None:
            c.table_upload = TableUpload(c.block_table, "draft graphs")
        c.table_upload.put(pages)

    @staticmethod
    def inputs_from(c: DraftCaptured, anchor: Tensor, kvp: Tensor) -> None:
        """The anchor and kvp (int64 [1] each, in device memory) into the key's buffers, in stream order."""
        c.anchor.copy_(anchor)
        c.seqlens.copy_(kvp)  # int64 -> int32

    def _block(self, width: int, fill: Callable[[DraftCaptured], None]) -> tuple[Tensor, Tensor]:
        """The key's replay after `fill` writes its inputs; on the key's first call its eager warm-up on the
        same buffers, then its capture."""
        c = self.graphs.get(width)
        fresh = c is None
        if c is None:
            c = self._buffers(width)
        fill(c)
        if fresh:
            # First call of the key: the eager warm-up on the same buffers gives this block's result.
            chain, logits = self._run(c)
            self._capture(c)
            self.graphs[width] = c
            while len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
            return chain, logits
        self.graphs.move_to_end(width)
        assert c.graph is not None and c.chain is not None and c.logits is not None
        c.graph.replay()
        self.replays += 1
        return c.chain, c.logits

    def warm_up(self, anchor: int, pages: Sequence[int], kvp: int, width: int) -> tuple[Tensor, Tensor]:
        """What the key's warm-up computes for these inputs, run eagerly now on fresh buffers (tests compare
        replays with it)."""
        c = self._buffers(width)
        self._fill(c, anchor, pages, kvp)
        return self._run(c)

    def condition(self, export: Sequence[Tensor], path: Sequence[int], table: Tensor, kvp: int) -> None:
        """Write the draft's K/V of the accepted rows `path` (rows of the verify whose tap states are
        `export`, root first) at positions kvp.. through the block table `table` (host int32 [1, width], the
        verify's), through a replay when the key was captured before. `export` must be tensors that stay in
        place between calls (a replayed verify's)."""
        rows = [int(r) for r in path]
        if not rows:
            raise ValueError("draft graphs: a conditioning needs at least one accepted row")
        host_int32 = table.dtype == torch.int32 and table.device.type == "cpu"
        if table.dim() != 2 or table.shape[0] != 1 or not host_int32:
            raise ValueError("draft graphs: the block table must be a host int32 tensor [1, width]")
        key, c, fresh = self._condition_key((), len(rows), int(table.shape[1]), export)
        if c.uploads is None:
            c.uploads = Staged(c.index, c.block_table, c.seqlens)
        c.uploads.put(rows, table, [kvp])
        self._run_condition(key, c, export, fresh)

    def condition_from(self, export: Sequence[Tensor], index: Tensor, kvp: Tensor, table: Tensor) -> None:
        """`condition` with its inputs read from device memory when it runs (`index` int64 [rows], padded past
        the committed path; `kvp` int32 [1]; `table` int32 [1, width], the verify key's block table), copied
        into the key's buffers in stream order: one key per (rows, width, export tensors), whatever the path's
        length. The rows past the path write K/V at positions the draft never reads before the next
        conditioning overwrites them."""
        if index.dim() != 1 or index.dtype != torch.long or kvp.shape != (1,) or kvp.dtype != torch.int32:
            raise ValueError("draft graphs: conditioning from the device takes int64 rows [n], int32 kvp [1]")
        if table.dim() != 2 or table.shape[0] != 1 or table.dtype != torch.int32 or not table.is_cuda:
            raise ValueError("draft graphs: the block table must be a device int32 tensor [1, width]")
        key, c, fresh = self._condition_key(("device",), int(index.shape[0]), int(table.shape[1]), export)
        self.condition_inputs_from(c, index, kvp, table)
        self._run_condition(key, c, export, fresh)

    @staticmethod
    def condition_inputs_from(c: ConditionCaptured, index: Tensor, kvp: Tensor, table: Tensor) -> None:
        """`condition_from`'s device inputs into the key's buffers, in stream order."""
        c.block_table.copy_(table)
        c.index.copy_(index)
        c.seqlens.copy_(kvp)

    def captured_condition_from(
        self, export: Sequence[Tensor], rows: int, width: int
    ) -> ConditionCaptured | None:
        """The captured key of `condition_from` with `rows` rows through a table of `width` pages from
        `export` (None before its first call)."""
        c = self.conditions.get(self._condition_name(("device",), rows, width, export))
        return c if c is not None and c.graph is not None else None

    def _condition_key(
        self, tag: tuple, rows: int, width: int, export: Sequence[Tensor]
    ) -> tuple[tuple, ConditionCaptured, bool]:
        """The conditioning key of `rows` rows through a table of `width` pages from the export tensors as the
        graph reads them (where, and in what shape, layout and type), behind `tag`; its buffers, made on the
        key's first call (then True)."""
        key = self._condition_name(tag, rows, width, export)
        c = self.conditions.get(key)
        if c is not None:
            return key, c, False
        dev = self.device
        c = ConditionCaptured(
            index=torch.zeros((rows,), dtype=torch.long, device=dev),
            block_table=torch.zeros((1, width), dtype=torch.int32, device=dev),
            seqlens=torch.zeros((1,), dtype=torch.int32, device=dev),
        )
        return key, c, True

    @staticmethod
    def _condition_name(tag: tuple, rows: int, width: int, export: Sequence[Tensor]) -> tuple:
        sources = tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in export)
        return (*tag, rows, width, sources)

    def _run_condition(self, key: tuple, c: ConditionCaptured, export: Sequence[Tensor], fresh: bool) -> None:
        """The key's replay; on its first call the conditioning eagerly, then its capture."""
        if fresh:
            self._condition(c, export)  # this call's conditioning; the capture records the same operations
            with kept_graph(self._condition_pool) as graph:
                self._condition(c, export)
            c.graph = graph
            self.condition_captures += 1
            self.conditions[key] = c
            while len(self.conditions) > MAX_CONDITIONS:
                self.conditions.popitem(last=False)
            return
        self.conditions.move_to_end(key)
        assert c.graph is not None
        c.graph.replay()
        self.condition_replays += 1

    def _condition(self, c: ConditionCaptured, export: Sequence[Tensor]) -> None:
        """ExLlamaV3's conditioning of the draft on the key's buffers (warm-up and capture run this)."""
        update_draft_kv(self.engine, [t.index_select(1, c.index) for t in export], c.block_table, c.seqlens)

    # -- buffers ----------------------------------------------------------------------------------------
    def _buffers(self, width: int) -> DraftCaptured:
        dev = self.device
        x = None
        if self.template is not None:  # written by the graph: the mask rows, then the anchor's row
            x = torch.empty(self.template.shape, dtype=self.template.dtype, device=dev)
        return DraftCaptured(
            x=x,
            block_table=torch.zeros((1, width), dtype=torch.int32, device=dev),
            seqlens=torch.zeros((1,), dtype=torch.int32, device=dev),
            anchor=torch.zeros((1,), dtype=torch.long, device=dev),
        )

    def _fill(self, c: DraftCaptured, anchor: int, pages: Sequence[int], kvp: int) -> None:
        """This block's values into the key's buffers, in stream order (no synchronisation)."""
        table = padded_table(pages, c.block_table.shape[1], "draft graphs")
        if c.table_upload is not None:  # the upload below writes the table with the rest
            c.table_upload.forget()
        if self.table is not None:
            check_ids([anchor], self.table.vocab)  # the graph's first kernel gathers its row from c.anchor
            if c.uploads is None:
                c.uploads = Staged(c.block_table, c.seqlens, c.anchor)
            c.uploads.put(table, [kvp], [anchor])
            return
        x = self.input_layer.forward(torch.tensor([[anchor]], dtype=torch.long), {})
        c.x = static_input(c.x, x, self.device, "draft graphs")
        if c.uploads is None:
            c.uploads = Staged(c.x, c.block_table, c.seqlens, c.anchor)
        c.uploads.put(x, table, [kvp], [anchor])

    # -- forward, capture -------------------------------------------------------------------------------
    def _run(self, c: DraftCaptured) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft block on the key's buffers, after the input layer: the draft's modules, the target's
        head over the block rows, the selector's walk. Warm-up and capture both run exactly this."""
        engine, model = self.engine, self.model
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": c.block_table,
            "cache": engine.draft_cache,
            "cache_seqlens": c.seqlens,
        }
        model.prepare_inputs(torch.zeros((1, 1), dtype=torch.long), params)  # host-side parameters only
        assert c.x is not None
        if self.table is not None:
            # the whole input, every call: the draft's forward updates its input buffer in place
            assert self.template is not None
            c.x.copy_(self.template)
            self.table.gather(c.x[0, :1], c.anchor, self.scale)
        state = forward_after_input(model, c.x, params)[:, 1:]  # rows predicting positions kvp+1 .. kvp+7
        head = engine.model.modules[engine.model.logit_layer_idx]
        logits = head.forward(head.prepare_for_device(state.half().contiguous(), params), params)
        chain, _ = model.selector.walk_block(
            state,
            logits,
            c.anchor,
            vocab_size=engine.vocab_size,
            scale=engine.draft_config.output_multiplier,
            softcap=engine.draft_config.final_logit_softcapping,
        )
        return chain[0, 1:], logits[0, :, : engine.vocab_size]

    def _capture(self, c: DraftCaptured) -> None:
        with kept_graph(self._block_pool) as graph:
            chain, logits = self._run(c)
        c.graph, c.chain, c.logits = graph, chain, logits
        self.captures += 1
