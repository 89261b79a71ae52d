"""Model weights in the compute dtype, under one naming scheme for both checkpoint formats.

Hugging Face directories (Qwen3.5 or Llama; single or sharded safetensors; bf16/fp16/fp32) name tensors
under `model.` or, for the multimodal Qwen3.5 checkpoints, `model.language_model.`; vision (`model.visual.`)
and multi-token prediction (`mtp.`) tensors are skipped. Every expected tensor must be present with its exact
shape and no unknown language-model tensor may remain: a checkpoint that does not fit is refused, not
half-loaded.

RMSNorm scales are stored *effective*: (1 + w) for Qwen3.5's zero-centred norms, w otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from elpis.reference.config import FULL, ModelConfig


class WeightsError(ValueError):
    """Checkpoint tensors do not match the configuration."""


@dataclass
class AttentionWeights:
    q: torch.Tensor  # [heads * head_dim * (2 if gated else 1), hidden]; gated: per head [q | gate]
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


@dataclass
class DeltaNetWeights:
    qkv: torch.Tensor  # [2 * key_dim + value_dim, hidden]
    z: torch.Tensor  # [value_dim, hidden]
    b: torch.Tensor  # [value_heads, hidden]
    a: torch.Tensor  # [value_heads, hidden]
    conv: torch.Tensor  # [conv_dim, kernel] depthwise causal filter
    neg_a: torch.Tensor  # -exp(A_log), [value_heads]
    dt_bias: torch.Tensor  # [value_heads]
    norm: torch.Tensor  # gated RMSNorm scale over value_head_dim (applied as w)
    out: torch.Tensor  # [hidden, value_dim]


@dataclass
class MLPWeights:
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    mixer: AttentionWeights | DeltaNetWeights
    post_norm: torch.Tensor
    mlp: MLPWeights


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied

    def nbytes(self) -> int:
        seen: dict[int, int] = {}

        def visit(obj) -> None:
            if isinstance(obj, torch.Tensor):
                seen[obj.data_ptr()] = obj.numel() * obj.element_size()
            elif hasattr(obj, "__dataclass_fields__"):
                for name in obj.__dataclass_fields__:
                    visit(getattr(obj, name))
            elif isinstance(obj, list):
                for item in obj:
                    visit(item)

        visit(self)
        return sum(seen.values())


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names (Hugging Face names without the model prefix) and their shapes."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    q_rows = c.num_attention_heads * c.head_dim * (2 if c.attn_output_gate else 1)
    kv_rows = c.num_key_value_heads * c.head_dim
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
        if kind == FULL:
            a = p + "self_attn."
            shapes[a + "q_proj.weight"] = (q_rows, c.hidden_size)
            shapes[a + "k_proj.weight"] = (kv_rows, c.hidden_size)
            shapes[a + "v_proj.weight"] = (kv_rows, c.hidden_size)
            shapes[a + "o_proj.weight"] = (c.hidden_size, c.num_attention_heads * c.head_dim)
            if c.qk_norm:
                shapes[a + "q_norm.weight"] = (c.head_dim,)
                shapes[a + "k_norm.weight"] = (c.head_dim,)
        else:
            g = p + "linear_attn."
            heads = c.linear_num_value_heads
            shapes[g + "in_proj_qkv.weight"] = (c.conv_dim, c.hidden_size)
            shapes[g + "in_proj_z.weight"] = (c.linear_value_dim, c.hidden_size)
            shapes[g + "in_proj_b.weight"] = (heads, c.hidden_size)
            shapes[g + "in_proj_a.weight"] = (heads, c.hidden_size)
            shapes[g + "conv1d.weight"] = (c.conv_dim, 1, c.linear_conv_kernel_dim)
            shapes[g + "A_log"] = (heads,)
            shapes[g + "dt_bias"] = (heads,)
            shapes[g + "norm.weight"] = (c.linear_value_head_dim,)
            shapes[g + "out_proj.weight"] = (c.hidden_size, c.linear_value_dim)
    return shapes


def check_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse unless `tensors` (canonical names) are exactly the config's tensors with their exact shapes."""
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise WeightsError(f"{len(missing)} tensors missing, first: {missing[0]}")
    unknown = sorted(set(tensors) - set(shapes))
    if unknown:
        raise WeightsError(f"{len(unknown)} unexpected tensors, first: {unknown[0]}")
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(f"{name}: shape {tuple(tensors[name].shape)}, expected {shape}")


