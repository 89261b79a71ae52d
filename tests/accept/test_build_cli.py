"""`elpis build` on the command line: a failing build exits 1, names its layer, and leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.accept.build import LAYERS, BuildError
from elpis.cli import main


def test_failing_build_exits_one_and_names_the_layer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "empty-root"  # no bend/ or proofs/: the prover refuses
    root.mkdir()
    out = tmp_path / "out" / "accept"
    assert main(["build", "--root", str(root), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "build failed" in err and "prove" in err
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir()] == [".accept.lock"], "staging left behind"


def test_a_killed_builds_leftovers_are_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "out" / "accept"
    out.parent.mkdir(parents=True)
    for name in (".accept-staging-abc123", ".accept-old-def456"):
        (out.parent / name).mkdir()
        (out.parent / name / "half-written").write_text("x")
    keep = out.parent / ".accept-notes"
    keep.mkdir()
    assert main(["build", "--root", str(tmp_path / "missing-root"), "--out", str(out)]) == 1
    assert sorted(p.name for p in out.parent.iterdir()) == [".accept-notes", ".accept.lock"]


def test_build_errors_only_name_known_layers() -> None:
    assert BuildError("table", "x").layer == "table"
    with pytest.raises(ValueError, match="unknown build layer"):
        BuildError("somewhere", "x")
    assert LAYERS == ("prove", "generate", "c-scan", "compile", "table", "identity", "admission")
