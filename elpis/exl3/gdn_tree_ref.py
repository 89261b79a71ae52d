"""CPU references of the Gated DeltaNet tree kernel (`patches/kernels/gdn_tree.cu`): the same per-path math.

* `reference_tree` (any float dtype, float64 for checks): each row's conv window and recurrent state follow
  its ancestor path from the committed state, with `elpis.reference.layers`' conv, l2 norm and recurrent delta
  rule; a row starts from its parent's state (as `elpis.reference`'s tree verify does).
* `reference_commit`: the committed state and conv window after replaying a path.
* `emulate_fp32`: the kernel's algorithm in float32 with its orders of summation (taps in order; norms as 32
  lanes of 4 channels and an xor butterfly; each 128-long dot as 16 lanes of 8 rows k = 16i + lane and a
  butterfly), so agreement with the kernel is to the last few ulps (the kernel fuses multiply-adds).

All three run one stepping loop (`_walk`: each row from its parent's state, a path as a chain); only the
step differs, `elpis.reference`'s layers in a chosen dtype or the kernel's float32 order of summation.

Layouts are the kernel's (see its header): qkv [R, 10240] pre-conv, beta/g [R, 48], conv_weight [10240, 4],
conv_state [10240, >=4] with columns 0..3 the last inputs oldest first, state [48, 128, 128] as S[h][k][v].
`random_inputs` makes synthetic inputs of that layout for tests and timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from elpis.reference.layers import L2NORM_EPS, causal_conv, delta_rule_recurrent, l2_normalize

KEY_HEADS = 16
VALUE_HEADS = 48
HEAD_DIM = 128
CONV_DIM = 2 * KEY_HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM
TAPS = 4


def path_rows(ancestors: int) -> list[int]:
    """Root-first rows of an ancestor bitmask (parents precede children, so ascending order is root first)."""
    return [j for j in range(ancestors.bit_length()) if (ancestors >> j) & 1]


def parents_of(ancestors: Sequence[int]) -> list[int]:
    return [-1 if r == 0 else path_rows(a)[-2] for r, a in enumerate(ancestors)]


def _window_start(conv_state: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The K-1 committed inputs a conv reads (columns 1..3), token-major [3, C]."""
    return conv_state[:, 1:TAPS].t().to(dtype)


