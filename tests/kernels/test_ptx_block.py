"""The PTX interpreter's block mode (tests/kernels/ptx_interp.py: `Machine.run_block`) on small kernels nvcc
builds: every thread of a block, barriers, warp shuffles and the race detector. A reduction with its
barriers gives its sum and no race; the same source without one barrier is reported as a race (the detector
can fail); a butterfly of shuffles gives every lane the warp's sum; the shuffles' lane arithmetic is CUDA's
documented one; a shuffle some lanes of its mask never reach, and a barrier after a thread exited, are
refused."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import platform
import random
import re
import struct
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from elpis import nvcc
from tests.kernels import ptx_interp
from tests.kernels.ptx_interp import BlockReport, Entry, Machine, PtxProgram, PtxUnsupported, SyncFault
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

FULL = 0xFFFFFFFF

KERNELS = r"""
#define FULL 0xffffffffu
extern "C" __global__ void reduce(const unsigned* in, unsigned* out) {
    __shared__ unsigned s[256];
    const unsigned t = threadIdx.x;
    s[t] = in[blockIdx.x * blockDim.x + t];
#ifndef NO_FIRST_BARRIER
    __syncthreads();
#endif
    for (unsigned d = blockDim.x / 2; d > 0; d >>= 1) {
        if (t < d) s[t] += s[t + d];
#ifndef NO_LEVEL_BARRIER
        __syncthreads();
#endif
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
extern "C" __global__ void butterfly(const unsigned* in, unsigned* out) {
    unsigned v = in[threadIdx.x];
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(FULL, v, d);
    out[threadIdx.x] = v;
}
extern "C" __global__ void shuffles(const unsigned* in, unsigned* out, unsigned k) {
    const unsigned v = in[threadIdx.x], l = threadIdx.x;
    out[4 * l + 0] = __shfl_up_sync(FULL, v, k, 16);
    out[4 * l + 1] = __shfl_down_sync(FULL, v, k, 8);
    out[4 * l + 2] = __shfl_sync(FULL, v, in[32 + l], 16);
    out[4 * l + 3] = __shfl_xor_sync(FULL, v, k);
}
extern "C" __global__ void divergent(const unsigned* in, unsigned* out) {
    unsigned v = in[threadIdx.x];
    if (threadIdx.x < 16) v += __shfl_xor_sync(FULL, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}
extern "C" __global__ void early_exit(unsigned* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1u;
}
"""


def _program(tmp_path: Path, arch: str = "sm_86", **defines: int) -> PtxProgram:
    source = tmp_path / "block_kernels.cu"
    source.write_text(KERNELS)
    return PtxProgram(
        nvcc.compile_to(source, "ptx", arch=arch, defines=defines, out_dir=tmp_path).read_text()
    )


def _launch(
    entry: Entry, threads: int, inputs: np.ndarray, outputs: int, *scalars: int
) -> tuple[np.ndarray, BlockReport]:
    m = Machine()
    out = np.zeros(outputs, dtype=np.uint32)
    at_in, at_out = m.put(inputs), m.put(out)
    report = m.run_block(entry, [at_in, at_out, *scalars], threads=threads)
    return m.get(at_out, out), report


@pytest.mark.parametrize("arch", nvcc.ARCHS)
@pytest.mark.parametrize("threads", [32, 64, 256])
def test_a_reduction_with_its_barriers_sums_without_a_race(tmp_path: Path, arch: str, threads: int) -> None:
    entry = _program(tmp_path, arch).entry("reduce")
    values = np.array(random.Random(threads).choices(range(1 << 32), k=threads), dtype=np.uint32)
    out, report = _launch(entry, threads, values, 1)
    assert out[0] == int(values.astype(np.uint64).sum()) % (1 << 32)
    assert report.races == [] and report.unwritten_reads == []
    assert report.barriers == 1 + threads.bit_length() - 1  # the first and one a level


@pytest.mark.parametrize("missing", ["NO_FIRST_BARRIER", "NO_LEVEL_BARRIER"])
def test_a_reduction_without_a_barrier_is_reported_as_a_race(tmp_path: Path, missing: str) -> None:
    entry = _program(tmp_path, **{missing: 1}).entry("reduce")
    _, report = _launch(entry, 64, np.arange(64, dtype=np.uint32), 1)
    assert report.races, "no race reported"
    race = report.races[0]
    assert race.space == "shared" and race.first.thread != race.second.thread
    assert race.first.write or race.second.write
    assert "race on shared byte" in str(race)


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_butterfly_gives_every_lane_the_warps_sum(tmp_path: Path, arch: str) -> None:
    entry = _program(tmp_path, arch).entry("butterfly")
    for threads in (32, 64):
        values = np.array(random.Random(threads).choices(range(1 << 32), k=threads), dtype=np.uint32)
        out, report = _launch(entry, threads, values, threads)
        for w in range(threads // 32):
            assert set(out[32 * w : 32 * w + 32].tolist()) == {
                int(values[32 * w : 32 * w + 32].sum()) % (1 << 32)
            }
        assert report.shuffles == 5 * threads // 32 and report.races == []


def _cuda_shuffles(v: list[int], sources: list[int], k: int) -> list[int]:
    """up (width 16), down (width 8), an index (width 16) and xor by the CUDA programming guide's words: a
    lane keeps its own value where the source would leave its group of `width` lanes."""
    out = []
    for lane in range(32):
        up = v[lane - k] if lane % 16 >= k else v[lane]
        down = v[lane + k] if lane % 8 + k < 8 else v[lane]
        index = v[lane // 16 * 16 + sources[lane] % 16]
        out += [up, down, index, v[lane ^ k]]
    return out


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_shuffles_read_the_lanes_cuda_names(tmp_path: Path, arch: str) -> None:
    entry = _program(tmp_path, arch).entry("shuffles")
    rng = random.Random(5)
    for k in (0, 1, 3, 7, 8, 15, 16, 31):
        values = [rng.getrandbits(32) for _ in range(32)]
        sources = [rng.getrandbits(32) for _ in range(32)]
        out, _ = _launch(entry, 32, np.array(values + sources, dtype=np.uint32), 128, k)
        assert out.tolist() == _cuda_shuffles(values, sources, k), k


def test_a_shuffle_not_every_lane_of_its_mask_reaches_is_refused(tmp_path: Path) -> None:
    entry = _program(tmp_path).entry("divergent")
    with pytest.raises(SyncFault, match="thread 16 of its warp is at line"):
        _launch(entry, 32, np.arange(32, dtype=np.uint32), 32)


def test_a_barrier_after_a_thread_exited_is_refused(tmp_path: Path) -> None:
    entry = _program(tmp_path).entry("early_exit")
    m = Machine()
    with pytest.raises(PtxUnsupported, match="exited"):
        m.run_block(entry, [m.put(np.zeros(32, dtype=np.uint32))], threads=32)


FLOAT32_KERNEL = r"""
extern "C" __global__ void floats32(const float* x, const long long* n, float* out) {
    const float a = x[0], b = x[1], c = x[2];
    out[0] = __fmaf_rn(a, b, c);
    out[1] = __fmaf_rd(a, b, c);
    out[2] = __fmaf_rz(a, b, c);
    out[3] = __fmaf_ru(a, b, c);
    out[4] = __fadd_rn(a, b);
    out[5] = __fmul_rn(a, b);
    out[6] = __fsub_rn(a, b);
    out[7] = __saturatef(a);
    out[8] = __ll2float_rn(n[0]);
    out[9] = __int2float_rn(static_cast<int>(n[0]));
    out[10] = __uint2float_rn(static_cast<unsigned>(n[0]));
    out[11] = __ll2float_rd(n[0]);
}
extern "C" __global__ void unrounded(const float* x, float* out) {
    float p, s, e;
    asm("mul.f32 %0, %1, %2;" : "=f"(p) : "f"(x[0]), "f"(x[1]));
    asm("add.f32 %0, %1, %2;" : "=f"(s) : "f"(p), "f"(x[2]));  // ptxas may make these one fma
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x[0]));
    out[0] = s;
    out[1] = e;
}
"""

_ROUNDING = {"rn": 0, "rm": 0x400, "rp": 0x800, "rz": 0xC00}  # x86 fenv.h FE_TONEAREST, DOWNWARD, UPWARD, ...


def _libm_fmaf(a: float, b: float, c: float, mode: str) -> float:
    """The C library's fmaf (IEEE's fused multiply-add) under the rounding mode: an independent reference."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype, libm.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    libm.fesetround(_ROUNDING[mode])
    try:
        return libm.fmaf(a, b, c)
    finally:
        libm.fesetround(0)


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _int_to_f32_down(n: int) -> float:
    r = float(np.float32(n))  # to nearest; one step down where that rounded up
    return float(np.nextafter(np.float32(r), np.float32(-np.inf))) if r > n else r


