"""Where persisted prefix caches live: a subdirectory bound to the model files, the cache geometry and the
engine, so a different model, cache layout or kernel build never reads another's pages."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from elpis.exl3.prefix import DISK_FORMAT, PAGE

if TYPE_CHECKING:
    from elpis.exl3.engine import Engine


def binding(engine: Engine) -> dict:
    import torch

    from elpis.exl3.engine import MAX_HISTORY, env_switches, exllamav3_version
    from elpis.manifest import model_fingerprint

    return {
        "disk_format": DISK_FORMAT,
        "model": model_fingerprint(engine.model_dir, engine.draft_dir),
        "exllamav3": exllamav3_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_capability": list(torch.cuda.get_device_capability(engine.device)),
        "cache_tokens": engine.cache_tokens,
        "kv_bits": engine.kv_bits,
        "page": PAGE,
        "chunk": engine.prefill_chunk,
        "max_history": MAX_HISTORY,
        "gdn_state": str(next(iter(engine.cache.get_all_recurrent_layers().values())).recurrent_state.dtype),
        "env": env_switches(),
    }


def bound_cache_dir(root: Path, engine: Engine) -> Path:
    facts = binding(engine)
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]
    out = Path(root) / f"v{DISK_FORMAT}-{key}"
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    (out / "BINDING.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return out
