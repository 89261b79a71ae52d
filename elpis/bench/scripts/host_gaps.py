"""Diagnostic (GPU machine, after `elpis build` and the full-size synth in /tmp/full): what the host does
while the GPU sits idle inside greedy tree-16 rounds (issue 9: host time per round <= 0.2 ms).

Loads the served configuration (tree mode, verify and draft graphs, elpis's kernels), labels the host steps
of a round with `torch.profiler.record_function` (the speculation core's round and tree, the drafter's block,
read-back and candidates, the tree build, the verify and its graph fill, the read-back of the row checks, the
acceptor, the commit and the draft's conditioning), then for each context: times rounds without the
profiler, profiles `--rounds` more, and prints one line "HOSTGAPS {json}" with the round time and
`elpis.bench.host_gaps.report`: GPU busy and idle microseconds per round, the idle time by the host's
innermost step and by the torch op or CUDA call it was in. `--prelaunch 0,1` loads the backend with the verify
gate (`elpis.exl3.verify_gate`) and measures each context without it (the gate detached from the tree
graphs, so `prelaunch()` queues nothing) and with it, in that order, in one process. `--gc default,freeze`
does the same with Python's collector as it is and with every object made so far frozen out of it;
`--cprofile 1` adds a window under cProfile (the functions with the most own time per round).
Usage (repo root):
  python3 elpis/bench/scripts/host_gaps.py MODEL DRAFT [--contexts 1024,8192] [--rounds 12] [--threads 0,1]
      [--prelaunch 0,1] [--gc default,freeze] [--cprofile 1] [--profile 0] [--trace-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import gzip
import itertools
import json
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from elpis import accept
from elpis.bench.host_gaps import PREFIX, report
from elpis.bench.worker import BenchDecoder
from elpis.exl3 import backend as backend_module
from elpis.exl3 import drafter as drafter_module
from elpis.exl3 import gdn_tree as gdn_tree_module
from elpis.exl3 import load_backend
from elpis.exl3 import tree_graph as tree_graph_module
from elpis.exl3.upload import Staged
from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
from elpis.spec import generate as generate_module
from elpis.spec.integrity import RoundTracker

WARMUP = 4


@contextlib.contextmanager
def wrapping(targets: list[tuple[Any, str, str]], wrap: Any) -> Iterator[None]:
    """Each (object, attribute, label): the attribute replaced by `wrap(original, label)` for the block, and
    put back at the end."""
    undo = []
    for obj, attr, label in targets:
        original = getattr(obj, attr)
        undo.append((obj, attr, original, attr in vars(obj)))
        setattr(obj, attr, wrap(original, label))
    try:
        yield
    finally:
        for obj, attr, original, own in reversed(undo):
            if own:
                setattr(obj, attr, original)
            else:
                delattr(obj, attr)


def labelled(targets: list[tuple[Any, str, str]]) -> contextlib.AbstractContextManager[None]:
    """Each target's calls run inside a profiler range PREFIX + label."""

    def wrap(original: Any, label: str) -> Any:
        def wrapped(*args, **kwargs):
            with torch.profiler.record_function(PREFIX + label):
                return original(*args, **kwargs)

        return wrapped

    return wrapping(targets, wrap)


