"""CPU checks of the Gated DeltaNet tree kernel's math and plan (patches/kernels/gdn_tree.cu).

* The float64 reference along a tree equals the recurrence stepped along each row's own path (recurrent and
  chunked forms of `elpis.reference`) and `elpis.reference`'s own tree verify of a DeltaNet layer.
* Commit replay equals committing one token at a time.
* The float32 emulation of the kernel's algorithm agrees with float64.
* The host-side visiting plan the kernel runs (bend/gdn_plan.bend compiled to build/kernels/gdn_plan.h, in
  the kernel's host code built with nvcc): every row starts from its parent's state, the on-chip stack stays
  within its 3 slots, conv taps read the path, and it is the Bend interpreter's plan.
* The kernel's own source run on the CPU (g++ and a small emulation of CUDA blocks, warps and shuffles) on
  three blocks: agrees with the references, rows are invariant, commit equals one token at a time.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import random

import pytest
import torch
import torch.nn.functional as F

from elpis import accept
from elpis.bend import gdn_plan
from elpis.exl3 import gdn_tree
from elpis.exl3 import gdn_tree_ref as ref
from elpis.paths import REPO_ROOT
from elpis.reference.config import qwen3_5_config
from elpis.reference.layers import causal_conv, delta_rule_chunked, delta_rule_recurrent
from elpis.reference.model import ReferenceModel
from elpis.reference.state import DeltaNetState
from elpis.reference.weights import DeltaNetWeights
from tests.kernels import cuda_emu
from tests.nvcc_marks import needs_nvcc

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TREES = [
    [-1],
    [-1, 0],
    [-1, 0, 1, 2, 3],  # a chain: depth beyond the conv window
    [-1, 0, 0, 1, 1, 2, 4, 6],
    [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14],
]


def _path_recurrence(inp: ref.Inputs, path: list[int], chunked: bool) -> torch.Tensor:
    """The last output of stepping the recurrence over `path` from the committed state, float64."""
    window = inp.conv_state[:, 1:4].t().double()
    activated, _ = causal_conv(window, inp.qkv[path].double(), inp.conv_weight.double())
    q, k, v = ref._split_heads(activated)
    rule = delta_rule_chunked if chunked else delta_rule_recurrent
    out, _ = rule(q, k, v, inp.g[path].double(), inp.beta[path].double(), inp.state.double())
    return out[-1]


@pytest.mark.parametrize("parents", TREES[1:4])
def test_tree_reference_equals_each_rows_path(parents: list[int]) -> None:
    inp = ref.random_inputs(len(parents), seed=len(parents))
    masks = accept.tree_masks(parents)
    out, _ = ref.reference_tree(*inp.tensors(), masks.ancestors)
    for r, a in enumerate(masks.ancestors):
        path = ref.path_rows(a)
        assert len(path) == masks.depth[r] + 1 and path[0] == 0 and path[-1] == r
        step = _path_recurrence(inp, path, chunked=False)
        assert torch.equal(out[r], step), r  # same operations in the same order
        chunk = _path_recurrence(inp, path, chunked=True)
        assert (out[r] - chunk).abs().max().item() < 1e-10, r


def test_tree_reference_equals_the_reference_models_tree_verify() -> None:
    """elpis.reference runs a tree row as one DeltaNet step from its parent's state: same layer, same rows."""
    raw = json.loads((REPO_ROOT / "elpis/assets/qwen38/text_config.json").read_text())
    config = qwen3_5_config(raw)
    parents = [-1, 0, 1, 0, 3, 4, 1]
    rows = len(parents)
    gen = torch.Generator().manual_seed(7)
    heads = config.linear_num_value_heads
    mixed = torch.randn(rows, config.conv_dim, generator=gen, dtype=torch.float64)
    b = torch.randn(rows, heads, generator=gen, dtype=torch.float64)
    a = torch.randn(rows, heads, generator=gen, dtype=torch.float64)
    conv = torch.randn(config.conv_dim, config.linear_conv_kernel_dim, generator=gen, dtype=torch.float64)
    neg_a = -torch.rand(heads, generator=gen, dtype=torch.float64) * 2
    dt_bias = torch.randn(heads, generator=gen, dtype=torch.float64)
    window = torch.randn(
        config.linear_conv_kernel_dim - 1, config.conv_dim, generator=gen, dtype=torch.float64
    )
    recurrent = torch.randn(heads, 128, 128, generator=gen, dtype=torch.float64) * 0.3
    empty = torch.empty(0)
    w = DeltaNetWeights(empty, empty, empty, empty, conv, neg_a, dt_bias, empty, empty)
    model = ReferenceModel(config, None, dtype=torch.float64, device="cpu")  # type: ignore[arg-type]
    committed = DeltaNetState(window, recurrent)
    cores, states = [], []
    for r, p in enumerate(parents):
        start = committed if p < 0 else states[p]
        core, after = model._deltanet_mix(
            w, mixed[r : r + 1], b[r : r + 1], a[r : r + 1], start, chunked=False
        )
        cores.append(core[0])
        states.append(after)

    g = neg_a * F.softplus(a + dt_bias)
    beta = torch.sigmoid(b)
    conv_state = torch.cat([torch.zeros(config.conv_dim, 1, dtype=torch.float64), window.t()], dim=1)
    ancestors = accept.tree_masks(parents).ancestors
    out, after = ref.reference_tree(mixed, beta, g, conv, conv_state, recurrent, ancestors)
    for r in range(rows):
        assert (out[r] - cores[r]).abs().max().item() < 1e-12, r
        assert (after[r].recurrent - states[r].recurrent).abs().max().item() < 1e-12, r
        assert torch.equal(after[r].window, states[r].window), r


