"""Reading a GGUF file's metadata (the `gguf` package does the parsing; this adds checks and one cache)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

_MISSING = object()


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this code can use."""


@lru_cache(maxsize=4)
def _open(path: str, mtime_ns: int, size: int):  # the stat values key the cache: a changed file is re-read
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise GGUFFormatError(f"{path}: not a readable GGUF file ({exc})") from exc


def open_gguf(path: Path):
    """A memory-mapped `gguf.GGUFReader` for `path` (cached per file version)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    stat = path.stat()
    return _open(str(path), stat.st_mtime_ns, stat.st_size)


def gguf_value(reader, key: str, default: Any = _MISSING) -> Any:
    """The decoded value of metadata `key`; raises GGUFFormatError if absent and no default is given."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise GGUFFormatError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()


def is_gguf(path: Path) -> bool:
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"
