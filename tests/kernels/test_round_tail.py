"""GPU test of the round's decision kernel (patches/kernels/round_tail.cu) through `elpis.exl3.round_tail`:
on the GPU its record is `elpis.accept.tree`'s decision and it copies the end row's commit inputs, with the
greedy targets taken from real logits by `sampling.greedy_ids`; a flagged row commits nothing. The CPU
emulation (tests/kernels/test_round_tail_emu.py) covers the refusals and the host half.
"""

from __future__ import annotations

import random

import pytest
import torch

from elpis import accept
from elpis.exl3 import gdn_tree, round_tail
from elpis.spec.sampling import greedy_ids

pytestmark = pytest.mark.gpu

VOCAB = 1000


def _round(cells, ids, bad, moves, plans):
    dev = torch.device("cuda")
    record = torch.full((round_tail.RECORD_WORDS,), -7, dtype=torch.int32, device=dev)
    moves_out = torch.zeros(moves.shape[1:], dtype=torch.int64, device=dev)
    plan_out = torch.zeros(plans.shape[1:], dtype=torch.uint8, device=dev)
    round_tail.decide(torch.from_numpy(cells).to(dev), ids, bad, moves, plans, record, moves_out, plan_out)
    return round_tail.read_record(record.tolist()), moves_out, plan_out


def test_the_gpu_decides_as_the_proven_acceptor_from_real_logits() -> None:
    rng = random.Random(11)
    gen = torch.Generator(device="cuda").manual_seed(3)
    parents = [-1, 0, 0, 1, 3, 2, 5]
    kvp, run, pages = 300, 16, [7, 9, 4]
    candidates = round_tail.commit_candidates(parents, kvp, run, pages)
    moves, plans = (torch.from_numpy(a).cuda() for a in candidates)
    for _ in range(50):
        logits = torch.randn((len(parents), VOCAB), generator=gen, device="cuda")
        ids = greedy_ids(logits)
        target = ids.tolist()
        draft = [rng.randrange(VOCAB) for _ in parents]
        for r in range(1, len(parents)):
            if rng.random() < 0.6:
                draft[r] = target[parents[r]]  # accepted when its parent is
        stops = [rng.randrange(VOCAB)] if rng.random() < 0.3 else []
        budget = rng.randint(1, 8)
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        bad = torch.zeros(len(parents), dtype=torch.int32, device="cuda")
        got, moves_out, plan_out = _round(cells, ids, bad, moves, plans)
        want = accept.tree(parents, draft, target, stops, budget)
        assert (got.status, got.path, got.count, got.ends) == (0, tuple(want.rows), want.count, want.ends)
        assert got.tokens == tuple(target[r] for r in want.rows)
        assert torch.equal(moves_out, moves[got.end]) and torch.equal(plan_out, plans[got.end])
    bad[2] = 1
    got, moves_out, plan_out = _round(cells, ids, bad, moves, plans)
    assert (got.status, got.count) == (round_tail.STATUS_FLAGGED_ROW, 0)
    assert torch.equal(moves_out, moves[round_tail.NOOP]) and not plan_out.any()
    assert plans.shape[1] == gdn_tree.PLAN_CAPACITY
