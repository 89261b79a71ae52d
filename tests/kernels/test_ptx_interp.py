"""The PTX interpreter (tests/kernels/ptx_interp.py) against C and PTX semantics: small kernels built by nvcc,
run on random inputs, each result compared with its value computed here; and what it does not implement is
refused by name, not interpreted."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from elpis import nvcc
from tests.kernels.ptx_interp import Machine, PtxProgram, PtxUnsupported
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

INTEGER_KERNEL = r"""
#include <stdint.h>
extern "C" __global__ void integers(const uint32_t* in, uint32_t* out, int64_t* wide) {
    const uint32_t a = in[0], b = in[1], sel = in[2];
    const int32_t sa = static_cast<int32_t>(a), sb = static_cast<int32_t>(b);
    uint32_t p, f;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p) : "r"(a), "r"(b), "r"(sel));  // sign replication included
    asm("bfi.b32 %0, %1, %2, %3, %4;" : "=r"(f) : "r"(a), "r"(b), "r"(sel & 63u), "r"((sel >> 8) & 63u));
    out[0] = p;
    out[1] = f;
    out[2] = sa < sb;
    out[3] = static_cast<uint32_t>(sa > sb ? sa : sb);
    out[4] = a < b ? a : b;
    out[5] = a >> (b & 31u);
    out[6] = static_cast<uint32_t>(sa >> (b & 31u));
    out[7] = __popc(a);
    out[8] = static_cast<uint32_t>(static_cast<int8_t>(a));
    unsigned short narrowed;  // a u8 conversion into a 16-bit register: truncated, zero-extended
    asm("cvt.u8.u32 %0, %1;" : "=h"(narrowed) : "r"(a));
    out[9] = narrowed;
    wide[0] = static_cast<int64_t>(sa) * sb;
    wide[1] = static_cast<int64_t>(static_cast<uint64_t>(a) * b);
}
"""

FLOAT_KERNEL = r"""
#include <stdint.h>
extern "C" __global__ void floats(const double* x, const float* y, double* out, int64_t* whole) {
    const double a = x[0], b = x[1];
    out[0] = fmin(a, b);
    out[1] = a + b;
    out[2] = a - b;
    out[3] = -a;
    out[4] = static_cast<double>(y[0]);
    out[5] = a < b ? 1.0 : 0.0;
    out[6] = !(a >= b) ? 1.0 : 0.0;  // true on a NaN
    whole[0] = static_cast<int64_t>(y[0]);
}
"""

DIVIDE_KERNEL = r"""
#include <stdint.h>
extern "C" __global__ void divide(const uint32_t* a, uint32_t* out) { out[0] = a[0] / a[1]; }
"""

REACH_KERNEL = r"""
#include <stdint.h>
extern "C" __global__ void reach(const uint32_t* a, uint32_t* out, uint32_t i) { out[0] = a[i]; }
"""


def _program(tmp_path: Path, name: str, text: str, arch: str = "sm_86") -> PtxProgram:
    source = tmp_path / f"{name}.cu"
    source.write_text(text)
    return PtxProgram(nvcc.compile_to(source, "ptx", arch=arch, out_dir=tmp_path).read_text())


def _prmt(a: int, b: int, selector: int) -> int:
    source, out = b << 32 | a, 0
    for i in range(4):
        s = (selector >> (4 * i)) & 0xF
        byte = (source >> (8 * (s & 7))) & 0xFF
        out |= (0xFF if s & 8 and byte & 0x80 else 0 if s & 8 else byte) << (8 * i)
    return out


def _bfi(a: int, b: int, pos: int, length: int) -> int:
    if length == 0 or pos >= 32:
        return b
    field = ((1 << min(length, 32 - pos)) - 1) << pos
    return (b & ~field | (a << pos) & field) & 0xFFFFFFFF


def _s32(v: int) -> int:  # a 32-bit pattern as a signed value
    return v - (1 << 32) if v >> 31 else v


def test_integer_operations_are_cs_and_ptxs(tmp_path: Path) -> None:
    program = _program(tmp_path, "integers", INTEGER_KERNEL)
    rng = random.Random(3)
    edges = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
    for _ in range(120):
        a, b, sel = (rng.choice(edges) if rng.random() < 0.3 else rng.getrandbits(32) for _ in range(3))
        out, wide = np.zeros(10, dtype=np.uint32), np.zeros(2, dtype=np.int64)
        Machine().call(program.entry("integers"), np.array([a, b, sel], dtype=np.uint32), out, wide)
        sa, sb = _s32(a), _s32(b)
        want = [
            _prmt(a, b, sel), _bfi(a, b, sel & 63, (sel >> 8) & 63), int(sa < sb), max(sa, sb) & 0xFFFFFFFF,
            min(a, b), a >> (b & 31), (sa >> (b & 31)) & 0xFFFFFFFF, bin(a).count("1"),
            (((a & 0xFF) ^ 0x80) - 0x80) & 0xFFFFFFFF, a & 0xFF,
        ]  # fmt: skip
        assert out.tolist() == want, (a, b, sel)
        assert wide.tolist() == [sa * sb, a * b - (1 << 64) if a * b >> 63 else a * b], (a, b)


def test_float64_operations_round_and_order_as_ieee_and_nan_aware(tmp_path: Path) -> None:
    program = _program(tmp_path, "floats", FLOAT_KERNEL)
    rng = random.Random(4)
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, 5e-324, -2.5]
    for _ in range(120):
        a, b = (rng.choice(specials) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6) for _ in range(2))
        y = struct.unpack("<f", struct.pack("<f", rng.choice([rng.uniform(-1e9, 1e9), 0.5, -3.75])))[0]
        out, whole = np.zeros(7, dtype=np.float64), np.zeros(1, dtype=np.int64)
        Machine().call(program.entry("floats"), np.array([a, b]), np.array([y], dtype=np.float32), out, whole)
        lowest = b if math.isnan(a) else a if math.isnan(b) else min(a, b)
        want = [lowest, a + b, a - b, -a, y, float(a < b), float(not a >= b)]
        for i, (got, value) in enumerate(zip(out.tolist(), want, strict=True)):
            if i == 0 and a == 0.0 and b == 0.0:  # fmin of two zeros may give either
                assert got == 0.0
            elif math.isnan(value):  # the payload of a NaN is the hardware's, not checked
                assert math.isnan(got), (i, a, b)
            else:  # the bits: a sign of zero or a last-place difference shows
                assert struct.pack("<d", got) == struct.pack("<d", value), (i, a, b)
        assert whole[0] == math.trunc(y), y


def test_what_it_does_not_implement_is_refused_by_name(tmp_path: Path) -> None:
    program = _program(tmp_path, "division", DIVIDE_KERNEL)
    numbers, out = np.array([7, 2], dtype=np.uint32), np.zeros(1, dtype=np.uint32)
    with pytest.raises(PtxUnsupported, match="div"):
        Machine().call(program.entry("divide"), numbers, out)


def test_a_load_outside_memory_and_a_wrong_launch_fail(tmp_path: Path) -> None:
    program = _program(tmp_path, "reach", REACH_KERNEL)
    entry = program.entry("reach")
    with pytest.raises(MemoryError):
        Machine().call(entry, np.zeros(2, dtype=np.uint32), np.zeros(1, dtype=np.uint32), 1 << 30)
    with pytest.raises(ValueError, match="parameters"):
        Machine().call(entry, np.zeros(2, dtype=np.uint32))