@pytest.mark.parametrize("path", [[0], [0, 1], [0, 2, 5], [0, 1, 3, 4, 6, 7]])
def test_commit_replay_equals_one_token_at_a_time(path: list[int]) -> None:
    inp = ref.random_inputs(8, seed=3)
    outs, state, conv = ref.reference_commit(*inp.tensors(), path)
    step_state, step_conv = inp.state.double(), inp.conv_state
    for i, r in enumerate(path):
        o, step_state, step_conv = ref.reference_commit(
            inp.qkv, inp.beta, inp.g, inp.conv_weight, step_conv, step_state, [r]
        )
        assert torch.equal(o[0], outs[i])
    assert torch.equal(step_state, state)
    assert torch.equal(step_conv, conv)
    assert conv.dtype == torch.bfloat16 and torch.equal(conv[:, 4:], inp.conv_state[:, 4:])
    tail = [*[inp.conv_state[:, j] for j in range(4)], *[inp.qkv[r] for r in path]][-4:]
    assert torch.equal(conv[:, :4], torch.stack(tail, dim=1))


def test_commit_outputs_equal_the_tree_rows_on_the_path() -> None:
    parents = [-1, 0, 0, 1, 3, 2]
    inp = ref.random_inputs(len(parents), seed=11)
    out, after = ref.reference_tree(*inp.tensors(), accept.tree_masks(parents).ancestors)
    path = [0, 1, 3, 4]
    outs, state, _ = ref.reference_commit(*inp.tensors(), path)
    assert torch.equal(outs, out[path])
    assert torch.equal(state, after[4].recurrent)


@pytest.mark.parametrize("parents", [TREES[2], TREES[3]])
def test_float32_emulation_matches_float64(parents: list[int]) -> None:
    inp = ref.random_inputs(len(parents), seed=5)
    ancestors = accept.tree_masks(parents).ancestors
    want, _ = ref.reference_tree(*inp.tensors(), ancestors)
    got = ref.emulate_fp32(*inp.tensors(), ancestors)
    assert got.dtype == torch.float32
    err = (got.double() - want).abs().max().item()
    assert err < 2e-5 * max(1.0, want.abs().max().item()), err


