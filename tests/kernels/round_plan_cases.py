"""What the host does for the head of a greedy tree round, composed from the served Python, as the reference
of `patches/kernels/round_plan.cu` (its emulated and GPU tests): the tree's size (`spec.tree.tree_shape`), the
candidates (`drafter.unpack_candidates`), the tree (`spec.tree.build_tree`), the verify's inputs
(`tree_verify.layout_tree`, `gdn_tree.packed_plan`, `TreeGraphs._int_values`' segments) and the acceptor's
cells (`round_tail.tree_cells`). Plus random candidate blocks that reach the builder's corners: ties,
duplicates, the chain token among the top-k, -inf, log-probabilities above 0; and random verified trees for
`patches/kernels/round_tail.cu`'s tests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from elpis.accept import abi
from elpis.backend import DraftBlock
from elpis.exl3 import gdn_tree, round_plan, round_tail
from elpis.exl3.drafter import unpack_candidates
from elpis.exl3.tree_verify import layout_tree
from elpis.spec.tree import DraftTree, build_tree, tree_shape


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


def emulated_plan(lib, packed: np.ndarray, run: int, vocab: int, state: np.ndarray, *, k: int | None = None):
    """One call of the kernel's emulated build `lib` on `state` (int64 [STATE_WORDS]): the launch's error
    code, then the record, the verify inputs by name (lists) and the cells (None, None, None for a refused
    launch). Each output is poisoned first, so an unwritten one shows."""
    packed = np.ascontiguousarray(packed, dtype=np.float32)
    k = (packed.shape[1] - 2) // 2 if k is None else k
    inputs = poisoned_verify_inputs(run)
    cells = np.full(abi.TREE_CELLS, -7, dtype=np.int64)
    record = np.full(round_plan.RECORD_WORDS, -7, dtype=np.int32)
    err = lib.elpis_round_plan(
        packed.ctypes.data, packed.shape[0], k, run, vocab, state.ctypes.data, inputs["seqlens"].ctypes.data,
        inputs["position"].ctypes.data, inputs["ctx"].ctypes.data, inputs["masks"].ctypes.data,
        inputs["plan"].ctypes.data, inputs["ids"].ctypes.data, cells.ctypes.data, record.ctypes.data, None,
    )  # fmt: skip
    if err:
        return err, None, None, None
    return 0, round_plan.read_record(record.tolist()), {n: v.tolist() for n, v in inputs.items()}, cells


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


def random_round(rng: random.Random) -> tuple[list[int], list[int], list[int], list[int], int]:
    """A verified tree for the round's tail: parents, drafts, greedy targets that follow some drafts (so paths
    of several rows are accepted), stops and a budget, over 12 token ids so stops and matches happen."""
    rows = rng.randint(1, 16)
    parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
    vocab = 12
    draft = [rng.randrange(vocab) for _ in range(rows)]
    target = [rng.randrange(vocab) for _ in range(rows)]
    for r in range(1, rows):
        if rng.random() < 0.6:
            target[parents[r]] = draft[r]  # the parent's target is this child's draft: accepted
    stops = rng.sample(range(vocab), rng.randint(0, 2))
    budget = rng.randint(1, 20)
    return parents, draft, target, stops, budget


def emulated_tail_launch(lib) -> Callable[[dict[str, np.ndarray]], None]:
    """round_tail.cu's emulated build as a `round_check.Launch` (numpy buffers, `round_check.buffers`)."""

    def launch(b: dict[str, np.ndarray]) -> None:
        err = lib.elpis_round_tail(
            b["cells"].ctypes.data, b["ids"].ctypes.data, b["bad"].ctypes.data, len(b["ids"]),
            b["state"].ctypes.data, b["pages"].ctypes.data, len(b["pages"]), b["record"].ctypes.data,
            b["moves_out"].ctypes.data, b["plan_out"].ctypes.data, b["cond_index"].ctypes.data,
            len(b["cond_index"]), b["cond_kvp"].ctypes.data, None,
        )  # fmt: skip
        assert err == 0

    return launch


def interpreted_tail_launch(program) -> Callable[[dict[str, np.ndarray]], None]:
    """round_tail.cu's PTX (a `ptx_interp.PtxProgram`) as a `round_check.Launch`, the arguments of
    elpis_round_tail's launch in the kernel's order."""
    from tests.kernels.ptx_interp import Machine

    def launch(b: dict[str, np.ndarray]) -> None:
        Machine().call(
            program.entry("round_tail_kernel"), b["cells"], b["ids"], b["bad"], len(b["ids"]), b["state"],
            b["pages"], len(b["pages"]), b["record"], b["moves_out"], b["plan_out"], b["cond_index"],
            len(b["cond_index"]), b["cond_kvp"],
        )  # fmt: skip

    return launch
