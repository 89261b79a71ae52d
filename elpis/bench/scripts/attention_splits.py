"""The served tree attention against builds with other split layouts of its schedule (diagnostic, GPU).

`bend/verify_schedule.bend` cuts a row's span into splits; each (split, K/V head) is one block that runs its
split's tiles one after another, and the combine folds the splits. Each NAME=DIR given is a folder holding a
`verify_schedule.h` rendered from another layout (`render_layout.py OUT_DIR REV` renders a commit's;
session 20 rendered uniform split sizes from copies of `bend/`, session 24 session 23's layout,
`.device/schedule-r2`), and the
tensor-core kernel is built against it beside the served build (the build's own header, `served`). At each
context, with the served graph form (context and masks read on the device, the grid sized for the context's
bucket, `context_bucket`), 8 and 16 rows of a random tree: time per call (`rows_gemm_check.timed`: a CUDA
graph of 20 calls, median of 7 replays), the workspace, and the largest difference of the output from the
served build's. Writes one JSON object to OUT and prints a line per case.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/attention_splits.py OUT.json NAME=DIR...
"""

from __future__ import annotations

import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from elpis import nvcc
from elpis.bench.scripts.rows_gemm_check import timed
from elpis.exl3 import tree_attention as ta
from elpis.exl3.tree_graph import context_bucket
from tests.kernels import tree_cases as tc

CONTEXTS = (1000, 4000, 8000, 32000, 128000, 262000)
DEFINES = {"ELPIS_QCACHE_K_BITS": 3, "ELPIS_QCACHE_V_BITS": 3, "ELPIS_MMA_PREFETCH": 1}


def tree_masks(parents: list[int]) -> list[int]:
    """Depths then ancestor bitmasks (bit j: row j is the row or an ancestor), as `elpis.accept.tree_masks`
    gives them, without the built acceptor (this probe runs on a machine that has not run `make build`)."""
    depth, ancestors = [], []
    for row, parent in enumerate(parents):
        depth.append(0 if parent < 0 else depth[parent] + 1)
        ancestors.append((1 << row) | (0 if parent < 0 else ancestors[parent]))
    return depth + ancestors


def call(lib, q, pool, ctx_dev, max_ctx, masks, out, workspace) -> None:
    rows = q.shape[0]
    err = lib.elpis_tree_attention_mma_dev(
        q.data_ptr(), pool.layer.qk.data_ptr(), pool.layer.sk.data_ptr(), pool.layer.qv.data_ptr(),
        pool.layer.sv.data_ptr(), pool.table.data_ptr(), masks.data_ptr(), masks.data_ptr() + 4 * rows, rows,
        ctx_dev.data_ptr(), max_ctx, ta.DEFAULT_SCALE, out.data_ptr(), None, workspace.data_ptr(),
        workspace.numel(), torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"tree attention: CUDA error {err}")


def measure(libs: dict, pool, ctx: int, max_ctx: int, rows: int) -> dict:
    """Time and output of every build on one random tree of `rows` rows at context `ctx`."""
    ctx_dev = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    parents = tc.random_parents(rows, random.Random(rows))
    masks = torch.tensor(tree_masks(parents), dtype=torch.int32, device="cuda")
    q = torch.randn((rows, ta.Q_HEADS, ta.HEAD_DIM), device="cuda").half()
    record: dict = {"ctx": ctx, "max_ctx": max_ctx, "rows": rows}
    outs = {}
    for name, lib in libs.items():
        floats = int(lib.elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1))
        workspace = torch.empty(floats, dtype=torch.float32, device="cuda")
        out = torch.empty((rows, ta.Q_HEADS, ta.HEAD_DIM), dtype=torch.half, device="cuda")

        def run(lib=lib, workspace=workspace, out=out) -> None:
            call(lib, q, pool, ctx_dev, max_ctx, masks, out, workspace)

        ms, mode = timed(lambda _, run=run: run(), reps=7, inner=20)
        record[f"ms_{name}"], record[f"timing_{name}"] = round(ms, 4), mode
        outs[name] = out.float()
        record[f"workspace_mb_{name}"] = round(floats * 4 / 2**20, 1)
        record[f"maxdiff_{name}"] = (outs[name] - outs["served"]).abs().max().item()
    return record


def main(out_path: str, layouts: dict[str, Path]) -> int:
    dirs = {"served": [], **{name: [d] for name, d in layouts.items()}}
    for name, d in layouts.items():
        if name == "served" or not (d / "verify_schedule.h").is_file():
            raise SystemExit(f"{name}={d}: want a NAME other than served and a folder with verify_schedule.h")
    arch = nvcc.device_arch()

    def compile_one(include: list[Path]) -> Path:
        return nvcc.compile_shared(ta.SOURCE_MMA, arch=arch, defines=DEFINES, include_dirs=include)

    with ThreadPoolExecutor(len(dirs)) as workers:  # nvcc runs as a process: the builds go in parallel
        list(workers.map(compile_one, dirs.values()))
    libs = {name: ta.load_mma(DEFINES, include_dirs=d) for name, d in dirs.items()}
    records = []
    for ctx in CONTEXTS:
        max_ctx = context_bucket(ctx + 16, 1 << 20)  # the served graph's grid covers the bucket
        pool = tc.QuantPool(max_ctx, seed=ctx)
        for rows in (8, 16):
            records.append(measure(libs, pool, ctx, max_ctx, rows))
            print(json.dumps(records[-1]), flush=True)
        del pool
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    layout_dirs = {k: str(v) for k, v in layouts.items()}
    report = {"gpu": props.name, "torch": torch.__version__, "layouts": layout_dirs, "records": records}
    Path(out_path).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], {a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in sys.argv[2:]}))
