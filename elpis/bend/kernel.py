"""Placeholder replaced below."""

from __future__ import annotations

from elpis.bend.errors import BendError


def check_proof(prog, key):
    raise BendError(f"{prog.laws[key].loc}: the proof kernel is not available yet")
