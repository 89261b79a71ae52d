"""The decision of a greedy tree round on the GPU (`patches/kernels/round_tail.cu`; issue 9, item 2).

Staged, not yet served (the plan: elpis/spec/README.md, "The round on the GPU"). After the verify, the
kernel puts the row checks and greedy targets through the proven acceptor as device code, writes the commit's
inputs for the committed path (`tree_verify.commit_moves`' K/V slot moves and `gdn_tree.packed_commit_plan`'s
plan, into the commit graph's buffers) and advances the request's state block (`round_plan.state_block`: kvp,
the remaining budget, the anchor, done) for the next round, whose tree `round_plan` builds from it. A round
that fails its checks gets the no-op inputs and leaves the state alone, so the next round verifies the same
position again. `read_record` turns the kernel's record into a `RoundTail`.

The GPU test (tests/kernels/test_round_tail.py) checks the record against `elpis.accept.tree` and the written
inputs against `commit_moves` and `packed_commit_plan` on the device; that a commit with the no-op inputs
(zero plan) leaves the Gated DeltaNet state and conv window unchanged is
tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from elpis import nvcc
from elpis.accept import abi
from elpis.exl3.tensors import check_one_device, check_tensor
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "round_tail.cu"
MAX_ROWS = abi.MAX_ROWS
# The record's layout, as the kernel writes it (kRec*): status, count, ends, end row, kvp, path[16],
# tokens[16], the request's epoch and the round's number
REC_STATUS, REC_COUNT, REC_ENDS, REC_END, REC_KVP, REC_PATH = 0, 1, 2, 3, 4, 5
REC_TOKENS = REC_PATH + MAX_ROWS
REC_EPOCH = REC_TOKENS + MAX_ROWS
REC_ROUND = REC_EPOCH + 1
RECORD_WORDS = REC_ROUND + 1
STATUS_FLAGGED_ROW, STATUS_NON_FINITE, STATUS_SLOT_OUTSIDE_PAGES = 1, 2, 3
# A drawn target the draw left to the host (the draw kernels' answer, kUndecided): off the committed path the
# round commits as if it were any id (the acceptor never reads it); on the path the round is refused
# (STATUS_NON_FINITE)
UNDECIDED = -5

_I32, _U32, _VP = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_round_tail": (_VP, _VP, _VP, _U32, _VP, _VP, _U32, _VP, _VP, _VP, _VP, _VP, _U32, _VP, _VP),
    "elpis_round_tail_record_words": (),
}


class RoundTail(NamedTuple):
    """What the kernel decided for the round verified at `kvp`. status 0: `count` rows committed along `path`
    (their target `tokens`), the request ends when `ends`; 1: a row failed its checks; 2: a greedy maximum was
    not finite; 3: a K/V slot outside the sequence's pages; < 0: the acceptor refused the cells
    (elpis.accept.abi.ERR_*; round_plan's refused and idle rounds give ERR_SIZE). Nothing is committed and
    the state is left alone unless the status is 0. `epoch` and `round` say which round of which request it
    is (the state block's, at the round)."""

    status: int
    count: int
    ends: bool
    end: int
    kvp: int
    path: tuple[int, ...]
    tokens: tuple[int, ...]
    epoch: int
    round: int


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


def read_record(words: list[int]) -> RoundTail:
    if len(words) != RECORD_WORDS:
        raise ValueError(f"a round tail record has {RECORD_WORDS} words, got {len(words)}")
    count = words[REC_COUNT]
    path = tuple(words[REC_PATH : REC_PATH + count])
    tokens = tuple(words[REC_TOKENS : REC_TOKENS + count])
    return RoundTail(
        words[REC_STATUS], count, bool(words[REC_ENDS]), words[REC_END], words[REC_KVP], path, tokens,
        words[REC_EPOCH], words[REC_ROUND],
    )  # fmt: skip


def decide(
    cells: torch.Tensor,
    ids: torch.Tensor,
    bad: torch.Tensor,
    state: torch.Tensor,
    pages: torch.Tensor,
    page_count: torch.Tensor,
    record: torch.Tensor,
    moves_out: torch.Tensor,
    plan_out: torch.Tensor,
    cond_index: torch.Tensor,
    cond_kvp: torch.Tensor,
    *,
    library: ctypes.CDLL | None = None,
) -> None:
    """Launch the kernel (the served build, or `library`: another build of SOURCE bound by `bind`) on the
    current stream: cells int64 [TREE_CELLS], ids int64 [run], bad int32 [run],
    state int64 [round_plan.STATE_WORDS] (advanced on a commit), pages int32 [width] (the verify key's block
    table row: the sequence's pages, then padding), page_count int32 [1] (how many of `pages` are the
    sequence's, read on the device: a captured round serves every count; outside 1..width the round commits
    nothing, status 3), record int32
    [RECORD_WORDS], moves_out int64 [4, run - 1], plan_out uint8 [PLAN_CAPACITY], cond_index int64 [run..16]
    and cond_kvp int32 [1] (the draft's conditioning: the path padded with its last row, and the kvp it was
    verified at); every one on one device."""
    import torch

    from elpis.exl3 import gdn_tree, round_plan

    check_tensor("cells", cells, torch.int64, (abi.TREE_CELLS,))
    check_tensor("ids", ids, torch.int64, (None,))
    run = ids.shape[0]
    if not 1 <= run <= MAX_ROWS:
        raise ValueError(f"round tail: a verify of 1..{MAX_ROWS} rows, got {run}")
    check_tensor("bad", bad, torch.int32, (run,))
    check_tensor("state", state, torch.int64, (round_plan.STATE_WORDS,))
    check_tensor("pages", pages, torch.int32, (None,))
    check_tensor("page_count", page_count, torch.int32, (1,))
    check_tensor("record", record, torch.int32, (RECORD_WORDS,))
    check_tensor("moves_out", moves_out, torch.int64, (4, run - 1))
    check_tensor("plan_out", plan_out, torch.uint8, (gdn_tree.PLAN_CAPACITY,))
    check_tensor("cond_index", cond_index, torch.int64, (None,))
    if not run <= cond_index.shape[0] <= MAX_ROWS:
        raise ValueError(f"round tail: cond_index holds {cond_index.shape[0]} rows, a path up to {run}")
    check_tensor("cond_kvp", cond_kvp, torch.int32, (1,))
    operands = (cells, ids, bad, state, pages, page_count, record, moves_out, plan_out, cond_index, cond_kvp)
    check_one_device("round tail", operands)
    err = (_library() if library is None else library).elpis_round_tail(
        cells.data_ptr(), ids.data_ptr(), bad.data_ptr(), run, state.data_ptr(), pages.data_ptr(),
        pages.shape[0], page_count.data_ptr(), record.data_ptr(), moves_out.data_ptr(), plan_out.data_ptr(),
        cond_index.data_ptr(), cond_index.shape[0], cond_kvp.data_ptr(),
        torch.cuda.current_stream(ids.device).cuda_stream,
    )  # fmt: skip
    if err:
        raise RuntimeError(f"round tail kernel: {'arguments refused' if err < 0 else f'CUDA error {err}'}")