@contextlib.contextmanager
def stamped(targets: list[tuple[Any, str, str]]) -> Iterator[dict[str, list[tuple[float, float]]]]:
    """Each target's calls timed: the (start, end) perf_counter seconds of every call, per label."""
    stamps: dict[str, list[tuple[float, float]]] = {label: [] for _, _, label in targets}

    def wrap(original: Any, label: str) -> Any:
        def wrapped(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                stamps[label].append((t, time.perf_counter()))

        return wrapped

    with wrapping(targets, wrap):
        yield stamps


def host_path(stamps: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Median milliseconds per round: from the draft's read-back to the verify's start on the host (the gate
    opened, or the verify graph launched), and of the prelaunch call itself."""
    out: dict[str, float] = {}
    ready = [start for start, _ in stamps["readback"]]
    if stamps.get("gate_open"):
        ends = [start for start, _ in stamps["gate_open"] if start > ready[0]]
    else:
        ends = [end for _, end in stamps["graphs.verify"]]
    pairs = [min((e for e in ends if e > r), default=None) for r in ready]
    spans = [(e - r) * 1e3 for r, e in zip(ready, pairs, strict=True) if e is not None]
    if spans:
        out["readback_to_verify_ms"] = statistics.median(spans)
    if stamps.get("prelaunch"):
        out["prelaunch_ms"] = statistics.median((b - a) * 1e3 for a, b in stamps["prelaunch"])
    return out


def step_medians(stamps: dict[str, list[tuple[float, float]]], rounds: int) -> dict[str, float]:
    """Per label, the median over rounds of the milliseconds its calls took in a round (a round runs from
    one "tree" call's start, where it drafts, to the next one's)."""
    starts = [a for a, _ in stamps.get("tree", [])]
    spans = list(zip(starts, [*starts[1:], float("inf")], strict=True))[:rounds]
    out: dict[str, float] = {}
    for label, calls in stamps.items():
        per_round = [sum(b - a for a, b in calls if start <= a < end) * 1e3 for start, end in spans]
        if per_round:
            out[label] = round(statistics.median(per_round), 4)
    return out


def host_steps(backend: Any) -> list[tuple[Any, str, str]]:
    d = backend.drafter
    return [
        (SpeculativeGenerator, "_round", "round"),
        (SpeculativeGenerator, "_tree", "tree"),
        (d, "propose", "propose"),
        (d, "block", "draft.block"),
        (drafter_module, "unpack_candidates", "draft.unpack"),
        (backend, "prelaunch", "prelaunch"),
        (generate_module, "build_tree", "build_tree"),
        (generate_module, "choose_row_count", "choose_rows"),
        (backend, "verify", "verify"),
        (backend.graphs, "verify", "graphs.verify"),
        (backend.graphs, "_fill", "graphs.fill"),
        # what the fill is made of (session 27: 0.31 ms on the H200 machine, several times its parts' cost
        # in microbenchmarks): the table, the packed words, the tree's plan, the id check, the staged uploads
        # (every staged upload of the round, not only the fill's), and the verify's tree layout
        (tree_graph_module, "padded_table", "fill.table"),
        (backend.graphs, "_int_values", "fill.int_values"),
        (gdn_tree_module, "packed_plan", "fill.plan"),
        (tree_graph_module, "check_ids", "fill.check_ids"),
        (Staged, "put", "staged.put"),
        (backend_module, "layout_tree", "verify.layout"),
        (RoundTracker, "check_verify_greedy", "checks.readback"),
        (accept, "tree", "accept"),
        (backend, "commit", "commit"),
        (backend.graphs, "commit", "graphs.commit"),
        (d.graphs, "condition", "condition"),
    ]


def timed_rounds(steps: Iterator[Any], rounds: int) -> list[float]:
    """Milliseconds of each of the next `rounds` steps (one round each) of a generation."""
    out: list[float] = []
    t = time.perf_counter()
    for _ in range(rounds):
        next(steps)
        now = time.perf_counter()
        out.append((now - t) * 1e3)
        t = now
    return out


def python_profile(steps: Iterator[Any], rounds: int, top: int = 30) -> list[list[Any]]:
    """The next `rounds` rounds under cProfile: the `top` functions by own time, each as [function, calls per
    round, own ms per round, cumulative ms per round] (cProfile's overhead inflates every figure; the shares
    are what count)."""
    prof = cProfile.Profile()
    prof.enable()
    timed_rounds(steps, rounds)
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (prim calls, calls, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [
        [f"{Path(file).name}:{line}:{name}", round(calls / rounds, 2), round(own * 1e3 / rounds, 4),
         round(cum * 1e3 / rounds, 4)]
        for (file, line, name), (_, calls, own, cum, _) in rows
    ]  # fmt: skip


def measure(
    backend: Any,
    decoder: Any,
    context: int,
    rounds: int,
    trace: Path | None = None,
    profile: bool = True,
    cprofile: bool = False,
) -> dict[str, Any]:
    rng = random.Random(context)
    ids = [rng.randrange(1000, backend.info.vocab_size - 1000) for _ in range(context)]
    gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16, draft_top_k=4)
    request = GenerationRequest(
        prompt_ids=tuple(ids), max_tokens=WARMUP + 4 * rounds + 2, sampling=SamplingParams(), ignore_eos=True
    )
    steps = gen.generate(request)
    next(steps)  # prefill and the first round
    for _ in range(WARMUP):
        next(steps)
    torch.cuda.synchronize()
    marks = [(drafter_module, "unpack_candidates", "readback"), (backend.graphs, "verify", "graphs.verify")]
    if backend.graphs.gate is not None:
        marks += [(backend.graphs.gate, "release", "gate_open"), (backend, "prelaunch", "prelaunch")]
    with stamped(marks) as stamps:
        plain = timed_rounds(steps, rounds)
    torch.cuda.synchronize()
    out = {"context": context, "round_ms_median": statistics.median(plain), "round_ms": plain}
    out.update(host_path(stamps))
    # the host's own time in each step, unprofiled (a step's time includes the steps it calls, and a wait on
    # the GPU where the step reads back): median ms per round over the window
    with stamped([step for step in host_steps(backend) if step[2] != "draft.unpack"]) as steps_stamped:
        stamped_rounds = timed_rounds(steps, rounds)
    torch.cuda.synchronize()
    out["stamped_round_ms_median"] = statistics.median(stamped_rounds)
    out["host_step_ms"] = step_medians(steps_stamped, rounds)
    # from the row checks' read-back returning to the commit graph's replay queued: the host's path after
    # the verify, with the GPU idle
    ends = [b for _, b in steps_stamped["graphs.commit"]]
    after = [min((e for e in ends if e > b), default=None) for _, b in steps_stamped["checks.readback"]]
    gaps = [(e - b) * 1e3 for (_, b), e in zip(steps_stamped["checks.readback"], after, strict=True) if e]
    if gaps:
        out["checks_to_commit_ms"] = statistics.median(gaps)
    if cprofile:
        out["cprofile"] = python_profile(steps, rounds)
    if not profile:
        steps.close()
        return out
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    profiler = torch.profiler.profile(activities=activities, with_stack=trace is not None)
    with labelled(host_steps(backend)), profiler as prof:
        profiled = timed_rounds(steps, rounds)
        torch.cuda.synchronize()
    steps.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        text = path.read_text()
    events = json.loads(text).get("traceEvents", [])
    if trace is not None:
        with gzip.open(trace, "wt") as f:
            f.write(text)
    out["profiled_round_ms_median"] = statistics.median(profiled)
    out.update(report(events, rounds))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("draft")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument(
        "--threads",
        default="0",
        help="torch CPU threads to measure each context under (0: the process default), e.g. 0,1",
    )
    p.add_argument("--prelaunch", default="", help="e.g. 0,1: each context without, then with, the gate")
    p.add_argument("--profile", type=int, default=1, help="0: time rounds only, no profiled window")
    p.add_argument("--cprofile", type=int, default=0, help="1: also --rounds rounds under Python's cProfile")
    p.add_argument(
        "--gc", default="default", help="e.g. default,freeze: each context with Python's collector as it is, "
        "then with every object made so far frozen out of it (gc.freeze)"
    )  # fmt: skip
    p.add_argument(
        "--trace-dir", type=Path, help="keep each profiled window as trace-CONTEXT-tTHREADS[-gG].json.gz"
    )
    args = p.parse_args()
    gates = [int(g) for g in args.prelaunch.split(",")] if args.prelaunch else [-1]
    backend = load_backend(
        args.model, args.draft, max_context=65536, model_id="diag", host_cache_gib=0.0, tree=True,
        prelaunch=True if args.prelaunch else None,
    )  # fmt: skip
    gate = backend.graphs.gate
    backend.prefix.enabled = False
    decoder = BenchDecoder(Path(args.model))
    default_threads = backend.prefill_threads  # torch's own count, before load_backend's host_threads
    for context in (int(c) for c in args.contexts.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            for g, mode in itertools.product(gates, args.gc.split(",")):
                # the backend's rounds run under its host_threads (begin() switches back after a prefill)
                backend.host_threads = threads or default_threads
                torch.set_num_threads(backend.host_threads)
                if g >= 0:
                    backend.graphs.gate = gate if g else None
                name = f"trace-{context}-t{threads}" + (f"-g{g}" if g >= 0 else "") + ".json.gz"
                trace = args.trace_dir / name if args.trace_dir else None
                if mode not in ("default", "freeze"):
                    raise SystemExit(f"--gc: {mode!r} is neither default nor freeze")
                gc.unfreeze()
                gc.collect()
                if mode == "freeze":
                    gc.freeze()
                gated = backend.graphs.gated_verifies
                measured = measure(
                    backend, decoder, context, args.rounds, trace, profile=bool(args.profile),
                    cprofile=bool(args.cprofile),
                )  # fmt: skip
                out = {"threads": torch.get_num_threads(), "prelaunch": g, "gc": mode, **measured}
                out["gated_verifies"] = backend.graphs.gated_verifies - gated
                print("HOSTGAPS " + json.dumps(out), flush=True)
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
