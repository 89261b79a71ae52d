"""The prefix cache's bookkeeping on the CPU: a fake store whose 'K/V' is the token ids themselves and whose
'recurrent state' is a digest of every token seen, so any wrong reuse shows up as wrong contents."""

from __future__ import annotations

import hashlib

import pytest
import torch

from elpis.exl3.prefix import (
    PAGE,
    DiskTier,
    PrefixCache,
    Snapshot,
    chain_keys,
    is_boundary,
    prefill_boundaries,
    prefix_key,
)


class FakeStore:
    """K/V pages hold the tokens written at each position; the state is the running hash of the sequence."""

    def __init__(self, pages: int) -> None:
        self.kv = torch.full((pages, PAGE), -1, dtype=torch.int64)
        self.state: bytes = b""
        self.position = 0
        self.unsettled: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def read_page(self, page: int) -> torch.Tensor:
        return self.kv[page].clone().view(torch.uint8)

    def write_page(self, page: int, data: torch.Tensor) -> None:
        self.kv[page] = data.view(torch.int64)

    def save_state(self) -> dict[str, torch.Tensor]:
        """Like the GPU store, the values arrive later (at `settle`): a cache that reads a snapshot without
        settling it first reads zeros."""
        values = {
            "h": torch.frombuffer(bytearray(self.state), dtype=torch.uint8).clone(),
            "pos": torch.tensor([self.position]),
        }
        out = {name: torch.zeros_like(t) for name, t in values.items()}
        self.unsettled.append((out, values))
        return out

    def settle(self) -> None:
        for out, values in self.unsettled:
            for name, t in values.items():
                out[name].copy_(t)
        self.unsettled.clear()

    def load_state(self, state: dict[str, torch.Tensor], position: int) -> None:
        assert int(state["pos"]) == position, "an unsettled or wrong snapshot"
        self.state, self.position = bytes(state["h"].tolist()), position


def running_hash(tokens) -> bytes:
    h = b""
    for t in tokens:
        h = hashlib.sha1(h + int(t).to_bytes(8, "little")).digest()
    return h


