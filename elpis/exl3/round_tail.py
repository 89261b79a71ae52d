"""The decision of a greedy tree round on the GPU (`patches/kernels/round_tail.cu`; issue 9, item 2).

Staged, not yet served (the plan: elpis/spec/README.md, "The round on the GPU"). Two halves:

- `commit_candidates(parents, kvp, run, pages)`, on the host while the verify runs: for every row e of the
  tree, the commit's inputs when the committed path ends at e (the path from the root to e), exactly as
  `TreeGraphs.commit` builds them for that path (K/V slot moves padded with self-copies of the last slot,
  the Gated DeltaNet commit plan), plus a no-op candidate (self-copies only, a zero plan) at index 16.
  A committed path is always a root-to-row path, so these 17 cover every decision.
- `decide(...)`, on the GPU after the verify: the row checks and greedy targets go through the proven
  acceptor as device code, and the chosen candidate is copied into the commit graph's input buffers.
  `read_record` turns the kernel's record into a `RoundTail`.

Before it is served, the GPU must show: the record equals `elpis.accept.tree` on the same inputs, the copied
inputs equal `TreeGraphs.commit`'s, and a commit with the no-op candidate (zero plan) leaves the Gated
DeltaNet state and conv window unchanged. The first two pass on the H200 (tests/kernels/test_round_tail.py,
device call 59); the third has a GPU test (tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing),
not yet run.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from elpis import nvcc
from elpis.accept import abi
from elpis.exl3.tensors import check_tensor
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "round_tail.cu"
MAX_ROWS = abi.MAX_ROWS
NOOP = MAX_ROWS  # index of the no-op candidate
CANDIDATES = MAX_ROWS + 1
# The record's layout, as the kernel writes it (kRec*): status, count, ends, end row, path[16], tokens[16]
REC_STATUS, REC_COUNT, REC_ENDS, REC_END, REC_PATH = 0, 1, 2, 3, 4
REC_TOKENS = REC_PATH + MAX_ROWS
RECORD_WORDS = REC_TOKENS + MAX_ROWS
STATUS_FLAGGED_ROW, STATUS_NON_FINITE = 1, 2

_I32, _U32, _VP = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_round_tail": (_VP, _VP, _VP, _U32, _VP, _U32, _VP, _U32, _VP, _VP, _VP, _VP),
    "elpis_round_tail_record_words": (),
}


class RoundTail(NamedTuple):
    """What the kernel decided. status 0: `count` rows committed along `path` (their target `tokens`), the
    request ends when `ends`; 1: a row failed its checks; 2: a greedy maximum was not finite; < 0: the
    acceptor refused the cells (elpis.accept.abi.ERR_*). Nothing is committed unless the status is 0."""

    status: int
    count: int
    ends: bool
    end: int
    path: tuple[int, ...]
    tokens: tuple[int, ...]


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated) and check its record size."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    if lib.elpis_round_tail_record_words() != RECORD_WORDS:
        raise RuntimeError(
            f"round tail kernel: {lib.elpis_round_tail_record_words()} record words, expected {RECORD_WORDS}"
        )
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def tree_cells(parents: list[int], draft: list[int], stops: list[int], budget: int) -> np.ndarray:
    """The acceptor's tree cells (int64 [TREE_CELLS]) with everything known before the verify; the target
    cells stay 0 (the kernel fills them). Refuses what the acceptor would refuse for its shape."""
    rows = len(parents)
    if not 1 <= rows <= MAX_ROWS or len(draft) != rows:
        raise ValueError(f"a tree of 1..{MAX_ROWS} rows and a draft token per row, got {rows}, {len(draft)}")
    if len(stops) > abi.MAX_STOPS:
        raise ValueError(f"at most {abi.MAX_STOPS} stop ids, got {len(stops)}")
    cells = np.zeros(abi.TREE_CELLS, dtype=np.int64)
    cells[abi.TREE_ROWS], cells[abi.TREE_BUDGET], cells[abi.TREE_NSTOPS] = rows, budget, len(stops)
    cells[abi.TREE_STOPS : abi.TREE_STOPS + len(stops)] = stops
    cells[abi.TREE_PARENTS : abi.TREE_PARENTS + rows] = parents
    cells[abi.TREE_DRAFT : abi.TREE_DRAFT + rows] = draft
    return cells


def root_path(parents: list[int], end: int) -> list[int]:
    """The rows from the root to `end`, root first."""
    path = [end]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def commit_candidates(
    parents: list[int], kvp: int, run: int, pages: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Moves int64 [CANDIDATES, 4, run - 1] (source pages, source offsets, destination pages, destination
    offsets) and plans uint8 [CANDIDATES, PLAN_CAPACITY]: candidate e commits the path from the root to row e,
    as `TreeGraphs.commit` would; rows past the tree and NOOP commit nothing."""
    from elpis.exl3 import gdn_tree
    from elpis.exl3.tree_verify import check_parents, commit_moves

    rows = len(parents)
    check_parents(parents, rows)
    if not rows <= run <= MAX_ROWS:
        raise ValueError(f"a verify of {run} rows cannot hold a tree of {rows}")
    moves = np.zeros((CANDIDATES, 4, run - 1), dtype=np.int64)
    plans = np.zeros((CANDIDATES, gdn_tree.PLAN_CAPACITY), dtype=np.uint8)
    for e in range(CANDIDATES):
        path = root_path(parents, e) if e < rows else []
        moves[e] = np.array(commit_moves(kvp, path, run, pages), dtype=np.int64).reshape(4, -1)
        if path:
            plan = gdn_tree.packed_commit_plan(tuple(path))
            plans[e, : len(plan)] = np.frombuffer(plan, dtype=np.uint8)
    return moves, plans


