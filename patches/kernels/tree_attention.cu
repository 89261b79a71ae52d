// Tree-verify attention with an ancestor mask, row-invariant by construction (issue 8, items 2 and 6).
//
// Geometry (Qwen3.8-27B full-attention layers): 24 query heads, 4 K/V heads (GQA groups of 6), head
// dim 256; paged fp16 caches [pages, 256, 4, 256] addressed through a block table; up to 16 tree rows.
// Row r (depth d(r), ancestor bitmask a(r) from tree_masks) attends to the absolute positions
// 0 .. ctx+d(r): committed positions p < ctx from cache slot p, position ctx+e from slot ctx + (row of
// its ancestor at depth e), where the engine wrote each tree row's K/V by row index.
//
// Which positions each block reduces, and how tree rows map to slots, is the proved schedule compiled
// from bend/verify_schedule.bend (build/kernels/verify_schedule.h): splits at boundaries fixed by
// absolute position alone (128 positions below 4096, 256 below 16384, 512 below 65536, 2048 beyond).
// Every number a row's output depends on is computed in an order fixed by absolute positions only:
//   * score(p)  = warp-wide dot product: lane l sums dims 8l..8l+7 serially with fmaf, then a fixed
//                 xor butterfly (16, 8, 4, 2, 1), times the scale;
//   * per split: max (exact), p = expf(score - max), sum and P.V serially in ascending position order;
//   * splits combined serially in ascending split order (fixed fmaf formula), fp32, then fp16 (rn).
// So a row's output is bit-identical to the same kernel run for that row alone at context ctx+d(r)
// (plain decoding), whatever the other rows, its row index or the tree's shape. Plain fp32 SIMT code,
// no fast math, no atomics, no data-dependent reduction order.
//
// ELPIS_TREE_ATTN_STAGED (default 1) stages K and V through shared memory, kTile positions at a time, with
// coalesced 16-byte loads; 0 reads them straight from global memory. The arithmetic and its order are the
// same in both builds, so they must agree bit for bit (a GPU test checks it).
//
// ELPIS_TREE_ATTN_QCACHE (default 0) builds the variant that reads ExLlamaV3's quantized paged cache
// (CacheLayer_quant, compand_a 0) instead of fp16 pages: packed words [pages, 256, 32 * bits] (uint32)
// and fp16 scales [pages, 256, 32] per K and V, bits ELPIS_QCACHE_K_BITS / ELPIS_QCACHE_V_BITS (2..8).
// Staging dequantises each 32-value group in registers into the same fp16 tile the fp16 build fills
// (our own code; the arithmetic and its order reproduce their dequant_cache_paged, see
// elpis/exl3/qcache_ref.py), and everything after staging is unchanged: its output is bit-identical to
// the fp16 build run on the pages `CacheLayer_quant.get_kv` returns, without the fp16 window.
#include "tree_attention_common.cuh"

#ifndef ELPIS_TREE_ATTN_STAGED
#define ELPIS_TREE_ATTN_STAGED 1
#endif
#ifndef ELPIS_TREE_ATTN_QCACHE
#define ELPIS_TREE_ATTN_QCACHE 0
#endif
#if ELPIS_TREE_ATTN_QCACHE
#if !ELPIS_TREE_ATTN_STAGED
#error "ELPIS_TREE_ATTN_QCACHE dequantises while staging: it needs ELPIS_TREE_ATTN_STAGED=1"
#endif
#endif

