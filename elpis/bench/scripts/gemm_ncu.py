"""Drive one warm 8-row chain verify of the full-size synthetic target for Nsight Compute (diagnostic, GPU).

Loads the target alone (no draft) with ExLlamaV3's kernels, prefills a 512-token prompt, runs three warm-up
verifies of 8 rows and then a fourth inside the NVTX range "verify8", so that `ncu --nvtx --nvtx-include
verify8/` profiles only the kernels of one verify (the EXL3 GEMMs of issue 9 among them).
Usage (repo root, after `make build`): ncu ... python3 elpis/bench/scripts/gemm_ncu.py TARGET_DIR
"""

from __future__ import annotations

import sys

import torch

from elpis.exl3 import load_backend


def main(target: str) -> None:
    backend = load_backend(target, None, max_context=4096, prefix_cache=False, host_cache_gib=0.0)
    backend.begin(list(range(1000, 1512)))
    anchor = 1511
    for i in range(4):
        tokens = [anchor] + [2000 + i * 8 + j for j in range(7)]
        parents = list(range(-1, 7))
        if i == 3:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("verify8")
        backend.verify(tokens, parents)
        if i == 3:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        backend.commit([0])
        anchor = 3000 + i
    backend.finish()
    print("gemm_ncu: 4 verifies of 8 rows", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
