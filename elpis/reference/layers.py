"""The math of one layer, as plain functions over tensors (no state objects, no architecture names).

Conventions: activations are [tokens, ...] in the compute dtype; weights are [out, in] as checkpoints store
them. Every function is out-of-place, so a state tensor handed in is never modified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6  # fixed by the Gated DeltaNet definition (FLA), independent of rms_norm_eps
DELTA_CHUNK = 64


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


# --- rotary position embedding -------------------------------------------------------------------------


def inverse_frequencies(rotary_dim: int, theta: float) -> torch.Tensor:
    """float32, computed the way every implementation (and so the trained model) computes it."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] for integer positions.

    The angle position * inv_freq is formed in float64: a float32 product loses up to 0.4% of the angle
    at position 1e5, and the result then depends only on the position, never on how a batch was formed.
    """
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(device=positions.device, dtype=torch.float64)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; rotates the first rotary_dim features of each head (rotate-half pairing)."""
    rotary = cos.shape[-1]
    rot, rest = x[..., :rotary], x[..., rotary:]
    half = rotary // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


# --- full attention --------------------------------------------------------------------------------------


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor | None
) -> torch.Tensor:
    """Softmax attention with grouped K/V heads.

    q [T, heads, d], keys/values [N, kv_heads, d] (a view of the cache is fine), visible [T, N] bool or None
    (all visible). Returns [T, heads * d].
    """
    tokens, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(tokens, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3)  # [kv, group, T, d]
    scores = torch.matmul(grouped, keys.permute(1, 2, 0).unsqueeze(1)) * dim**-0.5  # [kv, group, T, N]
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, values.permute(1, 0, 2).unsqueeze(1))  # [kv, group, T, d]
    return out.permute(2, 0, 1, 3).reshape(tokens, heads * dim)


# --- Gated DeltaNet --------------------------------------------------------------------------------------


def causal_conv(
    window_start: torch.Tensor, mixed: torch.Tensor, taps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution + SiLU.

    window_start [K-1, C]: the K-1 inputs before `mixed` [T, C]; taps [C, K]. Returns the activated output
    [T, C] and the new window (the last K-1 inputs). Output t = sum_j taps[:, j] * input[t - (K-1) + j].
    """
    kernel = taps.shape[1]
    extended = torch.cat([window_start, mixed], dim=0)
    tokens = mixed.shape[0]
    acc = extended[0:tokens] * taps[:, 0]
    for j in range(1, kernel):
        acc = acc + extended[j : j + tokens] * taps[:, j]
    return F.silu(acc), extended[extended.shape[0] - (kernel - 1) :]


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule one token at a time.

    q, k [T, H, dk] (normalised; q pre-scaled), v [T, H, dv], g (log decay) and beta [T, H],
    state [H, dk, dv]. Per token: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q.
    """
    outputs = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        remembered = (state * k[t][:, :, None]).sum(dim=-2)  # S^T k, [H, dv]
        delta = (v[t] - remembered) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        outputs.append((state * q[t][:, :, None]).sum(dim=-2))
    return torch.stack(outputs), state


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = DELTA_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, a chunk of tokens at a time (equal to delta_rule_recurrent up to rounding).

    Within a chunk with start state S0 and cumulative log decay c_t (G_t = exp(c_t)):
        S_t = G_t S0 + sum_{s<=t} (G_t / G_s) k_s u_s^T
    where the pseudo-values u solve the unit lower-triangular system
        u_t + beta_t sum_{s<t} (G_t / G_s) (k_t . k_s) u_s = beta_t (v_t - G_t S0^T k_t),
    so o_t = G_t S0^T q_t + sum_{s<=t} (G_t / G_s) (q_t . k_s) u_s and the chunk's end state follows.
    """
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, d]
    gh, bh = g.transpose(0, 1), beta.transpose(0, 1)  # [H, T]
    outputs = []
    for start in range(0, q.shape[0], chunk):
        qc, kc, vc = qh[:, start : start + chunk], kh[:, start : start + chunk], vh[:, start : start + chunk]
        bc = bh[:, start : start + chunk]
        # Cumulative log decay in float64: differences of large sums would otherwise cancel badly.
        cum = gh[:, start : start + chunk].to(torch.float64).cumsum(dim=-1)  # [H, C]
        size = cum.shape[-1]
        causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        # G_t / G_s for s <= t (formed in log space, masked before exp so nothing overflows)
        ratio = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp().to(q.dtype)
        system = (bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * ratio).tril(-1)
        system = system + torch.eye(size, dtype=q.dtype, device=q.device)
        decay = cum.exp().to(q.dtype)[:, :, None]  # G_t
        rhs = bc[:, :, None] * (vc - decay * (kc @ state))
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        outputs.append(decay * (qc @ state) + ((qc @ kc.transpose(-1, -2)) * ratio) @ u)
        to_end = (cum[:, -1:] - cum).exp().to(q.dtype)[:, :, None]  # G_C / G_s
        state = cum[:, -1].exp().to(q.dtype)[:, None, None] * state + (kc * to_end).transpose(-1, -2) @ u
    return torch.cat(outputs, dim=1).transpose(0, 1), state


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return scale * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * F.silu(gate)
