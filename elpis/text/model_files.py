"""Facts a model directory (or GGUF file) states about its text side: family, end-of-sequence ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from elpis.text.gguf_meta import is_gguf

QWEN3_5_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text"})


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def text_config(model_dir: Path) -> dict[str, Any]:
    """`config.json`, with a nested `text_config` (multimodal checkpoints) taking precedence; {} if absent."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return {}
    config = read_json(path)
    nested = config.get("text_config")
    if isinstance(nested, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **nested}
    return config


def is_qwen3_5_dir(model_dir: Path) -> bool:
    config = text_config(model_dir)
    return config.get("model_type") in QWEN3_5_MODEL_TYPES or any(
        str(a).startswith("Qwen3_5") for a in config.get("architectures", ())
    )


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, not {value!r}")


def eos_token_ids(model_path: Path) -> tuple[int, ...]:
    """The model's own end ids: generation_config.json, else config.json; GGUF: its eos/eot metadata."""
    model_path = Path(model_path)
    if is_gguf(model_path):
        from elpis.text.gguf_vocab import gguf_eos_ids

        return gguf_eos_ids(model_path)
    generation = model_path / "generation_config.json"
    if generation.is_file():
        ids = _ids(read_json(generation).get("eos_token_id"))
        if ids:
            return ids
    return _ids(text_config(model_path).get("eos_token_id"))
