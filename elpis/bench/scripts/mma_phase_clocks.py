"""Where a tile of the tensor-core tree attention spends its time (diagnostic, GPU only).

Builds `patches/kernels/tree_attention_mma.cu` with ELPIS_MMA_CLOCKS (thread 0 of the block in the middle of
the grid adds each phase's clock64 cycles to device counters; in a tail tile one extra barrier separates P
from the V staging) and prints, per context and row count, one JSON line: the served build's median ms per
call, the clock build's cycles per tile per phase, the measured block's ns per tile and the SM clock this
implies.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/mma_phase_clocks.py [ctx ...]
"""

from __future__ import annotations

import ctypes
import json
import random
import sys

import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from tests.kernels import tree_cases as tc

# A tile below ctx overlaps its staging with the tensor-core phases: there "scores" is the score warps' scores
# and P beside the other warps' V staging, "output" includes the next tile's K staging, "stage_k" is only the
# block's first K, and "softmax_p" and "stage_v" stay 0.
PHASES = ("slots", "stage_k", "scores", "softmax_p", "stage_v", "output")


def clock_library() -> ctypes.CDLL:
    lib = ta.load_mma({"ELPIS_QCACHE_K_BITS": 3, "ELPIS_QCACHE_V_BITS": 3, "ELPIS_MMA_CLOCKS": 1})
    lib.elpis_tree_attention_mma_clocks.argtypes = [ctypes.c_void_p]
    lib.elpis_tree_attention_mma_clocks.restype = ctypes.c_int
    return lib


def read_clocks(lib: ctypes.CDLL) -> list[int]:
    torch.cuda.synchronize()
    out = (ctypes.c_ulonglong * 10)()
    err = lib.elpis_tree_attention_mma_clocks(ctypes.addressof(out))
    if err != 0:
        raise RuntimeError(f"reading the phase clocks failed: CUDA error {err}")
    return list(out)


def main(contexts: list[int]) -> None:
    lib = clock_library()
    for ctx in contexts:
        pool = tc.QuantPool(ctx + 16, seed=ctx)
        for rows in (1, 8, 16):
            masks = accept.tree_masks(tc.random_parents(rows, random.Random(rows)))
            q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
            args = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv, pool.table, ctx, masks.depth,
                    masks.ancestors)  # fmt: skip
            served_ms = tc.median_ms(lambda q=q, a=args: ta.tree_attention_mma(q, *a), 20)
            clocked_ms = tc.median_ms(lambda q=q, a=args: tc.call_build(lib, q, a[:4], *a[4:]), 20)
            c = read_clocks(lib)
            tiles = max(c[6], 1)
            record = {
                "ctx": ctx, "rows": rows, "served_ms": round(served_ms, 4),
                "clocked_ms": round(clocked_ms, 4),
                "blocks_measured": c[9], "tiles_per_block": c[6] / max(c[9], 1),
                "cycles_per_tile": {p: round(c[i] / tiles) for i, p in enumerate(PHASES)},
                "block_cycles_per_tile": round(c[7] / tiles), "block_ns_per_tile": round(c[8] / tiles, 1),
                "implied_ghz": round(c[7] / max(c[8], 1), 3),
            }  # fmt: skip
            print(json.dumps(record), flush=True)
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1008, 8176, 32752, 131056])
