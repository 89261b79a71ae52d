"""Random tiny Qwen3.5 models built with transformers (test-only dependency) for the correctness anchor."""

from __future__ import annotations

from pathlib import Path

import torch


def random_hf_model(seed: int, strong_decay: bool = False, **overrides):
    """A Qwen3_5ForCausalLM with every parameter randomised (norm weights too, so (1 + w) is exercised).

    By default the DeltaNet decay stays moderate (A in [0.01, 2], dt_bias near -2), where float32 is well
    conditioned. strong_decay uses transformers' own initial range (A up to 16, dt_bias near 0): the
    cumulative log decay over a 64-token chunk then reaches hundreds, and float32 implementations that
    subtract such sums (transformers' chunked form) lose about 1e-5 relative.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    settings = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**settings)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "A_log" in name:
                high = 16.0 if strong_decay else 2.0
                param.copy_(torch.empty(param.shape).uniform_(0.01, high, generator=generator).log())
            elif "dt_bias" in name:
                param.copy_(noise if strong_decay else 0.5 * noise - 2.0)
            elif "norm" in name:
                param.copy_(0.3 * noise + (1.0 if "linear_attn.norm" in name else 0.0))
            else:
                param.copy_(0.1 * noise)
    return model


def save(model, out: Path, **kwargs) -> Path:
    model.save_pretrained(str(out), **kwargs)
    return out
