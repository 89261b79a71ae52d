"""The round's decision kernel checked against the host on the machine that built it, before any round runs
there (fail closed).

nvcc 13.0 and NVRTC 12.8 compiled an earlier `patches/kernels/gdn_tree_plan.cuh`, inside `round_tail.cu`, into
a kernel that refused every round, while every host build of the same source was right (bench/results/tree/
README.md, sessions 36-37). Our kernels are built by the user's own CUDA toolkit, so a miscompile can reach a
machine that CI never saw. `check_round_tail(launch)` runs fixed rounds through one build of the kernel and
compares, byte for byte, what it writes with what the host computes for the same round:
- the record: the proven acceptor's decision (`elpis.accept.tree`), the committed tokens, the round's stamps;
- the commit's inputs: `tree_verify.commit_moves` and `gdn_tree.packed_commit_plan` of the path;
- the draft's conditioning and the state block, advanced on a commit and left alone on a refusal.
The rounds include refusals (a flagged row, a non-finite maximum, cells the acceptor refuses). The first
difference raises `RoundKernelMismatch` naming the round; `elpis.exl3.device_round.DeviceRounds` runs the
check on the GPU when it is made, so rounds on the GPU are refused with the reason, and host rounds stay.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from elpis import accept
from elpis.accept import abi
from elpis.exl3 import gdn_tree, round_plan, round_tail
from elpis.exl3.tree_verify import PAGE, commit_moves

RUN = round_tail.MAX_ROWS
PAGES = (40, 41, 7, 43, 44)  # the sequence's cache pages, out of order: a slot's page is looked up
ROUNDS = 24  # decided rounds; each a different tree, path length and page straddle
SEED = 37

# the decision first, then what it implies, then the inputs, which the kernel must leave alone
COMPARED = (
    "record", "moves_out", "plan_out", "cond_index", "cond_kvp", "state", "cells", "ids", "bad", "pages",
)  # fmt: skip

Buffers = dict[str, np.ndarray]
Launch = Callable[[Buffers], None]


class RoundKernelMismatch(RuntimeError):
    """The round's decision kernel wrote something else than the host computes for the same round."""


def buffers(cells: np.ndarray, ids: list[int], bad: list[int], state: np.ndarray) -> Buffers:
    """One round's inputs and its outputs, poisoned, in the order of `round_tail.decide`'s operands."""
    return {
        "cells": np.array(cells, dtype=np.int64),
        "ids": np.array(list(ids) + [0] * (RUN - len(ids)), dtype=np.int64),
        "bad": np.array(list(bad) + [0] * (RUN - len(bad)), dtype=np.int32),
        "state": np.array(state, dtype=np.int64),
        "pages": np.array(PAGES, dtype=np.int32),
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
    if status is None:
        decision = accept.tree(parents, draft, ids[: len(parents)], stops, budget)
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


def _rounds() -> list[tuple[Buffers, Buffers]]:
    """(inputs, expected outputs) of every checked round: decided trees, then refusals."""
    rng = random.Random(SEED)
    cases = []
    for i in range(ROUNDS):
        rows = 1 + i % RUN
        parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
        draft = [rng.randrange(12) for _ in range(rows)]
        target = [rng.randrange(12) for _ in range(rows)]
        for r in range(1, rows):
            if rng.random() < 0.7:
                target[parents[r]] = draft[r]  # the parent's target is this child's draft: accepted
        stops = rng.sample(range(12), rng.randint(0, 2))
        budget = rng.randint(1, 20)
        kvp = rng.choice((0, PAGE - 3, 2 * PAGE - 9, 3 * PAGE + 17))  # the verify's slots straddle pages
        state = round_plan.state_block(anchor=draft[0], kvp=kvp, remaining=budget, max_context=kvp + 1000,
                                       tree_budget=RUN, stops=stops, epoch=i)  # fmt: skip
        given = buffers(round_tail.tree_cells(parents, draft, stops, budget), target, [0] * rows, state)
        cases.append((given, _expected(given, parents, draft, stops, budget, None)))
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
        round_tail.decide(on["cells"], on["ids"], on["bad"], on["state"], on["pages"], on["record"],
                          on["moves_out"], on["plan_out"], on["cond_index"], on["cond_kvp"])  # fmt: skip
        torch.cuda.synchronize(device)
        for name, value in on.items():
            buffers[name][...] = value.cpu().numpy()

    return launch
