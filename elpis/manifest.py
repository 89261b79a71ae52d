"""`elpis verify-models`: check the target and draft directories against the pinned SHA-256 manifest.

The manifest (`elpis/assets/qwen38/manifest.json`) names every file of the two pinned revisions and its
SHA-256. A directory passes only if it holds exactly those files (no missing, no extra file, no symlink,
no subdirectory) and every file hashes to its pinned value; the first problem found is reported and the
command exits 1. Files are opened without following symlinks and re-checked after hashing (size, inode and
times unchanged), so a file swapped during the check is refused.

`verify(target_dir, draft_dir)` raises `ManifestError`; `elpis serve --backend exl3` calls it before loading.
Synthetic checkpoints (`elpis synth`) cannot pass; serving them needs `require_synthetic`, which only accepts
directories whose config.json says `"synthetic": true` (so the flag that allows it cannot wave a real-looking
model through unchecked).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from elpis.paths import QWEN38_FACTS

MANIFEST = QWEN38_FACTS / "manifest.json"
CHUNK = 8 << 20
ROLES = ("target", "draft")


class ManifestError(ValueError):
    """A model directory does not match the pinned manifest (or the manifest itself is malformed)."""


@dataclass(frozen=True)
class Pinned:
    repo: str
    revision: str
    files: dict[str, str]  # name -> sha256


def load_manifest(path: Path = MANIFEST) -> dict[str, Pinned]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"manifest {path}: {exc}") from exc
    if data.get("schema_version") != 1:
        raise ManifestError(f"manifest {path}: schema_version must be 1")
    roles: dict[str, Pinned] = {}
    for role in ROLES:
        entry = data.get(role)
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict) or not entry["files"]:
            raise ManifestError(f"manifest {path}: no file table for {role}")
        for name, digest in entry["files"].items():
            if "/" in name or name in ("", ".", "..") or name.startswith("."):
                raise ManifestError(f"manifest {path}: bad file name {name!r}")
            if not (
                isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
            ):
                raise ManifestError(f"manifest {path}: {role}/{name}: sha256 must be 64 lowercase hex digits")
        roles[role] = Pinned(str(entry.get("repo", "")), str(entry.get("revision", "")), dict(entry["files"]))
    return roles


def _hash_file(path: Path, progress) -> str:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot open without following links ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(handle.fileno())
        if not stat.S_ISREG(before.st_mode):
            raise ManifestError(f"{path}: not a regular file")
        digest = hashlib.sha256()
        while block := handle.read(CHUNK):
            digest.update(block)
            if progress is not None:
                progress.update(len(block))
        after = os.fstat(handle.fileno())
    keys = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
    if any(getattr(before, k) != getattr(after, k) for k in keys):
        raise ManifestError(f"{path}: changed while it was being hashed")
    return digest.hexdigest()


def check_dir(role: str, directory: Path, pinned: Pinned, progress=None) -> None:
    """Raise ManifestError naming the first problem of one model directory."""
    directory = Path(directory)
    if directory.is_symlink():
        raise ManifestError(f"{role} directory {directory} is a symlink; give the real directory")
    if not directory.is_dir():
        raise ManifestError(f"{role} directory {directory} does not exist or is not a directory")
    present = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_symlink():
            raise ManifestError(f"{role}: {entry.name} is a symlink (symlinks are refused)")
        if entry.is_dir(follow_symlinks=False):
            raise ManifestError(f"{role}: unexpected subdirectory {entry.name}")
        present[entry.name] = entry
    missing = sorted(set(pinned.files) - set(present))
    if missing:
        raise ManifestError(
            f"{role}: missing file {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    extra = sorted(set(present) - set(pinned.files))
    if extra:
        raise ManifestError(f"{role}: unexpected file {extra[0]} (not in the pinned manifest)")
    for name in sorted(pinned.files):
        got = _hash_file(directory / name, progress)
        if got != pinned.files[name]:
            raise ManifestError(
                f"{role}: {name} has SHA-256 {got}, the pinned revision has {pinned.files[name]}"
            )


def verify(target_dir: Path, draft_dir: Path, manifest: Path = MANIFEST, show_progress: bool = False) -> None:
    """Check both directories; raise ManifestError with the first problem."""
    roles = load_manifest(manifest)
    dirs = {"target": Path(target_dir), "draft": Path(draft_dir)}
    progress = None
    if show_progress:
        from tqdm import tqdm

        total = 0
        for role in ROLES:
            for name in roles[role].files:
                path = dirs[role] / name
                if path.is_file() and not path.is_symlink():
                    total += path.stat().st_size
        progress = tqdm(total=total, unit="B", unit_scale=True, desc="sha256")
    try:
        for role in ROLES:
            check_dir(role, dirs[role], roles[role], progress)
    finally:
        if progress is not None:
            progress.close()


def require_synthetic(target_dir: Path, draft_dir: Path) -> None:
    """Serving without verification is for synthetic checkpoints only: both configs must say so."""
    for role, directory in (("target", target_dir), ("draft", draft_dir)):
        path = Path(directory) / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{role}: cannot read {path}: {exc}") from exc
        if config.get("synthetic") is not True:
            raise ManifestError(
                f"{role} {directory} is not a synthetic checkpoint (config.json has no "
                '"synthetic": true); real models must pass verify-models'
            )


def model_fingerprint(target_dir: Path, draft_dir: Path | None) -> str:
    """A cheap content fingerprint of the model files (binds persisted prefix caches to the model): every
    file's name and size, small files in full, large files by their first and last 8 MiB."""
    digest = hashlib.sha256()
    for role, directory in (("target", target_dir), ("draft", draft_dir)):
        if directory is None:
            continue
        for path in sorted(Path(directory).iterdir()):
            if not path.is_file():
                continue
            size = path.stat().st_size
            digest.update(f"{role}/{path.name}:{size}\n".encode())
            with path.open("rb") as handle:
                if size <= 2 * CHUNK:
                    digest.update(handle.read())
                else:
                    digest.update(handle.read(CHUNK))
                    handle.seek(size - CHUNK)
                    digest.update(handle.read(CHUNK))
    return digest.hexdigest()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, required=True, help="target model directory (EXL3 4.00 bpw)")
    parser.add_argument("--draft", type=Path, required=True, help="DFlash2 draft directory")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help=argparse.SUPPRESS)  # tests only


def run(args: argparse.Namespace) -> int:
    try:
        verify(args.target, args.draft, args.manifest, show_progress=sys.stderr.isatty())
    except ManifestError as exc:
        print(f"elpis verify-models: FAILED: {exc}", file=sys.stderr)
        return 1
    print("elpis verify-models: OK (target and draft match the pinned manifest)")
    return 0
