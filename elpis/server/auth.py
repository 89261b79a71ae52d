"""API key: loaded from a private file, compared in constant time; loopback rule for running without one."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from pathlib import Path

MAX_KEY_BYTES = 4096
ALLOWED_MODES = (0o600, 0o400)


class KeyFileError(ValueError):
    """The key file is unusable; the message says why (the server refuses to start)."""


def load_api_key(path: Path) -> str:
    """Read the key from `path`: a regular file (not a symlink) with mode 0600 or 0400.

    One trailing newline is stripped; the rest must be 1..4096 printable ASCII characters without spaces.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyFileError(f"API key file {path} does not exist") from None
    except OSError as exc:
        if os.path.islink(path):
            raise KeyFileError(f"API key file {path} is a symlink; give the real file") from None
        raise KeyFileError(f"API key file {path} cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"API key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode not in ALLOWED_MODES:
            raise KeyFileError(
                f"API key file {path} has mode {mode:04o}; it must be 0600 or 0400 (run: chmod 600 {path})"
            )
        raw = os.read(fd, MAX_KEY_BYTES + 3)
    finally:
        os.close(fd)
    if raw.endswith(b"\r\n"):
        raw = raw[:-2]
    elif raw.endswith(b"\n"):
        raw = raw[:-1]
    if not raw:
        raise KeyFileError(f"API key file {path} is empty")
    if len(raw) > MAX_KEY_BYTES:
        raise KeyFileError(f"API key in {path} is longer than {MAX_KEY_BYTES} bytes")
    if any(b < 0x21 or b > 0x7E for b in raw):
        raise KeyFileError(f"API key in {path} must be printable ASCII without spaces or line breaks")
    return raw.decode("ascii")


def write_new_key(path: Path) -> str:
    """Create `path` with a fresh random key, mode 0600, refusing to overwrite anything."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "sk-elpis-" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have narrowed or widened nothing; make it exact
        os.write(fd, (key + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Authorizer:
    """Checks `Authorization: Bearer <key>` headers, and `x-api-key: <key>` (how Anthropic's clients send
    it); `key=None` means authentication is off."""

    def __init__(self, key: str | None) -> None:
        self._expected = None if key is None else ("Bearer " + key).encode("ascii")
        self._key = None if key is None else key.encode("ascii")

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, header_values: list[str]) -> bool:
        """An Authorization header's values: exactly one, `Bearer <key>`."""
        return self._expected is None or _one_value_is(header_values, self._expected)

    def allows_request(self, authorization: list[str], api_key: list[str]) -> bool:
        """A request's credentials: at least one of the two headers, and every one sent must hold the key
        (a wrong one is never outvoted by a right one)."""
        if self._expected is None:
            return True
        if not authorization and not api_key:
            return False
        if authorization and not self.allows(authorization):
            return False
        return not api_key or self._allows_api_key(api_key)

    def _allows_api_key(self, header_values: list[str]) -> bool:
        assert self._key is not None
        return _one_value_is(header_values, self._key)


def _one_value_is(header_values: list[str], expected: bytes) -> bool:
    """Exactly one header value, equal to `expected` (compared in constant time; non-ASCII never is)."""
    if len(header_values) != 1:
        return False
    try:
        given = header_values[0].encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given, expected)
