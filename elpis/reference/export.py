"""`elpis export-hf`: a Llama GGUF written out as a standard Hugging Face Llama directory.

Tools that read only Hugging Face directories (ExLlamaV3's converter, transformers) can then take the model
we serve from a GGUF. The weights are the GGUF's dequantised values, exactly (float32 by default; float16 or
bfloat16 round them and are refused if a value overflows), in Hugging Face names, orientation and q/k row
order. The config, tokenizer and chat template are the ones elpis reads from the GGUF, so the reference
backend, `elpis.text.load_tokenizer` and `load_chat_template` give the same results on either form.

The directory is written into a temporary sibling and renamed into place: it is complete or absent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

from elpis.reference.config import LLAMA_ARCHITECTURE, ModelConfig, llama_config_from_gguf
from elpis.reference.gguf_weights import read_gguf_tensors
from elpis.reference.weights import check_tensors
from elpis.text.gguf_meta import gguf_value, is_gguf, open_gguf

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _single_or_list(ids: tuple[int, ...]) -> int | list[int]:
    return ids[0] if len(ids) == 1 else list(ids)


def _token_facts(reader, tokenizer) -> dict[str, Any]:
    """bos/eos/pad/unk ids and texts from the GGUF header (absent ones are left out)."""
    facts: dict[str, Any] = {"eos_ids": tokenizer.eos_ids}
    for key, gguf_key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        token_id = gguf_value(reader, f"tokenizer.ggml.{gguf_key}_token_id", None)
        if token_id is None:
            continue
        text = tokenizer.id_to_token(int(token_id))
        if text is None:
            raise ValueError(f"GGUF {key} token id {token_id} is not in the vocabulary")
        facts[key] = (int(token_id), text)
    return facts


def config_json(config: ModelConfig, tokens: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """A transformers `LlamaConfig` dict that `elpis.reference.config.llama_config` reads back as `config`."""
    raw: dict[str, Any] = {
        "architectures": [LLAMA_ARCHITECTURE],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "eos_token_id": _single_or_list(tokens["eos_ids"]),
        "torch_dtype": _DTYPE_NAMES[dtype],
        "use_cache": True,
    }
    for key in ("bos", "pad"):
        if key in tokens:
            raw[f"{key}_token_id"] = tokens[key][0]
    return raw


def tokenizer_files(reader, tokenizer, template: str, tokens: dict[str, Any], context: int) -> dict[str, Any]:
    """tokenizer_config.json, special_tokens_map.json and generation_config.json, in transformers' form."""
    backend = tokenizer.backend
    added = {
        str(token_id): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for token_id, token in sorted(backend.get_added_tokens_decoder().items())
    }
    special = {f"{key}_token": tokens[key][1] for key in ("bos", "eos", "pad", "unk") if key in tokens}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(gguf_value(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf_value(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "added_tokens_decoder": added,
        "chat_template": template,
    }
    generation = {"eos_token_id": _single_or_list(tokens["eos_ids"])}
    for key in ("bos", "pad"):
        if key in tokens:
            generation[f"{key}_token_id"] = tokens[key][0]
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special,
        "generation_config.json": generation,
    }


def _check_output(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir() or out_dir.is_symlink():
            raise ValueError(f"{out_dir} exists and is not a directory")
        if any(out_dir.iterdir()) and not overwrite:
            raise ValueError(f"{out_dir} is not empty (pass overwrite=True / --overwrite to replace it)")


def _install(staged: Path, out_dir: Path) -> None:
    """Rename `staged` to `out_dir`, replacing an existing directory only once the new one is complete."""
    if not out_dir.exists():
        os.replace(staged, out_dir)
        return
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old."))
    os.replace(out_dir, old / "previous")
    try:
        os.replace(staged, out_dir)
    except OSError:
        os.replace(old / "previous", out_dir)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def export_hf(
    gguf_path: Path, out_dir: Path, *, dtype: torch.dtype = torch.float32, overwrite: bool = False
) -> Path:
    """Write the Llama GGUF `gguf_path` as a Hugging Face Llama directory at `out_dir`; returns `out_dir`.

    Raises ValueError (with the reason) for a file that is not a Llama GGUF, an unsupported dtype, a
    non-empty `out_dir` without `overwrite`, or weights that do not fit the header.
    """
    from safetensors.torch import save_file

    from elpis.text import load_chat_template, load_tokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} is not supported (float32, float16 or bfloat16)")
    if not gguf_path.exists():
        raise ValueError(f"{gguf_path}: no such file")
    if not is_gguf(gguf_path):
        raise ValueError(f"{gguf_path} is not a GGUF file")
    _check_output(out_dir, overwrite)
    if out_dir.resolve() in gguf_path.resolve().parents:
        raise ValueError(f"{out_dir} holds the GGUF file itself; write the export somewhere else")
    reader = open_gguf(gguf_path)
    config = llama_config_from_gguf(reader)  # ConfigError (a ValueError) for anything but Llama
    if config.rotary_dim != config.head_dim:
        raise ValueError(
            f"{gguf_path}: RoPE over {config.rotary_dim} of {config.head_dim} head dims has no Hugging Face "
            "Llama equivalent"
        )
    tokenizer = load_tokenizer(gguf_path)
    template = load_chat_template(gguf_path).source
    tokens = _token_facts(reader, tokenizer)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{gguf_path}: {tokenizer.vocab_size} tokens but an embedding of {config.vocab_size}"
        )

    tensors = read_gguf_tensors(gguf_path, config)
    check_tensors(config, tensors)
    stored: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        converted = tensor.to(dtype).contiguous()
        if not torch.isfinite(converted).all():
            raise ValueError(f"{name}: values are not finite in {_DTYPE_NAMES[dtype]}")
        stored[name if name == "lm_head.weight" else f"model.{name}"] = converted

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staged = out_dir.parent / f".{out_dir.name}.partial.{uuid.uuid4().hex}"
    staged.mkdir()  # not mkdtemp: the finished directory gets the usual umask permissions, not 0700
    try:
        files = {
            "config.json": config_json(config, tokens, dtype),
            **tokenizer_files(reader, tokenizer, template, tokens, config.max_position_embeddings),
        }
        for name, content in files.items():
            (staged / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", "utf-8")
        tokenizer.backend.save(str(staged / "tokenizer.json"))
        weights = staged / "model.safetensors"
        save_file(stored, str(weights), metadata={"format": "pt"})
        # safetensors creates its file 0600; give it the mode our own files got under the umask.
        weights.chmod(stat.S_IMODE((staged / "config.json").stat().st_mode))
        _install(staged, out_dir)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return out_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gguf", type=Path, required=True, help="Llama GGUF file (e.g. the embedded SmolLM2)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (absent or empty)")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="fp32", help="weight dtype (fp32 keeps the exact values)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    try:
        out = export_hf(args.gguf, args.out, dtype=DTYPES[args.dtype], overwrite=args.overwrite)
    except (ValueError, OSError) as exc:  # bad input, or an output place we cannot write
        print(f"elpis export-hf: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
