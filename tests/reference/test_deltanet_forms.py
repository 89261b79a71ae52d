"""The chunked (prefill) and recurrent (decode) forms of the gated delta rule agree to rounding."""

from __future__ import annotations

import pytest
import torch

from elpis.reference.layers import causal_conv, delta_rule_chunked, delta_rule_recurrent, l2_normalize


def _inputs(tokens: int, dtype: torch.dtype, seed: int, heads: int = 3, dk: int = 8, dv: int = 5):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(tokens, heads, dk, generator=g, dtype=dtype)) * dk**-0.5
    k = l2_normalize(torch.randn(tokens, heads, dk, generator=g, dtype=dtype))
    v = torch.randn(tokens, heads, dv, generator=g, dtype=dtype)
    decay = -torch.rand(tokens, heads, generator=g, dtype=dtype) * 3.0  # includes strong decays
    beta = torch.rand(tokens, heads, generator=g, dtype=dtype)
    state = torch.randn(heads, dk, dv, generator=g, dtype=dtype)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("tokens", [1, 2, 63, 64, 65, 200])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_chunked_equals_recurrent(tokens: int, dtype: torch.dtype, tolerance: float) -> None:
    q, k, v, decay, beta, state = _inputs(tokens, dtype, seed=tokens)
    out_r, state_r = delta_rule_recurrent(q, k, v, decay, beta, state)
    out_c, state_c = delta_rule_chunked(q, k, v, decay, beta, state)
    scale = out_r.abs().max()
    assert ((out_c - out_r).abs().max() / scale).item() < tolerance
    assert ((state_c - state_r).abs().max() / state_r.abs().max()).item() < tolerance


def test_chunk_size_does_not_matter() -> None:
    q, k, v, decay, beta, state = _inputs(100, torch.float64, seed=9)
    reference, _ = delta_rule_chunked(q, k, v, decay, beta, state, chunk=64)
    for chunk in (1, 7, 100):
        out, _ = delta_rule_chunked(q, k, v, decay, beta, state, chunk=chunk)
        assert torch.allclose(out, reference, rtol=0, atol=1e-12)


def test_delta_rule_definition() -> None:
    """One step by hand: decay, read, correct toward v with rate beta, then read with q."""
    q, k, v, decay, beta, state = _inputs(1, torch.float64, seed=3)
    out, new_state = delta_rule_recurrent(q, k, v, decay, beta, state)
    for h in range(q.shape[1]):
        s = state[h] * decay[0, h].exp()
        s = s + torch.outer(k[0, h], beta[0, h] * (v[0, h] - s.T @ k[0, h]))
        assert torch.allclose(new_state[h], s)
        assert torch.allclose(out[0, h], s.T @ q[0, h])


def test_causal_conv_stream_equals_batch() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 6, generator=g, dtype=torch.float64)
    taps = torch.randn(6, 4, generator=g, dtype=torch.float64)
    window = torch.zeros(3, 6, dtype=torch.float64)
    batch, end = causal_conv(window, x, taps)
    outs = []
    for t in range(10):
        out, window = causal_conv(window, x[t : t + 1], taps)
        outs.append(out)
    assert torch.allclose(torch.cat(outs), batch)
    assert torch.equal(window, end)
    # first output sees only x[0] through the last tap
    assert torch.allclose(batch[0], torch.nn.functional.silu(x[0] * taps[:, 3]))
