"""One warm launch of elpis's 1-16-row EXL3 GEMM and of ExLlamaV3's on one shape, inside the NVTX range
"gemm", for `ncu --nvtx --nvtx-include gemm/` (diagnostic, GPU). Usage: python3 rows_gemm_ncu.py K N ROWS
"""

from __future__ import annotations

import sys

import torch

from elpis.exl3 import rows_gemm as rg


def main(k: int, n: int, rows: int) -> None:
    from exllamav3.ext import exllamav3_ext as ext

    from elpis.bench.scripts.rows_gemm_check import random_linear

    g = torch.Generator(device="cuda").manual_seed(1)
    trellises, suh, svh = random_linear(k, n, g, copies=1)
    trellis = trellises[0]
    x = torch.randn((rows, k), generator=g, device="cuda").half()
    out, a_had = torch.empty((rows, n), dtype=torch.half, device="cuda"), torch.empty_like(x)
    for _ in range(3):
        rg.rows_gemm(x, trellis, suh, svh)
        ext.exl3_gemm(x, trellis, out, suh, a_had, svh, 0, False, True, 0)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("gemm")
    rg.rows_gemm(x, trellis, suh, svh)
    ext.exl3_gemm(x, trellis, out, suh, a_had, svh, 0, False, True, 0)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
