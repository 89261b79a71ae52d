"""The round's two kernels checked against the host on the machine that built them, before any round runs
there (fail closed).

nvcc 13.0 and NVRTC 12.8 compiled an earlier `patches/kernels/gdn_tree_plan.cuh`, inside `round_tail.cu`, into
a kernel that refused every round, while every host build of the same source was right (bench/results/tree/
README.md, sessions 36-37). Our kernels are built by the user's own CUDA toolkit, so a miscompile can reach a
machine that CI never saw. `check_round_tail(launch)` runs fixed rounds through one build of the kernel and
compares, byte for byte, what it writes with what the host computes for the same round:
- the record: the proven acceptor's decision (`elpis.accept.tree`), the committed tokens, the round's stamps;
- the commit's inputs: `tree_verify.commit_moves` and `gdn_tree.packed_commit_plan` of the path;
- the draft's conditioning and the state block, advanced on a commit and left alone on a refusal.
The rounds include refusals (a flagged row, a non-finite maximum, cells the acceptor refuses).
`check_round_plan(launch)` does the same for `round_plan.cu`, which inlines the same header: seeded candidate
blocks (ties, duplicates, -inf, rows out of order) and requests (idle, out of room or budget), against the
tree, verify inputs and acceptor cells the host builds from them (`host_plan`, composed from the served
Python). The first difference raises `RoundKernelMismatch` naming the round;
`elpis.exl3.device_round.DeviceRounds` runs both checks on the GPU when it is made, so rounds on the GPU are
refused with the reason, and host rounds stay. The tests use the same reference
(tests/kernels/round_plan_cases.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from elpis import accept
from elpis.accept import abi
from elpis.backend import DraftBlock
from elpis.exl3 import gdn_tree, round_plan, round_tail
from elpis.exl3.drafter import unpack_candidates
from elpis.exl3.tree_verify import PAGE, commit_moves, layout_tree
from elpis.spec.tree import DraftTree, build_tree, tree_shape

RUN = round_tail.MAX_ROWS
PAGES = (40, 41, 7, 43, 44)  # the sequence's cache pages, out of order: a slot's page is looked up
TABLE_WIDTH = 8  # the block table row holding them, padded (the kernel reads their count from device memory)
ROUNDS = 24  # decided rounds; each a different tree, path length and page straddle
SEED = 37

# the decision first, then what it implies, then the inputs, which the kernel must leave alone
COMPARED = (
    "record", "moves_out", "plan_out", "cond_index", "cond_kvp", "state", "cells", "ids", "bad", "pages",
    "page_count",
)  # fmt: skip

Buffers = dict[str, np.ndarray]
Launch = Callable[[Buffers], None]


class RoundKernelMismatch(RuntimeError):
    """A round kernel wrote something else than the host computes for the same round."""


def buffers(cells: np.ndarray, ids: list[int], bad: list[int], state: np.ndarray) -> Buffers:
    """One round's inputs and its outputs, poisoned, in the order of `round_tail.decide`'s operands."""
    return {
        "cells": np.array(cells, dtype=np.int64),
        "ids": np.array(list(ids) + [0] * (RUN - len(ids)), dtype=np.int64),
        "bad": np.array(list(bad) + [0] * (RUN - len(bad)), dtype=np.int32),
        "state": np.array(state, dtype=np.int64),
        "pages": np.array(PAGES + (0,) * (TABLE_WIDTH - len(PAGES)), dtype=np.int32),
        "page_count": np.array([len(PAGES)], dtype=np.int32),
        "record": np.full(round_tail.RECORD_WORDS, -7, dtype=np.int32),
        "moves_out": np.full((4, RUN - 1), -7, dtype=np.int64),
        "plan_out": np.full(gdn_tree.PLAN_CAPACITY, 0xA5, dtype=np.uint8),
        "cond_index": np.full(RUN, -7, dtype=np.int64),
        "cond_kvp": np.full(1, -7, dtype=np.int32),
    }


def _expected(given: Buffers, parents: list[int], draft: list[int], stops: list[int], budget: int,
              status: int | None) -> Buffers:  # fmt: skip
    """What the kernel must leave in `given`'s buffers: the acceptor's decision, or the no-op round of
    `status` (the round's row checks or the acceptor's refusal)."""
    want = {name: value.copy() for name, value in given.items()}
    state = given["state"]
    kvp, ids = int(state[round_plan.STATE_KVP]), [int(i) for i in given["ids"]]
    path: list[int] = []
    ends = False
    if status is None:  # an undecided target is never read where the round commits: any id stands for it
        targets = [0 if i == round_tail.UNDECIDED else i for i in ids[: len(parents)]]
        decision = accept.tree(parents, draft, targets, stops, budget)
        path, ends, status = list(decision.rows), decision.ends, 0
    record = np.full(round_tail.RECORD_WORDS, 0, dtype=np.int32)
    record[round_tail.REC_STATUS], record[round_tail.REC_COUNT] = status, len(path)
    record[round_tail.REC_ENDS], record[round_tail.REC_END] = int(ends), path[-1] if path else -1
    record[round_tail.REC_KVP] = kvp
    record[round_tail.REC_PATH : round_tail.REC_PATH + RUN] = path + [255] * (RUN - len(path))
    tokens = [ids[r] for r in path]
    record[round_tail.REC_TOKENS : round_tail.REC_TOKENS + RUN] = tokens + [-1] * (RUN - len(path))
    record[round_tail.REC_EPOCH] = int(state[round_plan.STATE_EPOCH])
    record[round_tail.REC_ROUND] = int(state[round_plan.STATE_ROUND])
    want["record"] = record
    if status == round_tail.STATUS_SLOT_OUTSIDE_PAGES:
        moves = [0] * (4 * (RUN - 1))  # the last slot, which a no-op's self-copies take, is outside too
    else:
        moves = commit_moves(kvp, path, RUN, list(PAGES))
    want["moves_out"] = np.array(moves, dtype=np.int64).reshape(4, RUN - 1)
    plan = gdn_tree.packed_commit_plan(tuple(path)) if path else b""
    want["plan_out"] = np.frombuffer(plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan)), dtype=np.uint8)
    conditioning = path + [path[-1]] * (RUN - len(path)) if path else [0] * RUN  # the path, padded
    want["cond_index"] = np.array(conditioning, dtype=np.int64)
    want["cond_kvp"] = np.array([kvp], dtype=np.int32)
    after = state.copy()
    after[round_plan.STATE_ROUND] += 1
    if path:
        after[round_plan.STATE_KVP] += len(path)
        after[round_plan.STATE_REMAINING] -= len(path)
        after[round_plan.STATE_ANCHOR] = tokens[-1]
        after[round_plan.STATE_DONE] = int(ends)
    want["state"] = after
    return want


def random_round(rng: random.Random, rows: int) -> tuple[list[int], list[int], list[int], list[int], int]:
    """A verified tree of `rows` rows for the round's tail: parents, drafts, greedy targets that follow some
    drafts (so paths of several rows are accepted), stops and a budget, over 12 token ids so stops and
    matches happen."""
    parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
    draft = [rng.randrange(12) for _ in range(rows)]
    target = [rng.randrange(12) for _ in range(rows)]
    for r in range(1, rows):
        if rng.random() < 0.6:
            target[parents[r]] = draft[r]  # the parent's target is this child's draft: accepted
    return parents, draft, target, rng.sample(range(12), rng.randint(0, 2)), rng.randint(1, 20)


def _rounds() -> list[tuple[Buffers, Buffers]]:
    """(inputs, expected outputs) of every checked round: decided trees, whole chains of every length, then
    refusals."""
    rng = random.Random(SEED)
    cases = []
    for i in range(ROUNDS):
        rows = 1 + i % RUN
        parents, draft, target, stops, budget = random_round(rng, rows)
        kvp = rng.choice((0, PAGE - 3, 2 * PAGE - 9, 3 * PAGE + 17))  # the verify's slots straddle pages
        state = round_plan.state_block(anchor=draft[0], kvp=kvp, remaining=budget, max_context=kvp + 1000,
                                       tree_budget=RUN, stops=stops, epoch=i)  # fmt: skip
        given = buffers(round_tail.tree_cells(parents, draft, stops, budget), target, [0] * rows, state)
        cases.append((given, _expected(given, parents, draft, stops, budget, None)))
    for length in range(1, RUN + 1):  # a whole chain accepted up to the budget: every commit plan's length
        parents = list(range(-1, RUN - 1))
        target = [100 + r for r in range(RUN)]
        draft = [7, *target[:-1]]  # row r drafts what row r - 1's target is
        state = round_plan.state_block(anchor=7, kvp=PAGE - 5, remaining=length, max_context=5000,
                                       tree_budget=RUN, stops=[], epoch=ROUNDS + length)  # fmt: skip
        given = buffers(round_tail.tree_cells(parents, draft, [], length), target, [0] * RUN, state)
        cases.append((given, _expected(given, parents, draft, [], length, None)))
    parents, draft, target = [-1, 0, 1], [5, 6, 7], [6, 7, 8]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    state = round_plan.state_block(
        anchor=5, kvp=300, remaining=10, max_context=5000, tree_budget=RUN, stops=[]
    )
    for ids, bad, status in (
        (target, [0, 1, 0], round_tail.STATUS_FLAGGED_ROW),  # a NaN/+inf row or a changed digest
        ([6, -1, 8], [0, 0, 0], round_tail.STATUS_NON_FINITE),
        ([6, 7, 2**32], [0, 0, 0], abi.ERR_ID),  # the acceptor's own refusal, with its code
    ):
        given = buffers(cells, ids, bad, state)
        cases.append((given, _expected(given, parents, draft, [], 10, status)))
    # a drawn target the draw left to the host: ignored off the committed path (row 3), refused on it (the
    # path's rows 0-2, the last one's target committed too)
    parents, draft = [-1, 0, 1, 0], [5, 6, 7, 9]
    cells = round_tail.tree_cells(parents, draft, [], 10)
    undecided = round_tail.UNDECIDED
    for ids, status in (([6, 7, 8, undecided], None), ([6, undecided, 8, 3], round_tail.STATUS_NON_FINITE),
                        ([6, 7, undecided, 3], round_tail.STATUS_NON_FINITE)):  # fmt: skip
        given = buffers(cells, ids, [0] * 4, state)
        cases.append((given, _expected(given, parents, draft, [], 10, status)))
    # slots past the sequence's pages, which the table's padding (page 0) would take if the kernel ignored the
    # count; and counts the table cannot hold
    outside = round_plan.state_block(anchor=5, kvp=len(PAGES) * PAGE - 2, remaining=10, max_context=5000,
                                     tree_budget=RUN, stops=[])  # fmt: skip
    for at, count in ((outside, len(PAGES)), (state, 0), (state, TABLE_WIDTH + 1)):
        given = buffers(cells, target, [0, 0, 0], at)
        given["page_count"][0] = count
        cases.append((given, _expected(given, parents, draft, [], 10, round_tail.STATUS_SLOT_OUTSIDE_PAGES)))
    return cases


def check_round_tail(launch: Launch) -> int:
    """Run every checked round through `launch` (one build of round_tail.cu: it fills the buffers' outputs and
    advances their state in place, as `round_tail.decide` does) and compare with the host. Returns the
    number of rounds checked; raises RoundKernelMismatch at the first difference."""
    cases = _rounds()
    for number, (given, want) in enumerate(cases):
        got = {name: value.copy() for name, value in given.items()}
        launch(got)
        for name in COMPARED:
            value = want[name]
            if got[name].shape != value.shape or not np.array_equal(got[name], value):
                raise RoundKernelMismatch(
                    f"the round's decision kernel, as built here, disagrees with the host on check round "
                    f"{number}: its {name} is {got[name].tolist()}, the host's {value.tolist()} (record: "
                    f"{got['record'].tolist()[:5]}). The CUDA compiler may have miscompiled it; rounds on "
                    "the GPU are refused (bench/results/tree/README.md, sessions 36-37)"
                )
    return len(cases)


def gpu_launch(device: object) -> Launch:
    """A launch of the served build on `device` (a torch device): the buffers copied there and back."""
    import torch

    def launch(buffers: Buffers) -> None:
        on = {name: torch.from_numpy(value.copy()).to(device) for name, value in buffers.items()}
        round_tail.decide(on["cells"], on["ids"], on["bad"], on["state"], on["pages"], on["page_count"],
                          on["record"], on["moves_out"], on["plan_out"], on["cond_index"],
                          on["cond_kvp"])  # fmt: skip
        torch.cuda.synchronize(device)
        for name, value in on.items():
            buffers[name][...] = value.cpu().numpy()

    return launch


# ---- the round's plan kernel ------------------------------------------------------------------------------

PLAN_ROUNDS = 16  # seeded candidate blocks and requests; half at 8 verify rows, half at 16
PLAN_VOCABS = (16, 248_320)  # a tiny vocabulary (duplicates, chain repeats) and Qwen3.8's
PlanLaunch = Callable[[np.ndarray, int, np.ndarray, Buffers, np.ndarray, np.ndarray], None]


@dataclass(frozen=True)
class Request:
    anchor: int
    kvp: int
    remaining: int
    max_context: int
    tree_budget: int
    stops: tuple[int, ...]
    done: bool = False
    epoch: int = 0

    def state(self) -> np.ndarray:
        return round_plan.state_block(
            anchor=self.anchor, kvp=self.kvp, remaining=self.remaining, max_context=self.max_context,
            tree_budget=self.tree_budget, stops=self.stops, done=self.done, epoch=self.epoch,
        )  # fmt: skip


@dataclass(frozen=True)
class Expected:
    """status: 0, round_plan.STATUS_IDLE, or -1 where the host's builder raises (any refusal code)."""

    status: int
    tree: DraftTree
    inputs: dict[str, list[int]]  # the verify's inputs by name (round_plan.plan's), plan as its bytes
    cells: np.ndarray | None  # the acceptor's cells, for a tree to verify


