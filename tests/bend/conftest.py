"""Shared fixtures for the Bend front end, prover and code generator tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from elpis.bend.check import Program, load
from elpis.bend.interp import Interpreter
from elpis.bend.scalar_header import ScalarHeader
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


def refuses_edited_header(spec: ScalarHeader, tmp_path: Path, old: str, new: str) -> None:
    """A scalar schedule's header with `old` (once in it) made `new` fails its table check."""
    text = spec.render(REPO_ROOT)
    assert text.count(old) == 1, old
    bad = tmp_path / spec.header
    bad.write_text(text.replace(old, new))
    with pytest.raises(spec.error):
        spec.check_header(bad, REPO_ROOT)


def fails_closed_on_template_edit(
    spec: ScalarHeader, repo_copy: Path, tmp_path: Path, old: str, new: str
) -> None:
    """A scalar schedule's template with `old` (once in it) made `new` builds no header: its table refuses."""
    template = repo_copy / "codegen" / spec.template
    text = template.read_text()
    assert text.count(old) == 1, old
    template.write_text(text.replace(old, new))
    out = tmp_path / "kernels"
    with pytest.raises(spec.error):
        spec.build(out, repo_copy)
    assert not (out / spec.header).exists()
