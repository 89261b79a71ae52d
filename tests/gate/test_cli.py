"""`elpis gate` user errors: a clear message on stderr and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.cli import main as elpis_main
from elpis.gate.rules import RULES_DIR

MODEL = ["gate", "model", "--model", "x", "--reference", "reference:dtype=fp64"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gate", "op", "--backend", "tpu"], "unknown backend"),
        (["gate", "op", "--backend", "reference"], "need --model"),
        (["gate", "op", "--option", "novalue"], "KEY=VALUE"),
        ([*MODEL, "--arm", "nospec"], "NAME=SPEC"),
        ([*MODEL, "--arm", "a=reference:rows"], "not key=value"),
        (["gate", "verdict", "--rules", "/nonexistent.toml", "--measurement", "m.json", "--candidate", "c",
          "--patch", "p"], "cannot read rule file"),
    ],
)  # fmt: skip
def test_user_errors_exit_2(argv: list[str], message: str, capsys) -> None:
    assert elpis_main(argv) == 2
    assert message in capsys.readouterr().err


def test_verdict_on_a_missing_measurement(tmp_path: Path, capsys) -> None:
    argv = ["gate", "verdict", "--rules", str(RULES_DIR / "cpu-reference-r1.toml"), "--measurement",
            str(tmp_path / "none.json"), "--candidate", "c", "--patch", "p"]  # fmt: skip
    assert elpis_main(argv) == 2
    assert "cannot read measurement" in capsys.readouterr().err


def test_contexts_must_be_integers(capsys) -> None:
    assert elpis_main(["gate", "op", "--backend", "reference", "--model", "x", "--contexts", "a,b"]) == 2
    assert "--contexts must be comma-separated integers" in capsys.readouterr().err