def host_plan(packed: np.ndarray, run: int, vocab: int, req: Request) -> Expected:
    k = (packed.shape[1] - 2) // 2
    tree = DraftTree((req.anchor,), (-1,), (0,), (0.0,))
    status = 0
    room = req.max_context - req.kvp
    if req.done or req.remaining < 1 or room < 1:
        status = round_plan.STATUS_IDLE
    else:
        rows, depth = tree_shape(req.tree_budget, room, req.remaining)
        if depth >= 1:
            used = min(depth, packed.shape[0])
            try:
                block = DraftBlock(unpack_candidates(packed[:used].tolist(), k))
                tree = build_tree(req.anchor, block, rows, max_depth=depth, vocab_size=vocab)
            except (ValueError, OverflowError):
                status = -1
    layout = layout_tree(tree.parents, run)
    plan = gdn_tree.packed_plan(layout.depth, layout.ancestors)
    inputs = {
        "seqlens": [req.kvp],
        "position": layout.position_ids(req.kvp),
        "ctx": [req.kvp],
        "masks": [*layout.depth, *layout.ancestors],
        "plan": list(plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan))),
        "ids": [*tree.tokens, *[tree.tokens[0]] * (run - len(tree))],
    }
    cells = None
    if status == 0:
        cells = round_tail.tree_cells(list(tree.parents), list(tree.tokens), list(req.stops), req.remaining)
    return Expected(status, tree, inputs, cells)


