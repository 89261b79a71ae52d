"""Llama weights from a GGUF file, dequantised with the `gguf` package, under the Hugging Face names.

llama.cpp's converter permutes the rows of q and k so that its interleaved-pair RoPE computes what Hugging
Face's rotate-half RoPE computes; undoing that permutation here lets one RoPE convention serve both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from elpis.reference.config import ModelConfig
from elpis.reference.weights import ModelWeights, WeightsError, assemble

_GLOBAL = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _hf_name(name: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _PER_LAYER:
        return f"layers.{parts[1]}.{_PER_LAYER[parts[2]]}"
    raise WeightsError(f"GGUF tensor {name!r} is not part of a Llama model")


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation: per head, rows (pair, half) -> (half, pair)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def read_gguf_tensors(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor of a Llama GGUF, dequantised to float32, in Hugging Face orientation, row order and names.

    Names are canonical (Hugging Face names without the `model.` prefix); checking them against the config
    is `assemble`'s job.
    """
    from gguf.quants import dequantize

    from elpis.text.gguf_meta import open_gguf

    reader = open_gguf(path)
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name in tensors:
            raise WeightsError(f"GGUF tensor {tensor.name!r} appears twice")
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise WeightsError(f"{tensor.name}: cannot dequantise {tensor.tensor_type.name} ({exc})") from exc
        array = np.asarray(array, dtype=np.float32).reshape(tuple(reversed([int(n) for n in tensor.shape])))
        if name.endswith("q_proj.weight"):
            array = unpermute_rope_rows(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = unpermute_rope_rows(array, config.num_key_value_heads)
        tensors[name] = torch.from_numpy(np.array(array, copy=True))  # off the read-only memory map
    return tensors


def load_gguf_weights(path: Path, config: ModelConfig, dtype: torch.dtype, device) -> ModelWeights:
    return assemble(config, read_gguf_tensors(path, config), dtype, torch.device(device))
