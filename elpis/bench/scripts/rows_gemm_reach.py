"""Which of a verify's EXL3 linears reach elpis's GEMM under the patch exl3-rows-gemm (diagnostic, GPU).

Loads the small synthetic model with rows_gemm=True in tree mode with eager tree verifies, lists the modules
that still hold an ExLlamaV3 C++ block graph (`bc`, whose GEMMs no Python wrapper reaches), and counts the
linears the kernel serves in one eager chain verify and one eager tree verify, and the kernel calls that
served them (a group of projections sharing an input is one call), against the number of marked linears.
Usage (repo root, after `make build`, ELPIS_PATCH_ROWS_GEMM=1): python3 rows_gemm_reach.py SMALL_DIR
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from elpis.exl3 import load_backend, rows_gemm_patch, walk_modules


def main(small: str) -> None:
    backend = load_backend(
        Path(small) / "target", Path(small) / "draft", max_context=8192, model_id="small", host_cache_gib=0.0,
        tree=True, tree_graphs=False, rows_gemm=True,
    )  # fmt: skip
    model = backend.engine.model
    marked = sum(
        1 for m in walk_modules(model) if getattr(getattr(m, "inner", None), rows_gemm_patch.MARK, False)
    )
    with_bc = collections.Counter(
        type(m).__name__ for m in walk_modules(model) if getattr(m, "bc", None) is not None
    )
    ids = list(range(100, 700))
    groups = rows_gemm_patch.groups(model)
    report = {
        "marked_linears": marked,
        "groups": len(groups),
        "grouped_linears": sum(len(g.members) for g in groups),
        "modules_with_bc": dict(with_bc),
    }
    for label, tree in (("chain", False), ("tree", True)):
        loaded = backend.tree, backend.fixed_rows
        backend.tree, backend.fixed_rows = tree, (16 if tree else 8)
        try:
            backend.begin(ids)
            before = dict(rows_gemm_patch.calls)
            backend.verify([ids[-1], 5, 6, 7], [-1, 0, 1, 2])
            served = rows_gemm_patch.calls["rows_gemm"] - before["rows_gemm"]
            group_calls = rows_gemm_patch.calls["groups"] - before["groups"]
            report[f"{label}_verify_linears_served"] = served
            report[f"{label}_verify_group_calls"] = group_calls
            backend.finish()
        finally:
            backend.tree, backend.fixed_rows = loaded
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