def read_record(words: list[int]) -> RoundTail:
    if len(words) != RECORD_WORDS:
        raise ValueError(f"a round tail record has {RECORD_WORDS} words, got {len(words)}")
    count = words[REC_COUNT]
    path = tuple(words[REC_PATH : REC_PATH + count])
    tokens = tuple(words[REC_TOKENS : REC_TOKENS + count])
    return RoundTail(words[REC_STATUS], count, bool(words[REC_ENDS]), words[REC_END], path, tokens)


def decide(
    cells: torch.Tensor,
    ids: torch.Tensor,
    bad: torch.Tensor,
    moves: torch.Tensor,
    plans: torch.Tensor,
    record: torch.Tensor,
    moves_out: torch.Tensor,
    plan_out: torch.Tensor,
) -> None:
    """Launch the kernel on the current stream: cells int64 [TREE_CELLS], ids int64 [rows], bad int32
    [rows], moves int64 [CANDIDATES, 4, cols], plans uint8 [CANDIDATES, bytes] (from `commit_candidates`,
    on the device), record int32 [RECORD_WORDS], moves_out int64 [4, cols], plan_out uint8 [bytes]."""
    import torch

    check_tensor("cells", cells, torch.int64, (abi.TREE_CELLS,))
    check_tensor("ids", ids, torch.int64, (None,))
    rows = ids.shape[0]
    check_tensor("bad", bad, torch.int32, (rows,))
    check_tensor("moves", moves, torch.int64, (CANDIDATES, 4, None))
    cols = moves.shape[2]
    check_tensor("plans", plans, torch.uint8, (CANDIDATES, None))
    check_tensor("record", record, torch.int32, (RECORD_WORDS,))
    check_tensor("moves_out", moves_out, torch.int64, (4, cols))
    check_tensor("plan_out", plan_out, torch.uint8, (plans.shape[1],))
    devices = {t.device for t in (cells, ids, bad, moves, plans, record, moves_out, plan_out)}
    if len(devices) != 1:
        raise ValueError(f"round tail operands on several devices: {sorted(map(str, devices))}")
    err = _library().elpis_round_tail(
        cells.data_ptr(), ids.data_ptr(), bad.data_ptr(), rows, moves.data_ptr(), cols, plans.data_ptr(),
        plans.shape[1], record.data_ptr(), moves_out.data_ptr(), plan_out.data_ptr(),
        torch.cuda.current_stream(ids.device).cuda_stream,
    )  # fmt: skip
    if err:
        raise RuntimeError(f"round tail kernel: {'arguments refused' if err < 0 else f'CUDA error {err}'}")
