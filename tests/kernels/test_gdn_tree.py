"""GPU tests of the Gated DeltaNet tree kernel (patches/kernels/gdn_tree.cu) at the real head geometry.

Accuracy against float64 and the float32 emulation of its algorithm (max errors recorded); bitwise row
invariance: renumbered rows, rewritten siblings, the path inside another tree, every row against a 1-row
call at the state after its first d path tokens; commit bitwise equal to committing one token at a time;
refusals of bad inputs; a timing line. Results go to $ELPIS_KERNEL_LOG (JSON lines) when set.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
from pathlib import Path

import pytest
import torch

from elpis import accept
from elpis.exl3 import gdn_tree as gt
from elpis.exl3 import gdn_tree_ref as ref
from tests.kernels.timing import graph_us, median_us

pytestmark = pytest.mark.gpu

CHAIN16 = list(range(-1, 15))
WIDE16 = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14]
BUSHY16 = [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10]
STACK3 = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]  # parks 3 states at once (the bound)


def _log(record: dict) -> None:
    path = os.environ.get("ELPIS_KERNEL_LOG")
    line = json.dumps({"test": "gdn_tree", **record}, sort_keys=True)
    print(line)
    if path:
        with Path(path).open("a") as fh:
            fh.write(line + "\n")


def _trees() -> list[list[int]]:
    rng = random.Random(1)
    out = [[-1], [-1, 0], [-1, 0, 0, 1, 2]]
    out += [[-1] + [rng.randrange(r) for r in range(1, rows)] for rows in (8, 12, 16)]
    return [*out, CHAIN16, WIDE16, BUSHY16, STACK3]


def _inputs(rows: int, seed: int) -> ref.Inputs:
    return ref.random_inputs(rows, seed).to("cuda")


def _verify(inp: ref.Inputs, parents: list[int]) -> torch.Tensor:
    m = accept.tree_masks(parents)
    return gt.gdn_tree_verify(*inp.tensors(), m.depth, m.ancestors)


def _path(parents: list[int], r: int) -> list[int]:
    path = [r]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("parents", _trees(), ids=lambda p: f"rows{len(p)}")
def test_matches_float64(parents: list[int]) -> None:
    inp = _inputs(len(parents), seed=len(parents))
    before = inp.clone()
    m = accept.tree_masks(parents)
    out, out_bf16 = gt.gdn_tree_verify(*inp.tensors(), m.depth, m.ancestors, bf16_out=True)
    assert all(torch.equal(a, b) for a, b in zip(inp.tensors(), before.tensors(), strict=True))
    want, _ = ref.reference_tree(*inp.tensors(), m.ancestors)
    scale = max(1.0, want.abs().max().item())
    err = (out.double() - want).abs().max().item()
    _log({"check": "float64", "rows": len(parents), "max_abs_err": err, "max_abs_ref": scale})
    assert err < 2e-5 * scale, err
    assert torch.equal(out_bf16, out.bfloat16())


@pytest.mark.parametrize("parents", [[-1, 0, 0, 1, 2, 3, 3, 6], WIDE16], ids=["rows8", "rows16"])
def test_matches_float32_emulation(parents: list[int]) -> None:
    inp = _inputs(len(parents), seed=3)
    out = _verify(inp, parents)
    emu = ref.emulate_fp32(*inp.tensors(), accept.tree_masks(parents).ancestors)
    err = (out - emu).abs().max().item()
    _log({"check": "fp32_emulation", "rows": len(parents), "max_abs_err": err})
    assert err < 1e-5 * max(1.0, emu.abs().max().item()), err


def test_every_row_count_matches_float64() -> None:
    rng = random.Random(2)
    worst = 0.0
    for rows in range(1, 17):
        parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
        inp = _inputs(rows, seed=700 + rows)
        out = _verify(inp, parents)
        want, _ = ref.reference_tree(*inp.tensors(), accept.tree_masks(parents).ancestors)
        err = (out.double() - want).abs().max().item()
        assert err < 2e-5 * max(1.0, want.abs().max().item()), (rows, err)
        worst = max(worst, err)
    _log({"check": "float64_rows_1_to_16", "max_abs_err": worst})


@pytest.mark.parametrize("parents", _trees()[2:], ids=lambda p: f"rows{len(p)}")
def test_renumbered_rows_are_bit_identical(parents: list[int]) -> None:
    rows = len(parents)
    inp = _inputs(rows, seed=rows + 100)
    out = _verify(inp, parents)
    rng = random.Random(rows)
    # a random order with parents before children (root stays first)
    order, ready = [0], [c for c in range(rows) if parents[c] == 0]
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        ready += [c for c in range(rows) if parents[c] == node]
    new = {old: i for i, old in enumerate(order)}
    new_parents = [-1] + [new[parents[old]] for old in order[1:]]
    perm = torch.tensor(order, device=inp.qkv.device)
    moved = ref.Inputs(inp.qkv[perm].contiguous(), inp.beta[perm].contiguous(), inp.g[perm].contiguous(),
                       inp.conv_weight, inp.conv_state, inp.state)  # fmt: skip
    out2 = _verify(moved, new_parents)
    assert torch.equal(out2, out[perm])


@pytest.mark.parametrize(
    "parents", [WIDE16, BUSHY16, [-1, 0, 1, 0, 3, 3]], ids=["wide16", "bushy16", "rows6"]
)
def test_rewritten_siblings_leave_a_row_unchanged(parents: list[int]) -> None:
    rows = len(parents)
    inp = _inputs(rows, seed=rows + 200)
    out = _verify(inp, parents)
    for r in (rows - 1, rows // 2):
        keep = set(_path(parents, r))
        other = inp.clone()
        noise = ref.random_inputs(rows, seed=999 + r).to("cuda")
        for j in range(rows):
            if j not in keep:
                other.qkv[j], other.beta[j], other.g[j] = noise.qkv[j], noise.beta[j], noise.g[j]
        out2 = _verify(other, parents)
        unaffected = [j for j in range(rows) if set(_path(parents, j)) <= keep]
        assert r in unaffected
        for j in unaffected:
            assert torch.equal(out2[j], out[j]), (r, j)


def test_the_path_in_another_tree_is_bit_identical() -> None:
    parents = WIDE16
    inp = _inputs(16, seed=300)
    out = _verify(inp, parents)
    rng = random.Random(5)
    for r in (8, 13, 15, 0):
        path = _path(parents, r)
        for size in (len(path), 16):
            # place the path at increasing random rows of a new random tree, chained
            spots = (
                sorted(rng.sample(range(1, size), len(path) - 1))
                if size > len(path)
                else list(range(1, size))
            )
            spots = [0, *spots]
            new_parents = [-1] + [rng.randrange(i) for i in range(1, size)]
            for a, b in itertools.pairwise(spots):
                new_parents[b] = a
            noise = ref.random_inputs(size, seed=400 + r + size).to("cuda")
            other = ref.Inputs(noise.qkv, noise.beta, noise.g, inp.conv_weight, inp.conv_state, inp.state)
            for old, spot in zip(path, spots, strict=True):
                other.qkv[spot], other.beta[spot], other.g[spot] = inp.qkv[old], inp.beta[old], inp.g[old]
            out2 = _verify(other, new_parents)
            assert torch.equal(out2[spots[-1]], out[r]), (r, size)


@pytest.mark.parametrize("parents", [WIDE16, BUSHY16, STACK3], ids=["wide16", "bushy16", "stack3"])
def test_each_row_equals_a_one_row_call_after_its_path(parents: list[int]) -> None:
    inp = _inputs(16, seed=500)
    out = _verify(inp, parents)
    for r in range(16):
        path = _path(parents, r)
        state, conv = inp.state.clone(), inp.conv_state.clone()
        if len(path) > 1:
            gt.gdn_tree_commit(inp.qkv, inp.beta, inp.g, inp.conv_weight, conv, state, path[:-1])
        one = ref.Inputs(inp.qkv[r : r + 1].contiguous(), inp.beta[r : r + 1].contiguous(),
                         inp.g[r : r + 1].contiguous(), inp.conv_weight, conv, state)  # fmt: skip
        assert torch.equal(_verify(one, [-1])[0], out[r]), r


@pytest.mark.parametrize("path", [[0], [0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7], list(range(16)), [0, 3, 5, 9]])
def test_commit_equals_one_token_at_a_time(path: list[int]) -> None:
    inp = _inputs(16, seed=600 + len(path))
    parents = list(range(-1, 15))
    tree_out = _verify(inp, parents)
    state, conv = inp.state.clone(), inp.conv_state.clone()
    outs = gt.gdn_tree_commit(inp.qkv, inp.beta, inp.g, inp.conv_weight, conv, state, path, outputs=True)
    step_state, step_conv = inp.state.clone(), inp.conv_state.clone()
    for r in path:
        gt.gdn_tree_commit(inp.qkv, inp.beta, inp.g, inp.conv_weight, step_conv, step_state, [r])
    assert torch.equal(state, step_state)
    assert torch.equal(conv, step_conv)
    assert torch.equal(conv[:, 4:], inp.conv_state[:, 4:])
    if path == list(range(len(path))):  # a prefix of the chain tree: commit outputs are its rows
        assert torch.equal(outs, tree_out[: len(path)])
    want_out, want_state, want_conv = ref.reference_commit(*inp.tensors(), path)
    assert torch.equal(conv, want_conv)
    err = (state.double() - want_state).abs().max().item()
    _log({"check": "commit_float64", "rows": len(path), "state_max_abs_err": err})
    assert err < 2e-5 * max(1.0, want_state.abs().max().item()), err
    assert (outs.double() - want_out).abs().max().item() < 2e-5 * max(1.0, want_out.abs().max().item())


def _fill_plan(plan_dev: torch.Tensor, packed: bytes) -> None:
    """A graph form's plan buffer holding `packed`, zero after it."""
    plan_dev.zero_()
    plan_dev[: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8).cuda()