namespace {

constexpr uint32_t kThreads = 256;  // one thread per head dim in P.V and the combine
constexpr uint32_t kWarps = kThreads / 32;
#if ELPIS_TREE_ATTN_STAGED
constexpr uint32_t kTile = 32;              // positions staged through shared memory at a time
constexpr uint32_t kChunks = kHeadDim / 8;  // 16-byte chunks per position and head
#endif
static_assert(kThreads == kHeadDim, "P.V and the combine give each thread one head dim");
static_assert(kHeadDim == 32 * 8, "QK gives each lane 8 dims");
static_assert(kSplit % 32 == 0 && kSplit <= 2048, "split size must fit the shared score buffer");

// A split's scores and slots live in dynamic shared memory (56 KB at 2048-position splits, past the 48 KB a
// block may declare statically; with the 16 KB staging tile, 72 KB, within the 99 KB an RTX 3090 block gets).
constexpr size_t kProbBytes = size_t(kGroup) * kSplit * sizeof(float);
constexpr size_t kSplitSmemBytes = kProbBytes + size_t(kSplit) * sizeof(uint32_t);
static_assert(kSplitSmemBytes + 16u * 1024u + 64u <= 99u * 1024u, "an RTX 3090 block gets at most 99 KB");

#if ELPIS_TREE_ATTN_QCACHE
using CacheWord = uint32_t;  // packed codes; scales beside them
constexpr uint32_t kKBits = ELPIS_QCACHE_K_BITS;
constexpr uint32_t kVBits = ELPIS_QCACHE_V_BITS;
#else
using CacheWord = __half;  // fp16 pages; the scale pointers are unused (null)
[[maybe_unused]] constexpr uint32_t kKBits = 16;
[[maybe_unused]] constexpr uint32_t kVBits = 16;
#endif

#if !ELPIS_TREE_ATTN_QCACHE
// Offset (in halves) of position `slot`, K/V head `h`, dim 0 in a paged cache.
__device__ __forceinline__ size_t cache_offset(const int32_t* block_table, uint32_t slot, uint32_t h) {
    const size_t page = static_cast<size_t>(block_table[slot / kPage]);
    return ((page * kPage + slot % kPage) * kKvHeads + h) * kHeadDim;
}
#endif

__device__ __forceinline__ void unpack8(const uint4 raw, float out[8]) {
    const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(h2[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void load8(const __half* src, float out[8]) {
    unpack8(__ldg(reinterpret_cast<const uint4*>(src)), out);
}

#if ELPIS_TREE_ATTN_STAGED && !ELPIS_TREE_ATTN_QCACHE
// Copy head h's K (or V) rows of split positions t0 .. t0+cnt-1 into `tile` (coalesced 16-byte loads).
template <uint32_t kBits>
__device__ __forceinline__ void stage(uint4 (*tile)[kChunks], const __half* __restrict__ cache,
                                      const __half* __restrict__ /* scales: fp16 pages have none */,
                                      const int32_t* __restrict__ block_table, const uint32_t* slots,
                                      uint32_t t0, uint32_t cnt, uint32_t h) {
    for (uint32_t idx = threadIdx.x; idx < cnt * kChunks; idx += kThreads) {
        const uint32_t pos = idx / kChunks, chunk = idx % kChunks;
        const uint4* src = reinterpret_cast<const uint4*>(cache + cache_offset(block_table, slots[t0 + pos], h));
        tile[pos][chunk] = __ldg(src + chunk);
    }
}
#endif

#if ELPIS_TREE_ATTN_QCACHE
static_assert(kQGroupsPerHead * 4 == kChunks, "a group fills four 16-byte tile chunks");

// The quantized cache's staging: one thread per (position, group of head h), dequantised into the same
// tile layout the fp16 staging fills.
template <uint32_t kBits>
__device__ __forceinline__ void stage(uint4 (*tile)[kChunks], const uint32_t* __restrict__ packed,
                                      const __half* __restrict__ scales, const int32_t* __restrict__ block_table,
                                      const uint32_t* slots, uint32_t t0, uint32_t cnt, uint32_t h) {
    for (uint32_t idx = threadIdx.x; idx < cnt * kQGroupsPerHead; idx += kThreads) {
        const uint32_t pos = idx / kQGroupsPerHead, g = idx % kQGroupsPerHead;
        const size_t group = qcache_group(block_table, slots[t0 + pos], h, g);
        __align__(16) __half vals[kQGroup];
        dequant_group<kBits>(packed + group * kBits, scales[group], vals);
        const uint4* chunks = reinterpret_cast<const uint4*>(vals);
#pragma unroll
        for (uint32_t c = 0; c < 4; c++) tile[pos][g * 4 + c] = chunks[c];
    }
}
#endif

// Fixed-order warp sum: every lane ends with the same value (each butterfly level adds symmetric pairs).
__device__ __forceinline__ float warp_sum(float v) {
    v += __shfl_xor_sync(kFull, v, 16);
    v += __shfl_xor_sync(kFull, v, 8);
    v += __shfl_xor_sync(kFull, v, 4);
    v += __shfl_xor_sync(kFull, v, 2);
    v += __shfl_xor_sync(kFull, v, 1);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 16));
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 8));
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 4));
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 2));
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
    return v;
}

// One position's scores for the kGroup query heads: lane l's 8 dims serially, then the fixed butterfly.
__device__ __forceinline__ void score(const float (&qf)[kGroup][8], const float (&kf)[8], float scale,
                                      uint32_t lane, float (*prob)[kSplit], uint32_t i) {
#pragma unroll
    for (uint32_t j = 0; j < kGroup; j++) {
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < 8; d++) dot = fmaf(qf[j][d], kf[d], dot);
        dot = warp_sum(dot);
        if (lane == 0) prob[j][i] = dot * scale;
    }
}

