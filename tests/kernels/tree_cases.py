"""Cases and invariance checks for the tree-verify attention, shared by the CPU tests (run on the float32
emulation of the kernel's algorithm) and the GPU tests (run on the kernel itself).

`attend(q, k_cache, v_cache, block_table, ctx, depth, ancestors) -> (out fp16 [R, 24, 256], lse [R, 24])`
is the function under test. Every check compares outputs bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref

Attend = Callable[..., tuple[torch.Tensor, torch.Tensor]]
PAGE = ref.PAGE
# bend/verify_schedule.bend's first split boundary, split_min() (test_tree_attention_ref checks it)
FIRST_SPLIT = 128


@dataclass
class Case:
    q: torch.Tensor  # [R, 24, 256] fp16
    k: torch.Tensor  # [pages, 256, 4, 256] fp16
    v: torch.Tensor
    table: torch.Tensor  # int32 [n]
    ctx: int
    parents: list[int]
    depth: tuple[int, ...]
    ancestors: tuple[int, ...]

    def run(self, attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        return attend(self.q, self.k, self.v, self.table, self.ctx, self.depth, self.ancestors)

    def slot_page(self, slot: int) -> tuple[int, int]:
        return int(self.table[slot // PAGE]), slot % PAGE


def random_parents(rows: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(r) for r in range(1, rows)]


def random_path(parents: list[int], rng: random.Random) -> list[int]:
    """The root-first path from row 0 to a random row of the tree."""
    node, path = rng.randrange(len(parents)), []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def median_ms(fn: Callable[[], object], reps: int = 30) -> float:
    """Median GPU milliseconds of `fn` over `reps` calls timed with CUDA events, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def call_emulated(lib, entry: str, caches, q, table, ctx: int, depth, ancestors):
    """One call of an emulated tree-attention entry (`entry` of `lib`, built by cuda_emu) taking q, the cache
    tensors `caches` (fp16 pages, or packed words and scales), the block table and the masks, with NaN-filled
    outputs and workspace (so an unwritten value shows). Returns (out fp16 [R, 24, 256], lse [R, 24])."""
    rows = len(depth)
    dep = torch.tensor(depth, dtype=torch.int32)
    anc = torch.tensor(ancestors, dtype=torch.int32)
    floats = lib.elpis_tree_attention_workspace_floats(rows, ctx, max(depth))
    work = torch.full((floats,), float("nan"), dtype=torch.float32)
    out = torch.full((rows, ref.Q_HEADS, ref.HEAD_DIM), float("nan"), dtype=torch.half)
    lse = torch.full((rows, ref.Q_HEADS), float("nan"), dtype=torch.float32)
    err = getattr(lib, entry)(
        q.data_ptr(), *(t.data_ptr() for t in caches), table.data_ptr(), dep.data_ptr(), anc.data_ptr(),
        rows, ctx, max(depth), ta.DEFAULT_SCALE, out.data_ptr(), lse.data_ptr(), work.data_ptr(),
        floats, None,
    )  # fmt: skip
    assert err == 0
    return out, lse


def call_build(lib, q, caches, table, ctx: int, depth, ancestors, return_lse: bool = False):
    """One GPU call of a given build of the tensor-core attention (`lib`, from `ta.load_mma`) through the
    served entry's checks, for a test or diagnostic that compares or times it beside the served build.
    `caches`: qk, sk, qv, sv."""
    return ta._quantized_call(
        lambda k, v: lib, "elpis_tree_attention_mma", q, tuple(caches), table, ctx, depth, ancestors,
        ta.DEFAULT_SCALE, return_lse,
    )  # fmt: skip


def log_kernel(test: str, record: dict) -> None:
    """Print one JSON result line of a GPU kernel test and append it to $ELPIS_KERNEL_LOG when set."""
    line = json.dumps({"test": test, **record}, sort_keys=True)
    print(line)
    if path := os.environ.get("ELPIS_KERNEL_LOG"):
        with Path(path).open("a") as fh:
            fh.write(line + "\n")


