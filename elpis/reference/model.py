"""The forward pass: prefill a run of tokens, and verify a token tree (every row's logits in one call).

Exactness. A *decode step* is one token at [1, hidden] through every layer: attention over the cache view
`[:position + 1]`, DeltaNet from its parent state with the recurrent rule. Tree verify in exact mode runs
each row as exactly that step (the ancestors' K/V placed in the cache slots they would occupy after
committing them), so a row's logits and state are bit-identical to plain decoding of its path and do not
depend on the other rows; commit copies those states, so the committed state is bit-identical to decoding
the tokens one by one. The batched mode (one matmul per weight for all rows, attention masked to each
row's ancestors) agrees to rounding only. Prefill (batched, chunked DeltaNet) agrees with decoding to
rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from elpis.reference.config import ModelConfig
from elpis.reference.layers import (
    apply_rope,
    attend,
    causal_conv,
    delta_rule_chunked,
    delta_rule_recurrent,
    gated_rms_norm,
    inverse_frequencies,
    l2_normalize,
    mlp,
    rms_norm,
    rope_tables,
)
from elpis.reference.state import DeltaNetState, KVCache, SequenceState
from elpis.reference.weights import AttentionWeights, DeltaNetWeights, ModelWeights

PREFILL_CHUNK = 512


@dataclass
class TreeRows:
    """What one verify computed, kept until commit: each row's K/V and DeltaNet state per layer."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    base: int  # committed length when verified
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [rows, kv_heads, head_dim]
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    deltanet: dict[int, list[DeltaNetState]] = field(default_factory=dict)  # layer -> state after each row


def tree_depths(parents: Sequence[int]) -> list[int]:
    depths: list[int] = []
    for r, p in enumerate(parents):
        depths.append(0 if r == 0 else depths[p] + 1)
    return depths


def ancestor_mask(parents: Sequence[int], device) -> torch.Tensor:
    """[R, R] bool: entry (r, j) is true iff j is r or an ancestor of r."""
    rows = len(parents)
    mask = torch.zeros(rows, rows, dtype=torch.bool, device=device)
    for r in range(rows):
        mask[r, r] = True
        if r > 0:
            mask[r] |= mask[parents[r]]
    return mask


class ReferenceModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, *, dtype: torch.dtype, device) -> None:
        self.config = config
        self.weights = weights
        self.dtype = dtype
        self.device = torch.device(device)
        self.inv_freq = inverse_frequencies(config.rotary_dim, config.rope_theta)

    # --- state ---------------------------------------------------------------------------------------

    def new_state(self, capacity: int = 256) -> SequenceState:
        c = self.config
        layers: list[KVCache | DeltaNetState] = []
        for w in self.weights.layers:
            if isinstance(w.mixer, AttentionWeights):
                layers.append(
                    KVCache.empty(capacity, c.num_key_value_heads, c.head_dim, self.dtype, self.device)
                )
            else:
                window = torch.zeros(
                    c.linear_conv_kernel_dim - 1, c.conv_dim, dtype=self.dtype, device=self.device
                )
                recurrent = torch.zeros(
                    c.linear_num_value_heads,
                    c.linear_key_head_dim,
                    c.linear_value_head_dim,
                    dtype=self.dtype,
                    device=self.device,
                )
                layers.append(DeltaNetState(window, recurrent))
        return SequenceState(layers)

    # --- sublayers -----------------------------------------------------------------------------------

    def _attention_inputs(self, w: AttentionWeights, h: torch.Tensor, positions: torch.Tensor):
        c = self.config
        tokens = h.shape[0]
        if c.attn_output_gate:
            both = F.linear(h, w.q).view(tokens, c.num_attention_heads, 2 * c.head_dim)
            q, gate = both[..., : c.head_dim], both[..., c.head_dim :].reshape(tokens, -1)
        else:
            q, gate = F.linear(h, w.q).view(tokens, c.num_attention_heads, c.head_dim), None
        k = F.linear(h, w.k).view(tokens, c.num_key_value_heads, c.head_dim)
        v = F.linear(h, w.v).view(tokens, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = rms_norm(q, w.q_norm, c.rms_norm_eps), rms_norm(k, w.k_norm, c.rms_norm_eps)
        cos, sin = rope_tables(positions, self.inv_freq, self.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate

    @staticmethod
    def _attention_output(
        w: AttentionWeights, attended: torch.Tensor, gate: torch.Tensor | None
    ) -> torch.Tensor:
        if gate is not None:
            attended = attended * torch.sigmoid(gate)
        return F.linear(attended, w.o)

    def _deltanet_mix(
        self,
        w: DeltaNetWeights,
        mixed: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        start: DeltaNetState,
        chunked: bool,
    ) -> tuple[torch.Tensor, DeltaNetState]:
        """Conv + delta rule for [T] tokens after `start`; returns the core output [T, v_heads, v_dim]."""
        c = self.config
        tokens = mixed.shape[0]
        activated, window = causal_conv(start.window, mixed, w.conv)
        q, k, v = torch.split(activated, [c.linear_key_dim, c.linear_key_dim, c.linear_value_dim], dim=-1)
        repeat = c.linear_num_value_heads // c.linear_num_key_heads
        q = l2_normalize(q.reshape(tokens, c.linear_num_key_heads, c.linear_key_head_dim))
        q = (q * c.linear_key_head_dim**-0.5).repeat_interleave(repeat, dim=1)
        k = l2_normalize(k.reshape(tokens, c.linear_num_key_heads, c.linear_key_head_dim))
        k = k.repeat_interleave(repeat, dim=1)
        v = v.reshape(tokens, c.linear_num_value_heads, c.linear_value_head_dim)
        g = w.neg_a * F.softplus(a + w.dt_bias)
        beta = torch.sigmoid(b)
        rule = delta_rule_chunked if chunked else delta_rule_recurrent
        core, recurrent = rule(q, k, v, g, beta, start.recurrent)
        return core, DeltaNetState(window, recurrent)

    def _deltanet_output(self, w: DeltaNetWeights, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        normed = gated_rms_norm(core, z.view_as(core), w.norm, self.config.rms_norm_eps)
        return F.linear(normed.reshape(core.shape[0], -1), w.out)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(x, self.weights.final_norm, self.config.rms_norm_eps), self.weights.head)

    def _embed(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.weights.embed[torch.tensor(list(tokens), dtype=torch.long, device=self.device)]

    # --- prefill -------------------------------------------------------------------------------------

    def prefill(
        self, state: SequenceState, tokens: Sequence[int], *, logits: str | None = None
    ) -> torch.Tensor | None:
        """Run `tokens` after the state's tokens. logits: None, "last" ([1, V]) or "all" ([T, V])."""
        collected = []
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            x = self._prefill_chunk(state, chunk)
            if logits == "all" or (logits == "last" and start + PREFILL_CHUNK >= len(tokens)):
                collected.append(self._logits(x if logits == "all" else x[-1:]))
        return torch.cat(collected) if collected else None

    def _prefill_chunk(self, state: SequenceState, tokens: Sequence[int]) -> torch.Tensor:
        c = self.config
        base, count = len(state.tokens), len(tokens)
        positions = torch.arange(base, base + count, device=self.device)
        # query i (at base + i) sees keys 0 .. base + i
        visible = torch.arange(base + count, device=self.device)[None, :] <= positions[:, None]
        x = self._embed(tokens)
        for i, w in enumerate(self.weights.layers):
            h = rms_norm(x, w.input_norm, c.rms_norm_eps)
            layer_state = state.layers[i]
            if isinstance(layer_state, KVCache):
                q, k, v, gate = self._attention_inputs(w.mixer, h, positions)
                layer_state.reserve(base + count)
                layer_state.keys[base : base + count] = k
                layer_state.values[base : base + count] = v
                layer_state.length = base + count
                attended = attend(
                    q, layer_state.keys[: base + count], layer_state.values[: base + count], visible
                )
                out = self._attention_output(w.mixer, attended, gate)
            else:
                m = w.mixer
                mixed, z = F.linear(h, m.qkv), F.linear(h, m.z)
                core, state.layers[i] = self._deltanet_mix(
                    m, mixed, F.linear(h, m.b), F.linear(h, m.a), layer_state, chunked=True
                )
                out = self._deltanet_output(m, core, z)
            x = x + out
            x = x + mlp(rms_norm(x, w.post_norm, c.rms_norm_eps), w.mlp.gate, w.mlp.up, w.mlp.down)
        state.tokens.extend(tokens)
        return x

    # --- tree verify ---------------------------------------------------------------------------------

    def verify(
        self, state: SequenceState, tokens: Sequence[int], parents: Sequence[int], *, exact_rows: bool = True
    ) -> tuple[torch.Tensor, TreeRows]:
        """Logits [R, V] (compute dtype) of every row, and the per-row states for commit()."""
        tree = TreeRows(list(tokens), list(parents), tree_depths(parents), len(state.tokens))
        for i, layer_state in enumerate(state.layers):
            if isinstance(layer_state, KVCache):
                layer_state.reserve(
                    tree.base + max(tree.depths) + 1 if exact_rows else tree.base + len(tokens)
                )
            else:
                tree.deltanet[i] = []
        if exact_rows:
            logits = torch.cat([self._verify_row(state, tree, r) for r in range(len(tokens))])
        else:
            logits = self._verify_batched(state, tree)
        return logits, tree

    def _verify_row(self, state: SequenceState, tree: TreeRows, row: int) -> torch.Tensor:
        """One decode step for `row`, with its ancestors standing in the cache where commit would put them."""
        c = self.config
        path = []  # ancestors of row, root first
        node = tree.parents[row]
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        path.reverse()
        slot = tree.base + tree.depths[row]
        positions = torch.tensor([slot], device=self.device)
        x = self._embed([tree.tokens[row]])
        for i, w in enumerate(self.weights.layers):
            h = rms_norm(x, w.input_norm, c.rms_norm_eps)
            layer_state = state.layers[i]
            if isinstance(layer_state, KVCache):
                q, k, v, gate = self._attention_inputs(w.mixer, h, positions)
                if row == 0:
                    tree.keys[i], tree.values[i] = k, v
                else:
                    tree.keys[i] = torch.cat([tree.keys[i], k])
                    tree.values[i] = torch.cat([tree.values[i], v])
                if path:
                    layer_state.keys[tree.base : slot] = tree.keys[i][path]
                    layer_state.values[tree.base : slot] = tree.values[i][path]
                layer_state.keys[slot] = k[0]
                layer_state.values[slot] = v[0]
                attended = attend(q, layer_state.keys[: slot + 1], layer_state.values[: slot + 1], None)
                out = self._attention_output(w.mixer, attended, gate)
            else:
                m = w.mixer
                start = layer_state if row == 0 else tree.deltanet[i][tree.parents[row]]
                mixed, z = F.linear(h, m.qkv), F.linear(h, m.z)
                core, after = self._deltanet_mix(
                    m, mixed, F.linear(h, m.b), F.linear(h, m.a), start, chunked=False
                )
                tree.deltanet[i].append(after)
                out = self._deltanet_output(m, core, z)
            x = x + out
            x = x + mlp(rms_norm(x, w.post_norm, c.rms_norm_eps), w.mlp.gate, w.mlp.up, w.mlp.down)
        return self._logits(x)

    def _verify_batched(self, state: SequenceState, tree: TreeRows) -> torch.Tensor:
        c = self.config
        rows, base = len(tree.tokens), tree.base
        positions = torch.tensor([base + d for d in tree.depths], device=self.device)
        visible = torch.cat(
            [
                torch.ones(rows, base, dtype=torch.bool, device=self.device),
                ancestor_mask(tree.parents, self.device),
            ],
            dim=1,
        )
        x = self._embed(tree.tokens)
        for i, w in enumerate(self.weights.layers):
            h = rms_norm(x, w.input_norm, c.rms_norm_eps)
            layer_state = state.layers[i]
            if isinstance(layer_state, KVCache):
                q, k, v, gate = self._attention_inputs(w.mixer, h, positions)
                tree.keys[i], tree.values[i] = k, v
                layer_state.keys[base : base + rows] = k
                layer_state.values[base : base + rows] = v
                attended = attend(
                    q, layer_state.keys[: base + rows], layer_state.values[: base + rows], visible
                )
                out = self._attention_output(w.mixer, attended, gate)
            else:
                m = w.mixer
                mixed, z, b, a = F.linear(h, m.qkv), F.linear(h, m.z), F.linear(h, m.b), F.linear(h, m.a)
                cores = []
                for r in range(rows):
                    start = layer_state if r == 0 else tree.deltanet[i][tree.parents[r]]
                    core, after = self._deltanet_mix(
                        m, mixed[r : r + 1], b[r : r + 1], a[r : r + 1], start, chunked=False
                    )
                    cores.append(core)
                    tree.deltanet[i].append(after)
                out = self._deltanet_output(m, torch.cat(cores), z)
            x = x + out
            x = x + mlp(rms_norm(x, w.post_norm, c.rms_norm_eps), w.mlp.gate, w.mlp.up, w.mlp.down)
        return self._logits(x)

    def commit(self, state: SequenceState, tree: TreeRows, rows: Sequence[int]) -> None:
        """Make `state` the state after the tokens of `rows` (a root-first path of `tree`), in order."""
        if len(state.tokens) != tree.base:
            raise RuntimeError("the state moved since this tree was verified")
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        end = tree.base + len(rows)
        for i, layer_state in enumerate(state.layers):
            if isinstance(layer_state, KVCache):
                layer_state.reserve(end)
                layer_state.keys[tree.base : end] = tree.keys[i][index]
                layer_state.values[tree.base : end] = tree.values[i][index]
                layer_state.length = end
            else:
                state.layers[i] = tree.deltanet[i][rows[-1]]
        state.tokens.extend(tree.tokens[r] for r in rows)
