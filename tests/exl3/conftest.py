"""Fixtures shared by the exl3 tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An `elpis synth --small` checkpoint: ELPIS_SMALL_DIR when set, else one written once per session."""
    given = os.environ.get("ELPIS_SMALL_DIR")
    if given:
        return Path(given)
    from elpis.exl3.synth import write_small

    out = tmp_path_factory.mktemp("synth") / "small"
    write_small(out, seed=0)
    return out
