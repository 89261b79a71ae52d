"""Why the round's decision kernel refuses rounds on the GPU (call 144, session 36: every round of
tests/kernels/test_round_tail.py and tests/exl3/test_device_round.py got status -6, "internal", on the H200,
while the CPU emulation of the same source passes).

For the cases of test_round_tail.py's first test (same seeds), on the GPU: the shipped kernel's status; the
diagnostic build (round_tail_diag.cu: each internal refusal returns -1000 - its source line) at -O3, with
ptxas at -O0 and at -G; the CPU acceptor's decision; per build, each path's commit plan on its own
("CPDIAG" lines, call 145) and, for the first three cases, the tail's steps with their intermediates
("TSDIAG" lines). Prints one JSON line per case that differs anywhere (at most 6) and a summary line
"RTDIAG {...}". Call 144 also compared the generated acceptor's raw poisoned runs with the CPU's; they
agreed, and that arm is gone.
Usage (repo root, after `elpis build`): python3 elpis/bench/scripts/round_tail_diag.py
"""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from elpis import accept, nvcc
from elpis.exl3 import gdn_tree, round_plan, round_tail

HERE = Path(__file__).resolve().parent
RUN = 16


def build(name: str, opts: list[str]) -> ctypes.CDLL:
    arch = nvcc.device_arch()
    flags = [f for f in nvcc._flags(arch, [HERE], {}) if f not in ("-O3", "-lineinfo")]
    out = Path(f"/tmp/round_tail_diag-{name}.so")
    cmd = [str(nvcc.nvcc_path()), *flags, *opts, "-shared", str(HERE / "round_tail_diag.cu"), "-o", str(out)]
    subprocess.run(cmd, check=True)
    lib = round_tail.bind(ctypes.CDLL(str(out)))
    lib.elpis_diag_set_stack.argtypes = [ctypes.c_size_t]
    return lib


def decide(lib: ctypes.CDLL | None, cells: np.ndarray, ids: torch.Tensor, state0: np.ndarray) -> dict:
    """One round through test_round_tail.py's own launch (the shipped build when `lib` is None)."""
    from tests.kernels.test_round_tail import decide_round

    state = torch.from_numpy(state0.copy()).cuda()
    bad = torch.zeros(len(ids), dtype=torch.int32, device="cuda")
    got, *_ = decide_round(cells, ids, bad, state, library=lib)
    return {"status": got.status, "path": list(got.path), "count": got.count, "ends": got.ends}


def commit_plans(lib: ctypes.CDLL, name: str) -> None:
    """Each path's commit plan on the GPU three ways against the host's packed plan: a "CPDIAG" line each."""
    lib.elpis_commit_plan_diag.argtypes = [ctypes.c_void_p, ctypes.c_uint32, *[ctypes.c_void_p] * 4]
    for path in ([0], [0, 1], [0, 1, 3], [0, 2, 5, 6], list(range(16))):
        n = len(path)
        dev = torch.device("cuda")
        path_t = torch.tensor(path, dtype=torch.int32, device=dev)
        depth = torch.arange(n, dtype=torch.int32, device=dev)
        anc = torch.tensor([(1 << (i + 1)) - 1 for i in range(n)], dtype=torch.int64).to(torch.int32).to(dev)
        out = torch.full((51 + 64,), -99, dtype=torch.int32, device=dev)
        got = torch.zeros(gdn_tree.PLAN_CAPACITY, dtype=torch.uint8, device=dev)
        ptrs = (depth.data_ptr(), anc.data_ptr(), out.data_ptr(), got.data_ptr())
        err = lib.elpis_commit_plan_diag(path_t.data_ptr(), n, *ptrs)
        assert err == 0, err
        want = gdn_tree.packed_commit_plan(tuple(path))
        w = out.tolist()
        line = {"build": name, "path": path, "commit_plan": w[0], "tree_plan": w[1], "gdn_plan": w[2],
                "order": w[3 : 3 + n], "load": w[19 : 19 + n], "store": w[35 : 35 + n],
                "taps": w[51 : 51 + 4 * n],
                "bytes_equal": bytes(got.tolist()[: len(want)]) == want}  # fmt: skip
        print("CPDIAG " + json.dumps(line), flush=True)


def tail_steps(lib: ctypes.CDLL, name: str, cells: np.ndarray, ids: torch.Tensor) -> dict:
    """The tail's steps with their intermediates (elpis_tail_steps in round_tail_diag.cu)."""
    lib.elpis_tail_steps.argtypes = [ctypes.c_void_p] * 4
    out = torch.full((20,), -99, dtype=torch.int32, device="cuda")
    path_copy = torch.full((RUN,), -99, dtype=torch.int32, device="cuda")
    padded = torch.zeros(RUN, dtype=torch.int64, device="cuda")
    padded[: len(ids)] = ids
    cells_dev = torch.from_numpy(cells).cuda()
    err = lib.elpis_tail_steps(cells_dev.data_ptr(), padded.data_ptr(), out.data_ptr(), path_copy.data_ptr())
    assert err == 0, err
    w = out.tolist()
    return {"build": name, "code": w[0], "path": w[1:17], "shared_plan": w[17], "local_plan": w[18],
            "copied_plan": w[19]}  # fmt: skip


def main() -> None:
    # NVVM and ptxas optimising (as shipped), ptxas not optimising, and device debug (nothing optimised; last,
    # with a 32 KiB stack, as a crash there ends the run)
    libs = {"O3": build("O3", ["-O3"]), "ptxasO0": build("ptxasO0", ["-O3", "-Xptxas", "-O0"]),
            "G": build("G", ["-G"])}  # fmt: skip
    libs["G"].elpis_diag_set_stack(32768)
    for name, lib in libs.items():
        commit_plans(lib, name)
    from tests.kernels.test_round_tail import PARENTS as parents
    from tests.kernels.test_round_tail import real_logit_cases

    shown, statuses = 0, {}
    for case, (ids, draft, stops, budget) in enumerate(real_logit_cases()):
        target = ids.tolist()
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        state = round_plan.state_block(anchor=draft[0], kvp=300, remaining=budget, max_context=10_000,
                                       tree_budget=RUN, stops=stops)  # fmt: skip
        want = accept.tree(parents, draft, target, stops, budget)
        row = {"case": case, "want": {"path": list(want.rows), "count": want.count, "ends": want.ends},
               "shipped": decide(None, cells, ids, state)}  # fmt: skip
        for name, lib in libs.items():
            if case < 3:
                print("TSDIAG " + json.dumps(tail_steps(lib, name, cells, ids)), flush=True)
            row[name] = decide(lib, cells, ids, state)
        for key in ("shipped", *libs):
            statuses.setdefault(key, {}).setdefault(str(row[key]["status"]), 0)
            statuses[key][str(row[key]["status"])] += 1
        arms = ("shipped", *libs)
        wrong = any(row[k]["status"] != 0 or row[k]["path"] != row["want"]["path"] for k in arms)
        if wrong and shown < 6:
            print(json.dumps(row), flush=True)
            shown += 1
    print("RTDIAG " + json.dumps({"statuses": statuses, "ids_dtype": str(ids.dtype)}), flush=True)


if __name__ == "__main__":
    main()