class Seq:
    """A minimal backend loop over the cache: begin (plan, restore, prefill with snapshots), finish."""

    def __init__(self, cache: PrefixCache, store: FakeStore) -> None:
        self.cache, self.store = cache, store

    def run(self, tokens: list[int]) -> tuple[int, list[int]]:
        self.store.state, self.store.position = b"", 0
        plan, pages = self.cache.begin(tokens)
        done = plan.reuse
        assert self.store.position == done
        snaps = []
        for stop in prefill_boundaries(done, len(tokens), self.cache.chunk):
            while len(pages) * PAGE < stop:
                pages.append(self.cache.allocate())
            for pos in range(done, stop):
                self.store.kv[pages[pos // PAGE], pos % PAGE] = tokens[pos]
                self.store.state = hashlib.sha1(
                    self.store.state + int(tokens[pos]).to_bytes(8, "little")
                ).digest()
            self.store.position = done = stop
            if self.cache.wants_snapshot(stop, len(tokens)):
                tail = self.store.read_page(pages[stop // PAGE]) if stop % PAGE else None
                snap = Snapshot(stop, prefix_key(tokens, stop, plan.keys), self.store.save_state(), tail)
                self.cache.add_snapshot(snap)
                snaps.append(snap)
        keys = chain_keys(tokens)
        for i, key in enumerate(keys):
            self.cache.register(key, pages[i])
        # every position holds the right token, the state is the hash of the whole sequence
        for pos, t in enumerate(tokens):
            assert int(self.store.kv[pages[pos // PAGE], pos % PAGE]) == t, pos
        assert self.store.state == running_hash(tokens)
        self.cache.persist(keys, pages, snaps)
        self.cache.release(pages)
        return plan.reuse, pages


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50000, (n,), generator=g).tolist()


def test_boundaries_follow_absolute_positions():
    assert prefill_boundaries(0, 5000, 2048) == [2048, 4096, 4864, 5000]
    assert prefill_boundaries(4096, 5000, 2048) == [4864, 5000]
    assert prefill_boundaries(0, 4096, 2048) == [2048, 4096]
    assert prefill_boundaries(0, 100, 2048) == [100]
    assert (
        is_boundary(4096, 5000, 2048) and is_boundary(4864, 5000, 2048) and not is_boundary(1024, 5000, 2048)
    )


def stock_chunks(length: int, chunk: int = 2048) -> list[int]:
    """ExLlamaV3's Job.prefill for a recurrent model from an empty cache: chunk ends rounded down to a page,
    the chunk that crosses the last full page cut there."""
    ends, pos, end = [], 0, length
    while pos < end:
        stop = min((pos + chunk) // PAGE * PAGE, end)
        last_page = end // PAGE * PAGE
        if pos < last_page <= stop:
            stop = last_page
        ends.append(stop)
        pos = stop
    return ends


@pytest.mark.parametrize("length", [1, 255, 256, 1000, 2048, 2049, 5000, 8191, 70000])
def test_boundaries_equal_stock_chunking(length):
    assert prefill_boundaries(0, length, 2048) == stock_chunks(length)


def test_reuse_from_gpu_pages_is_exact_and_longest():
    store = FakeStore(64)
    cache = PrefixCache(store, 64, chunk=2048, snapshot_interval=4096, host_bytes=0)
    seq = Seq(cache, store)
    base = tokens(6000, 1)
    assert seq.run(base)[0] == 0
    # same prompt: resumes at its own end
    assert seq.run(base)[0] == 6000
    # longer prompt: resumes at the last chunk boundary that is also one of the new prompt's boundaries
    reuse, _ = seq.run(base + tokens(900, 2))
    assert reuse == 4096
    # a prompt that differs inside the first page reuses nothing
    other = list(base)
    other[10] += 1
    assert seq.run(other)[0] == 0
    assert cache.stats.gpu_hits > 0


def test_eviction_to_host_and_back():
    store = FakeStore(30)
    cache = PrefixCache(store, 30, chunk=2048, snapshot_interval=2048, host_bytes=1 << 30)
    seq = Seq(cache, store)
    a, b = tokens(6000, 3), tokens(6000, 4)
    seq.run(a)
    seq.run(b)  # 24 pages each, 30 in all: part of a's pages go to the host tier
    assert cache.stats.evicted_to_host > 0
    reuse, _ = seq.run(a + tokens(300, 5))
    assert reuse == 4096 and cache.stats.host_hits > 0


def test_without_host_tier_evicted_pages_are_gone():
    store = FakeStore(30)
    cache = PrefixCache(store, 30, chunk=2048, snapshot_interval=2048, host_bytes=0)
    seq = Seq(cache, store)
    a, b = tokens(6000, 3), tokens(6000, 4)
    seq.run(a)
    seq.run(b)
    reuse, _ = seq.run(a + tokens(300, 5))
    assert reuse < 4096  # a's early pages were dropped, so its snapshots are unusable
    assert cache.stats.dropped_pages > 0


def test_disk_tier_survives_a_restart_and_drops_damage(tmp_path):
    a = tokens(9000, 6)
    store = FakeStore(64)
    seq = Seq(PrefixCache(store, 64, chunk=2048, snapshot_interval=8192, disk_dir=tmp_path), store)
    seq.run(a)
    store2 = FakeStore(64)  # a new process: empty GPU and host tiers
    cache2 = PrefixCache(store2, 64, chunk=2048, snapshot_interval=8192, disk_dir=tmp_path)
    reuse, _ = Seq(cache2, store2).run(a + tokens(400, 7))
    assert reuse == 8192 and cache2.stats.disk_hits > 0
    damaged = 0
    for path in tmp_path.glob("p-*.page"):
        path.write_bytes(path.read_bytes()[:-1] + b"x")  # corrupt every page file
        damaged += 1
    store3 = FakeStore(64)
    cache3 = PrefixCache(store3, 64, chunk=2048, snapshot_interval=8192, disk_dir=tmp_path)
    reuse, _ = Seq(cache3, store3).run(a + tokens(400, 8))
    assert reuse == 0  # the damaged entry is refused: the prompt is prefilled cold, correctly
    disk = DiskTier(tmp_path)  # the damaged file that was read is gone; the cold run wrote a good one again
    assert sum(disk.read_page(k) is None for k in list(disk.pages)) < damaged


def test_disabled_cache_reuses_nothing():
    store = FakeStore(64)
    cache = PrefixCache(store, 64, enabled=False)
    seq = Seq(cache, store)
    a = tokens(3000, 9)
    seq.run(a)
    assert seq.run(a)[0] == 0
    assert not cache.gpu and not cache.snapshots


def test_all_pages_in_use_is_an_error():
    store = FakeStore(2)
    cache = PrefixCache(store, 2)
    cache.allocate()
    cache.allocate()
    with pytest.raises(MemoryError):
        cache.allocate()


def test_resume_points_follow_the_chunk_size():
    """Why 8192-token prefill chunks stay opt-in: a follow-up turn resumes only where its own cold prefill has
    a chunk boundary. After a 6,000-token first turn, a 6,716-token second prompt resumes at 4,096 with
    2048-token chunks and nowhere with 8192-token chunks (device call 23 saw this as 0 cached tokens)."""
    first_end, second_end = 5999, 6716
    for chunk, expected in ((2048, 4096), (8192, None)):
        cache = PrefixCache(FakeStore(64), 64, chunk=chunk, snapshot_interval=8192, host_bytes=0)
        snapshots = [p for p in prefill_boundaries(0, first_end, chunk) if cache.wants_snapshot(p, first_end)]
        usable = [p for p in snapshots if p <= second_end and is_boundary(p, second_end, chunk)]
        assert max(usable, default=None) == expected, (chunk, snapshots, usable)