def test_a_zero_plan_commits_nothing() -> None:
    """The round's decision kernel (patches/kernels/round_tail.cu) hands a round it refuses the no-op commit
    inputs: a zero plan. Through the graph form of the commit, that leaves the state and the conv window
    bitwise as they were, while a real plan in the same buffer does commit."""
    inp = _inputs(16, seed=700)
    state, conv = inp.state.clone(), inp.conv_state.clone()
    plan = torch.zeros((gt.PLAN_CAPACITY,), dtype=torch.uint8, device="cuda")
    gt.gdn_tree_commit_graph(inp.qkv, inp.beta, inp.g, inp.conv_weight, conv, state, plan)
    torch.cuda.synchronize()
    assert torch.equal(state, inp.state) and torch.equal(conv, inp.conv_state)
    _fill_plan(plan, gt.packed_commit_plan((0, 1)))
    gt.gdn_tree_commit_graph(inp.qkv, inp.beta, inp.g, inp.conv_weight, conv, state, plan)
    want_state, want_conv = inp.state.clone(), inp.conv_state.clone()
    gt.gdn_tree_commit(inp.qkv, inp.beta, inp.g, inp.conv_weight, want_conv, want_state, [0, 1])
    assert torch.equal(state, want_state) and torch.equal(conv, want_conv)
    assert not torch.equal(state, inp.state)