def poisoned_verify_inputs(run: int) -> dict[str, np.ndarray]:
    """The kernel's verify outputs by name (its VerifyInputs struct's order), each poisoned, so an unwritten
    one shows."""
    return {
        "seqlens": np.full(1, -7, dtype=np.int32),
        "position": np.full(run, -7, dtype=np.int32),
        "ctx": np.full(1, -7, dtype=np.int32),
        "masks": np.full(2 * run, -7, dtype=np.int32),
        "plan": np.full(gdn_tree.PLAN_CAPACITY, 0xA5, dtype=np.uint8),
        "ids": np.full(run, -7, dtype=np.int32),
    }


def random_block(rng: random.Random, rows: int, k: int, vocab: int) -> np.ndarray:
    """A packed candidate block (pack_candidates' layout) with ties, duplicates, -inf, values above 0 and
    rows out of order."""
    ids_from = rng.choice((4, 12, vocab))  # a narrow range makes duplicates and chain repeats common
    step = rng.choice((0.0, 0.5, 1.0))  # 0: continuous log-probabilities; else multiples of it (ties)
    block = np.zeros((rows, 2 + 2 * k), dtype=np.float32)

    def logprob() -> float:
        roll = rng.random()
        if roll < 0.05:
            return -math.inf
        if roll < 0.08:
            return rng.choice((0.0, -0.0, 1e-7, 0.25))  # clamped to 0.0 by the unpacking
        value = -rng.uniform(0.0, 8.0)
        return round(value / step) * step if step else value

    for d in range(rows):
        block[d, 0] = rng.randrange(min(ids_from, vocab))
        block[d, 1] = logprob()
        block[d, 2 : 2 + k] = [rng.randrange(min(ids_from, vocab)) for _ in range(k)]
        lps = [logprob() for _ in range(k)]
        # the drafter's top-k comes sorted; unsorted rows reach the builder's own sort and a repeated id whose
        # first copy is -inf (dropped, so the second copy is kept)
        block[d, 2 + k :] = sorted(lps, reverse=True) if rng.random() < 0.5 else lps
    return block


