"""A/B (GPU machine, after `elpis build` and the full-size synth in /tmp/full): greedy tree rounds decided on
the host against rounds decided on the GPU (`elpis.exl3.device_round`, registry switch exl3-device-rounds),
in one process on one backend.

Loads the served configuration with the embedding gather and device rounds switched on (both needed by the
device rounds; the host rounds run with the gather too, so the arms differ only in who decides), then for each
context: `--pairs` pairs of requests of `--tokens` greedy tokens after a warm-up, the arms alternating (host
rounds: the backend's `device_rounds` detached, so the generator runs its host loop). Random weights: every
draft is rejected and a round commits one token, so a round's time is a step's. Per arm: the median round time
and its MAD pooled over the pairs, and the noise rule of `elpis.bench.report` (NOISE_MADS x the larger MAD).
The two arms' tokens must be identical (both are plain decoding's). Prints one line "DEVROUNDAB {json}" per
context and writes every line's document to `--out`.
With `--profile-rounds N`, one more request per arm and context runs under the CUDA profiler for N rounds
after the warm-up: its GPU milliseconds per round (span, busy as the union of kernel intervals, idle, kernels
launched) and every kernel's time per round by name, then the names whose time differs most between the arms
(device minus host), one line "DEVROUNDPROF {json}" per context, written beside the A/B in `--out`. It answers
where a device round's time goes against a host round's: idle gaps the host left, or kernels it added.
Usage (repo root):
  python3 elpis/bench/scripts/device_round_ab.py MODEL DRAFT --out FILE.json [--contexts 1024,8192]
      [--tokens 40] [--pairs 3] [--budget 16] [--profile-rounds 16]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

WARMUP_ROUNDS = 4  # rounds of each request left out of its times (captures, caches)
DIFF_KERNELS = 12  # kernel names listed by their difference between the arms


def profiled_rounds(
    backend: Any, decoder: Any, prompt: list[int], rounds: int, budget: int
) -> dict[str, Any]:
    """One greedy request whose rounds WARMUP_ROUNDS .. WARMUP_ROUNDS + `rounds` run under the CUDA profiler:
    per round, the window's span, busy and idle GPU ms and kernel count (`phases.summarize`), and every
    kernel's ms per round by name. A round on the GPU is queued one round ahead of the step that reports it,
    so the window's edges may hold part of a neighbouring round; over 16 rounds that is a few per cent."""
    import tempfile

    import torch

    from elpis.bench.phases import summarize

    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    steps = greedy_steps(backend, decoder, prompt, WARMUP_ROUNDS + rounds + 4, budget)
    for step, _ in enumerate(steps):
        if step == WARMUP_ROUNDS:
            torch.cuda.synchronize()
            profiler.start()
        elif step == WARMUP_ROUNDS + rounds:
            torch.cuda.synchronize()
            profiler.stop()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        profiler.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    summary = summarize(events, rounds, "round", top=None)
    by_name: dict[str, float] = {}  # every kernel's ms per round, whatever phase (none are labelled here)
    for phase in summary["phases"].values():
        for name, (ms, _) in phase["top_kernels"].items():
            by_name[name] = by_name.get(name, 0.0) + ms
    times = {k: summary[k] for k in ("span_ms", "busy_ms", "idle_ms")}
    return times | {"kernels": summary["kernels"] / rounds, "by_name": by_name}


def profile_difference(host: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    """Both arms' span, busy and idle ms per round, and the kernel names whose ms per round differ most."""
    names = set(host["by_name"]) | set(device["by_name"])
    diff = {n: device["by_name"].get(n, 0.0) - host["by_name"].get(n, 0.0) for n in names}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:DIFF_KERNELS]
    return {
        arm: {k: round(doc[k], 4) for k in ("span_ms", "busy_ms", "idle_ms", "kernels")}
        for arm, doc in (("host", host), ("device", device))
    } | {"kernel_ms_device_minus_host": {n: round(d, 4) for n, d in top}}


