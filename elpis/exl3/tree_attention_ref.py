"""CPU references for the tree-verify attention kernel (`patches/kernels/tree_attention.cu`).

* `reference_fp64`: what the kernel computes, in float64, stated independently of the schedule: row r
  attends to the committed slots 0 .. ctx-1 followed by its ancestors' slots ctx + j, j the rows of its
  ancestor mask in ascending order (ancestors come before descendants), softmax over all of them.
* `emulate_fp32`: the kernel's algorithm in float32 on the CPU, split for split: absolute positions cut
  at the proved schedule's boundaries (`elpis.bend.schedule.split_bounds`), each split's scores (per-lane
  fused multiply-adds over 8 dims, then the kernel's xor butterfly), max, exp, serial sum and serial P.V
  in ascending position order, then the splits folded in ascending order with the kernel's formula.
  Fused multiply-add is emulated through float64 (exact product, one rounding of the sum to float64 then
  float32: a double rounding the GPU does not do) and exp is the CPU's, so it matches the kernel to a few
  float32 ulps, not bit for bit.
* `row_kv` / `sequential_cache`: the K/V a row reads in position order, and the cache plain decoding
  would hold after committing that row's path (the row-invariance tests compare against it).

Tensors: q [R, 24, 256], caches [pages, 256, 4, 256] (any float dtype), block_table int [n]; the float64
reference runs on the caches' device, the emulation on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

HEAD_DIM = 256
Q_HEADS = 24
KV_HEADS = 4
GROUP = Q_HEADS // KV_HEADS
PAGE = 256


def ancestor_rows(mask: int) -> list[int]:
    """The rows of an ancestor mask in ascending order: the row's ancestors from the root, then itself."""
    return [j for j in range(32) if (mask >> j) & 1]


def row_slots(ctx: int, mask: int) -> list[int]:
    """Cache slots of the positions 0 .. ctx+depth a row with ancestor mask `mask` attends to."""
    return list(range(ctx)) + [ctx + j for j in ancestor_rows(mask)]


def _gather(cache: torch.Tensor, block_table: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
    idx = torch.as_tensor(slots, dtype=torch.long, device=cache.device)
    pages = block_table.to(cache.device, torch.long)[idx // PAGE]
    return cache[pages, idx % PAGE]  # [n, KV_HEADS, HEAD_DIM]


def row_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, ctx: int, mask: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [ctx+depth+1, 4, 256] a row reads, in absolute position order."""
    slots = row_slots(ctx, mask)
    return _gather(k_cache, block_table, slots), _gather(v_cache, block_table, slots)


def sequential_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, ctx: int, mask: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fresh cache (identity block table) holding the row's positions at their absolute slots: what plain
    decoding at context ctx+depth holds after committing the row's path. Returns (k, v, block_table)."""
    k, v = row_kv(k_cache, v_cache, block_table, ctx, mask)
    n = k.shape[0]
    pages = (n + PAGE - 1) // PAGE
    kc = torch.zeros((pages, PAGE, KV_HEADS, HEAD_DIM), dtype=k_cache.dtype)
    vc = torch.zeros_like(kc)
    kc.view(-1, KV_HEADS, HEAD_DIM)[:n] = k
    vc.view(-1, KV_HEADS, HEAD_DIM)[:n] = v
    return kc, vc, torch.arange(pages, dtype=torch.int32)


def reference_fp64(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx: int,
    ancestors: Sequence[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention: (out [R, 24, 256], lse [R, 24])."""
    outs, lses = [], []
    for r, mask in enumerate(ancestors):
        k, v = row_kv(k_cache, v_cache, block_table, ctx, mask)
        k, v = k.double(), v.double()  # [n, 4, 256]
        qg = q[r].double().to(k.device).view(KV_HEADS, GROUP, HEAD_DIM)  # query head i uses K/V head i // 6
        s = torch.einsum("gjd,ngd->gjn", qg, k) * scale
        lse = torch.logsumexp(s, dim=-1)
        out = torch.einsum("gjn,ngd->gjd", torch.exp(s - lse[..., None]), v)
        outs.append(out.reshape(Q_HEADS, HEAD_DIM))
        lses.append(lse.reshape(Q_HEADS))
    return torch.stack(outs), torch.stack(lses)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double() + c.double()).float()


def _scores(qg: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Kernel-order scores: qg [6, 256] fp32, k [n, 256] fp32 -> [6, n]."""
    lanes_q = qg.view(GROUP, 1, 32, 8)
    lanes_k = k.view(1, -1, 32, 8)
    acc = torch.zeros((GROUP, k.shape[0], 32), dtype=torch.float32)
    for d in range(8):
        acc = _fma32(lanes_q[..., d], lanes_k[..., d], acc)
    for width in (16, 8, 4, 2, 1):  # xor butterfly as seen by lane 0: own value + partner's
        acc = acc[..., :width] + acc[..., width : 2 * width]
    return acc[..., 0] * torch.tensor(scale, dtype=torch.float32)


def emulate_fp32(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx: int,
    ancestors: Sequence[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm in float32: (out fp16 [R, 24, 256], lse fp32 [R, 24])."""
    from elpis.bend.schedule import split_bounds

    rows = len(ancestors)
    out = torch.empty((rows, Q_HEADS, HEAD_DIM), dtype=torch.half)
    lse = torch.empty((rows, Q_HEADS), dtype=torch.float32)
    for r, mask in enumerate(ancestors):
        k_all, v_all = row_kv(k_cache, v_cache, block_table, ctx, mask)
        k_all, v_all = k_all.float(), v_all.float()
        total = k_all.shape[0]
        for h in range(KV_HEADS):
            qg = q[r, h * GROUP : (h + 1) * GROUP].float().cpu()
            parts = []
            for begin, end in split_bounds(total):  # the schedule's splits, ascending
                s = _scores(qg, k_all[begin:end, h], scale)  # [6, n]
                m = s.max(dim=-1).values
                p = torch.exp(s - m[:, None])
                acc = torch.zeros((GROUP, HEAD_DIM), dtype=torch.float32)
                l_sum = torch.zeros(GROUP, dtype=torch.float32)
                for i in range(end - begin):  # serial, ascending positions
                    acc = _fma32(p[:, i : i + 1], v_all[begin + i, h][None, :], acc)
                    l_sum = l_sum + p[:, i]
                parts.append((m, l_sum, acc))
            m, l_sum, acc = parts[0]
            for ms, ls, acs in parts[1:]:  # combine in ascending split order
                mn = torch.maximum(m, ms)
                keep, take = torch.exp(m - mn), torch.exp(ms - mn)
                l_sum = _fma32(l_sum, keep, ls * take)
                acc = _fma32(acc, keep[:, None], acs * take[:, None])
                m = mn
            out[r, h * GROUP : (h + 1) * GROUP] = (acc / l_sum[:, None]).half()
            lse[r, h * GROUP : (h + 1) * GROUP] = m + torch.log(l_sum)
    return out, lse
