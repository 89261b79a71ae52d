"""Reasoning / content / tool-call splitting of streamed text, and its invariance under re-chunking."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elpis.server.channels import OutputSplitter, TextEvent, ToolCallEvent, prompt_opens_reasoning
from elpis.server.holdback import partial_marker_len
from elpis.server.toolcalls import ToolCallDecoder

TOOLS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
}


def run(text: str | list[str], *, reasoning: bool, tools: bool = True, stopped: bool = True):
    splitter = OutputSplitter(starts_in_reasoning=reasoning, tools=ToolCallDecoder(TOOLS) if tools else None)
    events = []
    for piece in [text] if isinstance(text, str) else text:
        events += splitter.feed(piece)
    events += splitter.finish(stopped)
    return splitter, events


def fold(events) -> tuple[str, str, list[tuple[int, str, str]]]:
    reasoning = "".join(e.text for e in events if isinstance(e, TextEvent) and e.channel == "reasoning")
    content = "".join(e.text for e in events if isinstance(e, TextEvent) and e.channel == "content")
    calls = [(e.index, e.call.name, e.call.arguments) for e in events if isinstance(e, ToolCallEvent)]
    return reasoning, content, calls


CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def test_generation_that_starts_inside_think() -> None:
    splitter, events = run("\nI should look it up.\n</think>\n\nChecking.\n\n" + CALL, reasoning=True)
    reasoning, content, calls = fold(events)
    assert reasoning == "I should look it up."
    assert content == "Checking."
    assert calls == [(0, "get_weather", json.dumps({"city": "Paris", "days": 3}))]
    assert splitter.tool_calls == 1 and not splitter.problems


def test_think_open_in_the_output_and_absent() -> None:
    assert fold(run("<think>\nhm\n</think>\n\nHi", reasoning=False)[1])[:2] == ("hm", "Hi")
    splitter, events = run("Hi <think> there", reasoning=False)
    assert fold(events)[:2] == ("", "Hi <think> there") and not splitter.saw_reasoning


def test_unclosed_reasoning_leaves_content_empty() -> None:
    assert fold(run("thinking forever", reasoning=True, stopped=False)[1])[:2] == ("thinking forever", "")


def test_two_calls_and_text_between() -> None:
    text = CALL + "\n" + CALL.replace("Paris", "Rome")
    _, events = run(text, reasoning=False)
    _, content, calls = fold(events)
    assert content == "" and [c[0] for c in calls] == [0, 1]
    assert json.loads(calls[1][2])["city"] == "Rome"


def test_malformed_call_comes_back_as_content_and_is_logged(caplog) -> None:
    bad = "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"
    splitter, events = run(bad, reasoning=False)
    _reasoning, content, calls = fold(events)
    assert calls == [] and content == bad
    assert splitter.problems == ["unclosed parameter"]
    assert "[tool] unparsed: unclosed parameter" in caplog.text
    assert "Paris" not in caplog.text  # logs never carry model text


def test_undeclared_function_then_a_good_call() -> None:
    text = "<tool_call><function=rm_rf></function></tool_call>\n" + CALL
    splitter, events = run(text, reasoning=False)
    _, content, calls = fold(events)
    assert content == "<tool_call><function=rm_rf></function></tool_call>"
    assert [c[1] for c in calls] == ["get_weather"]
    assert "undeclared" in splitter.problems[0]


def test_cut_off_call_is_content() -> None:
    text = CALL.removesuffix("</tool_call>")
    assert fold(run(text, reasoning=False, stopped=False)[1])[1] == text
    assert fold(run(text, reasoning=False, stopped=True)[1])[2] != []  # stopped at </function>: a call


def test_without_tools_markup_is_plain_content() -> None:
    assert fold(run(CALL, reasoning=False, tools=False)[1]) == ("", CALL, [])


def test_hold_back_is_only_as_long_as_needed() -> None:
    splitter = OutputSplitter(starts_in_reasoning=False, tools=ToolCallDecoder(TOOLS))
    assert fold(splitter.feed("Hello <tool"))[1] == "Hello"  # " <tool" may start a call
    assert fold(splitter.feed("kit>"))[1] == " <toolkit>"  # it did not
    assert partial_marker_len("abc</thi", ["</think>"]) == 5
    assert partial_marker_len("abc</thx", ["</think>"]) == 0


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


# ------------------------------------------------------------------------------------- fuzz

PIECES = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=get_weather>",
    "<function=nope>",
    "<function=",
    "<parameter=city>",
    "<parameter=days>",
    "</parameter>",
    "</function>",
    "\n",
    " ",
    "\r\n",
    "Paris",
    "3",
    "[1,2]",
    "{",
    "<",
    ">",
    "=",
    "/",
    "x",
    "é",
    "</",
    "<tool",
    "</think",
]
space = st.sampled_from(["", " ", "\n", "\n\n", "\r\n", " \n"])
word = st.one_of(st.sampled_from(PIECES), st.text(max_size=3))


@st.composite
def call_markup(draw) -> str:
    """A tool call as the model writes it, sometimes damaged (cut short or with a stray character)."""
    name = draw(st.sampled_from(["get_weather", "get_weather", "nope", ""]))
    keys = draw(st.lists(st.sampled_from(["city", "days", "other", "city"]), max_size=3))
    text = draw(space) + "<tool_call>" + draw(space) + f"<function={name}>" + draw(space)
    for key in keys:
        text += f"<parameter={key}>{draw(space)}{draw(word)}{draw(space)}</parameter>{draw(space)}"
    text += "</function>" + draw(space) + draw(st.sampled_from(["</tool_call>", "</tool_call>", ""]))
    damage = draw(st.sampled_from(["none", "none", "cut", "insert"]))
    where = draw(st.integers(min_value=0, max_value=len(text)))
    if damage == "cut":
        text = text[:where]
    elif damage == "insert":
        text = text[:where] + draw(st.sampled_from(["x", "<", ">", "\n", "</think>"])) + text[where:]
    return text


segment = st.one_of(
    word,
    space.map(lambda s: s + "</think>"),
    st.tuples(space, space).map(lambda p: p[0] + "<think>" + p[1]),
    call_markup(),
    space,
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(segment, max_size=12),
    data=st.data(),
    reasoning=st.booleans(),
    tools=st.booleans(),
    stopped=st.booleans(),
)
def test_any_chunking_gives_the_same_answer(parts, data, reasoning, tools, stopped) -> None:
    """Streaming never changes the result, never raises, and never loses or invents text.

    Deltas are groups of the generated segments (like tokens arriving in rounds), some cut inside one.
    """
    text = "".join(parts)
    boundaries, position = [], 0
    for part in parts[:-1]:
        position += len(part)
        boundaries.append(position)
    keep = data.draw(st.lists(st.booleans(), min_size=len(boundaries), max_size=len(boundaries)))
    extra = data.draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=8))
    points = sorted({b for b, k in zip(boundaries, keep, strict=True) if k} | set(extra))
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    whole_splitter, whole = run(text, reasoning=reasoning, tools=tools, stopped=stopped)
    streamed_splitter, streamed = run(pieces, reasoning=reasoning, tools=tools, stopped=stopped)
    assert fold(whole) == fold(streamed)
    assert whole_splitter.problems == streamed_splitter.problems
    reasoning_text, content, calls = fold(whole)
    # without reasoning or calls the content is the text itself; otherwise nothing is invented
    if not calls and not whole_splitter.saw_reasoning:
        assert content == text
    for piece in (reasoning_text, content):
        assert set(piece) <= set(text)
    for _, _, arguments in calls:
        assert isinstance(json.loads(arguments), dict)