// One block: row `blockIdx.x`, split `blockIdx.y`, K/V head `blockIdx.z` (its kGroup query heads). Rows
// vary fastest, so the blocks in flight together read the same split's pages (L2 reuse across rows).
// Writes the split's partial (max, sum, acc[256]) per query head.
// (`, 1`: without a resident-block bound, ptxas held the sm_86 build with dynamic shared memory to 64 registers
// and spilled.)
__global__ void __launch_bounds__(kThreads, 1) tree_attention_split(
    const __half* __restrict__ q, const CacheWord* __restrict__ k_cache, const __half* __restrict__ k_scales,
    const CacheWord* __restrict__ v_cache, const __half* __restrict__ v_scales, const int32_t* __restrict__ block_table, const uint32_t* __restrict__ depth,
    const uint32_t* __restrict__ ancestors, uint32_t ctx, float scale, uint32_t max_splits,
    float* __restrict__ part_acc, float* __restrict__ part_ml) {
    const uint32_t row = blockIdx.x, split = blockIdx.y, h = blockIdx.z;
    const uint32_t total = elpis_sched_span(ctx, depth[row]);
    if (split >= elpis_sched_splits(total)) return;  // this row's span has fewer splits
    const uint32_t begin = elpis_sched_split_begin(split);
    const uint32_t n = elpis_sched_split_end(total, split) - begin;
    const uint32_t mask = ancestors[row];

    ELPIS_DYNAMIC_SMEM(split_smem, kSplitSmemBytes);
    float (*prob)[kSplit] = reinterpret_cast<float (*)[kSplit]>(split_smem);
    uint32_t* slots = reinterpret_cast<uint32_t*>(split_smem + kProbBytes);
    __shared__ float head_max[kGroup];

    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (uint32_t i = threadIdx.x; i < n; i += kThreads) slots[i] = elpis_sched_slot(ctx, mask, begin + i);

    float qf[kGroup][8];
#pragma unroll
    for (uint32_t j = 0; j < kGroup; j++)
        load8(q + ((static_cast<size_t>(row) * kQHeads + h * kGroup + j) * kHeadDim + lane * 8u), qf[j]);
    __syncthreads();

    // Scores: one warp per position, the same lane/dim assignment for every position.
#if ELPIS_TREE_ATTN_STAGED
    __shared__ uint4 tile[kTile][kChunks];
    for (uint32_t t0 = 0; t0 < n; t0 += kTile) {
        const uint32_t cnt = min(kTile, n - t0);
        stage<kKBits>(tile, k_cache, k_scales, block_table, slots, t0, cnt, h);
        __syncthreads();
        for (uint32_t p = warp; p < cnt; p += kWarps) {
            float kf[8];
            unpack8(tile[p][lane], kf);
            score(qf, kf, scale, lane, prob, t0 + p);
        }
        __syncthreads();
    }
#else
    for (uint32_t i = warp; i < n; i += kWarps) {
        float kf[8];
        load8(k_cache + cache_offset(block_table, slots[i], h) + lane * 8u, kf);
        score(qf, kf, scale, lane, prob, i);
    }
    __syncthreads();
#endif

    // Max per query head (exact in any order).
    if (warp < kGroup) {
        float m = __int_as_float(0xff800000);  // -inf
        for (uint32_t i = lane; i < n; i += 32) m = fmaxf(m, prob[warp][i]);
        m = warp_max(m);
        if (lane == 0) head_max[warp] = m;
    }
    __syncthreads();
    for (uint32_t idx = threadIdx.x; idx < kGroup * n; idx += kThreads) {
        const uint32_t j = idx / n, i = idx % n;
        prob[j][i] = expf(prob[j][i] - head_max[j]);
    }
    __syncthreads();

    // P.V and the sum: thread d owns dim d; positions in ascending order.
    const uint32_t d = threadIdx.x;
    float acc[kGroup], sum[kGroup];
#pragma unroll
    for (uint32_t j = 0; j < kGroup; j++) acc[j] = sum[j] = 0.0f;
#if ELPIS_TREE_ATTN_STAGED
    const __half* vt = reinterpret_cast<const __half*>(&tile[0][0]);
    for (uint32_t t0 = 0; t0 < n; t0 += kTile) {
        const uint32_t cnt = min(kTile, n - t0);
        stage<kVBits>(tile, v_cache, v_scales, block_table, slots, t0, cnt, h);
        __syncthreads();
        for (uint32_t i = 0; i < cnt; i++) {
            const float v = __half2float(vt[i * kHeadDim + d]);
#pragma unroll
            for (uint32_t j = 0; j < kGroup; j++) {
                const float p = prob[j][t0 + i];
                acc[j] = fmaf(p, v, acc[j]);
                sum[j] = sum[j] + p;
            }
        }
        __syncthreads();
    }
#else
#pragma unroll 4
    for (uint32_t i = 0; i < n; i++) {
        const float v = __half2float(v_cache[cache_offset(block_table, slots[i], h) + d]);
#pragma unroll
        for (uint32_t j = 0; j < kGroup; j++) {
            const float p = prob[j][i];
            acc[j] = fmaf(p, v, acc[j]);
            sum[j] = sum[j] + p;
        }
    }
#endif
#pragma unroll
    for (uint32_t j = 0; j < kGroup; j++) {
        const size_t part = (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * max_splits + split;
        part_acc[part * kHeadDim + d] = acc[j];
        if (d == 0) {
            part_ml[part * 2] = head_max[j];
            part_ml[part * 2 + 1] = sum[j];
        }
    }
}

}  // namespace

