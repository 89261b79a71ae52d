"""The arithmetic of `device_round_ab.py`'s profile lines (host against device rounds), on toy profiles."""

from __future__ import annotations

import pytest

from elpis.bench.scripts import device_round_ab as ab


def arm(span: float, busy: float, by_name: dict[str, float]) -> dict:
    return {"span_ms": span, "busy_ms": busy, "idle_ms": span - busy, "kernels": 900.0, "by_name": by_name}


def test_the_difference_lists_the_kernels_a_device_round_adds_or_drops_largest_first() -> None:
    host = arm(17.2, 15.5, {"rows_gemm_kernel": 11.3, "topk": 0.1, "argmax": 0.04})
    names = {f"k{i}": 0.001 * i for i in range(20)}
    device = arm(17.2, 16.9, {"rows_gemm_kernel": 11.3, "topk": 0.1, "round_tail_kernel": 0.03,
                              "gdn_tree_kernel": 0.5, **names})  # fmt: skip
    got = ab.profile_difference(host, device)
    assert got["host"]["idle_ms"] == pytest.approx(1.7) and got["device"]["idle_ms"] == pytest.approx(0.3)
    diff = got["kernel_ms_device_minus_host"]
    assert len(diff) == ab.DIFF_KERNELS
    assert list(diff)[:3] == ["gdn_tree_kernel", "argmax", "round_tail_kernel"]
    assert diff["argmax"] == pytest.approx(-0.04) and "rows_gemm_kernel" not in diff
