"""Acceptor speed: one decision through the Python binding, and bulk decisions through the batch entry.

    python -m elpis.accept.bench

The single-call figure is a median over rounds of many calls (it sits on every verify round). Batch
throughput is reported as wall time and as the calling thread's CPU time (the C loop runs in that
thread with the GIL released), so a loaded machine does not hide what the code itself costs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from elpis import accept
from elpis.accept import table

BATCH_SEED = 0xBE4C4


@dataclass(frozen=True)
class BatchTiming:
    decisions: int
    wall_s: float
    cpu_s: float


@dataclass(frozen=True)
class CallTiming:
    wall_us: float  # median over rounds, wall clock
    cpu_us: float  # median over rounds, this thread's CPU time (what the code costs on an idle machine)


def single_call_median_us(call: Callable[[], object], rounds: int = 31, calls: int = 2000) -> CallTiming:
    call()  # admission and per-thread buffers happen outside the measurement
    wall, cpu = [], []
    for _ in range(rounds):
        start_wall, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(calls):
            call()
        wall.append((time.perf_counter_ns() - start_wall) / calls / 1000)
        cpu.append((time.thread_time_ns() - start_cpu) / calls / 1000)
    return CallTiming(statistics.median(wall), statistics.median(cpu))


def typical_calls() -> dict[str, Callable[[], object]]:
    """One realistic decision of each kind: 7 drafts with a mismatch, an 8-row tree, its masks."""
    draft, target, stops = [11, 12, 13, 14, 15, 16, 17], [11, 12, 13, 14, 99, 16, 17, 18], [151643, 151645]
    parents = [-1, 0, 0, 1, 1, 3, 2, 5]
    tree_draft = [0, 11, 77, 12, 88, 13, 78, 14]
    tree_target = [11, 12, 79, 13, 89, 14, 80, 15]
    return {
        "chain": lambda: accept.chain(draft, target, stops, 4096),
        "tree": lambda: accept.tree(parents, tree_draft, tree_target, stops, 4096),
        "tree_masks": lambda: accept.tree_masks(parents),
    }


def batch_timing(kind: str, decisions: int = 1_048_576, block: int = 65_536) -> BatchTiming:
    """Time `decisions` random decisions (k <= 15 / up to 16 rows) through the batch entry, reusing one
    block of cells so memory stays small; every code must be a decision, not an error."""
    make = {"chain": table.random_chain_block, "tree": table.random_tree_block}[kind]
    cells = make(BATCH_SEED, 0, block)
    accept.batch(kind, cells[:16])  # admit and warm up outside the measurement
    wall, cpu = time.perf_counter(), time.thread_time()
    done = 0
    while done < decisions:
        n = min(block, decisions - done)
        out = accept.batch(kind, cells[:n])
        done += n
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if int(np.min(out["codes"])) < 2:
        raise RuntimeError(f"{kind} batch returned an error code")
    return BatchTiming(done, wall, cpu)


def main() -> int:
    start = time.perf_counter()
    accept.admitted()
    print(f"admission (identity + full table re-run + probes): {time.perf_counter() - start:.3f} s")
    for name, call in typical_calls().items():
        t = single_call_median_us(call)
        print(
            f"{name:10s} one decision via the Python binding: "
            f"median {t.wall_us:.2f} us wall, {t.cpu_us:.2f} us CPU"
        )
    total_wall = total_cpu = 0.0
    for kind in ("chain", "tree"):
        t = batch_timing(kind)
        total_wall += t.wall_s
        total_cpu += t.cpu_s
        print(
            f"{kind:10s} {t.decisions:,} decisions via the batch entry: {t.wall_s:.3f} s wall, "
            f"{t.cpu_s:.3f} s CPU ({t.decisions / t.wall_s / 1e6:.2f} M/s)"
        )
    print(f"chain + tree batch total: {total_wall:.3f} s wall, {total_cpu:.3f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
