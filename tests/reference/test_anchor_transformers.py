"""Correctness anchor: random tiny Qwen3.5 models match transformers' own implementation to fp32 rounding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from elpis.reference.backend import ReferenceBackend
from elpis.reference.loader import load_model
from elpis.reference.model import ReferenceModel

from .hf_random import random_hf_model, save

TOLERANCE = 1e-5

# (seed, overrides): GQA and value/key head ratios, kernel sizes, layer patterns, head_dim and vocab vary.
CONFIGS = [
    (1, {}),
    (
        2,
        {
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 6,
            "linear_conv_kernel_dim": 3,
            "num_hidden_layers": 5,
        },
    ),
    (
        3,
        {
            "hidden_size": 48,
            "head_dim": 64,
            "num_key_value_heads": 1,
            "linear_num_key_heads": 3,
            "linear_num_value_heads": 3,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
        },
    ),
]


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.double() - reference.double()).abs().max() / reference.double().abs().max()).item()


def hf_decode(model, prompt: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """transformers' logits for each of `steps`, fed one at a time after `prompt`, with its cache."""
    with torch.no_grad():
        out = model(prompt[None], use_cache=True)
        cache = out.cache
        logits = []
        for token in steps:
            out = model(token.view(1, 1), cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits[0, -1])
    return torch.stack(logits)


def our_decode(model: ReferenceModel, prompt: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    backend = ReferenceBackend(model, model_id="t", max_context=4096, stop_token_ids=(0,))
    backend.begin([*prompt.tolist(), int(steps[0])])
    logits = []
    for i, token in enumerate(steps.tolist()):
        logits.append(backend.verify([token], [-1])[0])
        backend.commit([0])
        if i + 1 < len(steps):
            assert backend.position() == len(prompt) + i + 1
    return torch.stack(logits)


@pytest.fixture(scope="module", params=range(len(CONFIGS)), ids=lambda i: f"config{i}")
def anchor_pair(request, tmp_path_factory):
    seed, overrides = CONFIGS[request.param]
    hf = random_hf_model(seed, **overrides)
    path = save(hf, tmp_path_factory.mktemp(f"hf{request.param}"))
    return hf, path


def test_prefill_matches_transformers(anchor_pair) -> None:
    hf, path = anchor_pair
    ours = load_model(path)
    tokens = torch.randint(0, hf.config.vocab_size, (150,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = hf(tokens[None]).logits[0]
    error = relative_error(ours.prefill(ours.new_state(), tokens.tolist(), logits="all"), reference)
    assert error < TOLERANCE, error


def test_decode_with_cache_matches_transformers(anchor_pair) -> None:
    hf, path = anchor_pair
    ours = load_model(path)
    tokens = torch.randint(0, hf.config.vocab_size, (100,), generator=torch.Generator().manual_seed(6))
    prompt, steps = tokens[:70], tokens[70:]
    error = relative_error(our_decode(ours, prompt, steps), hf_decode(hf, prompt, steps))
    assert error < TOLERANCE, error


def test_float64_agrees(anchor_pair) -> None:
    hf, path = anchor_pair
    ours = load_model(path, dtype=torch.float64)
    tokens = torch.randint(
        0, hf.config.vocab_size, (80,), generator=torch.Generator().manual_seed(7)
    ).tolist()
    logits = ours.prefill(ours.new_state(), tokens, logits="all")
    assert logits.dtype == torch.float64
    with torch.no_grad():
        reference = hf(torch.tensor([tokens])).logits[0]
    assert relative_error(logits, reference) < TOLERANCE


def test_strong_decay_float32_stays_close_to_float64(tmp_path: Path) -> None:
    """Where transformers' float32 chunked form drifts (~1.5e-5), ours stays within 1e-5 of float64."""
    hf = random_hf_model(1, strong_decay=True)
    path = save(hf, tmp_path / "strong")
    tokens = torch.randint(
        0, hf.config.vocab_size, (150,), generator=torch.Generator().manual_seed(5)
    ).tolist()
    exact = load_model(path, dtype=torch.float64)
    truth = exact.prefill(exact.new_state(), tokens, logits="all")
    ours = load_model(path)
    assert relative_error(ours.prefill(ours.new_state(), tokens, logits="all"), truth) < TOLERANCE
    with torch.no_grad():
        assert relative_error(hf(torch.tensor([tokens])).logits[0], truth) < 10 * TOLERANCE


def test_multimodal_layout_sharded_bf16(tmp_path: Path) -> None:
    """text_config nesting, model.language_model. names, vision/MTP tensors skipped, shards, bf16 storage."""
    hf = random_hf_model(11)
    flat = save(hf, tmp_path / "flat")
    config = json.loads((flat / "config.json").read_text())
    nested = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "text_config": {**config, "architectures": None},
        "vision_config": {"depth": 1},
    }
    out = tmp_path / "multimodal"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(nested))
    tensors = load_file(str(flat / "model.safetensors"))
    renamed = {
        ("model.language_model." + k[6:] if k.startswith("model.") else k): v.to(torch.bfloat16)
        for k, v in tensors.items()
    }
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    renamed["mtp.fc.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    names = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: renamed[k] for k in keys}, str(out / file))
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))

    # transformers on the same bf16-rounded weights, in fp32
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    tokens = list(range(3, 90))
    ours = load_model(out)
    with torch.no_grad():
        reference = hf(torch.tensor([tokens])).logits[0]
    assert relative_error(ours.prefill(ours.new_state(), tokens, logits="all"), reference) < TOLERANCE


def test_bad_checkpoints_are_refused(tmp_path: Path) -> None:
    from elpis.reference.config import ConfigError
    from elpis.reference.weights import WeightsError

    hf = random_hf_model(12)
    path = save(hf, tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    missing = dict(tensors)
    del missing["model.layers.0.linear_attn.A_log"]
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(WeightsError, match="missing"):
        load_model(path)
    wrong = dict(tensors)
    wrong["model.norm.weight"] = torch.zeros(3)
    save_file(wrong, str(path / "model.safetensors"))
    with pytest.raises(WeightsError, match="shape"):
        load_model(path)
    extra = dict(tensors)
    extra["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(3)
    save_file(extra, str(path / "model.safetensors"))
    with pytest.raises(WeightsError, match="unexpected"):
        load_model(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ConfigError, match=r"not Qwen3\.5 .* or Llama"):
        load_model(path)
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError, match="model_type 'qwen3_5_text' is not 'llama'"):
        load_model(path)
