"""Where a rows-GEMM launch spends its time, block by block (diagnostic, GPU).

The ELPIS_GEMM_CLOCKS build of `patches/kernels/exl3_gemm_rows.cu` records, per block, %globaltimer at its
start, after each n-block's main loop and at its end, the n-blocks it finished (folded partials and applied
the output transform), its multiprocessor, and when the last block of an n-block saw the final count and had
summed the partials. For a few verify shapes at 16 rows, weights from DRAM (a fresh
copy of the trellis per launch), this prints and writes: the spread of block starts, the main loops' share of
a block's time, what the blocks that finish n-blocks add, and per multiprocessor the time between the launch's
first start and its own last end against the launch's span (the idle that Nsight Compute counts).
Usage (repo root, after `make build`):
  python3 elpis/bench/scripts/rows_gemm_timeline.py OUT.json [DEFINE:VALUE,...]
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys

import numpy as np
import torch

from elpis import nvcc
from elpis.bench.scripts.rows_gemm_check import parse_defines, random_linear
from elpis.exl3 import rows_gemm as rg

SHAPES = (("mlp.gate", 5120, (17408,)), ("mlp gate/up", 5120, (17408, 17408)), ("mlp.down", 17408, (5120,)))
CLOCK_BLOCKS, CLOCK_WORDS = 4096, 10


def timeline(lib, name: str, k: int, widths: tuple[int, ...], rows: int = 16) -> dict:
    g = torch.Generator(device="cuda").manual_seed(k + sum(widths))
    linears = [random_linear(k, n, g, copies=4) for n in widths]
    x = torch.randn((rows, k), generator=g, device="cuda").half()
    clocks = np.zeros((CLOCK_BLOCKS, CLOCK_WORDS), dtype=np.uint64)
    runs = []
    for c in range(4):  # the first launch warms up; each reads another copy of the weights
        members = [rg.Member(t[c], suh, svh, torch.half) for t, suh, svh in linears]
        torch.cuda.synchronize()
        rg.rows_gemm_group(x, members, lib=lib)
        torch.cuda.synchronize()
        if c == 0:
            continue
        if lib.elpis_rows_gemm_clocks(clocks.ctypes.data) != 0:
            raise RuntimeError("reading the clocks failed")
        blocks = int(lib.elpis_rows_gemm_blocks(k, sum(widths), 4))
        runs.append(summarise(clocks[:blocks].astype(np.int64)))
    return {"shape": name, "k": k, "widths": list(widths), "rows": rows, "runs": runs}


def summarise(c: np.ndarray) -> dict:
    start, end, nbs, finished, sm = c[:, 0], c[:, 4], c[:, 5], c[:, 6], c[:, 7]
    t0 = int(start.min())
    span = int(end.max()) - t0
    loop_end = np.array([c[i, min(int(nbs[i]), 3)] for i in range(len(c))])  # last recorded loop end
    per_sm_last = np.array([end[sm == s].max() for s in np.unique(sm)]) - t0  # each SM's last block end
    return {
        "span_us": span / 1e3,
        "start_spread_us": (int(start.max()) - t0) / 1e3,
        "block_us_median": statistics.median((end - start).tolist()) / 1e3,
        "block_us_max": int((end - start).max()) / 1e3,
        "loops_us_median": statistics.median((loop_end - start).tolist()) / 1e3,
        "after_loops_us_median": statistics.median((end - loop_end).tolist()) / 1e3,
        "after_loops_us_max": int((end - loop_end).max()) / 1e3,
        "finishing_blocks": int((finished > 0).sum()),
        "blocks": len(c),
        "sm_last_end_us": {
            "min": int(per_sm_last.min()) / 1e3,
            "median": statistics.median(per_sm_last.tolist()) / 1e3,
            "max": int(per_sm_last.max()) / 1e3,
        },
        "sm_idle_share": 1.0 - float(per_sm_last.mean()) / span,
        **fold_phases(c, loop_end),
        "late_blocks": [late_block(c, int(i), t0) for i in np.argsort(-end)[:6]],
    }


def fold_phases(c: np.ndarray, loop_end: np.ndarray) -> dict:
    """Of the blocks whose last n-block was one they summed the partials of (its count seen after its main
    loop): main loop end -> final count seen -> partials summed -> block end (output transform, stores)."""
    seen, summed, end = c[:, 8], c[:, 9], c[:, 4]
    last = (seen > 0) & (seen >= loop_end)
    if not last.any():
        return {"folding_blocks": 0}

    def stats(d: np.ndarray) -> dict:
        return {"median": statistics.median(d.tolist()) / 1e3, "max": int(d.max()) / 1e3}

    return {
        "folding_blocks": int(last.sum()),
        "loop_to_count_us": stats(seen[last] - loop_end[last]),
        "count_to_summed_us": stats(summed[last] - seen[last]),
        "summed_to_end_us": stats(end[last] - summed[last]),
    }


def late_block(c: np.ndarray, i: int, t0: int) -> dict:
    start, end = (int(c[i, 0]) - t0) / 1e3, (int(c[i, 4]) - t0) / 1e3
    return {"block": i, "sm": int(c[i, 7]), "start_us": start, "end_us": end, "nblocks": int(c[i, 5]),
            "finished": int(c[i, 6])}  # fmt: skip


def main(out_path: str, knobs: str = "") -> int:
    defines = {"ELPIS_GEMM_CLOCKS": 1, **parse_defines(knobs)}
    lib = rg.bind(nvcc.load(rg.SOURCE, defines=defines))
    lib.elpis_rows_gemm_clocks.argtypes = [ctypes.c_void_p]
    lib.elpis_rows_gemm_clocks.restype = ctypes.c_int
    report = {"gpu": torch.cuda.get_device_properties(0).name, "defines": defines, "shapes": []}
    for name, k, widths in SHAPES:
        entry = timeline(lib, name, k, widths)
        report["shapes"].append(entry)
        for run in entry["runs"]:
            brief = {key: value for key, value in run.items() if key != "late_blocks"}
            print(json.dumps({"shape": name, **brief}), flush=True)
        print(json.dumps({"shape": name, "late_blocks": entry["runs"][-1]["late_blocks"]}), flush=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
