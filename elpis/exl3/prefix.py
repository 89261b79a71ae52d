"""Prefix cache for one sequence at a time: GPU pages, a host-RAM tier, optional persistence on disk.

The K/V cache is paged (256 tokens a page). A *full* page is named by a chained hash of its tokens and
every token before it, so equal names mean equal K/V. A hybrid model (Gated DeltaNet layers) can only resume
from a *snapshot* of its recurrent state, taken at a position q during prefill; a prompt reuses the longest
prefix that ends at a usable snapshot and whose pages are all present in some tier.

Exactness: prefill runs in chunks whose boundaries depend only on absolute positions and the prompt length
(`prefill_boundaries`). A snapshot is usable for a prompt only if its position is one of that prompt's own
chunk boundaries, so resuming runs exactly the chunks a cold prefill would run from there on: the state,
the K/V and every later token are bit-identical to a run without the cache.

Tiers: pages of finished sequences stay on the GPU until their slot is needed (least recently used first);
an evicted page moves to host RAM if the host tier has room (its budget also holds the snapshots); with a
disk directory, the pages and snapshots of each finished sequence are written there too, under a key bound
to the model and cache geometry, and found again after a restart. A damaged disk entry is deleted and
treated as a miss (the prompt is prefilled cold).

This module knows nothing about ExLlamaV3: a `PageStore` moves page contents and recurrent states.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

PAGE = 256
GiB = 1 << 30
DISK_FORMAT = 1


def page_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """Name of a full page: its tokens chained onto the name of the page before it."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def prefix_key(tokens: Sequence[int], position: int, keys: Sequence[bytes]) -> bytes:
    """Name of the first `position` tokens (any position), given the names of the full pages before it."""
    full = position // PAGE
    prev = keys[full - 1] if full else b""
    if position % PAGE == 0:
        return prev or b"\0" * 16
    h = hashlib.blake2b(prev, digest_size=16, person=b"tail")
    h.update(np.asarray(tokens[full * PAGE : position], dtype=np.int64).tobytes())
    return h.digest()


def chain_keys(tokens: Sequence[int]) -> list[bytes]:
    keys: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - PAGE + 1, PAGE):
        prev = page_key(prev, tokens[start : start + PAGE])
        keys.append(prev)
    return keys


def prefill_boundaries(start: int, end: int, chunk: int) -> list[int]:
    """Chunk ends of a prefill of positions [start, end): multiples of `chunk`, the last page boundary
    before `end`, and `end` itself (the same rule whatever `start` is, so a resumed prefill runs the cold
    prefill's chunks). `start` must itself be a boundary of the cold prefill of `end`."""
    if not 0 <= start <= end:
        raise ValueError(f"bad prefill range {start}..{end}")
    marks = set(range(chunk, end, chunk))
    last_page = end // PAGE * PAGE
    if 0 < last_page < end:
        marks.add(last_page)
    marks.add(end)
    return sorted(m for m in marks if m > start)


def is_boundary(position: int, end: int, chunk: int) -> bool:
    return position == 0 or position in prefill_boundaries(0, end, chunk)


class PageStore(Protocol):
    """Moves page contents (target and draft K/V of one 256-token page) and recurrent states."""

    def read_page(self, page: int) -> torch.Tensor:
        """The page's contents as a flat uint8 CPU tensor."""
        ...

    def write_page(self, page: int, data: torch.Tensor) -> None: ...

    def save_state(self) -> dict[str, torch.Tensor]:
        """The recurrent state at the current position, as CPU tensors (possibly filled later: `settle`)."""
        ...

    def load_state(self, state: dict[str, torch.Tensor], position: int) -> None: ...

    def settle(self) -> None:
        """Wait until every state `save_state` returned holds its values (it may fill them in the
        background)."""
        ...


@dataclass
class Snapshot:
    position: int
    key: bytes  # prefix_key at `position`
    state: dict[str, torch.Tensor]
    tail: torch.Tensor | None  # contents of the partial page at `position` (None when page-aligned)

    def nbytes(self) -> int:
        size = sum(t.numel() * t.element_size() for t in self.state.values())
        return size + (self.tail.numel() if self.tail is not None else 0)