def _f32(rng: random.Random) -> float:
    specials = [0.0, -0.0, 1.5, -3.0, 0.5, 2.0**-149, -(2.0**-130), 3.0e38, -1.0e-38, 2.0**24 + 2]
    raw = rng.choice(specials) if rng.random() < 0.3 else rng.uniform(-4, 4) * 2.0 ** rng.randint(-140, 120)
    return float(np.float32(raw))


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="x86 fenv rounding modes"
)
def test_float32_operations_round_as_ieee(tmp_path: Path) -> None:
    """fma in every rounding mode against the C library's fmaf (exact cancellations and zeros' signs
    included), add, mul and sub against numpy's float32, saturation, and integers to float32."""
    source = tmp_path / "floats32.cu"
    source.write_text(FLOAT32_KERNEL)
    entry = PtxProgram(nvcc.compile_to(source, "ptx", arch="sm_86", out_dir=tmp_path).read_text()).entry(
        "floats32"
    )
    rng = random.Random(11)
    for i in range(300):
        a, b, c = _f32(rng), _f32(rng), _f32(rng)
        if i % 10 == 0:  # an exact cancellation: the sign of the zero is the rounding mode's
            a, b, c = 3.0, 0.5, -1.5
        elif i % 3 == 1:  # like magnitudes: a * b + c mostly exact in float64, then rounded once to float32
            a, b, c = (float(np.float32(rng.uniform(-4, 4))) for _ in range(3))
        n = rng.choice([0, 1, -1, 2**24 + 1, -(2**40) - 3, 2**31 - 1, rng.getrandbits(63) - 2**62])
        m, out = Machine(), np.zeros(12, dtype=np.float32)
        at = m.put(out)
        m.run(entry, [m.put(np.array([a, b, c], dtype=np.float32)), m.put(np.array([n], dtype=np.int64)), at])
        got = [_f32_bits(v) for v in m.get(at, out).tolist()]
        fa, fb = np.float32(a), np.float32(b)
        want = [_libm_fmaf(a, b, c, mode) for mode in ("rn", "rm", "rz", "rp")]
        with np.errstate(over="ignore"):  # an overflow to infinity is the IEEE result being checked
            want += [fa + fb, fa * fb, fa - fb, min(max(a, 0.0), 1.0)]
        want += [np.float32(n), np.float32(_signed32(n)), np.float32(n & 0xFFFFFFFF), _int_to_f32_down(n)]
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            if math.isnan(float(w)):
                assert math.isnan(struct.unpack("<f", struct.pack("<I", g))[0]), (j, a, b, c)
            else:
                assert g == _f32_bits(float(w)), (j, a, b, c, n)