# --- the plan (the host C function the launchers call) -----------------------------------------------


def _simulate(parents: list[int], plan: gdn_tree.Plan, slots: int) -> None:
    """Run the plan symbolically: registers and stack slots hold row ids; each row must start from its
    parent (row 0 from the committed state), every row visited once, within `slots` stack slots."""
    committed = -1
    regs = committed
    stack: dict[int, int] = {}
    seen = []
    for visit, r in enumerate(plan.order):
        start = regs if plan.load[visit] < 0 else stack[plan.load[visit]]
        if plan.load[visit] >= 0:
            assert 0 <= plan.load[visit] < slots
        assert start == parents[r], (parents, plan, visit)
        regs = r
        if plan.store[visit] >= 0:
            assert 0 <= plan.store[visit] < slots, (parents, plan)
            stack[plan.store[visit]] = r
        seen.append(r)
    assert sorted(seen) == list(range(len(parents)))
    assert plan.max_stack <= slots


def _check_src(parents: list[int], plan: gdn_tree.Plan) -> None:
    for r in range(len(parents)):
        path = [r]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        d = len(path) - 1
        want = [path[d - 3 + j] if d - 3 + j >= 0 else -1 - (4 + d - 3 + j) for j in range(4)]
        assert list(plan.src[r]) == want, (parents, r)


@needs_nvcc
def test_plan_for_every_tree_up_to_8_rows() -> None:
    slots = gdn_tree.stack_slots()
    assert slots == 3
    for rows in range(1, 9):
        for choice in itertools.product(*[range(r) for r in range(1, rows)]):
            parents = [-1, *choice]
            masks = accept.tree_masks(parents)
            plan = gdn_tree.plan(masks.depth, masks.ancestors)
            _simulate(parents, plan, slots)
            if rows <= 6:
                _check_src(parents, plan)


