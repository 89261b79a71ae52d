"""Shared fixtures for the Bend front end, prover and code generator tests."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from elpis.bend.check import Program, load
from elpis.bend.interp import Interpreter
from elpis.bend.prove import prove_all
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


def fails_its_law(repo_copy: Path, module: str, old: str, new: str, law: str) -> None:
    """A Bend program (`module`, in a repository copy) with `old` (once in it) made `new` fails `law`, and
    nothing else of what is proved with it."""
    path = repo_copy / module
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    report = prove_all(repo_copy, jobs=1, only={law})
    assert not report.ok
    assert len(report.failures) == 1 and law in report.failures[0]


def exported_parameters(spec: ScalarHeader) -> set[str]:
    """A scalar schedule's rendered header: each entry exported with its U32 parameters through the header's
    host-and-device qualifier, every generated name under the header's prefixes; the entries' parameter names
    (so a test can say no function takes the row count)."""
    text = spec.render(REPO_ROOT)
    for name, entry in spec.entries.items():
        params = ", ".join(["uint32_t [a-z0-9]+"] * entry.arity)
        assert re.search(rf"{spec.stem}_FN uint32_t {name}\({params}\)", text), name
    assert f"#define {spec.stem}_FN __host__ __device__ static inline" in text
    exported = f"{spec.stem.lower()}_"  # the entries' prefix, e.g. elpis_gdnba_
    names = set(re.findall(r"\b(?:bend|elpis)_[a-z0-9_]+(?=\()", text))
    assert names and all(n.startswith((spec.prefix, exported)) for n in names), names
    return set(re.findall(r"uint32_t ([a-z0-9_]+)[,)]", text.split("exported entry points")[1]))
