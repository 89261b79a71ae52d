"""Fixtures for the acceptor tests: the build made by `make build` (build/accept), admitted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import elpis.accept


@pytest.fixture(scope="session")
def build_dir() -> Path:
    path = Path(elpis.accept.ACCEPT_BUILD_DIR)
    if not path.is_dir():
        pytest.fail("acceptor not built: run make build (make test does it first)")
    return path


@pytest.fixture(scope="session")
def acceptor(build_dir: Path) -> Any:
    """The admitted library (admission itself is under test in test_admission.py)."""
    return elpis.accept.admitted()
