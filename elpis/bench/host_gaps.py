"""Where the GPU waits for the host inside decode rounds (issue 9: host time per round).

A round's GPU timeline has gaps: no kernel, copy or memset runs while the host samples, accepts, builds the
next tree or prepares a launch. `elpis/bench/scripts/host_gaps.py` runs rounds under torch's profiler with
the host's steps labelled (`torch.profiler.record_function(PREFIX + name)`); this module reads the Chrome
trace and says, for every microsecond of GPU idle time, which labelled step the host was in (the innermost
label open on the host thread then) and which torch op or CUDA runtime call it was inside. The profiler's own
overhead lengthens host steps, so the split is a ranking, not a measurement of the unprofiled round.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

PREFIX = "elpis.host."
UNLABELLED = "(no label)"
IN_PYTHON = "(python)"  # host time inside no torch op and no CUDA call
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CALL_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")

Segment = tuple[float, float, str]  # start, end (µs), name


def busy(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `intervals` as disjoint, ascending intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def idle_gaps(device: Iterable[tuple[float, float]], min_us: float = 0.0) -> list[tuple[float, float]]:
    """The gaps between the device's busy intervals (from its first start to its last end) of at least
    `min_us` microseconds."""
    spans = busy(device)
    return [(a[1], b[0]) for a, b in itertools.pairwise(spans) if b[0] - a[1] >= min_us]


def innermost(spans: Iterable[Segment], outside: str = UNLABELLED) -> list[Segment]:
    """The host thread's timeline of the innermost open span: nested spans (one thread's ranges) in, a
    sequence of disjoint (start, end, name) pieces out, `outside` where none is open."""
    points: list[tuple[float, int, int, str]] = []
    for i, (start, end, name) in enumerate(spans):
        if end < start:
            raise ValueError(f"span {name!r} ends before it starts ({start} > {end})")
        points.append((start, 1, i, name))
        points.append((end, 0, i, name))  # at one instant: ends (0) before starts (1)
    points.sort()
    timeline: list[Segment] = []
    stack: list[tuple[int, str]] = []
    previous = None
    for t, kind, i, name in points:
        if previous is not None and t > previous:
            label = stack[-1][1] if stack else outside
            if timeline and timeline[-1][2] == label and timeline[-1][1] == previous:
                timeline[-1] = (timeline[-1][0], t, label)
            else:
                timeline.append((previous, t, label))
        if kind == 1:
            stack.append((i, name))
        else:
            stack = [entry for entry in stack if entry[0] != i]  # usually the top: ranges nest
        previous = t
    return timeline


def attribute(
    gaps: Sequence[tuple[float, float]], timeline: Sequence[Segment], outside: str = UNLABELLED
) -> dict[str, float]:
    """Microseconds of `gaps` under each name of a host `timeline` (`innermost`); gap time outside the
    timeline counts as `outside`."""
    out: dict[str, float] = defaultdict(float)
    j = 0
    for g0, g1 in gaps:
        covered = 0.0
        while j < len(timeline) and timeline[j][1] <= g0:
            j += 1
        k = j
        while k < len(timeline) and timeline[k][0] < g1:
            t0, t1, name = timeline[k]
            overlap = min(t1, g1) - max(t0, g0)
            if overlap > 0:
                out[name] += overlap
                covered += overlap
            k += 1
        if g1 - g0 - covered > 1e-9:
            out[outside] += g1 - g0 - covered
    return dict(out)


def report(
    events: Sequence[dict[str, Any]], rounds: int, min_us: float = 2.0, top: int = 12
) -> dict[str, Any]:
    """From a Chrome trace of `rounds` rounds: GPU busy and idle microseconds per round, and the idle time per
    round split by the host's innermost labelled step and by the innermost torch op or CUDA call."""
    if rounds < 1:
        raise ValueError(f"a report needs at least one round, got {rounds}")
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    device = [_extent(e) for e in complete if e.get("cat") in DEVICE_CATS]
    if not device:
        raise ValueError("the trace holds no GPU work (was CUPTI available?)")
    labels = [e for e in complete if e.get("cat") == "user_annotation" and e["name"].startswith(PREFIX)]
    if not labels:
        raise ValueError(f"the trace holds no host ranges named {PREFIX}*")
    threads: dict[Any, int] = defaultdict(int)
    for e in labels:
        threads[e.get("tid")] += 1
    host_tid = max(threads, key=threads.__getitem__)  # the thread that ran the rounds

    def on_host(cats: Sequence[str], prefix: str = "") -> list[Segment]:
        return [
            (*_extent(e), e["name"][len(prefix) :])
            for e in complete
            if e.get("cat") in cats and e.get("tid") == host_tid and e.get("name", "").startswith(prefix)
        ]

    gaps = idle_gaps(device, min_us)
    steps = attribute(gaps, innermost(on_host(("user_annotation",), PREFIX)))
    calls = attribute(gaps, innermost(on_host(HOST_CALL_CATS), outside=IN_PYTHON), outside=IN_PYTHON)
    union = busy(device)
    window = union[-1][1] - union[0][0]
    busy_us = sum(b - a for a, b in union)

    def per_round(split: dict[str, float]) -> dict[str, float]:
        ranked = sorted(split.items(), key=lambda kv: -kv[1])[:top]
        return {name: round(us / rounds, 1) for name, us in ranked}

    return {
        "rounds": rounds,
        "window_us_per_round": round(window / rounds, 1),
        "busy_us_per_round": round(busy_us / rounds, 1),
        "idle_us_per_round": round((window - busy_us) / rounds, 1),
        "gaps_counted_us_per_round": round(sum(b - a for a, b in gaps) / rounds, 1),
        "min_gap_us": min_us,
        "idle_by_host_step": per_round(steps),
        "idle_by_host_call": per_round(calls),
    }


def _extent(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0))