def _split_heads(activated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Conv output [T, C] -> normalised q (scaled), k per value head [T, 48, 128] and v [T, 48, 128]."""
    tokens = activated.shape[0]
    q, k, v = torch.split(activated, [KEY_HEADS * HEAD_DIM, KEY_HEADS * HEAD_DIM, VALUE_HEADS * HEAD_DIM], -1)
    group = VALUE_HEADS // KEY_HEADS
    q = l2_normalize(q.reshape(tokens, KEY_HEADS, HEAD_DIM)) * HEAD_DIM**-0.5
    k = l2_normalize(k.reshape(tokens, KEY_HEADS, HEAD_DIM))
    return (
        q.repeat_interleave(group, dim=1),
        k.repeat_interleave(group, dim=1),
        v.reshape(tokens, VALUE_HEADS, HEAD_DIM),
    )


@dataclass
class RowState:
    window: torch.Tensor  # [3, C]: the last 3 inputs along the row's path
    recurrent: torch.Tensor  # [48, 128, 128]


# One row's step from the state it starts from: (output [48, 128], the row's state after it).
Step = Callable[[RowState, int], tuple[torch.Tensor, RowState]]


def _walk(
    parents: Sequence[int], rows: Sequence[int], root: RowState, step: Step
) -> tuple[torch.Tensor, list[RowState]]:
    """The one stepping loop of both the references and the float32 emulation: input row rows[i] steps
    from the state after rows[parents[i]] (parents[i] < i; -1: from `root`, the committed state).
    Outputs [n, 48, 128] and each row's state after its step."""
    outs, after = [], []
    for i, p in enumerate(parents):
        out, state = step(root if p < 0 else after[p], rows[i])
        outs.append(out)
        after.append(state)
    return torch.stack(outs), after


def _chain(n: int) -> list[int]:
    """Parents of a path: each row steps from the one before it."""
    return list(range(-1, n - 1))


def _reference_step(
    qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, conv_weight: torch.Tensor, dtype: torch.dtype
) -> Step:
    """A step of `elpis.reference.layers`' conv, l2 norm and recurrent delta rule in `dtype`."""
    taps = conv_weight.to(dtype)

    def step(start: RowState, r: int) -> tuple[torch.Tensor, RowState]:
        activated, window = causal_conv(start.window, qkv[r : r + 1].to(dtype), taps)
        q, k, v = _split_heads(activated)
        out, recurrent = delta_rule_recurrent(
            q, k, v, g[r : r + 1].to(dtype), beta[r : r + 1].to(dtype), start.recurrent
        )
        return out[0], RowState(window, recurrent)

    return step


def reference_tree(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    ancestors: Sequence[int],
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, list[RowState]]:
    """Core outputs [R, 48, 128] in `dtype`, and each row's state after its step."""
    root = RowState(_window_start(conv_state, dtype), state.to(dtype))
    step = _reference_step(qkv, beta, g, conv_weight, dtype)
    return _walk(parents_of(ancestors), range(len(ancestors)), root, step)


def reference_commit(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    path: Sequence[int],
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(outputs [n, 48, 128], new recurrent state, new conv_state) after the input rows `path`, in order.

    The new conv_state keeps conv_state's dtype and extra columns; columns 0..3 hold the last 4 inputs."""
    rows = list(path)
    root = RowState(_window_start(conv_state, dtype), state.to(dtype))
    outs, after = _walk(_chain(len(rows)), rows, root, _reference_step(qkv, beta, g, conv_weight, dtype))
    inputs = torch.cat([conv_state[:, :TAPS].t(), qkv[rows].to(conv_state.dtype)], dim=0)
    new_conv = conv_state.clone()
    new_conv[:, :TAPS] = inputs[-TAPS:].t()
    return outs, after[-1].recurrent, new_conv


# --- the kernel's algorithm in float32 ---------------------------------------------------------------


def _butterfly(x: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """Sum over the last axis (lanes) by xor exchanges as the kernel's shuffles do; lane 0's value."""
    lanes = torch.arange(x.shape[-1], device=x.device)
    for s in strides:
        x = x + x[..., lanes ^ s]
    return x[..., 0]


def _emulate_conv(inputs: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """inputs [4, C] (oldest first) -> silu(sum_j w_j x_j) [C], taps in order."""
    acc = taps[:, 0] * inputs[0]
    for j in range(1, TAPS):
        acc = acc + taps[:, j] * inputs[j]
    return acc / (1.0 + torch.exp(-acc))


def _emulate_norm(x: torch.Tensor) -> torch.Tensor:
    """x [heads, 128]: 1 / sqrt(sum x^2 + eps) with lane l summing channels 4l..4l+3, then a butterfly."""
    sq = x.reshape(x.shape[0], 32, 4)
    ss = sq[..., 0] * sq[..., 0]
    for i in range(1, 4):
        ss = ss + sq[..., i] * sq[..., i]
    ss = _butterfly(ss, (16, 8, 4, 2, 1))
    return 1.0 / torch.sqrt(ss + torch.tensor(L2NORM_EPS, dtype=torch.float32))


def _emulate_dot(vec: torch.Tensor, st: torch.Tensor) -> torch.Tensor:
    """vec [48, 128], st [48, 128, 128] -> [48, 128]: per column 16 lanes of k = 16i + lane, a butterfly."""
    vv = vec.reshape(VALUE_HEADS, 8, 16, 1)
    ss = st.reshape(VALUE_HEADS, 8, 16, HEAD_DIM)
    part = vv[:, 0] * ss[:, 0]
    for i in range(1, 8):
        part = part + vv[:, i] * ss[:, i]
    return _butterfly(part.transpose(1, 2), (8, 4, 2, 1))


def _kernel_step(qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, conv_weight: torch.Tensor) -> Step:
    """A step of the kernel's algorithm in float32, with its orders of summation."""
    f32 = torch.float32
    taps = conv_weight.to(f32)
    group = VALUE_HEADS // KEY_HEADS
    scale = torch.tensor(HEAD_DIM**-0.5, dtype=f32)

    def step(start: RowState, r: int) -> tuple[torch.Tensor, RowState]:
        inputs = torch.cat([start.window, qkv[r : r + 1].to(f32)], dim=0)  # oldest first, this row last
        c = _emulate_conv(inputs, taps)
        q, k, v = torch.split(c, [KEY_HEADS * HEAD_DIM, KEY_HEADS * HEAD_DIM, VALUE_HEADS * HEAD_DIM])
        q = q.reshape(KEY_HEADS, HEAD_DIM)
        k = k.reshape(KEY_HEADS, HEAD_DIM)
        q = q * (_emulate_norm(q) * scale)[:, None]
        k = k * _emulate_norm(k)[:, None]
        q, k = q.repeat_interleave(group, 0), k.repeat_interleave(group, 0)
        st = start.recurrent * torch.exp(g[r].to(f32))[:, None, None]
        dot = _emulate_dot(k, st)
        delta = (v.reshape(VALUE_HEADS, HEAD_DIM) - dot) * beta[r].to(f32)[:, None]
        st = st + k[:, :, None] * delta[:, None, :]
        return _emulate_dot(q, st), RowState(inputs[1:], st)

    return step


def _kernel_root(conv_state: torch.Tensor, state: torch.Tensor) -> RowState:
    return RowState(_window_start(conv_state, torch.float32), state.to(torch.float32))


def emulate_fp32_path(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    path: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm in float32 along input rows `path` (root first): outputs [n, 48, 128] and the
    state after the last row."""
    rows = list(path)
    step = _kernel_step(qkv, beta, g, conv_weight)
    outs, after = _walk(_chain(len(rows)), rows, _kernel_root(conv_state, state), step)
    return outs, after[-1].recurrent


def emulate_fp32(
    qkv: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
    ancestors: Sequence[int],
) -> torch.Tensor:
    """Core outputs float32 [R, 48, 128] by the kernel's algorithm, each row from its parent's state."""
    step = _kernel_step(qkv, beta, g, conv_weight)
    outs, _ = _walk(parents_of(ancestors), range(len(ancestors)), _kernel_root(conv_state, state), step)
    return outs


# --- synthetic inputs ----------------------------------------------------------------------------------


@dataclass
class Inputs:
    qkv: torch.Tensor  # bf16 [n, 10240]
    beta: torch.Tensor  # bf16 [n, 48]
    g: torch.Tensor  # fp32 [n, 48]
    conv_weight: torch.Tensor  # bf16 [10240, 4]
    conv_state: torch.Tensor  # bf16 [10240, 4 + extra]
    state: torch.Tensor  # fp32 [48, 128, 128]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.qkv, self.beta, self.g, self.conv_weight, self.conv_state, self.state

    def to(self, device) -> Inputs:
        return Inputs(*(t.to(device) for t in self.tensors()))

    def clone(self) -> Inputs:
        return Inputs(*(t.clone() for t in self.tensors()))


def random_inputs(rows: int, seed: int, *, conv_columns: int = TAPS + 3) -> Inputs:
    """Inputs shaped like the real model's (decays exp(g) in about 0.4 .. 1, beta in (0, 1), a state of the
    size a long context leaves), on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, CONV_DIM, generator=gen).bfloat16()
    beta = torch.sigmoid(torch.randn(rows, VALUE_HEADS, generator=gen)).bfloat16()
    a_log = torch.rand(VALUE_HEADS, generator=gen) * 2.0 - 1.0
    g = -torch.exp(a_log) * torch.nn.functional.softplus(torch.randn(rows, VALUE_HEADS, generator=gen) - 2.0)
    conv_weight = (torch.randn(CONV_DIM, TAPS, generator=gen) * 0.5).bfloat16()
    conv_state = torch.randn(CONV_DIM, conv_columns, generator=gen).bfloat16()
    state = torch.randn(VALUE_HEADS, HEAD_DIM, HEAD_DIM, generator=gen) * 0.3
    return Inputs(qkv, beta, g.float(), conv_weight, conv_state, state.float())
