"""The one error type of the Bend front end, checker, prover and code generator."""

from __future__ import annotations


class BendError(Exception):
    """A user-facing error; the message starts with `file:line:column` where one is known."""