# CPU matmul kernels pick their code path by pointer alignment, and the paths round fp32 sums differently:
# the same weights at another offset (a safetensors file, a numpy buffer) give other logits. Every weight
# gets the allocator's own alignment, so results do not depend on where the weights were read from.
WEIGHT_ALIGNMENT = 64


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.contiguous()
    return tensor.clone() if tensor.data_ptr() % WEIGHT_ALIGNMENT else tensor


def assemble(
    config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    """Check `tensors` (canonical names) against the config and build ModelWeights in dtype on device."""
    check_tensors(config, tensors)

    def t(name: str) -> torch.Tensor:
        return _aligned(tensors[name].to(device=device, dtype=dtype))

    def norm(name: str) -> torch.Tensor:
        w = tensors[name].to(device=device, dtype=dtype)
        return _aligned(1.0 + w if config.norm_unit_offset else w)

    layers = []
    for i, kind in enumerate(config.layer_types):
        p = f"layers.{i}."
        if kind == FULL:
            a = p + "self_attn."
            mixer: AttentionWeights | DeltaNetWeights = AttentionWeights(
                q=t(a + "q_proj.weight"),
                k=t(a + "k_proj.weight"),
                v=t(a + "v_proj.weight"),
                o=t(a + "o_proj.weight"),
                q_norm=norm(a + "q_norm.weight") if config.qk_norm else None,
                k_norm=norm(a + "k_norm.weight") if config.qk_norm else None,
            )
        else:
            g = p + "linear_attn."
            mixer = DeltaNetWeights(
                qkv=t(g + "in_proj_qkv.weight"),
                z=t(g + "in_proj_z.weight"),
                b=t(g + "in_proj_b.weight"),
                a=t(g + "in_proj_a.weight"),
                conv=_aligned(t(g + "conv1d.weight")[:, 0, :]),
                # Computed in float32 or wider even for half checkpoints, where exp(A_log) could overflow.
                neg_a=_aligned(
                    -tensors[g + "A_log"]
                    .to(device=device, dtype=torch.promote_types(dtype, torch.float32))
                    .exp()
                    .to(dtype)
                ),
                dt_bias=t(g + "dt_bias"),
                norm=t(g + "norm.weight"),  # the gated norm is applied as w, never (1 + w)
                out=t(g + "out_proj.weight"),
            )
        layers.append(
            LayerWeights(
                input_norm=norm(p + "input_layernorm.weight"),
                mixer=mixer,
                post_norm=norm(p + "post_attention_layernorm.weight"),
                mlp=MLPWeights(
                    gate=t(p + "mlp.gate_proj.weight"),
                    up=t(p + "mlp.up_proj.weight"),
                    down=t(p + "mlp.down_proj.weight"),
                ),
            )
        )
    embed = t("embed_tokens.weight")
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=norm("norm.weight"),
        head=embed if config.tie_word_embeddings else t("lm_head.weight"),
    )


_SKIPPED_PREFIXES = ("mtp.", "model.visual.", "visual.")
_MODEL_PREFIXES = ("model.language_model.", "model.")


def canonical_name(name: str) -> str | None:
    """Canonical name of a checkpoint tensor, or None for tensors outside the text model."""
    if name.startswith(_SKIPPED_PREFIXES):
        return None
    if name == "lm_head.weight":
        return name
    for prefix in _MODEL_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name  # reported as unexpected by assemble()


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{index}: no weight_map")
        files = sorted({model_dir / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise WeightsError(f"{index} names {f.name}, which is missing")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{model_dir}: no safetensors files")
    return files


def load_hf_weights(
    model_dir: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in _safetensors_files(Path(model_dir)):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                canonical = canonical_name(name)
                if canonical is None:
                    continue
                if canonical in tensors:
                    raise WeightsError(f"tensor {canonical} appears twice")
                tensors[canonical] = handle.get_tensor(name)
    return assemble(config, tensors, dtype, device)
