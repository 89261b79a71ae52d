"""Independent test oracle for the acceptors: numpy, vectorised over many decisions at once.

This is the only place in the repository allowed to restate the acceptance rule, and only to check the
compiled library (the table check at build time and tests). It is written deliberately unlike the Bend
sources: no recursion and no per-position branching, but whole boolean matrices ("where would the scan
halt?") reduced with argmax. It reads the same packed int64 cells as the glue, ignores every unused slot
and only accepts inputs inside the domain (the glue's validation is not its business).

Outputs use the glue's encodings: code = count << 1 | ends; tree paths packed four bits per committed
row; masks as per-row depth and ancestor bitmask, zero past the last row.
"""

from __future__ import annotations

import numpy as np

from elpis.accept import abi

_POS = np.arange(abi.MAX_ROWS)
_SLOTS = np.arange(abi.MAX_STOPS)


def _columns(cells: np.ndarray, start: int, width: int) -> np.ndarray:
    return cells[:, start : start + width]


def _stop_hits(values: np.ndarray, stops: np.ndarray, nstops: np.ndarray) -> np.ndarray:
    """hits[n, i]: values[n, i] equals one of the first nstops[n] stop ids of decision n."""
    used = _SLOTS[None, :] < nstops[:, None]
    return ((values[:, :, None] == stops[:, None, :]) & used[:, None, :]).any(axis=2)


def chain(cells: np.ndarray) -> np.ndarray:
    """Codes (int8) for chain decisions given as (n, CHAIN_CELLS) int64 cells."""
    cells = np.asarray(cells, dtype=np.int64)
    n = len(cells)
    k = cells[:, abi.CHAIN_K]
    budget = cells[:, abi.CHAIN_BUDGET]
    nstops = cells[:, abi.CHAIN_NSTOPS]
    _check_domain(k, 0, abi.MAX_DRAFT, budget, nstops)
    target = _columns(cells, abi.CHAIN_TARGET, abi.MAX_ROWS)
    draft = np.zeros_like(target)
    draft[:, : abi.MAX_DRAFT] = _columns(cells, abi.CHAIN_DRAFT, abi.MAX_DRAFT)
    stops = _columns(cells, abi.CHAIN_STOPS, abi.MAX_STOPS)
    return _first_halt(k, target, draft, stops, nstops, budget, n)


def _first_halt(k, target, draft, stops, nstops, budget, n) -> np.ndarray:
    pos = _POS[None, :]
    live = pos <= k[:, None]
    stop_here = _stop_hits(target, stops, nstops) & live
    out_of_budget = (pos + 1) >= budget[:, None]
    last_row = pos == k[:, None]
    rejected = (draft != target) & (pos < k[:, None])
    halts = live & (stop_here | out_of_budget | last_row | rejected)
    where = halts.argmax(axis=1)  # every decision halts at k at the latest
    count = where + 1
    ends = stop_here[np.arange(n), where] | (count >= budget)
    return (count << 1 | ends).astype(np.int8)


def tree(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8, packed paths uint64) for tree decisions given as (n, TREE_CELLS) int64 cells."""
    cells = np.asarray(cells, dtype=np.int64)
    n = len(cells)
    rows = cells[:, abi.TREE_ROWS]
    budget = cells[:, abi.TREE_BUDGET]
    nstops = cells[:, abi.TREE_NSTOPS]
    _check_domain(rows, 1, abi.MAX_ROWS, budget, nstops)
    parents = _columns(cells, abi.TREE_PARENTS, abi.MAX_ROWS)
    draft = _columns(cells, abi.TREE_DRAFT, abi.MAX_ROWS)
    target = _columns(cells, abi.TREE_TARGET, abi.MAX_ROWS)
    stops = _columns(cells, abi.TREE_STOPS, abi.MAX_STOPS)
    _check_parents(parents, rows)

    everyone = np.arange(n)
    in_tree = (_POS[None, :] < rows[:, None]) & (_POS[None, :] > 0)
    path = np.zeros((n, abi.MAX_ROWS), dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)  # edges walked
    here = np.zeros(n, dtype=np.int64)
    walking = np.ones(n, dtype=bool)
    for step in range(1, abi.MAX_ROWS):
        wanted = target[everyone, here]
        matches = in_tree & (parents == here[:, None]) & (draft == wanted[:, None])
        moves = walking & matches.any(axis=1)
        child = matches.argmax(axis=1)  # lowest-numbered matching child
        path[moves, step] = child[moves]
        length += moves
        here = np.where(moves, child, here)
        walking = moves

    # Along the path every draft matched, so only stops, budget and the path's end can halt the scan.
    path_target = np.take_along_axis(target, path, axis=1)
    path_draft = np.zeros_like(path_target)
    path_draft[:, :-1] = np.take_along_axis(draft, path[:, 1:], axis=1)
    codes = _first_halt(length, path_target, path_draft, stops, nstops, budget, n)
    count = codes.astype(np.int64) >> 1
    kept = _POS[None, :] < count[:, None]
    packed = (np.where(kept, path, 0).astype(np.uint64) << (4 * _POS).astype(np.uint64)[None, :]).sum(
        axis=1, dtype=np.uint64
    )
    return codes, packed


def masks(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth uint8 (n, 16), ancestors uint16 (n, 16)) for (n, MASKS_CELLS) int64 cells."""
    cells = np.asarray(cells, dtype=np.int64)
    n = len(cells)
    rows = cells[:, abi.MASKS_ROWS]
    if rows.size and (rows.min() < 1 or rows.max() > abi.MAX_ROWS):
        raise ValueError("oracle: rows outside 1..16")
    parents = _columns(cells, abi.MASKS_PARENTS, abi.MAX_ROWS)
    _check_parents(parents, rows)
    # Ancestor sets as a boolean matrix: row r sees itself plus everything its parent sees.
    sees = np.zeros((n, abi.MAX_ROWS, abi.MAX_ROWS), dtype=bool)
    sees[:, 0, 0] = True
    everyone = np.arange(n)
    for r in range(1, abi.MAX_ROWS):
        present = r < rows
        parent = np.where(present, parents[:, r], 0)
        sees[:, r, :] = sees[everyone, parent, :] & present[:, None]
        sees[:, r, r] = present
    depth = sees.sum(axis=2) - 1
    depth[depth < 0] = 0
    ancestors = (sees.astype(np.uint32) << _POS.astype(np.uint32)[None, None, :]).sum(axis=2)
    return depth.astype(np.uint8), ancestors.astype(np.uint16)


def _check_domain(size, low, high, budget, nstops) -> None:
    if size.size == 0:
        return
    if size.min() < low or size.max() > high:
        raise ValueError("oracle: size outside the domain")
    if budget.min() < 1 or budget.max() > abi.BUDGET_MAX:
        raise ValueError("oracle: budget outside the domain")
    if nstops.min() < 0 or nstops.max() > abi.MAX_STOPS:
        raise ValueError("oracle: stop count outside the domain")


def _check_parents(parents: np.ndarray, rows: np.ndarray) -> None:
    used = (_POS[None, :] < rows[:, None]) & (_POS[None, :] > 0)
    legal = (parents >= 0) & (parents < _POS[None, :])
    if (parents[:, 0] != -1).any() or (used & ~legal).any():
        raise ValueError("oracle: illegal parent array")
