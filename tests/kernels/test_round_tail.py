"""GPU test of the round's decision kernel (patches/kernels/round_tail.cu) through `elpis.exl3.round_tail`:
on the GPU its record is `elpis.accept.tree`'s decision, with the greedy targets taken from real logits by
`sampling.greedy_ids`, the commit inputs it writes are `tree_verify.commit_moves`' and
`gdn_tree.packed_commit_plan`'s, and the state block advances by the committed count; a flagged row commits
nothing and keeps the state. The CPU emulation (tests/kernels/test_round_tail_emu.py) covers the refusals and
the two kernels of a round together.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from elpis import accept
from elpis.exl3 import gdn_tree, round_plan, round_tail
from elpis.exl3.tree_verify import commit_moves
from elpis.spec.sampling import greedy_ids

pytestmark = pytest.mark.gpu

VOCAB = 1000
RUN = 16
PAGES = [7, 9, 4]


def decide_round(cells, ids, bad, state, library=None):
    """One round's record, written moves and plan, and the draft's conditioning (outputs poisoned first);
    `library`: another build of round_tail.cu (elpis/bench/scripts/round_tail_diag.py)."""
    dev = torch.device("cuda")
    record = torch.full((round_tail.RECORD_WORDS,), -7, dtype=torch.int32, device=dev)
    moves_out = torch.full((4, RUN - 1), -7, dtype=torch.int64, device=dev)
    plan_out = torch.full((gdn_tree.PLAN_CAPACITY,), 0xA5, dtype=torch.uint8, device=dev)
    pages = torch.tensor([*PAGES, 0, 0], dtype=torch.int32, device=dev)  # a table row: pages, then padding
    page_count = torch.tensor([len(PAGES)], dtype=torch.int32, device=dev)
    padded = torch.zeros(RUN, dtype=torch.int64, device=dev)
    padded[: len(ids)] = ids
    bad_run = torch.zeros(RUN, dtype=torch.int32, device=dev)
    bad_run[: len(bad)] = bad
    cells_dev = torch.from_numpy(cells).to(dev)
    cond_index = torch.full((RUN,), -7, dtype=torch.int64, device=dev)
    cond_kvp = torch.full((1,), -7, dtype=torch.int32, device=dev)
    outs = (record, moves_out, plan_out, cond_index, cond_kvp)
    round_tail.decide(cells_dev, padded, bad_run, state, pages, page_count, *outs, library=library)
    cond = (cond_index.tolist(), cond_kvp.item())
    return round_tail.read_record(record.tolist()), moves_out.cpu(), plan_out.cpu(), cond


def _inputs(kvp: int, path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    moves = torch.tensor(commit_moves(kvp, path, RUN, PAGES), dtype=torch.int64).view(4, RUN - 1)
    plan = gdn_tree.packed_commit_plan(tuple(path)) if path else b""
    padded = plan + bytes(gdn_tree.PLAN_CAPACITY - len(plan))
    return moves, torch.frombuffer(bytearray(padded), dtype=torch.uint8)


PARENTS = [-1, 0, 0, 1, 3, 2, 5]


def real_logit_cases(count: int = 50) -> Iterator[tuple[torch.Tensor, list[int], list[int], int]]:
    """(ids, draft, stops, budget) for the tree PARENTS: greedy targets of random logits on the GPU, drafts
    matching some of them; fixed seeds (elpis/bench/scripts/round_tail_diag.py replays the same cases)."""
    rng = random.Random(11)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(count):
        logits = torch.randn((len(PARENTS), VOCAB), generator=gen, device="cuda")
        ids = greedy_ids(logits)
        target = ids.tolist()
        draft = [rng.randrange(VOCAB) for _ in PARENTS]
        for r in range(1, len(PARENTS)):
            if rng.random() < 0.6:
                draft[r] = target[PARENTS[r]]  # accepted when its parent is
        stops = [rng.randrange(VOCAB)] if rng.random() < 0.3 else []
        yield ids, draft, stops, rng.randint(1, 8)


def test_the_gpu_decides_as_the_proven_acceptor_from_real_logits() -> None:
    parents = PARENTS
    kvp = 300
    for ids, draft, stops, budget in real_logit_cases():
        target = ids.tolist()
        cells = round_tail.tree_cells(parents, draft, stops, budget)
        host_state = round_plan.state_block(
            anchor=draft[0], kvp=kvp, remaining=budget, max_context=10_000, tree_budget=RUN, stops=stops
        )
        state = torch.from_numpy(host_state).cuda()
        bad = torch.zeros(len(parents), dtype=torch.int32, device="cuda")
        got, moves_out, plan_out, cond = decide_round(cells, ids, bad, state)
        want = accept.tree(parents, draft, target, stops, budget)
        assert (got.status, got.path, got.count, got.ends, got.kvp) == (
            0, tuple(want.rows), want.count, want.ends, kvp
        )  # fmt: skip
        assert got.tokens == tuple(target[r] for r in want.rows)
        moves, plan = _inputs(kvp, list(want.rows))
        assert torch.equal(moves_out, moves) and torch.equal(plan_out, plan)
        assert cond == (list(want.rows) + [want.rows[-1]] * (RUN - want.count), kvp)
        after = state.tolist()
        assert after[round_plan.STATE_KVP] == kvp + want.count
        assert after[round_plan.STATE_REMAINING] == budget - want.count
        assert after[round_plan.STATE_ANCHOR] == got.tokens[-1]
        assert after[round_plan.STATE_DONE] == int(want.ends)
        assert (got.epoch, got.round, after[round_plan.STATE_ROUND]) == (0, 0, 1)
    state = torch.from_numpy(host_state).cuda()
    bad[2] = 1
    got, moves_out, plan_out, cond = decide_round(cells, ids, bad, state)
    assert (got.status, got.count) == (round_tail.STATUS_FLAGGED_ROW, 0) and cond == ([0] * RUN, kvp)
    noop_moves, zero_plan = _inputs(kvp, [])
    assert torch.equal(moves_out, noop_moves) and torch.equal(plan_out, zero_plan)
    counted = host_state.copy()
    counted[round_plan.STATE_ROUND] += 1  # only the round number moves
    assert state.tolist() == counted.tolist()


def test_the_served_builds_pass_the_checks_device_rounds_make_at_load() -> None:
    """elpis.exl3.round_check on the GPU, as DeviceRounds runs it: the served builds of both round kernels
    against the host on their fixed rounds (a miscompile here refuses rounds on the GPU at load; sessions
    36-37)."""
    from elpis.exl3 import round_check

    dev = torch.device("cuda")
    assert round_check.check_round_plan(round_check.gpu_plan_launch(dev)) == round_check.PLAN_ROUNDS
    assert round_check.check_round_tail(round_check.gpu_launch(dev)) >= 20
