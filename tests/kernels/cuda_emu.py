"""A kernel's own CUDA source built for the CPU, so its indexing and plan use are checked before a GPU run.

`build_emulated(source, out_dir, launches=...)` compiles a `.cu` file with g++ against small headers that
emulate what our kernels use of CUDA: the blocks of a grid one after another, the threads of a block as
fibers on the calling thread (a barrier switches fibers with a few x86-64 instructions: an OS thread per CUDA
thread and futex waits at every barrier cost a 2-core machine more time than the emulated kernel itself),
__syncthreads as a block barrier, warp shuffles and ldmatrix through a per-warp buffer and barrier,
__shared__ as statics, the IEEE round-to-nearest intrinsics as plain float operations, fp16 as _Float16 and
bf16 by round-to-nearest-even (both as on the GPU). Every `<<<...>>>` launch becomes a call of an emulated
launch, which runs every block, or only the blocks chosen with `emu_set_blocks` (for a grid of more than one
row of blocks). exp and log are the CPU's, so the numbers are not the GPU's bits; tests compare with float64
references and check bitwise row invariance of the kernel's own code.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from elpis import nvcc
from elpis.paths import BUILD_DIR

EMU_RUNTIME = r"""
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float2 { float x, y; };
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef void* cudaStream_t;
inline cudaError_t cudaGetLastError() { return 0; }
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
static int emu_sms = 1;  // the emulated GPU's multiprocessors (emu_set_sms)
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return 0; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = emu_sms; return 0; }
template <typename K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, size_t) { return 0; }
// One block of any kernel per emulated multiprocessor.
template <typename K>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, K, int, size_t) { *n = 1; return 0; }
#define ELPIS_CUDA_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
// A fiber switch (System V x86-64): push the callee-saved registers and the float control words, keep the
// stack pointer in *from, take `to`'s, pop its saved state and return where it left off (a new fiber: its
// entry). The symbol is local to each emulated build.
#if !defined(__x86_64__)
#error "the CUDA emulation's fibers switch with x86-64 code"
#endif
extern "C" void emu_switch(void** from, void* to);
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
// Emulation state is static, not inline: g++ gives inline variables process-wide (GNU unique) binding, so
// two emulated kernels loaded into one test process would share one block selection and one barrier.
// One CUDA thread: a fiber with its index and its exchange phases (see below), run by emu_run_block.
struct emu_thread {
    void* stack_pointer;
    dim3 index;
    unsigned shfl_phase = 0, mma_phase = 0, ldsm_phase = 0;
    bool done = false;
};
static emu_thread* emu_current;
static void* emu_scheduler;
static const std::function<void()>* emu_body;
#define threadIdx (emu_current->index)
#define emu_shfl_phase (emu_current->shfl_phase)
#define emu_mma_phase (emu_current->mma_phase)
#define emu_ldsm_phase (emu_current->ldsm_phase)
inline void emu_yield() { emu_switch(&emu_current->stack_pointer, emu_scheduler); }
// A reusable barrier of `count` fibers: the last to arrive opens the generation and runs on; the others yield
// until it is open.
struct emu_barrier {
    unsigned count, arrived = 0, generation = 0;
    explicit emu_barrier(unsigned n) : count(n) {}
    void arrive_and_wait() {
        const unsigned waiting_for = generation;
        if (++arrived == count) {
            arrived = 0;
            generation++;
            return;
        }
        while (generation == waiting_for) emu_yield();
    }
};
// A fiber's first frame: run the kernel, then hand back to the scheduler for good.
static void emu_thread_main() {
    (*emu_body)();
    emu_current->done = true;
    emu_yield();
    __builtin_unreachable();
}
// A new fiber's stack, top down: its entry as the return address (16-byte aligned, as after a call), then the
// six registers and the caller's float control words that emu_switch pops.
inline void* emu_fiber_stack(char* base, size_t bytes) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t(15);
    uint64_t* top = reinterpret_cast<uint64_t*>(end - 16);
    top[0] = reinterpret_cast<uint64_t>(&emu_thread_main);
    uint64_t* sp = top - 7;
    for (int r = 1; r < 7; r++) sp[r] = 0;
    uint32_t words[2] = {0, 0};
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(words[0]), "=m"(words[1]));
    std::memcpy(sp, words, 8);
    return sp;
}
static dim3 blockIdx, blockDim, gridDim;
static emu_barrier* emu_block_barrier;
static emu_barrier* emu_warp_barrier[32];
// Warp exchanges (shuffle, mma, ldmatrix) cost one warp barrier each: every kind of exchange alternates
// between two buffers (a per-lane phase; the lanes of a warp make the same exchanges in the same order). A
// lane writes buffer p of its next exchange of a kind only after passing the barrier of that kind's previous
// exchange, which every lane reaches after reading buffer p of the exchange before it.
static float emu_warp_buf[2][32][32];
static std::vector<std::pair<unsigned, unsigned>> emu_blocks;  // (x, y) chosen by emu_set_blocks
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int m) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float (&buf)[32] = emu_warp_buf[emu_shfl_phase][warp];
    emu_shfl_phase ^= 1u;
    buf[lane] = v;
    emu_warp_barrier[warp]->arrive_and_wait();
    return buf[lane ^ m];
}
// __shfl_sync of a 32-bit word from lane `src` (same buffers and phase as the float shuffle).
inline unsigned emu_shfl_u32(unsigned v, unsigned src) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float (&buf)[32] = emu_warp_buf[emu_shfl_phase][warp];
    emu_shfl_phase ^= 1u;
    std::memcpy(&buf[lane], &v, 4);
    emu_warp_barrier[warp]->arrive_and_wait();
    unsigned r;
    std::memcpy(&r, &buf[src & 31u], 4);
    return r;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
