"""`elpis export-hf`: a Llama GGUF as a Hugging Face Llama directory, read back by us and by transformers.

SmolLM2 (the embedded model) must give bit-identical logits from either form and standard files that
transformers loads; a tiny random Llama written as a GGUF must come back tensor for tensor as the
transformers original (untied head, GQA, permuted q/k rows). Refusals: bad inputs, bad output places, and
Hugging Face directories whose tensors or config do not fit.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from elpis.reference import export
from elpis.reference.config import ConfigError
from elpis.reference.export import export_hf
from elpis.reference.loader import load_backend, load_model, read_config
from elpis.reference.weights import WEIGHT_ALIGNMENT, WeightsError, expected_shapes
from elpis.text import load_chat_template, load_tokenizer

from .tiny_llama_gguf import byte_level_vocab, random_llama, write_gguf

HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Wie heißt die Hauptstadt? 😀"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy, 1234?"},
    ],
]


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.double() - reference.double()).abs().max() / reference.double().abs().max()).item()


def tensors_of(obj) -> list[torch.Tensor]:
    """Every tensor in a ModelWeights tree, in field order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list):
        return [t for item in obj for t in tensors_of(item)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for name in obj.__dataclass_fields__ for t in tensors_of(getattr(obj, name))]
    return []


# --- SmolLM2 --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_dir(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_hf(smollm2_gguf, tmp_path_factory.mktemp("export") / "SmolLM2-hf")


@pytest.fixture(scope="module")
def smol_backends(smollm2_gguf: Path, smol_dir: Path):
    return load_backend(smollm2_gguf, max_context=512), load_backend(smol_dir, max_context=512)


@pytest.fixture(scope="module")
def prompt_ids(smollm2_gguf: Path) -> list[int]:
    text = load_chat_template(smollm2_gguf).render(CONVERSATIONS[1])
    ids = load_tokenizer(smollm2_gguf).encode(text)
    assert len(ids) >= 32
    return ids[:32]


