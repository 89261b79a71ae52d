// Tree-verify attention on tensor cores (mma.sync m16n8k16: fp16 operands, fp32 accumulation) reading
// ExLlamaV3's quantized paged cache directly, row-invariant by construction (issue 8, items 2 and 6).
//
// Same contract as tree_attention.cu (the fp32 SIMT kernel, kept as the exact reference build): row r
// (depth d(r), ancestor bitmask a(r)) attends to absolute positions 0 .. ctx+d(r) - committed positions
// p < ctx from slot p, position ctx+e from slot ctx + (row of its ancestor at depth e) - through the
// proved split schedule of build/kernels/verify_schedule.h, and split partials are folded by the same
// combine kernel (tree_attention_common.cuh).
//
// One block per (split, K/V head) serves every row, in tiles of kTile absolute positions (tiles never
// straddle a split). A tile wholly below ctx holds committed positions only, the same for every row: it is
// dequantised once and shared. Any other tile is staged once per row from that row's own slots
// (elpis_sched_slot), with the row's positions past its span zeroed and masked.
//
// Why a row's bits do not depend on the other rows, its row index or the tree shape: every tensor-core
// instruction works on one row alone. Scores are S^T = K Q^T with the row's 6 query heads (plus 2 zero
// columns) as the n-tile, and the output is O^T = V^T P^T with the same n-tile, so each mma.sync sees
// exactly (the tile's K or V at the row's positions, the row's own Q or P, the row's own accumulators):
// the same operands whichever rows share the block, and the same as a 1-row call at ctx + d(r) over a
// cache holding its path (plain decoding), whose tiles cover the same absolute positions with the same
// values. The head-dim reduction of a score runs over 16 k-steps in order; the softmax per tile takes the
// exact max, exp(s - max) rounded to fp16 for P, and adds P's values serially in position order; the
// running output is rescaled by exp(old max - new max) before each tile's mma. Rows skip the tiles past
// their span (no instruction touches their accumulators there).
//
// Numerics differ from the SIMT kernel (P in fp16 as the tensor cores take it; the mma's internal
// summation): the GPU test records the error of both against an fp64 reference. Ampere instructions only
// (mma.sync, no wgmma/TMA); dynamic shared memory 93,952 bytes (sm_86 allows 99 KB per block).
#include "tree_attention_common.cuh"

#ifndef ELPIS_QCACHE_K_BITS
#define ELPIS_QCACHE_K_BITS 3
#endif
#ifndef ELPIS_QCACHE_V_BITS
#define ELPIS_QCACHE_V_BITS 3
#endif

#ifdef ELPIS_CUDA_EMU
#define ELPIS_DYNAMIC_SMEM(name) alignas(16) static uint8_t name[kSmemBytes]
#else
#define ELPIS_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

