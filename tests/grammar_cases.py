"""A JSON schema every grammar test shares: each value has few spellings, so a random model finishes the
object in a few dozen tokens; and the check that a text is that schema's JSON."""

from __future__ import annotations

import json
from typing import Any

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sunny": {"type": "boolean"},
        "wind": {"type": "integer", "minimum": 0, "maximum": 99},
        "sky": {"enum": ["clear", "cloudy", "storm"]},
    },
    "required": ["sunny", "wind", "sky"],
    "additionalProperties": False,
}


def check_weather(text: str) -> dict[str, Any]:
    """`text` parsed, asserted to be valid under WEATHER."""
    value = json.loads(text)
    assert set(value) == {"sunny", "wind", "sky"}, text
    assert isinstance(value["sunny"], bool) and isinstance(value["wind"], int), text
    assert 0 <= value["wind"] <= 99 and value["sky"] in WEATHER["properties"]["sky"]["enum"], text
    return value
