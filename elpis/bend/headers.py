"""Install a generated kernel header only after it passed its check (one way for every generated header)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def install_checked(text: str, out_dir: Path, name: str, check: Callable[[Path], object]) -> Path:
    """Write `text` to a temporary file in `out_dir`, run `check` on it (it raises on a mismatch), then
    move it to `out_dir / name` atomically; a header that fails its check is never left behind."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        check(tmp)
        os.chmod(tmp, 0o644)
        tmp.replace(out_dir / name)
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir / name