@needs_nvcc
def test_plan_for_16_rows_stays_within_three_slots() -> None:
    rng = random.Random(0)
    slots = gdn_tree.stack_slots()
    worst = 0
    trees = [[-1] + [rng.randrange(r) for r in range(1, 16)] for _ in range(3000)]
    trees += [[-1] + [(r - 1) // 2 for r in range(1, 16)]]  # complete binary tree (15 rows)
    trees += [[-1] + [(r - 1) // 2 for r in range(1, 15)] + [7]]
    # a 16-row tree that needs all 3 slots: root {A(7), B(8)}, A {C(3), D(3)}, C {leaf, leaf}
    needs_three = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]
    trees.append(needs_three)
    for parents in trees:
        masks = accept.tree_masks(parents)
        plan = gdn_tree.plan(masks.depth, masks.ancestors)
        _simulate(parents, plan, slots)
        _check_src(parents, plan)
        worst = max(worst, plan.max_stack)
    masks = accept.tree_masks(needs_three)
    assert gdn_tree.plan(masks.depth, masks.ancestors).max_stack == 3
    assert worst == 3


@needs_nvcc
def test_kernel_plan_is_the_bend_programs() -> None:
    """What the kernel's host code plans (through the generated header) is the Bend interpreter's plan."""
    planner = gdn_plan.Planner()
    rng = random.Random(5)
    trees = [t for rows in range(1, 6) for t in gdn_plan.every_tree(rows)]
    trees += [[-1] + [rng.randrange(r) for r in range(1, 16)] for _ in range(40)]
    for parents in trees:
        masks = accept.tree_masks(parents)
        got = gdn_tree.plan(masks.depth, masks.ancestors)
        want = planner.plan(parents)
        assert (got.order, got.load, got.store) == (want.order, want.load, want.store)
        assert got.max_stack == want.slots
        window = gdn_plan.WINDOW
        taps = tuple(tuple(c if c < window else -1 - (c - window) for c in t) for t in want.taps)
        assert got.src == taps, parents


@needs_nvcc
def test_plan_refuses_bad_masks() -> None:
    with pytest.raises(ValueError, match="row 0 must be the root"):
        gdn_tree.plan([1], [1])
    with pytest.raises(ValueError, match="rows below it"):
        gdn_tree.plan([0, 1], [1, 0b110])
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        gdn_tree.plan([], [])
    # past the Python checks: the C plan itself refuses a mask whose parent chain is inconsistent
    lib = gdn_tree._host_library()
    i32 = gdn_tree._i32
    depth, ancestors = [0, 1, 2], [0b1, 0b11, 0b101]  # row 2 claims depth 2 but its parent 0 has depth 0
    got = lib.elpis_gdn_tree_plan(
        3,
        i32(depth),
        gdn_tree._u32(ancestors),
        None,
        i32([0] * 16),
        i32([0] * 16),
        i32([0] * 16),
        i32([0] * 64),
    )
    assert got == -2


def test_gpu_entry_points_refuse_cpu_tensors() -> None:
    inp = ref.random_inputs(2, seed=1)
    masks = accept.tree_masks([-1, 0])
    with pytest.raises(ValueError, match="qkv must be on a CUDA device"):
        gdn_tree.gdn_tree_verify(*inp.tensors(), masks.depth, masks.ancestors)
    with pytest.raises(ValueError, match="qkv must be on a CUDA device"):
        gdn_tree.gdn_tree_commit(*inp.tensors(), [0, 1])


# --- the kernel's own source, run on the CPU ----------------------------------------------------------
# gdn_tree.cu compiled by g++ against the CUDA emulation of tests/kernels/cuda_emu.py; the emulated launch
# runs chosen blocks of the main kernel (all of them would take minutes) and every block of the conv
# commit. This checks the kernel's indexing, plan use, commit and invariance before any GPU run.

EMU_BLOCKS = [(0, 0), (7, 47), (3, 25)]  # (value-column slice, value head): first, last, a middle one


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    build = tmp_path_factory.mktemp("gdn_emu")
    lib = gdn_tree.bind(cuda_emu.build_emulated(gdn_tree.SOURCE, build, launches=5, needs=(gdn_plan.HEADER,)))
    lib.emu_set_blocks(len(EMU_BLOCKS), gdn_tree._i32([v for b in EMU_BLOCKS for v in b]))
    return lib


TOKEN_MAJOR = (ref.CONV_DIM, 1)  # qkv's (row, channel) strides as random_inputs makes it


def _channel_major(qkv: torch.Tensor) -> torch.Tensor:
    """qkv copied into a channel-major [10240, 16] buffer (its rows in the first columns, junk after), as
    ExLlamaV3's layer casts the projection for its conv; the kernel reads it with strides (1, 16)."""
    buffer = torch.randn(ref.CONV_DIM, 16).bfloat16()
    buffer[:, : qkv.shape[0]] = qkv.t()
    return buffer


def _emu_verify(
    lib, inp: ref.Inputs, parents: list[int], qkv: torch.Tensor | None = None, layout=TOKEN_MAJOR
) -> tuple[torch.Tensor, torch.Tensor]:
    masks = accept.tree_masks(parents)
    rows = len(parents)
    out = torch.full((rows, ref.VALUE_HEADS, ref.HEAD_DIM), float("nan"))
    out_bf16 = torch.zeros((rows, ref.VALUE_HEADS, ref.HEAD_DIM), dtype=torch.bfloat16)
    err = lib.elpis_gdn_tree_verify(
        (inp.qkv if qkv is None else qkv).data_ptr(), *layout, inp.beta.data_ptr(), inp.g.data_ptr(),
        inp.conv_weight.data_ptr(), inp.conv_state.data_ptr(), inp.conv_state.shape[1], inp.state.data_ptr(),
        rows, gdn_tree._i32(masks.depth), gdn_tree._u32(masks.ancestors), out.data_ptr(), out_bf16.data_ptr(),
        None,
    )  # fmt: skip
    assert err == 0
    return out, out_bf16


def _emu_commit(
    lib,
    inp: ref.Inputs,
    conv: torch.Tensor,
    state: torch.Tensor,
    path: list[int],
    qkv: torch.Tensor | None = None,
    layout=TOKEN_MAJOR,
) -> None:
    err = lib.elpis_gdn_tree_commit(
        (inp.qkv if qkv is None else qkv).data_ptr(), *layout, inp.beta.data_ptr(), inp.g.data_ptr(),
        inp.conv_weight.data_ptr(), conv.data_ptr(), conv.shape[1], state.data_ptr(), len(path),
        gdn_tree._i32(path), None, None, None,
    )  # fmt: skip
    assert err == 0


def _emu_columns(x: torch.Tensor) -> list[torch.Tensor]:
    """The parts of [..., 48, 128] that the emulated blocks computed."""
    return [x[..., h, s * 16 : (s + 1) * 16] for s, h in EMU_BLOCKS]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_emu_columns(a), _emu_columns(b), strict=True))


@pytest.mark.slow
def test_kernel_source_on_the_cpu_matches_references(emulated) -> None:
    stack3 = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]  # parks 3 states at once
    for parents in ([-1, 0, 0, 1, 2], TREES[4], stack3):
        inp = ref.random_inputs(len(parents), seed=len(parents))
        ancestors = accept.tree_masks(parents).ancestors
        out, out_bf16 = _emu_verify(emulated, inp, parents)
        want, _ = ref.reference_tree(*inp.tensors(), ancestors)
        emu = ref.emulate_fp32(*inp.tensors(), ancestors)
        for got, w, e in zip(_emu_columns(out), _emu_columns(want), _emu_columns(emu), strict=True):
            assert (got.double() - w).abs().max().item() < 1e-6
            assert (got - e).abs().max().item() < 1e-6
        assert _same(out_bf16, out.bfloat16())


