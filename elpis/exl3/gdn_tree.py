"""Python entry to the Gated DeltaNet tree kernel (`patches/kernels/gdn_tree.cu`).

`gdn_tree_verify(...)` runs the causal conv and the gated delta rule of every tree row along its own
ancestor path from the committed state (depth and ancestor bitmasks from `elpis.accept.tree_masks`),
without a per-row copy of the recurrent state; `gdn_tree_commit(...)` replays the accepted path (<= 16 rows)
from the committed state and rewrites the fp32 recurrent state and the conv window in place, with the same
arithmetic, so the state after a commit is bit-identical to committing one token at a time. Layouts are in
the kernel's header comment.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device
pointers on the current stream. `plan(depth, ancestors)` exposes the host-side visiting plan (the same C
function the launchers use) and works without a GPU. That plan is the proved Bend program
`bend/gdn_plan.bend`, compiled by `make build` to `build/kernels/gdn_plan.h` (`elpis.bend.gdn_plan`), which
the kernel source includes; the C glue around it only validates the masks and maps rows to input rows.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from elpis import nvcc
from elpis.exl3.tensors import check_tensor
from elpis.exl3.tree_attention import check_masks
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "gdn_tree.cu"
KEY_HEADS = 16
VALUE_HEADS = 48
HEAD_DIM = 128
CONV_DIM = 2 * KEY_HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM  # 10240: [q | k | v]
TAPS = 4
MAX_ROWS = 16

PLAN_ERRORS = {
    -1: "row count out of range",
    -2: "masks do not describe a tree rooted at row 0 with parents before children",
    -3: "an input row index is out of range",
    -4: "the on-chip state stack would overflow",
}


@dataclass(frozen=True)
class Plan:
    order: tuple[int, ...]  # visiting order of the rows
    load: tuple[int, ...]  # per visit: stack slot of the parent's state, -1 = the state just computed
    store: tuple[int, ...]  # per visit: stack slot the row's state is parked in, -1 = none
    src: tuple[tuple[int, ...], ...]  # per row, per tap: input row >= 0, or -1 - committed conv column
    max_stack: int


_I32, _U32, _VP = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
# ctypes signatures of the library's C entries (a CPU test checks them against the kernel source)
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_gdn_tree_plan": (_U32, _VP, _VP, _VP, _VP, _VP, _VP, _VP),
    "elpis_gdn_tree_stack_slots": (),
    "elpis_gdn_tree_verify": (_VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _VP, _U32, _VP, _VP, _VP, _VP, _VP),
    "elpis_gdn_tree_commit": (_VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _VP, _U32, _VP, _VP, _VP, _VP),
    "elpis_gdn_tree_plan_pack": (_U32, _VP, _VP, _VP, _U32),
    "elpis_gdn_tree_verify_dev": (_VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _VP, _U32, _VP, _VP, _VP, _VP),
    "elpis_gdn_tree_commit_plan_pack": (_U32, _VP, _VP, _U32),
    "elpis_gdn_tree_commit_dev": (_VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _VP, _VP, _VP),
}
PLAN_CAPACITY = 256  # bytes reserved for a packed plan (the C struct is about 110)


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every entry of a build (GPU or emulated)."""
    return nvcc.set_signatures(lib, ENTRY_ARGS)


def _load_library(arch: str | None = None) -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE, arch=arch) if arch else nvcc.load(SOURCE))


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return _load_library()


@lru_cache(maxsize=1)
def _host_library() -> ctypes.CDLL:
    """For the host-side plan: the GPU's build when there is a GPU, else the sm_86 build (its host code
    runs on a machine without a GPU)."""
    import torch

    return _library() if torch.cuda.is_available() else _load_library("sm_86")


def _i32(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int32 * max(1, len(values)))(*values)


def _u32(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_uint32 * max(1, len(values)))(*values)


