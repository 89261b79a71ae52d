"""Where things live: the repository checkout, build outputs and packaged assets."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
ASSETS = PACKAGE_DIR / "assets"
QWEN38_FACTS = ASSETS / "qwen38"
DATASETS = ASSETS / "datasets"

BEND_DIR = REPO_ROOT / "bend"
PROOFS_DIR = REPO_ROOT / "proofs"
CODEGEN_DIR = REPO_ROOT / "codegen"
EXT_DIR = REPO_ROOT / "ext"
PATCHES_DIR = REPO_ROOT / "patches"
BUILD_DIR = REPO_ROOT / "build"
ACCEPT_BUILD_DIR = BUILD_DIR / "accept"
BENCH_RESULTS = REPO_ROOT / "bench" / "results"
# Downloaded or unpacked model assets (SmolLM2 GGUF, built tokenizers): never committed.
CACHE_DIR = REPO_ROOT / ".cache"
