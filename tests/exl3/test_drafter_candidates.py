"""`elpis.exl3.drafter.pack_candidates` and `unpack_candidates`: the DFlash2 drafter's candidates per depth,
read back from the draft's tensors in one transfer, equal what reading each tensor back separately gives
(the drafter's previous read-back), on CPU tensors shaped like the GPU's."""

from __future__ import annotations

import pytest
import torch

from elpis.exl3.drafter import EXACT_FLOAT32_IDS, pack_candidates, unpack_candidates

VOCAB = 248_320


def candidates(chain, chain_lp, top_ids, top_lp) -> list[list[tuple[int, float]]]:
    """The drafter's read-back: packed on the device, one transfer, unpacked on the host."""
    return unpack_candidates(pack_candidates(chain, chain_lp, top_ids, top_lp).tolist(), top_ids.shape[1])


def separate_read_back(chain, chain_lp, top_ids, top_lp) -> list[list[tuple[int, float]]]:
    """Each tensor read back on its own (four host syncs), as the drafter did before."""
    k = top_ids.shape[1]
    chain_l, chain_lp_l, ids_l, lps_l = chain.tolist(), chain_lp.tolist(), top_ids.tolist(), top_lp.tolist()
    rows = []
    for d in range(len(chain_l)):
        row = [(int(chain_l[d]), min(0.0, float(chain_lp_l[d])))]
        for token, lp in zip(ids_l[d], lps_l[d], strict=True):
            if len(row) == k:
                break
            if token != row[0][0]:
                row.append((int(token), min(0.0, float(lp))))
        rows.append(row)
    return rows


def draft(depth: int, k: int, seed: int, chain_in_top: bool):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((depth, VOCAB), generator=gen) * 4
    logits[:, VOCAB - 1] = 30.0  # the largest id is a candidate everywhere
    logprobs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logprobs, k, dim=-1)
    chain = top.indices[:, 1] if chain_in_top else torch.randint(0, VOCAB, (depth,), generator=gen)
    chain_lp = logprobs.gather(1, chain[:, None])[:, 0]
    return chain, chain_lp, top.indices, top.values


@pytest.mark.parametrize(
    ("depth", "k", "chain_in_top"), [(7, 1, False), (7, 4, True), (3, 16, False), (1, 2, True)]
)
def test_one_read_back_equals_separate_read_backs(depth: int, k: int, chain_in_top: bool) -> None:
    tensors = draft(depth, k, seed=depth * 100 + k, chain_in_top=chain_in_top)
    got = candidates(*tensors)
    assert got == separate_read_back(*tensors)
    assert all(len(row) == k and row[0][0] == int(c) for row, c in zip(got, tensors[0], strict=True))
    assert all(lp <= 0.0 for row in got for _, lp in row)


def test_no_depth_gives_no_candidates() -> None:
    empty = torch.zeros((0,), dtype=torch.long)
    assert candidates(empty, empty.float(), torch.zeros((0, 4), dtype=torch.long), torch.zeros((0, 4))) == []


def test_mismatched_shapes_and_unreadable_ids_are_refused() -> None:
    chain, chain_lp, ids, lps = draft(4, 3, seed=1, chain_in_top=True)
    with pytest.raises(ValueError, match="disagree"):
        candidates(chain[:3], chain_lp, ids, lps)
    with pytest.raises(ValueError, match="cannot be read back"):
        candidates(torch.full_like(chain, EXACT_FLOAT32_IDS), chain_lp, ids, lps)
    with pytest.raises(ValueError, match="a packed row of"):
        unpack_candidates(pack_candidates(chain, chain_lp, ids, lps).tolist(), 4)