@lru_cache(maxsize=256)
def _tree_arrays(depth: tuple[int, ...], ancestors: tuple[int, ...]) -> tuple[ctypes.Array, ctypes.Array]:
    """Checked masks as C arrays, cached: the engine calls every GDN layer with the same tree."""
    check_masks(depth, ancestors)
    return _i32(depth), _u32(ancestors)


def plan(depth: Sequence[int], ancestors: Sequence[int], *, lib: ctypes.CDLL | None = None) -> Plan:
    """The kernel's visiting plan for a tree (tree_masks output); raises ValueError on a bad tree."""
    check_masks(depth, ancestors)
    lib = lib or _host_library()
    rows = len(depth)
    order, load, store, src = _i32([0] * MAX_ROWS), _i32([0] * MAX_ROWS), _i32([0] * MAX_ROWS), _i32([0] * 64)
    got = lib.elpis_gdn_tree_plan(rows, _i32(depth), _u32(ancestors), None, order, load, store, src)
    if got < 0:
        raise ValueError(f"gdn tree plan refused: {PLAN_ERRORS.get(got, got)}")
    return Plan(
        tuple(order[:rows]),
        tuple(load[:rows]),
        tuple(store[:rows]),
        tuple(tuple(src[TAPS * r : TAPS * r + TAPS]) for r in range(rows)),
        int(got),
    )


@lru_cache(maxsize=256)
def packed_plan(depth: tuple[int, ...], ancestors: tuple[int, ...]) -> bytes:
    """The plan of a tree as the bytes `gdn_tree_verify_graph` reads from device memory."""
    check_masks(depth, ancestors)
    buf = (ctypes.c_uint8 * PLAN_CAPACITY)()
    lib = _host_library()
    got = lib.elpis_gdn_tree_plan_pack(len(depth), _i32(depth), _u32(ancestors), buf, PLAN_CAPACITY)
    if got < 0:
        raise ValueError(f"gdn tree plan refused: {PLAN_ERRORS.get(got, got)}")
    return bytes(buf)[:got]


@lru_cache(maxsize=1024)
def packed_commit_plan(path: tuple[int, ...]) -> bytes:
    """The plan of a commit along `path` (input rows, root first): the bytes `gdn_tree_commit_graph` reads."""
    rows = list(path)
    if not 1 <= len(rows) <= MAX_ROWS or len(set(rows)) != len(rows):
        raise ValueError(f"path must have 1..{MAX_ROWS} distinct rows, got {rows}")
    if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < MAX_ROWS for r in rows):
        raise ValueError(f"path rows must be input row indices 0..{MAX_ROWS - 1}, got {rows}")
    buf = (ctypes.c_uint8 * PLAN_CAPACITY)()
    got = _host_library().elpis_gdn_tree_commit_plan_pack(len(rows), _i32(rows), buf, PLAN_CAPACITY)
    if got < 0:
        raise ValueError(f"gdn tree commit plan refused: {PLAN_ERRORS.get(got, got)}")
    return bytes(buf)[:got]


def stack_slots() -> int:
    return int(_host_library().elpis_gdn_tree_stack_slots())


def channel_major(qkv: torch.Tensor) -> bool:
    """Whether the kernel reads `qkv` in place as channel-major: a bf16 CUDA [n, 10240] view that is the
    transpose of a contiguous [10240, >= n] buffer (how ExLlamaV3's layer casts the projection for its
    conv)."""
    import torch

    return (
        qkv.dim() == 2 and qkv.shape[1] == CONV_DIM and qkv.stride() == (1, qkv.stride(1))
        and qkv.stride(1) >= qkv.shape[0] and qkv.is_cuda and qkv.dtype == torch.bfloat16
    )  # fmt: skip


def qkv_layout(qkv: torch.Tensor) -> tuple[int, int]:
    """(row stride, channel stride) in elements of a qkv [n, 10240] bf16 CUDA tensor the kernel reads:
    token-major (contiguous) or `channel_major`. ValueError for any other layout."""
    import torch

    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if channel_major(qkv):
        return 1, qkv.stride(1)
    check_tensor("qkv", qkv, torch.bfloat16, (None, CONV_DIM))
    return CONV_DIM, 1