def _signed32(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >> 31 else n


def test_a_fusable_add_and_approximate_math_are_refused_unless_opted_in(tmp_path: Path) -> None:
    """An unrounded mul.f32 read by an unrounded add.f32 may become one fma (ptxas's choice), and ex2.approx
    is approximate: both refused by default; `approximate=True` runs them, the add rounded twice and 2^x
    correctly rounded (one of the results PTX allows)."""
    source = tmp_path / "unrounded.cu"
    source.write_text(FLOAT32_KERNEL)
    entry = PtxProgram(nvcc.compile_to(source, "ptx", arch="sm_86", out_dir=tmp_path).read_text()).entry(
        "unrounded"
    )
    x, out = np.array([1.5, 3.0, 0.25], dtype=np.float32), np.zeros(2, dtype=np.float32)
    with pytest.raises(PtxUnsupported, match="may fuse"):
        Machine().call(entry, x, out)
    Machine(approximate=True).call(entry, x, out)
    assert out.tolist() == [4.75, float(np.float32(2.0**1.5))]


WATCHED_KERNEL = r"""
#include <cuda_bf16.h>
struct Table { int n; signed char pick[64]; };
// a static __shared__ of a device function: nvcc declares it at module scope, outside the entry
__device__ __forceinline__ void body(const Table& table, const __nv_bfloat16* in, float* out,
                                     __nv_bfloat16* back) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = __bfloat162float(in[t]);
    __syncthreads();
    const float v = s[table.pick[(t + table.n) & 63]];  // the struct parameter indexed at run time
    out[t] = v;
    back[t] = __float2bfloat16_rn(v * 3.0f);
}
// __grid_constant__: nvcc reads the struct through the parameter's address (mov.b64 %rd, param)
extern "C" __global__ void watched(const __grid_constant__ Table table, const __nv_bfloat16* in, float* out,
                                   __nv_bfloat16* back) {
    body(table, in, out, back);
}
// a second entry using body keeps the shared array at module scope (with one, nvcc moves it into the entry)
extern "C" __global__ void watched_too(const __grid_constant__ Table table, const __nv_bfloat16* in,
                                       float* out, __nv_bfloat16* back) {
    body(table, in, out, back);
}
"""


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_watch_records_each_threads_accesses_of_a_module_shared_array(tmp_path: Path, arch: str) -> None:
    """A static __shared__ array of a device function (declared at module scope), a struct parameter whose
    array nvcc indexes through the parameter's address, bf16 widened and rounded to nearest even: the outputs
    are numpy's and torch's, and a watch on the shared array records, for each thread in its program order,
    its store of s[t] before the barrier and its load of s[pick[(t + n) & 63]] after it."""
    import torch

    source = tmp_path / "watched.cu"
    source.write_text(WATCHED_KERNEL)
    text = nvcc.compile_to(source, "ptx", arch=arch, out_dir=tmp_path).read_text()
    assert re.search(r"^\.shared .*E1s\[256\];$", text, re.M)  # the array is the module's
    assert re.search(r"^\s*mov\.b64\s+%rd\d+, watched_param_0;$", text, re.M)  # the parameter's address
    entry = PtxProgram(text).entries["watched"]
    rng = np.random.default_rng(9)
    threads, n = 64, 37
    pick = rng.integers(0, threads, 64).astype(np.int8)
    table = struct.pack("<i", n) + pick.tobytes()
    values = torch.from_numpy(rng.standard_normal(threads).astype(np.float32) * 1e3).bfloat16()
    m = Machine()
    at_in = m.put(values.view(torch.int16).numpy())
    out, back = np.zeros(threads, dtype=np.float32), np.zeros(threads, dtype=np.int16)
    at_out, at_back = m.put(out), m.put(back)
    shared, size = m.symbol(entry, "body")
    assert size == 4 * threads
    w = m.watch(shared, size)
    report = m.run_block(entry, [table, at_in, at_out, at_back], threads=threads)
    assert report.races == [] and report.unwritten_reads == [] and report.barriers == 1
    wide = values.float().numpy()
    want = wide[pick[(np.arange(threads) + n) & 63]]
    assert m.get(at_out, out).tolist() == want.tolist()
    rounded = torch.from_numpy(want * np.float32(3.0)).bfloat16().view(torch.int16).numpy()
    assert m.get(at_back, back).tolist() == rounded.tolist()
    for t in range(threads):
        seen = [(x.write, (x.addr - shared) // 4, x.barriers) for x in w.of_thread(t)]
        assert seen == [(True, t, 0), (False, int(pick[(t + n) & 63]), 1)], (t, seen)
    assert [x.seq for x in w.touches] == list(range(len(w.touches))) == list(range(2 * threads))
    m.unwatch(w)
    m.run_block(entry, [table, at_in, at_out, at_back], threads=threads)
    assert len(w.touches) == 2 * threads


MATRIX_KERNELS = r"""
#include <cuda_fp16.h>
// 64 rows of 8 halves in dynamic shared memory; lane l names row rows[l] (ldmatrix's row addresses)
extern "C" __global__ void ldmatrix_all(const unsigned short* in, const unsigned* rows, unsigned* out) {
    extern __shared__ __align__(16) unsigned short s[];
    const unsigned l = threadIdx.x;
    for (unsigned i = 0; i < 16; i++) s[16 * l + i] = in[16 * l + i];
#ifndef NO_BARRIER
    __syncthreads();
#endif
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(s + 8 * rows[l]));
    unsigned* o = out + 11 * l;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(o[0]), "=r"(o[1]), "=r"(o[2]), "=r"(o[3]) : "r"(addr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(o[4]), "=r"(o[5]), "=r"(o[6]), "=r"(o[7]) : "r"(addr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(o[8]), "=r"(o[9]) : "r"(addr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(o[10]) : "r"(addr));
}
extern "C" __global__ void ldmatrix_half_warp(const unsigned short* in, unsigned* out) {
    extern __shared__ __align__(16) unsigned short s[];
    const unsigned l = threadIdx.x;
    for (unsigned i = 0; i < 16; i++) s[16 * l + i] = in[16 * l + i];
    __syncthreads();
    unsigned r = 0;
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(s + 8 * l));
    if (l < 16) asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(addr));
    out[l] = r;
}
// lane l's fragments: a[4 l..], b[2 l..] (f16x2 words), c[4 l..] floats; d[4 l..] out
extern "C" __global__ void mma(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const unsigned l = threadIdx.x;
    float* o = d + 4 * l;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(o[0]), "=f"(o[1]), "=f"(o[2]), "=f"(o[3])
                 : "r"(a[4 * l]), "r"(a[4 * l + 1]), "r"(a[4 * l + 2]), "r"(a[4 * l + 3]), "r"(b[2 * l]),
                   "r"(b[2 * l + 1]), "f"(c[4 * l]), "f"(c[4 * l + 1]), "f"(c[4 * l + 2]), "f"(c[4 * l + 3]));
}
extern "C" __global__ void to_half(const float* x, unsigned short* out) {
    out[threadIdx.x] = __half_as_ushort(__float2half_rn(x[threadIdx.x]));
}
"""


def _matrix_program(tmp_path: Path, arch: str = "sm_86", **defines: int) -> PtxProgram:
    source = tmp_path / "matrix_kernels.cu"
    source.write_text(MATRIX_KERNELS)
    return PtxProgram(
        nvcc.compile_to(source, "ptx", arch=arch, defines=defines, out_dir=tmp_path).read_text()
    )


def _ldmatrix_isa(rows: np.ndarray, count: int, trans: bool) -> list[list[int]]:
    """The PTX ISA's ldmatrix .m8n8 .b16 layout, written out here: matrix i's row r is at the address lane
    8 i + r gives; lane l's register i holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (the
    first in the low half), or with .trans column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1."""
    regs = []
    for lane in range(32):
        words = []
        for i in range(count):
            m = rows[8 * i : 8 * i + 8]  # [row][column]
            pair = (m[2 * (lane % 4), lane // 4], m[2 * (lane % 4) + 1, lane // 4]) if trans else (
                m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1])  # fmt: skip
            words.append(int(pair[0]) | int(pair[1]) << 16)
        regs.append(words)
    return regs


def _run_ldmatrix(entry: Entry, halves: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, BlockReport]:
    m = Machine()
    out = np.zeros(32 * 11, dtype=np.uint32)
    at_out = m.put(out)
    report = m.run_block(entry, [m.put(halves), m.put(rows), at_out], threads=32, dynamic_shared=1024)
    return m.get(at_out, out).reshape(32, 11), report


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_ldmatrix_gives_each_lane_the_isa_fragments(tmp_path: Path, arch: str) -> None:
    """x4, x4.trans, x2 and x1.trans from rows named in a random order: every lane's registers are the
    ISA layout's (written out in the test); the transposed layout, or two lanes' registers swapped, is not
    what the instruction gives (the comparison can fail). The reads pass the race detector."""
    entry = _matrix_program(tmp_path, arch).entry("ldmatrix_all")
    rng = np.random.default_rng(4)
    halves = rng.integers(0, 1 << 16, 64 * 8, dtype=np.uint16)
    rows = rng.permutation(64)[:32].astype(np.uint32)
    got, report = _run_ldmatrix(entry, halves, rows)
    table = halves.reshape(64, 8)[rows]  # the rows in lane order
    want = [x4 + x4t + x2 + x1t for x4, x4t, x2, x1t in zip(
        _ldmatrix_isa(table, 4, False), _ldmatrix_isa(table, 4, True), _ldmatrix_isa(table, 2, False),
        _ldmatrix_isa(table, 1, True), strict=True)]  # fmt: skip
    assert got.tolist() == want
    assert report.races == [] and report.unwritten_reads == [] and report.collectives == 4
    assert got[:, :4].tolist() != [w[4:8] for w in want]  # the plain load is not the transposed layout
    swapped = [*want[1:2], *want[0:1], *want[2:]]
    assert got.tolist() != swapped


def test_ldmatrix_reads_are_seen_by_the_race_detector(tmp_path: Path) -> None:
    """Without the barrier between the threads' stores and the ldmatrix, its row reads race with other
    lanes' stores (the ldmatrix line is reported)."""
    text_entry = _matrix_program(tmp_path, NO_BARRIER=1).entry("ldmatrix_all")
    rows = np.arange(32, dtype=np.uint32)[::-1].copy()
    _, report = _run_ldmatrix(text_entry, np.arange(512, dtype=np.uint16), rows)
    assert report.races and report.races[0].space == "shared"
    ldmatrix_lines = {i.line for i in text_entry.code if i.opcode == "ldmatrix"}
    assert any(r.second.line in ldmatrix_lines and not r.second.write for r in report.races)


def test_ldmatrix_half_a_warp_runs_is_refused(tmp_path: Path) -> None:
    entry = _matrix_program(tmp_path).entry("ldmatrix_half_warp")
    m = Machine()
    args = [m.put(np.zeros(512, dtype=np.uint16)), m.put(np.zeros(32, dtype=np.uint32))]
    with pytest.raises(SyncFault, match="runs ldmatrix, thread 16 of its warp is at"):
        m.run_block(entry, args, threads=32, dynamic_shared=1024)


def _mma_fragments(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each lane's fragments of A (16 x 16, row), B (16 x 8, col) and C (16 x 8) by the ISA's table for
    mma.m16n8k16 (written out here): group g = lane / 4, pair p = 2 (lane % 4). A: a0 a1 row g, columns p,
    p + 1; a2 a3 row g + 8; a4..a7 the same 8 columns on. B: b0 b1 rows p, p + 1 of column g; b2 b3 rows
    p + 8, p + 9. C: c0 c1 row g, columns p, p + 1; c2 c3 row g + 8."""
    a16, b16 = a.astype(np.float16).view(np.uint16), b.astype(np.float16).view(np.uint16)
    fa, fb, fc = [], [], []
    for lane in range(32):
        g, p = lane // 4, 2 * (lane % 4)
        for r, k in ((g, p), (g + 8, p), (g, p + 8), (g + 8, p + 8)):
            fa.append(int(a16[r, k]) | int(a16[r, k + 1]) << 16)
        for k in (p, p + 8):
            fb.append(int(b16[k, g]) | int(b16[k + 1, g]) << 16)
        fc += [c[g, p], c[g, p + 1], c[g + 8, p], c[g + 8, p + 1]]
    return np.array(fa, dtype=np.uint32), np.array(fb, dtype=np.uint32), np.array(fc, dtype=np.float32)


def _mma_result(d: np.ndarray) -> np.ndarray:
    """D (16 x 8) from the lanes' d fragments (C's layout)."""
    out = np.zeros((16, 8), dtype=np.float32)
    for lane in range(32):
        g, p = lane // 4, 2 * (lane % 4)
        out[g, p], out[g, p + 1], out[g + 8, p], out[g + 8, p + 1] = d[4 * lane : 4 * lane + 4]
    return out


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_mma_is_the_exact_product_rounded_once(tmp_path: Path, arch: str) -> None:
    """mma.m16n8k16.row.col.f32.f16.f16.f32 on random halves: D is A B + C with each element's exact value
    (float64 holds it: the operands' bits span under 53) rounded once to float32; C large enough that the
    rounding matters. B read as row-major (the transposed layout), or D's lanes swapped, is not the result
    (the comparison can fail). Refused on a machine that is not `approximate`."""
    entry = _matrix_program(tmp_path, arch).entry("mma")
    rng = np.random.default_rng(8)
    for trial in range(4):
        a = rng.uniform(-4, 4, (16, 16)).astype(np.float16).astype(np.float64)
        b = rng.uniform(-4, 4, (16, 8)).astype(np.float16).astype(np.float64)
        c = (rng.uniform(-1, 1, (16, 8)) * 2.0 ** (trial * 3)).astype(np.float32).astype(np.float64)
        fa, fb, fc = _mma_fragments(a, b, c)
        m, d = Machine(approximate=True), np.zeros(128, dtype=np.float32)
        at_d = m.put(d)
        m.run_block(entry, [m.put(fa), m.put(fb), m.put(fc), at_d], threads=32)
        got = _mma_result(m.get(at_d, d))
        exact = np.array([[math.fsum([*(a[i] * b[:, j]), c[i, j]]) for j in range(8)] for i in range(16)])
        assert np.array_equal(got, exact.astype(np.float32)), trial
        assert not np.array_equal(got, (a @ b.reshape(8, 16).T + c).astype(np.float32))  # B row-major
        swapped = m.get(at_d, d).reshape(32, 4)[[1, 0, *range(2, 32)]].reshape(-1)
        assert not np.array_equal(_mma_result(swapped), got)
    exact_only = Machine()
    with pytest.raises(PtxUnsupported, match="approximate"):
        exact_only.run_block(entry, [exact_only.put(np.zeros(128, dtype=np.uint32))] * 4, threads=32)


def test_float_to_half_rounds_to_nearest_even(tmp_path: Path) -> None:
    """cvt.rn.f16.f32 against Python's IEEE half packing (struct 'e', nearest even from the exact value):
    ties, subnormals, the smallest subnormal's half, overflow to infinity; a NaN is refused."""
    entry = _matrix_program(tmp_path).entry("to_half")
    rng = random.Random(3)
    specials = [0.0, -0.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2.0**-25, 2.0**-25 * 1.5, -(2.0**-24),
                65504.0, 65519.0, 65520.0, -1.0e6, 2.0**-14 - 2.0**-25, 3.0e-8]  # fmt: skip
    xs = specials + [rng.uniform(-8, 8) * 2.0 ** rng.randint(-26, 14) for _ in range(32 - len(specials))]
    x = np.array(xs, dtype=np.float32)
    m = Machine()
    out = np.zeros(32, dtype=np.uint16)
    at = m.put(out)
    m.run_block(entry, [m.put(x), at], threads=32)
    want = []
    for v in x.tolist():
        try:
            want.append(struct.unpack("<H", struct.pack("<e", v))[0])
        except OverflowError:  # past the largest half by half an ulp or more: infinity
            want.append(0x7C00 | (0x8000 if v < 0 else 0))
    assert m.get(at, out).tolist() == want
    with pytest.raises(PtxUnsupported, match="NaN"):
        m.run_block(entry, [m.put(np.full(32, np.nan, dtype=np.float32)), at], threads=32)


def test_the_mma_models_rounding_is_one_rounding_of_the_exact_sum() -> None:
    """`mma_reference` (integer sums in units of 2^-149) against rationals rounded by `_round_f32`, over
    subnormal halves, sums C cancels to far below their terms, the top of float32's range, an infinite C; and
    an exact zero of zeros of both signs."""
    rng = np.random.default_rng(12)
    for trial in range(40):
        scale = 2.0 ** rng.integers(-24, 16)
        a = (rng.uniform(-2, 2, (2, 16)) * scale).astype(np.float16).astype(np.float64)
        b = rng.uniform(-2, 2, (16, 8)).astype(np.float16).astype(np.float64)
        c = np.float32(rng.uniform(-1, 1, (2, 8)) * 2.0 ** rng.integers(-140, 128)).astype(np.float64)
        if trial % 4 == 0:  # C cancels row 0's products up to float32's rounding of them: a tiny remainder
            c[0] = (-(a[0] @ b)).astype(np.float32)
        got = ptx_interp.mma_reference(a, b, c)
        for i in range(2):
            for j in range(8):
                exact = sum((Fraction(a[i, k]) * Fraction(b[k, j]) for k in range(16)), Fraction(c[i, j]))
                want = ptx_interp._round_f32(exact, "rn") if exact else got[i][j]
                assert got[i][j] == want, (trial, i, j)
    zeros = np.zeros((1, 16)), np.zeros((16, 8)), np.full((1, 8), -0.0)
    assert ptx_interp.mma_reference(*zeros)[0] == [0] * 8  # +0 products and a -0 C: +0
    assert ptx_interp.mma_reference(-zeros[0], zeros[1], zeros[2])[0] == [0x80000000] * 8  # every term -0: -0
    top = float(np.finfo(np.float32).max)  # products of halves stay far below its half ulp: no overflow
    big = np.full((1, 16), 60000.0), np.full((16, 8), 60000.0), np.full((1, 8), top)
    assert ptx_interp.mma_reference(*big)[0] == [0x7F7FFFFF] * 8
    assert ptx_interp.mma_reference(*big[:2], np.full((1, 8), math.inf))[0] == [0x7F800000] * 8