def make_case(ctx: int, parents: list[int], seed: int, device: str = "cpu") -> Case:
    """Random fp16 q and caches; the block table maps the sequence's pages to shuffled cache pages."""
    rows = len(parents)
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = (ctx + rows + PAGE - 1) // PAGE + 1  # one spare page: a 1-row call at ctx+depth fits too
    pool = pages + 2
    k = torch.randn((pool, PAGE, ref.KV_HEADS, ref.HEAD_DIM), generator=gen, device=device).half()
    v = torch.randn((pool, PAGE, ref.KV_HEADS, ref.HEAD_DIM), generator=gen, device=device).half()
    q = torch.randn((rows, ref.Q_HEADS, ref.HEAD_DIM), generator=gen, device=device).half()
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(seed))[:pages]
    masks = accept.tree_masks(parents)
    return Case(q, k, v, order.to(torch.int32).to(device), ctx, list(parents), masks.depth, masks.ancestors)


def _copy_case(case: Case) -> Case:
    return Case(case.q.clone(), case.k.clone(), case.v.clone(), case.table.clone(), case.ctx,
                list(case.parents), case.depth, case.ancestors)  # fmt: skip


def _row_kv(case: Case, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    page, off = case.slot_page(case.ctx + row)
    return case.k[page, off].clone(), case.v[page, off].clone()


def _set_row_kv(case: Case, row: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
    page, off = case.slot_page(case.ctx + row)
    case.k[page, off] = kv[0]
    case.v[page, off] = kv[1]


def _random_like(
    kv: tuple[torch.Tensor, torch.Tensor], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv
    return (
        torch.randn(k.shape, generator=gen, device=k.device).half(),
        torch.randn(v.shape, generator=gen, device=v.device).half(),
    )


def relabel(case: Case, rng: random.Random) -> tuple[Case, list[int]]:
    """The same tree with its rows renumbered (a random order that keeps parents first), q and the rows'
    K/V moved with them. Returns the new case and new_index[old_row]."""
    rows = len(case.parents)
    children: dict[int, list[int]] = {r: [] for r in range(rows)}
    for r in range(1, rows):
        children[case.parents[r]].append(r)
    order, ready = [], [0]
    while ready:
        r = ready.pop(rng.randrange(len(ready)))
        order.append(r)
        ready.extend(children[r])
    new = {old: i for i, old in enumerate(order)}
    parents = [-1] + [new[case.parents[old]] for old in order[1:]]
    out = _copy_case(case)
    masks = accept.tree_masks(parents)
    out.parents, out.depth, out.ancestors = parents, masks.depth, masks.ancestors
    out.q = case.q[torch.as_tensor(order, device=case.q.device)].clone()
    for old in range(rows):
        _set_row_kv(out, new[old], _row_kv(case, old))
    return out, [new[r] for r in range(rows)]


def check_relabel_rows(attend: Attend, case: Case, rng: random.Random) -> None:
    out, lse = case.run(attend)
    moved, new = relabel(case, rng)
    out2, lse2 = moved.run(attend)
    for r, n in enumerate(new):
        assert torch.equal(out[r], out2[n]), f"row {r} (now {n}) changed when the rows were renumbered"
        assert torch.equal(lse[r], lse2[n])


def check_siblings_do_not_matter(attend: Attend, case: Case, seed: int) -> None:
    """Rewrite q and K/V of every row off row t's path (t: the deepest row); rows whose paths avoid the
    rewritten rows keep their output bit for bit."""
    out, lse = case.run(attend)
    t = max(range(len(case.depth)), key=lambda r: (case.depth[r], r))
    changed = [r for r in range(len(case.parents)) if not (case.ancestors[t] >> r) & 1]
    if not changed:
        return
    other = _copy_case(case)
    gen = torch.Generator(device=case.q.device.type).manual_seed(seed + 1)
    for r in changed:
        other.q[r] = torch.randn(other.q[r].shape, generator=gen, device=case.q.device).half()
        kv = _row_kv(other, r)
        _set_row_kv(other, r, _random_like(kv, gen))
    out2, lse2 = other.run(attend)
    changed_bits = sum(1 << r for r in changed)
    kept = [r for r in range(len(case.parents)) if not case.ancestors[r] & changed_bits]
    assert t in kept
    for r in kept:
        assert torch.equal(out[r], out2[r]), f"row {r} changed when rows {changed} off its path changed"
        assert torch.equal(lse[r], lse2[r])


def check_other_tree_same_path(attend: Attend, case: Case, rng: random.Random, seed: int) -> None:
    """Row t's path re-embedded in a different tree (path first as a chain, then other random rows): t's
    output is unchanged bit for bit."""
    out, lse = case.run(attend)
    t = max(range(len(case.depth)), key=lambda r: (case.depth[r], r))
    path = ref.ancestor_rows(case.ancestors[t])
    rows = len(case.parents)
    extra = rows - len(path)
    parents = [-1] + list(range(len(path) - 1)) + [rng.randrange(len(path) + i) for i in range(extra)]
    other = _copy_case(case)
    masks = accept.tree_masks(parents)
    other.parents, other.depth, other.ancestors = parents, masks.depth, masks.ancestors
    gen = torch.Generator(device=case.q.device.type).manual_seed(seed + 2)
    other.q = torch.randn(case.q.shape, generator=gen, device=case.q.device).half()
    for r in range(rows):  # fresh K/V everywhere in the tree slots ...
        kv = _row_kv(other, r)
        _set_row_kv(other, r, _random_like(kv, gen))
    for e, old in enumerate(path):  # ... then the path's own rows at their new indices 0..depth
        other.q[e] = case.q[old]
        _set_row_kv(other, e, _row_kv(case, old))
    out2, lse2 = other.run(attend)
    e = len(path) - 1
    assert torch.equal(out[t], out2[e]), f"row {t} changed when its path was put in another tree"
    assert torch.equal(lse[t], lse2[e])


def check_equals_plain_decoding(attend: Attend, case: Case) -> None:
    """Every tree row equals a 1-row call (plain decoding) at context ctx+depth whose cache holds the row's
    path at slots ctx .. ctx+depth, bit for bit."""
    out, lse = case.run(attend)
    for t in range(len(case.parents)):
        path = ref.ancestor_rows(case.ancestors[t])
        plain = _copy_case(case)
        for e, old in enumerate(path):
            _set_row_kv(plain, e, _row_kv(case, old))
        one, one_lse = attend(case.q[t : t + 1].clone(), plain.k, plain.v, plain.table,
                              case.ctx + case.depth[t], (0,), (1,))  # fmt: skip
        assert torch.equal(out[t], one[0]), f"row {t} differs from plain decoding at ctx+{case.depth[t]}"
        assert torch.equal(lse[t], one_lse[0])


class QuantPool:
    """A `CacheLayer_quant` (4 K/V heads of 256, compand_a 0) filled by ExLlamaV3 from random K/V through
    a shuffled block table, and its fp16 pages from `get_kv`."""

    def __init__(self, tokens: int, seed: int, bits: int = 3) -> None:
        from exllamav3.cache import CacheLayer_quant

        self.pages = -(-tokens // PAGE)
        pool = self.pages + 2
        attention = SimpleNamespace(num_kv_heads=ref.KV_HEADS, head_dim=ref.HEAD_DIM)
        self.layer = CacheLayer_quant(None, attention, 0, pool * PAGE, bits, bits)
        self.layer.alloc(torch.device("cuda"))
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(pool, generator=gen)[: self.pages]
        self.table = order.to(torch.int32).cuda()
        shape = (1, tokens, ref.KV_HEADS, ref.HEAD_DIM)
        cgen = torch.Generator(device="cuda").manual_seed(seed)
        k = torch.randn(shape, generator=cgen, device="cuda").half()
        v = (torch.randn(shape, generator=cgen, device="cuda") * 0.5).half()
        k[0, :3, :, :64] = 0  # all-zero groups: scale fp16(1e-10) = 0, signed-zero decode
        for first in range(0, tokens, 16384):  # in chunks: one 128K-token append crashed ExLlamaV3's update
            n = min(16384, tokens - first)
            start = torch.tensor([first], dtype=torch.int32, device="cuda")
            part = slice(first, first + n)
            self.layer.update_kv_direct(start, self.table[None], k[:, part], v[:, part], n)
        self.seqlens = torch.tensor([tokens], dtype=torch.int32, device="cuda")
        self.k, self.v = self.layer.get_kv(self.seqlens, self.table[None])
        self.tokens = tokens

    def slots_of_pages(self, pages: list[int]) -> list[tuple[int, int]]:
        """(physical page, rows written) of logical pages `pages`."""
        return [(int(self.table[p]), min(PAGE, self.tokens - p * PAGE)) for p in pages]
