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
extern "C" __global__ void divide(const float* a, float* out) { out[0] = a[0] / a[1]; }
extern "C" __global__ void quotients(const int32_t* s, const uint32_t* u, const int64_t* w, int64_t* out) {
    out[0] = s[0] / s[1];
    out[1] = u[0] / u[1];
    out[2] = w[0] / w[1];
}
"""

HALVES_KERNEL = r"""
#include <cuda_fp16.h>
extern "C" __global__ void halves(const __half2* h, float* out) {
    const float2 f = __half22float2(h[0]), g = __half22float2(h[1]);  // two scopes declaring low, high
    out[0] = f.x;
    out[1] = f.y;
    out[2] = g.x;
    out[3] = g.y;
}
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


SINE_KERNEL = r"""
extern "C" __global__ void sine(const float* a, float* out) { out[0] = __sinf(a[0]); }
"""


def test_what_it_does_not_implement_is_refused_by_name(tmp_path: Path) -> None:
    program = _program(tmp_path, "sine", SINE_KERNEL)
    numbers, out = np.array([0.5], dtype=np.float32), np.zeros(1, dtype=np.float32)
    with pytest.raises(PtxUnsupported, match="sin"):
        Machine().call(program.entry("sine"), numbers, out)


ROOT_KERNEL = r"""
extern "C" __global__ void root(const float* a, float* out) { out[0] = sqrtf(a[0]); }
"""


def _float32_cases(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random float32 bit patterns, subnormals, zeros of both signs, infinities and NaN among them."""
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000],
                       dtype=np.uint32)  # fmt: skip
    bits[: len(special)] = special
    bits[len(special) : 2 * len(special)] &= 0x807FFFFF  # subnormals
    return bits.view(np.float32)


def _same_float32(got: np.float32, want: np.float32) -> bool:
    """The same bits, or both NaN (a NaN's payload is the hardware's, not checked)."""
    return (np.isnan(got) and np.isnan(want)) or got.view(np.uint32) == want.view(np.uint32)


def test_float_division_and_square_root_are_ieees(tmp_path: Path) -> None:
    """div.rn.f32 and sqrt.rn.f32 (a / b and sqrtf without fast math) are IEEE's correctly rounded results:
    numpy's float32 divide and sqrt here, bit for bit, on random patterns and the special values."""
    divide = _program(tmp_path, "division", DIVIDE_KERNEL).entry("divide")
    text = nvcc.compile_to(tmp_path / "division.cu", "ptx", arch="sm_86", out_dir=tmp_path).read_text()
    assert "div.rn.f32" in text
    root = _program(tmp_path, "root", ROOT_KERNEL).entry("root")
    root_text = nvcc.compile_to(tmp_path / "root.cu", "ptx", arch="sm_86", out_dir=tmp_path).read_text()
    assert "sqrt.rn.f32" in root_text
    rng = np.random.default_rng(8)
    a, b = _float32_cases(rng, 300), _float32_cases(rng, 300)[::-1].copy()
    with np.errstate(all="ignore"):
        quotient, square_root = a / b, np.sqrt(a)
    for i in range(len(a)):
        out = np.zeros(1, dtype=np.float32)
        Machine().call(divide, np.array([a[i], b[i]]), out)
        assert _same_float32(out[0], quotient[i]), (a[i], b[i], out[0], quotient[i])
        Machine().call(root, np.array([a[i]]), out)
        assert _same_float32(out[0], square_root[i]), (a[i], out[0], square_root[i])


def _c_quotient(a: int, b: int) -> int:
    """C's integer quotient: rounded toward zero."""
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def test_integer_division_rounds_toward_zero_and_refuses_what_ptx_leaves_open(tmp_path: Path) -> None:
    """div.s32, div.u32 and div.s64 against C's quotient; a zero divisor and the signed minimum over -1,
    whose results PTX leaves to the machine, are refused."""
    program = _program(tmp_path, "division", DIVIDE_KERNEL)
    entry = program.entry("quotients")
    text = nvcc.compile_to(tmp_path / "division.cu", "ptx", arch="sm_86", out_dir=tmp_path).read_text()
    assert all(f"div.{t}" in text for t in ("s32", "u32", "s64"))
    rng = random.Random(5)
    for _ in range(150):
        sa, sb = (rng.choice([-7, 7, -1, 1, 2**31 - 1, -(2**31)]) if rng.random() < 0.3 else
                  rng.randint(-(2**31), 2**31 - 1) >> rng.randint(0, 30) for _ in range(2))  # fmt: skip
        ua, ub = rng.getrandbits(32), rng.getrandbits(32) >> rng.randint(0, 31)
        wa, wb = rng.getrandbits(64) - 2**63, (rng.getrandbits(64) - 2**63) >> rng.randint(0, 62)
        if 0 in (sb, ub, wb) or (sa, sb) == (-(2**31), -1) or (wa, wb) == (-(2**63), -1):
            continue
        out = np.zeros(3, dtype=np.int64)
        Machine().call(entry, np.array([sa, sb], dtype=np.int32), np.array([ua, ub], dtype=np.uint32),
                       np.array([wa, wb], dtype=np.int64), out)  # fmt: skip
        assert out.tolist() == [_c_quotient(sa, sb), ua // ub, _c_quotient(wa, wb)], (sa, sb, ua, ub, wa, wb)
    for s in ([7, 0], [-(2**31), -1]):
        with pytest.raises(PtxUnsupported, match="machine-specific"):
            Machine().call(entry, np.array(s, dtype=np.int32), np.array([1, 1], dtype=np.uint32),
                           np.array([1, 1], dtype=np.int64), np.zeros(3, dtype=np.int64))  # fmt: skip


def test_inline_asm_scopes_registers_are_their_own(tmp_path: Path) -> None:
    """cuda_fp16's __half22float2 is inline asm declaring `.reg .f16 low,high` in a multi-line scope: each
    scope's registers are renamed apart, and the conversions are numpy's float16 to float32 (exact), on
    random bit patterns (subnormals, infinities and NaNs included)."""
    entry = _program(tmp_path, "halves", HALVES_KERNEL).entry("halves")
    rng = np.random.default_rng(6)
    for _ in range(40):
        bits = rng.integers(0, 1 << 16, 4, dtype=np.uint16)
        bits[rng.integers(0, 4)] = rng.choice([0x0001, 0x83FF, 0x7C00, 0xFC00, 0x8000, 0x7E01])
        out = np.zeros(4, dtype=np.float32)
        Machine().call(entry, bits.view(np.int16).copy(), out)
        want = bits.view(np.float16).astype(np.float32)
        nan = np.isnan(want)
        assert (np.isnan(out) == nan).all() and (
            out[~nan].view(np.uint32) == want[~nan].view(np.uint32)
        ).all()


def test_a_load_outside_memory_and_a_wrong_launch_fail(tmp_path: Path) -> None:
    program = _program(tmp_path, "reach", REACH_KERNEL)
    entry = program.entry("reach")
    with pytest.raises(MemoryError):
        Machine().call(entry, np.zeros(2, dtype=np.uint32), np.zeros(1, dtype=np.uint32), 1 << 30)
    with pytest.raises(ValueError, match="parameters"):
        Machine().call(entry, np.zeros(2, dtype=np.uint32))