def random_request(rng: random.Random, run: int, vocab: int) -> Request:
    kvp = rng.randrange(0, 5000)
    room = rng.choice((0, 1, 2, 3, 5, 40, 10_000, 10_000))
    return Request(
        anchor=rng.randrange(vocab),
        kvp=kvp,
        remaining=rng.choice((0, 1, 2, 3, 4, 6, 9, 50, 50)),
        max_context=kvp + room,
        tree_budget=rng.randint(1, run),
        stops=tuple(rng.sample(range(vocab), rng.randint(0, 4))),
        done=rng.random() < 0.05,
    )


def plan_difference(
    record: round_plan.PlannedTree, inputs: dict[str, list[int]], cells: np.ndarray, want: Expected
) -> str | None:
    """What of the plan kernel's outputs differs from the host's `want`, or None: the status (any refusal
    code where the host's builder raises), the tree, the verify's inputs, the acceptor's cells (0 rows, which
    the acceptor refuses, where there is no tree to verify)."""
    status = record.status if record.status >= 0 else -1
    if status != want.status:
        return f"status {record.status}, the host's {want.status}"
    if (record.rows, record.tokens, record.parents) != (len(want.tree), want.tree.tokens, want.tree.parents):
        return f"tree {record.tokens} / {record.parents}, the host's {want.tree.tokens} / {want.tree.parents}"
    for name, value in want.inputs.items():
        if inputs[name] != value:
            return f"verify input {name} {inputs[name]}, the host's {value}"
    if want.cells is None:
        return None if cells[abi.TREE_ROWS] == 0 else f"cells of {cells[abi.TREE_ROWS]} rows for no tree"
    if np.array_equal(cells, want.cells):
        return None
    return f"cells {cells.tolist()}, the host's {want.cells.tolist()}"


