"""The Gated DeltaNet tree kernel (patches/kernels/gdn_tree.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py, at the real head geometry. Only a few (value-column slice, value head) blocks of
the 8 x 48 grid run (emu_set_blocks), spread over the key heads; the conv-window commit runs whole. exp and
log are the CPU's, so the bits are not the GPU's: the checks are the float64 reference within the GPU tests'
bound, and bitwise row invariance of the kernel's own code (a row's output is the same in any tree that
gives it the same path, and after a commit of part of its path). The GPU's bits: test_gdn_tree.py.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from elpis import accept
from elpis.exl3 import gdn_tree as gt
from elpis.exl3 import gdn_tree_ref as ref
from tests.kernels import cuda_emu

BLOCKS = ((0, 0), (7, 17), (3, 47), (5, 30))  # (slice of 16 value columns, value head)
CHAIN16 = list(range(-1, 15))
WIDE16 = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 12, 2, 14]
STACK3 = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]  # parks 3 states at once (the bound)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    built = cuda_emu.build_emulated(
        gt.SOURCE, tmp_path_factory.mktemp("gdn_tree_emu"), launches=5, needs=("gdn_plan.h",)
    )
    xy = [v for block in BLOCKS for v in block]
    built.emu_set_blocks(len(BLOCKS), (ctypes.c_int * len(xy))(*xy))
    return gt.bind(built)


def _ran(t: torch.Tensor) -> torch.Tensor:
    """The emulated blocks' part of [rows, 48, 128]: [rows, blocks, 16]."""
    return torch.stack([t[:, head, 16 * s : 16 * s + 16] for s, head in BLOCKS], dim=1)


def _qkv(inp: ref.Inputs, channel_major: bool) -> tuple[torch.Tensor, int, int]:
    """qkv as the kernel reads it, with its row and channel strides: token-major as it is, or copied into a
    channel-major [10240, 16] buffer (the input rows in its first columns, the rest junk)."""
    if not channel_major:
        return inp.qkv, gt.CONV_DIM, 1
    buffer = torch.randn(gt.CONV_DIM, 16).bfloat16()
    buffer[:, : inp.qkv.shape[0]] = inp.qkv.t()
    return buffer, 1, 16


def _verify(
    lib: ctypes.CDLL, inp: ref.Inputs, parents: list[int], channel_major: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    m = accept.tree_masks(parents)
    rows = len(parents)
    out = torch.full((rows, 48, 128), float("nan"))
    out_bf16 = torch.zeros((rows, 48, 128), dtype=torch.bfloat16)
    _, beta, g, weight, conv, state = inp.tensors()
    qkv, row_stride, channel_stride = _qkv(inp, channel_major)
    err = lib.elpis_gdn_tree_verify(
        qkv.data_ptr(), row_stride, channel_stride, beta.data_ptr(), g.data_ptr(), weight.data_ptr(),
        conv.data_ptr(), conv.shape[1],
        state.data_ptr(), rows, (ctypes.c_int32 * rows)(*m.depth), (ctypes.c_uint32 * rows)(*m.ancestors),
        out.data_ptr(), out_bf16.data_ptr(), None,
    )  # fmt: skip
    assert err == 0
    assert not _ran(out).isnan().any(), "every emulated block writes its columns of every row"
    return _ran(out), _ran(out_bf16)


def _commit(lib: ctypes.CDLL, inp: ref.Inputs, path: list[int], channel_major: bool = False) -> None:
    _, beta, g, weight, conv, state = inp.tensors()
    qkv, row_stride, channel_stride = _qkv(inp, channel_major)
    err = lib.elpis_gdn_tree_commit(
        qkv.data_ptr(), row_stride, channel_stride, beta.data_ptr(), g.data_ptr(), weight.data_ptr(),
        conv.data_ptr(), conv.shape[1],
        state.data_ptr(), len(path), (ctypes.c_int32 * len(path))(*path), None, None, None,
    )  # fmt: skip
    assert err == 0


def _path(parents: list[int], r: int) -> list[int]:
    path = [r]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _rows(inp: ref.Inputs, rows: list[int]) -> ref.Inputs:
    """The inputs with rows `rows` (in that order) as a call's input rows; the states as they are."""
    return ref.Inputs(inp.qkv[rows], inp.beta[rows], inp.g[rows], inp.conv_weight, inp.conv_state, inp.state)


@pytest.mark.parametrize(
    "parents",
    [[-1], [-1, 0, 0, 1, 2], CHAIN16, WIDE16, STACK3],
    ids=["rows1", "rows5", "chain16", "wide16", "stack3"],
)
def test_matches_float64(lib: ctypes.CDLL, parents: list[int]) -> None:
    inp = ref.random_inputs(len(parents), seed=len(parents))
    before = inp.clone()
    out, out_bf16 = _verify(lib, inp, parents)
    assert all(torch.equal(a, b) for a, b in zip(inp.tensors(), before.tensors(), strict=True))
    want, _ = ref.reference_tree(*inp.tensors(), accept.tree_masks(parents).ancestors)
    want = _ran(want)
    err = (out.double() - want).abs().max().item()
    assert err < 2e-5 * max(1.0, want.abs().max().item()), err
    assert torch.equal(out_bf16, out.bfloat16())


@pytest.mark.parametrize("parents", [WIDE16, STACK3], ids=["wide", "stack3"])
def test_a_row_is_its_paths_chain_bit_for_bit(lib: ctypes.CDLL, parents: list[int]) -> None:
    # the same input rows along a row's path, as a chain call of their own: the same bits, whatever the tree
    # around the row, the visiting order or where its ancestors' states were parked
    inp = ref.random_inputs(len(parents), seed=11)
    out, _ = _verify(lib, inp, parents)
    for r in (3, 7, 10, 15):
        path = _path(parents, r)
        chain, _ = _verify(lib, _rows(inp, path), list(range(-1, len(path) - 1)))
        assert torch.equal(chain[-1], out[r]), r


def test_a_commit_leaves_the_state_its_rows_lead_to(lib: ctypes.CDLL) -> None:
    # committing a path's first rows, then verifying the rest as a chain from the committed state, gives the
    # bits the whole chain gives from the state before
    inp = ref.random_inputs(6, seed=12)
    whole, _ = _verify(lib, inp, list(range(-1, 5)))
    committed = inp.clone()
    _commit(lib, committed, [0, 1, 2])
    assert not torch.equal(committed.conv_state, inp.conv_state)
    rest, _ = _verify(lib, _rows(committed, [3, 4, 5]), [-1, 0, 1])
    assert torch.equal(rest, whole[3:])


def test_channel_major_input_gives_the_same_bits(lib: ctypes.CDLL) -> None:
    # the projection as ExLlamaV3's layer leaves it for its conv ([10240, rows] bf16), read in place
    inp = ref.random_inputs(len(STACK3), seed=13)
    token = _verify(lib, inp, STACK3)
    channel = _verify(lib, inp, STACK3, channel_major=True)
    assert all(torch.equal(a, b) for a, b in zip(token, channel, strict=True))
    by_token, by_channel = inp.clone(), inp.clone()
    _commit(lib, by_token, [0, 1, 4, 6])
    _commit(lib, by_channel, [0, 1, 4, 6], channel_major=True)
    assert torch.equal(by_token.conv_state, by_channel.conv_state)
    assert torch.equal(by_token.state, by_channel.state)
    assert not torch.equal(by_token.state, inp.state)
