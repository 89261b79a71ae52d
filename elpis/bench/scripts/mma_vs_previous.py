"""The served tensor-core tree attention against a previous build of its source, on the GPU (diagnostic).

A kernel change that keeps the arithmetic must keep every bit: for contexts that use one block per
(split, head) and several (short contexts deal the rows to more blocks), 1-16 rows and random trees, both
builds get the same quantized cache (tests/kernels/tree_cases.QuantPool) and queries, and their outputs and
log-sum-exps are compared bit for bit; then both are timed (median of CUDA-event times) from 32K on, with 1, 8
and 16 rows. Contexts given on the command line replace the default four (1000, 4093, 32760, 131050); one
past 131050 is checked with 1, 8 and 16 rows only. `--define NAME=VALUE` builds the other source with extra
defines (e.g. the 8-row build, ELPIS_BUILD_MAX_ROWS=8 ELPIS_MMA_MIN_BLOCKS=2, against the served one), and
`--max-rows N` keeps the checks to the rows such a build serves.
Prints one JSON line per check and exits non-zero on any difference.
Usage (repo root, after `make build`):
  python3 elpis/bench/scripts/mma_vs_previous.py OTHER.cu [CTX ...] [--define NAME=VALUE ...] [--max-rows N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from elpis import accept
from elpis.exl3 import tree_attention as ta
from tests.kernels import tree_cases as tc


def main(previous: Path, contexts: list[int], defines: dict[str, int], max_rows: int = 16) -> int:
    lib = ta.load_mma({"ELPIS_QCACHE_K_BITS": 3, "ELPIS_QCACHE_V_BITS": 3, **defines}, previous)
    served = ta._mma_library(3, 3, fold=ta.hadamard_fold_default())
    occupancy = {}
    for name, build in (("served", served), ("other", lib)):
        if hasattr(build, "elpis_tree_attention_mma_blocks_per_sm"):  # sources from session 49 on
            occupancy[name] = int(build.elpis_tree_attention_mma_blocks_per_sm())
    print(json.dumps({"check": "blocks per multiprocessor", "defines": defines, **occupancy}), flush=True)

    def prev(q, *a, return_lse=False):
        return tc.call_build(lib, q, a[:4], *a[4:], return_lse=return_lse)

    new = ta.tree_attention_mma
    failures = 0
    for ctx in contexts or [1000, 4093, 32760, 131050]:
        pool = tc.QuantPool(ctx + 16, seed=ctx + 3)
        args0 = (pool.layer.qk, pool.layer.sk, pool.layer.qv, pool.layer.sv, pool.table)
        for rows in [r for r in ((1, 3, 8, 9, 12, 16) if ctx <= 131050 else (1, 8, 16)) if r <= max_rows]:
            masks = accept.tree_masks(tc.random_parents(rows, random.Random(ctx * 31 + rows)))
            q = torch.randn(
                (rows, ta.Q_HEADS, ta.HEAD_DIM), generator=torch.Generator().manual_seed(rows)
            ).half()
            q = q.cuda()
            args = (*args0, ctx, masks.depth, masks.ancestors)
            out_new, lse_new = new(q, *args, return_lse=True)
            out_old, lse_old = prev(q, *args, return_lse=True)
            same = torch.equal(out_new.view(torch.int16), out_old.view(torch.int16)) and torch.equal(
                lse_new.view(torch.int32), lse_old.view(torch.int32)
            )
            failures += not same
            print(
                json.dumps({"check": "bits vs previous build", "ctx": ctx, "rows": rows, "identical": same})
            )
        if ctx >= 32760:
            record: dict = {"check": "timing vs previous build", "ctx": ctx, "defines": defines}
            for rows in [r for r in (1, 8, 16) if r <= max_rows]:
                masks = accept.tree_masks(tc.random_parents(rows, random.Random(rows)))
                q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
                args = (*args0, ctx, masks.depth, masks.ancestors)
                for name, fn in (("new", new), ("previous", prev), ("new_again", new)):
                    ms = tc.median_ms(lambda fn=fn, q=q, a=args: fn(q, *a), 30)
                    record[f"{name}_ms_{rows}"] = round(ms, 4)
            print(json.dumps(record), flush=True)
        del pool
        torch.cuda.empty_cache()
    print(json.dumps({"check": "bits vs previous build", "failures": failures}))
    return 1 if failures else 0


def _define(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    if not name or not value.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"--define wants NAME=INTEGER, got {text!r}")
    return name, int(value)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("previous", type=Path)
    parser.add_argument("contexts", type=int, nargs="*")
    parser.add_argument("--define", type=_define, action="append", default=[])
    parser.add_argument("--max-rows", type=int, default=16)
    args = parser.parse_args()
    sys.exit(main(args.previous, args.contexts, dict(args.define), args.max_rows))
