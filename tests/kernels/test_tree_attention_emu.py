"""The tree-verify attention kernel's own source, run on the CPU before any GPU run.

patches/kernels/tree_attention.cu is compiled by g++ against small headers that emulate what it uses of
CUDA: every block of the grid in turn, one std::thread per CUDA thread, __syncthreads as a block barrier,
warp shuffles through a per-warp buffer and barrier, __shared__ as statics, fp16 as _Float16 (IEEE
round-to-nearest-even, as on the GPU). The `<<<...>>>` launches become calls of an emulated launch. exp and
log are the CPU's, so the numbers are not the GPU's bits; what this checks is the kernel's indexing, its
use of the generated schedule, its agreement with float64, and bitwise row invariance of its own code.
"""

from __future__ import annotations

import ctypes
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from elpis.paths import BUILD_DIR
from tests.kernels import tree_cases as tc

EMU_RUNTIME = r"""
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef void* cudaStream_t;
inline cudaError_t cudaGetLastError() { return 0; }
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
inline thread_local dim3 threadIdx;
inline dim3 blockIdx, blockDim;
inline std::barrier<>* emu_block_barrier;
inline std::barrier<>* emu_warp_barrier[32];
inline float emu_warp_buf[32][32];
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int m) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu_warp_buf[warp][lane] = v;
    emu_warp_barrier[warp]->arrive_and_wait();
    const float r = emu_warp_buf[warp][lane ^ m];
    emu_warp_barrier[warp]->arrive_and_wait();
    return r;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline uint4 __ldg(const uint4* p) { return *p; }
template <typename K, typename... A>
void emu_launch(K kernel, dim3 grid, unsigned threads_per_block, int, void*, A... args) {
    blockDim = dim3(threads_per_block);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                std::barrier<> block_barrier(threads_per_block);
                std::vector<std::barrier<>*> warps;
                for (unsigned w = 0; w < (threads_per_block + 31) / 32; w++)
                    emu_warp_barrier[w] = warps.emplace_back(new std::barrier<>(32));
                emu_block_barrier = &block_barrier;
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads_per_block; t++)
                    pool.emplace_back([=] { threadIdx = dim3(t); kernel(args...); });
                for (auto& t : pool) t.join();
                for (auto* w : warps) delete w;
            }
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
"""


def _build(tmp: Path, staged: int) -> ctypes.CDLL:
    header = BUILD_DIR / "kernels" / "verify_schedule.h"
    if not header.is_file():
        pytest.fail(f"{header} missing: run make build")
    (tmp / "cuda_runtime.h").write_text(EMU_RUNTIME)
    (tmp / "cuda_fp16.h").write_text(EMU_FP16)
    source, launches = re.subn(
        r"(\w+)<<<(.*?)>>>\((.*?)\);", r"emu_launch(\1, \2, \3);", ta.SOURCE.read_text(), flags=re.S
    )
    assert launches == 2
    (tmp / "tree_attention_emu.cpp").write_text(source)
    lib_path = tmp / f"libtree_attention_emu{staged}.so"
    done = subprocess.run(
        [shutil.which("g++") or "g++", "-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC",
         "-pthread", f"-I{tmp}", f"-I{header.parent}", f"-DELPIS_TREE_ATTN_STAGED={staged}",
         str(tmp / "tree_attention_emu.cpp"), "-o", str(lib_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(lib_path))
    u32, u64, vp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    lib.elpis_tree_attention.argtypes = [
        vp,
        vp,
        vp,
        vp,
        vp,
        vp,
        u32,
        u32,
        u32,
        ctypes.c_float,
        vp,
        vp,
        vp,
        u64,
        vp,
    ]
    lib.elpis_tree_attention.restype = ctypes.c_int
    lib.elpis_tree_attention_workspace_floats.argtypes = [u32, u32, u32]
    lib.elpis_tree_attention_workspace_floats.restype = u64
    return lib


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> dict[int, ctypes.CDLL]:
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    tmp = tmp_path_factory.mktemp("tree_attention_emu")
    return {staged: _build(tmp, staged) for staged in (1, 0)}


def _attend(lib: ctypes.CDLL):
    def attend(q, k, v, table, ctx, depth, ancestors):
        ta.check_masks(depth, ancestors)
        rows = len(depth)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        table = table.to(torch.int32).contiguous()
        dep = torch.tensor(depth, dtype=torch.int32)
        anc = torch.tensor(ancestors, dtype=torch.int32)
        floats = lib.elpis_tree_attention_workspace_floats(rows, ctx, max(depth))
        work = torch.full((floats,), float("nan"), dtype=torch.float32)
        out = torch.full((rows, ta.Q_HEADS, ta.HEAD_DIM), float("nan"), dtype=torch.half)
        lse = torch.full((rows, ta.Q_HEADS), float("nan"), dtype=torch.float32)
        err = lib.elpis_tree_attention(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), table.data_ptr(), dep.data_ptr(), anc.data_ptr(),
            rows, ctx, max(depth), ta.DEFAULT_SCALE, out.data_ptr(), lse.data_ptr(), work.data_ptr(), floats,
            None,
        )  # fmt: skip
        assert err == 0
        return out, lse

    return attend


def _check_against_float64(emulated: dict[int, ctypes.CDLL], ctx: int, parents: list[int]) -> None:
    case = tc.make_case(ctx, parents, seed=ctx + 3)
    want, want_lse = ref.reference_fp64(
        case.q, case.k, case.v, case.table, ctx, case.ancestors, ta.DEFAULT_SCALE
    )
    outs = {}
    for staged, lib in emulated.items():
        out, lse = case.run(_attend(lib))
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        assert (out.double() - want).abs().max().item() < 2e-3
        assert (lse.double() - want_lse).abs().max().item() < 1e-5
        outs[staged] = (out, lse)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), "staged != direct"


def test_kernel_source_matches_float64(emulated: dict[int, ctypes.CDLL]) -> None:
    """Both builds (staged and direct) agree with float64 and with each other bit for bit; a tree past the
    first page of the block table (shuffled pages), spans of 38..41 positions (two 32-position tiles)."""
    _check_against_float64(emulated, 37, [-1, 0, 1, 0, 3])


@pytest.mark.slow
def test_kernel_source_across_a_split_boundary(emulated: dict[int, ctypes.CDLL]) -> None:
    """Spans of 511..513: rows whose last positions fall in the second split (about a minute here: every
    emulated shuffle is two thread barriers)."""
    _check_against_float64(emulated, 510, [-1, 0, 1, 0])


@pytest.mark.slow
def test_kernel_source_is_row_invariant(emulated: dict[int, ctypes.CDLL]) -> None:
    """Renumbered rows, rewritten siblings, the path in another tree, and every row against a 1-row call at
    ctx+depth, bit for bit (spans of 6..8 positions; the GPU tests cover split boundaries)."""
    attend = _attend(emulated[1])
    ctx, rng = 5, random.Random(4)
    case = tc.make_case(ctx, [-1, 0, 1, 0], seed=9)
    tc.check_relabel_rows(attend, case, rng)
    tc.check_siblings_do_not_matter(attend, case, seed=9)
    tc.check_other_tree_same_path(attend, case, rng, seed=9)
    tc.check_equals_plain_decoding(attend, case)
