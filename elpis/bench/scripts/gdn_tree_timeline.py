"""Where a Gated DeltaNet tree kernel launch spends its time, phase by phase (diagnostic, GPU).

The ELPIS_GDN_CLOCKS build of `patches/kernels/gdn_tree.cu` (or of another source given as the second
argument) records, for thread 0 of every block, %globaltimer at the marks of the kernel body: start, state
and inputs staged, q/k convolved, after the first barrier, v convolved and L2 norms done, after the second
barrier, the walk done, end (between two barriers the times are warp 0's). For verifies of 16, 8 and 1 rows
and commits of 1 and 4 rows (random inputs of the real geometry, each call launched three times, the last one
read), this prints and writes the median and maximum of each phase over the blocks, the spread of block
starts and the launch span.
Usage (repo root, after `make build`):
  python3 elpis/bench/scripts/gdn_tree_timeline.py OUT.json [SOURCE.cu]
"""

from __future__ import annotations

import ctypes
import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch

from elpis import nvcc
from elpis.exl3 import gdn_tree as gt
from elpis.exl3 import gdn_tree_ref as ref

BLOCKS, WORDS = 8 * 48, 9
PHASES = ("staged", "convolved", "barrier1", "normed", "barrier2", "walked", "written")
BUSHY16 = [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10]
CHAIN16 = list(range(-1, 15))
BUSHY8 = [-1, 0, 0, 1, 1, 2, 3, 4]


def masks(parents: list[int]) -> tuple[list[int], list[int]]:
    """Depth and ancestor bitmask (itself included) of each row; computed here so that the script runs before
    the acceptor library is built on a fresh machine."""
    depth: list[int] = []
    ancestors: list[int] = []
    for r, p in enumerate(parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        ancestors.append((1 << r) | (0 if p < 0 else ancestors[p]))
    return depth, ancestors


def summarise(c: np.ndarray) -> dict:
    start, end = c[:, 0], c[:, 7]
    t0 = int(start.min())
    out: dict = {
        "span_us": (int(end.max()) - t0) / 1e3,
        "start_spread_us": (int(start.max()) - t0) / 1e3,
        "block_median_us": float(np.median(end - start)) / 1e3,
        "sms": len(np.unique(c[:, 8])),
    }
    for i, name in enumerate(PHASES):
        d = (c[:, i + 1] - c[:, i]) / 1e3
        out[name] = {"median_us": round(float(np.median(d)), 3), "max_us": round(float(d.max()), 3)}
    return out


def launch_clocks(lib, call) -> dict:
    clocks = np.zeros((BLOCKS, WORDS), dtype=np.uint64)
    for _ in range(3):
        torch.cuda.synchronize()
        call()
        torch.cuda.synchronize()
    if lib.elpis_gdn_tree_clocks(clocks.ctypes.data) != 0:
        raise RuntimeError("reading the clocks failed")
    return summarise(clocks.astype(np.int64))


def main(out_path: str, source: str | None = None) -> int:
    path = Path(source) if source else gt.SOURCE
    lib = gt.bind(nvcc.load(path, defines={"ELPIS_GDN_CLOCKS": 1}))
    lib.elpis_gdn_tree_clocks.argtypes = [ctypes.c_void_p]
    lib.elpis_gdn_tree_clocks.restype = ctypes.c_int
    gt._library = lambda: lib  # type: ignore[assignment]  # the module looks its library up at each call
    report: dict = {"gpu": torch.cuda.get_device_name(), "source": str(path), "calls": []}
    calls = []
    trees = (("verify bushy16", BUSHY16), ("verify chain16", CHAIN16), ("verify bushy8", BUSHY8))
    for name, parents in trees:
        inp = ref.random_inputs(len(parents), seed=len(parents)).to("cuda")
        depth, ancestors = masks(parents)
        calls.append((name, functools.partial(gt.gdn_tree_verify, *inp.tensors(), depth, ancestors)))
    one = ref.random_inputs(1, seed=1).to("cuda")
    calls.append(("verify 1", functools.partial(gt.gdn_tree_verify, *one.tensors(), [0], [1])))
    for n in (1, 4):
        inp = ref.random_inputs(16, seed=n).to("cuda")
        calls.append((f"commit {n}", functools.partial(gt.gdn_tree_commit, *inp.tensors(), list(range(n)))))
    for name, call in calls:
        entry = {"call": name, **launch_clocks(lib, call)}
        report["calls"].append(entry)
        print(json.dumps(entry), flush=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
