"""Machine and software identity recorded with every result, so numbers are never compared blind."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from elpis.paths import REPO_ROOT


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_revision() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_fingerprint(path: Path) -> dict[str, Any]:
    """SHA-256 of a model file, or of every file of a model directory (name -> digest)."""

    def digest(file: Path) -> str:
        h = hashlib.sha256()
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    if path.is_file():
        return {"file": path.name, "sha256": digest(path)}
    return {
        "directory": path.name,
        "files": {f.name: digest(f) for f in sorted(path.iterdir()) if f.is_file()},
    }


def identity() -> dict[str, Any]:
    """Hardware, software versions and the git revision of this checkout."""
    import torch

    info: dict[str, Any] = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": {name: _version(name) for name in ("elpis", "torch", "numpy", "exllamav3")},
        "git": _git_revision(),
    }
    if torch.cuda.is_available():
        info["cuda"] = {
            "device": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "torch_cuda": torch.version.cuda,
        }
    return info
