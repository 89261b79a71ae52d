"""Shared fixtures for the Bend front end, prover and code generator tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from elpis.bend.check import Program, load
from elpis.bend.interp import Interpreter
from elpis.paths import REPO_ROOT

SOURCES = sorted([*(REPO_ROOT / "bend").glob("*.bend"), *(REPO_ROOT / "proofs").glob("*.bend")])


@pytest.fixture(scope="session")
def program() -> Program:
    return load(REPO_ROOT, [REPO_ROOT / "proofs/PROOF.bend"])


@pytest.fixture(scope="session")
def interp(program: Program) -> Interpreter:
    return Interpreter(program)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the Bend sources, proofs and templates to mutate."""
    for d in ("bend", "proofs", "codegen"):
        shutil.copytree(REPO_ROOT / d, tmp_path / d)
    return tmp_path


def write_module(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(text)
    return path
