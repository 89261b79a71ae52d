"""In-process A/B of greedy speculative rounds between two arms (GPU scripts `device_round_ab.py`: rounds
decided on the host against rounds on the GPU; `switch_ab.py`: registry switches off against on).

Both arms serve the same requests in one process, alternating (A B, B A, ...), so clock, thermal and machine
drift fall on both alike. With random weights every draft is rejected and a round commits one token, so a
round's time is a step's. Per arm: the median round time and its MAD pooled over the pairs, and the noise
rule of `elpis.bench.report` (NOISE_MADS x the larger MAD). Both arms must give identical tokens (plain
decoding's). `profiled_rounds` runs one request under the CUDA profiler: GPU span, busy (union of kernel
intervals), idle and kernels per round, and each kernel's time per round by name, and `profile_difference`
lists the kernels whose time differs most between two arms. `host_time` measures the host's own time per
round where the rounds run on the GPU (a round's wall time less the host's waits on the GPU), and which rounds
Python's cyclic collector ran in (`CollectorTime`).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WARMUP_ROUNDS = 4  # rounds of each request left out of its times (captures, caches)
DIFF_KERNELS = 12  # kernel names listed by their difference between the arms


def arguments(description: str) -> argparse.ArgumentParser:
    """The arguments both A/B scripts take: the checkpoints, the output file, the contexts, each request's
    tokens, the timed pairs, the tree's rows and the profiled rounds (0: none); a script adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--profile-rounds", type=int, default=0)
    return parser


def load_with_device_rounds(model: Path, draft: Path) -> Any:
    """The served tree-16 configuration with rounds on the GPU and the embedding gather they need switched
    on, whatever the registry's defaults say (the switches stay set for the process)."""
    os.environ["ELPIS_PATCH_EMBED_GATHER"] = "1"
    os.environ["ELPIS_PATCH_DEVICE_ROUNDS"] = "1"
    from elpis.exl3 import load_backend

    return load_backend(model, draft, max_context=262_144, model_id="bench", tree=True, device_rounds=True)


def load_ab(model: Path, draft: Path) -> tuple[Any, Any]:
    """`load_with_device_rounds`, with the prefix cache off (every request prefills: no request of an A/B
    reuses another's pages), and the model's decoder for the speculation loop's text path."""
    from elpis.bench.worker import BenchDecoder

    backend = load_with_device_rounds(model, draft)
    backend.prefix.enabled = False
    return backend, BenchDecoder(model)


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


