"""The front door: the README's commands, the CI entry and the flake stay consistent."""

from __future__ import annotations

import os
import re
import shlex
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


def _makefile_elpis_commands() -> list[list[str]]:
    """Every `$(BIN)/elpis ...` command in the Makefile's recipes, its make variables replaced by their
    defaults (`?=` / `:=` lines), split into words up to the shell's `&&`, `;`, `}` or `|`."""
    text = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    defaults = dict(re.findall(r"^(\w+)[ \t]*[:?]?=[ \t]*(.*)$", text, re.MULTILINE))
    commands = []
    for match in re.finditer(r"\$\(BIN\)/elpis\s+([^;&|}\n]*)", text):
        words = shlex.split(re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), ""), match.group(1)))
        commands.append(words)
    return commands


def test_the_makefiles_elpis_commands_parse() -> None:
    """`make bench` once called `elpis bench` without its required mode: every command a make target runs
    must be one the CLI accepts (parsed only, nothing runs)."""
    import argparse
    import importlib

    commands = _makefile_elpis_commands()
    assert {c[0] for c in commands} >= {"prove", "build", "serve", "bench", "synth"}
    for words in commands:
        name, rest = words[0], words[1:]
        assert name in COMMANDS, f"the Makefile runs an unknown command: elpis {' '.join(words)}"
        parser = argparse.ArgumentParser(prog=f"elpis {name}", exit_on_error=False)
        importlib.import_module(COMMANDS[name][0]).add_arguments(parser)
        try:
            parser.parse_args(rest)
        except (argparse.ArgumentError, SystemExit) as exc:
            pytest.fail(f"the Makefile's `elpis {' '.join(words)}` does not parse: {exc}")
