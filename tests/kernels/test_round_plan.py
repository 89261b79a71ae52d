"""GPU test of the round's plan kernel (patches/kernels/round_plan.cu) through `elpis.exl3.round_plan`: on the
GPU, from a draft block's candidates built the way the DFlash2 drafter builds them (log-softmax and top-k of
real logits, `drafter.block_candidates`), the tree, the verify's inputs and the acceptor's cells are the
host's (tests/kernels/round_plan_cases.py composes the served Python). The CPU emulation
(tests/kernels/test_round_plan_emu.py) covers the corners and the refusals.
"""

from __future__ import annotations

import random

import pytest
import torch

from elpis.accept import abi
from elpis.exl3 import gdn_tree, round_check, round_plan
from elpis.exl3.drafter import block_candidates
from tests.kernels.round_plan_cases import host_plan, random_request

pytestmark = pytest.mark.gpu

VOCAB = 248_320


def _block(gen: torch.Generator, k: int) -> torch.Tensor:
    """The drafter's packed candidates for 7 block rows of random logits (chain: a sampled token)."""
    logits = torch.randn((7, VOCAB), generator=gen, device="cuda") * 4
    chain = torch.randint(0, VOCAB, (7,), generator=gen, device="cuda")
    return block_candidates(chain, logits, k).contiguous()


@pytest.mark.parametrize("run", [8, 16])
def test_the_gpu_plans_the_hosts_tree_and_verify_inputs(run: int) -> None:
    rng = random.Random(run)
    gen = torch.Generator(device="cuda").manual_seed(run)
    dev = torch.device("cuda")
    for _ in range(40):
        k = rng.choice((1, 2, 4, 8))
        packed = _block(gen, k)
        req = random_request(rng, run, VOCAB)
        inputs = {
            "seqlens": torch.full((1,), -7, dtype=torch.int32, device=dev),
            "position": torch.full((run,), -7, dtype=torch.int32, device=dev),
            "ctx": torch.full((1,), -7, dtype=torch.int32, device=dev),
            "masks": torch.full((2 * run,), -7, dtype=torch.int32, device=dev),
            "plan": torch.full((gdn_tree.PLAN_CAPACITY,), 0xA5, dtype=torch.uint8, device=dev),
            "ids": torch.full((run,), -7, dtype=torch.int32, device=dev),
        }
        cells = torch.full((abi.TREE_CELLS,), -7, dtype=torch.int64, device=dev)
        record = torch.full((round_plan.RECORD_WORDS,), -7, dtype=torch.int32, device=dev)
        state = torch.from_numpy(req.state()).to(dev)
        round_plan.plan(packed, VOCAB, state, inputs, cells, record)
        got = round_plan.read_record(record.tolist())
        want = host_plan(packed.cpu().numpy(), run, VOCAB, req)
        # the host reports any refusal as -1, the kernel its own code: compared as the load-time check does
        values = {n: t.tolist() for n, t in inputs.items()}
        assert round_check.plan_difference(got, values, cells.cpu().numpy(), want) is None
