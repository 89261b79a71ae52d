"""Tensor layout of an EXL3 Qwen3.8 (Qwen3.5-family) target and its DFlash2 draft, derived from a config.

One list of `TensorSpec` per checkpoint: name, shape, safetensors dtype and how a synthetic value is drawn.
The synthetic writer (`elpis.exl3.synth`) writes exactly these tensors; ExLlamaV3's loader then reads them
through the same code path as a converted checkpoint. Facts (from reading exllamav3 1.6.5's loader):

- EXL3 linear `key`: `trellis` int16 `[in/16, out/16, 16*bits]`, `suh` fp16 `[in]`, `svh` fp16 `[out]`,
  `mul1` int32 scalar (the mul1 codebook marker). Any bit pattern is a valid trellis.
- Target: prefix `model.language_model.`, plain `lm_head`; norms stored zero-centred (applied as w + 1);
  GDN `in_proj_b/a` unquantized fp16, `conv1d.weight` bf16 `[conv_dim, 1, kernel]`, `dt_bias` bf16,
  `A_log` and the gated norm fp32.
- Draft: no prefix, no embedding or head of its own (it uses the target's); norms applied as w (store ~1);
  `fc` takes the concatenated tap states; conv `base_kernel` bf16 `[2, kernel, hidden]`; selector codebooks
  bf16 `[vocab, rank]`, `hidden_projection` fp16 `.weight [rank, hidden]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elpis.paths import QWEN38_FACTS

TARGET_PREFIX = "model.language_model"
MUL1_MARKER = -2082680531  # 0x83DCD12D as a little-endian int32: selects the mul1 trellis codebook
PAGE = 256


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name: I16, I32, F16, BF16, F32
    init: str  # how synth draws it (see elpis.exl3.synth.draw)
    fan_in: int = 1  # input width, sets the output scale of linears


def load_facts(name: str) -> dict[str, Any]:
    data = json.loads((QWEN38_FACTS / name).read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "tokenizer_real_vocab"}


def read_config(model_dir: Path) -> dict[str, Any]:
    """A checkpoint's config.json, with a nested text_config (multimodal form) folded in."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    nested = config.get("text_config")
    if isinstance(nested, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **nested}
    return config


