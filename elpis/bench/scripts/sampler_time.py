"""Time `elpis.spec.sampling.sample_rows` on the GPU (no build or checkpoint needed): 1, 8 and 16 rows of
random full-vocabulary logits (std 4) under Qwen's recommended settings, temperature alone, top_p alone and
greedy; median of 30 calls after 5, in ms. "recommended-whole" is the recommended settings with the top_k head
read from the whole vocabulary's weights (the path before session 53, still taken where the head's edge is not
clear of the largest logits), in the same run; "recommended-device" draws them with registry patch
exl3-sample-draw's kernel (elpis.exl3.sample_draw) from the same weights. "recommended+presence" adds Qwen's
`presence_penalty` 1.5: each call adjusts the rows (`elpis.spec.penalties.History`, a 1,000-token prompt and
200 generated tokens, the rows' paths those of a random 16-row tree) and then samples; "presence-adjust" times
the adjustment alone.
"topk_ms" times torch.topk alone on the float32 rows for the head's k (top_k 20 + TOP_PAD) and beside it.
Prints one "SAMPLER {json}" line.
With --against DIR (another revision's elpis/spec/sampling.py and penalties.py, e.g. from `git show
REV:elpis/spec/sampling.py`), each setting is also timed with those modules, the two alternating call by call
in one process ("against" in the line), and every draw and adjusted bit of both must be the same.
Usage (repo root): python3 elpis/bench/scripts/sampler_time.py [--against DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

from elpis.spec import penalties, sampling
from elpis.spec.sampling import SamplingParams

VOCAB = 248_320
RECOMMENDED = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": 3}
SETTINGS = {
    "recommended": SamplingParams(**RECOMMENDED),
    "temperature": SamplingParams(temperature=0.7, seed=3),
    "top_p": SamplingParams(temperature=0.7, top_p=0.95, seed=3),
    "greedy": SamplingParams(),
    "recommended-whole": SamplingParams(**RECOMMENDED),
    "recommended-device": SamplingParams(**RECOMMENDED),
    "recommended+presence": SamplingParams(**RECOMMENDED, presence_penalty=1.5),
    "presence-adjust": SamplingParams(**RECOMMENDED, presence_penalty=1.5),
}
FROM_TOP = sampling._top_candidates


def _whole_vocabulary(*args: object) -> None:
    return None


def _device_draw() -> sampling.DeviceDraw:
    """The draw of registry patch exl3-sample-draw (its kernel built now, outside the timed calls)."""
    from elpis.exl3 import sample_draw

    sample_draw._library()
    return sample_draw.draw


class Modules:
    """One revision's sampler and adjustments, and a request's history of the bench's shape for them."""

    def __init__(self, sampling_module: ModuleType, penalties_module: ModuleType) -> None:
        self.sampling, self.penalties = sampling_module, penalties_module
        rng = random.Random(5)
        self.prompt = [rng.randrange(VOCAB) for _ in range(1000)]
        self.generated = [rng.randrange(VOCAB) for _ in range(200)]
        parents = [-1] + [rng.randrange(r) for r in range(1, 16)]
        self.paths = penalties.tree_paths([rng.randrange(VOCAB) for _ in parents], parents)

    def call(self, name: str, params: SamplingParams, logits: torch.Tensor,
             positions: list[int]) -> Callable[[], object]:
        """A call of setting `name` on `logits` with these modules."""
        theirs = self.sampling.SamplingParams(**{f: getattr(params, f) for f in params.__dataclass_fields__})
        if "presence" not in name:
            return partial(self.sampling.sample_rows, logits, theirs, positions)
        history = self.penalties.History(theirs, self.prompt, VOCAB)
        history.commit(self.generated)
        paths = self.paths[: logits.shape[0]]
        if name == "presence-adjust":
            return partial(history.adjusted, logits, paths)
        return lambda: self.sampling.sample_rows(history.adjusted(logits, paths), theirs, positions)


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
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


def _median_ms(call: Callable[[], object]) -> float:
    """`_alternating_ms` of one call."""
    return _alternating_ms({"call": call})["call"]


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a.view(torch.int64), b.view(torch.int64))
    return a == b


def against(directory: str, ours: Modules) -> dict[str, dict[str, dict[str, float]]]:
    """Every setting (but the "-whole" one) timed with this revision's modules and those in `directory`, in
    turns; the draws and adjusted bits must agree."""
    folder = Path(directory)
    their_sampling = _module(folder / "sampling.py", "sampling_against")
    their_penalties = penalties
    if (folder / "penalties.py").exists():
        their_penalties = _module(folder / "penalties.py", "penalties_against")
    theirs = Modules(their_sampling, their_penalties)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for rows in (1, 8, 16):
        logits = torch.randn(rows, VOCAB, device="cuda") * 4
        positions = list(range(100, 100 + rows))
        for name, params in SETTINGS.items():
            if name.endswith(("-whole", "-device")):
                continue
            our_call = ours.call(name, params, logits, positions)
            their_call = theirs.call(name, params, logits, positions)
            if not _same(our_call(), their_call()):
                raise SystemExit(f"{name} at {rows} rows: the two revisions give different results")
            ms = _alternating_ms({"this": our_call, "against": their_call})
            for side, value in ms.items():
                out.setdefault(side, {}).setdefault(name, {})[str(rows)] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="a folder with another revision's sampling.py (and penalties.py)")
    args = parser.parse_args()
    torch.manual_seed(0)
    ours = Modules(sampling, penalties)
    out: dict[str, dict[str, float]] = {}
    topk: dict[str, dict[str, float]] = {}
    for rows in (1, 8, 16):
        logits = torch.randn(rows, VOCAB, device="cuda") * 4
        positions = list(range(100, 100 + rows))
        for name, params in SETTINGS.items():
            sampling._top_candidates = _whole_vocabulary if name.endswith("-whole") else FROM_TOP
            sampling.use_device_draw(_device_draw() if name.endswith("-device") else None)
            out.setdefault(name, {})[str(rows)] = _median_ms(ours.call(name, params, logits, positions))
            sampling.use_device_draw(None)
        for k in (20, 32, 20 + sampling.TOP_PAD, 64):
            topk.setdefault(str(k), {})[str(rows)] = _median_ms(partial(torch.topk, logits, k, dim=1))
    sampling._top_candidates = FROM_TOP
    found: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "ms": out, "topk_ms": topk}
    if args.against:
        found["against"] = against(args.against, ours)
    print("SAMPLER " + json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
