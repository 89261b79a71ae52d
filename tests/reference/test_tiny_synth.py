"""`elpis synth --tiny`: deterministic, loadable by transformers, with tokenizer and template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from elpis.reference.loader import load_backend
from elpis.reference.model import ReferenceModel
from elpis.reference.synth import write_tiny


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_and_config(tiny_dir: Path) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["vocab_size"] == 248320
    assert config["layer_types"][:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert config["rope_parameters"]["rope_theta"] == 10_000_000
    assert (tiny_dir / "model.safetensors").stat().st_size < 70 * 2**20


def test_deterministic_per_seed(tmp_path: Path, tiny_dir: Path) -> None:
    same = write_tiny(tmp_path / "same", seed=0)
    other = write_tiny(tmp_path / "other", seed=1)
    assert digest(same / "model.safetensors") == digest(tiny_dir / "model.safetensors")
    assert digest(other / "model.safetensors") != digest(tiny_dir / "model.safetensors")
    with pytest.raises(FileExistsError):
        write_tiny(same, seed=0)


def test_cli(tmp_path: Path) -> None:
    from elpis.cli import main

    out = tmp_path / "cli"
    assert main(["synth", "--tiny", str(out), "--seed", "3"]) == 0
    assert (out / "model.safetensors").is_file()
    with pytest.raises(SystemExit):
        main(["synth", "--tiny", str(out)])


def test_transformers_agrees_on_the_tiny_checkpoint(tiny_dir: Path, tiny_model: ReferenceModel) -> None:
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    tokens = list(range(2000, 2070))
    with torch.no_grad():
        reference = hf(torch.tensor([tokens])).logits[0]
    ours = tiny_model.prefill(tiny_model.new_state(), tokens, logits="all")
    # the random 8-layer model amplifies float32 rounding (see test_tree_verify), hence 1e-4
    assert ((ours - reference).abs().max() / reference.abs().max()).item() < 1e-4
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_text_side_of_the_tiny_checkpoint(tiny_dir: Path) -> None:
    from elpis.text import load_chat_template, load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    prompt = load_chat_template(tiny_dir).render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    ids = tokenizer.encode(prompt)
    assert ids[:3] == [248045, 846, 198] and tokenizer.eos_ids == (248046, 248044)
    backend = load_backend(tiny_dir)
    assert backend.info.stop_token_ids == (248046, 248044)
    assert backend.info.model_id == tiny_dir.name
    backend.begin(ids)
    assert backend.verify([ids[-1]], [-1]).shape == (1, 248320)


def test_load_backend_dtypes(tiny_dir: Path) -> None:
    backend = load_backend(tiny_dir, dtype="float64", max_context=64, model_id="tiny64")
    assert backend.model.weights.head.dtype == torch.float64 and backend.info.model_id == "tiny64"
    backend.begin([5, 6])
    assert backend.verify([6], [-1]).dtype == torch.float32
    for bad in ("bfloat16", torch.float16, "int8"):
        with pytest.raises(ValueError, match="float32 or float64"):
            load_backend(tiny_dir, dtype=bad)
    with pytest.raises(FileNotFoundError):
        load_backend(tiny_dir / "missing")
