"""`elpis bench gsm8k` and `elpis eval` end to end against the real `elpis serve` (SmolLM2 on the CPU),
started as a process with a temporary key file, exactly as a user would run them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from elpis.cli import main as elpis_main

KEY = "sk-gate-served-test-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from elpis.reference.assets import ensure_smollm2

    model = ensure_smollm2()
    key = tmp_path_factory.mktemp("served") / "api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    port = _free_port()
    log = key.parent / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "elpis.cli", "serve", "--model", str(model), "--api-key-file", str(key),
             "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=5)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, f"elpis serve exited: {log.read_text()[-3000:]}"
            try:
                client.models.list()
                break
            except openai.APIError:
                assert time.monotonic() < deadline, f"elpis serve did not come up: {log.read_text()[-3000:]}"
                time.sleep(0.5)
        yield url, key
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_gsm8k_workload_against_elpis_serve_is_reproducible(served, tmp_path: Path, capsys) -> None:
    url, key = served
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        argv = ["bench", "gsm8k", "--url", url, "--api-key-file", str(key), "--questions", "2",
                "--max-tokens", "12", "--out", str(out)]  # fmt: skip
        assert elpis_main(argv) == 0
        runs.append(json.loads(out.read_text()))
    for record in runs:
        assert record["model"].startswith("SmolLM2-135M-Instruct") and len(record["rows"]) == 2
        for row in record["rows"]:
            assert 1 <= row["completion_tokens"] <= 12 and row["tok_s"] > 0
            assert row["rounds"] >= 1 and 0 <= row["committed"] <= row["completion_tokens"]
        summary = record["summary"]
        assert summary["tok_s_min"] <= summary["tok_s_median"] <= summary["tok_s_max"]
        assert summary["tokens_per_round"] > 0
    capsys.readouterr()
    # Greedy decoding is deterministic: two runs give byte-identical answers.
    assert (
        elpis_main(["bench", "gsm8k", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    )
    assert "2/2 answers byte-identical" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_lanes_against_elpis_serve(served, tmp_path: Path) -> None:
    url, key = served
    out = tmp_path / "eval.json"
    argv = ["eval", "--url", url, "--api-key-file", str(key), "--gsm8k-n", "2", "--aime-n", "1",
            "--gsm8k-max-tokens", "24", "--aime-max-tokens", "16", "--out", str(out)]  # fmt: skip
    assert elpis_main(argv) == 0
    record = json.loads(out.read_text())
    assert record["thinking"] is True and record["model"].startswith("SmolLM2-135M-Instruct")
    assert [len(record["lanes"][lane]["rows"]) for lane in ("aime25", "gsm8k")] == [1, 2]
    for lane, budget in (("aime25", 16), ("gsm8k", 24)):
        for row in record["lanes"][lane]["rows"]:
            assert 1 <= row["completion_tokens"] <= budget
            assert row["finish_reason"] in ("stop", "length") and row["content"] is not None
            assert isinstance(row["correct"], bool) and row["gold"]
        summary = record["lanes"][lane]["summary"]
        assert summary["tasks"] == len(record["lanes"][lane]["rows"])
        assert summary["truncated"] == sum(
            r["finish_reason"] == "length" for r in record["lanes"][lane]["rows"]
        )
