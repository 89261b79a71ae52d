"""Reading model facts: the published Qwen3.8 text config (flat and nested) and error messages."""

from __future__ import annotations

import json
import math

import pytest

from elpis.paths import QWEN38_FACTS
from elpis.reference.config import FULL, LINEAR, ConfigError, qwen3_5_config
from elpis.reference.weights import expected_shapes


def facts() -> dict:
    return json.loads((QWEN38_FACTS / "text_config.json").read_text())


def test_qwen38_facts() -> None:
    flat = qwen3_5_config(facts())
    nested = qwen3_5_config(
        {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": facts(),
        }
    )
    assert flat == nested
    assert (
        flat.num_layers == 64
        and flat.layer_types.count(FULL) == 16
        and flat.layer_types[:4] == (LINEAR,) * 3 + (FULL,)
    )
    assert (flat.hidden_size, flat.intermediate_size, flat.vocab_size) == (5120, 17408, 248320)
    assert (flat.num_attention_heads, flat.num_key_value_heads, flat.head_dim, flat.rotary_dim) == (
        24,
        4,
        256,
        64,
    )
    assert (
        flat.rope_theta == 1e7
        and flat.norm_unit_offset
        and flat.attn_output_gate
        and not flat.tie_word_embeddings
    )
    assert (flat.linear_num_key_heads, flat.linear_num_value_heads, flat.conv_dim) == (16, 48, 10240)
    shapes = expected_shapes(flat)
    assert shapes["layers.0.linear_attn.in_proj_qkv.weight"] == (10240, 5120)
    assert shapes["layers.3.self_attn.q_proj.weight"] == (24 * 256 * 2, 5120)
    parameters = sum(math.prod(shape) for shape in shapes.values())
    assert 26.0e9 < parameters < 28.0e9  # "27B"


def test_layer_types_from_interval() -> None:
    config = facts()
    del config["layer_types"]
    config["num_hidden_layers"] = 8
    assert qwen3_5_config(config).layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "silu"),
        ({"head_dim": None}, "head_dim"),
        ({"architectures": ["LlamaForCausalLM"]}, "not Qwen3.5"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type"),
        ({"num_key_value_heads": 5}, "multiple"),
        ({"layer_types": ["full_attention"]}, "entries"),
        ({"linear_num_value_heads": 20}, "multiple"),
    ],
)
def test_bad_configs_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        qwen3_5_config({**facts(), **change})
