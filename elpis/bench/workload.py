"""The benchmark's workload and its arithmetic: prompts, context checkpoints, bytes a round must read and
FLOPs a prefill must do (from the checkpoint geometry, not from measurements), so every timing can also be
stated as a fraction of the hardware limit measured in the same run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from elpis.exl3 import geometry

CHECKPOINTS = (1024, 8192, 32768, 131072, 262000)
# issue 8's comparison: stock chain-8 against elpis chain-8 and tree mode with 8- and 16-row trees
TREE_CHECKPOINTS = (1024, 8192, 32768, 131072)
CHAIN_ROWS = 8  # rows of a chain round (stock's draft window 7 + the anchor)
TREE_BUDGETS = {"elpis-tree8": 8, "elpis-tree16": 16}  # tree systems: rows per tree, anchor included
ELPIS_SYSTEMS = ("elpis", *TREE_BUDGETS)  # a worker process a tree row count (`cli.worker_groups`)
PROFILE_SYSTEMS = ("stock", *ELPIS_SYSTEMS)  # `elpis bench profile`: stock and one elpis system per run
SYSTEMS = ("stock", *ELPIS_SYSTEMS)
LABELS = {1024: "1K", 8192: "8K", 32768: "32K", 131072: "128K", 262000: "262K", 262144: "262K"}
KV_GROUP = 32  # quantized cache: one fp16 scale per 32 values


def label(tokens: int) -> str:
    return LABELS.get(tokens, f"{tokens}")


def prompt(length: int, seed: int, vocab: int) -> list[int]:
    """Deterministic random token ids (random weights make content irrelevant to speed); a different seed
    gives a different first page, so nothing is served from the prefix cache."""
    rng = random.Random(seed)
    top = min(vocab, 248_000)
    return [rng.randrange(top) for _ in range(length)]


def _spec_bytes(specs: list[geometry.TensorSpec]) -> int:
    size = {"I16": 2, "I32": 4, "F16": 2, "BF16": 2, "F32": 4}
    total = 0
    for s in specs:
        n = 1
        for d in s.shape:
            n *= d
        total += n * size[s.dtype]
    return total


@dataclass(frozen=True)
class ModelArithmetic:
    target_bytes: int  # everything a target forward reads except the embedding (kept in host RAM)
    head_bytes: int
    draft_bytes: int
    draft_update_bytes: int  # fc + draft k/v projections, run for every committed token
    linear_params: int  # target body linear weights (prefill GEMMs; the head is not run in prefill)
    draft_update_params: int
    kv_bytes_per_token: int  # target K/V read per context token (all attention layers)
    draft_kv_bytes_per_token: int
    draft_window: int
    gdn_state_bytes: int  # recurrent state of all GDN layers (read once, written once per forward)
    attn_layers: int
    gdn_layers: int
    q_heads: int
    head_dim: int
    gdn_state_flops_per_token: int

    def round_bytes(self, context: int, draft: bool) -> int:
        """Bytes one verify round (or one plain step, draft=False) must read at least."""
        total = self.target_bytes + context * self.kv_bytes_per_token + 2 * self.gdn_state_bytes
        total += self.draft_update_bytes
        if draft:
            window = min(context, self.draft_window)
            total += self.draft_bytes + self.head_bytes + window * self.draft_kv_bytes_per_token
        return total

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs of prefilling positions [start, end): linear layers, causal attention, GDN state updates,
        and the draft's K/V update."""
        n = end - start
        linear = 2 * (self.linear_params + self.draft_update_params) * n
        # sum over p in [start, end) of p keys: QK^T and PV, 2 FLOPs per multiply-add, per attention layer
        keys = (start + end - 1) * n / 2
        attention = self.attn_layers * 4 * self.q_heads * self.head_dim * keys
        return linear + attention + self.gdn_layers * self.gdn_state_flops_per_token * n


def arithmetic(target: dict[str, Any], draft: dict[str, Any] | None, kv_bits: int = 3) -> ModelArithmetic:
    groups = geometry.target_tensors(target)
    globals_ = groups[0]
    head = [s for s in globals_ if s.name.startswith("lm_head")]
    others = [s for s in globals_ if not s.name.endswith("embed_tokens.weight")]
    body = [s for g in groups[1:] for s in g]
    linear_params = 0
    for s in body:
        if s.name.endswith(".trellis"):
            linear_params += s.shape[0] * 16 * s.shape[1] * 16
        elif s.init == "dense":
            linear_params += s.shape[0] * s.shape[1]
    types = geometry.layer_types(target)
    attn_layers = types.count("full_attention")
    gdn_layers = types.count("linear_attention")
    kv_width = target["num_key_value_heads"] * target["head_dim"]
    per_layer_token = kv_width // KV_GROUP * (2 * kv_bits * 4 + 2 * 2)  # packed K and V + fp16 scales
    nv, dk, dv = (
        target["linear_num_value_heads"],
        target["linear_key_head_dim"],
        target["linear_value_head_dim"],
    )
    draft_bytes = draft_update_bytes = draft_update_params = draft_kv = window = 0
    if draft is not None:
        dgroups = geometry.draft_tensors(draft)
        draft_bytes = sum(_spec_bytes(g) for g in dgroups) - sum(
            _spec_bytes([s]) for s in dgroups[0] if "codebook" in s.name
        )
        fc = [s for s in dgroups[0] if s.name.startswith("fc.")]
        kv = [s for g in dgroups[1:] for s in g if ".k_proj." in s.name or ".v_proj." in s.name]
        draft_update_bytes = _spec_bytes(fc + kv)
        draft_update_params = sum(
            s.shape[0] * 16 * s.shape[1] * 16 for s in fc + kv if s.name.endswith(".trellis")
        )
        dkv_width = draft["num_key_value_heads"] * draft["head_dim"]
        draft_kv = draft["num_hidden_layers"] * (dkv_width // KV_GROUP * (2 * kv_bits * 4 + 2 * 2))
        window = int(draft.get("sliding_window", 2048))
    return ModelArithmetic(
        target_bytes=_spec_bytes(others) + _spec_bytes(body),
        head_bytes=_spec_bytes(head),
        draft_bytes=draft_bytes,
        draft_update_bytes=draft_update_bytes,
        linear_params=linear_params,
        draft_update_params=draft_update_params,
        kv_bytes_per_token=attn_layers * per_layer_token,
        draft_kv_bytes_per_token=draft_kv,
        draft_window=window,
        gdn_state_bytes=gdn_layers * nv * dk * dv * 2,
        attn_layers=attn_layers,
        gdn_layers=gdn_layers,
        q_heads=target["num_attention_heads"],
        head_dim=target["head_dim"],
        gdn_state_flops_per_token=6 * nv * dk * dv,
    )
