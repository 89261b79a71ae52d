"""The `Backend` over ExLlamaV3: prefill, chain verify, commit with K/V and Gated DeltaNet rewind.

One sequence at a time (`begin` ... `finish`). The paged 3-bit K/V cache and the recurrent state are
ExLlamaV3's; this module decides what runs and keeps the bookkeeping:

- `begin`: reuse the longest exact prefix from the prefix cache (`elpis.exl3.prefix`), prefill the rest in
  chunks whose boundaries depend only on absolute positions (2048-token chunks, a cut at the last page
  boundary, like ExLlamaV3's own generator, so the stock comparison is bit-exact), feeding the DFlash2
  draft's K/V from the target's tap layers after every chunk. With `prefill_group` > 1 (the default with the
  registry patch exl3-prefill-groups) up to that many chunks run layer-major, each EXL3 weight rebuilt once
  for them (`elpis.exl3.prefill_groups`; same kernels on the same chunks, bitwise the same cache and state).
- `verify`: one forward over the anchor and the draft rows with the recurrent state's history on, so the
  rejected rows can be undone. Rows must form a chain (`parents == [-1, 0, 1, ...]`); trees raise
  `ValueError` until tree verify lands (issue 8). With `fixed_rows` every call runs that many rows (padding
  with copies of the last token), so a row's arithmetic never depends on how many rows the caller sent:
  plain decoding and speculative decoding then run the very same kernels on the anchor row. Measured on
  the H200 (bench/results/lossless-2026-11-30.md): without padding, 1-row and 8-row results diverge; with
  the Gated DeltaNet state in fp16 (ExLlamaV3's default) accepted drafts change the output, in fp32 (elpis's
  default, `load_backend(gdn_state_fp32=True)`) they did not.
- `commit`: the accepted prefix of the chain stays; the Gated DeltaNet state is rewound by replaying the
  accepted rows from the committed state (ExLlamaV3's `GDNState.rewind`); K/V of rejected rows are left in
  place and overwritten by the next round; the draft's K/V are updated from the accepted rows' tap states.

Tree mode (`tree=True`, issue 8; off by default until the GPU evidence is in): every verify, a 1-row plain
decoding step included, runs as a token tree of `fixed_rows` rows (8 or 16, `tree_verify.TREE_RUNS`) through
`elpis.exl3.tree_verify` (our tree attention and Gated DeltaNet kernels inside ExLlamaV3's forward, rows at
positions kvp + depth, padding rows as leaves of the root), so plain and speculative decoding share every
kernel and a row's arithmetic depends only on its own path. Its commit takes any root-first path of the tree:
the accepted rows' K/V move to sequential slots, the GDN state replays the path from the committed state, and
the draft is fed the path rows' tap states.

Acceptance is never decided here: `elpis.spec` calls `elpis.accept` and passes the committed rows.
Every entry point runs under `torch.inference_mode()`: ExLlamaV3 allocates its caches and states in it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from elpis.backend import BackendError, BackendInfo
from elpis.exl3.capture import plain_module_path
from elpis.exl3.draft_graph import update_draft_kv
from elpis.exl3.engine import Engine
from elpis.exl3.prefix import PAGE, GiB, PrefixCache, Snapshot, prefill_boundaries, prefix_key
from elpis.exl3.tree_verify import TREE_RUNS, TreeCall, TreeLayout, check_parents, check_path, layout_tree
from elpis.exl3.upload import pinned, upload
from elpis.spec.run_choice import smallest_run

if TYPE_CHECKING:
    from elpis.exl3.device_round import DeviceRounds
    from elpis.exl3.graph_warmup import WarmupReport
    from elpis.spec.run_choice import RunChoice

MAX_ROWS = 16


def check_chain(parents: Sequence[int], rows: int) -> None:
    if len(parents) != rows:
        raise ValueError(f"verify got {rows} tokens but {len(parents)} parents")
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"verify takes 1..{MAX_ROWS} rows, got {rows}")
    if list(parents) != list(range(-1, rows - 1)):
        if parents[0] != -1 or any(not 0 <= p < r for r, p in enumerate(parents) if r):
            raise ValueError(
                f"parents {list(parents)} are not a tree (parents[0] == -1, 0 <= parents[r] < r)"
            )
        raise ValueError(
            f"the exl3 backend verifies chains only (parents [-1, 0, 1, ...]); got the tree {list(parents)}. "
            "Tree verify is issue 8; run the speculation core with draft_top_k=1 until then"
        )


def stock_table_width(tokens_needed: int) -> int:
    """Block-table width in pages, rounded up to 16 like ExLlamaV3's generator (the split-K attention kernels
    derive their split count from the width, so matching it keeps results equal to stock)."""
    pages = -(-tokens_needed // PAGE)
    return -(-pages // 16) * 16


class CachePageStore:
    """`PageStore` over the target's and the draft's quantized K/V caches (same page layout) and the
    recurrent state of the backend's one slot."""

    def __init__(self, backend: Exl3Backend) -> None:
        self.backend = backend
        engine = backend.engine
        caches = [engine.cache] + ([engine.draft_cache] if engine.draft_cache is not None else [])
        self.parts: list[torch.Tensor] = []
        for cache in caches:
            for layer in cache.layers.values():
                self.parts += [t for t in layer.get_tensors() if t is not None]
        self.sizes = [t[0].numel() * t.element_size() for t in self.parts]
        self.page_bytes = sum(self.sizes)
        self.staging = torch.empty(self.page_bytes, dtype=torch.uint8, pin_memory=True)
        # pinned staging buffers for the snapshots' device-to-host copies, one per snapshot in flight; the
        # first is allocated now rather than in the first request's prefill (the layers' shapes are known
        # even before their tensors are allocated), more when a prefill group holds several snapshots
        _, self.state_bytes = _spans(src for _, _, src in self._state_sources(0, 0))
        self.stagings: list[_Staging] = []
        self.reserve_stagings(1)
        self.copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elpis-snapshot")

    def reserve_stagings(self, count: int) -> None:
        """At least `count` state staging buffers, allocated now (none without recurrent layers)."""
        while self.state_bytes and len(self.stagings) < count:
            self.stagings.append(_Staging(torch.empty(self.state_bytes, dtype=torch.uint8, pin_memory=True)))

    def read_page(self, page: int) -> torch.Tensor:
        offset = 0
        for t, n in zip(self.parts, self.sizes, strict=True):
            self.staging[offset : offset + n].copy_(t[page].reshape(-1).view(torch.uint8), non_blocking=True)
            offset += n
        torch.cuda.synchronize(self.backend.engine.device)
        return self.staging.clone()

    def write_page(self, page: int, data: torch.Tensor) -> None:
        if data.numel() != self.page_bytes:
            raise ValueError(f"page data has {data.numel()} bytes, the cache layout needs {self.page_bytes}")
        offset = 0
        for t, n in zip(self.parts, self.sizes, strict=True):
            t[page].reshape(-1).view(torch.uint8).copy_(data[offset : offset + n])
            offset += n

    def save_state(self) -> dict[str, torch.Tensor]:
        """The slot's recurrent and conv state as CPU tensors, filled in the background: `settle()` before
        reading them. The rows are those ExLlamaV3's `stash` copies. `stash` copies each of ~100 tensors into
        fresh pageable memory with a host wait per copy: ~120 ms per snapshot of Qwen3.8's 155 MB on the H200,
        in the middle of the prefill (device call 64). Here the device-to-host copies go in stream order into
        a pinned staging buffer, allocated at load (its allocation cost ~45 ms at the first snapshot, call
        65), and a worker thread waits for them and copies into pageable tensors (~27 ms per snapshot) while
        the host goes on queueing the prefill or the first round."""
        capture = self.capture_state()
        capture.copy_all()
        return capture.finish()

    def capture_state(self) -> StateCapture:
        """A snapshot of the state taken layer by layer: `copy_module(m)` queues the copies of recurrent layer
        `m`'s rows as they are now (in stream order), `finish()` once every layer is copied. A prefill in
        layer-major groups takes a snapshot inside a group this way, copying each layer as it passes the
        snapshot's position."""
        gdn = self.backend.state
        if gdn.last_history:
            raise BackendError("snapshot of a recurrent state with an unsettled speculative pass")
        sources = self._state_sources(gdn.slot, 2 * gdn.slot + gdn.parity)  # the slot's committed row
        spans, total = _spans(src for _, _, src in sources)
        return StateCapture(self, self._free_staging(total), sources, spans)

    def _free_staging(self, size: int) -> _Staging:
        """A staging buffer no snapshot is using: one whose copies have drained, else a new one."""
        for staging in self.stagings:
            pending = staging.drained
            if staging.busy or staging.buffer.numel() < size or (pending is not None and not pending.done()):
                continue
            staging.drained = None
            if pending is not None:
                pending.result()  # re-raises a failed copy here rather than losing it
            staging.busy = True
            return staging
        staging = _Staging(torch.empty(size, dtype=torch.uint8, pin_memory=True), busy=True)
        self.stagings.append(staging)
        return staging

    def settle(self) -> None:
        """Wait until every state `save_state` or a capture returned holds its values (re-raising a failed
        copy)."""
        for staging in self.stagings:
            pending, staging.drained = staging.drained, None
            if pending is not None:
                pending.result()

    def _state_sources(self, slot: int, row: int) -> list[tuple[str, Any, torch.Tensor]]:
        """(name, recurrent module, device view) of what a snapshot holds, per recurrent layer: the
        recurrent-state `row` and the first `conv_kernel_size` conv columns of `slot` (ExLlamaV3 1.6.5's
        `GDNLayerState.stash` rows; `load_state` writes them back through its `unstash`)."""
        out = []
        for key, layer in self.backend.engine.cache.get_all_recurrent_layers().items():
            if type(layer).__name__ != "GDNLayerState" or not isinstance(key, tuple):
                kind = type(layer).__name__
                raise BackendError(f"snapshots hold Gated DeltaNet layer states only, not {kind}")
            name = ".".join(str(k) for k in key)
            cdim = layer.module.conv_kernel_size
            out.append((f"{name}.recurrent", layer.module, layer.recurrent_state[row : row + 1]))
            out.append((f"{name}.conv", layer.module, layer.conv_state[slot, :, :cdim]))
        return out

    def load_state(self, state: dict[str, torch.Tensor], position: int) -> None:
        self.settle()
        gdn = self.backend.state
        stashed: dict[Any, Any] = {"position": position, "checkpoint_size": gdn.checkpoint_size}
        for key in gdn.cache.get_all_recurrent_layers():
            name = ".".join(str(k) for k in key)
            stashed[key] = (state[f"{name}.recurrent"], state[f"{name}.conv"])
        gdn.position = position
        gdn.unstash(stashed)