@pytest.mark.slow
def test_kernel_source_on_the_cpu_is_row_invariant_and_commits_exactly(emulated) -> None:
    parents = TREES[4]
    inp = ref.random_inputs(16, seed=300)
    out, _ = _emu_verify(emulated, inp, parents)
    # renumbered rows (a different visiting order and stack use)
    order = [0, 9, 1, 10, 11, 2, 12, 14, 3, 13, 15, 4, 5, 6, 7, 8]
    new = {old: i for i, old in enumerate(order)}
    renumbered = [-1] + [new[parents[old]] for old in order[1:]]
    perm = torch.tensor(order)
    moved = ref.Inputs(inp.qkv[perm].contiguous(), inp.beta[perm].contiguous(), inp.g[perm].contiguous(),
                       inp.conv_weight, inp.conv_state, inp.state)  # fmt: skip
    assert _same(_emu_verify(emulated, moved, renumbered)[0], out[perm])
    for r in (13, 8):
        path = ref.path_rows(accept.tree_masks(parents).ancestors[r])
        state, conv = inp.state.clone(), inp.conv_state.clone()
        _emu_commit(emulated, inp, conv, state, path[:-1])
        step_state, step_conv = inp.state.clone(), inp.conv_state.clone()
        for x in path[:-1]:
            _emu_commit(emulated, inp, step_conv, step_state, [x])
        assert _same(state, step_state) and torch.equal(conv, step_conv)
        _, _, want_conv = ref.reference_commit(*inp.tensors(), path[:-1])
        assert torch.equal(conv, want_conv)
        one = ref.Inputs(inp.qkv[r : r + 1].contiguous(), inp.beta[r : r + 1].contiguous(),
                         inp.g[r : r + 1].contiguous(), inp.conv_weight, conv, state)  # fmt: skip
        assert _same(_emu_verify(emulated, one, [-1])[0][0], out[r])


