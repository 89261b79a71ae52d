"""Time `elpis.spec.sampling.sample_rows` on the GPU (no build or checkpoint needed): 1, 8 and 16 rows of
random full-vocabulary logits (std 4) under Qwen's recommended settings, temperature alone, top_p alone and
greedy; median of 10 calls after 3, in ms. "recommended-whole" is the recommended settings with the top_k head
read from the whole vocabulary's weights (the path before session 53, still taken where the head's edge is not
clear of the largest logits), in the same run. Prints one "SAMPLER {json}" line.
Usage (repo root): python3 elpis/bench/scripts/sampler_time.py
"""

from __future__ import annotations

import json
import statistics
import time

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


def main() -> None:
    torch.manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for rows in (1, 8, 16):
        logits = torch.randn(rows, VOCAB, device="cuda") * 4
        positions = list(range(100, 100 + rows))
        for name, params in SETTINGS.items():
            sampling._top_candidates = _whole_vocabulary if name.endswith("-whole") else FROM_TOP
            for _ in range(3):
                sample_rows(logits, params, positions)
            times = []
            for _ in range(10):
                torch.cuda.synchronize()
                start = time.perf_counter()
                sample_rows(logits, params, positions)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - start) * 1000)
            out.setdefault(name, {})[str(rows)] = round(statistics.median(times), 3)
    sampling._top_candidates = FROM_TOP
    print("SAMPLER " + json.dumps({"gpu": torch.cuda.get_device_name(), "ms": out}), flush=True)


if __name__ == "__main__":
    main()