def greedy_steps(backend: Any, decoder: Any, prompt: list[int], tokens: int, budget: int) -> Any:
    """The steps of one greedy request of `tokens` tokens through the speculation core (trees of the draft's
    top-4, `budget` rows)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=4)
    request = GenerationRequest(prompt_ids=tuple(prompt), max_tokens=tokens, sampling=SamplingParams(),
                                ignore_eos=True)  # fmt: skip
    return gen.generate(request)


def rounds_of(
    backend: Any, decoder: Any, prompt: list[int], tokens: int, budget: int
) -> tuple[list[int], list[float]]:
    """One greedy request through the speculation core: its tokens and each round's seconds after the
    warm-up rounds (a step is a round)."""
    out: list[int] = []
    stamps = [time.perf_counter()]
    for step in greedy_steps(backend, decoder, prompt, tokens, budget):
        stamps.append(time.perf_counter())
        out += step.token_ids
    seconds = [b - a for a, b in itertools.pairwise(stamps[1:])]  # the first step holds the prefill
    return out, seconds[WARMUP_ROUNDS:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--profile-rounds", type=int, default=0)
    args = parser.parse_args()
    os.environ["ELPIS_PATCH_EMBED_GATHER"] = "1"
    os.environ["ELPIS_PATCH_DEVICE_ROUNDS"] = "1"

    from elpis.bench.report import mad_ms, noise_ms
    from elpis.bench.worker import BenchDecoder
    from elpis.bench.workload import prompt as make_prompt
    from elpis.exl3 import load_backend

    backend = load_backend(args.model, args.draft, max_context=262_144, model_id="bench", tree=True,
                           device_rounds=True)  # fmt: skip
    backend.prefix.enabled = False  # every request prefills: no pair reuses another's pages
    decoder = BenchDecoder(args.model)
    device = backend.device_rounds
    docs = []
    for context in (int(c) for c in args.contexts.split(",")):
        base = make_prompt(context + 1, seed=context, vocab=backend.info.vocab_size)
        arms: dict[str, list[float]] = {"host": [], "device": []}
        tokens: dict[str, list[int]] = {}
        rounds_before = device.rounds
        for pair in range(args.pairs + 1):  # the first pair warms both arms up and is not timed
            for arm in ("host", "device") if pair % 2 else ("device", "host"):
                backend.device_rounds = device if arm == "device" else None
                try:
                    out, seconds = rounds_of(backend, decoder, base, args.tokens, args.budget)
                finally:
                    backend.device_rounds = device
                if tokens.setdefault(arm, out) != out:
                    raise SystemExit(f"{arm} rounds at {context}: two requests gave different tokens")
                if pair:
                    arms[arm] += seconds
        if tokens["host"] != tokens["device"]:
            raise SystemExit(f"context {context}: rounds on the GPU gave other tokens than host rounds")
        medians = {arm: statistics.median(s) * 1000 for arm, s in arms.items()}
        mads = {arm: mad_ms(s) for arm, s in arms.items()}
        gain = medians["host"] - medians["device"]
        noise = noise_ms(*mads.values())
        doc = {
            "context": context, "rounds_per_arm": {a: len(s) for a, s in arms.items()},
            "round_median_ms": medians, "round_mad_ms": mads, "gain_ms": gain, "noise_ms": noise,
            "verdict": "faster" if gain > noise else "slower" if -gain > noise else "within noise",
            "device_rounds_run": device.rounds - rounds_before, "tokens_equal": True,
        }  # fmt: skip
        docs.append(doc)
        print("DEVROUNDAB " + json.dumps(doc), flush=True)
        if args.profile_rounds:
            profiles = {}
            for arm in ("host", "device"):
                backend.device_rounds = device if arm == "device" else None
                try:
                    profiles[arm] = profiled_rounds(backend, decoder, base, args.profile_rounds, args.budget)
                finally:
                    backend.device_rounds = device
            prof = {"context": context, "rounds": args.profile_rounds} | profile_difference(**profiles)
            docs.append(prof)
            print("DEVROUNDPROF " + json.dumps(prof), flush=True)
    args.out.write_text(json.dumps(docs, indent=1) + "\n")


if __name__ == "__main__":
    main()
