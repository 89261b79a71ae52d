"""One way to check and install a generated kernel header (the schedule and the GDN plan use it): build a
C harness around the header with the host compiler, run it, compare what it prints with the Bend
interpreter's table line by line, and install the header atomically only once that passed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

# Host build of a harness: plain C11, every warning an error (the header must be clean C for gcc too).
HARNESS_CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror")


def source_digest(root: Path, sources: Sequence[str]) -> str:
    """The sha256 a generated header records of its sources: each path (relative to `root`) and its bytes."""
    digest = hashlib.sha256()
    for rel in sources:
        digest.update(rel.encode() + b"\0" + (Path(root) / rel).read_bytes())
    return digest.hexdigest()


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


def harness_lines(
    header: Path,
    name: str,
    harness: str,
    error: type[Exception],
    *,
    cc: str | None = None,
    timeout: float = 60,
) -> list[str]:
    """Compile the C program `harness` (which includes "`name`") against a copy of `header` named `name`
    ($CC or gcc, HARNESS_CFLAGS), run it and return its output lines. A harness that does not compile,
    fails or does not finish in `timeout` seconds raises `error` naming the header."""
    cc = cc or os.environ.get("CC", "gcc")
    with tempfile.TemporaryDirectory(prefix=f"elpis-{Path(name).stem}-") as tmp:
        work = Path(tmp)
        (work / name).write_bytes(Path(header).read_bytes())
        (work / "harness.c").write_text(harness)
        exe = work / "harness"
        done = subprocess.run(
            [cc, *HARNESS_CFLAGS, f"-I{work}", "harness.c", "-o", str(exe)],
            capture_output=True,
            text=True,
            cwd=work,
        )
        if done.returncode != 0:
            raise error(f"{name} does not compile as C11:\n{done.stderr.strip()}")
        try:
            run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise error(f"{name}: the harness did not finish in {timeout:g} s") from exc
        if run.returncode != 0:
            raise error(f"{name}: the harness failed (exit {run.returncode})")
    return run.stdout.splitlines()


def require_same_table(
    name: str,
    want: Sequence[str],
    got: Sequence[str],
    where: Callable[[int], str],
    error: type[Exception],
) -> int:
    """Raise `error` at the first line where the compiled header's table `got` differs from the
    interpreter's `want` (`where(i)` names the source and the case of line i), or when the lengths
    differ; return the number of lines checked."""
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            raise error(f"{name} disagrees with {where(i)}:\n  interpreter: {w}\n  compiled:    {g}")
    if len(got) != len(want):
        raise error(f"{name}: table has {len(got)} lines, the interpreter {len(want)}")
    return len(want)
