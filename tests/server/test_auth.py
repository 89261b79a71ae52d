"""API key file rules, constant-time header check, loopback rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elpis.server.auth import Authorizer, KeyFileError, is_loopback, load_api_key, write_new_key


def key_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "key"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_key_files_load(tmp_path: Path, mode: int) -> None:
    assert load_api_key(key_file(tmp_path, b"sk-test-123\n", mode)) == "sk-test-123"


@pytest.mark.parametrize(
    ("mode", "content", "reason"),
    [
        (0o644, b"k", "mode 0644"),
        (0o640, b"k", "mode 0640"),
        (0o700, b"k", "mode 0700"),
        (0o600, b"", "empty"),
        (0o600, b"\n", "empty"),
        (0o600, b"has space", "printable ASCII"),
        (0o600, b"two\nlines", "printable ASCII"),
        (0o600, "clé".encode(), "printable ASCII"),
        (0o600, b"k" * 4097, "longer than 4096"),
    ],
)
def test_bad_key_files_are_refused_with_the_reason(
    tmp_path: Path, mode: int, content: bytes, reason: str
) -> None:
    with pytest.raises(KeyFileError, match=reason):
        load_api_key(key_file(tmp_path, content, mode))


def test_symlinks_directories_and_missing_files_are_refused(tmp_path: Path) -> None:
    real = key_file(tmp_path, b"k")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(KeyFileError, match="symlink"):
        load_api_key(link)
    with pytest.raises(KeyFileError, match="not a regular file"):
        (tmp_path / "dir").mkdir(mode=0o700)
        os.chmod(tmp_path / "dir", 0o600)
        load_api_key(tmp_path / "dir")
    with pytest.raises(KeyFileError, match="does not exist"):
        load_api_key(tmp_path / "missing")


def test_new_key_is_private_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "key"
    key = write_new_key(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert load_api_key(path) == key
    with pytest.raises(FileExistsError):
        write_new_key(path)


def test_authorizer() -> None:
    auth = Authorizer("sk-1")
    assert auth.allows(["Bearer sk-1"])
    assert not auth.allows(["Bearer sk-2"])
    assert not auth.allows(["bearer sk-1"])
    assert not auth.allows(["Bearer sk-1", "Bearer sk-1"])  # exactly one header
    assert not auth.allows([])
    assert not auth.allows(["Bearer sk-é"])
    assert Authorizer(None).allows([]) and not Authorizer(None).enabled


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("example.com", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
