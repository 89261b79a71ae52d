"""The embedded default (SmolLM2-135M-Instruct on the CPU, loaded the way `elpis serve` loads it) answers
a real question correctly, whole and streamed."""

from __future__ import annotations

import argparse

import pytest

from elpis.server.cli import EMBEDDED_MODEL_ID, add_arguments, build_service

from .conftest import running_server

pytestmark = pytest.mark.slow  # a real 135M model decoding on the CPU
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])  # the defaults of `elpis serve` with no arguments
    with running_server(lambda: build_service(args)) as server:
        yield server


def test_models_lists_the_embedded_default(smollm2) -> None:
    assert [m.id for m in smollm2.client().models.list().data] == [EMBEDDED_MODEL_ID]


def test_capital_of_france(smollm2) -> None:
    client = smollm2.client()
    reply = client.chat.completions.create(model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=40)
    answer = reply.choices[0].message.content
    assert "Paris" in answer
    assert reply.choices[0].message.model_extra["reasoning_content"] is None
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=40, stream=True
        )
        if chunk.choices
    )
    assert streamed == answer


def test_capital_of_france_as_json(smollm2) -> None:
    """Structured output on a real model: the schema's JSON, and still the right answer."""
    import json

    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 40}},
              "required": ["capital"], "additionalProperties": False}
    reply = smollm2.client().chat.completions.create(
        model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert "Paris" in json.loads(reply.choices[0].message.content)["capital"]
