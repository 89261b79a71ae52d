"""Shared fixtures: the tiny checkpoint is written once per session; models are loaded once and shared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elpis.reference.backend import ReferenceBackend
from elpis.reference.loader import load_model
from elpis.reference.model import ReferenceModel
from elpis.reference.synth import write_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> ReferenceModel:
    return load_model(tiny_dir, dtype=torch.float32)


@pytest.fixture
def tiny_backend(tiny_model: ReferenceModel) -> ReferenceBackend:
    """A fresh backend (empty prefix cache) over the shared tiny model."""
    return ReferenceBackend(tiny_model, model_id="tiny", max_context=4096, stop_token_ids=(248046, 248044))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from elpis.reference.assets import ensure_smollm2

    return ensure_smollm2()
