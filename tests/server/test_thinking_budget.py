"""`thinking_token_budget` over HTTP, on the scripted backend (its rows follow the script by absolute step, so
after the closing tokens the script goes on where it was): the reasoning holds the budget's tokens, then the
server's closing tokens end it, the answer follows, whole and streamed, with and without a drafter."""

from __future__ import annotations

import json

import httpx
import pytest

from elpis.server.thinking import CLOSING_TEXT

from .conftest import API_KEY, running_server
from .scripted import SCRIPTS, scripted_service
from .test_http_scripted import user

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HTTP = httpx.Client(timeout=60)
SCRIPT = "hello"  # "The user greets me.\nI greet back.\n</think>\n\nHello! How can I help?"


@pytest.fixture(scope="module", params=["drafter", "plain"])
def server(qwen_text, request):
    service, backend = scripted_service(qwen_text, drafter=request.param == "drafter")
    with running_server(lambda: service) as running:
        running.backend = backend
        yield running


def _chat(server, **body) -> httpx.Response:
    body = {"model": "scripted", "messages": user(f"hi SCRIPT:{SCRIPT}"), **body}
    return HTTP.post(server.url + "/v1/chat/completions", json=body, headers=AUTH)


def _expected(server, limit: int) -> tuple[str, list[int]]:
    """The reasoning the budget leaves, and every generated id: the script's first `limit` tokens, the
    closing tokens, then the script from the step after them, and the end of the turn."""
    tokenizer = server.server.service.tokenizer
    script = tokenizer.encode(SCRIPTS[SCRIPT])
    close = tokenizer.encode(CLOSING_TEXT, special=True)
    ids = [*script[:limit], *close, *script[limit + len(close) :], server.backend.end_of_turn]
    return tokenizer.decode(script[:limit]).strip(), ids


def test_the_budget_closes_the_reasoning_and_the_answer_follows(server) -> None:
    reasoning, ids = _expected(server, 3)
    reply = _chat(server, thinking_token_budget=3)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    message = data["choices"][0]["message"]
    assert message["reasoning_content"] == reasoning
    tokenizer = server.server.service.tokenizer
    answer = tokenizer.decode(ids[3 + len(tokenizer.encode(CLOSING_TEXT, special=True)) : -1]).strip()
    assert message["content"] == answer  # the script goes on by step: its own end comes later, as text
    assert data["usage"]["completion_tokens"] == len(ids)
    assert data["choices"][0]["finish_reason"] == "stop"


def test_the_streamed_answer_is_the_whole_one(server) -> None:
    whole = _chat(server, thinking_token_budget=2).json()["choices"][0]["message"]
    reasoning, content = "", ""
    body = {"model": "scripted", "messages": user(f"hi SCRIPT:{SCRIPT}"), "stream": True,
            "thinking_token_budget": 2}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    reasoning += choice["delta"].get("reasoning_content") or ""
                    content += choice["delta"].get("content") or ""
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])


def test_a_budget_the_reasoning_fits_changes_nothing(server) -> None:
    free = _chat(server).json()["choices"][0]["message"]
    roomy = _chat(server, thinking_token_budget=500).json()["choices"][0]["message"]
    assert roomy == free and free["content"] == "Hello! How can I help?"


def test_a_zero_budget_answers_at_once(server) -> None:
    _, ids = _expected(server, 0)
    data = _chat(server, thinking_token_budget=0).json()
    assert not data["choices"][0]["message"].get("reasoning_content")
    assert data["usage"]["completion_tokens"] == len(ids)


def test_thinking_off_leaves_the_budget_moot(server) -> None:
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    free = _chat(server, **kwargs).json()["choices"][0]["message"]
    budgeted = _chat(server, thinking_token_budget=1, **kwargs).json()["choices"][0]["message"]
    assert budgeted == free


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_a_malformed_budget_is_refused(server, value) -> None:
    reply = _chat(server, thinking_token_budget=value)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "thinking_token_budget", error


def test_the_servers_default_budget_holds_requests_that_name_none(qwen_text) -> None:
    """`elpis serve --thinking-budget N`: a request without a budget of its own is held to N; one that names
    a budget keeps its own."""
    service, backend = scripted_service(qwen_text)
    with running_server(lambda: service, default_thinking_budget=3) as running:
        running.backend = backend
        reasoning, _ = _expected(running, 3)
        held = _chat(running).json()["choices"][0]["message"]
        assert held["reasoning_content"] == reasoning
        own = _chat(running, thinking_token_budget=500).json()["choices"][0]["message"]
        assert own["content"] == "Hello! How can I help?"


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_malformed_default_budget_is_refused_at_start(value: str) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "elpis.cli", "serve", "--thinking-budget", value],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "argument --thinking-budget" in result.stderr
    assert "Traceback" not in result.stderr