def plan_outputs(
    launch: PlanLaunch, packed: np.ndarray, run: int, vocab: int, state: np.ndarray
) -> tuple[list[int], dict[str, list[int]], np.ndarray]:
    """One launch of a plan kernel build on poisoned outputs (an unwritten one shows): its record's words, the
    verify inputs by name (lists) and the acceptor's cells."""
    inputs = poisoned_verify_inputs(run)
    cells = np.full(abi.TREE_CELLS, -7, dtype=np.int64)
    record = np.full(round_plan.RECORD_WORDS, -7, dtype=np.int32)
    launch(packed, vocab, state, inputs, cells, record)
    return record.tolist(), {name: value.tolist() for name, value in inputs.items()}, cells


def check_round_plan(launch: PlanLaunch) -> int:
    """Run the seeded plan rounds through `launch` (one build of round_plan.cu: given packed float32
    candidates, the vocabulary, the state block, it fills the verify inputs, cells and record in place, as
    `round_plan.plan` does) and compare with `host_plan`. Returns the number of rounds checked; raises
    RoundKernelMismatch at the first difference."""
    rng = random.Random(SEED)
    for number in range(PLAN_ROUNDS):
        run, vocab = (8, 16)[number % 2], PLAN_VOCABS[(number // 2) % 2]
        packed = random_block(rng, 7, rng.choice((1, 2, 4, 8)), vocab)
        req = random_request(rng, run, vocab)
        want = host_plan(packed, run, vocab, req)
        words, inputs, cells = plan_outputs(launch, packed, run, vocab, req.state())
        try:
            difference = plan_difference(round_plan.read_record(words), inputs, cells, want)
        except ValueError as exc:  # a record the kernel should never write
            difference = str(exc)
        if difference is not None:
            raise RoundKernelMismatch(
                f"the round's plan kernel, as built here, disagrees with the host on plan check round "
                f"{number}: its {difference}. The CUDA compiler may have miscompiled it; rounds on the GPU "
                "are refused (bench/results/tree/README.md, sessions 36-37)"
            )
    return PLAN_ROUNDS


def gpu_plan_launch(device: object) -> PlanLaunch:
    """A launch of the served round_plan.cu build on `device`: the arrays copied there and back."""
    import torch

    def launch(packed: np.ndarray, vocab: int, state: np.ndarray, inputs: Buffers, cells: np.ndarray,
               record: np.ndarray) -> None:  # fmt: skip
        on = {name: torch.from_numpy(value.copy()).to(device) for name, value in inputs.items()}
        outputs = torch.from_numpy(cells.copy()).to(device), torch.from_numpy(record.copy()).to(device)
        block = torch.from_numpy(np.ascontiguousarray(packed, dtype=np.float32)).to(device)
        round_plan.plan(block, vocab, torch.from_numpy(state.copy()).to(device), on, *outputs)
        torch.cuda.synchronize(device)
        for name, value in on.items():
            inputs[name][...] = value.cpu().numpy()
        cells[...], record[...] = outputs[0].cpu().numpy(), outputs[1].cpu().numpy()

    return launch