extern "C" {

// Validates the call's size limits and launches the split and combine kernels; 0 or a cudaError_t.
static int launch(const void* q, const void* k_cache, const void* k_scales, const void* v_cache, const void* v_scales,
           const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors, uint32_t rows, uint32_t ctx,
           uint32_t max_depth, float scale, void* out, float* lse, float* workspace, uint64_t workspace_floats,
           void* stream) {
    if (rows == 0 || rows > kMaxRows || max_depth >= kMaxRows) return static_cast<int>(cudaErrorInvalidValue);
    if (workspace_floats < elpis_tree_attention_workspace_floats(rows, ctx, max_depth))
        return static_cast<int>(cudaErrorInvalidValue);
    const uint32_t max_splits = elpis_tree_attention_max_splits(ctx, max_depth);
    if (max_splits > kMaxGridY) return static_cast<int>(cudaErrorInvalidValue);
    float* part_acc = workspace;
    float* part_ml = workspace + static_cast<uint64_t>(rows) * kQHeads * max_splits * kHeadDim;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    static bool smem_set = false;
    if (const int err = allow_dynamic_smem(tree_attention_split, kSplitSmemBytes, smem_set)) return err;
    tree_attention_split<<<dim3(rows, max_splits, kKvHeads), kThreads, kSplitSmemBytes, s>>>(
        static_cast<const __half*>(q), static_cast<const CacheWord*>(k_cache), static_cast<const __half*>(k_scales),
        static_cast<const CacheWord*>(v_cache), static_cast<const __half*>(v_scales), block_table, depth, ancestors,
        ctx, scale, max_splits, part_acc, part_ml);
    tree_attention_combine<false><<<dim3(rows, kQHeads), kHeadDim, 0, s>>>(depth, CtxArg{ctx, nullptr}, max_splits,
                                                                           part_acc, part_ml, static_cast<__half*>(out), lse);
    return static_cast<int>(cudaGetLastError());
}

#if ELPIS_TREE_ATTN_QCACHE
// The quantized-cache build's entry. Device pointers, validated by elpis/exl3/tree_attention.py: q
// [rows, 24, 256] fp16; qk [pages, 256, 32 * K bits] and qv [pages, 256, 32 * V bits] int32 (the build's
// bits); sk, sv [pages, 256, 32] fp16; the rest as in elpis_tree_attention.
uint32_t elpis_tree_attention_qcache_bits(void) { return kKBits * 16u + kVBits; }

int elpis_tree_attention_qcache(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                                const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors,
                                uint32_t rows, uint32_t ctx, uint32_t max_depth, float scale, void* out, float* lse,
                                float* workspace, uint64_t workspace_floats, void* stream) {
    return launch(q, qk, sk, qv, sv, block_table, depth, ancestors, rows, ctx, max_depth, scale, out, lse, workspace,
                  workspace_floats, stream);
}
#else
// Returns 0 or a cudaError_t. All pointers are device pointers; shapes were validated by the caller
// (elpis/exl3/tree_attention.py): q [rows, 24, 256] fp16, caches [pages, 256, 4, 256] fp16, block_table
// int32 covering slots 0 .. ctx+rows-1, depth/ancestors uint32 [rows] from tree_masks with max depth
// `max_depth`, out [rows, 24, 256] fp16, lse [rows, 24] fp32 or null, workspace as above.
int elpis_tree_attention(const void* q, const void* k_cache, const void* v_cache, const int32_t* block_table,
                         const uint32_t* depth, const uint32_t* ancestors, uint32_t rows, uint32_t ctx,
                         uint32_t max_depth, float scale, void* out, float* lse, float* workspace,
                         uint64_t workspace_floats, void* stream) {
    return launch(q, k_cache, nullptr, v_cache, nullptr, block_table, depth, ancestors, rows, ctx, max_depth, scale,
                  out, lse, workspace, workspace_floats, stream);
}
#endif

}  // extern "C"
