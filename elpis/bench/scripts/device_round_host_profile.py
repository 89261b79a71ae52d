"""Where the host's time goes in greedy rounds on the GPU (GPU machine, after `elpis build` and the full-size
synth in /tmp/full): per context, on one load, the host time a round (`rounds_ab.host_time`, unprofiled), then
one request's rounds after its prefill and warm-up rounds under cProfile, the functions by their own and
cumulative time. Rounds as the registry says (composed round graphs or pieces), or as `--round-graph on|off`
says. `--gc default freeze ...` times the host once per mode in that order, Python's cyclic collector as it is
or with every object made so far frozen out of it (gc.freeze), to see whether its collections make the slow
rounds. Usage: python3 elpis/bench/scripts/device_round_host_profile.py MODEL DRAFT [--context 1024 [8192 ..]]
[--tokens 40] [--top 30] [--round-graph on|off] [--gc default [freeze ..]]"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--context", type=int, nargs="+", default=[1024])
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--round-graph", choices=("on", "off"))
    parser.add_argument("--gc", nargs="+", choices=("default", "freeze"), default=["default"])
    args = parser.parse_args()
    from elpis.bench import rounds_ab as ab
    from elpis.bench.worker import BenchDecoder
    from elpis.exl3.round_graph import CudaComposer, RoundGraphs

    backend = ab.load_with_device_rounds(args.model, args.draft)
    rounds = backend.device_rounds
    if args.round_graph == "off":
        rounds.round_graphs = None
    elif args.round_graph == "on" and rounds.round_graphs is None:
        rounds.round_graphs = RoundGraphs(CudaComposer(backend.engine.device))
    decoder = BenchDecoder(args.model)
    for context in args.context:
        profile_context(backend, decoder, context, args.tokens, args.top, args.gc)


def profile_context(
    backend: Any, decoder: Any, context: int, tokens: int, top: int, modes: list[str]
) -> None:
    from elpis.bench import hardware
    from elpis.bench import rounds_ab as ab
    from elpis.bench.workload import prompt as make_prompt

    base = make_prompt(context + 1, seed=context, vocab=backend.info.vocab_size)
    for _ in ab.greedy_steps(backend, decoder, base, tokens, 16):  # warm-up request (captures, composes)
        pass
    graphs = "composed" if backend.device_rounds.round_graphs is not None else "pieces"
    for mode in modes:
        gc.unfreeze()
        gc.collect()
        if mode == "freeze":
            gc.freeze()
        got = ab.device_host_time(backend, decoder, base, tokens, 16)
        print(f"HOSTTIME context {context}, {graphs}, collector {mode}: {got} host {hardware.host_facts()}")
    gc.unfreeze()
    profiler = cProfile.Profile()
    steps = 0
    for step, _ in enumerate(ab.greedy_steps(backend, decoder, base, tokens, 16)):
        if step == ab.WARMUP_ROUNDS:  # after the prefill (step 0) and the warm-up rounds
            profiler.enable()
        steps += step >= ab.WARMUP_ROUNDS
    profiler.disable()
    print(f"HOSTPROF context {context}, {graphs}: {steps} rounds profiled")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main()