def _check_inputs(qkv, beta, g, conv_weight, conv_state, state) -> tuple[int, tuple[int, int]]:
    """Validate the shared inputs; returns the number of input rows and qkv's layout (`qkv_layout`)."""
    import torch

    layout = qkv_layout(qkv)
    n_in = qkv.shape[0]
    if not 1 <= n_in <= MAX_ROWS:
        raise ValueError(f"qkv must have 1..{MAX_ROWS} rows, got {n_in}")
    check_tensor("beta", beta, torch.bfloat16, (n_in, VALUE_HEADS))
    check_tensor("g", g, torch.float32, (n_in, VALUE_HEADS))
    check_tensor("conv_weight", conv_weight, torch.bfloat16, (CONV_DIM, TAPS))
    check_tensor("conv_state", conv_state, torch.bfloat16, (CONV_DIM, None))
    if conv_state.shape[1] < TAPS:
        raise ValueError(f"conv_state must have at least {TAPS} columns, got {conv_state.shape[1]}")
    check_tensor("state", state, torch.float32, (VALUE_HEADS, HEAD_DIM, HEAD_DIM))
    tensors = (qkv, beta, g, conv_weight, conv_state, state)
    if len({t.device for t in tensors}) != 1:
        raise ValueError("qkv, beta, g, conv_weight, conv_state and state must be on the same device")
    return n_in, layout


def _outputs(rows: int, device, want_f32: bool, want_bf16: bool):
    import torch

    if not (want_f32 or want_bf16):
        return None, None
    shape = (rows, VALUE_HEADS, HEAD_DIM)
    out = torch.empty(shape, dtype=torch.float32, device=device) if want_f32 else None
    out_bf16 = torch.empty(shape, dtype=torch.bfloat16, device=device) if want_bf16 else None
    return out, out_bf16


def _raise_on(err: int, what: str) -> None:
    if err < 0:
        raise RuntimeError(f"gdn tree {what}: plan refused: {PLAN_ERRORS.get(err, err)}")
    if err > 0:
        raise RuntimeError(f"gdn tree {what}: CUDA error {err}")


