// Shared by the tree-verify attention kernels (tree_attention.cu: fp32 SIMT, the exact reference build;
// tree_attention_mma.cu: tensor cores): the geometry, the in-register dequantisation of ExLlamaV3's
// quantized cache (CacheLayer_quant, compand_a 0), the fixed-order combine of split partials, and the
// exported workspace arithmetic. Each .cu includes it once into its own library.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "verify_schedule.h"

// A kernel's dynamic shared memory of `bytes` (under the CUDA emulation, a static buffer of that size).
#ifdef ELPIS_CUDA_EMU
#define ELPIS_DYNAMIC_SMEM(name, bytes) alignas(16) static uint8_t name[bytes]
#else
#define ELPIS_DYNAMIC_SMEM(name, bytes) extern __shared__ __align__(16) uint8_t name[]
#endif

// Bits per K and V value of the quantized-cache builds (2..8); the served cache is 3/3.
#ifndef ELPIS_QCACHE_K_BITS
#define ELPIS_QCACHE_K_BITS 3
#endif
#ifndef ELPIS_QCACHE_V_BITS
#define ELPIS_QCACHE_V_BITS 3
#endif

namespace {

constexpr uint32_t kHeadDim = 256;
constexpr uint32_t kQHeads = 24;
constexpr uint32_t kKvHeads = 4;
constexpr uint32_t kGroup = kQHeads / kKvHeads;  // query heads per K/V head
constexpr uint32_t kPage = 256;                  // cache positions per page
constexpr uint32_t kSplit = ELPIS_SCHED_SPLIT_SIZE;  // the longest split
// Rows a call serves: the schedule's 16, or fewer in a build that trades them for registers (ELPIS_BUILD_MAX_ROWS,
// tree_attention_mma.cu's 8-row build). A row's arithmetic does not depend on it.
#ifdef ELPIS_BUILD_MAX_ROWS
constexpr uint32_t kMaxRows = ELPIS_BUILD_MAX_ROWS;
static_assert(kMaxRows >= 1 && kMaxRows <= ELPIS_SCHED_MAX_ROWS, "a build serves at most the schedule's rows");
#else
constexpr uint32_t kMaxRows = ELPIS_SCHED_MAX_ROWS;
#endif
constexpr uint32_t kFull = 0xffffffffu;
constexpr uint32_t kMaxGridY = 65535;  // splits per call (elpis/exl3/tree_attention.py: MAX_SPAN)

// The opt-in a kernel needs to launch with more than 48 KB of dynamic shared memory, once per process (`done`:
// the caller's flag for that kernel); 0 or a cudaError_t.
template <typename Kernel>
int allow_dynamic_smem(Kernel kernel, size_t bytes, bool& done) {
    if (done) return 0;
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return static_cast<int>(err);
    done = true;
    return 0;
}

// --- the quantized cache: packed words [pages, 256, 32 * bits] (uint32), fp16 scales [pages, 256, 32] ---
constexpr uint32_t kQGroup = 32;                                      // values per quantization group
constexpr uint32_t kQGroupsPerToken = kKvHeads * kHeadDim / kQGroup;  // 32
constexpr uint32_t kQGroupsPerHead = kHeadDim / kQGroup;              // 8
constexpr float kRsqrt32 = 0.17677669529663688110f;                   // fp32(1/sqrt(32))

// Code of value j of a group: bit planes of power-of-two widths, widest (most significant) first, each
// plane `width` words with value j's field at plane bit j*width (a field never straddles a word). A plane
// starts after the wider planes (kBits & ~(2*width-1) words) and sits above the narrower ones' bits.
template <uint32_t kBits>
__device__ __forceinline__ uint32_t group_code(const uint32_t (&w)[kBits], uint32_t j) {
    uint32_t code = 0;
#pragma unroll
    for (uint32_t width = 1; width <= 8; width <<= 1) {
        if (!(kBits & width)) continue;
        const uint32_t base = kBits & ~(2u * width - 1u), bit = j * width;
        const uint32_t field = (w[base + (bit >> 5)] >> (bit & 31u)) & ((1u << width) - 1u);
        code |= field << (kBits & (width - 1u));
    }
    return code;
}

// Dequantisation step of a group: scale * fp32(1/sqrt(32)) / 2^(bits-1), each product rounded once.
template <uint32_t kBits>
__device__ __forceinline__ float group_step(__half scale) {
    static_assert(kBits >= 2 && kBits <= 8, "quantized cache bits are 2..8");
    constexpr float kHalfLevels = static_cast<float>(1u << (kBits - 1));
    return __fmul_rn(__fmul_rn(__half2float(scale), kRsqrt32), 1.0f / kHalfLevels);
}

// The step without the Hadamard's normalisation: scale / 2^(bits-1), exact (a power-of-two multiple of an fp16).
// A kernel that folds the rotation into its operands (ELPIS_MMA_HADAMARD_FOLD) dequantises with it, and takes
// the 1/sqrt(32) on the query and on the output instead, so that every staged value keeps its magnitude.
template <uint32_t kBits>
__device__ __forceinline__ float group_raw_step(__half scale) {
    static_assert(kBits >= 2 && kBits <= 8, "quantized cache bits are 2..8");
    return __fmul_rn(__half2float(scale), 1.0f / static_cast<float>(1u << (kBits - 1)));
}

// Value of a code before the Hadamard: (code - mid) * step, mid = 2^(bits-1) - 0.5.
template <uint32_t kBits>
__device__ __forceinline__ float code_value(uint32_t code, float step) {
    constexpr float kMid = static_cast<float>(1u << (kBits - 1)) - 0.5f;
    return __fmul_rn(__fsub_rn(static_cast<float>(code), kMid), step);
}

// The unnormalised Hadamard's butterflies over index bits 0 .. log2(kN)-1 of v, in that order, each operation
// rounded once (explicit _rn intrinsics: never fused).
template <uint32_t kN>
__device__ __forceinline__ void hadamard_butterflies(float (&v)[kN]) {
#pragma unroll
    for (uint32_t b = 1; b < kN; b <<= 1) {
#pragma unroll
        for (uint32_t j = 0; j < kN; j++) {
            if (j & b) continue;
            const float lo = v[j], hi = v[j | b];
            v[j] = __fadd_rn(lo, hi);
            v[j | b] = __fsub_rn(lo, hi);
        }
    }
}

// One group of 32 values as fp16: code_value, then the unnormalised Hadamard as butterflies over index bits
// 0..4 in order, then fp16 (rn). Reproduces ExLlamaV3's dequant_cache_paged (elpis/exl3/qcache_ref.py is the
// reference, checked bit for bit against CacheLayer_quant.get_kv).
// With kRotated false, the group as stored, before the rotation: code_value with group_raw_step, then fp16.
template <uint32_t kBits, bool kRotated = true>
__device__ __forceinline__ void dequant_words(const uint32_t (&w)[kBits], __half scale, __half (&out)[kQGroup]) {
    const float step = kRotated ? group_step<kBits>(scale) : group_raw_step<kBits>(scale);
    float v[kQGroup];
#pragma unroll
    for (uint32_t j = 0; j < kQGroup; j++) v[j] = code_value<kBits>(group_code<kBits>(w, j), step);
    if (kRotated) hadamard_butterflies(v);
#pragma unroll
    for (uint32_t j = 0; j < kQGroup; j++) out[j] = __float2half_rn(v[j]);
}

// dequant_words of a group's packed words in memory.
template <uint32_t kBits, bool kRotated = true>
__device__ __forceinline__ void dequant_group(const uint32_t* __restrict__ words, __half scale,
                                              __half (&out)[kQGroup]) {
    uint32_t w[kBits];
#pragma unroll
    for (uint32_t i = 0; i < kBits; i++) w[i] = words[i];
    dequant_words<kBits, kRotated>(w, scale, out);
}

// Index of group g (0..7) of K/V head h at cache slot `slot` in the packed words / scales.
__device__ __forceinline__ size_t qcache_group(const int32_t* __restrict__ block_table, uint32_t slot, uint32_t h,
                                               uint32_t g) {
    const size_t token = static_cast<size_t>(block_table[slot / kPage]) * kPage + slot % kPage;
    return token * kQGroupsPerToken + h * kQGroupsPerHead + g;
}

// The committed context length of a call: a launch argument, or, for a launch captured in a CUDA graph,
// read from device memory when the kernel runs, so one captured launch serves every context its grid covers.
struct CtxArg {
    uint32_t value;
    const uint32_t* ptr;  // null: `value`
};

__device__ __forceinline__ uint32_t ctx_of(const CtxArg c) { return c.ptr != nullptr ? *c.ptr : c.value; }

constexpr uint32_t kCombineAhead = 8;  // split partials loaded ahead of their fold

// One block per (row, query head), kHeadDim threads: fold the row's splits in ascending order, normalise,
// write fp16 (and the log-sum-exp). `max_splits` is only the partial buffers' stride.
// With kRotateOut (a kernel that folds the cache's rotation into its operands, ELPIS_MMA_HADAMARD_FOLD), the
// partials hold the output before the rotation: each 32-value group of the folded output is rotated here, once,
// by the Hadamard's butterflies over index bits 0..4 in order (a group is one warp, its index the lane), then
// scaled by fp32(1/sqrt(32)). Each operation is rounded once, the same in every call, whatever the rows.
template <bool kRotateOut>
__global__ void __launch_bounds__(kHeadDim) tree_attention_combine(
    const uint32_t* __restrict__ depth, const CtxArg ctx_arg, uint32_t max_splits,
    const float* __restrict__ part_acc, const float* __restrict__ part_ml, __half* __restrict__ out,
    float* __restrict__ lse) {
    const uint32_t row = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const uint32_t ctx = ctx_of(ctx_arg);
    const uint32_t n = elpis_sched_splits(elpis_sched_span(ctx, depth[row]));
    const size_t base = (static_cast<size_t>(row) * kQHeads + head) * max_splits;
    float m = part_ml[base * 2], l = part_ml[base * 2 + 1], a = part_acc[base * kHeadDim + d];
    // The partials are loaded kCombineAhead splits at a time before they are folded one by one, so that a
    // long context's hundreds of splits do not each wait a full load latency; the folding order and
    // operations are those of a one-at-a-time loop.
    for (uint32_t s0 = 1; s0 < n; s0 += kCombineAhead) {
        float ms[kCombineAhead], ls[kCombineAhead], as[kCombineAhead];
#pragma unroll
        for (uint32_t j = 0; j < kCombineAhead; j++) {
            if (s0 + j >= n) break;
            ms[j] = part_ml[(base + s0 + j) * 2];
            ls[j] = part_ml[(base + s0 + j) * 2 + 1];
            as[j] = part_acc[(base + s0 + j) * kHeadDim + d];
        }
#pragma unroll
        for (uint32_t j = 0; j < kCombineAhead; j++) {
            if (s0 + j >= n) break;
            const float mn = fmaxf(m, ms[j]);
            const float keep = expf(m - mn), take = expf(ms[j] - mn);
            l = fmaf(l, keep, ls[j] * take);
            a = fmaf(a, keep, as[j] * take);
            m = mn;
        }
    }
    const size_t o = static_cast<size_t>(row) * kQHeads + head;
    float x = a / l;
    if (kRotateOut) {
        const uint32_t lane = d & 31u;
#pragma unroll
        for (uint32_t bit = 1; bit < kQGroup; bit <<= 1) {
            const float other = __shfl_xor_sync(kFull, x, bit);
            x = (lane & bit) ? __fsub_rn(other, x) : __fadd_rn(x, other);  // lo + hi, or lo - hi
        }
        x = __fmul_rn(x, kRsqrt32);
    }
    out[o * kHeadDim + d] = __float2half_rn(x);
    if (lse != nullptr && d == 0) lse[o] = m + logf(l);
}

}  // namespace

extern "C" {

// Splits of the longest span of a call (the partial buffers' middle dimension).
uint32_t elpis_tree_attention_max_splits(uint32_t ctx, uint32_t max_depth) {
    return elpis_sched_splits(elpis_sched_span(ctx, max_depth));
}

// Floats of workspace a call needs: partial acc [rows, 24, splits, 256] and (max, sum) [rows, 24, splits, 2].
uint64_t elpis_tree_attention_workspace_floats(uint32_t rows, uint32_t ctx, uint32_t max_depth) {
    const uint64_t parts = static_cast<uint64_t>(rows) * kQHeads * elpis_tree_attention_max_splits(ctx, max_depth);
    return parts * (kHeadDim + 2);
}

}  // extern "C"
