"""Device time of a kernel call for the GPU tests' timing lines and the kernel A/B scripts."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def median_us(fn: Callable[[], object], calls: int = 20, reps: int = 15) -> float:
    """Microseconds per call, launched from Python `calls` times per repetition: median of `reps`."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def graph_us(fn: Callable[[], object], calls: int = 20, reps: int = 15) -> float:
    """Device time per call: `calls` launches captured in one CUDA graph (no Python between kernels)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return median_us(graph.replay, calls=1, reps=reps) / calls