def test_channel_major_qkv_gives_the_same_bits() -> None:
    """The projection as ExLlamaV3's layer casts it for its conv ([10240, rows] bf16, here with junk columns
    past the rows) read in place: every entry, eager and graph forms, gives the token-major input's bits."""
    parents = STACK3
    inp = _inputs(len(parents), seed=701)
    buffer = torch.randn(gt.CONV_DIM, 16, device="cuda").bfloat16()
    buffer[:, : len(parents)] = inp.qkv.t()
    channel = buffer.t()[: len(parents)]
    assert gt.qkv_layout(channel) == (1, 16) and gt.qkv_layout(inp.qkv) == (gt.CONV_DIM, 1)
    m = accept.tree_masks(parents)
    token_out = gt.gdn_tree_verify(*inp.tensors(), m.depth, m.ancestors, bf16_out=True)
    channel_out = gt.gdn_tree_verify(channel, *inp.tensors()[1:], m.depth, m.ancestors, bf16_out=True)
    assert all(torch.equal(a, b) for a, b in zip(token_out, channel_out, strict=True))
    plan_dev = torch.zeros((gt.PLAN_CAPACITY,), dtype=torch.uint8, device="cuda")
    _fill_plan(plan_dev, gt.packed_plan(tuple(m.depth), tuple(m.ancestors)))
    graph_out = gt.gdn_tree_verify_graph(channel, *inp.tensors()[1:], plan_dev)
    assert all(torch.equal(a, b) for a, b in zip(token_out, graph_out, strict=True))
    path = _path(parents, len(parents) - 1)
    by_token, by_channel, by_graph = inp.clone(), inp.clone(), inp.clone()
    gt.gdn_tree_commit(*by_token.tensors(), path)
    gt.gdn_tree_commit(channel, *by_channel.tensors()[1:], path)
    _fill_plan(plan_dev, gt.packed_commit_plan(tuple(path)))
    gt.gdn_tree_commit_graph(channel, *by_graph.tensors()[1:], plan_dev)
    for other in (by_channel, by_graph):
        assert torch.equal(other.state, by_token.state) and torch.equal(other.conv_state, by_token.conv_state)


