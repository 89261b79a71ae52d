"""The acceptor build's identity: which files went in and came out, by SHA-256, and with what tools.

Shared by the build (which writes `identity.json`) and the loader (which recomputes and compares it).
Sources are keyed by their path relative to the root they were read from: the Bend/proof/codegen/glue
trees of the root being built (`bend/`, `proofs/`, `codegen/`, `ext/`), and the Python that generates,
builds and admits the acceptor (`elpis/bend/`, `elpis/accept/`) from the running package. The CUDA build
of the acceptor (`ext/*.cu`, `ext/*.cuh`, `elpis/accept/device.py`) is not read by this build: nvcc compiles
it from the generated C, and `elpis.accept.device` checks it against the table on its own. The checked
entries both builds share (`ext/accept_checks.h`) are read by this build, so they are recorded here.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from elpis.paths import PACKAGE_DIR

SCHEMA = "elpis-accept-identity/1"
KEYS = frozenset(
    {
        "schema",
        "toolchain",
        "flags",
        "sources",
        "artifacts",
        "table_sha256",
        "certificates",
        "identity_sha256",
    }
)
ROOT_SOURCE_DIRS = ("bend", "proofs", "codegen", "ext")
PACKAGE_SOURCE_DIRS = ("bend", "accept")  # under the running elpis package
NOT_READ_SUFFIXES = (".cu", ".cuh")  # CUDA sources in ext/ (elpis.nvcc builds them, not this build)
NOT_READ_FILES = frozenset({"elpis/accept/device.py"})
# Python distributions whose versions are recorded; those marked True must match at admission.
DISTRIBUTIONS = {
    "cffi": True,
    "numpy": True,
    "pycparser": False,
    "lark": False,
    "z3-solver": False,
    "jinja2": False,
}

# Build outputs, by role (the loader requires exactly these files).
GENERATED_H, GENERATED_C, WRAPPER_C = "acceptors.h", "acceptors.c", "_elpis_accept.c"
TABLE, CERTIFICATES, IDENTITY = "table.bin", "certificates.json", "identity.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(identity: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of every key except identity_sha256."""
    body = {k: v for k, v in identity.items() if k != "identity_sha256"}
    return hashlib.sha256(canonical(body)).hexdigest()


def _files_under(base: Path, rel: str) -> list[Path]:
    top = base / rel
    if not top.exists():
        return []
    found = []
    for path in sorted(top.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        found.append(path)
    return found


def source_files(root: Path) -> dict[str, Path]:
    """Every source the build reads, keyed by its identity name."""
    files: dict[str, Path] = {}
    for rel in ROOT_SOURCE_DIRS:
        for path in _files_under(root, rel):
            files[path.relative_to(root).as_posix()] = path
    package_parent = PACKAGE_DIR.parent
    for rel in PACKAGE_SOURCE_DIRS:
        for path in _files_under(PACKAGE_DIR, rel):
            files[path.relative_to(package_parent).as_posix()] = path
    return {
        name: path
        for name, path in files.items()
        if name not in NOT_READ_FILES and not name.endswith(NOT_READ_SUFFIXES)
    }


def source_hashes(root: Path) -> dict[str, str]:
    return {name: sha256_file(path) for name, path in source_files(root).items()}


def distribution_versions() -> dict[str, str]:
    versions = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def python_identity() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "machine": platform.machine(),
        "system": platform.system(),
    }


def compiler_version(cc: str) -> str:
    result = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()[0].strip()


def toolchain(cc: str) -> dict[str, str]:
    return {**python_identity(), **distribution_versions(), "cc": cc, "cc_version": compiler_version(cc)}


def runtime_mismatches(recorded: dict[str, str]) -> list[str]:
    """Toolchain entries that must equal the running interpreter's (the library is loaded into it)."""
    now = {**python_identity(), **distribution_versions()}
    keys = ["python", "implementation", "machine", "system"] + [
        d for d, must in DISTRIBUTIONS.items() if must
    ]
    return [
        f"{k}: built with {recorded.get(k)!r}, running {now[k]!r}" for k in keys if recorded.get(k) != now[k]
    ]