def exl3_linear(key: str, in_features: int, out_features: int, bits: int) -> list[TensorSpec]:
    if in_features % 16 or out_features % 16:
        raise ValueError(f"{key}: EXL3 needs both sides divisible by 16, got {in_features}x{out_features}")
    return [
        TensorSpec(f"{key}.trellis", (in_features // 16, out_features // 16, 16 * bits), "I16", "trellis"),
        TensorSpec(f"{key}.suh", (in_features,), "F16", "sign"),
        TensorSpec(f"{key}.svh", (out_features,), "F16", "scale", fan_in=in_features),
        TensorSpec(f"{key}.mul1", (), "I32", "mul1"),
    ]


def layer_types(config: dict[str, Any]) -> list[str]:
    n = config["num_hidden_layers"]
    types = config.get("layer_types")
    if types is None:
        interval = config.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for {n} layers")
    return list(types)


def target_layer(config: dict[str, Any], index: int, kind: str, bits: int) -> list[TensorSpec]:
    h, inter = config["hidden_size"], config["intermediate_size"]
    p = f"{TARGET_PREFIX}.layers.{index}"
    specs = [
        TensorSpec(f"{p}.input_layernorm.weight", (h,), "BF16", "zero_norm"),
        TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "BF16", "zero_norm"),
    ]
    specs += exl3_linear(f"{p}.mlp.gate_proj", h, inter, bits)
    specs += exl3_linear(f"{p}.mlp.up_proj", h, inter, bits)
    specs += exl3_linear(f"{p}.mlp.down_proj", inter, h, bits)
    if kind == "linear_attention":
        nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        conv_dim = 2 * nk * dk + nv * dv
        kernel = config.get("linear_conv_kernel_dim", 4)
        a = f"{p}.linear_attn"
        specs += exl3_linear(f"{a}.in_proj_qkv", h, conv_dim, bits)
        specs += exl3_linear(f"{a}.in_proj_z", h, nv * dv, bits)
        specs += exl3_linear(f"{a}.out_proj", nv * dv, h, bits)
        specs += [
            TensorSpec(f"{a}.in_proj_b.weight", (nv, h), "F16", "dense", fan_in=h),
            TensorSpec(f"{a}.in_proj_a.weight", (nv, h), "F16", "dense", fan_in=h),
            TensorSpec(f"{a}.conv1d.weight", (conv_dim, 1, kernel), "BF16", "conv"),
            TensorSpec(f"{a}.dt_bias", (nv,), "BF16", "dt_bias"),
            TensorSpec(f"{a}.A_log", (nv,), "F32", "a_log"),
            TensorSpec(f"{a}.norm.weight", (dv,), "F32", "unit_norm"),
        ]
    elif kind == "full_attention":
        nq, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        a = f"{p}.self_attn"
        # q_proj carries the output gate interleaved per head: [q(hd) | gate(hd)] x heads.
        specs += exl3_linear(f"{a}.q_proj", h, nq * hd * 2, bits)
        specs += exl3_linear(f"{a}.k_proj", h, nkv * hd, bits)
        specs += exl3_linear(f"{a}.v_proj", h, nkv * hd, bits)
        specs += exl3_linear(f"{a}.o_proj", nq * hd, h, bits)
        specs += [
            TensorSpec(f"{a}.q_norm.weight", (hd,), "BF16", "zero_norm"),
            TensorSpec(f"{a}.k_norm.weight", (hd,), "BF16", "zero_norm"),
        ]
    else:
        raise ValueError(f"layer {index}: unknown layer type {kind!r}")
    return specs


def target_globals(config: dict[str, Any], head_bits: int) -> list[TensorSpec]:
    h, vocab = config["hidden_size"], config["vocab_size"]
    return [
        TensorSpec(f"{TARGET_PREFIX}.embed_tokens.weight", (vocab, h), "BF16", "embedding"),
        TensorSpec(f"{TARGET_PREFIX}.norm.weight", (h,), "BF16", "zero_norm"),
        *exl3_linear("lm_head", h, vocab, head_bits),
    ]


def target_tensors(config: dict[str, Any], body_bits: int = 4, head_bits: int = 6) -> list[list[TensorSpec]]:
    """The target's tensors grouped into files: globals first, then one group per layer."""
    groups = [target_globals(config, head_bits)]
    for i, kind in enumerate(layer_types(config)):
        groups.append(target_layer(config, i, kind, body_bits))
    return groups


def draft_shape(config: dict[str, Any]) -> dict[str, int]:
    dflash = config.get("dflash_config", {})

    def get(key: str) -> Any:
        return dflash.get(key, config.get(key))

    return {
        "block": get("block_size"),
        "kernel": get("conv_kernel_size"),
        "group": get("conv_group_size"),
        "rank": get("selector_rank"),
        "taps": len(get("target_layer_ids")),
    }


def draft_tensors(config: dict[str, Any], bits: int = 4) -> list[list[TensorSpec]]:
    """The DFlash2 draft's tensors grouped into files: encoder and selector, then one group per layer."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    nq, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    s = draft_shape(config)
    groups_per_conv = h // s["group"]
    globals_ = [
        *exl3_linear("fc", s["taps"] * h, h, bits),
        TensorSpec("hidden_norm.weight", (h,), "BF16", "unit_norm"),
        TensorSpec("norm.weight", (h,), "BF16", "unit_norm"),
        TensorSpec("candidate_selector.predecessor_codebook", (vocab, s["rank"]), "BF16", "codebook"),
        TensorSpec("candidate_selector.successor_codebook", (vocab, s["rank"]), "BF16", "codebook"),
        TensorSpec("candidate_selector.hidden_projection.weight", (s["rank"], h), "F16", "dense", fan_in=h),
    ]
    groups = [globals_]
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}"
        layer = [
            TensorSpec(f"{p}.input_layernorm.weight", (h,), "BF16", "unit_norm"),
            TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "BF16", "unit_norm"),
            TensorSpec(f"{p}.self_attn.q_norm.weight", (hd,), "BF16", "unit_norm"),
            TensorSpec(f"{p}.self_attn.k_norm.weight", (hd,), "BF16", "unit_norm"),
            *exl3_linear(f"{p}.self_attn.q_proj", h, nq * hd, bits),
            *exl3_linear(f"{p}.self_attn.k_proj", h, nkv * hd, bits),
            *exl3_linear(f"{p}.self_attn.v_proj", h, nkv * hd, bits),
            *exl3_linear(f"{p}.self_attn.o_proj", nq * hd, h, bits),
            *exl3_linear(f"{p}.mlp.gate_proj", h, inter, bits),
            *exl3_linear(f"{p}.mlp.up_proj", h, inter, bits),
            *exl3_linear(f"{p}.mlp.down_proj", inter, h, bits),
        ]
        for conv in ("attention_conv", "mlp_conv"):
            layer.append(TensorSpec(f"{p}.{conv}.base_kernel", (2, s["kernel"], h), "BF16", "conv"))
            layer += exl3_linear(f"{p}.{conv}.kernel_projection", h, 2 * s["kernel"] * groups_per_conv, bits)
        groups.append(layer)
    return groups


def small_target_config() -> dict[str, Any]:
    """The --small target: the full model's head geometry (attention 24q/4kv x 256, GDN 16k/48v x 128, so
    the same attention and GDN kernels compile), narrower hidden/MLP, 8 layers, a 32K vocabulary."""
    config = load_facts("text_config.json")
    n = 8
    config.update(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=n,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        vocab_size=32768,
    )
    return config


def small_draft_config() -> dict[str, Any]:
    config = load_facts("draft_config.json")
    config.update(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=2,
        layer_types=["sliding_attention"] * 2,
        max_window_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=32768,
        num_target_layers=8,
    )
    config["dflash_config"] = {
        **config["dflash_config"],
        "mask_token_id": 32767,
        "selector_rank": 128,
        "target_layer_ids": [1, 5],
    }
    return config
