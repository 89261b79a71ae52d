"""The round's decision on the GPU (patches/kernels/round_tail.cu) on the CPU, through the CUDA emulation
of tests/kernels/cuda_emu.py: its record is `elpis.accept.tree`'s decision on the same tree, targets, stops
and budget; the commit inputs it writes are `tree_verify.commit_moves`' and `gdn_tree.packed_commit_plan`'s
for the path, or the no-op ones when a row failed its checks, a greedy maximum was not finite, a slot lies
outside the pages or the acceptor refused the cells; the request's state advances on a commit only. And the
two kernels of the round together (round_plan.cu, then the verify's greedy targets, then this one), round
after round from the state block alone, commit exactly plain greedy decoding's tokens.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from elpis import accept
from elpis.accept import abi
from elpis.exl3 import gdn_tree, round_plan, round_tail
from elpis.exl3.tree_verify import PAGE, commit_moves
from tests.kernels.round_plan_cases import Request, emulated_plan, random_round

RUN = 16
PAGES = [40, 41, 7, 43, 44]  # the sequence's cache pages (not in order: a slot's page is looked up)


@pytest.fixture
def lib(round_tail_emu: ctypes.CDLL) -> ctypes.CDLL:
    return round_tail_emu


@pytest.fixture
def plan_lib(round_plan_emu: ctypes.CDLL) -> ctypes.CDLL:
    return round_plan_emu


def _decide(
    lib, cells, ids, bad, state, *, run: int = RUN, pages: list[int] = PAGES, cond: list | None = None,
    page_count: int | None = None,
):
    """The record, the written moves and plan, and the state after the kernel (outputs poisoned first); the
    conditioning's index and kvp into `cond` when given. `pages` go into a block table row padded with page 0
    (as a verify key's), whose first `page_count` (default: all of `pages`) are the sequence's."""
    ids = np.ascontiguousarray(list(ids) + [0] * (run - len(ids)), dtype=np.int64)
    bad = np.ascontiguousarray(list(bad) + [0] * (run - len(bad)), dtype=np.int32)
    state = np.array(state, dtype=np.int64)
    pages_arr = np.array(list(pages) + [0] * 3, dtype=np.int32)
    count = np.array([len(pages) if page_count is None else page_count], dtype=np.int32)
    record = np.full(round_tail.RECORD_WORDS, -7, dtype=np.int32)
    moves_out = np.full((4, run - 1), -7, dtype=np.int64)
    plan_out = np.full(gdn_tree.PLAN_CAPACITY, 0xA5, dtype=np.uint8)
    cond_index = np.full(run, -7, dtype=np.int64)
    cond_kvp = np.full(1, -7, dtype=np.int32)
    err = lib.elpis_round_tail(
        cells.ctypes.data, ids.ctypes.data, bad.ctypes.data, run, state.ctypes.data, pages_arr.ctypes.data,
        len(pages_arr), count.ctypes.data, record.ctypes.data, moves_out.ctypes.data, plan_out.ctypes.data,
        cond_index.ctypes.data, run, cond_kvp.ctypes.data, None,
    )  # fmt: skip
    assert err == 0
    if cond is not None:
        cond[:] = [cond_index.tolist(), int(cond_kvp[0])]
    return round_tail.read_record(record.tolist()), moves_out, plan_out, state


def _state(kvp: int, remaining: int = 50, anchor: int = 5, stops: tuple[int, ...] = ()) -> np.ndarray:
    return Request(anchor, kvp, remaining, kvp + 1000, RUN, stops).state()


def _counted(state: np.ndarray) -> np.ndarray:
    """`state` after a round that commits nothing: only the round number moves."""
    after = state.copy()
    after[round_plan.STATE_ROUND] += 1
    return after


def _want_inputs(kvp: int, path: list[int], run: int = RUN) -> tuple[np.ndarray, np.ndarray]:
    moves = np.array(commit_moves(kvp, path, run, PAGES), dtype=np.int64).reshape(4, run - 1)
    plan = gdn_tree.packed_commit_plan(tuple(path)) if path else b""
    return moves, np.frombuffer(plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan)), dtype=np.uint8)


def test_the_record_is_the_acceptors_decision_and_the_paths_commit_inputs_are_written(lib) -> None:
    rng = random.Random(5)
    seen_lengths = set()
    for _ in range(200):
        parents, draft, target, stops, budget = random_round(rng)
        kvp = rng.choice((0, PAGE - 3, 2 * PAGE - 9, 3 * PAGE + 17))  # the verify's slots straddle pages
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        state = _state(kvp, budget, anchor=draft[0], stops=tuple(stops))
        cond: list = [None, None]
        got, moves_out, plan_out, after = _decide(lib, cells, target, [0] * len(parents), state, cond=cond)
        want = accept.tree(parents, draft, target, stops, budget)
        assert got.status == 0 and got.kvp == kvp
        assert (got.path, got.count, got.ends) == (tuple(want.rows), want.count, want.ends)
        assert got.tokens == tuple(target[r] for r in want.rows) and got.end == want.rows[-1]
        moves, plan = _want_inputs(kvp, list(want.rows))
        assert np.array_equal(moves_out, moves) and np.array_equal(plan_out, plan)
        advanced = state.copy()
        advanced[round_plan.STATE_KVP] += want.count
        advanced[round_plan.STATE_REMAINING] -= want.count
        advanced[round_plan.STATE_ANCHOR] = got.tokens[-1]
        advanced[round_plan.STATE_DONE] = int(want.ends)
        advanced[round_plan.STATE_ROUND] += 1
        assert after.tolist() == advanced.tolist()
        # the draft's conditioning: the path padded with its last row, at the kvp it was verified at
        assert cond == [list(want.rows) + [want.rows[-1]] * (RUN - want.count), kvp]
        seen_lengths.add(got.count)
    assert len(seen_lengths) >= 4, f"the random rounds accepted too few path lengths: {seen_lengths}"


def test_a_round_that_is_not_committed_writes_the_no_op_inputs_and_keeps_the_state(lib) -> None:
    parents, draft, target = [-1, 0, 1], [5, 6, 7], [6, 7, 8]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    noop_moves, zero_plan = _want_inputs(300, [])
    cases = [
        (cells, target, [0, 1, 0], round_tail.STATUS_FLAGGED_ROW),  # a NaN/+inf row or a changed digest
        (cells, target, [1, 0, 0], round_tail.STATUS_FLAGGED_ROW),  # the anchor's row too
        (cells, [6, -1, 8], [0, 0, 0], round_tail.STATUS_NON_FINITE),  # a row whose maximum was not finite
        (cells, [6, 7, 2**32], [0, 0, 0], abi.ERR_ID),  # the acceptor's own refusal, with its code
    ]
    idle = cells.copy()
    idle[abi.TREE_ROWS] = 0  # what round_plan writes for a refused or idle round
    cases.append((idle, target, [0, 0, 0], abi.ERR_SIZE))
    bad_parent = cells.copy()
    bad_parent[abi.TREE_PARENTS + 2] = 2
    cases.append((bad_parent, target, [0, 0, 0], abi.ERR_PARENT))
    for cells_, ids, bad, status in cases:
        state = _state(300)
        cond: list = [None, None]
        got, moves_out, plan_out, after = _decide(lib, cells_, ids, bad, state, cond=cond)
        assert (got.status, got.count, got.path, got.tokens, got.end, got.kvp) == (status, 0, (), (), -1, 300)
        assert cond == [[0] * RUN, 300]  # row 0 alone, at the same kvp: the retry overwrites it
        assert np.array_equal(moves_out, noop_moves) and np.array_equal(plan_out, zero_plan)
        assert after.tolist() == _counted(state).tolist()


def test_every_round_is_stamped_with_its_request_and_number_and_counted(lib) -> None:
    """The record carries the state's epoch and round number (the host's check that a record is the round it
    waits for); the number advances on every round, committed, flagged or refused alike."""
    cells = round_tail.tree_cells([-1, 0], [5, 6], [], 10)
    state = Request(5, 300, 50, 1300, RUN, (), epoch=2**31 - 1).state()  # the largest epoch a record holds
    seen = []
    for bad in ([0, 0], [1, 0], [0, 0]):
        got, *_, state = _decide(lib, cells, [6, 9], bad, state)
        seen.append((got.epoch, got.round, got.status))
        cells = round_tail.tree_cells([-1, 0], [int(state[round_plan.STATE_ANCHOR]), 6], [], 10)
    assert seen == [(2**31 - 1, 0, 0), (2**31 - 1, 1, round_tail.STATUS_FLAGGED_ROW), (2**31 - 1, 2, 0)]
    assert state[round_plan.STATE_ROUND] == 3
    idle = cells.copy()
    idle[abi.TREE_ROWS] = 0
    got, *_, state = _decide(lib, idle, [6, 9], [0, 0], state)
    assert (got.round, got.status, state[round_plan.STATE_ROUND]) == (3, abi.ERR_SIZE, 4)


def test_only_the_trees_rows_are_checked_and_more_rows_than_verified_are_refused(lib) -> None:
    cells = round_tail.tree_cells([-1, 0], [5, 6], [], 10)
    got, *_ = _decide(lib, cells, [6, 9, -1, 3], [0, 0, 1, 1], _state(0))  # padding rows 2, 3 flagged
    assert got.status == 0 and got.path == (0, 1)
    three = round_tail.tree_cells([-1, 0, 1], [5, 6, 7], [], 10)
    got, *_ = _decide(lib, three, [6, 7], [0, 0], _state(0), run=2)
    assert got.status == abi.ERR_SIZE


def test_an_undecided_target_off_the_path_is_ignored_and_on_it_refuses_the_round(lib) -> None:
    """A sampled row the draw left to the host (UNDECIDED): off the committed path the acceptor never reads
    it and the round commits the path as with any target there; on the path (a row it walks through, or the
    last, whose target it commits) the round is refused for the host to decide. Other negative targets
    refuse the round wherever they are."""
    parents, draft = [-1, 0, 1, 0, 3], [5, 6, 7, 9, 4]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    undecided = round_tail.UNDECIDED
    for off_path in ([6, 7, 8, undecided, 2], [6, 7, 8, 1, undecided], [6, 7, 8, undecided, undecided]):
        state = _state(300)
        got, moves_out, plan_out, after = _decide(lib, cells, off_path, [0] * 5, state)
        want = accept.tree(parents, draft, [6, 7, 8, 0, 0], [], 10)
        assert got.status == 0 and got.path == tuple(want.rows) == (0, 1, 2) and got.tokens == (6, 7, 8)
        moves, plan = _want_inputs(300, [0, 1, 2])
        assert np.array_equal(moves_out, moves) and np.array_equal(plan_out, plan)
        assert after[round_plan.STATE_KVP] == 303
    for on_path in ([undecided, 7, 8, 1, 2], [6, undecided, 8, 1, 2], [6, 7, undecided, 1, 2]):
        state = _state(300)
        got, moves_out, plan_out, after = _decide(lib, cells, on_path, [0] * 5, state)
        assert (got.status, got.count, got.tokens) == (round_tail.STATUS_NON_FINITE, 0, ())
        assert after.tolist() == _counted(state).tolist()
    got, *_ = _decide(lib, cells, [6, 7, 8, -1, 2], [0] * 5, _state(300))  # a non-finite greedy row anywhere
    assert got.status == round_tail.STATUS_NON_FINITE


def test_a_slot_outside_the_pages_commits_nothing(lib) -> None:
    kvp = len(PAGES) * PAGE - 2  # the verify's last slots lie past the sequence's pages
    cells = round_tail.tree_cells([-1, 0, 0, 2], [5, 6, 7, 8], [], 10)
    state = _state(kvp)
    got, moves_out, plan_out, after = _decide(lib, cells, [7, 1, 8, 2], [0] * 4, state)
    assert (got.status, got.count) == (round_tail.STATUS_SLOT_OUTSIDE_PAGES, 0)
    assert not moves_out.any() and not plan_out.any() and after.tolist() == _counted(state).tolist()


@pytest.mark.parametrize("count", [0, -1, 2, len(PAGES) + 4, 2**31 - 1])
def test_the_page_count_in_device_memory_bounds_the_slots(lib, count: int) -> None:
    # slots on the table's third page: inside the table (even its padding), outside a count of 2 or of a count
    # the table (8 columns) cannot hold; count 3 and the whole table commit
    kvp = 2 * PAGE + 5
    cells = round_tail.tree_cells([-1, 0, 0, 2], [5, 6, 7, 8], [], 10)
    state = _state(kvp)
    got, moves_out, plan_out, after = _decide(lib, cells, [7, 1, 8, 2], [0] * 4, state, page_count=count)
    assert (got.status, got.count) == (round_tail.STATUS_SLOT_OUTSIDE_PAGES, 0)
    assert not moves_out.any() and not plan_out.any() and after.tolist() == _counted(state).tolist()
    for committing in (3, len(PAGES) + 3):
        got, *_ = _decide(lib, cells, [7, 1, 8, 2], [0] * 4, state, page_count=committing)
        assert (got.status, got.count) == (0, 3), committing


def test_bad_arguments_are_refused(lib) -> None:
    cells = round_tail.tree_cells([-1], [1], [], 1)
    ids, bad = np.zeros(17, dtype=np.int64), np.zeros(17, dtype=np.int32)
    state, pages = _state(0), np.array(PAGES, dtype=np.int32)
    count = np.array([len(PAGES)], dtype=np.int32)
    out = np.zeros(8192, dtype=np.int64)

    def call(run: int, width: int, cond_rows: int = 16) -> int:
        return lib.elpis_round_tail(
            cells.ctypes.data, ids.ctypes.data, bad.ctypes.data, run, state.ctypes.data, pages.ctypes.data,
            width, count.ctypes.data, out.ctypes.data, out.ctypes.data, out.ctypes.data, out.ctypes.data,
            cond_rows, out.ctypes.data, None,
        )  # fmt: skip

    assert call(0, 5) == -1 and call(17, 5) == -1 and call(8, 0) == -1
    assert call(8, 5, cond_rows=7) == -1 and call(8, 5, cond_rows=17) == -1  # a path of run rows must fit
    assert not out.any()  # nothing launched


def test_tree_cells_refuse_what_the_layout_cannot_hold() -> None:
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        round_tail.tree_cells([], [], [], 1)
    with pytest.raises(ValueError, match="draft token per row"):
        round_tail.tree_cells([-1, 0], [1], [], 1)
    with pytest.raises(ValueError, match="at most 4 stop ids"):
        round_tail.tree_cells([-1], [1], [1, 2, 3, 4, 5], 1)


# -- the round's two kernels together ---------------------------------------------------------------------

VOCAB = 50


def _next(token: int) -> int:
    """The toy target model: greedy decoding after `token` (a fixed permutation-like map)."""
    return (7 * token + 3) % VOCAB


def _draft_block(rng: random.Random, anchor: int, k: int, right: float) -> np.ndarray:
    """A 7-row candidate block after `anchor`: the chain is the target's own continuation with probability
    `right` per depth (then wrong), and the top-k hold other tokens, sometimes the right one."""
    block = np.zeros((7, 2 + 2 * k), dtype=np.float32)
    token = anchor
    for d in range(7):
        truth = _next(token)
        chain = truth if rng.random() < right else (truth + 1 + rng.randrange(VOCAB - 1)) % VOCAB
        block[d, 0], block[d, 1] = chain, -rng.uniform(0.0, 1.0)
        others = [truth if rng.random() < 0.5 else rng.randrange(VOCAB) for _ in range(k)]
        block[d, 2 : 2 + k] = others
        block[d, 2 + k :] = sorted((-rng.uniform(0.5, 4.0) for _ in range(k)), reverse=True)
        token = chain
    return block


def _plain(anchor: int, max_tokens: int, stops: tuple[int, ...]) -> list[int]:
    out, token = [], anchor
    while len(out) < max_tokens:
        token = _next(token)
        out.append(token)
        if token in stops:
            break
    return out


@pytest.mark.parametrize("run", [8, 16])
def test_rounds_on_the_device_commit_plain_decodings_tokens(lib, plan_lib, run: int) -> None:
    """Plan, verify (each row's greedy target from the toy model), decide, round after round from the state
    block alone: the committed tokens are plain greedy decoding's, max_tokens is exact, a stop token ends the
    request, and a round whose row checks fail is verified again at the same position."""
    rng = random.Random(run)
    longest, faults = 0, 0
    for case in range(30):
        anchor, kvp = rng.randrange(VOCAB), rng.randrange(0, 600)
        max_tokens = rng.randint(1, 40)
        stops = (rng.randrange(VOCAB),) if case % 3 == 0 else ()
        budget = rng.randint(1, run)
        state = Request(anchor, kvp, max_tokens, kvp + 5000, budget, stops).state()
        pages = list(range(100, 100 + (kvp + 5000) // PAGE + 2))
        committed: list[int] = []
        for _ in range(200):
            if state[round_plan.STATE_DONE]:
                break
            packed = _draft_block(rng, int(state[round_plan.STATE_ANCHOR]), rng.choice((1, 2, 4)), 0.7)
            err, planned, ints, cells = emulated_plan(plan_lib, packed, run, VOCAB, state)
            assert err == 0 and planned.status == 0
            targets = [_next(int(t)) for t in ints["ids"]]  # the verify: each row's greedy target
            bad = [0] * run
            if rng.random() < 0.1:  # a corrupted row, flagged by the checks: the round must be recomputed
                row = rng.randrange(planned.rows)
                bad[row], targets[row] = 1, (targets[row] + 1) % VOCAB
            before = state.copy()
            got, *_, state = _decide(lib, cells, targets, bad, state, run=run, pages=pages)
            if got.status != 0:
                assert got.status == round_tail.STATUS_FLAGGED_ROW
                assert state.tolist() == _counted(before).tolist()
                faults += 1
                continue
            assert got.kvp == kvp + len(committed)
            committed += got.tokens
            longest = max(longest, got.count)
        assert state[round_plan.STATE_DONE] == 1
        assert committed == _plain(anchor, max_tokens, stops), case
        assert state[round_plan.STATE_KVP] == kvp + len(committed)
        assert state[round_plan.STATE_REMAINING] == max_tokens - len(committed)
    assert longest >= 4 and faults >= 3  # drafts were accepted several deep, and flagged rounds recomputed
