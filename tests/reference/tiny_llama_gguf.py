"""A tiny random Llama written as a GGUF file the way llama.cpp's converter lays one out (test-only).

The weights come from a transformers `LlamaForCausalLM`, so the Hugging Face original is known exactly and an
exported directory can be compared with it tensor for tensor. The q/k rows are permuted here with the
forward form of llama.cpp's permutation (written independently of the inverse the package applies).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def byte_level_vocab() -> tuple[list[str], list[str]]:
    """Control tokens, the 256 byte-level symbols, and a few merges (with their results in the vocabulary)."""
    from tokenizers import pre_tokenizers

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    merged = [m.replace(" ", "") for m in merges]
    return CONTROL_TOKENS + symbols + merged, merges


def random_llama(seed: int, vocab_size: int, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = dict(
        vocab_size=vocab_size,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=50_000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**settings)).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)  # not all ones, so a swapped norm would show
            else:
                parameter.normal_(0.0, 0.2)
    return model


def permute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's layout: per head, Hugging Face rows (half, pair) become (pair, half)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_gguf(model, path: Path, *, arch: str = "llama", rope_dims: int | None = None) -> Path:
    """`model` (a transformers Llama) as an F32 GGUF with a byte-level BPE tokenizer and a chat template."""
    from gguf import GGUFWriter, TokenType

    config = model.config
    tokens, merges = byte_level_vocab()
    if len(tokens) != config.vocab_size:
        raise ValueError(f"model vocab {config.vocab_size} != tokenizer vocab {len(tokens)}")
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(rope_dims or config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in CONTROL_TOKENS else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)

    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        for hf, gguf_name in _GGUF_NAMES.items():
            array = state[f"model.layers.{i}.{hf}"]
            if hf == "self_attn.q_proj.weight":
                array = permute_rope_rows(array, config.num_attention_heads)
            elif hf == "self_attn.k_proj.weight":
                array = permute_rope_rows(array, config.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{gguf_name}", np.ascontiguousarray(array))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not config.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
