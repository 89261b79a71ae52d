"""Loading the ExLlamaV3 pieces elpis drives directly: target, DFlash2 draft, quantized K/V caches.

ExLlamaV3's own Generator is not used on the elpis path (acceptance is decided by `elpis.accept` through
`elpis.spec`); its model, cache, recurrent-state and kernel code are. Import this module only on a CUDA
machine with the `gpu` extra: importing exllamav3 builds (or loads) its CUDA extension.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elpis.exl3 import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, patches

CACHE_TOKENS = 270_336  # 1056 pages: 262,144 context + room for verify rows and the draft block
MAX_CONTEXT = 262_144
KV_BITS = 3
# The GDN conv ring and scan staging hold up to 16 verify rows (issue 8's tree size).
MAX_HISTORY = 15


@dataclass
class Engine:
    model: Any  # exllamav3.Model (Qwen3_5)
    cache: Any  # exllamav3.Cache, CacheLayer_quant
    draft: Any | None  # exllamav3.Model (DFlash2, paged sliding-window attention)
    draft_cache: Any | None
    config: Any
    draft_config: Any | None
    device: torch.device
    model_dir: Path
    draft_dir: Path | None
    load_seconds: float
    cache_tokens: int
    kv_bits: int
    prefill_chunk: int
    # the embedding table mapped for the device (`elpis.exl3.embed_gather.host_table`), once asked for
    embed_table: Any = None

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        ids = list(getattr(self.config, "eos_token_id_list", None) or [])
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            import json

            extra = json.loads(gen.read_text()).get("eos_token_id")
            for i in [extra] if isinstance(extra, int) else (extra or []):
                if i not in ids:
                    ids.append(i)
        return tuple(int(i) for i in ids)


def load_engine(
    model_dir: Path,
    draft_dir: Path | None,
    *,
    cache_tokens: int = CACHE_TOKENS,
    kv_bits: int = KV_BITS,
    device: str = "cuda:0",
    warmup: bool = True,
    progress: bool = True,
    recurrent_dtype: torch.dtype = torch.half,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    rows_gemm: bool = False,
) -> Engine:
    """Load target (and draft) onto one GPU with 3-bit K/V caches of `cache_tokens` tokens; ExLlamaV3's
    scratch is sized for prefill chunks of `prefill_chunk` tokens. `rows_gemm`: the EXL3 linears of both run
    elpis's GEMM for 1-16 rows (registry patch exl3-rows-gemm, `elpis.exl3.rows_gemm_patch`)."""
    if cache_tokens % 256:
        raise ValueError(f"cache_tokens must be a multiple of 256, got {cache_tokens}")
    check_prefill_chunk(prefill_chunk)
    patches.apply_all()
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache import CacheLayer_quant

    from elpis.exl3 import rows_gemm_patch

    t0 = time.perf_counter()
    dev = torch.device(device)
    config = Config.from_directory(str(model_dir))
    model = Model.from_config(config)
    cache = Cache(
        model,
        max_num_tokens=cache_tokens,
        layer_type=CacheLayer_quant,
        k_bits=kv_bits,
        v_bits=kv_bits,
        max_batch_size=1,
        max_history=MAX_HISTORY,
        recurrent_dtype=recurrent_dtype,  # fp16 (ExLlamaV3's default) or fp32 Gated DeltaNet state
    )
    draft = draft_cache = draft_config = None
    if draft_dir is not None:
        draft_config = Config.from_directory(str(draft_dir))
        if not getattr(draft_config, "arch_string", "").startswith("DFlash2"):
            raise ValueError(f"{draft_dir}: not a DFlash2 draft ({draft_config.arch_string})")
        # Paged sliding-window attention (swa_full): the draft keeps no per-sequence ring, so a round's
        # draft state is just K/V pages that the prefix cache can share and restore like the target's.
        draft = Model.from_config(draft_config, swa_full=True)
        draft_cache = Cache(
            draft,
            max_num_tokens=cache_tokens,
            layer_type=CacheLayer_quant,
            k_bits=kv_bits,
            v_bits=kv_bits,
            max_batch_size=1,
        )
        with rows_gemm_patch.loading(rows_gemm):
            draft.load(device=dev, progressbar=progress)
    with rows_gemm_patch.loading(rows_gemm):
        model.load(device=dev, progressbar=progress)
    if rows_gemm:
        for loaded in (model, draft):
            if loaded is not None:
                rows_gemm_patch.mark(loaded)
    if draft is not None:
        draft.attach_to(model)
    if warmup:
        model.warmup(cache=cache, max_chunk_size=prefill_chunk, max_batch_size=1, max_q_len=MAX_HISTORY + 1)
    cache.reset_states()
    return Engine(
        model,
        cache,
        draft,
        draft_cache,
        config,
        draft_config,
        dev,
        Path(model_dir),
        Path(draft_dir) if draft_dir else None,
        time.perf_counter() - t0,
        cache_tokens,
        kv_bits,
        prefill_chunk,
    )


def exllamav3_version() -> str:
    from importlib.metadata import version

    return version("exllamav3")


def env_switches() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("EXL3_", "ELPIS_", "PYTORCH_CUDA"))}
