"""Model shape and numerics conventions, read from a Hugging Face config.json or a GGUF header.

Two architectures share one description: the Qwen3.5/3.8 hybrid (Gated DeltaNet + gated full attention) and
Llama (all full attention). Everything the forward pass needs to know is a field here, so the math never
branches on an architecture name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

FULL = "full_attention"
LINEAR = "linear_attention"

QWEN3_5_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
LLAMA_ARCHITECTURE = "LlamaForCausalLM"


class ConfigError(ValueError):
    """The checkpoint's configuration is missing a fact or states one this code does not support."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "qwen3_5" or "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    norm_unit_offset: bool  # RMSNorm scales by (1 + w) (Qwen3.5 "zero-centred" weights) instead of w
    attn_output_gate: bool  # q_proj also yields a per-head sigmoid gate, interleaved [q | gate] per head
    qk_norm: bool  # RMSNorm over each q and k head before RoPE
    tie_word_embeddings: bool
    max_position_embeddings: int
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    def validate(self) -> ModelConfig:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ConfigError(what)

        need(self.arch in ("qwen3_5", "llama"), f"unsupported architecture {self.arch!r}")
        need(self.num_layers > 0, "no layers")
        need(all(t in (FULL, LINEAR) for t in self.layer_types), f"unknown layer type in {self.layer_types}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "head_dim"):
            need(getattr(self, name) > 0, f"{name} must be positive")
        need(
            self.num_key_value_heads > 0 and self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads",
        )
        need(
            0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0,
            "rotary dim must be even, <= head",
        )
        if LINEAR in self.layer_types:
            need(self.linear_num_key_heads > 0 and self.linear_key_head_dim > 0, "linear key heads missing")
            need(
                self.linear_num_value_heads > 0 and self.linear_value_head_dim > 0,
                "linear value heads missing",
            )
            need(
                self.linear_num_value_heads % self.linear_num_key_heads == 0,
                "linear_num_value_heads must be a multiple of linear_num_key_heads",
            )
            need(self.linear_conv_kernel_dim >= 1, "linear_conv_kernel_dim must be >= 1")
        return self


def _get(config: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in config and config[key] is not None:
        return config[key]
    if default is ...:
        raise ConfigError(f"config.json has no {key!r}")
    return default


def qwen3_5_config(raw: dict[str, Any]) -> ModelConfig:
    """From a config.json dict: flat (`Qwen3_5ForCausalLM`) or with `text_config` (multimodal checkpoint)."""
    architectures = tuple(raw.get("architectures") or ())
    if architectures and architectures[0] not in QWEN3_5_ARCHITECTURES:
        raise ConfigError(
            f"architecture {architectures[0]!r} is not Qwen3.5 ({', '.join(QWEN3_5_ARCHITECTURES)}) "
            f"or Llama ({LLAMA_ARCHITECTURE})"
        )
    config = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    if config.get("model_type") not in ("qwen3_5_text", "qwen3_5", None):
        raise ConfigError(f"model_type {config.get('model_type')!r} is not qwen3_5_text")
    if _get(config, "hidden_act", "silu") != "silu":
        raise ConfigError("only hidden_act 'silu' is supported")
    layers = int(_get(config, "num_hidden_layers"))
    layer_types = config.get("layer_types")
    if layer_types is None:
        interval = int(_get(config, "full_attention_interval", 4))
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
    if len(layer_types) != layers:
        raise ConfigError(f"layer_types has {len(layer_types)} entries for {layers} layers")
    rope = _default_rope(config)
    head_dim = int(_get(config, "head_dim"))
    partial = float(rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25)))
    if not _get(config, "attn_output_gate", True):
        raise ConfigError("Qwen3.5 attention without the output gate is not supported")
    return ModelConfig(
        arch="qwen3_5",
        vocab_size=int(_get(config, "vocab_size")),
        hidden_size=int(_get(config, "hidden_size")),
        intermediate_size=int(_get(config, "intermediate_size")),
        layer_types=tuple(layer_types),
        num_attention_heads=int(_get(config, "num_attention_heads")),
        num_key_value_heads=int(_get(config, "num_key_value_heads")),
        head_dim=head_dim,
        rotary_dim=int(head_dim * partial),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10_000_000.0))),
        rms_norm_eps=float(_get(config, "rms_norm_eps")),
        norm_unit_offset=True,
        attn_output_gate=True,
        qk_norm=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        max_position_embeddings=int(_get(config, "max_position_embeddings", 262144)),
        linear_num_key_heads=int(_get(config, "linear_num_key_heads", 16)),
        linear_num_value_heads=int(_get(config, "linear_num_value_heads", 32)),
        linear_key_head_dim=int(_get(config, "linear_key_head_dim", 128)),
        linear_value_head_dim=int(_get(config, "linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(_get(config, "linear_conv_kernel_dim", 4)),
    ).validate()


def _default_rope(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings (`rope_parameters`, or the older `rope_scaling`), plain RoPE only."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"rope settings must be an object, not {rope!r}")
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(
            f"rope_type {rope.get('rope_type', rope.get('type'))!r} is not supported (only 'default')"
        )
    return rope


def llama_config(raw: dict[str, Any]) -> ModelConfig:
    """From a Hugging Face `LlamaForCausalLM` config.json dict (transformers' defaults where it has them)."""
    architectures = tuple(raw.get("architectures") or ())
    if architectures[:1] != (LLAMA_ARCHITECTURE,):
        raise ConfigError(f"architecture {architectures[:1]} is not {LLAMA_ARCHITECTURE!r}")
    if raw.get("model_type", "llama") != "llama":
        raise ConfigError(f"model_type {raw.get('model_type')!r} is not 'llama'")
    if _get(raw, "hidden_act", "silu") != "silu":
        raise ConfigError("only hidden_act 'silu' is supported")
    for flag in ("attention_bias", "mlp_bias"):
        if _get(raw, flag, False):
            raise ConfigError(f"{flag} is not supported")
    if int(_get(raw, "pretraining_tp", 1)) != 1:
        raise ConfigError("pretraining_tp other than 1 is not supported")
    rope = _default_rope(raw)
    if float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ConfigError("partial rotary embeddings are not part of the Llama architecture")
    hidden = int(_get(raw, "hidden_size"))
    heads = int(_get(raw, "num_attention_heads"))
    head_dim = int(_get(raw, "head_dim", hidden // heads))
    return ModelConfig(
        arch="llama",
        vocab_size=int(_get(raw, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_get(raw, "intermediate_size")),
        layer_types=(FULL,) * int(_get(raw, "num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(_get(raw, "num_key_value_heads", heads)),
        head_dim=head_dim,
        rotary_dim=head_dim,
        rope_theta=float(rope.get("rope_theta", _get(raw, "rope_theta", 10_000.0))),
        rms_norm_eps=float(_get(raw, "rms_norm_eps")),
        norm_unit_offset=False,
        attn_output_gate=False,
        qk_norm=False,
        tie_word_embeddings=bool(_get(raw, "tie_word_embeddings", False)),
        max_position_embeddings=int(_get(raw, "max_position_embeddings")),
    ).validate()


def read_hf_config(model_dir: Path) -> ModelConfig:
    """A Hugging Face directory's config.json: Llama, else Qwen3.5 (whose error names both)."""
    import json

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir}: no config.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if tuple(raw.get("architectures") or ())[:1] == (LLAMA_ARCHITECTURE,):
        return llama_config(raw)
    return qwen3_5_config(raw)


def llama_config_from_gguf(reader) -> ModelConfig:
    """From a GGUF header with general.architecture == 'llama'."""
    from elpis.text.gguf_meta import gguf_value

    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    hidden = int(gguf_value(reader, "llama.embedding_length"))
    heads = int(gguf_value(reader, "llama.attention.head_count"))
    head_dim = int(gguf_value(reader, "llama.attention.key_length", hidden // heads))
    if gguf_value(reader, "llama.rope.scaling.type", "none") not in ("none", None):
        raise ConfigError("GGUF rope scaling is not supported")
    tokens = gguf_value(reader, "tokenizer.ggml.tokens")
    has_head = any(t.name == "output.weight" for t in reader.tensors)
    return ModelConfig(
        arch="llama",
        vocab_size=int(gguf_value(reader, "llama.vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(gguf_value(reader, "llama.feed_forward_length")),
        layer_types=(FULL,) * int(gguf_value(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf_value(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rotary_dim=int(gguf_value(reader, "llama.rope.dimension_count", head_dim)),
        rope_theta=float(gguf_value(reader, "llama.rope.freq_base", 10_000.0)),
        rms_norm_eps=float(gguf_value(reader, "llama.attention.layer_norm_rms_epsilon")),
        norm_unit_offset=False,
        attn_output_gate=False,
        qk_norm=False,
        tie_word_embeddings=not has_head,
        max_position_embeddings=int(gguf_value(reader, "llama.context_length")),
    ).validate()
