"""The synthetic checkpoints have exactly the tensors ExLlamaV3 1.6.5's loader reads, with its dtypes.

The expectation below is written out independently of `elpis.exl3.geometry` (which the writer uses), from
the loader's rules: EXL3 linears as trellis/suh/svh/mul1, target norms bf16, GDN conv/dt_bias bf16, A_log and
the gated norm fp32, b/a projections fp16, draft codebooks bf16 and its selector projection fp16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors import safe_open

from elpis.exl3 import geometry

MUL1 = -2082680531


def exl3(key: str, k: int, n: int, bits: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        f"{key}.trellis": ("I16", (k // 16, n // 16, 16 * bits)),
        f"{key}.suh": ("F16", (k,)),
        f"{key}.svh": ("F16", (n,)),
        f"{key}.mul1": ("I32", ()),
    }


def expected_target(c: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    p = "model.language_model"
    out = {f"{p}.embed_tokens.weight": ("BF16", (v, h)), f"{p}.norm.weight": ("BF16", (h,))}
    out |= exl3("lm_head", h, v, 6)
    for n in range(c["num_hidden_layers"]):
        layer = f"{p}.layers.{n}"
        out[f"{layer}.input_layernorm.weight"] = ("BF16", (h,))
        out[f"{layer}.post_attention_layernorm.weight"] = ("BF16", (h,))
        out |= exl3(f"{layer}.mlp.gate_proj", h, i, 4) | exl3(f"{layer}.mlp.up_proj", h, i, 4)
        out |= exl3(f"{layer}.mlp.down_proj", i, h, 4)
        if (n + 1) % 4:
            a = f"{layer}.linear_attn"
            out |= exl3(f"{a}.in_proj_qkv", h, 2 * 16 * 128 + 48 * 128, 4)
            out |= exl3(f"{a}.in_proj_z", h, 48 * 128, 4) | exl3(f"{a}.out_proj", 48 * 128, h, 4)
            out[f"{a}.in_proj_b.weight"] = ("F16", (48, h))
            out[f"{a}.in_proj_a.weight"] = ("F16", (48, h))
            out[f"{a}.conv1d.weight"] = ("BF16", (10240, 1, 4))
            out[f"{a}.dt_bias"] = ("BF16", (48,))
            out[f"{a}.A_log"] = ("F32", (48,))
            out[f"{a}.norm.weight"] = ("F32", (128,))
        else:
            a = f"{layer}.self_attn"
            out |= exl3(f"{a}.q_proj", h, 24 * 256 * 2, 4) | exl3(f"{a}.k_proj", h, 4 * 256, 4)
            out |= exl3(f"{a}.v_proj", h, 4 * 256, 4) | exl3(f"{a}.o_proj", 24 * 256, h, 4)
            out[f"{a}.q_norm.weight"] = ("BF16", (256,))
            out[f"{a}.k_norm.weight"] = ("BF16", (256,))
    return out


def expected_draft(c: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = c["dflash_config"]
    q, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out = exl3("fc", len(d["target_layer_ids"]) * h, h, 4)
    out |= {
        "hidden_norm.weight": ("BF16", (h,)),
        "norm.weight": ("BF16", (h,)),
        "candidate_selector.predecessor_codebook": ("BF16", (v, d["selector_rank"])),
        "candidate_selector.successor_codebook": ("BF16", (v, d["selector_rank"])),
        "candidate_selector.hidden_projection.weight": ("F16", (d["selector_rank"], h)),
    }
    for n in range(c["num_hidden_layers"]):
        layer = f"layers.{n}"
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[f"{layer}.{name}.weight"] = ("BF16", (h,))
        out[f"{layer}.self_attn.q_norm.weight"] = ("BF16", (hd,))
        out[f"{layer}.self_attn.k_norm.weight"] = ("BF16", (hd,))
        out |= exl3(f"{layer}.self_attn.q_proj", h, q * hd, 4) | exl3(
            f"{layer}.self_attn.k_proj", h, kv * hd, 4
        )
        out |= exl3(f"{layer}.self_attn.v_proj", h, kv * hd, 4) | exl3(
            f"{layer}.self_attn.o_proj", q * hd, h, 4
        )
        out |= exl3(f"{layer}.mlp.gate_proj", h, i, 4) | exl3(f"{layer}.mlp.up_proj", h, i, 4)
        out |= exl3(f"{layer}.mlp.down_proj", i, h, 4)
        groups = h // d["conv_group_size"]
        for conv in ("attention_conv", "mlp_conv"):
            out[f"{layer}.{conv}.base_kernel"] = ("BF16", (2, d["conv_kernel_size"], h))
            out |= exl3(f"{layer}.{conv}.kernel_projection", h, 2 * d["conv_kernel_size"] * groups, 4)
    return out


def read_dir(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                assert name not in found, f"{name} is stored twice"
                sl = f.get_slice(name)
                found[name] = (sl.get_dtype(), tuple(sl.get_shape()))
    return found


@pytest.mark.slow
def test_small_target_tensors(small):
    config = json.loads((small / "target" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["synthetic"] is True
    assert config["mtp_num_hidden_layers"] == 0
    assert read_dir(small / "target") == expected_target(config)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (small / "target" / name).is_file(), name


@pytest.mark.slow
def test_small_draft_tensors(small):
    config = json.loads((small / "draft" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert read_dir(small / "draft") == expected_draft(config)
    target = json.loads((small / "target" / "config.json").read_text())
    assert config["hidden_size"] == target["hidden_size"] and config["vocab_size"] == target["vocab_size"]
    assert all(0 <= t < target["num_hidden_layers"] for t in config["dflash_config"]["target_layer_ids"])
    assert config["dflash_config"]["mask_token_id"] < config["vocab_size"]


@pytest.mark.slow
def test_small_values_are_usable(small):
    import torch

    with safe_open(str(sorted((small / "target").glob("*.safetensors"))[0]), framework="pt") as f:
        assert int(f.get_tensor("lm_head.mul1")) == MUL1
        svh = f.get_tensor("lm_head.svh").float()
        suh = f.get_tensor("lm_head.suh").float()
    assert torch.all(suh.abs() == 1)
    assert torch.allclose(svh.abs(), torch.full_like(svh, 0.7 / math.sqrt(1024)), rtol=1e-3)


def test_full_geometry_matches_expectation():
    config = geometry.load_facts("text_config.json")
    specs = {s.name: (s.dtype, s.shape) for g in geometry.target_tensors(config) for s in g}
    assert specs == expected_target(config)
    assert specs["lm_head.trellis"] == ("I16", (320, 15520, 96))
    draft = geometry.load_facts("draft_config.json")
    assert {s.name: (s.dtype, s.shape) for g in geometry.draft_tensors(draft) for s in g} == expected_draft(
        draft
    )


def test_synth_refuses_existing_directory(tmp_path):
    from elpis.cli import main

    with pytest.raises(SystemExit, match="already exists"):
        main(["synth", "--small", str(tmp_path)])
