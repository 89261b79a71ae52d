"""GPU idle time split by what the host was doing (`elpis.bench.host_gaps`), on hand-made traces."""

from __future__ import annotations

import pytest

from elpis.bench import host_gaps
from elpis.bench.host_gaps import UNLABELLED, attribute, busy, idle_gaps, innermost, report


def test_busy_merges_overlaps_and_gaps_respect_the_minimum():
    assert busy([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    kernels = [(0, 10), (12, 20), (20.5, 30), (31, 40)]
    assert idle_gaps(kernels) == [(10, 12), (20, 20.5), (30, 31)]
    assert idle_gaps(kernels, min_us=1.0) == [(10, 12), (30, 31)]


def test_the_innermost_open_range_names_each_instant():
    spans = [(0, 100, "round"), (10, 40, "verify"), (20, 30, "fill"), (60, 90, "commit")]
    assert innermost(spans) == [
        (0, 10, "round"), (10, 20, "verify"), (20, 30, "fill"), (30, 40, "verify"), (40, 60, "round"),
        (60, 90, "commit"), (90, 100, "round"),
    ]  # fmt: skip
    assert innermost([(5, 6, "a")], outside="idle") == [(5, 6, "a")]
    with pytest.raises(ValueError, match="ends before it starts"):
        innermost([(3, 1, "bad")])


def test_gap_time_goes_to_the_step_open_then():
    timeline = innermost([(0, 100, "round"), (10, 40, "verify"), (20, 30, "fill")])
    split = attribute([(15, 25), (35, 50), (120, 130)], timeline)
    assert split == {"verify": 5 + 5, "fill": 5, "round": 10, UNLABELLED: 10}
    assert sum(split.values()) == pytest.approx(10 + 15 + 10)


def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}


def test_report_per_round_from_a_trace():
    p = host_gaps.PREFIX
    events = [
        _x("gemm", "kernel", 0, 100, tid=7), _x("gemm", "kernel", 150, 100, tid=7),
        _x("copy", "gpu_memcpy", 300, 10, tid=7), _x("gemm", "kernel", 400, 100, tid=7),
        _x(p + "accept", "user_annotation", 95, 60), _x(p + "propose", "user_annotation", 250, 160),
        _x("cudaMemcpyAsync", "cuda_runtime", 260, 45), _x("aten::topk", "cpu_op", 320, 20),
        _x(p + "other-thread", "user_annotation", 0, 500, tid=2),
    ]  # fmt: skip
    out = report(events, rounds=2, min_us=1.0)
    assert out["busy_us_per_round"] == 155.0 and out["window_us_per_round"] == 250.0
    assert out["idle_us_per_round"] == 95.0 and out["gaps_counted_us_per_round"] == 95.0
    # gaps 100-150 (accept), 250-300 (propose), 310-400 (propose until 410)
    assert out["idle_by_host_step"] == {"propose": 70.0, "accept": 25.0}
    assert out["idle_by_host_call"] == {"(python)": 65.0, "cudaMemcpyAsync": 20.0, "aten::topk": 10.0}
    with pytest.raises(ValueError, match="no GPU work"):
        report([e for e in events if e["cat"] == "user_annotation"], rounds=1)
    with pytest.raises(ValueError, match="no host ranges"):
        report([e for e in events if e["cat"] != "user_annotation"], rounds=1)
    with pytest.raises(ValueError, match="at least one round"):
        report(events, rounds=0)