// A deliberately non-monotone exp for kernels that must not rest on exp's monotonicity (a build names it
// through a define): the CPU's exp, times (1 + 2^-40) for about half the arguments, picked by a hash of their
// bits (tests/kernels/test_vocab_draw_emu.py restates it on the host).
inline double emu_exp_bumped(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    const double e = std::exp(d);
    return ((bits * 0x9E3779B97F4A7C15ull) >> 63) ? e * (1.0 + 0x1p-40) : e;
}
// Atomics: fibers switch only at barriers, so a plain read-modify-write is atomic here.
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    const unsigned long long old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline uint4 __ldg(const uint4* p) { return *p; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
// 1 MiB a fiber's stack, from one arena kept across blocks and launches (malloc maps it lazily; pages are
// touched only as used, and once: a fresh mapping per block faulted its pages in again for every block).
constexpr size_t emu_stack_bytes = size_t(1) << 20;
inline char* emu_stacks(unsigned threads) {
    static std::unique_ptr<char, decltype(&std::free)> arena(nullptr, &std::free);
    static unsigned held = 0;
    if (threads > held) {
        arena.reset(static_cast<char*>(std::malloc(emu_stack_bytes * threads)));
        held = threads;
    }
    return arena.get();
}
template <typename K, typename... A>
void emu_run_block(dim3 index, dim3 block, K kernel, A... args) {
    blockIdx = index;
    emu_barrier block_barrier(block.x);
    std::vector<std::unique_ptr<emu_barrier>> warps;
    for (unsigned w = 0; w < (block.x + 31) / 32; w++)
        emu_warp_barrier[w] = warps.emplace_back(new emu_barrier(32)).get();
    emu_block_barrier = &block_barrier;
    const std::function<void()> body = [=] { kernel(args...); };
    emu_body = &body;
    char* stacks = emu_stacks(block.x);
    std::vector<emu_thread> threads(block.x);
    for (unsigned t = 0; t < block.x; t++) {
        threads[t].index = dim3(t);
        threads[t].stack_pointer = emu_fiber_stack(stacks + emu_stack_bytes * t, emu_stack_bytes);
    }
    // Round robin until every fiber has returned: a fiber runs until it waits at a barrier or ends.
    for (unsigned running = block.x; running > 0;) {
        running = 0;
        for (emu_thread& thread : threads) {
            if (thread.done) continue;
            emu_current = &thread;
            emu_switch(&emu_scheduler, thread.stack_pointer);
            running += thread.done ? 0 : 1;
        }
    }
}
template <typename K, typename... A>
void emu_launch(K kernel, dim3 grid, dim3 block, int, void*, A... args) {
    blockDim = block;
    gridDim = grid;
    if (grid.y > 1 && !emu_blocks.empty()) {
        for (auto [x, y] : emu_blocks) emu_run_block(dim3(x, y, 0), block, kernel, args...);
        return;
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) emu_run_block(dim3(x, y, z), block, kernel, args...);
}
extern "C" void emu_set_sms(int n) { emu_sms = n; }
extern "C" void emu_set_blocks(int n, const int* xy) {
    emu_blocks.clear();
    for (int i = 0; i < n; i++) emu_blocks.push_back({unsigned(xy[2 * i]), unsigned(xy[2 * i + 1])});
}
"""

EMU_FP16 = r"""
#pragma once
#include <cstdint>
#include "cuda_runtime.h"
struct __half { _Float16 v; };
struct __half2 { __half x, y; };
inline float __half2float(__half h) { return float(h.v); }
inline __half __float2half_rn(float f) { return __half{_Float16(f)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x.v), float(h.y.v)}; }
inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
// fp16 pair arithmetic: each value computed in float and rounded once to fp16 (exp and the reciprocal are the
// CPU's, not the GPU's approximations: tests compare the kernel's own paths with each other)
inline __half2 emu_h2(__half2 a, float (*f)(float)) {
    return __half2{__half{_Float16(f(float(a.x.v)))}, __half{_Float16(f(float(a.y.v)))}};
}
inline __half2 __hneg2(__half2 a) { return emu_h2(a, [](float v) { return -v; }); }
inline __half2 h2exp(__half2 a) { return emu_h2(a, [](float v) { return std::exp(v); }); }
inline __half2 h2rcp(__half2 a) { return emu_h2(a, [](float v) { return 1.0f / v; }); }
inline __half emu_h(float v) { return __half{_Float16(v)}; }
inline __half2 __hadd2(__half2 a, __half2 b) {
    return __half2{emu_h(float(a.x.v) + float(b.x.v)), emu_h(float(a.y.v) + float(b.y.v))};
}
inline __half2 __hmul2(__half2 a, __half2 b) {
    return __half2{emu_h(float(a.x.v) * float(b.x.v)), emu_h(float(a.y.v) * float(b.y.v))};
}
inline __half2 __float2half2_rn(float f) { return __half2{__float2half_rn(f), __float2half_rn(f)}; }
inline __half __low2half(__half2 a) { return a.x; }
inline __half __high2half(__half2 a) { return a.y; }
// mma.sync m16n8k16 (fp16 A row-major, B column-major, fp32 C/D) for one warp: every lane posts its
// fragments (PTX layout, g = lane / 4, t = lane % 4), then computes its four outputs as C + sum over k in
// order, in fp32 (not the tensor cores' bits: the tests check indexing and invariance, not GPU numbers).
static float emu_mma_a[2][32][16][16], emu_mma_b[2][32][16][8];  // [phase][warp]: see the runtime header
inline void emu_mma_half_pair(uint32_t pair, float& lo, float& hi) {
    __half h[2];
    std::memcpy(h, &pair, 4);
    lo = float(h[0].v);
    hi = float(h[1].v);
}
inline void emu_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    float (&A)[16][16] = emu_mma_a[emu_mma_phase][warp];
    float (&B)[16][8] = emu_mma_b[emu_mma_phase][warp];
    emu_mma_phase ^= 1u;
    emu_mma_half_pair(a[0], A[g][2 * t], A[g][2 * t + 1]);
    emu_mma_half_pair(a[1], A[g + 8][2 * t], A[g + 8][2 * t + 1]);
    emu_mma_half_pair(a[2], A[g][2 * t + 8], A[g][2 * t + 9]);
    emu_mma_half_pair(a[3], A[g + 8][2 * t + 8], A[g + 8][2 * t + 9]);
    emu_mma_half_pair(b0, B[2 * t][g], B[2 * t + 1][g]);
    emu_mma_half_pair(b1, B[2 * t + 8][g], B[2 * t + 9][g]);
    emu_warp_barrier[warp]->arrive_and_wait();
    for (int e = 0; e < 4; e++) {
        const int m = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; k++) acc = acc + A[m][k] * B[k][n];
        d[e] = acc;
    }
}
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 for one warp: lane 8i+k posts the address of row k of
// matrix i; register i of lane l gets (row l/4, cols 2(l%4), +1) of matrix i, or with trans (rows 2(l%4), +1,
// col l/4), low half first.
static const uint16_t* emu_ldsm_row[2][32][32];  // [phase][warp][lane]
inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint16_t** rows = emu_ldsm_row[emu_ldsm_phase][warp];
    emu_ldsm_phase ^= 1u;
    rows[lane] = static_cast<const uint16_t*>(row);
    emu_warp_barrier[warp]->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        const uint16_t* const* m = rows + 8 * i;
        const uint32_t lo = trans ? m[2 * t][g] : m[g][2 * t], hi = trans ? m[2 * t + 1][g] : m[g][2 * t + 1];
        r[i] = lo | (hi << 16);
    }
}
"""

EMU_BF16 = r"""
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { uint16_t x; };
inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = uint32_t(b.x) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) { r.x = 0x7fc0; return r; }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.x = uint16_t(u >> 16);
    return r;
}
"""

HEADERS = {"cuda_runtime.h": EMU_RUNTIME, "cuda_fp16.h": EMU_FP16, "cuda_bf16.h": EMU_BF16}
LAUNCH = re.compile(r"(\w+(?:<[\w, ]*>)?)<<<(.*?)>>>\((.*?)\);", re.S)  # a kernel, or a template instance
# No contraction into fma: the kernels' own arithmetic, one rounding per operation as written.
CXXFLAGS = ("-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC")


def gxx() -> str:
    """The host C++ compiler, or a skip when there is none."""
    found = shutil.which("g++")
    if found is None:
        pytest.skip("g++ not installed")
    return found


def emulated_source(source: Path, launches: int) -> str:
    """`source` with each of its `launches` kernel launches turned into an emulated launch."""
    text, found = LAUNCH.subn(r"emu_launch(\1, \2, \3);", Path(source).read_text())
    assert found == launches, f"{source}: {found} launches, expected {launches}"
    return text


def build_emulated(
    source: Path,
    out_dir: Path,
    *,
    launches: int,
    needs: Sequence[str] = (),
    defines: Mapping[str, int | str] | None = None,
) -> ctypes.CDLL:
    """Build `source` (a .cu file with `launches` launches) for the CPU into `out_dir` and load it. `needs`
    names the generated headers (build/kernels/) it includes; the include path is the CUDA build's."""
    for name in needs:
        if not (BUILD_DIR / "kernels" / name).is_file():
            pytest.fail(f"{BUILD_DIR / 'kernels' / name} missing: run make build")
    compiler = gxx()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in HEADERS.items():
        (out_dir / name).write_text(text)
    flags = "".join(f"_{k}{v}" for k, v in (defines or {}).items())
    unit = out_dir / f"{Path(source).stem}_emu{flags}.cpp"
    unit.write_text(emulated_source(source, launches))
    lib_path = unit.with_name(f"lib{unit.stem}.so")
    done = subprocess.run(
        [compiler, *CXXFLAGS, f"-I{out_dir}", *[f"-I{d}" for d in nvcc.INCLUDE_DIRS],
         *[f"-D{k}={v}" for k, v in (defines or {}).items()], str(unit), "-o", str(lib_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(lib_path))


def build_span_kernels(
    tmp_path_factory: pytest.TempPathFactory,
    binding: Any,
    prefix: str,
    *,
    launches: int,
    threads: int,
    span_vectors: int = 1024,
    max_spans: int = 64,
) -> ctypes.CDLL:
    """An emulated build of the kernel file of `binding` (its SOURCE and bind: elpis.exl3.draft_candidates,
    elpis.exl3.verify_epilogue, whose kernels read logit rows in spans, row_scan.cuh), bound, with its block
    (`prefix`_THREADS), its span in 16-byte vectors (`prefix`_SPAN_VECTORS) and its most spans a row
    (`prefix`_MAX_SPANS); the served build's are 256, 1024 and 64."""
    source = Path(binding.SOURCE)
    out = tmp_path_factory.mktemp(f"{source.stem}_{threads}_{span_vectors}_{max_spans}")
    names = ("THREADS", "SPAN_VECTORS", "MAX_SPANS")
    defines = {f"{prefix}_{n}": v for n, v in zip(names, (threads, span_vectors, max_spans), strict=True)}
    needs = ("row_spans.h", "row_scan_schedule.h")
    built = build_emulated(source, out, launches=launches, needs=needs, defines=defines)
    return binding.bind(built, threads=threads)
