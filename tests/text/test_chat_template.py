"""Chat templates: Qwen3.8's renders like transformers' apply_chat_template, with its own errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.text import ChatTemplate, Tokenizer, load_chat_template
from elpis.text.qwen_vocab import cached_qwen_tokenizer_dir

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city (°C, ünïcode kept)",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

TOOL_ROUND_TRIP = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and Köln?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
            },
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Köln", "opts": [1, 2]}},
            },
        ],
    },
    {"role": "tool", "content": "Sunny, 21"},
    {"role": "tool", "content": "Rain, 12"},
    {"role": "assistant", "content": "Paris sunny; Köln rain.", "reasoning": "Summarise."},
    {"role": "user", "content": "Thanks!"},
]

CASES: list[tuple[list[dict], dict]] = [
    ([{"role": "user", "content": "Hello"}], {}),
    ([{"role": "user", "content": "Hello"}], {"enable_thinking": False}),
    ([{"role": "user", "content": "Hello"}], {"reasoning_effort": "low"}),
    ([{"role": "user", "content": "Hello"}], {"reasoning_effort": "medium"}),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], {}),
    ([{"role": "user", "content": "Weather?"}], {"tools": [WEATHER_TOOL]}),
    (TOOL_ROUND_TRIP, {"tools": [WEATHER_TOOL]}),
    (TOOL_ROUND_TRIP, {"tools": [WEATHER_TOOL], "preserve_thinking": False, "enable_thinking": False}),
    (
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}],
            }
        ],
        {},
    ),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "tool_calls": None}], {}),
]


@pytest.fixture(scope="session")
def qwen_template(qwen_dir: Path) -> ChatTemplate:
    return load_chat_template(qwen_dir)


@pytest.fixture(scope="session")
def hf_qwen(qwen_dir: Path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(cached_qwen_tokenizer_dir()))
    hf.chat_template = (qwen_dir / "chat_template.jinja").read_text()
    return hf


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_transformers(
    qwen_template: ChatTemplate, hf_qwen, case: int, add_generation_prompt: bool
) -> None:
    messages, kwargs = CASES[case]
    kwargs = dict(kwargs)
    tools = kwargs.pop("tools", None)
    ours = qwen_template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
    theirs = hf_qwen.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    assert ours == theirs


def test_known_prompt_ids(qwen_template: ChatTemplate, qwen_tokenizer: Tokenizer) -> None:
    prompt = qwen_template.render([{"role": "user", "content": "Hello, how are you?"}], enable_thinking=False)
    assert qwen_tokenizer.encode(prompt) == [
        248045,
        846,
        198,
        9419,
        11,
        1204,
        513,
        488,
        30,
        248046,
        198,
        248045,
        74455,
        198,
        248068,
        271,
        248069,
        271,
    ]


def test_template_facts(qwen_template: ChatTemplate) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    default = qwen_template.render(hello)
    assert default.startswith("<|im_start|>system\nReasoning effort is set to xhigh.")
    assert default.endswith("<|im_start|>assistant\n<think>\n")
    assert "Reasoning effort" not in qwen_template.render(hello, reasoning_effort="medium")
    rendered = qwen_template.render(TOOL_ROUND_TRIP, tools=[WEATHER_TOOL])
    assert '"description": "Weather for a city (°C, ünïcode kept)"' in rendered
    assert (
        "<think>\nNeed the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"
        in rendered
    )
    assert "<parameter=opts>\n[1, 2]\n</parameter>" in rendered
    assert (
        "<|im_start|>user\n<tool_response>\nSunny, 21\n</tool_response>\n<tool_response>\nRain, 12"
        in rendered
    )
    assert "<think>\nSummarise.\n</think>\n\nParis sunny; Köln rain." in rendered


@pytest.mark.parametrize(
    ("messages", "kwargs", "message"),
    [
        (
            [{"role": "developer", "content": "x"}, {"role": "user", "content": "hi"}],
            {},
            "Unexpected message role.",
        ),
        (
            [{"role": "user", "content": "hi"}],
            {"reasoning_effort": "high"},
            "Unexpected reasoning effort high",
        ),
        ([{"role": "assistant", "content": "x"}], {}, "No user query found in messages."),
        ([], {}, "No messages provided."),
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            {},
            "System message must be",
        ),
    ],
)
def test_template_errors_carry_its_message(
    qwen_template: ChatTemplate, messages, kwargs, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        qwen_template.render(messages, **kwargs)


def test_sandbox_and_syntax_errors() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}")
    escape = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="chat template failed"):
        escape.render([{"role": "user", "content": "x"}])
    loops = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert loops.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"


def test_template_from_tokenizer_config(tmp_path: Path) -> None:
    import json

    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos_token": "<s>"})
    )
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "hi"}]) == "<s>hi"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="no chat_template"):
        load_chat_template(tmp_path)


def test_gguf_template_and_tokenizer_match_transformers(smollm2_gguf: Path) -> None:
    from transformers import AutoTokenizer

    from elpis.text import load_tokenizer

    template = load_chat_template(smollm2_gguf)
    tokenizer = load_tokenizer(smollm2_gguf)
    hf = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = template.render(messages)
    assert prompt == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.eos_ids == (2,)
    assert tokenizer.vocab_size == 49152
    texts = [
        prompt,
        "Numbers 12345 and 3.14, don't stop",
        "  spaced\n\n\ttabs",
        "héllo wörld 你好 🙂",
        "x=1;y=2//c",
    ]
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode(tokenizer.encode(prompt), skip_special=True).startswith(
        "system\nYou are a helpful"
    )
