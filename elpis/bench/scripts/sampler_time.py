"""Time `elpis.spec.sampling.sample_rows` on the GPU (no build or checkpoint needed): 1, 8 and 16 rows of
random full-vocabulary logits (std 4) under Qwen's recommended settings, temperature alone, top_p alone and
greedy; median of 30 calls after 5, in ms. "recommended-whole" is the recommended settings with the top_k head
read from the whole vocabulary's weights (the path before session 53, still taken where the head's edge is not
clear of the largest logits), in the same run. "topk_ms" times torch.topk alone on the float32 rows for the
head's k (top_k 20 + TOP_PAD) and beside it. Prints one "SAMPLER {json}" line.
Usage (repo root): python3 elpis/bench/scripts/sampler_time.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams, sample_rows

VOCAB = 248_320
SETTINGS = {
    "recommended": SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=3),
    "temperature": SamplingParams(temperature=0.7, seed=3),
    "top_p": SamplingParams(temperature=0.7, top_p=0.95, seed=3),
    "greedy": SamplingParams(),
    "recommended-whole": SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=3),
}


def _whole_vocabulary(*args: object) -> None:
    return None


FROM_TOP = sampling._top_candidates


def _median_ms(call: Callable[[], object]) -> float:
    for _ in range(5):
        call()
    times = []
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 3)


def main() -> None:
    torch.manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    topk: dict[str, dict[str, float]] = {}
    for rows in (1, 8, 16):
        logits = torch.randn(rows, VOCAB, device="cuda") * 4
        positions = list(range(100, 100 + rows))
        for name, params in SETTINGS.items():
            sampling._top_candidates = _whole_vocabulary if name.endswith("-whole") else FROM_TOP
            ms = _median_ms(partial(sample_rows, logits, params, positions))
            out.setdefault(name, {})[str(rows)] = ms
        for k in (20, 32, 20 + sampling.TOP_PAD, 64):
            topk.setdefault(str(k), {})[str(rows)] = _median_ms(partial(torch.topk, logits, k, dim=1))
    sampling._top_candidates = FROM_TOP
    found = {"gpu": torch.cuda.get_device_name(), "ms": out, "topk_ms": topk}
    print("SAMPLER " + json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
