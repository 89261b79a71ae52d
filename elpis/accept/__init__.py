"""The proven acceptors, as built by `make build` into build/accept/ and admitted once per process.

    chain(draft, target, stops, budget) -> ChainDecision(count, ends)
    tree(parents, draft, target, stops, budget) -> TreeDecision(rows, count, ends)
    tree_masks(parents) -> TreeMasks(depth, ancestors)

Every decision is made by the compiled C generated from the proved Bend implementation; this module only
packs arguments into a preallocated int64 cell buffer (one per thread: the C call runs with the GIL
released) and unpacks the result. Invalid input raises ValueError naming the problem (the glue's codes,
in its fixed checking order: size, parent, stop count, budget, id). The first call admits the build
(`elpis.accept.loader.admit`); if build/accept is missing it raises
RuntimeError("acceptor not built: run make build"), and any failed admission check raises
`loader.AdmissionError`, every time, with no fallback.
"""

from __future__ import annotations

import operator
import struct
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from elpis.accept import abi
from elpis.paths import ACCEPT_BUILD_DIR, REPO_ROOT

__all__ = ["ChainDecision", "TreeDecision", "TreeMasks", "admitted", "batch", "chain", "tree", "tree_masks"]


class ChainDecision(NamedTuple):
    count: int  # commit target[:count]
    ends: bool  # the last committed token ends the request (a stop id, or the budget is used up)


class TreeDecision(NamedTuple):
    rows: tuple[int, ...]  # committed rows, root first; commit [target[r] for r in rows]
    count: int
    ends: bool


class TreeMasks(NamedTuple):
    depth: tuple[int, ...]
    ancestors: tuple[int, ...]  # bit j of ancestors[r] is set iff j is r or an ancestor of r


_tuple_new = tuple.__new__  # builds the named tuples without a Python-level __new__ call

_admit_lock = threading.Lock()
_acceptor: Any = None
_failure: BaseException | None = None
_local = threading.local()


def admitted() -> Any:
    """The admitted acceptor (`loader.Acceptor`); admits build/accept on first use, once per process.
    The server calls this at start so a bad build refuses to start instead of failing a request."""
    global _acceptor, _failure
    if _acceptor is not None:
        return _acceptor
    with _admit_lock:
        if _acceptor is None:
            if _failure is not None:
                raise _failure
            if not ACCEPT_BUILD_DIR.is_dir():
                raise RuntimeError("acceptor not built: run make build")
            from elpis.accept import loader

            try:
                _acceptor = loader.admit(ACCEPT_BUILD_DIR, REPO_ROOT)
            except loader.AdmissionError as exc:
                _failure = exc
                raise
    return _acceptor


class _Buffers:
    """Per-thread preallocated cells and outputs, and the bound entry points."""

    def __init__(self, acceptor: Any) -> None:
        ffi, lib = acceptor.ffi, acceptor.lib
        self.chain_cells = ffi.new("int64_t[]", abi.CHAIN_CELLS)
        self.tree_cells = ffi.new("int64_t[]", abi.TREE_CELLS)
        self.masks_cells = ffi.new("int64_t[]", abi.MASKS_CELLS)
        self.chain_view = ffi.buffer(self.chain_cells)
        self.tree_view = ffi.buffer(self.tree_cells)
        self.masks_view = ffi.buffer(self.masks_cells)
        self.path = ffi.new("uint8_t[]", abi.MAX_ROWS)
        self.depth = ffi.new("uint8_t[]", abi.MAX_ROWS)
        self.ancestors = ffi.new("uint16_t[]", abi.MAX_ROWS)
        self.chain = lib.elpis_chain_checked
        self.tree = lib.elpis_tree_checked
        self.masks = lib.elpis_masks_checked
        self.unpack = ffi.unpack


def _buffers() -> _Buffers:
    buffers = _Buffers(admitted())
    _local.buffers = buffers
    return buffers