namespace {

constexpr uint32_t kKBits = ELPIS_QCACHE_K_BITS;
constexpr uint32_t kVBits = ELPIS_QCACHE_V_BITS;
constexpr uint32_t kTile = 32;                // positions per tile
constexpr uint32_t kWarps = kHeadDim / 16;    // 16: warp w owns head dims 16w .. 16w+15 of the output
constexpr uint32_t kThreads = kWarps * 32;    // 512
constexpr uint32_t kQPad = 8;                 // an n-tile: one row's 6 query heads and 2 zero columns
constexpr uint32_t kKStride = kHeadDim + 8;   // halves per staged K position (spreads smem banks)
constexpr uint32_t kVStride = kTile + 8;      // halves per staged V^T head dim
constexpr uint32_t kPStride = kTile + 8;      // halves per P query row
constexpr uint32_t kNoSlot = 0xffffffffu;     // a position past the row's span
constexpr uint32_t kStats = kMaxRows * kQPad;  // (row, query column) pairs

static_assert(kSplit % kTile == 0, "tiles never straddle a split");
static_assert(kTile == 32 && kMaxRows == 16 && kGroup <= kQPad && kWarps == 16, "the warp layout below");

// Dynamic shared memory (bytes). K [kTile][kKStride] and V^T [kHeadDim][kVStride] share one buffer.
constexpr size_t kQBytes = size_t(kMaxRows) * kGroup * kHeadDim * 2;
constexpr size_t kKBytes = size_t(kTile) * kKStride * 2;
constexpr size_t kVBytes = size_t(kHeadDim) * kVStride * 2;
constexpr size_t kOffKV = kQBytes;
constexpr size_t kOffP = kOffKV + (kKBytes > kVBytes ? kKBytes : kVBytes);
constexpr size_t kOffS = kOffP + size_t(kStats) * kPStride * 2;
constexpr size_t kOffStats = kOffS + size_t(kMaxRows) * kGroup * kTile * 4;
constexpr size_t kOffSlots = kOffStats + 3 * size_t(kStats) * 4;
constexpr size_t kOffRows = kOffSlots + kTile * 4;
constexpr size_t kSmemBytes = kOffRows + 2 * kMaxRows * 4;
static_assert(kSmemBytes <= 99 * 1024, "an RTX 3090 block gets at most 99 KB of shared memory");
static_assert(kOffKV % 16 == 0 && kOffP % 16 == 0 && (kKStride * 2) % 16 == 0, "16-byte staging stores");

__device__ __forceinline__ uint32_t ld32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

// d += A B for one m16n8k16 tile (A row-major 16x16, B column-major 16x8, fp16; d fp32), PTX fragment
// layout: a = rows (g, g+8) x cols (2t.., 2t+8..), b = k (2t.., 2t+8..) x col g, d = rows (g, g+8) x
// cols (2t, 2t+1), with g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef ELPIS_CUDA_EMU
    emu_mma_m16n8k16(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Group `i` of the tile (position i / 8, head-dim group i % 8) dequantised, or zeros past the row's span.
template <uint32_t kBits>
__device__ __forceinline__ void tile_group(const uint32_t* __restrict__ packed, const __half* __restrict__ scales,
                                           const int32_t* __restrict__ block_table, uint32_t slot, uint32_t h,
                                           uint32_t grp, __half (&vals)[kQGroup]) {
    if (slot == kNoSlot) {
#pragma unroll
        for (uint32_t j = 0; j < kQGroup; j++) vals[j] = __float2half_rn(0.0f);
        return;
    }
    const size_t idx = qcache_group(block_table, slot, h, grp);
    dequant_group<kBits>(packed + idx * kBits, scales[idx], vals);
}

struct Block {
    __half* q;      // [kMaxRows][kGroup][kHeadDim]
    __half* kv;     // K [kTile][kKStride] | V^T [kHeadDim][kVStride]
    __half* p;      // [kMaxRows][kQPad][kPStride]
    float* s;       // [kMaxRows][kGroup][kTile] scaled scores, -inf past a span
    float* m;       // [kStats] running max
    float* l;       // [kStats] running sum
    float* alpha;   // [kStats] this tile's rescale factor
    uint32_t* slot; // [kTile]
    uint32_t* end;  // [kMaxRows] end of the row's positions in this split (0: the row is not in it)
    uint32_t* mask; // [kMaxRows]
};

// One tile for the rows in `active` (all of them see the same positions: committed ones, or one row's own).
__device__ __forceinline__ void run_tile(const Block& b, float (&o)[kMaxRows][4], uint32_t t0, uint32_t active,
                                         int gather_row, uint32_t ctx, float scale, uint32_t h,
                                         const uint32_t* __restrict__ qk, const __half* __restrict__ sk,
                                         const uint32_t* __restrict__ qv, const __half* __restrict__ sv,
                                         const int32_t* __restrict__ block_table) {
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, g = lane >> 2, t = lane & 3u;
    if (tid < kTile) {
        const uint32_t pos = t0 + tid;
        uint32_t slot = pos;  // a shared tile: committed positions, slot = position
        if (gather_row >= 0) {
            const uint32_t r = static_cast<uint32_t>(gather_row);
            slot = pos < b.end[r] ? elpis_sched_slot(ctx, b.mask[r], pos) : kNoSlot;
        }
        b.slot[tid] = slot;
    }
    __syncthreads();

    // K tile, position-major.
    for (uint32_t i = tid; i < kTile * kQGroupsPerHead; i += kThreads) {
        const uint32_t pos = i / kQGroupsPerHead, grp = i % kQGroupsPerHead;
        __align__(16) __half vals[kQGroup];
        tile_group<kKBits>(qk, sk, block_table, b.slot[pos], h, grp, vals);
        uint4* dst = reinterpret_cast<uint4*>(b.kv + pos * kKStride + grp * kQGroup);
        const uint4* src = reinterpret_cast<const uint4*>(vals);
#pragma unroll
        for (uint32_t c = 0; c < 4; c++) dst[c] = src[c];
    }
    __syncthreads();

    // Scores S^T = K Q^T: warp -> positions 16*(warp & 1).., rows 2*(warp >> 1) and the next.
    {
        const uint32_t mt = warp & 1u, r0 = 2u * (warp >> 1);
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const bool on0 = (active >> r0) & 1u, on1 = (active >> (r0 + 1)) & 1u;
        if (on0 || on1) {
#pragma unroll 4
            for (uint32_t kk = 0; kk < kHeadDim / 16; kk++) {
                const __half* kb = b.kv + (16u * mt + g) * kKStride + 16u * kk + 2u * t;
                const uint32_t a[4] = {ld32(kb), ld32(kb + 8 * kKStride), ld32(kb + 8), ld32(kb + 8 * kKStride + 8)};
#pragma unroll
                for (uint32_t k = 0; k < 2; k++) {
                    if (!(k == 0 ? on0 : on1)) continue;
                    uint32_t b0 = 0, b1 = 0;  // the two padding query columns are zero
                    if (g < kGroup) {
                        const __half* qb = b.q + ((r0 + k) * kGroup + g) * kHeadDim + 16u * kk + 2u * t;
                        b0 = ld32(qb);
                        b1 = ld32(qb + 8);
                    }
                    mma16816(acc[k], a, b0, b1);
                }
            }
#pragma unroll
            for (uint32_t k = 0; k < 2; k++) {
                if (!(k == 0 ? on0 : on1)) continue;
#pragma unroll
                for (uint32_t e = 0; e < 4; e++) {
                    const uint32_t pos = 16u * mt + g + (e >= 2 ? 8u : 0u), j = 2u * t + (e & 1u);
                    if (j < kGroup)
                        b.s[((r0 + k) * kGroup + j) * kTile + pos] =
                            b.slot[pos] == kNoSlot ? __int_as_float(0xff800000) : __fmul_rn(acc[k][e], scale);
                }
            }
        }
    }
    __syncthreads();

    // Online softmax per (row, query head): exact max, P = fp16(exp(s - max)), sum of P in position order.
    if (tid < kMaxRows * kGroup) {
        const uint32_t r = tid / kGroup, j = tid % kGroup;
        if ((active >> r) & 1u) {
            const float* s = b.s + (r * kGroup + j) * kTile;
            float mx = __int_as_float(0xff800000);
            for (uint32_t i = 0; i < kTile; i++) mx = fmaxf(mx, s[i]);
            const uint32_t st = r * kQPad + j;
            const float m_new = fmaxf(b.m[st], mx);
            const float alpha = expf(b.m[st] - m_new);  // 0 on the row's first tile (old max -inf)
            __half* p = b.p + st * kPStride;
            float sum = 0.0f;
            for (uint32_t i = 0; i < kTile; i++) {
                const __half ph = __float2half_rn(expf(s[i] - m_new));
                p[i] = ph;
                sum = __fadd_rn(sum, __half2float(ph));
            }
            b.l[st] = __fadd_rn(__fmul_rn(b.l[st], alpha), sum);
            b.m[st] = m_new;
            b.alpha[st] = alpha;
        }
    }

    // V tile, transposed (head-dim-major) for the A operand of O^T.
    for (uint32_t i = tid; i < kTile * kQGroupsPerHead; i += kThreads) {
        const uint32_t pos = i / kQGroupsPerHead, grp = i % kQGroupsPerHead;
        __align__(16) __half vals[kQGroup];
        tile_group<kVBits>(qv, sv, block_table, b.slot[pos], h, grp, vals);
#pragma unroll
        for (uint32_t j = 0; j < kQGroup; j++) b.kv[(grp * kQGroup + j) * kVStride + pos] = vals[j];
    }
    __syncthreads();

    // O^T = alpha O^T + V^T P^T: warp -> head dims 16*warp.., every active row its own n-tile.
#pragma unroll
    for (uint32_t r = 0; r < kMaxRows; r++) {
        if (!((active >> r) & 1u)) continue;
        const float a0 = b.alpha[r * kQPad + 2u * t], a1 = b.alpha[r * kQPad + 2u * t + 1u];
        o[r][0] = __fmul_rn(o[r][0], a0);
        o[r][1] = __fmul_rn(o[r][1], a1);
        o[r][2] = __fmul_rn(o[r][2], a0);
        o[r][3] = __fmul_rn(o[r][3], a1);
    }
#pragma unroll
    for (uint32_t kk = 0; kk < kTile / 16; kk++) {
        const __half* vb = b.kv + (16u * warp + g) * kVStride + 16u * kk + 2u * t;
        const uint32_t a[4] = {ld32(vb), ld32(vb + 8 * kVStride), ld32(vb + 8), ld32(vb + 8 * kVStride + 8)};
#pragma unroll
        for (uint32_t r = 0; r < kMaxRows; r++) {
            if (!((active >> r) & 1u)) continue;
            const __half* pb = b.p + (r * kQPad + g) * kPStride + 16u * kk + 2u * t;
            mma16816(o[r], a, ld32(pb), ld32(pb + 8));
        }
    }
    __syncthreads();  // the next tile restages K, V and P
}

// One block: split `blockIdx.x`, K/V head `blockIdx.y`, every row whose span reaches the split. Writes the
// split's partial (max, sum, acc[256]) per (row, query head), as tree_attention.cu does.
__global__ void __launch_bounds__(kThreads) tree_attention_mma_split(
    const __half* __restrict__ q, const uint32_t* __restrict__ qk, const __half* __restrict__ sk,
    const uint32_t* __restrict__ qv, const __half* __restrict__ sv, const int32_t* __restrict__ block_table,
    const uint32_t* __restrict__ depth, const uint32_t* __restrict__ ancestors, uint32_t rows, uint32_t ctx,
    float scale, uint32_t max_splits, float* __restrict__ part_acc, float* __restrict__ part_ml) {
    ELPIS_DYNAMIC_SMEM(smem);
    const Block b{reinterpret_cast<__half*>(smem),
                  reinterpret_cast<__half*>(smem + kOffKV),
                  reinterpret_cast<__half*>(smem + kOffP),
                  reinterpret_cast<float*>(smem + kOffS),
                  reinterpret_cast<float*>(smem + kOffStats),
                  reinterpret_cast<float*>(smem + kOffStats) + kStats,
                  reinterpret_cast<float*>(smem + kOffStats) + 2 * kStats,
                  reinterpret_cast<uint32_t*>(smem + kOffSlots),
                  reinterpret_cast<uint32_t*>(smem + kOffRows),
                  reinterpret_cast<uint32_t*>(smem + kOffRows) + kMaxRows};
    const uint32_t split = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const uint32_t lane = tid & 31u, warp = tid >> 5, g = lane >> 2, t = lane & 3u;
    const uint32_t begin = elpis_sched_split_begin(split);

    if (tid < kMaxRows) {
        uint32_t end = 0, mask = 0;
        if (tid < rows) {
            const uint32_t span = elpis_sched_span(ctx, depth[tid]);
            if (split < elpis_sched_splits(span)) end = elpis_sched_split_end(span, split);
            mask = ancestors[tid];
        }
        b.end[tid] = end;
        b.mask[tid] = mask;
    }
    constexpr uint32_t kChunksPerRow = kGroup * kHeadDim / 8;  // 16-byte chunks of a row's 6 query heads
    for (uint32_t i = tid; i < rows * kChunksPerRow; i += kThreads) {
        const uint32_t r = i / kChunksPerRow, c = i % kChunksPerRow;
        const uint4* src = reinterpret_cast<const uint4*>(q + (static_cast<size_t>(r) * kQHeads + h * kGroup) * kHeadDim);
        reinterpret_cast<uint4*>(b.q)[i] = src[c];
    }
    for (uint32_t i = tid; i < kStats * kPStride / 2; i += kThreads) reinterpret_cast<uint32_t*>(b.p)[i] = 0;
    if (tid < kStats) {
        b.m[tid] = __int_as_float(0xff800000);
        b.l[tid] = 0.0f;
        b.alpha[tid] = 1.0f;
    }
    __syncthreads();

    uint32_t block_end = 0;
    for (uint32_t r = 0; r < kMaxRows; r++) block_end = max(block_end, b.end[r]);
    float o[kMaxRows][4];
#pragma unroll
    for (uint32_t r = 0; r < kMaxRows; r++) o[r][0] = o[r][1] = o[r][2] = o[r][3] = 0.0f;

    for (uint32_t t0 = begin; t0 < block_end; t0 += kTile) {
        if (t0 + kTile <= ctx) {  // committed positions only: one staging for every row in the split
            uint32_t active = 0;
            for (uint32_t r = 0; r < kMaxRows; r++) active |= (b.end[r] > t0 ? 1u : 0u) << r;
            run_tile(b, o, t0, active, -1, ctx, scale, h, qk, sk, qv, sv, block_table);
        } else {
            for (uint32_t r = 0; r < rows; r++)
                if (b.end[r] > t0) run_tile(b, o, t0, 1u << r, static_cast<int>(r), ctx, scale, h, qk, sk, qv, sv,
                                            block_table);
        }
    }

#pragma unroll
    for (uint32_t r = 0; r < kMaxRows; r++) {
        if (b.end[r] == 0) continue;
#pragma unroll
        for (uint32_t e = 0; e < 4; e++) {
            const uint32_t d = 16u * warp + g + (e >= 2 ? 8u : 0u), j = 2u * t + (e & 1u);
            if (j >= kGroup) continue;
            const size_t part = (static_cast<size_t>(r) * kQHeads + h * kGroup + j) * max_splits + split;
            part_acc[part * kHeadDim + d] = o[r][e];
        }
    }
    if (tid < kMaxRows * kGroup) {
        const uint32_t r = tid / kGroup, j = tid % kGroup;
        if (b.end[r] != 0) {
            const size_t part = (static_cast<size_t>(r) * kQHeads + h * kGroup + j) * max_splits + split;
            part_ml[part * 2] = b.m[r * kQPad + j];
            part_ml[part * 2 + 1] = b.l[r * kQPad + j];
        }
    }
}

}  // namespace

extern "C" {

uint32_t elpis_tree_attention_qcache_bits(void) { return kKBits * 16u + kVBits; }

uint32_t elpis_tree_attention_mma_smem_bytes(void) { return static_cast<uint32_t>(kSmemBytes); }

// Device pointers, validated by elpis/exl3/tree_attention.py (as for elpis_tree_attention_qcache): q
// [rows, 24, 256] fp16; qk [pages, 256, 32 * K bits] and qv [pages, 256, 32 * V bits] int32 (the build's
// bits); sk, sv [pages, 256, 32] fp16; block_table int32 covering slots 0 .. ctx+rows-1; depth/ancestors
// uint32 [rows] from tree_masks; out [rows, 24, 256] fp16; lse [rows, 24] fp32 or null; workspace of
// elpis_tree_attention_workspace_floats. Returns 0 or a cudaError_t.
int elpis_tree_attention_mma(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                             const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors,
                             uint32_t rows, uint32_t ctx, uint32_t max_depth, float scale, void* out, float* lse,
                             float* workspace, uint64_t workspace_floats, void* stream) {
    if (rows == 0 || rows > kMaxRows || max_depth >= kMaxRows) return static_cast<int>(cudaErrorInvalidValue);
    if (workspace_floats < elpis_tree_attention_workspace_floats(rows, ctx, max_depth))
        return static_cast<int>(cudaErrorInvalidValue);
    const uint32_t max_splits = elpis_tree_attention_max_splits(ctx, max_depth);
    if (max_splits > kMaxGridY) return static_cast<int>(cudaErrorInvalidValue);
    static bool smem_set = false;  // the opt-in above 48 KB, once per process
    if (!smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(tree_attention_mma_split,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
        if (err != cudaSuccess) return static_cast<int>(err);
        smem_set = true;
    }
    float* part_acc = workspace;
    float* part_ml = workspace + static_cast<uint64_t>(rows) * kQHeads * max_splits * kHeadDim;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    tree_attention_mma_split<<<dim3(max_splits, kKvHeads), kThreads, kSmemBytes, s>>>(
        static_cast<const __half*>(q), static_cast<const uint32_t*>(qk), static_cast<const __half*>(sk),
        static_cast<const uint32_t*>(qv), static_cast<const __half*>(sv), block_table, depth, ancestors, rows, ctx,
        scale, max_splits, part_acc, part_ml);
    tree_attention_combine<<<dim3(rows, kQHeads), kHeadDim, 0, s>>>(depth, ctx, max_splits, part_acc, part_ml,
                                                                   static_cast<__half*>(out), lse);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
