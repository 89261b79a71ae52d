"""`elpis serve` as a process: refusals at start-up, and a graceful SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import API_KEY, key_file

SERVE = [sys.executable, "-m", "elpis.cli", "serve"]


def refusal(args: list[str], **kwargs) -> str:
    result = subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=120, **kwargs)
    assert result.returncode == 2, result.stderr
    return result.stderr


@pytest.mark.parametrize("mode", [0o644, 0o604])
def test_refuses_a_key_file_others_can_read(tmp_path: Path, mode: int) -> None:
    stderr = refusal(["--api-key-file", str(key_file(tmp_path, mode=mode)), "--port", "0"])
    assert f"mode {mode:04o}" in stderr and "0600 or 0400" in stderr


def test_refuses_no_auth_off_loopback() -> None:
    stderr = refusal(["--no-auth", "--host", "0.0.0.0", "--port", "0"])
    assert "loopback" in stderr


@pytest.mark.parametrize("port", ["65536", "-1", "http"])
def test_a_port_outside_0_to_65535_is_refused_by_name(port: str) -> None:
    stderr = refusal(["--port", port])
    assert "argument --port" in stderr and "Traceback" not in stderr


def test_a_port_in_use_is_refused_naming_the_address(tmp_path: Path, tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        key = str(key_file(tmp_path))
        stderr = refusal(["--model", str(tiny_model), "--api-key-file", key, "--port", str(port)])
    assert f"cannot listen on 127.0.0.1:{port}" in stderr and "Traceback" not in stderr


def test_refuses_to_start_without_an_admitted_acceptor(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; import elpis.paths as p; "
        f"p.ACCEPT_BUILD_DIR = Path({str(tmp_path / 'no-build')!r}); "
        "from elpis.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", "--no-auth", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "acceptor" in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_shuts_down_within_the_grace_period(tmp_path: Path, tiny_model: Path) -> None:
    port = free_port()
    key = key_file(tmp_path)
    process = subprocess.Popen(
        [*SERVE, "--model", str(tiny_model), "--draft", "none", "--api-key-file", str(key),
         "--port", str(port), "--shutdown-grace", "1", "--keepalive", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read()
            time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 4000,
                "ignore_eos": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {API_KEY}"}
        frames = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line)
                if len(frames) == 3:
                    process.send_signal(signal.SIGTERM)
                    sent = time.monotonic()
        code = process.wait(timeout=30)
        assert code == 0
        assert time.monotonic() - sent < 10
        last = json.loads(frames[-1].removeprefix("data: "))
        assert last["error"]["code"] == "server_shutting_down"  # cut off, and told so
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
