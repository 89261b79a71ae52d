"""Drive the served tensor-core tree attention for Nsight Compute (diagnostic, GPU only).

Fills a quantized cache of `ctx` positions (tests/kernels/tree_cases.QuantPool), then calls
`tree_attention_mma` `calls` times with `rows` tree rows, so that `ncu --kernel-name regex:mma_split
--launch-skip N` can profile one warm launch. Usage (repo root, after `make build`):
  ncu ... python3 elpis/bench/scripts/mma_ncu.py [ctx] [rows] [calls]
"""

from __future__ import annotations

import random
import sys

import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from tests.kernels import tree_cases as tc


def main(ctx: int, rows: int, calls: int) -> None:
    pool = tc.QuantPool(ctx + 16, seed=ctx)
    masks = accept.tree_masks(tc.random_parents(rows, random.Random(rows)))
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
    args = (
        pool.layer.qk,
        pool.layer.sk,
        pool.layer.qv,
        pool.layer.sv,
        pool.table,
        ctx,
        masks.depth,
        masks.ancestors,
    )
    for _ in range(calls):
        ta.tree_attention_mma(q, *args)
    torch.cuda.synchronize()
    print(f"mma_ncu: {calls} calls at ctx {ctx}, {rows} rows", flush=True)


if __name__ == "__main__":
    argv = [int(a) for a in sys.argv[1:]]
    main(*(argv + [131056, 8, 4][len(argv) :]))
