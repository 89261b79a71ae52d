"""OpenAI chat requests rendered with the real Qwen3.8 template (the traps of offline_assets §2.2)."""

from __future__ import annotations

import pytest

from elpis.paths import QWEN38_FACTS
from elpis.server.channels import prompt_opens_reasoning
from elpis.server.errors import APIError
from elpis.server.prompting import chat_input, render_chat, template_kwargs
from elpis.server.protocol import ChatRequest, ChatTemplateKwargs, validate_request
from elpis.text import load_chat_template

TEMPLATE = load_chat_template(QWEN38_FACTS)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
XHIGH = "Reasoning effort is set to xhigh"


def render(**body) -> str:
    return render_chat(TEMPLATE, chat_input(validate_request(ChatRequest, body)))


def test_default_prompt_opens_think_and_carries_the_xhigh_line() -> None:
    text = render(messages=[{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n") and prompt_opens_reasoning(text)
    assert XHIGH in text


@pytest.mark.parametrize(
    ("effort", "thinking", "line"),
    [
        ("none", False, None),
        ("minimal", True, "set to low"),
        ("low", True, "set to low"),
        ("medium", True, None),
        ("high", True, XHIGH),
        ("max", True, XHIGH),
    ],
)
def test_reasoning_effort_values_map_onto_the_template(effort: str, thinking: bool, line: str | None) -> None:
    text = render(messages=[{"role": "user", "content": "hi"}], reasoning_effort=effort)
    assert prompt_opens_reasoning(text) is thinking
    assert ("Reasoning effort" in text) is (line is not None)
    if line:
        assert line in text


def test_enable_thinking_false_closes_think() -> None:
    text = render(
        messages=[{"role": "user", "content": "hi"}], chat_template_kwargs={"enable_thinking": False}
    )
    assert text.endswith("<think>\n\n</think>\n\n") and not prompt_opens_reasoning(text)


def test_conflicting_thinking_controls_are_refused() -> None:
    with pytest.raises(APIError, match="conflicts"):
        template_kwargs("none", ChatTemplateKwargs(enable_thinking=True))
    with pytest.raises(APIError, match="conflicts"):
        template_kwargs("high", ChatTemplateKwargs(reasoning_effort="low"))
    assert (
        template_kwargs("high", ChatTemplateKwargs(reasoning_effort="xhigh"))["reasoning_effort"] == "xhigh"
    )


def test_developer_messages_become_one_leading_system_message() -> None:
    text = render(
        messages=[
            {"role": "system", "content": "A."},
            {"role": "developer", "content": "B."},
            {"role": "user", "content": "hi"},
        ]
    )
    assert text.count("<|im_start|>system") == 1 and "A.\n\nB." in text


def test_template_errors_are_400s_with_the_template_message() -> None:
    with pytest.raises(APIError, match="No user query found") as info:
        render(messages=[{"role": "system", "content": "only system"}])
    assert info.value.status == 400


def test_late_system_and_developer_messages_join_the_leading_system_message_in_order() -> None:
    """The template refuses a system message past the start; agent clients send them there (Codex's per-turn
    developer message): each joins the one leading system message, in the order sent."""
    text = render(
        messages=[
            {"role": "system", "content": "A."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "developer", "content": "C."},
            {"role": "user", "content": "d"},
            {"role": "system", "content": "E."},
        ]
    )
    assert text.count("<|im_start|>system") == 1 and "A.\n\nC.\n\nE." in text
    assert text.index("E.") < text.index("<|im_start|>user\na")


def test_tool_round_trip_renders_calls_and_ordered_results() -> None:
    text = render(
        messages=[
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "need both",
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"days": 2}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "b", "content": "RESULT-B"},
            {"role": "tool", "tool_call_id": "a", "content": "RESULT-A"},
        ],
        tools=TOOLS,
    )
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text
    assert "<parameter=days>\n2\n</parameter>" in text
    assert text.index("RESULT-A") < text.index("RESULT-B")  # put back in call order
    assert "<think>\nneed both\n</think>" in text


def test_bad_tool_history_is_refused() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}
    with pytest.raises(APIError, match="must be a JSON object") as info:
        render(
            messages=[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}],
            tools=TOOLS,
        )
    assert info.value.param == "messages[1].tool_calls[0].function.arguments"
    call["function"]["arguments"] = "{}"
    with pytest.raises(APIError, match="answers no call"):
        render(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "zzz", "content": "r"},
            ],
            tools=TOOLS,
        )


def test_tool_choice_and_json_mode_become_instructions() -> None:
    base = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    assert "must call at least one" in render(**base, tool_choice="required")
    named = render(**base, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert "must call the function get_weather" in named
    assert "at most one function" in render(**base, parallel_tool_calls=False)
    none = render(**base, tool_choice="none")
    assert "<tools>" not in none
    assert "one valid JSON object" in render(
        messages=base["messages"], response_format={"type": "json_object"}
    )