# Packing: one precompiled little-endian struct layout per (size, stop count). Unused slots are pad bytes,
# so they keep whatever an earlier call left there: the glue neither validates nor reads them.
def _layout(*fields: tuple[int, int]) -> struct.Struct:
    """fields: (cell offset, number of cells) in increasing offset order."""
    fmt, at = "<", 0
    for offset, count in fields:
        fmt += f"{(offset - at) * 8}x" if offset > at else ""
        fmt += f"{count}q" if count else ""
        at = offset + count
    return struct.Struct(fmt)


assert (
    (abi.CHAIN_K, abi.CHAIN_BUDGET, abi.CHAIN_NSTOPS)
    == (0, 1, 2)
    == (abi.TREE_ROWS, abi.TREE_BUDGET, abi.TREE_NSTOPS)
)
_S = abi.MAX_STOPS + 1
_CHAIN_LAYOUTS = [
    _layout((0, 3), (abi.CHAIN_STOPS, ns), (abi.CHAIN_DRAFT, k), (abi.CHAIN_TARGET, k + 1))
    for k in range(abi.MAX_DRAFT + 1)
    for ns in range(_S)
]
_TREE_LAYOUTS = [None] * _S + [  # rows = 0 never gets here
    _layout(
        (0, 3),
        (abi.TREE_STOPS, ns),
        (abi.TREE_PARENTS, rows),
        (abi.TREE_DRAFT, rows),
        (abi.TREE_TARGET, rows),
    )
    for rows in range(1, abi.MAX_ROWS + 1)
    for ns in range(_S)
]
_MASKS_LAYOUTS = [None] + [_layout((abi.MASKS_ROWS, 1), (abi.MASKS_PARENTS, rows)) for rows in range(1, 17)]
_PACK_ERRORS = (struct.error, TypeError, OverflowError)


def chain(draft: Sequence[int], target: Sequence[int], stops: Sequence[int], budget: int) -> ChainDecision:
    """Decide one chain round: k = len(draft) drafts, k + 1 targets, <= 4 stop ids, budget >= 1."""
    try:
        b = _local.buffers
    except AttributeError:
        b = _buffers()
    k, ns = len(draft), len(stops)
    if k > 15 or len(target) != k + 1:
        raise ValueError(_shape_reason("chain", draft=draft, target=target, stops=stops))
    try:
        if ns <= 4:
            _CHAIN_LAYOUTS[k * 5 + ns].pack_into(b.chain_view, 0, k, budget, ns, *stops, *draft, *target)
        else:  # the glue reports the stop count in its own checking order, before reading any stop slot
            _CHAIN_LAYOUTS[k * 5].pack_into(b.chain_view, 0, k, budget, ns, *draft, *target)
    except _PACK_ERRORS:
        raise ValueError(_value_reason(budget, stops=stops, draft=draft, target=target)) from None
    code = b.chain(b.chain_cells)
    if code < 2:
        _raise_for(code, budget, stops=stops, draft=draft, target=target)
    return _tuple_new(ChainDecision, (code >> 1, code & 1 == 1))


def tree(
    parents: Sequence[int], draft: Sequence[int], target: Sequence[int], stops: Sequence[int], budget: int
) -> TreeDecision:
    """Decide one tree round over R = len(parents) rows (1..16); draft[0] is ignored (pass the anchor)."""
    try:
        b = _local.buffers
    except AttributeError:
        b = _buffers()
    rows, ns = len(parents), len(stops)
    if not 0 < rows <= 16 or len(draft) != rows or len(target) != rows:
        raise ValueError(_shape_reason("tree", parents=parents, draft=draft, target=target, stops=stops))
    try:
        if ns <= 4:
            _TREE_LAYOUTS[rows * 5 + ns].pack_into(
                b.tree_view, 0, rows, budget, ns, *stops, *parents, *draft, *target
            )
        else:  # the glue checks the parents first, then reports the stop count
            _TREE_LAYOUTS[rows * 5].pack_into(b.tree_view, 0, rows, budget, ns, *parents, *draft, *target)
    except _PACK_ERRORS:
        raise ValueError(
            _value_reason(budget, parents=parents, stops=stops, draft=draft, target=target)
        ) from None
    path = b.path
    code = b.tree(b.tree_cells, path)
    if code < 2:
        _raise_for(code, budget, parents=parents, stops=stops, draft=draft, target=target)
    count = code >> 1
    return _tuple_new(TreeDecision, (tuple(b.unpack(path, count)), count, code & 1 == 1))


