"""The front door: the README's commands, the CI entry and the flake stay consistent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from elpis.cli import COMMANDS, main
from elpis.paths import REPO_ROOT


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make serve" in readme
    assert re.search(r"make test$", ci, re.MULTILINE), ".ci/run must call the README's test command"


def test_flake_parses() -> None:
    tool = shutil.which("nix-instantiate")
    if tool is None:
        if os.environ.get("ELPIS_REQUIRE_NIX") == "1":
            pytest.fail("nix-instantiate is required here (Debian package nix-bin)")
        pytest.skip("nix-instantiate not installed (Debian package nix-bin); .ci/run installs it")
    subprocess.run([tool, "--parse", str(REPO_ROOT / "flake.nix")], check=True, capture_output=True)


def test_flake_apps_call_the_make_targets() -> None:
    flake = (REPO_ROOT / "flake.nix").read_text()
    makefile = (REPO_ROOT / "Makefile").read_text()
    for target in ("prove", "build", "serve"):
        assert f'{target} = makeApp "{target}"' in flake
        assert re.search(rf"^{target}:", makefile, re.MULTILINE)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"elpis {command}" in capsys.readouterr().out


def test_unknown_command_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "elpis.cli", "no-such-command"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
