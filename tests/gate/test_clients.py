"""`elpis bench gsm8k` and `elpis eval` end to end against an OpenAI-shaped aiohttp server on a real socket.

(The end-to-end runs against the real `elpis serve` are in `test_served.py`.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from elpis.bench import gsm8k
from elpis.cli import main as elpis_main
from elpis.gate.client import ClientError, read_api_key
from elpis.gate.corpus import chatml_prompt, gsm8k_tasks


def _bench(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    gsm8k.add_arguments(parser)
    return gsm8k.run(parser.parse_args(list(argv)))


def test_gsm8k_workload_sends_the_common_requests_and_reports(
    stub_server, key_file: Path, tmp_path: Path
) -> None:
    server = stub_server()
    out = tmp_path / "a.json"
    assert (
        _bench("--url", server.url, "--api-key-file", str(key_file), "--questions", "4", "--out", str(out))
        == 0
    )
    record = json.loads(out.read_text())
    questions = [t.question for t in gsm8k_tasks(4)]
    assert [body["prompt"] for _, body in server.requests] == [chatml_prompt(q) for q in questions]
    assert all(
        body["temperature"] == 0 and body["max_tokens"] == 512 and body["model"] == "stub-model"
        for _, body in server.requests
    )
    assert len(record["rows"]) == 4
    assert [r["correct"] for r in record["rows"]] == [True, False, True, False]
    s = record["summary"]
    assert s["requests"] == 4 and s["correct"] == 2 and s["capped"] == 0
    assert s["tok_s_min"] <= s["tok_s_median"] <= s["tok_s_max"]
    tokens = sum(r["completion_tokens"] for r in record["rows"])
    rounds = sum(r["rounds"] for r in record["rows"])
    assert s["tokens_per_round"] == pytest.approx(tokens / rounds)
    assert record["identity"]["versions"]["torch"]


def test_short_budget_is_respected_and_reported_as_capped(
    stub_server, key_file: Path, tmp_path: Path
) -> None:
    server = stub_server()
    out = tmp_path / "short.json"
    assert (
        _bench(
            "--url",
            server.url + "/v1/",
            "--api-key-file",
            str(key_file),
            "--questions",
            "2",
            "--max-tokens",
            "3",
            "--out",
            str(out),
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert all(r["completion_tokens"] == 3 and r["finish_reason"] == "length" for r in record["rows"])
    assert record["summary"]["capped"] == 2


def test_compare_finds_the_differing_answer(stub_server, key_file: Path, tmp_path: Path, capsys) -> None:
    paths = {}
    for name, variant in (("a1", "a"), ("a2", "a"), ("b", "b")):
        server = stub_server(variant)
        paths[name] = tmp_path / f"{name}.json"
        assert (
            _bench(
                "--url",
                server.url,
                "--api-key-file",
                str(key_file),
                "--questions",
                "3",
                "--out",
                str(paths[name]),
            )
            == 0
        )
    capsys.readouterr()
    assert _bench("--compare", str(paths["a1"]), str(paths["a2"])) == 0
    assert "3/3 answers byte-identical" in capsys.readouterr().out
    assert _bench("--compare", str(paths["a1"]), str(paths["b"])) == 1
    out = capsys.readouterr().out
    assert "2/3" in out and "question 1: first difference at byte 12" in out


def test_compare_refuses_different_workloads(tmp_path: Path, capsys) -> None:
    base = {"format": gsm8k.FORMAT, "questions": 2, "max_tokens": 512, "prompt_format": "x", "rows": []}
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(json.dumps({**base, "max_tokens": 64}))
    assert _bench("--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")) == 2
    assert "different workloads: max_tokens" in capsys.readouterr().err


def test_user_errors_exit_2_with_a_reason(stub_server, tmp_path: Path, capsys) -> None:
    server = stub_server()
    wrong = tmp_path / "wrong-key"
    wrong.write_text("nope\n")
    assert _bench("--url", server.url, "--api-key-file", str(wrong), "--questions", "1") == 2
    assert "refused the API key" in capsys.readouterr().err
    assert _bench("--url", "ftp://x", "--questions", "1") == 2
    assert "http://" in capsys.readouterr().err
    assert _bench("--questions", "1") == 2
    assert "--url is required" in capsys.readouterr().err
    assert _bench("--url", server.url, "--api-key-file", str(tmp_path / "missing")) == 2
    assert "cannot read API key file" in capsys.readouterr().err


def test_api_key_file_rules(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("abc\n")
    assert read_api_key(tmp_path / "k") == "abc"
    (tmp_path / "sp").write_text("a b\n")
    with pytest.raises(ClientError, match="printable ASCII"):
        read_api_key(tmp_path / "sp")
    (tmp_path / "link").symlink_to(tmp_path / "k")
    with pytest.raises(ClientError, match="not a regular file"):
        read_api_key(tmp_path / "link")


def test_eval_lanes_score_exactly_and_save_everything(stub_server, key_file: Path, tmp_path: Path) -> None:
    server = stub_server()
    out = tmp_path / "eval.json"
    code = elpis_main(
        [
            "eval",
            "--url",
            server.url,
            "--api-key-file",
            str(key_file),
            "--gsm8k-n",
            "3",
            "--aime-n",
            "2",
            "--aime-max-tokens",
            "64",
            "--gsm8k-max-tokens",
            "32",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    record = json.loads(out.read_text())
    gsm, aime = record["lanes"]["gsm8k"], record["lanes"]["aime25"]
    assert [r["correct"] for r in gsm["rows"]] == [True, False, True]
    # AIME tasks follow the 1,319 GSM8K rows in the stub: odd position first.
    assert [r["correct"] for r in aime["rows"]] == [False, True]
    assert gsm["summary"]["correct"] == 2 and aime["summary"]["correct"] == 1
    assert aime["rows"][0]["reasoning"] == "thinking..." and aime["rows"][0]["completion_tokens"] == 12
    chats = [body for kind, body in server.requests if kind == "chat"]
    assert len(chats) == 5
    assert all(
        b["temperature"] == 0 and b["chat_template_kwargs"] == {"enable_thinking": True} for b in chats
    )
    assert [b["max_tokens"] for b in chats] == [64, 64, 32, 32, 32]
    assert chats[0]["messages"][0]["content"].endswith("within \\boxed{}.")


def test_eval_rejects_unknown_lanes(stub_server, key_file: Path, capsys) -> None:
    server = stub_server()
    assert elpis_main(["eval", "--url", server.url, "--api-key-file", str(key_file), "--lanes", "mmlu"]) == 2
    assert "unknown lane" in capsys.readouterr().err
