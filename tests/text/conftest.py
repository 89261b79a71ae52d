"""Shared fixtures: the Qwen3.8 tokenizer is built (or read from the cache) once per session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from elpis.paths import QWEN38_FACTS
from elpis.text import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3.8-style model directory without tokenizer.json: config + generation config + template."""
    out = tmp_path_factory.mktemp("qwen38")
    config = json.loads((QWEN38_FACTS / "text_config.json").read_text())
    (out / "config.json").write_text(json.dumps(config))
    shutil.copy(QWEN38_FACTS / "chat_template.jinja", out / "chat_template.jinja")
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir: Path) -> Tokenizer:
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from elpis.reference.assets import ensure_smollm2

    return ensure_smollm2()
