"""`elpis synth --tiny`: a random-weight checkpoint of the Qwen3.8 architecture, small enough for CPU tests.

Same structure as the real model (3 Gated DeltaNet layers then 1 gated attention layer, repeated; partial
RoPE 0.25 with theta 1e7; GQA; zero-centred norms; untied head; the real 248,320-row vocabulary), scaled
down. Tensors are named as in the published checkpoint (`model.language_model.*`), stored in bfloat16, and
depend only on the seed: the same seed writes the same bytes.

The vocabulary dominates: embedding and head are 248,320 x hidden each, so hidden stays at 64.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from elpis.paths import QWEN38_FACTS
from elpis.reference.config import qwen3_5_config
from elpis.reference.weights import expected_shapes

QWEN38_VOCAB = 248320
TINY_LAYERS = 8


def tiny_config() -> dict:
    facts = json.loads((QWEN38_FACTS / "text_config.json").read_text(encoding="utf-8"))
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(TINY_LAYERS)]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": TINY_LAYERS,
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "attn_output_gate": True,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 6,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "rope_parameters": facts["rope_parameters"],
        "rms_norm_eps": facts["rms_norm_eps"],
        "vocab_size": QWEN38_VOCAB,
        "tie_word_embeddings": False,
        "bos_token_id": facts["bos_token_id"],
        "eos_token_id": facts["eos_token_id"],
        "dtype": "bfloat16",
    }


def _random_tensor(
    name: str, shape: tuple[int, ...], hidden: int, generator: torch.Generator
) -> torch.Tensor:
    """Scales that keep activations near unit size and give logits a spread of a few units."""
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=generator).log()
    if name.endswith("dt_bias"):
        return torch.randn(shape, generator=generator) * 0.5
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=generator)
    if name.endswith("norm.weight"):  # zero-centred: applied as (1 + w)
        return 0.1 * torch.randn(shape, generator=generator)
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=generator) * 0.5
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=generator)
    if name == "lm_head.weight":
        return torch.randn(shape, generator=generator) * (4.0 / hidden**0.5)
    return torch.randn(shape, generator=generator) * shape[-1] ** -0.5


def write_tiny(out: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to `out` (created; must not exist or be empty). Returns `out`."""
    from elpis.text.qwen_vocab import cached_qwen_tokenizer_dir

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    model_config = qwen3_5_config(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(model_config).items():
        full_name = name if name == "lm_head.weight" else f"model.language_model.{name}"
        tensors[full_name] = _random_tensor(name, shape, model_config.hidden_size, generator).to(
            torch.bfloat16
        )
    # One metadata key only: safetensors writes several in no fixed order, which would break determinism.
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["elpis_synth_seed"] = seed
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["bos_token_id"],
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(QWEN38_FACTS / "chat_template.jinja", out / "chat_template.jinja")
    tokenizer_dir = cached_qwen_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out / name)
    return out
