"""`elpis verify-models` on fake model directories with a test manifest."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from elpis.cli import main
from elpis.manifest import ManifestError, load_manifest, model_fingerprint, require_synthetic, verify

FILES = {
    "target": {"config.json": b"{}", "model.safetensors": b"weights" * 1000},
    "draft": {"config.json": b'{"d": 1}', "model.safetensors": b"draft"},
}


@pytest.fixture
def setup(tmp_path: Path):
    manifest = {"schema_version": 1}
    for role, files in FILES.items():
        d = tmp_path / role
        d.mkdir()
        for name, data in files.items():
            (d / name).write_bytes(data)
        manifest[role] = {
            "repo": f"x/{role}",
            "revision": "0" * 40,
            "files": {n: hashlib.sha256(b).hexdigest() for n, b in files.items()},
        }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return tmp_path / "target", tmp_path / "draft", path


def cli(target, draft, manifest) -> int:
    return main(
        ["verify-models", "--target", str(target), "--draft", str(draft), "--manifest", str(manifest)]
    )


def test_matching_dirs_pass(setup, capsys):
    assert cli(*setup) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda t, d: (t / "model.safetensors").write_bytes(b"tampered"),
            "target: model.safetensors has SHA-256",
        ),
        (lambda t, d: (d / "config.json").unlink(), "draft: missing file config.json"),
        (lambda t, d: (t / "README.md").write_text("x"), "target: unexpected file README.md"),
        (lambda t, d: (t / "sub").mkdir(), "unexpected subdirectory sub"),
        (
            lambda t, d: ((t / "config.json").unlink(), os.symlink(d / "config.json", t / "config.json")),
            "symlink",
        ),
    ],
)
def test_each_problem_is_named_and_fails(setup, capsys, damage, message):
    target, draft, manifest = setup
    damage(target, draft)
    assert cli(target, draft, manifest) == 1
    assert message in capsys.readouterr().err


def test_symlinked_directory_refused(setup, tmp_path):
    target, draft, manifest = setup
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ManifestError, match="is a symlink"):
        verify(link, draft, manifest)


def test_missing_directory(setup, tmp_path):
    _, draft, manifest = setup
    with pytest.raises(ManifestError, match="does not exist"):
        verify(tmp_path / "nope", draft, manifest)


def test_packaged_manifest_is_well_formed():
    pinned = load_manifest()
    assert pinned["target"].revision == "3f1771b8c21f83cbb8e82169559ced9f38ca04e5"
    assert len(pinned["target"].files) == 13 and len(pinned["draft"].files) == 3


def test_bad_manifest(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"schema_version": 1, "target": {"files": {"a": "XYZ"}}, "draft": {}}))
    with pytest.raises(ManifestError):
        load_manifest(path)


def test_synthetic_rule(setup, tmp_path):
    target, draft, _ = setup
    with pytest.raises(ManifestError, match="not a synthetic checkpoint"):
        require_synthetic(target, draft)
    for d in (target, draft):
        (d / "config.json").write_text(json.dumps({"synthetic": True}))
    require_synthetic(target, draft)


def test_fingerprint_follows_content(setup):
    target, draft, _ = setup
    before = model_fingerprint(target, draft)
    assert before == model_fingerprint(target, draft)
    (draft / "model.safetensors").write_bytes(b"other")
    assert model_fingerprint(target, draft) != before
