"""One loader for the reference backend: a Hugging Face directory (Qwen3.5/3.8 or Llama) or a Llama GGUF."""

from __future__ import annotations

from pathlib import Path

import torch

from elpis.reference.backend import DEFAULT_PREFIX_CACHE_BYTES, ReferenceBackend
from elpis.reference.config import ModelConfig, llama_config_from_gguf, read_hf_config
from elpis.reference.model import ReferenceModel
from elpis.text.gguf_meta import is_gguf, open_gguf
from elpis.text.model_files import eos_token_ids

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64}
DEFAULT_MAX_CONTEXT = 32768


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in DTYPES:
        resolved = DTYPES[dtype]
    else:
        raise ValueError(f"dtype {dtype!r} is not supported (float32 or float64)")
    if resolved not in (torch.float32, torch.float64):
        raise ValueError(f"the reference backend computes in float32 or float64, not {resolved}")
    return resolved


def read_config(model_path: Path | str) -> ModelConfig:
    model_path = Path(model_path)
    if is_gguf(model_path):
        return llama_config_from_gguf(open_gguf(model_path))
    if model_path.is_dir():
        return read_hf_config(model_path)
    raise FileNotFoundError(f"no model directory or GGUF file at {model_path}")


def load_model(
    model_path: Path | str,
    *,
    dtype: torch.dtype | str = torch.float32,
    device="cpu",
    config: ModelConfig | None = None,
) -> ReferenceModel:
    model_path = Path(model_path)
    dtype, device = resolve_dtype(dtype), torch.device(device)
    config = config or read_config(model_path)
    if is_gguf(model_path):
        from elpis.reference.gguf_weights import load_gguf_weights

        weights = load_gguf_weights(model_path, config, dtype, device)
    else:
        from elpis.reference.weights import load_hf_weights

        weights = load_hf_weights(model_path, config, dtype, device)
    return ReferenceModel(config, weights, dtype=dtype, device=device)


def load_backend(
    model_path: Path | str,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    max_context: int | None = None,
    model_id: str | None = None,
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    exact_rows: bool = True,
) -> ReferenceBackend:
    """The reference backend for a HF directory or a GGUF file.

    max_context defaults to the model's own limit capped at 32768; model_id to the file or directory name.
    """
    model_path = Path(model_path)
    config = read_config(model_path)
    limit = config.max_position_embeddings
    if max_context is None:
        max_context = min(limit, DEFAULT_MAX_CONTEXT)
    elif not 2 <= max_context <= limit:
        raise ValueError(f"max_context {max_context} must be in [2, {limit}] for this model")
    stops = eos_token_ids(model_path)
    if not stops:
        raise ValueError(f"{model_path}: the model states no end-of-sequence token id")
    model = load_model(model_path, dtype=dtype, device=device, config=config)
    return ReferenceBackend(
        model,
        model_id=model_id or (model_path.stem if model_path.is_file() else model_path.name),
        max_context=max_context,
        stop_token_ids=stops,
        prefix_cache_bytes=prefix_cache_bytes,
        exact_rows=exact_rows,
    )