def gdn_tree_verify(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    depth: Sequence[int],
    ancestors: Sequence[int],
    *,
    bf16_out: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Core outputs fp32 [R, 48, 128] of R tree rows (and bf16 ones with `bf16_out`).

    qkv bf16 [R, 10240] (pre-conv; token-major or channel-major, `qkv_layout`), beta bf16 [R, 48],
    g fp32 [R, 48], conv_weight bf16 [10240, 4], conv_state bf16 [10240, >=4] (columns 0..3: the last
    inputs, oldest first), state fp32 [48, 128, 128].
    Neither state is modified.
    """
    import torch

    rows = len(depth)
    depth_arr, ancestors_arr = _tree_arrays(tuple(depth), tuple(ancestors))
    n_in, layout = _check_inputs(qkv, beta, g, conv_weight, conv_state, state)
    if n_in != rows:
        raise ValueError(f"the tree has {rows} rows but qkv has {n_in}")
    out, out_bf16 = _outputs(rows, qkv.device, True, bf16_out)
    stream = torch.cuda.current_stream(qkv.device).cuda_stream
    err = _library().elpis_gdn_tree_verify(
        qkv.data_ptr(), *layout, beta.data_ptr(), g.data_ptr(), conv_weight.data_ptr(),
        conv_state.data_ptr(), conv_state.shape[1], state.data_ptr(), rows, depth_arr, ancestors_arr,
        out.data_ptr(), out_bf16.data_ptr() if out_bf16 is not None else None, stream,
    )  # fmt: skip
    _raise_on(err, "verify")
    return (out, out_bf16) if out_bf16 is not None else out


def _check_plan_dev(plan_dev: torch.Tensor, qkv: torch.Tensor) -> None:
    """A graph form's plan buffer: uint8 [PLAN_CAPACITY] on qkv's device."""
    import torch

    check_tensor("plan_dev", plan_dev, torch.uint8, (PLAN_CAPACITY,))
    if plan_dev.device != qkv.device:
        raise ValueError("plan_dev must be on qkv's device")


def gdn_tree_verify_graph(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    plan_dev: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gdn_tree_verify(..., bf16_out=True)` in the form a CUDA graph can capture: the tree's plan
    (`packed_plan`, uint8 [PLAN_CAPACITY] on the device) is read when the kernel runs, so one captured launch
    serves every tree of qkv's row count. The caller fills `plan_dev` with the plan of a tree of that many
    rows. Same arithmetic as `gdn_tree_verify`."""
    import torch

    rows, layout = _check_inputs(qkv, beta, g, conv_weight, conv_state, state)
    _check_plan_dev(plan_dev, qkv)
    out, out_bf16 = _outputs(rows, qkv.device, True, True)
    err = _library().elpis_gdn_tree_verify_dev(
        qkv.data_ptr(), *layout, beta.data_ptr(), g.data_ptr(), conv_weight.data_ptr(),
        conv_state.data_ptr(), conv_state.shape[1], state.data_ptr(), rows, plan_dev.data_ptr(),
        out.data_ptr(), out_bf16.data_ptr(), torch.cuda.current_stream(qkv.device).cuda_stream,
    )  # fmt: skip
    _raise_on(err, "verify (graph form)")
    return out, out_bf16


def gdn_tree_commit(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    path: Sequence[int],
    *,
    outputs: bool = False,
) -> torch.Tensor | None:
    """Advance `state` and `conv_state` in place by the input rows `path` (root first: the accepted rows,
    `accept.tree(...).rows`). With `outputs`, also returns the path rows' core outputs fp32 [n, 48, 128]."""
    import torch

    n_in, layout = _check_inputs(qkv, beta, g, conv_weight, conv_state, state)
    rows = list(path)
    if not 1 <= len(rows) <= MAX_ROWS:
        raise ValueError(f"path must have 1..{MAX_ROWS} rows, got {len(rows)}")
    for r in rows:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n_in:
            raise ValueError(f"path row {r!r} is not an input row index in 0..{n_in - 1}")
    if len(set(rows)) != len(rows):
        raise ValueError(f"path rows must be distinct, got {rows}")
    out, _ = _outputs(len(rows), qkv.device, outputs, False)
    stream = torch.cuda.current_stream(qkv.device).cuda_stream
    err = _library().elpis_gdn_tree_commit(
        qkv.data_ptr(), *layout, beta.data_ptr(), g.data_ptr(), conv_weight.data_ptr(),
        conv_state.data_ptr(), conv_state.shape[1], state.data_ptr(), len(rows), _i32(rows),
        out.data_ptr() if out is not None else None, None, stream,
    )  # fmt: skip
    _raise_on(err, "commit")
    return out


def gdn_tree_commit_graph(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    plan_dev: torch.Tensor,
) -> None:
    """`gdn_tree_commit` in the form a CUDA graph can capture: the path's plan (`packed_commit_plan`, uint8
    [PLAN_CAPACITY] on the device) is read when the kernels run, so one captured launch serves every path.
    Same arithmetic as `gdn_tree_commit`; `state` and `conv_state` are advanced in place."""
    import torch

    _, layout = _check_inputs(qkv, beta, g, conv_weight, conv_state, state)
    _check_plan_dev(plan_dev, qkv)
    err = _library().elpis_gdn_tree_commit_dev(
        qkv.data_ptr(), *layout, beta.data_ptr(), g.data_ptr(), conv_weight.data_ptr(),
        conv_state.data_ptr(), conv_state.shape[1], state.data_ptr(), plan_dev.data_ptr(),
        torch.cuda.current_stream(qkv.device).cuda_stream,
    )  # fmt: skip
    _raise_on(err, "commit (graph form)")