class CollectorTime:
    """Seconds Python's cyclic collector has run while installed (a `gc.callbacks` hook, as a context
    manager) and its collections by generation: a collection inside a round is host time that no profile of
    the round's own functions shows."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._began = 0.0

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = self.clock()
        else:
            self.seconds += self.clock() - self._began
            self.collections[info["generation"]] += 1

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._hook)


def host_time(
    steps: Iterable[Any],
    waited: Callable[[], float],
    clock: Callable[[], float] = time.perf_counter,
    uploads: Callable[[], float] = lambda: 0.0,
    collector: Callable[[], float] = lambda: 0.0,
) -> dict[str, Any]:
    """Issue 9's host time per round (Python and launches) for rounds on the GPU: each step's wall time less
    the seconds the host spent blocked on the GPU during it (`waited()`, a running total such as
    `DeviceRounds.wait_seconds`), after the warm-up rounds; the first step holds the prefill and is left out
    like `rounds_of` leaves it out. Medians and the 90th percentile in ms, and each round's host time in
    order. `uploads()`, a running total such as `Staged.wait_seconds` (the staged uploads' waits for their
    previous copies: also on the GPU, and on the round's path), is reported apart and left in the host time.
    `collector()`, a running total such as `CollectorTime.seconds`, marks the rounds the cyclic collector ran
    in: its time stays in the host time, and the 90th percentile of the other rounds is reported beside it."""
    stamps = [(clock(), waited(), uploads(), collector())]
    for _ in steps:
        stamps.append((clock(), waited(), uploads(), collector()))
    spans = list(itertools.pairwise(stamps[1:]))[WARMUP_ROUNDS:]
    if not spans:
        raise ValueError("no rounds after the warm-up: ask for more tokens")
    wall = [(b[0] - a[0]) * 1000 for a, b in spans]
    wait = [(b[1] - a[1]) * 1000 for a, b in spans]
    upload = sorted((b[2] - a[2]) * 1000 for a, b in spans)
    collected = [(b[3] - a[3]) * 1000 for a, b in spans]
    in_order = [w - x for w, x in zip(wall, wait, strict=True)]
    host = sorted(in_order)
    quiet = sorted(h for h, c in zip(in_order, collected, strict=True) if c == 0)
    median = statistics.median
    return {
        "rounds": len(host), "round_ms_median": median(wall), "wait_ms_median": median(wait),
        "host_ms_median": median(host), "host_ms_p90": _p90(host), "upload_wait_ms_median": median(upload),
        "upload_wait_ms_max": upload[-1], "gc_ms_total": sum(collected),
        "rounds_with_gc": sum(c > 0 for c in collected),
        "host_ms_p90_without_gc": _p90(quiet) if quiet else None,
        "host_ms_rounds": [round(h, 4) for h in in_order],
    }  # fmt: skip


def _p90(ascending: list[float]) -> float:
    return ascending[min(len(ascending) - 1, (9 * len(ascending)) // 10)]


def device_host_time(backend: Any, decoder: Any, prompt: list[int], tokens: int, budget: int) -> dict | None:
    """`host_time` of one greedy request on `backend`'s rounds on the GPU, with the cyclic collector's time
    and its collections by generation during it, or None where it has none attached (host rounds: the host's
    waits are inside its own loop, not counted by `DeviceRounds`)."""
    device = getattr(backend, "device_rounds", None)
    if device is None:
        return None
    from elpis.exl3.upload import Staged

    steps = greedy_steps(backend, decoder, prompt, tokens, budget)
    with CollectorTime() as collector:
        got = host_time(steps, lambda: device.wait_seconds, uploads=lambda: Staged.wait_seconds,
                        collector=lambda: collector.seconds)  # fmt: skip
    return got | {"gc_collections": collector.collections}


def arm_runner(
    backend: Any, decoder: Any, attach: Callable[[str], None], restore: Callable[[], None]
) -> Callable[..., Any]:
    """`on(arm, serve, prompt, *more)`: `serve(backend, decoder, prompt, *more)` with `attach(arm)` done first
    and `restore()` after (the A/B scripts' arms are what they attach to one backend)."""

    def on(arm: str, serve: Callable[..., Any], prompt: list[int], *more: int) -> Any:
        attach(arm)
        try:
            return serve(backend, decoder, prompt, *more)
        finally:
            restore()

    return on


def compare_arms(
    on: Callable[..., Any], arms: tuple[str, str], prompt: list[int], args: argparse.Namespace, what: str
) -> dict[str, Any]:
    """`alternate` over the two arms' requests of `prompt` (`on` from `arm_runner`), then `compare`."""
    seconds = alternate(
        arms, args.pairs, lambda arm: on(arm, rounds_of, prompt, args.tokens, args.budget), what
    )
    return compare(seconds, *arms)


def profile_arms(
    on: Callable[..., Any], arms: tuple[str, str], prompt: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """One `profiled_rounds` request an arm (`args.profile_rounds` rounds), and `profile_difference`."""
    profiles = {arm: on(arm, profiled_rounds, prompt, args.profile_rounds, args.budget) for arm in arms}
    return {"rounds": args.profile_rounds} | profile_difference(profiles, *arms)


def alternate(
    names: tuple[str, str], pairs: int, run: Callable[[str], tuple[list[int], list[float]]], what: str
) -> dict[str, list[float]]:
    """`pairs` timed pairs of requests after one untimed pair that warms both arms up, the arms' order
    alternating; `run(arm)` serves one request and returns its tokens and round seconds. Every request of both
    arms must give the same tokens."""
    seconds: dict[str, list[float]] = {name: [] for name in names}
    tokens: dict[str, list[int]] = {}
    for pair in range(pairs + 1):
        for name in names if pair % 2 else names[::-1]:
            out, times = run(name)
            if tokens.setdefault(name, out) != out:
                raise SystemExit(f"{what}, arm {name}: two requests gave different tokens")
            if pair:
                seconds[name] += times
    if tokens[names[0]] != tokens[names[1]]:
        raise SystemExit(f"{what}: arm {names[1]} gave other tokens than arm {names[0]}")
    return seconds


def compare(seconds: dict[str, list[float]], base: str, other: str) -> dict[str, Any]:
    """Median round ms and MAD of each arm, `other`'s gain over `base` and the noise rule's verdict."""
    from elpis.bench.report import mad_ms, noise_ms

    medians = {arm: statistics.median(s) * 1000 for arm, s in seconds.items()}
    mads = {arm: mad_ms(s) for arm, s in seconds.items()}
    gain = medians[base] - medians[other]
    noise = noise_ms(*mads.values())
    return {
        "rounds_per_arm": {a: len(s) for a, s in seconds.items()}, "round_median_ms": medians,
        "round_mad_ms": mads, "gain_ms": gain, "noise_ms": noise,
        "verdict": "faster" if gain > noise else "slower" if -gain > noise else "within noise",
        "tokens_equal": True,
    }  # fmt: skip


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


def profile_difference(profiles: dict[str, dict[str, Any]], base: str, other: str) -> dict[str, Any]:
    """Both arms' span, busy and idle ms and kernels per round, and the kernel names whose ms per round differ
    most (`other` minus `base`)."""
    a, b = profiles[base], profiles[other]
    names = set(a["by_name"]) | set(b["by_name"])
    diff = {n: b["by_name"].get(n, 0.0) - a["by_name"].get(n, 0.0) for n in names}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:DIFF_KERNELS]
    return {
        arm: {k: round(profiles[arm][k], 4) for k in ("span_ms", "busy_ms", "idle_ms", "kernels")}
        for arm in (base, other)
    } | {f"kernel_ms_{other}_minus_{base}": {n: round(d, 4) for n, d in top}}
