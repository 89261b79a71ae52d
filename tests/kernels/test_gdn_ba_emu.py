"""The Gated DeltaNet gate projections kernel (patches/kernels/gdn_ba_rows.cu) on the CPU, through the CUDA
emulation of tests/kernels/cuda_emu.py: b and a agree with float64 within the fp32 accumulation; a row's bits
do not depend on the other rows or on how many there are; bad arguments are refused. The GPU's own bits and
its speed are checked by tests/kernels/test_gdn_ba.py.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from elpis.exl3 import gdn_ba
from tests.kernels import cuda_emu

K = 2600  # three spans of k (1024 each), the last one partial
NV = 6  # 2 * NV = 12 columns: three blocks of four


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    built = cuda_emu.build_emulated(
        gdn_ba.SOURCE, tmp_path_factory.mktemp("gdn_ba_emu"), launches=2, needs=("gdn_ba_schedule.h",)
    )
    return gdn_ba.bind(built)


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    wb = (rng.standard_normal((K, NV)) / np.sqrt(K)).astype(np.float16)
    wa = (rng.standard_normal((K, NV)) / np.sqrt(K)).astype(np.float16)
    return wb, wa


def _run(lib: ctypes.CDLL, x: np.ndarray, wb: np.ndarray, wa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = x.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float16)
    wt = np.ascontiguousarray(np.concatenate((wb.T, wa.T), axis=0), dtype=np.float16)
    partials = np.full((-(-K // gdn_ba.SPAN), rows, 2 * NV), np.nan, dtype=np.float32)
    b = np.full((rows, NV), np.nan, dtype=np.float32)
    a = np.full((rows, NV), np.nan, dtype=np.float32)
    err = lib.elpis_gdn_ba_rows(
        x.ctypes.data, K, wt.ctypes.data, K, NV, rows, partials.ctypes.data, b.ctypes.data, a.ctypes.data,
        None,
    )  # fmt: skip
    assert err == 0
    assert not np.isnan(b).any() and not np.isnan(a).any(), "an output was not written"
    return b, a


def test_matches_float64(lib: ctypes.CDLL) -> None:
    wb, wa = _weights(1)
    x = np.random.default_rng(2).standard_normal((16, K)).astype(np.float16)
    b, a = _run(lib, x, wb, wa)
    x64 = x.astype(np.float64)
    for got, w in ((b, wb), (a, wa)):
        exact = x64 @ w.astype(np.float64)
        scale = np.abs(x64) @ np.abs(w.astype(np.float64))  # bound of the fp32 sums' rounding
        assert np.all(np.abs(got - exact) <= 1e-5 * scale + 1e-30), np.max(np.abs(got - exact) / scale)


def test_a_row_does_not_depend_on_the_others(lib: ctypes.CDLL) -> None:
    wb, wa = _weights(3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, K)).astype(np.float16)
    b16, a16 = _run(lib, x, wb, wa)
    for rows in (1, 5, 16):
        other = x[:rows].copy()
        other[1:] = rng.standard_normal((rows - 1, K)).astype(np.float16)  # row 0 kept, the rest rewritten
        b, a = _run(lib, other, wb, wa)
        assert b[0].tobytes() == b16[0].tobytes() and a[0].tobytes() == a16[0].tobytes(), f"{rows} rows"
    for r in (0, 7, 15):  # each row alone, at row 0 of a 1-row call
        b, a = _run(lib, x[r : r + 1], wb, wa)
        assert b.tobytes() == b16[r].tobytes() and a.tobytes() == a16[r].tobytes(), f"row {r}"


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    out = np.zeros((16, NV), dtype=np.float32)
    part = np.zeros((3, 16, 2 * NV), dtype=np.float32)
    x = np.zeros((17, K + 8), dtype=np.float16)
    wt = np.zeros((2 * NV, K + 8), dtype=np.float16)
    assert x.ctypes.data % 16 == 0 and wt.ctypes.data % 16 == 0

    def call(x_ptr: int, x_stride: int, wt_ptr: int, k: int, nv: int, rows: int) -> int:
        return lib.elpis_gdn_ba_rows(
            x_ptr, x_stride, wt_ptr, k, nv, rows, part.ctypes.data, out.ctypes.data, out.ctypes.data, None
        )

    xp, wp = x.ctypes.data, wt.ctypes.data
    assert call(xp, K, wp, K, NV, 0) == -1, "no rows"
    assert call(xp, K, wp, K, NV, 17) == -1, "more rows than 16"
    assert call(xp, K - 8, wp, K, NV, 1) == -1, "row stride below k"
    assert call(xp, K, wp, K, 3, 1) == -1, "2 * nv not a multiple of 4"
    assert call(xp, K + 4, wp, K + 4, NV, 1) == -1, "k not a multiple of 8"
    assert call(xp, K + 4, wp, K, NV, 1) == -1, "row stride not a multiple of 8"
    assert call(xp + 2, K, wp, K, NV, 1) == -1, "x not 16-byte aligned"
    assert call(xp, K, wp + 8, K, NV, 1) == -1, "wt not 16-byte aligned"
