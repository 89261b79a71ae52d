"""Diagnostic (GPU machine, after `elpis build` and the full-size synth in /tmp/full): where a verify round
waits for the GPU.

For chain-8, tree-8 and tree-16 rounds of the speculation core at a 1K context it reports, per phase
(drafter.propose, backend.verify, backend.commit, the rest of the round):
- host milliseconds per call, median over the measured rounds (no extra synchronisation);
- the synchronising torch calls inside each phase (`torch.cuda.set_sync_debug_mode`), with the call sites
  in elpis and ExLlamaV3 that made them, counted per round.
Syncs inside ExLlamaV3's C++ extension or our ctypes kernels are not seen by torch's sync debug mode; a phase
whose host time is close to the round's GPU time without a reported sync points at one of those.
Each mode runs with the DFlash2 draft block replayed from CUDA graphs (`elpis.exl3.draft_graph`, the default)
and eager, in the same process. Prints one JSON line per mode and draft setting prefixed with "SYNCDIAG ".
With `--conditioning-ab N`, instead: tree-16 rounds with the draft's conditioning replayed from CUDA graphs
(the default) and eager, alternating (A, B, A, B, ...) N times each, pooled per arm ("CONDAB " lines: each
run, then the pooled medians, MADs and the verdict by `elpis.bench.report.noise_ms`).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch

from elpis.bench.worker import BenchDecoder
from elpis.exl3 import load_backend
from elpis.exl3.tree_verify import tree_run
from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

MODES = {"chain-8": (False, 8, 1), "tree-8": (True, 8, 4), "tree-16": (True, 16, 4)}
ROUNDS, WARMUP = 10, 3


def call_site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost two frames in elpis or ExLlamaV3 (where the sync was asked for)."""
    ours = [f for f in stack if ("elpis" in f.filename or "exllamav3" in f.filename)]
    ours = [f for f in ours if "round_sync" not in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-2:]))


class Probe:
    def __init__(self) -> None:
        self.phase = "round"
        self.host: dict[str, list[float]] = collections.defaultdict(list)
        self.syncs: collections.Counter[tuple[str, str]] = collections.Counter()

    def wrap(self, obj, name: str, phase: str) -> None:
        inner = getattr(obj, name)

        def wrapped(*args, **kwargs):
            outer, self.phase = self.phase, phase
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.host[phase].append((time.perf_counter() - t0) * 1e3)
                self.phase = outer

        setattr(obj, name, wrapped)

    def on_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message):
            self.syncs[(self.phase, call_site(traceback.extract_stack()[:-1]))] += 1


def run_mode(backend, decoder, name: str, ids: list[int], debug: bool) -> dict:
    tree, budget, top_k = MODES[name]
    backend.tree = tree
    backend.fixed_rows = tree_run(budget) if tree else 8
    probe = Probe()
    probe.wrap(backend, "verify", "verify")
    probe.wrap(backend, "commit", "commit")
    probe.wrap(backend.drafter, "propose", "propose")
    gen = SpeculativeGenerator(
        backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=top_k
    )
    request = GenerationRequest(
        prompt_ids=tuple(ids), max_tokens=ROUNDS + WARMUP + 1, sampling=SamplingParams(), ignore_eos=True
    )
    rounds: list[float] = []
    steps = gen.generate(request)
    next(steps)  # the prefill and the first round
    torch.cuda.synchronize()
    for values in probe.host.values():
        values.clear()
    probe.syncs.clear()
    previous = warnings.showwarning
    if debug:
        warnings.showwarning = probe.on_warning
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
    try:
        t = time.perf_counter()
        for i, step in enumerate(steps):
            now = time.perf_counter()
            if i >= WARMUP - 1:
                rounds.append((now - t) * 1e3)
            t = now
            if step.finish_reason is not None:
                break
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = previous
    for attr in ("verify", "commit"):
        vars(backend).pop(attr, None)  # drop the instance wrappers: the class methods come back
    vars(backend.drafter).pop("propose", None)
    n = max(1, len(probe.host["verify"]))
    return {
        "mode": name,
        "sync_debug": debug,
        "rounds_measured": len(rounds),
        "round_ms_median": statistics.median(rounds) if rounds else None,
        "rounds_ms": rounds,
        "host_ms_median": {k: statistics.median(v) for k, v in probe.host.items() if v},
        "syncs_per_round": [
            {"phase": phase, "site": site, "per_round": round(count / n, 2)}
            for (phase, site), count in probe.syncs.most_common(25)
        ],
    }


def conditioning_ab(backend, decoder, ids: list[int], runs: int) -> None:
    from elpis.bench.report import mad_ms, noise_ms

    graphs = backend.drafter.graphs
    pooled: dict[str, list[float]] = {"graphs": [], "eager": []}
    try:
        run_mode(backend, decoder, "tree-16", ids, False)  # untimed: the verify and conditioning captures
        for i in range(2 * runs):
            arm = "graphs" if i % 2 == 0 else "eager"
            graphs.conditioning = arm == "graphs"
            captures, replays = graphs.condition_captures, graphs.condition_replays
            record = run_mode(backend, decoder, "tree-16", ids, False)
            record["conditioning"] = arm
            record["condition_captures"] = graphs.condition_captures - captures
            record["condition_replays"] = graphs.condition_replays - replays
            pooled[arm].extend(record.pop("rounds_ms"))
            print("CONDAB " + json.dumps(record), flush=True)
    finally:
        graphs.conditioning = True
    a, b = pooled["graphs"], pooled["eager"]
    med_a, med_b = statistics.median(a), statistics.median(b)
    mad_a, mad_b = (mad_ms([x / 1000 for x in arm]) for arm in (a, b))  # the bench's MAD, of seconds
    noise = noise_ms(mad_a, mad_b)
    verdict = "PASS" if med_b - med_a > noise else "within noise" if abs(med_b - med_a) <= noise else "WORSE"
    summary = {"pooled": True, "rounds": [len(a), len(b)], "graphs_ms": med_a, "eager_ms": med_b}
    summary.update(mad_ms=[mad_a, mad_b], noise_ms=noise, gain_ms=med_b - med_a, verdict=verdict)
    print("CONDAB " + json.dumps(summary), flush=True)


def main(model: str, draft: str, ab_runs: int = 0) -> None:
    backend = load_backend(model, draft, max_context=65536, model_id="diag", host_cache_gib=0.0, tree=True)
    decoder = BenchDecoder(Path(model))
    import random

    rng = random.Random(7)
    ids = [rng.randrange(1000, backend.info.vocab_size - 1000) for _ in range(1024)]
    if ab_runs:
        conditioning_ab(backend, decoder, ids, ab_runs)
        return
    graphs = backend.drafter.graphs
    # the draft block replayed from CUDA graphs (the default) and eager in one run; sync debug with graphs
    for draft_graphs, debug in ((True, False), (False, False), (True, True)):
        backend.drafter.graphs = graphs if draft_graphs else None
        for name in MODES:
            record = {"draft_graphs": draft_graphs, **run_mode(backend, decoder, name, ids, debug)}
            record.pop("rounds_ms")
            print("SYNCDIAG " + json.dumps(record), flush=True)
    backend.drafter.graphs = graphs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Where a verify round waits for the GPU (diagnostic).")
    parser.add_argument("model")
    parser.add_argument("draft")
    parser.add_argument("--conditioning-ab", type=int, default=0, metavar="N", help="A/B runs per arm")
    args = parser.parse_args()
    main(args.model, args.draft, args.conditioning_ab)