def tree_masks(parents: Sequence[int]) -> TreeMasks:
    """Per row: its depth and the bitmask of itself and its ancestors."""
    try:
        b = _local.buffers
    except AttributeError:
        b = _buffers()
    rows = len(parents)
    if not 0 < rows <= 16:
        raise ValueError(_shape_reason("masks", parents=parents))
    try:
        _MASKS_LAYOUTS[rows].pack_into(b.masks_view, 0, rows, *parents)
    except _PACK_ERRORS:
        raise ValueError(_value_reason(_NO_BUDGET, parents=parents)) from None
    code = b.masks(b.masks_cells, b.depth, b.ancestors)
    if code != 0:
        _raise_for(code, _NO_BUDGET, parents=parents)
    return _tuple_new(TreeMasks, (tuple(b.unpack(b.depth, rows)), tuple(b.unpack(b.ancestors, rows))))


def batch(kind: str, cells: np.ndarray) -> dict[str, np.ndarray]:
    """Run many decisions through the batch entry: `cells` is (n, CELLS) int64 in the glue's layout
    (elpis.accept.abi). Returns codes (and tree paths / mask rows); negative codes are not raised."""
    from elpis.accept import tablefile

    acceptor = admitted()
    return tablefile.library_outputs(acceptor.ffi, acceptor.lib, kind, cells)


# --- error reporting (slow path only) ---------------------------------------------------------------


_NO_BUDGET = object()  # tree_masks has no budget


def _shape_reason(kind: str, **args: Sequence[int]) -> str:
    lengths = ", ".join(f"len({name})={len(value)}" for name, value in args.items())
    return f"{abi.ERROR_REASONS[abi.ERR_SIZE]}: {abi.SIZE_RULES[kind]} (got {lengths})"


def _not_integer(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return True
    return False


def _value_reason(budget: Any, **seqs: Sequence[Any]) -> str:
    """A value could not even be packed (not an integer, or beyond int64): name it, in checking order."""
    for i, p in enumerate(seqs.get("parents", ())):
        if _not_integer(p) or not -(2**63) <= operator.index(p) < 2**63:
            return f"{abi.ERROR_REASONS[abi.ERR_PARENT]} (got parents[{i}] = {p!r})"
    if budget is not _NO_BUDGET and (
        _not_integer(budget) or not 0 < operator.index(budget) <= abi.BUDGET_MAX
    ):
        return f"{abi.ERROR_REASONS[abi.ERR_BUDGET]} (got {budget!r})"
    return _id_reason(seqs) or "bad input: every value must be an integer"


def _id_reason(seqs: dict[str, Sequence[Any]]) -> str | None:
    for name in ("stops", "draft", "target"):
        for i, v in enumerate(seqs.get(name, ())):
            if _not_integer(v) or not 0 <= operator.index(v) <= abi.ID_MAX:
                return f"{abi.ERROR_REASONS[abi.ERR_ID]} (got {name}[{i}] = {v!r})"
    return None


def _raise_for(code: int, budget: Any, **seqs: Sequence[Any]) -> None:
    if code == abi.ERR_INTERNAL:
        raise RuntimeError(f"acceptor library fault: {abi.ERROR_REASONS[code]}")
    reason = abi.ERROR_REASONS.get(code)
    if reason is None:
        raise RuntimeError(f"acceptor library returned unknown code {code}")
    detail = ""
    if code == abi.ERR_BUDGET:
        detail = f" (got {budget!r})"
    elif code == abi.ERR_ID:
        found = _id_reason(seqs)
        detail = found[len(reason) :] if found else ""
    elif code == abi.ERR_STOPS:
        detail = f" (got {len(seqs['stops'])} stops)"
    elif code == abi.ERR_PARENT:
        detail = f" (got parents = {list(seqs['parents'])!r})"
    raise ValueError(reason + detail)