def test_bad_inputs_are_refused() -> None:
    inp = _inputs(4, seed=7)
    m = accept.tree_masks([-1, 0, 1, 1])
    with pytest.raises(ValueError, match=r"qkv must be torch\.bfloat16"):
        gt.gdn_tree_verify(inp.qkv.float(), *inp.tensors()[1:], m.depth, m.ancestors)
    with pytest.raises(ValueError, match="the tree has 3 rows but qkv has 4"):
        gt.gdn_tree_verify(*inp.tensors(), m.depth[:3], m.ancestors[:3])
    with pytest.raises(ValueError, match="state must have shape"):
        gt.gdn_tree_verify(*inp.tensors()[:5], inp.state[:8].contiguous(), m.depth, m.ancestors)
    with pytest.raises(ValueError, match="conv_state must have at least 4 columns"):
        gt.gdn_tree_verify(
            *inp.tensors()[:4], inp.conv_state[:, :3].contiguous(), inp.state, m.depth, m.ancestors
        )
    with pytest.raises(ValueError, match="rows below it"):
        gt.gdn_tree_verify(*inp.tensors(), m.depth, [1, 3, 0b1100, 0b1011])
    with pytest.raises(ValueError, match="path row 4"):
        gt.gdn_tree_commit(*inp.tensors(), [0, 4])
    with pytest.raises(ValueError, match="distinct"):
        gt.gdn_tree_commit(*inp.tensors(), [0, 1, 1])


def test_timing_line() -> None:
    record: dict = {"check": "timing", "layer": "one GDN layer, 48x128x128 fp32 state", "unit": "us/call"}
    for rows in (8, 16):
        parents = BUSHY16[:rows] if rows == 16 else [-1, 0, 0, 1, 1, 2, 3, 4]
        inp = _inputs(rows, seed=rows)
        m = accept.tree_masks(parents)
        verify = functools.partial(gt.gdn_tree_verify, *inp.tensors(), m.depth, m.ancestors)
        path = _path(parents, rows - 1)
        commit = functools.partial(gt.gdn_tree_commit, *inp.clone().tensors(), path)
        record[f"verify_rows{rows}_host_median_us"] = round(median_us(verify), 2)
        record[f"commit_path{len(path)}_host_median_us"] = round(median_us(commit), 2)
        try:
            record[f"verify_rows{rows}_graph_us"] = round(graph_us(verify), 2)
            record[f"commit_path{len(path)}_graph_us"] = round(graph_us(commit), 2)
        except Exception as exc:  # keep the host-timed numbers; say why the graph ones are missing
            record[f"graph_rows{rows}_error"] = str(exc)[:200]
    record["device"] = torch.cuda.get_device_name()
    _log(record)
    assert record["verify_rows16_host_median_us"] > 0
