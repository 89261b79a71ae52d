"""The skip every test that needs nvcc shares: CI has nvcc and no GPU, and `.ci/run` sets
ELPIS_REQUIRE_NVCC=1 so that a missing compiler fails there instead of skipping."""

from __future__ import annotations

import os

import pytest

from elpis import nvcc


def nvcc_missing() -> bool:
    """No nvcc here, and nothing requires one."""
    return nvcc.nvcc_path() is None and os.environ.get("ELPIS_REQUIRE_NVCC") != "1"


needs_nvcc = pytest.mark.skipif(
    nvcc_missing(), reason="nvcc not installed (CI sets ELPIS_REQUIRE_NVCC=1 and has it)"
)