@dataclass
class Plan:
    """How `begin` restores a prompt: `reuse` tokens from the cache, from `snapshot`."""

    reuse: int
    snapshot: Snapshot | None
    keys: list[bytes]


@dataclass
class Stats:
    gpu_hits: int = 0
    host_hits: int = 0
    disk_hits: int = 0
    evicted_to_host: int = 0
    dropped_pages: int = 0
    dropped_snapshots: int = 0
    disk_writes: int = 0
    disk_errors: list[str] = field(default_factory=list)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class PrefixCache:
    """Page allocation for the active sequence plus the three tiers.

    `num_pages` GPU pages; `host_bytes` of host RAM for evicted pages (0: evicted pages are dropped);
    `snapshot_bytes` of host RAM for recurrent-state snapshots; `disk_dir` (or None) for persistence, already
    specific to the model and cache geometry (see `elpis.exl3.persist`). `enabled=False` turns reuse off
    (every prompt is prefilled cold, nothing is kept).
    """

    def __init__(
        self,
        store: PageStore,
        num_pages: int,
        *,
        chunk: int = 2048,
        host_bytes: int = 8 * GiB,
        snapshot_bytes: int = 4 * GiB,
        snapshot_interval: int = 8192,
        disk_dir: Path | None = None,
        enabled: bool = True,
    ) -> None:
        if chunk % PAGE or snapshot_interval % chunk:
            raise ValueError(
                "chunk must be a multiple of the page size and the snapshot interval of the chunk"
            )
        self.store, self.num_pages, self.chunk, self.enabled = store, num_pages, chunk, enabled
        self.host_bytes, self.snapshot_bytes, self.snapshot_interval = (
            host_bytes,
            snapshot_bytes,
            snapshot_interval,
        )
        self.free: list[int] = list(range(num_pages - 1, -1, -1))
        self.gpu: OrderedDict[bytes, int] = OrderedDict()  # key -> page, least recently used first
        self.page_key: dict[int, bytes] = {}  # page -> key, for indexed pages
        self.active: set[int] = set()  # pages referenced by the active sequence
        self.host: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # evicted page contents, LRU first
        self.host_used = 0
        self.snapshots: OrderedDict[tuple[int, bytes], Snapshot] = OrderedDict()
        self.snapshot_used = 0
        self.stats = Stats()
        self.disk = DiskTier(disk_dir) if (disk_dir is not None and enabled) else None

    # -- allocation -------------------------------------------------------------------------------------
    def allocate(self) -> int:
        """A page for the active sequence: a free one, else the least recently used indexed page."""
        if self.free:
            page = self.free.pop()
        else:
            victim = next((k for k, p in self.gpu.items() if p not in self.active), None)
            if victim is None:
                raise MemoryError("every K/V page is in use by the active sequence")
            page = self.gpu.pop(victim)
            del self.page_key[page]
            self._to_host(victim, self.store.read_page(page))
        self.active.add(page)
        return page

    def release(self, pages: Sequence[int]) -> None:
        """End of a sequence: indexed pages stay cached, the others are free again."""
        for page in pages:
            if page in self.active:
                self.active.discard(page)
                if page not in self.page_key:
                    self.free.append(page)

    def register(self, key: bytes, page: int) -> None:
        """`page` now holds the full page named `key` (written by prefill only; see the module docstring)."""
        if not self.enabled or key in self.gpu or page in self.page_key:
            return
        self.gpu[key] = page
        self.page_key[page] = key

    # -- host RAM ---------------------------------------------------------------------------------------
    def _to_host(self, key: bytes, data: torch.Tensor) -> None:
        size = _nbytes(data)
        if key in self.host or size > self.host_bytes:
            self.stats.dropped_pages += 1
            return
        while self.host_used + size > self.host_bytes:
            _, old = self.host.popitem(last=False)
            self.host_used -= _nbytes(old)
            self.stats.dropped_pages += 1
        self.host[key] = data
        self.host_used += size
        self.stats.evicted_to_host += 1

    def add_snapshot(self, snap: Snapshot) -> None:
        if not self.enabled:
            return
        key = (snap.position, snap.key)
        if key in self.snapshots:
            self.snapshots.move_to_end(key)
            return
        size = snap.nbytes()
        if size > self.snapshot_bytes:
            return
        while self.snapshot_used + size > self.snapshot_bytes:
            _, old = self.snapshots.popitem(last=False)
            self.snapshot_used -= old.nbytes()
            self.stats.dropped_snapshots += 1
        self.snapshots[key] = snap
        self.snapshot_used += size

    # -- planning and restoring -------------------------------------------------------------------------
    def wants_snapshot(self, position: int, end: int) -> bool:
        """Snapshot after the prefill chunk ending at `position` (of a prefill ending at `end`)?"""
        if not self.enabled or position == 0:
            return False
        return (
            position == end
            or position % self.snapshot_interval == 0
            or position == end // self.chunk * self.chunk
        )

    def _has_page(self, key: bytes) -> bool:
        return key in self.gpu or key in self.host or (self.disk is not None and self.disk.has_page(key))

    def plan(self, tokens: Sequence[int]) -> Plan:
        """The longest exact reuse for a prefill of `tokens` (the prompt without its last token)."""
        keys = chain_keys(tokens)
        end = len(tokens)
        if not self.enabled or end == 0:
            return Plan(0, None, keys)
        positions = {p for p, _ in self.snapshots}
        if self.disk is not None:
            positions.update(self.disk.snapshot_positions())
        for position in sorted(positions, reverse=True):
            if position > end or not is_boundary(position, end, self.chunk):
                continue
            if not all(self._has_page(k) for k in keys[: position // PAGE]):
                continue
            key = prefix_key(tokens, position, keys)
            snap = self.snapshots.get((position, key))
            if snap is None and self.disk is not None:
                snap = self.disk.read_snapshot(position, key)
            if snap is not None:
                return Plan(position, snap, keys)
        return Plan(0, None, keys)

    def begin(self, tokens: Sequence[int]) -> tuple[Plan, list[int]]:
        """Plan and restore; an entry found damaged on disk is deleted and the plan is made again (at worst
        the prompt is prefilled cold)."""
        while True:
            plan = self.plan(tokens)
            try:
                return plan, self.restore(plan)
            except _Damaged:
                continue

    def restore(self, plan: Plan) -> list[int]:
        """Pages for the reused prefix (shared GPU pages, or fresh pages filled from host or disk) and the
        partial tail page (copied); then the recurrent state. Returns the sequence's page list."""
        needed = plan.keys[: plan.reuse // PAGE]
        pages: list[int | None] = []
        for key in needed:  # first pin what is on the GPU, so filling the rest cannot evict it
            page = self.gpu.get(key)
            if page is not None:
                self.gpu.move_to_end(key)
                self.active.add(page)
                self.stats.gpu_hits += 1
            pages.append(page)
        blobs: dict[int, torch.Tensor] = {}
        for i, key in enumerate(needed):  # take the other contents in hand before allocating evicts anything
            if pages[i] is None:
                data = self.host.pop(key, None)
                if data is not None:
                    self.host_used -= _nbytes(data)
                    self.stats.host_hits += 1
                else:
                    data = self.disk.read_page(key) if self.disk is not None else None
                    if data is None:  # damaged on disk (now deleted): give back what was pinned, re-plan
                        self.release([p for p in pages if p is not None])
                        raise _Damaged(key.hex())
                    self.stats.disk_hits += 1
                blobs[i] = data
        for i, data in blobs.items():
            page = self.allocate()
            self.store.write_page(page, data)
            self.register(needed[i], page)
            pages[i] = page
        result = [p for p in pages if p is not None]
        snap = plan.snapshot
        if snap is not None:
            if snap.tail is not None:
                page = self.allocate()
                self.store.write_page(page, snap.tail)
                result.append(page)
            self.store.settle()
            self.store.load_state(snap.state, snap.position)
            self.add_snapshot(snap)
        return result

    # -- persistence ------------------------------------------------------------------------------------
    def persist(self, keys: Sequence[bytes], pages: Sequence[int], snapshots: Sequence[Snapshot]) -> None:
        """Write a finished sequence's named pages and its snapshots to disk (new ones only)."""
        if self.disk is None:
            return
        try:
            for key, page in zip(keys, pages, strict=False):
                if not self.disk.has_page(key):
                    self.disk.write_page(key, self.store.read_page(page))
                    self.stats.disk_writes += 1
            self.store.settle()
            for snap in snapshots:
                if not self.disk.has_snapshot(snap.position, snap.key):
                    self.disk.write_snapshot(snap)
                    self.stats.disk_writes += 1
        except OSError as exc:  # a full or broken disk never fails a request: persistence stops
            self.stats.disk_errors.append(str(exc))
            self.disk = None


class _Damaged(Exception):
    pass


class DiskTier:
    """Files under one directory: `p-<key>.page` and `s-<position>-<key>.snap`, each a JSON header line
    (format, SHA-256 of the payload) and the payload; written to a temporary name, then renamed."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.pages = {bytes.fromhex(p.name[2:-5]) for p in self.root.glob("p-*.page")}
        self.snaps: dict[int, set[bytes]] = {}
        for path in self.root.glob("s-*.snap"):
            _, position, key = path.stem.split("-")
            self.snaps.setdefault(int(position), set()).add(bytes.fromhex(key))

    def has_page(self, key: bytes) -> bool:
        return key in self.pages

    def has_snapshot(self, position: int, key: bytes) -> bool:
        return key in self.snaps.get(position, ())

    def snapshot_positions(self) -> list[int]:
        return [p for p, keys in self.snaps.items() if keys]

    def _write(self, path: Path, header: dict, payload: bytes) -> None:
        header = {**header, "format": DISK_FORMAT, "sha256": hashlib.sha256(payload).hexdigest()}
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(json.dumps(header).encode() + b"\n")
                handle.write(payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _read(self, path: Path) -> tuple[dict, bytes] | None:
        try:
            raw = path.read_bytes()
            line, _, payload = raw.partition(b"\n")
            header = json.loads(line)
            if header.get("format") != DISK_FORMAT or hashlib.sha256(payload).hexdigest() != header.get(
                "sha256"
            ):
                raise ValueError("checksum or format mismatch")
            return header, payload
        except (OSError, ValueError) as exc:
            path.unlink(missing_ok=True)  # fail closed: a damaged entry becomes a miss
            print(f"elpis prefix cache: dropped damaged {path.name}: {exc}")
            return None

    def write_page(self, key: bytes, data: torch.Tensor) -> None:
        self._write(self.root / f"p-{key.hex()}.page", {"kind": "page"}, data.numpy().tobytes())
        self.pages.add(key)

    def read_page(self, key: bytes) -> torch.Tensor | None:
        got = self._read(self.root / f"p-{key.hex()}.page")
        if got is None:
            self.pages.discard(key)
            return None
        return torch.frombuffer(bytearray(got[1]), dtype=torch.uint8)

    def write_snapshot(self, snap: Snapshot) -> None:
        tensors = dict(snap.state)
        if snap.tail is not None:
            tensors["__tail__"] = snap.tail
        payload = st_save({k: v.contiguous() for k, v in tensors.items()})
        self._write(
            self.root / f"s-{snap.position}-{snap.key.hex()}.snap",
            {"kind": "snapshot", "position": snap.position},
            payload,
        )
        self.snaps.setdefault(snap.position, set()).add(snap.key)

    def read_snapshot(self, position: int, key: bytes) -> Snapshot | None:
        if not self.has_snapshot(position, key):
            return None
        got = self._read(self.root / f"s-{position}-{key.hex()}.snap")
        if got is None or got[0].get("position") != position:
            self.snaps[position].discard(key)
            return None
        tensors = st_load(got[1])
        tail = tensors.pop("__tail__", None)
        return Snapshot(position, key, tensors, tail)
