"""The Gated DeltaNet tree kernel against a previous build of its source, on the GPU (diagnostic).

A kernel change that keeps the arithmetic must keep every bit: for 1-16 rows and random trees (chains,
bushy trees, the 3-slot stack bound) both builds get the same random inputs of the real geometry
(`gdn_tree_ref.random_inputs`); their verify outputs (fp32 and bf16) and, for commits along a path, the
rewritten recurrent state and conv window are compared bit for bit. Then both are timed: device time per
call of 48 calls (one per GDN layer) captured in one CUDA graph, median over repetitions, verify at 1, 8
and 16 rows and commits of 1, 4 and 16 rows.
Prints one JSON line per check ("GDNAB ...") and exits non-zero on any difference.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/gdn_vs_previous.py PREVIOUS.cu
"""

from __future__ import annotations

import functools
import json
import random
import sys
from pathlib import Path

import torch

from elpis.bench.scripts.gdn_tree_timeline import masks
from elpis.exl3 import gdn_tree as gt
from elpis.exl3 import gdn_tree_ref as ref
from tests.kernels.test_gdn_tree import _path
from tests.kernels.timing import graph_us

LAYERS = 48  # calls per captured graph: one per GDN layer of the model


def _trees() -> list[list[int]]:
    rng = random.Random(7)
    out = [[-1], [-1, 0], list(range(-1, 7)), list(range(-1, 15))]
    out += [[-1] + [rng.randrange(r) for r in range(1, rows)] for rows in (5, 8, 12, 16, 16)]
    out.append([-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14])  # parks 3 states at once
    return out


def _with(lib) -> None:
    """Make gdn_tree call `lib` (the module looks its library up by name at each call)."""
    gt._library = lambda: lib  # type: ignore[assignment]


class WithoutLayout:
    """A build from before the qkv layout arguments (session 22), bound: its entries take token-major qkv
    only, so the two stride arguments the current binding passes are checked and dropped."""

    LAYOUT_ENTRIES = ("elpis_gdn_tree_verify", "elpis_gdn_tree_commit", "elpis_gdn_tree_verify_dev",
                      "elpis_gdn_tree_commit_dev")  # fmt: skip

    def __init__(self, lib) -> None:
        gt.bind(lib)
        for name in self.LAYOUT_ENTRIES:  # the current signatures without the two strides after qkv
            argtypes = gt.ENTRY_ARGS[name]
            getattr(lib, name).argtypes = [argtypes[0], *argtypes[3:]]
        self._lib = lib

    def __getattr__(self, name: str):
        entry = getattr(self._lib, name)
        if name not in self.LAYOUT_ENTRIES:
            return entry

        def call(qkv, row_stride, channel_stride, *rest):
            if (row_stride, channel_stride) != (gt.CONV_DIM, 1):
                raise ValueError("the previous build reads token-major qkv only")
            return entry(qkv, *rest)

        return call


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def main(previous: Path) -> int:
    from elpis import nvcc

    new_lib = gt._library()
    old_lib = nvcc.load(previous)
    old_lib = gt.bind(old_lib) if "qkv_row_stride" in previous.read_text() else WithoutLayout(old_lib)
    failures = 0
    for i, parents in enumerate(_trees()):
        rows = len(parents)
        inp = ref.random_inputs(rows, seed=100 + i).to("cuda")
        depth, ancestors = masks(parents)  # no acceptor library needed: the script runs before `elpis build`
        results = {}
        for label, lib in (("new", new_lib), ("old", old_lib)):
            _with(lib)
            out, out_bf16 = gt.gdn_tree_verify(*inp.tensors(), depth, ancestors, bf16_out=True)
            path = _path(parents, rows - 1)
            committed = inp.clone()
            gt.gdn_tree_commit(*committed.tensors(), path)
            results[label] = (out, out_bf16, committed.state, committed.conv_state)
        same = all(
            torch.equal(_bits(a), _bits(b)) for a, b in zip(results["new"], results["old"], strict=True)
        )
        failures += not same
        print("GDNAB " + json.dumps({"check": "bits", "rows": rows, "parents": parents, "identical": same}))
    timings: dict[str, dict[str, float]] = {}
    for label, lib in (("new", new_lib), ("old", old_lib)):
        _with(lib)
        t: dict[str, float] = {}
        for rows in (1, 8, 16):
            parents = [-1] + [random.Random(rows).randrange(r) for r in range(1, rows)]
            inp = ref.random_inputs(rows, seed=rows).to("cuda")
            depth, ancestors = masks(parents)
            verify = functools.partial(gt.gdn_tree_verify, *inp.tensors(), depth, ancestors)
            t[f"verify_rows{rows}_us"] = round(graph_us(verify, LAYERS, 21), 2)
        for n in (1, 4, 16):
            inp = ref.random_inputs(16, seed=n).to("cuda")
            path = list(range(n))
            commit = functools.partial(gt.gdn_tree_commit, *inp.tensors(), path)
            t[f"commit_path{n}_us"] = round(graph_us(commit, LAYERS, 21), 2)
        timings[label] = t
    unit = "us per call, 48 calls per graph"
    print(
        "GDNAB "
        + json.dumps({"check": "timing", "unit": unit, **timings, "device": torch.cuda.get_device_name()})
    )
    print("GDNAB " + json.dumps({"check": "summary", "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
