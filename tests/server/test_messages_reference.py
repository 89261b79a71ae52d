"""`POST /v1/messages` on the CPU reference backend (the `elpis synth --tiny` model, n-gram drafting): a real
model's stream, stop sequences cut where the generator cuts, and grammar-held answers (structured output and
tool use), which a random model cannot write by chance."""

from __future__ import annotations

import json

from tests.grammar_cases import WEATHER, check_weather

from .test_messages_api import TOOLS, fold, ok, post, refused, stream

NO_THINK = {"thinking": {"type": "disabled"}}


def ask(text: str, max_tokens: int, **extra) -> dict:
    return {
        "model": "tiny",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
        **NO_THINK,
        **extra,
    }


def test_reference_model_streams_what_it_answers_whole(tiny) -> None:
    whole = ok(tiny, ask("Say something.", 24))
    events = stream(tiny, ask("Say something.", 24))
    deltas = [e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta"]
    [text] = whole["content"]
    assert text["text"] and len(deltas) > 1 and "".join(deltas) == text["text"]
    message = fold(events)
    assert message["content"] == whole["content"] and message["stop_reason"] == whole["stop_reason"]
    assert message["usage"]["output_tokens"] == whole["usage"]["output_tokens"] <= 24
    assert whole["stop_reason"] in ("end_turn", "max_tokens")


def test_reference_model_stop_sequence_cuts_exactly(tiny) -> None:
    full = ok(tiny, ask("Write.", 40))
    text = full["content"][0]["text"]
    assert len(text) > 12, text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = ok(tiny, ask("Write.", 40, stop_sequences=[stop]))
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop
    assert cut["content"] == [{"type": "text", "text": text[: text.index(stop)]}]
    streamed = fold(stream(tiny, ask("Write.", 40, stop_sequences=[stop])))
    assert streamed["content"] == cut["content"] and streamed["stop_sequence"] == stop


def test_reference_model_output_format_follows_the_schema(tiny) -> None:
    config = {"format": {"type": "json_schema", "schema": WEATHER}}
    reply = ok(tiny, ask("Weather?", 64, output_config=config))
    assert reply["stop_reason"] == "end_turn"
    check_weather(reply["content"][0]["text"])
    assert fold(stream(tiny, ask("Weather?", 64, output_config=config)))["content"] == reply["content"]
    bad = {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}
    message = refused(post(tiny, ask("Weather?", 64, output_config=bad)), 400, "invalid_request_error")
    assert message.startswith("output_config.format: ")


def test_reference_model_named_tool_use_is_well_formed(tiny) -> None:
    get_time = {
        "name": "get_time",
        "input_schema": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    }
    choice = {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}
    asked = ask("Time?", 64, tools=[*TOOLS, get_time], tool_choice=choice)
    reply = ok(tiny, asked)
    [call] = [block for block in reply["content"] if block["type"] == "tool_use"]
    assert call["name"] == "get_time" and call["input"] in ({"zone": "UTC"}, {"zone": "CET"})
    assert reply["stop_reason"] == "tool_use"
    streamed = fold(stream(tiny, asked))
    assert [b["input"] for b in streamed["content"] if b["type"] == "tool_use"] == [call["input"]]
    free = ok(tiny, {**asked, "tool_choice": {"type": "auto"}})
    assert "tool_use" not in [block["type"] for block in free["content"]]  # unheld, it writes no call
    assert json.dumps(free)
