"""Time `elpis.spec.sampling.sample_rows` on the GPU (no build or checkpoint needed): 1, 8 and 16 rows of
random full-vocabulary logits (std 4) under Qwen's recommended settings, temperature alone, top_p alone and
greedy; median of 30 calls after 5, in ms. "recommended-whole" is the recommended settings with the top_k head
read from the whole vocabulary's weights (the path before session 53, still taken where the head's edge is not
clear of the largest logits), in the same run. "topk_ms" times torch.topk alone on the float32 rows for the
head's k (top_k 20 + TOP_PAD) and beside it. Prints one "SAMPLER {json}" line.
With --against FILE (another revision's elpis/spec/sampling.py, e.g. `git show REV:elpis/spec/sampling.py`),
each setting is also timed with that module, the two alternating call by call in one process ("against" in
the line), and every draw of both must be the same.
Usage (repo root): python3 elpis/bench/scripts/sampler_time.py [--against FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType

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


def _module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("sampling_against", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _alternating_ms(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median ms of each call over 30 rounds after 5, the calls taking turns within a round."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(35):
        for name, call in calls.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            if round_ >= 5:
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: round(statistics.median(values), 3) for name, values in times.items()}


def against(path: str) -> dict[str, dict[str, dict[str, float]]]:
    """Every setting (but the "-whole" one) timed with this revision's sampler and the one at `path`, in
    turns; the draws must agree."""
    other = _module(path)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for rows in (1, 8, 16):
        logits = torch.randn(rows, VOCAB, device="cuda") * 4
        positions = list(range(100, 100 + rows))
        for name, params in SETTINGS.items():
            if name.endswith("-whole"):
                continue
            theirs = other.SamplingParams(**{f: getattr(params, f) for f in params.__dataclass_fields__})
            ours_call = partial(sample_rows, logits, params, positions)
            their_call = partial(other.sample_rows, logits, theirs, positions)
            if ours_call() != their_call():
                raise SystemExit(f"{name} at {rows} rows: the two samplers draw differently")
            ms = _alternating_ms({"this": ours_call, "against": their_call})
            for side, value in ms.items():
                out.setdefault(side, {}).setdefault(name, {})[str(rows)] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="another revision's elpis/spec/sampling.py to time beside this one")
    args = parser.parse_args()
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
    found: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "ms": out, "topk_ms": topk}
    if args.against:
        found["against"] = against(args.against)
    print("SAMPLER " + json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
