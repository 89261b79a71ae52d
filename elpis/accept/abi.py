"""The glue's ABI as Python sees it: domain limits, packed-cell layouts and error codes.

`ext/elpis_glue.h` is the source of truth; admission compares every constant here with the value the
loaded library reports, so the two can never drift silently.
"""

from __future__ import annotations

GLUE_ABI = 1

MAX_DRAFT = 15  # chain: 0 <= k <= 15 draft tokens, k + 1 target tokens
MAX_ROWS = 16  # tree: 1 <= rows <= 16
MAX_STOPS = 4
BUDGET_MAX = 2**48 - 1  # the proved budget domain is 1..BUDGET_MAX
ID_MAX = 2**32 - 1  # token ids are 0..ID_MAX

# Chain cells: k, budget, stop count, stops[4], draft[15], target[16].
CHAIN_K, CHAIN_BUDGET, CHAIN_NSTOPS, CHAIN_STOPS, CHAIN_DRAFT, CHAIN_TARGET = 0, 1, 2, 3, 7, 22
CHAIN_CELLS = 38
# Tree cells: rows, budget, stop count, stops[4], parents[16], draft[16], target[16].
TREE_ROWS, TREE_BUDGET, TREE_NSTOPS, TREE_STOPS, TREE_PARENTS, TREE_DRAFT, TREE_TARGET = 0, 1, 2, 3, 7, 23, 39
TREE_CELLS = 55
# Mask cells: rows, parents[16].
MASKS_ROWS, MASKS_PARENTS = 0, 1
MASKS_CELLS = 17

ERR_SIZE, ERR_PARENT, ERR_STOPS, ERR_BUDGET, ERR_ID, ERR_INTERNAL = -1, -2, -3, -4, -5, -6

# Reasons, in the glue's fixed checking order (the first failing check is the one reported).
ERROR_REASONS: dict[int, str] = {
    ERR_SIZE: "bad size",
    ERR_PARENT: "bad parent: parents[0] must be -1 and 0 <= parents[r] < r for every later row",
    ERR_STOPS: "bad stop count: at most 4 stop ids",
    ERR_BUDGET: f"bad budget: must be an integer in 1..{BUDGET_MAX}",
    ERR_ID: f"bad id: every draft, target and stop id must be an integer in 0..{ID_MAX}",
    ERR_INTERNAL: "internal: the compiled acceptor returned an out-of-range or unstable result",
}

# What "bad size" means for each entry point.
SIZE_RULES: dict[str, str] = {
    "chain": "chain needs 0 <= len(draft) <= 15 and len(target) == len(draft) + 1",
    "tree": "tree needs 1 <= len(parents) <= 16 and len(draft) == len(target) == len(parents)",
    "masks": "tree_masks needs 1 <= len(parents) <= 16",
}

# Every constant the library must report with exactly these values (name in the glue header -> value).
LIBRARY_CONSTANTS: dict[str, int] = {
    "ELPIS_GLUE_ABI": GLUE_ABI,
    "ELPIS_MAX_DRAFT": MAX_DRAFT,
    "ELPIS_MAX_ROWS": MAX_ROWS,
    "ELPIS_MAX_STOPS": MAX_STOPS,
    "ELPIS_BUDGET_MAX": BUDGET_MAX,
    "ELPIS_ERR_SIZE": ERR_SIZE,
    "ELPIS_ERR_PARENT": ERR_PARENT,
    "ELPIS_ERR_STOPS": ERR_STOPS,
    "ELPIS_ERR_BUDGET": ERR_BUDGET,
    "ELPIS_ERR_ID": ERR_ID,
    "ELPIS_ERR_INTERNAL": ERR_INTERNAL,
    "ELPIS_CHAIN_K": CHAIN_K,
    "ELPIS_CHAIN_BUDGET": CHAIN_BUDGET,
    "ELPIS_CHAIN_NSTOPS": CHAIN_NSTOPS,
    "ELPIS_CHAIN_STOPS": CHAIN_STOPS,
    "ELPIS_CHAIN_DRAFT": CHAIN_DRAFT,
    "ELPIS_CHAIN_TARGET": CHAIN_TARGET,
    "ELPIS_CHAIN_CELLS": CHAIN_CELLS,
    "ELPIS_TREE_ROWS": TREE_ROWS,
    "ELPIS_TREE_BUDGET": TREE_BUDGET,
    "ELPIS_TREE_NSTOPS": TREE_NSTOPS,
    "ELPIS_TREE_STOPS": TREE_STOPS,
    "ELPIS_TREE_PARENTS": TREE_PARENTS,
    "ELPIS_TREE_DRAFT": TREE_DRAFT,
    "ELPIS_TREE_TARGET": TREE_TARGET,
    "ELPIS_TREE_CELLS": TREE_CELLS,
    "ELPIS_MASKS_ROWS": MASKS_ROWS,
    "ELPIS_MASKS_PARENTS": MASKS_PARENTS,
    "ELPIS_MASKS_CELLS": MASKS_CELLS,
}
