"""Admission refuses every kind of damage to a build, with the reason, and accepts a pristine copy."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elpis.accept import abi, identity, loader, table
from elpis.paths import REPO_ROOT


@pytest.fixture
def copy(build_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the admitted build, safe to damage."""
    target = tmp_path / "accept"
    shutil.copytree(build_dir, target)
    return target


def _rewrite_identity(
    build: Path, change: Callable[[dict[str, Any]], None], *, redigest: bool = True
) -> None:
    path = build / identity.IDENTITY
    ident = json.loads(path.read_text())
    change(ident)
    if redigest:
        ident["identity_sha256"] = identity.digest(ident)
    path.write_text(json.dumps(ident))


def _refused(build: Path, match: str, root: Path = REPO_ROOT) -> None:
    with pytest.raises(loader.AdmissionError, match=match):
        loader.admit(build, root)


def test_a_pristine_copy_is_admitted(copy: Path) -> None:
    admitted = loader.admit(copy, REPO_ROOT)
    assert admitted.identity["table_sha256"] == loader.TABLE_SHA256
    assert admitted.lib.elpis_chain_checked is not None


def test_missing_directory(tmp_path: Path) -> None:
    _refused(tmp_path / "nothing", "does not exist")


def test_extra_file(copy: Path) -> None:
    (copy / "notes.txt").write_text("hello")
    _refused(copy, r"unexpected files \['notes.txt'\]")


def test_missing_file(copy: Path) -> None:
    (copy / identity.CERTIFICATES).unlink()
    _refused(copy, r"missing files \['certificates.json'\]")


def test_symlinked_file(copy: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.h"
    shutil.move(copy / identity.GENERATED_H, real)
    os.symlink(real, copy / identity.GENERATED_H)
    _refused(copy, "not a regular file")


def test_symlinked_directory(copy: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    os.symlink(copy, link)
    _refused(link, "symlink")


def test_tampered_library_byte(copy: Path) -> None:
    lib = copy / loader.LIBRARY
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(bytes(data))
    _refused(copy, f"{loader.LIBRARY}: SHA-256 .* differs")


def test_tampered_table_byte(copy: Path) -> None:
    path = copy / identity.TABLE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    _refused(copy, "table.bin: SHA-256 .* differs")


@pytest.mark.parametrize(
    "name", [identity.GENERATED_C, identity.GENERATED_H, identity.WRAPPER_C, identity.CERTIFICATES]
)
def test_tampered_artifact(copy: Path, name: str) -> None:
    with open(copy / name, "ab") as f:
        f.write(b" ")
    _refused(copy, f"{name}: SHA-256 .* differs")


def test_identity_edited_without_its_digest(copy: Path) -> None:
    _rewrite_identity(copy, lambda i: i["toolchain"].update(cc_version="other"), redigest=False)
    _refused(copy, "does not recompute")


def test_identity_with_an_extra_key(copy: Path) -> None:
    _rewrite_identity(copy, lambda i: i.update(extra=1))
    _refused(copy, "keys")


def test_identity_not_json(copy: Path) -> None:
    (copy / identity.IDENTITY).write_text("{")
    _refused(copy, "not JSON")


def test_stale_pin(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "TABLE_SHA256", "0" * 64)
    _refused(copy, "not the pinned")


def test_toolchain_mismatch(copy: Path) -> None:
    _rewrite_identity(copy, lambda i: i["toolchain"].update(cffi="0.0"))
    _refused(copy, "toolchain differs.*cffi")


def test_loader_is_not_the_recorded_one(copy: Path) -> None:
    _rewrite_identity(copy, lambda i: i["sources"].update({"elpis/accept/loader.py": "0" * 64}))
    _refused(copy, "running loader")


def _source_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rel in identity.ROOT_SOURCE_DIRS:
        shutil.copytree(REPO_ROOT / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_sources_changed_since_the_build(copy: Path, tmp_path: Path) -> None:
    root = _source_root(tmp_path)
    loader.admit(copy, root)  # the same sources elsewhere are fine
    bend_file = sorted((root / "bend").glob("*.bend"))[0]
    bend_file.write_text(bend_file.read_text() + "\n")
    _refused(copy, rf"stale build.*changed \['bend/{bend_file.name}'\]", root)


def test_sources_added_since_the_build(copy: Path, tmp_path: Path) -> None:
    root = _source_root(tmp_path)
    (root / "ext" / "extra.c").write_text("/* new */\n")
    _refused(copy, r"stale build.*added \['ext/extra.c'\]", root)


def test_library_constant_mismatch(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(abi.LIBRARY_CONSTANTS, "ELPIS_TREE_CELLS", abi.TREE_CELLS + 1)
    _refused(copy, "library constant ELPIS_TREE_CELLS")


def test_consistently_rehashed_but_wrong_table_fails_the_rerun(
    copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with every hash made to agree, the re-run through the library catches a wrong expectation."""
    path = copy / identity.TABLE
    data = bytearray(path.read_bytes())
    first_codes = (
        len(table.MAGIC) + 8 + int.from_bytes(data[len(table.MAGIC) : len(table.MAGIC) + 8], "little")
    )
    data[first_codes] ^= 0x02  # the first chain decision's count, off by one
    path.write_bytes(bytes(data))
    new = identity.sha256_file(path)
    monkeypatch.setattr(loader, "TABLE_SHA256", new)

    def rehash(ident: dict[str, Any]) -> None:
        ident["artifacts"][identity.TABLE] = new
        ident["table_sha256"] = new

    _rewrite_identity(copy, rehash)
    _refused(copy, "table re-check failed: section chain_patterns decision 0")


def test_probe_expectations_are_enforced(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = loader.probe_cases()
    name, kind, cells, _ = real[0]
    monkeypatch.setattr(loader, "probe_cases", lambda: [(name, kind, cells, abi.ERR_ID)])
    _refused(copy, f"probe {name!r}")


def test_every_probe_passes_on_the_admitted_library(acceptor: Any) -> None:
    from elpis.accept import tablefile

    for name, kind, cells, expected in loader.probe_cases():
        code = int(tablefile.library_outputs(acceptor.ffi, acceptor.lib, kind, cells[None, :])["codes"][0])
        assert (code >= 0) if expected is None else (code == expected), name