_threads_before_elpis: list[int] = []


def _torch_threads_at_first_load() -> int:
    """torch's CPU thread count before any backend of this process set `host_threads` (a second backend in
    the same process, as in the tests, would otherwise read the first one's setting)."""
    if not _threads_before_elpis:
        _threads_before_elpis.append(torch.get_num_threads())
    return _threads_before_elpis[0]


def _spans(tensors: Iterable[torch.Tensor]) -> tuple[list[int], int]:
    """Offsets of the tensors' bytes in one staging buffer (16-byte aligned, so views of any dtype fit) and
    its size."""
    spans, total = [], 0
    for t in tensors:
        spans.append(total)
        total += -(-t.numel() * t.element_size() // 16) * 16
    return spans, total


def _drain(
    copied: torch.cuda.Event, staged: list[tuple[str, torch.Tensor]], out: dict[str, torch.Tensor]
) -> None:
    """The snapshot worker: wait for the device-to-host copies, then copy out of the staging buffer. It polls
    the event rather than blocking in it, so the wait never holds the interpreter's lock while the main
    thread queues the prefill."""
    while not copied.query():
        time.sleep(0.0005)
    with torch.inference_mode():  # thread-local: `out` holds inference tensors when the caller was in it
        for name, view in staged:
            out[name].copy_(view)


class _InnerSnapshots:
    """The snapshots inside one prefill group, by chunk index: the layer-major order calls `after_chunk` once
    a block has run chunk j, when its recurrent layer holds the state at chunk j's end, and snapshot j copies
    that layer then. Each snapshot takes its staging buffer at its first copy, when the host is already
    queueing the group (a buffer allocated then overlaps the GPU's work)."""

    def __init__(self, store: CachePageStore, chunks: Iterable[int]) -> None:
        self.store = store
        self.chunks = set(chunks)
        self.captures: dict[int, StateCapture] = {}

    def after_chunk(self, module: Any, j: int) -> None:
        if j not in self.chunks:
            return
        capture = self.captures.get(j)
        if capture is None:
            capture = self.captures[j] = self.store.capture_state()
        capture.copy_module(getattr(module, "attn", None))

    def finish(self) -> dict[int, dict[str, torch.Tensor]]:
        missing = self.chunks - self.captures.keys()
        if missing:
            raise BackendError(f"prefill snapshots of chunks {sorted(missing)} were never taken")
        return {j: capture.finish() for j, capture in self.captures.items()}

    def abandon(self) -> None:
        for capture in self.captures.values():
            capture.abandon()


@dataclass
class _Staging:
    """A pinned buffer for one snapshot's device-to-host copies: `busy` from `capture_state` until its drain
    is queued, `drained` the worker's future until `settle` or the next use collects it."""

    buffer: torch.Tensor
    busy: bool = False
    drained: Future[None] | None = None


class StateCapture:
    """One snapshot's recurrent state, copied layer by layer into a staging buffer (`CachePageStore`)."""

    def __init__(
        self,
        store: CachePageStore,
        staging: _Staging,
        sources: list[tuple[str, Any, torch.Tensor]],
        spans: list[int],
    ) -> None:
        self.store, self.staging = store, staging
        self.views: dict[int, list[tuple[str, torch.Tensor, torch.Tensor]]] = {}
        for (name, module, src), offset in zip(sources, spans, strict=True):
            n = src.numel() * src.element_size()
            view = staging.buffer[offset : offset + n].view(src.dtype).view(src.shape)
            self.views.setdefault(id(module), []).append((name, src, view))
        self.copied: set[int] = set()
        self.copied_event: torch.cuda.Event | None = None

    def copy_all(self) -> None:
        """Queue the copies of every recurrent layer's rows as they are now."""
        for key in self.views:
            self._copy(key)

    def copy_module(self, module: Any) -> None:
        """Queue the copies of `module`'s rows as they are now (a module without recurrent state: none)."""
        if id(module) in self.views:
            self._copy(id(module))

    def _copy(self, key: int) -> None:
        if key in self.copied:
            raise BackendError("a snapshot copied one recurrent layer twice")
        for _, src, view in self.views[key]:
            view.copy_(src, non_blocking=True)
        self.copied.add(key)
        if len(self.copied) == len(self.views):  # the worker may drain from here on, not the group's end
            self.copied_event = torch.cuda.Event()
            self.copied_event.record(torch.cuda.current_stream(self.store.backend.engine.device))

    def finish(self) -> dict[str, torch.Tensor]:
        """The state as CPU tensors, filled by the worker once the copies queued so far are done."""
        missing = len(self.views) - len(self.copied)
        if missing or self.copied_event is None:
            raise BackendError(f"a snapshot is missing {missing} of {len(self.views)} recurrent layers")
        copied = self.copied_event
        staged = [(name, view) for views in self.views.values() for name, _, view in views]
        # each tensor owns pageable memory (the staging buffer is reused; the disk tier saves them one by one)
        out = {name: torch.empty(view.shape, dtype=view.dtype) for name, view in staged}
        self.staging.drained = self.store.copier.submit(_drain, copied, staged, out)
        self.staging.busy = False
        return out

    def abandon(self) -> None:
        """Give the staging buffer back unfinished (a prefill that failed; any copies it queued run before the
        buffer's next use, in stream order)."""
        self.staging.busy = False


@dataclass
class _Pending:
    rows: int  # rows the caller asked for
    run: int  # rows that ran (>= rows with fixed_rows padding)
    tokens: list[int]
    export: list[torch.Tensor] | None  # tap-layer states of every row (draft conditioning)
    kvp: int
    tree: TreeCall | None = None  # tree mode: the layout and each GDN layer's inputs for the commit


class Exl3Backend:
    """See the module docstring. `drafter` is the DFlash2 drafter bound to this backend (None without a
    draft model): it drafts from the backend's own state and must be used with this backend only."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_id: str,
        max_context: int,
        fixed_rows: int | None = 8,
        host_cache_bytes: int = 8 * GiB,
        snapshot_bytes: int = 4 * GiB,
        disk_cache_dir: Path | None = None,
        prefix_cache: bool = True,
        tree: bool = False,
        tree_graphs: bool = False,
        draft_graphs: bool = False,
        prefill_group: int = 1,
        host_threads: int | None = None,
        prelaunch: bool = False,
        embed_gather: bool = False,
    ) -> None:
        if max_context + MAX_ROWS > engine.cache_tokens:
            raise ValueError(
                f"max_context {max_context} + {MAX_ROWS} verify rows exceeds the "
                f"{engine.cache_tokens}-token cache"
            )
        if fixed_rows is not None and not 1 <= fixed_rows <= MAX_ROWS:
            raise ValueError(f"fixed_rows must be in 1..{MAX_ROWS}")
        if tree:
            check_tree_mode(gdn_state_dtypes(engine), fixed_rows)
        if tree_graphs and not tree:
            raise ValueError("tree_graphs replays tree-mode verifies: it needs tree=True")
        if prelaunch and not tree_graphs:
            raise ValueError("prelaunch queues replays of captured tree verifies: it needs tree_graphs=True")
        if embed_gather and not (tree_graphs or (draft_graphs and engine.draft is not None)):
            raise ValueError(
                "embed_gather acts inside captured tree verifies and draft blocks: it needs either"
            )
        from elpis.exl3 import check_prefill_group

        if check_prefill_group(prefill_group, engine.prefill_chunk) > 1:
            from elpis.exl3.prefill_groups import check_model, require_patch

            require_patch()
            check_model(engine.model)
        self.prefill_group = prefill_group
        # torch's CPU threads: `host_threads` between prefills, the count torch had before for the prefill
        self.host_threads = host_threads
        self.prefill_threads = _torch_threads_at_first_load()
        if host_threads is not None:
            torch.set_num_threads(host_threads)
        self.engine = engine
        self.fixed_rows = fixed_rows
        self.runs: tuple[int, ...] | None = None  # tree runs besides fixed_rows' (`tree_runs`)
        # each tree round's row count, host rounds' and GPU rounds' (DeviceRounds.choice): load_backend's
        self.run_choice: RunChoice | None = None
        self.tree = tree
        self.info = BackendInfo(
            "exl3", model_id, engine.vocab_size, max_context, engine.stop_token_ids, str(engine.device)
        )
        self.num_pages = engine.cache_tokens // PAGE
        self.prefix = PrefixCache(
            CachePageStore(self),
            self.num_pages,
            chunk=engine.prefill_chunk,
            host_bytes=host_cache_bytes,
            snapshot_bytes=snapshot_bytes,
            disk_dir=disk_cache_dir,
            enabled=prefix_cache,
        )
        if prefix_cache and prefill_group > 1:
            # a first group of a long prompt holds a snapshot inside it and one at its end
            self.prefix.store.reserve_stagings(2)
        self.export_layers = (
            set(engine.draft.draft_verifier_params["export_state_layers"])
            if engine.draft is not None
            else None
        )
        self.block_size = int(engine.draft_config.block_size) if engine.draft_config is not None else 0
        self.state: Any = None
        self.tokens: list[int] = []
        self.keys: list[bytes] = []
        self.pages: list[int] = []
        self.snaps: list[Snapshot] = []
        self.anchor: int | None = None
        self.pending: _Pending | None = None
        self.active = False
        self.last_prefill_seconds = 0.0
        # where begin()'s time went: restoring the reused prefix, and the host time of taking the snapshots
        # (queueing their copies, and waiting for an earlier snapshot's copy to finish)
        self.last_prefill_parts: dict[str, float] = {}
        self.warmup: WarmupReport | None = None  # what `elpis.exl3.graph_warmup` captured at load
        # greedy rounds on the GPU (`elpis.exl3.device_round`, registry switch exl3-device-rounds): set by
        # load_backend; the generator runs greedy requests through it when it is not None
        self.device_rounds: DeviceRounds | None = None
        self.graphs = None
        if tree_graphs:
            from elpis.exl3.tree_graph import TreeGraphs

            self.graphs = TreeGraphs(
                engine, self.export_layers, prelaunch=prelaunch, embed_gather=embed_gather
            )
        self.drafter = None
        if engine.draft is not None:
            from elpis.exl3.drafter import DFlash2Drafter

            self.drafter = DFlash2Drafter(self, graphs=draft_graphs, embed_gather=embed_gather)

    # -- pages ------------------------------------------------------------------------------------------
    def ensure_pages(self, tokens: int) -> None:
        """Pages for positions < `tokens` of the active sequence."""
        if tokens > self.engine.cache_tokens:
            raise BackendError(f"position {tokens} is past the {self.engine.cache_tokens}-token cache")
        while len(self.pages) * PAGE < tokens:
            self.pages.append(self.prefix.allocate())

    def block_table(self, width: int) -> torch.Tensor:
        """Host int32 [1, width] table of the sequence's pages (unused columns 0; never read past the
        cache lengths)."""
        table = torch.zeros((1, width), dtype=torch.int32)
        n = min(width, len(self.pages))
        table[0, :n] = torch.tensor(self.pages[:n], dtype=torch.int32)
        return table.pin_memory()  # pinned: ExLlamaV3 uploads it in stream order, without a sync

    def _register_full_pages(self) -> None:
        """Name every page the prefill has filled (they become shareable prefix pages)."""
        from elpis.exl3.prefix import page_key

        while (len(self.keys) + 1) * PAGE <= len(self.tokens):
            i = len(self.keys)
            prev = self.keys[-1] if self.keys else b""
            key = page_key(prev, self.tokens[i * PAGE : (i + 1) * PAGE])
            self.keys.append(key)
            self.prefix.register(key, self.pages[i])

    # -- Backend ----------------------------------------------------------------------------------------
    def position(self) -> int:
        return len(self.tokens)

    @torch.inference_mode()
    def begin(self, prompt: Sequence[int]) -> int:
        if self.active:
            raise BackendError("begin() while a sequence is active: finish() it first")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > self.info.max_context:
            raise ValueError(f"prompt has {len(prompt)} tokens; the context holds {self.info.max_context}")
        bad = [t for t in prompt if not 0 <= t < self.info.vocab_size]
        if bad:
            raise ValueError(
                f"prompt ids {bad[:4]} are outside the vocabulary (0..{self.info.vocab_size - 1})"
            )
        t0 = time.perf_counter()
        self.active = True
        self.state = self.engine.cache.get_new_state()
        self.last_prefill_parts = {"restore": 0.0, "snapshots": 0.0}
        try:
            body = prompt[:-1]
            plan, self.pages = self.prefix.begin(body)
            self.last_prefill_parts["restore"] = time.perf_counter() - t0
            self.tokens = body[: plan.reuse]
            self.keys = plan.keys[: plan.reuse // PAGE]
            self.state.position = plan.reuse
            self.snaps = []
            with self._prefill_threads():
                self._prefill(body, plan.keys)
            self._register_full_pages()
        except Exception:
            self._release()
            raise
        self.anchor = prompt[-1]
        self.pending = None
        torch.cuda.synchronize(self.engine.device)
        self.last_prefill_seconds = time.perf_counter() - t0
        return plan.reuse

    @contextmanager
    def _prefill_threads(self) -> Iterator[None]:
        """torch's CPU threads as they were before `host_threads` for the prefill (its CPU embedding lookup
        of the whole chunk), `host_threads` again after."""
        if self.host_threads is None or self.host_threads == self.prefill_threads:
            yield
            return
        torch.set_num_threads(self.prefill_threads)
        try:
            yield
        finally:
            torch.set_num_threads(self.host_threads)

    def _prefill(self, body: list[int], keys: list[bytes]) -> None:
        """Prefill `body` from the current position in ExLlamaV3's chunks. With `prefill_group` > 1 the chunks
        run layer-major in groups (`elpis.exl3.prefill_groups`: the same kernels on the same chunks, each
        EXL3 weight rebuilt once per group). A prefix-cache snapshot at a page boundary inside a group copies
        each recurrent layer's state as that layer passes the snapshot's position; one at a partial page (the
        prompt's end) ends its group, since its tail page is read once the whole model has written it."""
        from elpis.exl3.prefill_groups import plan_groups, prefill_layer_major

        engine = self.engine
        end = len(body)
        stops = prefill_boundaries(len(self.tokens), end, engine.prefill_chunk)
        snapshot_at = lambda stop: self.prefix.wants_snapshot(stop, end)  # noqa: E731
        store = self.prefix.store
        for group in plan_groups(stops, snapshot_at, self.prefill_group):
            passes, draft_params = [], []
            start = len(self.tokens)
            for stop in group:  # pages and tables in the order a chunk-by-chunk prefill makes them
                self.ensure_pages(stop)
                ids, params = self._prefill_pass(body, start, stop)
                passes.append((ids, params))
                # the draft gets the host table and lengths the target was given (before its own use of them)
                draft_params.append(
                    {"block_table": params["block_table"], "cache_seqlens": params["cache_seqlens"]}
                )
                start = stop
            # snapshots inside the group, by chunk index; the group's last stop is snapshotted after it
            inner = [j for j, stop in enumerate(group[:-1]) if snapshot_at(stop)]
            if any(group[j] % PAGE for j in inner):  # plan_groups ends groups there: the tail needs the model
                raise BackendError(f"prefill snapshot off a page boundary inside the group {group}")
            snapshots = _InnerSnapshots(store, inner)
            try:
                if len(passes) == 1:
                    engine.model.prefill(*passes[0])
                else:
                    after = snapshots.after_chunk if inner else None
                    prefill_layer_major(engine.model, passes, after_chunk=after)
                states = snapshots.finish()
            except BaseException:
                snapshots.abandon()
                raise
            chunks = zip(group, passes, draft_params, strict=True)
            for j, (stop, (_, params), conditioning) in enumerate(chunks):
                if engine.draft is not None:
                    engine.draft.update_kv_from_target(
                        target_hidden=params["export_states"], cache=engine.draft_cache, params=conditioning
                    )
                self.tokens.extend(body[len(self.tokens) : stop])
                if snapshot_at(stop):
                    if stop % PAGE:  # reading the partial page waits for the prefill: not the snapshot's time
                        torch.cuda.synchronize(engine.device)
                    t0 = time.perf_counter()
                    if j in states:
                        state, tail = states[j], None
                    else:
                        tail = store.read_page(self.pages[stop // PAGE]) if stop % PAGE else None
                        state = store.save_state()
                    snap = Snapshot(stop, prefix_key(body, stop, keys), state, tail)
                    self.prefix.add_snapshot(snap)
                    self.snaps.append(snap)
                    self.last_prefill_parts["snapshots"] += time.perf_counter() - t0

    def _prefill_pass(self, body: list[int], start: int, stop: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """The input ids and params of one `Model.prefill` call for positions [start, stop)."""
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": self.block_table(stock_table_width(stop)),
            "cache": self.engine.cache,
            "cache_seqlens": torch.tensor([start], dtype=torch.int32),
            "recurrent_states": [self.state],
        }
        if self.export_layers:
            params["export_state_layers"] = self.export_layers
        return torch.tensor([body[start:stop]], dtype=torch.long), params

    @torch.inference_mode()
    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        if not self.active:
            raise BackendError("verify() without an active sequence")
        if self.pending is not None:
            raise BackendError("verify() twice without commit()")
        tokens = [int(t) for t in tokens]
        if self.tree:
            layout = layout_tree(check_parents(list(parents), len(tokens)), run=self.verify_run(len(tokens)))
        else:
            check_chain(parents, len(tokens))
        bad = [t for t in tokens if not 0 <= t < self.info.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:4]} are outside the vocabulary")
        if self.anchor is not None and tokens[0] != self.anchor:
            raise ValueError(
                f"row 0 must be the anchor {self.anchor} (the prompt's last token), got {tokens[0]}"
            )
        rows = len(tokens)
        kvp = self.position()
        if kvp + rows > self.info.max_context + MAX_ROWS:
            raise ValueError(f"{rows} rows at position {kvp} run past the context ({self.info.max_context})")
        if self.tree:
            return self._verify_tree(tokens, layout, kvp)
        run = max(rows, self.fixed_rows or 1)
        ids = tokens + [tokens[-1]] * (run - rows)
        out, export = self._forward(ids, kvp)
        self.pending = _Pending(rows, run, tokens, export, kvp)
        return out[0, :rows, : self.info.vocab_size].float()

    def _verify_tree(self, tokens: list[int], layout: TreeLayout, kvp: int) -> torch.Tensor:
        from elpis.exl3.tree_verify import tree_forward

        rows = len(tokens)
        if kvp + layout.run > self.info.max_context + MAX_ROWS:
            raise ValueError(
                f"a tree verify writes {layout.run} rows from position {kvp}: past the context "
                f"({self.info.max_context})"
            )
        ids = tokens + [tokens[0]] * (layout.run - rows)  # padding leaves: the anchor again, never read
        if self.graphs is not None:
            from elpis.exl3.tree_graph import verify_pages

            self.ensure_pages(kvp + max(layout.run, self.block_size))
            pages = verify_pages(self.pages, kvp, layout.run)  # a larger run may have allocated more
            out, export, call = self.graphs.verify(self.state, pages, ids, layout, kvp)
            # the verify key's bucket width: the draft's conditioning graphs are keyed by it (and the
            # verify key), so they change with the buckets rather than every 4,096 tokens
            self._last_table = self.block_table(self.graphs.table_width(kvp, layout.run))
        else:
            call = TreeCall(layout, kvp, self.state.slot, self.state.base_row())
            extra = {"position_ids": pinned(layout.position_ids(kvp), torch.int32).view(1, -1)}
            # the module path the graphs capture: without it an 8-row run takes ExLlamaV3's captured MLP
            # blocks (they serve <= 8 rows) instead of the rows GEMM a replay runs, other kernels, other bits
            with plain_module_path(self.engine.model), tree_forward(call):
                out, export = self._forward(ids, kvp, history=False, extra=extra)
        self.state.position = kvp  # nothing is committed until commit(); the forward advanced it by run
        ran = (len(call.gdn), call.attention_layers)
        expected = (len(self.state.cache.get_all_recurrent_layers()), len(self.engine.cache.layers))
        if ran != expected:
            raise BackendError(
                f"tree verify ran {ran} of {expected} (Gated DeltaNet, attention) layers through its kernels"
            )
        self.pending = _Pending(rows, layout.run, tokens, export, kvp, call)
        return out[0, :rows, : self.info.vocab_size].float()

    def _forward(
        self, ids: list[int], kvp: int, *, history: bool | None = None, extra: dict[str, Any] | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        engine = self.engine
        run = len(ids)
        self.ensure_pages(kvp + max(run, self.block_size))
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": self.block_table(stock_table_width(kvp + 1 + 2 * (run - 1))),
            "cache": engine.cache,
            "cache_seqlens": pinned([kvp], torch.int32),
            "recurrent_states": [self.state],
            "recurrent_history": run > 1 if history is None else history,
            # pinned, stream-ordered embedding upload: every round ends in a token read-back (a sync) before
            # the staging buffer is written again
            "pinned_staging": True,
            **(extra or {}),
        }
        if self.export_layers:
            params["export_state_layers"] = self.export_layers
        out = engine.model.forward(torch.tensor([ids], dtype=torch.long), params)
        self._last_table = params["block_table"]
        return out, params.get("export_states")

    @torch.inference_mode()
    def prelaunch(self) -> bool:
        """Queue the next tree verify behind the verify gate (`elpis.exl3.verify_gate`), so that its graph's
        launch overlaps the draft running on the GPU; the `verify()` that follows opens the gate with its
        tree. The drafter calls this right after queuing the draft block and before reading it back.
        Nothing is queued (False) without the gate, between a verify and its commit, or for a key with no
        graph yet."""
        if self.graphs is None or self.graphs.gate is None or not self.active or self.pending is not None:
            return False
        kvp, run = self.position(), self.tree_run()
        if kvp + run > self.info.max_context + MAX_ROWS:
            return False
        self.ensure_pages(kvp + max(run, self.block_size))  # what verify() ensures, before the gate is queued
        return self.graphs.arm(self.state, self.pages, kvp, run)

    def _disarm(self) -> None:
        """Open an armed gate on its harmless inputs: work queued after it must not wait on a verify that
        will not come."""
        if self.graphs is not None:
            self.graphs.disarm()

    @torch.inference_mode()
    def commit(self, rows: Sequence[int]) -> None:
        pending = self.pending
        if pending is None:
            raise BackendError("commit() without a verify()")
        rows = list(rows)
        self._disarm()
        if self.graphs is not None and not self.graphs.inputs_arrived():
            from elpis.spec.integrity import LateInputs

            raise LateInputs(
                "the verify was queued before its tree and its gate timed out before the host opened it: it "
                "ran a dummy tree, so this round is discarded and verified again (nothing was committed)"
            )
        if pending.tree is not None:
            self._commit_tree(pending, rows)
            return
        if not rows or rows != list(range(len(rows))) or len(rows) > pending.rows:
            raise ValueError(
                f"commit rows {rows} are not a root-first prefix of the verified chain ({pending.rows} rows)"
            )
        count = len(rows)
        if pending.run > 1:
            self.state.rewind(pending.run - count)  # replays the accepted rows from the committed state
        engine = self.engine
        if engine.draft is not None and pending.export is not None:
            hidden = [t[:, :count] for t in pending.export]
            update_draft_kv(engine, hidden, self._last_table, pinned([pending.kvp], torch.int32))
        # Pages filled here are not named for reuse: decode rounds compute K/V with other kernels than
        # prefill, and a restored prefix must hold exactly the K/V a cold prefill would have written.
        self.tokens.extend(pending.tokens[:count])
        self.pending = None
        self.anchor = None  # the caller supplies the next anchor (the last committed row's target token)

    def _commit_tree(self, pending: _Pending, rows: list[int]) -> None:
        from elpis.exl3.tree_verify import commit_gdn, commit_kv

        call = pending.tree
        assert call is not None
        path = check_path(rows, call.layout.parents, pending.rows)
        engine = self.engine
        if self.graphs is None or not self.graphs.commit(call, path, self.pages):
            commit_kv(engine.cache, self.pages, pending.kvp, path)
            commit_gdn(call, path)
        if engine.draft is not None and pending.export is not None:
            self.condition_draft(pending.export, path, pending.kvp, replayed=call.source is not None)
        self.tokens.extend(pending.tokens[r] for r in path)
        self.state.position = len(self.tokens)
        self.pending = None
        self.anchor = None

    def condition_draft(
        self, export: Sequence[torch.Tensor], path: Sequence[int], kvp: int, *, replayed: bool
    ) -> None:
        """The draft's K/V of a committed `path` (rows of the last tree verify at kvp, whose tap states are
        `export`) through the verify's block table: replayed where the verify was (its exports stay in its
        graph's buffers), else eagerly."""
        draft_graphs = self.drafter.graphs if self.drafter is not None else None
        if replayed and draft_graphs is not None and draft_graphs.conditioning:
            draft_graphs.condition(export, path, self._last_table, kvp)
        else:
            index = upload(path, torch.long, export[0].device)
            hidden = [t.index_select(1, index) for t in export]
            update_draft_kv(self.engine, hidden, self._last_table, pinned([kvp], torch.int32))

    def abandon(self) -> None:
        """Drop the last verify without committing it (a round the speculation core discarded; the anchor
        stays). Tree mode only: its verify changed nothing committed (its K/V went to slots past the committed
        ones, the GDN kernels only read the state, the position was reset). A chain-mode verify advanced the
        recurrent state, which cannot be undone to zero rows here, so that is refused."""
        self._disarm()
        if self.pending is None:
            raise BackendError("abandon() without a verify()")
        if self.pending.tree is None:
            raise BackendError(
                "a chain-mode verify cannot be abandoned (it advanced the recurrent state); load the backend "
                "in tree mode for rounds that can be discarded and recomputed"
            )
        self.pending = None

    @torch.inference_mode()
    def finish(self) -> None:
        if not self.active:
            return
        self._disarm()  # before the prefix pages are persisted (their copies queue after the armed verify)
        if self.device_rounds is not None:
            self.device_rounds.drain()  # a round queued ahead of the request's end still runs on its pages
        self.pending = None  # an abandoned round: its rows were never committed, the state is dropped below
        try:
            self.prefix.persist(self.keys, self.pages, self.snaps)
        finally:
            self._release()

    def _release(self) -> None:
        self.prefix.release(self.pages)
        if self.state is not None:
            self.state.free()
        self.state, self.pages, self.tokens, self.keys, self.snaps = None, [], [], [], []
        self.anchor, self.pending, self.active = None, None, False

    def tree_run(self) -> int:
        """Rows of every tree-mode verify (`fixed_rows`, one of TREE_RUNS), checked: the bench switches it
        between generations."""
        return check_tree_rows(self.fixed_rows)

    def tree_runs(self) -> tuple[int, ...]:
        """The row counts a tree-mode round may verify at, up to `tree_run()`: `runs` (set by load_backend
        for a run choice, `elpis.spec.run_choice`), else `tree_run()` alone. Every one has its graphs captured
        at load, and a row's logits are the same at each."""
        top = self.tree_run()
        runs = tuple(r for r in (self.runs or (top,)) if r <= top)
        if top not in runs:
            raise ValueError(f"the tree runs {self.runs} leave out the backend's own, {top}")
        return runs

    def verify_run(self, rows: int) -> int:
        """The row count a tree verify of `rows` rows runs at: the smallest of `tree_runs()` that holds it."""
        run = smallest_run(self.tree_runs(), rows)
        if run is None:
            raise ValueError(f"a tree of {rows} rows is over the backend's {self.tree_run()}-row verifies")
        return run

    def round_cost(self, run: int, kvp: int) -> float:
        """Seconds of a round of `run` rows from kvp: its verify's and draft block's graphs in its context
        bucket, as the load-time capture timed them (`WarmupReport.round_seconds`)."""
        from elpis.exl3.tree_graph import context_bucket

        if self.warmup is None:
            raise BackendError("round costs are timed when the graphs are captured at load (capture_graphs)")
        key = (run, context_bucket(kvp + run, self.engine.cache_tokens))
        if key not in self.warmup.round_seconds:
            raise BackendError(f"no round of {run} rows was timed in the context bucket of position {kvp}")
        return self.warmup.round_seconds[key]

    def verify_cost(self, rows: int) -> float | None:
        """Relative cost of `rows` rows: constant with fixed_rows (every call runs the same shape) and in tree
        mode, where a round's row count is the run choice's to make (`run_choice`, by measured tokens a
        second), not the generator's draft-probability model's."""
        if self.tree and 1 <= rows <= self.tree_run():
            return 1.0
        if self.fixed_rows is not None and rows <= self.fixed_rows:
            return 1.0
        return None


def gdn_state_dtypes(engine: Any) -> set[torch.dtype]:
    """Storage dtypes of the engine's Gated DeltaNet recurrent-state pools."""
    layers = engine.cache.get_all_recurrent_layers().values()
    return {layer.recurrent_state.dtype for layer in layers if hasattr(layer, "recurrent_state")}


def check_tree_rows(fixed_rows: int | None) -> int:
    """A tree-mode backend's rows per verify, which must be one of TREE_RUNS."""
    if fixed_rows not in TREE_RUNS:
        raise ValueError(
            f"tree mode runs every verify as one of {TREE_RUNS} rows (fixed_rows); got {fixed_rows}"
        )
    assert fixed_rows is not None
    return fixed_rows


def check_tree_mode(state_dtypes: set[torch.dtype], fixed_rows: int | None) -> None:
    """Refuse a tree-mode backend the tree kernels cannot serve exactly."""
    check_tree_rows(fixed_rows)
    if state_dtypes != {torch.float32}:
        raise ValueError(
            "tree mode needs the Gated DeltaNet state in fp32 (load with gdn_state_fp32=True); "
            f"the cache holds {sorted(str(d) for d in state_dtypes)}"
        )
