"""Where the host's time goes in greedy rounds on the GPU (GPU machine, after `elpis build` and the full-size
synth in /tmp/full): one request's rounds under cProfile, the functions by their own and cumulative time per
round. Usage: python3 elpis/bench/scripts/device_round_host_profile.py MODEL DRAFT [--tokens 40] [--top 30]"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    from elpis.bench import rounds_ab as ab
    from elpis.bench.worker import BenchDecoder
    from elpis.bench.workload import prompt as make_prompt

    backend = ab.load_with_device_rounds(args.model, args.draft)
    decoder = BenchDecoder(args.model)
    base = make_prompt(1025, seed=1024, vocab=backend.info.vocab_size)
    for _ in ab.greedy_steps(backend, decoder, base, args.tokens, 16):  # warm-up request
        pass
    profiler = cProfile.Profile()
    steps = 0
    profiler.enable()
    for _ in ab.greedy_steps(backend, decoder, base, args.tokens, 16):
        steps += 1
    profiler.disable()
    print(f"HOSTPROF {steps} steps (the first holds the prefill)")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
