"""Fixtures of the gate tests: a throwaway git repository whose commit times the test chooses."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


class GitRepo:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str, when: int | None = None) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        if when is not None:
            env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{when} +0000"
        done = subprocess.run(
            ["git", *args], cwd=self.root, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout

    def commit(self, rel: str, text: str, when: int) -> str:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.git("add", rel)
        self.git("commit", "-q", "-m", f"write {rel}", when=when)
        return self.git("rev-parse", "HEAD").strip()


@pytest.fixture
def git_repo(tmp_path: Path) -> GitRepo:
    return GitRepo(tmp_path / "repo")


# --- an OpenAI-shaped HTTP server (aiohttp, real sockets) for the client tests --------------------------
# It answers from the packaged data: the gold answer for tasks at even positions, a wrong one at odd
# positions, so a client that scores correctly gets exactly ceil(n / 2) right.

STUB_KEY = "stub-key-0123"


class StubServer:
    def __init__(self, variant: str = "a") -> None:
        from elpis.gate.corpus import aime_tasks, chatml_prompt, gsm8k_tasks

        self.variant = variant  # "b" changes the text of question 1: byte comparisons must notice
        self.requests: list[tuple[str, dict]] = []
        self._gold = {}
        for i, task in enumerate(gsm8k_tasks() + aime_tasks()):
            self._gold[task.question] = (i % 2 == 0, task.gold, i)
            self._gold[chatml_prompt(task.question)] = (i % 2 == 0, task.gold, i)
        self.url = ""

    def _answer(self, question_text: str) -> tuple[str, int]:
        for question, (right, gold, index) in self._gold.items():
            if question_text.startswith(question):
                value = gold if right else str(int(float(gold)) + 1)
                extra = " (variant b)" if self.variant == "b" and index == 1 else ""
                return f"Step by step{extra}. The final answer is \\boxed{{{value}}}", index
        raise AssertionError(f"unknown question {question_text[:60]!r}")

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def _completions(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append(("completions", body))
        text, index = self._answer(body["prompt"])
        words = text.split(" ")[: body["max_tokens"]]
        text = " ".join(words)
        usage = {
            "prompt_tokens": 20 + index,
            "completion_tokens": len(words),
            "total_tokens": 20 + index + len(words),
            "speculation": {"rounds": max(1, len(words) // 2), "committed_tokens": len(words)},
        }
        finish = "length" if len(words) == body["max_tokens"] else "stop"
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
        )

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append(("chat", body))
        text, _ = self._answer(body["messages"][-1]["content"])
        message = {"role": "assistant", "content": text, "reasoning_content": "thinking..."}
        usage = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )

    def app(self):
        from aiohttp import web

        @web.middleware
        async def auth(request, handler):
            if request.headers.get("Authorization") != f"Bearer {STUB_KEY}":
                return web.json_response(
                    {
                        "error": {
                            "message": "bad key",
                            "type": "authentication_error",
                            "param": None,
                            "code": "invalid_api_key",
                        }
                    },
                    status=401,
                )
            return await handler(request)

        app = web.Application(middlewares=[auth])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app


@pytest.fixture
def stub_server():
    """Start `StubServer` instances on loopback ports in a background event loop; stop them after."""
    import asyncio
    import threading

    from aiohttp import web

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    def start(variant: str = "a") -> StubServer:
        server = StubServer(variant)

        async def up():
            runner = web.AppRunner(server.app())
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            return runner.addresses[0][1]

        port = asyncio.run_coroutine_threadsafe(up(), loop).result(timeout=30)
        server.url = f"http://127.0.0.1:{port}"
        return server

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(STUB_KEY + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `elpis synth --tiny` checkpoint: random weights, the real Qwen3.8 vocabulary and template."""
    from elpis.reference.synth import write_tiny

    return write_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)
