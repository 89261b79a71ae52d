"""The served tree attention with other split sizes of its schedule (diagnostic, GPU).

`bend/verify_schedule.bend` cuts a row's span into splits of 2^split_shift() positions; each (split, K/V
head) is one block that runs its split's tiles one after another, and the combine folds the splits. For
each shift given, the schedule header is rendered from a copy of `bend/` with that shift (not proved: a
timing probe) and the tensor-core kernel built against it. At each context, with the served graph form
(context and masks read on the device, the grid sized for the context's bucket, `context_bucket`), 8 and
16 rows of a random tree: time per call (`rows_gemm_check.timed`: a CUDA graph of 20 calls, median of 7
replays) and the largest difference of the output from the served build's (shift 9, the build's own header).
Writes one JSON object to OUT and prints a table.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/attention_splits.py OUT.json SHIFT...
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from elpis import nvcc
from elpis.bench.scripts.rows_gemm_check import timed
from elpis.bend import schedule
from elpis.exl3 import tree_attention as ta
from elpis.exl3.tree_graph import context_bucket
from elpis.paths import REPO_ROOT
from tests.kernels import tree_cases as tc

CONTEXTS = (1000, 4000, 8000, 32000, 128000, 262000)
DEFINES = {"ELPIS_QCACHE_K_BITS": 3, "ELPIS_QCACHE_V_BITS": 3, "ELPIS_MMA_PREFETCH": 1}


def schedule_dir(shift: int) -> Path:
    """A folder holding verify_schedule.h rendered with split_shift() = shift."""
    root = Path(f"/tmp/elpis-schedule-{shift}")
    shutil.rmtree(root, ignore_errors=True)
    for part in ("bend", "codegen"):
        shutil.copytree(REPO_ROOT / part, root / part)
    source = root / "bend" / "verify_schedule.bend"
    text = source.read_text()
    served = "def split_shift() -> Nat:\n  9n\n"
    if text.count(served) != 1:
        raise RuntimeError("bend/verify_schedule.bend: split_shift() is not the expected 9n")
    source.write_text(text.replace(served, f"def split_shift() -> Nat:\n  {shift}n\n"))
    (root / "kernels").mkdir()
    (root / "kernels" / "verify_schedule.h").write_text(schedule.render(root))
    return root / "kernels"


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
    for shift, lib in libs.items():
        floats = int(lib.elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1))
        workspace = torch.empty(floats, dtype=torch.float32, device="cuda")
        out = torch.empty((rows, ta.Q_HEADS, ta.HEAD_DIM), dtype=torch.half, device="cuda")

        def run(lib=lib, workspace=workspace, out=out) -> None:
            call(lib, q, pool, ctx_dev, max_ctx, masks, out, workspace)

        ms, mode = timed(lambda _, run=run: run(), reps=7, inner=20)
        record[f"ms_{1 << shift}"], record[f"timing_{1 << shift}"] = round(ms, 4), mode
        outs[shift] = out.float()
        record[f"workspace_mb_{1 << shift}"] = round(floats * 4 / 2**20, 1)
        record[f"maxdiff_{1 << shift}"] = (outs[shift] - outs[9]).abs().max().item()
    return record


def main(out_path: str, shifts: list[int]) -> int:
    dirs = {shift: [schedule_dir(shift)] if shift != 9 else [] for shift in {9, *shifts}}
    arch = nvcc.device_arch()

    def compile_one(include: list[Path]) -> Path:
        return nvcc.compile_shared(ta.SOURCE_MMA, arch=arch, defines=DEFINES, include_dirs=include)

    with ThreadPoolExecutor(len(dirs)) as workers:  # nvcc runs as a process: the builds go in parallel
        list(workers.map(compile_one, dirs.values()))
    libs = {shift: ta.load_mma(DEFINES, include_dirs=d) for shift, d in sorted(dirs.items(), reverse=True)}
    for shift, lib in libs.items():
        assert int(lib.elpis_tree_attention_split_size()) == 1 << shift
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
    report = {"gpu": props.name, "torch": torch.__version__, "shifts": sorted(libs), "records": records}
    Path(out_path).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], [int(s) for s in sys.argv[2:]]))
