"""`elpis serve --backend exl3` on the GPU, end to end over HTTP (session 50).

The served configuration on the small synthetic checkpoint (its real Qwen tokenizer and chat template; tree
mode with its DFlash2 draft, rounds on the GPU for greedy requests, host rounds for sampled ones, the run
choice between 8 and 16 rows) answers chat completions, whole and streamed, with the text of the same
configuration serving trees of one row (`--tree-budget 1`: plain decoding through the same kernels), greedy
and sampled. Every other server test runs on the CPU backends."""

from __future__ import annotations

import argparse

import pytest

from elpis.server.cli import add_arguments, build_service
from tests.server.conftest import running_server

pytestmark = pytest.mark.gpu

MESSAGES = [{"role": "user", "content": "Count from one to twenty, then name three rivers."}]
REQUESTS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.8, "seed": 5}}


def serve_args(small, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        ["--backend", "exl3", "--model", str(small / "target"), "--draft", str(small / "draft"),
         "--max-context", "8192", *extra]
    )  # fmt: skip


def answers(server) -> dict[str, tuple[str, str]]:
    """Each request's (content + reasoning) whole and streamed, and checks that both agree."""
    client = server.client()
    model = client.models.list().data[0].id
    out = {}
    for name, extra in REQUESTS.items():
        reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=48, **extra)
        message = reply.choices[0].message
        whole = (message.content or "", message.model_extra.get("reasoning_content") or "")
        content, reasoning = [], []
        stream = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=48, stream=True, **extra
        )
        for chunk in stream:
            if chunk.choices:
                delta = chunk.choices[0].delta
                content.append(delta.content or "")
                reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
        assert ("".join(content), "".join(reasoning)) == whole, f"{name}: streamed differs from whole"
        assert 1 <= reply.usage.completion_tokens <= 48, reply.usage
        out[name] = whole
    return out


def test_the_served_exl3_configuration_answers_with_plain_decodings_text(small):
    with running_server(lambda: build_service(serve_args(small, "--tree-budget", "1"))) as plain:
        assert plain.server.service.generator.backend.run_choice is None  # one row: one row count
        expected = answers(plain)
    with running_server(lambda: build_service(serve_args(small))) as served:
        backend = served.server.service.generator.backend
        assert backend.tree and backend.device_rounds is not None
        assert backend.run_choice is not None and backend.run_choice.runs == (8, 16)
        got = answers(served)
        rounds = dict(backend.run_choice.chosen)
    assert got == expected
    assert sum(rounds.values()) >= 8, rounds  # greedy rounds on the GPU and sampled host rounds chose counts
    assert any(text for pair in got.values() for text in pair)
