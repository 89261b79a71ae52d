"""Servers for the end-to-end tests: each runs in-process on its own thread and event loop, on a free port,
and is reached over real HTTP (the official `openai` client or raw sockets)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from elpis.server.app import Limits, OpenAIServer
from elpis.server.auth import Authorizer
from elpis.server.cli import serve
from elpis.server.service import ModelService

if TYPE_CHECKING:  # the client is imported where it is used: the lent GPU machine has no `openai`
    import openai

API_KEY = "sk-test-elpis-0123456789"


class RunningServer:
    def __init__(self, server: OpenAIServer, load: Callable[[], ModelService]) -> None:
        self.server = server
        self._load = load
        self.port = 0
        self.exit_code: int | None = None
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._main, name="test-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str = API_KEY, **kwargs) -> openai.OpenAI:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kwargs)

    def async_client(self, key: str = API_KEY, **kwargs) -> openai.AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kwargs)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()

        def listening(port: int) -> None:
            self.port = port
            self._listening.set()

        try:
            self.exit_code = await serve(self.server, "127.0.0.1", 0, self._load, stop=self.stop,
                                         on_listening=listening)  # fmt: skip
        finally:
            self._listening.set()

    def start(self, timeout: float = 120.0) -> RunningServer:
        self._thread.start()
        assert self._listening.wait(timeout), "server did not start listening"
        for _ in range(int(timeout * 20)):
            if self.server.service is not None or self.server.load_failure is not None:
                break
            threading.Event().wait(0.05)
        assert self.server.service is not None, f"model did not load: {self.server.load_failure}"
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop.set)
            self._thread.join(60)
            assert not self._thread.is_alive(), "server did not shut down"


@contextmanager
def running_server(load: Callable[[], ModelService], **limits) -> Iterator[RunningServer]:
    defaults = {"keepalive_s": 0.3, "header_timeout_s": 2.0, "body_timeout_s": 2.0, "shutdown_grace_s": 2.0}
    server = OpenAIServer(Authorizer(API_KEY), Limits(**{**defaults, **limits}))
    running = RunningServer(server, load).start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `elpis synth --tiny` checkpoint (random weights, real Qwen3.8 vocabulary and template)."""
    from elpis.reference.synth import write_tiny

    return write_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def qwen_text(tiny_model: Path):
    from elpis.text import load_chat_template, load_tokenizer

    return load_tokenizer(tiny_model), load_chat_template(tiny_model)


@pytest.fixture(scope="module")
def tiny(tiny_model: Path, qwen_text) -> Iterator[RunningServer]:
    """A server on the CPU reference backend over the tiny model, n-gram drafting (one per test module)."""
    from elpis.reference.loader import load_backend
    from elpis.spec import SpeculativeGenerator
    from elpis.spec.drafters import NgramDrafter

    tokenizer, template = qwen_text

    def load() -> ModelService:
        backend = load_backend(tiny_model, max_context=2048, model_id="tiny")
        generator = SpeculativeGenerator(backend, tokenizer, drafter=NgramDrafter(), tree_budget=8)
        return ModelService("tiny", tokenizer, template, generator, max_context=2048)

    with running_server(load) as server:
        yield server


def typed_events(lines: list[str]) -> list[dict]:
    """The events of a stream whose frames name their type (`event: T` then `data: {"type": T, ...}`), as
    the Responses and Messages APIs send them; keep-alive comments are skipped."""
    import json

    events, kind = [], None
    for line in lines:
        if not line or line.startswith(":"):
            continue  # frame separator, keep-alive comment
        if line.startswith("event: "):
            assert kind is None, line
            kind = line.removeprefix("event: ")
            continue
        assert line.startswith("data: ") and kind is not None, line
        event = json.loads(line.removeprefix("data: "))
        assert event["type"] == kind
        events.append(event)
        kind = None
    assert kind is None
    return events


def key_file(directory: Path, key: str = API_KEY, mode: int = 0o600) -> Path:
    path = directory / "api-key"
    path.write_text(key + "\n")
    os.chmod(path, mode)
    return path


def assert_cancelled_job_stopped(server: RunningServer, cancelled_before: int) -> int:
    """After a client left a stream: the scheduler goes idle, the backend runs no more rounds, and the job is
    counted as cancelled. Returns the backend's verify calls, for a bound on how far the job got."""
    import time

    deadline = time.monotonic() + 10
    while server.server.scheduler.running is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.server.scheduler.running is None
    calls = server.backend.verify_calls
    time.sleep(0.2)
    assert server.backend.verify_calls == calls  # the job stopped: no more rounds
    assert server.server.metrics.cancelled == cancelled_before + 1
    return calls