def test_smollm2_directory_is_standard(smollm2_gguf: Path, smol_dir: Path) -> None:
    assert {p.name for p in smol_dir.iterdir()} == HF_FILES  # nothing partial left beside or inside
    assert [p.name for p in smol_dir.parent.iterdir()] == [smol_dir.name]
    config = read_config(smol_dir)
    assert config == read_config(smollm2_gguf)  # every numeric fact survives the JSON round trip
    assert config.tie_word_embeddings and config.num_key_value_heads == 3
    raw = json.loads((smol_dir / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["torch_dtype"] == "float32"
    assert (raw["bos_token_id"], raw["eos_token_id"], raw["pad_token_id"]) == (1, 2, 2)
    stored = load_file(smol_dir / "model.safetensors")
    assert set(stored) == {f"model.{name}" for name in expected_shapes(config)}  # tied: no lm_head
    assert all(t.dtype == torch.float32 for t in stored.values())
    assert stored["model.layers.0.self_attn.k_proj.weight"].shape == (3 * 64, 576)  # [out, in]


def test_weights_are_the_gguf_values(smol_backends) -> None:
    from_gguf, from_dir = (b.model.weights for b in smol_backends)
    pairs = list(zip(tensors_of(from_gguf), tensors_of(from_dir), strict=True))
    assert len(pairs) == 2 + 30 * 9 + 1  # embed, 30 layers, final norm, head (the embedding again)
    assert all(torch.equal(a, b) for a, b in pairs)
    # both at the allocator's alignment, whatever offset the file had: CPU kernels round by alignment
    assert all(a.data_ptr() % WEIGHT_ALIGNMENT == b.data_ptr() % WEIGHT_ALIGNMENT == 0 for a, b in pairs)


def test_teacher_forced_logits_bit_identical(smol_backends, prompt_ids: list[int]) -> None:
    from_gguf, from_dir = smol_backends
    expected = from_gguf.prompt_logits(prompt_ids)
    assert expected.shape == (32, 49152)
    assert torch.equal(from_dir.prompt_logits(prompt_ids), expected)


def test_greedy_decoding_bit_identical(smol_backends, prompt_ids: list[int]) -> None:
    runs = []
    for backend in smol_backends:
        backend.begin(prompt_ids[:20])
        anchor, steps = prompt_ids[19], []
        for _ in range(6):
            logits = backend.verify([anchor], [-1])
            backend.commit([0])
            anchor = int(logits[0].argmax())
            steps.append((anchor, logits))
        backend.finish()
        runs.append(steps)
    assert [t for t, _ in runs[0]] == [t for t, _ in runs[1]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(*runs, strict=True))


def test_tokenizer_and_chat_template_match(smollm2_gguf: Path, smol_dir: Path) -> None:
    ours, exported = load_tokenizer(smollm2_gguf), load_tokenizer(smol_dir)
    assert exported.eos_ids == ours.eos_ids == (2,) and exported.vocab_size == ours.vocab_size
    for text in ("Hello, world! 12345", "<|im_start|>user\nnaïve café 😀<|im_end|>\n", "  \t\n<file_sep>x"):
        ids = ours.encode(text)
        assert exported.encode(text) == ids and exported.decode(ids) == ours.decode(ids)
        assert exported.encode(text, special=False) == ours.encode(text, special=False)
        assert exported.decode(ids, skip_special=True) == ours.decode(ids, skip_special=True)
    template, exported_template = load_chat_template(smollm2_gguf), load_chat_template(smol_dir)
    for messages in CONVERSATIONS:
        for add in (True, False):
            rendered = template.render(messages, add_generation_prompt=add)
            assert exported_template.render(messages, add_generation_prompt=add) == rendered


def test_load_backend_on_the_directory(smol_backends, smol_dir: Path) -> None:
    from_gguf, from_dir = smol_backends
    assert from_dir.info.model_id == smol_dir.name
    assert from_dir.info.stop_token_ids == from_gguf.info.stop_token_ids == (2,)
    assert from_dir.info.vocab_size == from_gguf.info.vocab_size == 49152


def test_transformers_reads_it_as_llama(
    smol_dir: Path, smol_backends, prompt_ids: list[int], smollm2_gguf: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        smol_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert isinstance(model, LlamaForCausalLM)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    with torch.no_grad():
        theirs = model(torch.tensor([prompt_ids])).logits[0]
    assert relative_error(smol_backends[1].prompt_logits(prompt_ids), theirs) < 1e-4
    del model

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    template = load_chat_template(smollm2_gguf)
    ours = load_tokenizer(smollm2_gguf)
    for messages in CONVERSATIONS:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == template.render(messages)
        assert tokenizer(text, add_special_tokens=False).input_ids == ours.encode(text)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)


# --- a tiny random Llama through GGUF and back -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama():
    return random_llama(seed=3, vocab_size=len(byte_level_vocab()[0]))


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tiny_llama, tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="module")
def tiny_export(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_hf(tiny_gguf, tmp_path_factory.mktemp("tiny-export") / "tiny-llama")


def test_tiny_llama_round_trips_exactly(tiny_llama, tiny_export: Path) -> None:
    stored = load_file(tiny_export / "model.safetensors")
    original = tiny_llama.state_dict()
    assert set(stored) == set(original) and "lm_head.weight" in stored  # untied head kept
    for name, tensor in original.items():
        assert torch.equal(stored[name], tensor), name  # q/k rows back in Hugging Face order, exactly


def test_tiny_llama_directory_matches_transformers(tiny_llama, tiny_export: Path) -> None:
    ids = [1, 40, 90, 259, 260, 7, 2, 1, 30, 200, 261, 262, 100, 5]
    with torch.no_grad():
        theirs = tiny_llama(torch.tensor([ids])).logits[0]
    ours = load_backend(tiny_export).prompt_logits(ids)
    assert relative_error(ours, theirs) < 1e-5
    tokenizer = load_tokenizer(tiny_export)
    assert tokenizer.encode(" the cat") == [261, 223, 69, 67, 86]  # merges "Ġ t", "Ġt he"; no "Ġ c"


def test_transformers_saved_llama_loads(tiny_llama, tmp_path: Path) -> None:
    """Not only our own export: a directory written by transformers' save_pretrained (rope_parameters)."""
    tiny_llama.save_pretrained(tmp_path / "saved")
    ids = [1, 9, 99, 199, 259, 2]
    with torch.no_grad():
        theirs = tiny_llama(torch.tensor([ids])).logits[0]
    model = load_model(tmp_path / "saved")
    ours = model.prefill(model.new_state(len(ids)), ids, logits="all")
    assert relative_error(ours, theirs) < 1e-5


@pytest.mark.parametrize(("dtype", "name"), [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")])
def test_half_exports_round_the_values(tiny_gguf: Path, tiny_llama, tmp_path: Path, dtype, name) -> None:
    out = export_hf(tiny_gguf, tmp_path / "half", dtype=dtype)
    stored = load_file(out / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == name
    for key, tensor in tiny_llama.state_dict().items():
        assert stored[key].dtype == dtype and torch.equal(stored[key], tensor.to(dtype)), key
    load_model(out)  # the reference backend widens it to float32


def test_overwrite_replaces_the_directory(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(ValueError, match="not empty"):
        export_hf(tiny_gguf, out)
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    export_hf(tiny_gguf, out, overwrite=True)
    assert {p.name for p in out.iterdir()} == HF_FILES
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert {p.name for p in export_hf(tiny_gguf, empty).iterdir()} == HF_FILES


def test_a_failed_write_leaves_the_old_directory(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("old")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        export_hf(tiny_gguf, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the staging directory is gone
    assert (out / "keep.txt").read_text() == "old"


def test_bad_inputs_are_refused(tiny_gguf: Path, tiny_llama, tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        export_hf(tmp_path / "absent.gguf", tmp_path / "a")
    with pytest.raises(ValueError, match="not a GGUF file"):
        export_hf(tiny_dir / "config.json", tmp_path / "b")  # the tiny Qwen3.8 checkpoint has no GGUF
    with pytest.raises(ValueError, match="not a GGUF file"):
        export_hf(tiny_dir, tmp_path / "c")
    qwen = write_gguf(tiny_llama, tmp_path / "qwen2.gguf", arch="qwen2")
    with pytest.raises(ConfigError, match="'qwen2' is not supported"):
        export_hf(qwen, tmp_path / "d")
    partial = write_gguf(tiny_llama, tmp_path / "partial.gguf", rope_dims=8)
    with pytest.raises(ValueError, match="RoPE over 8 of 16"):
        export_hf(partial, tmp_path / "e")
    with pytest.raises(ValueError, match="dtype"):
        export_hf(tiny_gguf, tmp_path / "f", dtype=torch.float64)
    inside = tmp_path / "holder"
    inside.mkdir()
    shutil.copy(tiny_gguf, inside / "model.gguf")
    with pytest.raises(ValueError, match="holds the GGUF file itself"):
        export_hf(inside / "model.gguf", inside, overwrite=True)
    assert [p.name for p in inside.iterdir()] == ["model.gguf"]
    shutil.rmtree(inside)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        export_hf(tiny_gguf, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "partial.gguf", "qwen2.gguf"]


def test_cli(tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    export.add_arguments(parser)
    out = tmp_path / "cli"
    assert (
        export.run(parser.parse_args(["--gguf", str(tiny_gguf), "--out", str(out), "--dtype", "bf16"])) == 0
    )
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    capsys.readouterr()
    assert export.run(parser.parse_args(["--gguf", str(tiny_gguf), "--out", str(out)])) == 2
    err = capsys.readouterr().err
    assert err.startswith("elpis export-hf: ") and "not empty" in err and err.count("\n") == 1
    assert export.run(parser.parse_args(["--gguf", str(tiny_gguf), "--out", str(out), "--overwrite"])) == 0
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"


# --- Hugging Face Llama directories that do not fit are refused ------------------------------------------


@pytest.fixture
def tiny_copy(tiny_export: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_export, tmp_path / "copy"))


def _edit_tensors(model_dir: Path, edit) -> None:
    tensors = load_file(model_dir / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "missing, first: layers.1.mlp.up_proj.weight"),
        (lambda t: t.pop("lm_head.weight"), "missing, first: lm_head.weight"),
        (
            lambda t: t.update({"model.layers.0.self_attn.q_bias": torch.zeros(96)}),
            "unexpected tensors, first: layers.0.self_attn.q_bias",
        ),
        (
            lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(48, 32)}),
            r"layers.0.self_attn.k_proj.weight: shape \(48, 32\), expected \(32, 48\)",
        ),
    ],
)
def test_bad_tensors_are_refused(tiny_copy: Path, edit, message: str) -> None:
    _edit_tensors(tiny_copy, edit)
    with pytest.raises(WeightsError, match=message):
        load_model(tiny_copy)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"partial_rotary_factor": 0.5}, "partial rotary"),
        ({"model_type": "mistral"}, "model_type"),
        ({"num_key_value_heads": 4}, "multiple"),
        ({"rms_norm_eps": None}, "rms_norm_eps"),
    ],
)
def test_bad_llama_configs_are_refused(tiny_copy: Path, change: dict, message: str) -> None:
    path = tiny_copy / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ConfigError, match=message):
        read_config(tiny_copy)


def test_a_tied_config_with_a_head_tensor_is_refused(tiny_copy: Path) -> None:
    path = tiny_copy / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tie_word_embeddings": True}))
    with pytest.raises(WeightsError, match=r"unexpected tensors, first: lm_head\.weight"):
        load_model(tiny_copy)