def test_graph_form_reads_the_plan_from_memory(emulated) -> None:
    """The graph form of the verify (the packed plan read from memory) gives the bits of the ordinary one."""
    parents = [-1, 0, 1, 0, 3, 1]
    masks = accept.tree_masks(parents)
    inp = ref.random_inputs(len(parents), seed=77)
    want, want_bf16 = _emu_verify(emulated, inp, parents)
    packed = gdn_tree.packed_plan(tuple(masks.depth), tuple(masks.ancestors))
    plan = torch.zeros(gdn_tree.PLAN_CAPACITY, dtype=torch.uint8)
    plan[: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    out = torch.full_like(want, float("nan"))
    out_bf16 = torch.zeros_like(want_bf16)
    err = emulated.elpis_gdn_tree_verify_dev(
        inp.qkv.data_ptr(), *TOKEN_MAJOR, inp.beta.data_ptr(), inp.g.data_ptr(), inp.conv_weight.data_ptr(),
        inp.conv_state.data_ptr(), inp.conv_state.shape[1], inp.state.data_ptr(), len(parents),
        plan.data_ptr(), out.data_ptr(), out_bf16.data_ptr(), None,
    )  # fmt: skip
    assert err == 0
    assert _same(out, want) and _same(out_bf16, want_bf16)


def test_graph_form_of_the_commit_reads_the_plan_from_memory(emulated) -> None:
    """The graph form of the commit (the path's packed plan read from memory) advances the state and the
    conv window exactly as the ordinary commit does."""
    parents = [-1, 0, 1, 0, 3, 4, 2]
    inp = ref.random_inputs(len(parents), seed=78)
    for path in ([0], [0, 3, 4], [0, 3, 4, 5], [0, 1, 2, 6]):
        state, conv = inp.state.clone(), inp.conv_state.clone()
        _emu_commit(emulated, inp, conv, state, path)
        packed = gdn_tree.packed_commit_plan(tuple(path))
        plan = torch.zeros(gdn_tree.PLAN_CAPACITY, dtype=torch.uint8)
        plan[: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
        graph_state, graph_conv = inp.state.clone(), inp.conv_state.clone()
        err = emulated.elpis_gdn_tree_commit_dev(
            inp.qkv.data_ptr(), *TOKEN_MAJOR, inp.beta.data_ptr(), inp.g.data_ptr(),
            inp.conv_weight.data_ptr(), graph_conv.data_ptr(), graph_conv.shape[1], graph_state.data_ptr(),
            plan.data_ptr(), None,
        )  # fmt: skip
        assert err == 0
        assert _same(graph_state, state) and torch.equal(graph_conv, conv), f"path {path}"
    with pytest.raises(ValueError, match="distinct"):
        gdn_tree.packed_commit_plan((0, 1, 1))


def test_kernel_source_on_the_cpu_reads_channel_major_qkv_in_place(emulated) -> None:
    """The projection as ExLlamaV3's layer casts it for its conv ([10240, rows] bf16), read in place through
    the layout: the verify's and the commit's bits are the token-major input's."""
    parents = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]  # parks 3 states at once
    inp = ref.random_inputs(len(parents), seed=301)
    buffer = _channel_major(inp.qkv)
    token = _emu_verify(emulated, inp, parents)
    channel = _emu_verify(emulated, inp, parents, qkv=buffer, layout=(1, 16))
    assert _same(token[0], channel[0]) and _same(token[1], channel[1])
    path = [0, 1, 4, 6]
    state, conv = inp.state.clone(), inp.conv_state.clone()
    _emu_commit(emulated, inp, conv, state, path)
    state_c, conv_c = inp.state.clone(), inp.conv_state.clone()
    _emu_commit(emulated, inp, conv_c, state_c, path, qkv=buffer, layout=(1, 16))
    assert _same(state, state_c) and torch.equal(conv, conv_c) and not _same(state, inp.state)
