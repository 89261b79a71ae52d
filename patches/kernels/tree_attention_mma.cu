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
// straddle a split), each staged once: the tile's committed positions (< ctx, the same for every row),
// and in a tile that reaches ctx also the 16 tree slots ctx..ctx+15 and a zero row. Each row addresses its
// own positions through the proved slot map (elpis_sched_slot): a committed position reads the tile row, a
// position ctx+e reads the tree slot of its ancestor at depth e, a position past its span reads zeros and
// is masked. Below ctx a tile's dequantisation overlaps its tensor-core work: half the warps compute the
// scores and P of whole rows while the other half dequantise V, and every warp dequantises the next tile's K
// around the output (run_tile).
//
// Why a row's bits do not depend on the other rows, its row index or the tree shape: every tensor-core
// instruction works on one row alone. Scores are S^T = K Q^T with the row's 6 query heads (plus 2 zero
// columns) as the n-tile, and the output is O^T = V^T P^T with the same n-tile, so each mma.sync sees
// exactly (the row's K or V at its positions of the tile, the row's own Q or P, the row's own
// accumulators): the same operands whichever rows share the block, and the same as a 1-row call at
// ctx + d(r) over a cache holding its path (plain decoding), whose tiles cover the same absolute positions
// with the same values. The head-dim reduction of a score runs over 16 k-steps in order; per tile the max
// is exact, P = fp16(exp(s - max)), and P's sum is a fixed butterfly over the same fragment lanes in every
// call; the running output is rescaled by exp(old max - new max) before each tile's mma. Rows skip the
// tiles past their span (no instruction touches their accumulators there).
//
// Numerics differ from the SIMT kernel (P in fp16 as the tensor cores take it; the mma's internal
// summation): the GPU test records the error of both against an fp64 reference. Ampere instructions only
// (mma.sync, ldmatrix; no wgmma/TMA); dynamic shared memory kSmemBytes, 99,668 bytes (sm_86 allows 99 KB:
// 101,376).
#include "tree_attention_common.cuh"

namespace {

constexpr uint32_t kKBits = ELPIS_QCACHE_K_BITS;
constexpr uint32_t kVBits = ELPIS_QCACHE_V_BITS;
constexpr uint32_t kTile = 32;                // positions per tile
constexpr uint32_t kWarps = kHeadDim / 16;    // 16: warp w owns head dims 16w .. 16w+15 of the output
constexpr uint32_t kThreads = kWarps * 32;    // 512
constexpr uint32_t kQPad = 8;                 // an n-tile: one row's 6 query heads and 2 zero columns
constexpr uint32_t kStaged = kTile + kMaxRows + 1;  // staged K/V rows: the tile, the tree rows, a zero row
constexpr uint32_t kTreeRow = kTile;          // staged row of tree slot ctx + j: kTreeRow + j
constexpr uint32_t kZeroRow = kTile + kMaxRows;
constexpr uint32_t kKVRows = 2 * kTile;       // staged rows: a tail tile's kStaged, or a tile's K and V apart
constexpr uint32_t kVRow = kTile;             // first staged row of V below ctx in the overlapped tiles
constexpr uint32_t kKStride = kHeadDim + 8;   // halves per staged K or V row (132 words: conflict-free ldmatrix)
constexpr uint32_t kPStride = kTile + 8;      // halves per P query row (20 words: conflict-free ldmatrix)
constexpr uint32_t kQStride = kHeadDim + 8;   // halves per staged query head (conflict-free ldmatrix)
constexpr uint32_t kStats = kMaxRows * kQPad;  // (row, query column) pairs
constexpr uint32_t kRowChunk = 4;             // rows per step of the output loop below ctx (see run_tile)

// ELPIS_MMA_HADAMARD_FOLD (0 unless the build asks; the registry switch exl3-attn-hadamard-fold): the cache's
// groups are 32-point Hadamard rotations, K = H k / sqrt(32) and V = H v / sqrt(32) with H symmetric, so a score
// q . K = (H q / sqrt(32)) . k and an output sum_i p_i V_i = H (sum_i p_i v_i) / sqrt(32). The fold rotates each
// query group once as it is staged and each output group once in the combine, and stages the cache's groups
// unrotated (dequant_words<kBits, false>): no butterflies and no shuffles per staged position. The real-number
// result is the same; the rounding is not (each query, staged value and output is rounded at another point), so
// it is served only under a gate verdict (bench/results/tree/README.md). A row's bits still depend on its own
// operands alone: the rotations are per query and per output.
#ifndef ELPIS_MMA_HADAMARD_FOLD
#define ELPIS_MMA_HADAMARD_FOLD 0
#endif
constexpr bool kFold = ELPIS_MMA_HADAMARD_FOLD != 0;

// ELPIS_MMA_MIN_BLOCKS (1 unless a diagnostic build asks): blocks a multiprocessor should hold at once, the launch
// bound that caps registers a thread (65,536 / (512 x 2) = 64 for 2). The served 16-row build needs 128, so one
// block an SM; an 8-row build (ELPIS_BUILD_MAX_ROWS 8, half the output accumulators) can ask for 2 where shared
// memory allows it (H100 / H200: 2 x ~67 KB; an RTX 3090's 100 KB an SM holds one). Same instructions on a row's
// operands either way, so the same bits. Measured in session 49 (H100): two blocks an SM, but 64 registers spill
// ~370 bytes a thread, and at 8 rows it was 5 % slower at 262K (bench/results/tree/README.md); not served.
// (Unset, the bound names no block count: ptxas allocates differently once it is given one, even 1.)
#if defined(ELPIS_MMA_MIN_BLOCKS) && ELPIS_MMA_MIN_BLOCKS > 1
#define ELPIS_MMA_BOUNDS __launch_bounds__(kThreads, ELPIS_MMA_MIN_BLOCKS)
#else
#define ELPIS_MMA_BOUNDS __launch_bounds__(kThreads)
#endif

// Every boundary is a multiple of the shortest split (law splits_fit_the_kernels).
static_assert(ELPIS_SCHED_SPLIT_MIN % kTile == 0, "tiles never straddle a split");
static_assert(kTile == 32 && kMaxRows % kRowChunk == 0 && kMaxRows <= 16 && kGroup <= kQPad && kWarps == 16,
              "the warp layout below");

// Dynamic shared memory (bytes). Staged K and V rows, [kKVRows][kKStride] position-major: a tile below ctx
// keeps K in rows 0..31 and V in rows 32..63 (so that one can be staged while the other is read, see run_tile);
// a tail tile stages K, then V, in rows 0..kStaged-1. A zero query row serves the padding query columns'
// ldmatrix rows.
static_assert(kStaged <= kKVRows && kVRow + kTile <= kKVRows, "the staged-row buffer holds either layout");
constexpr size_t kQBytes = size_t(kMaxRows) * kGroup * kQStride * 2;
constexpr size_t kKVBytes = size_t(kKVRows) * kKStride * 2;
constexpr size_t kOffKV = kQBytes;
constexpr size_t kOffP = kOffKV + (kKVBytes + 15) / 16 * 16;
constexpr size_t kOffQZero = kOffP + size_t(kStats) * kPStride * 2;
constexpr size_t kOffStats = kOffQZero + size_t(kQStride) * 2;
constexpr size_t kOffSlots = kOffStats + 7 * size_t(kStats) * 4;
constexpr size_t kOffRows = kOffSlots + kStaged * 4;
constexpr size_t kOffSrow = kOffRows + 2 * kMaxRows * 4;
constexpr size_t kSmemBytes = kOffSrow + kMaxRows * kTile;
static_assert(kSmemBytes <= 99 * 1024, "an RTX 3090 block gets at most 99 KB of shared memory");
static_assert(kOffKV % 16 == 0 && kOffP % 16 == 0 && kOffQZero % 16 == 0 && (kKStride * 2) % 16 == 0 &&
                  (kPStride * 2) % 16 == 0 && (kQStride * 2) % 16 == 0,
              "16-byte staging stores and ldmatrix rows");

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

// Four 8x8 fp16 matrices from shared memory (ldmatrix: Ampere and later): lane 8i+k gives the address of row k
// of matrix i (16 bytes); r[i] holds, for lane l, row l/4's elements 2(l%4), +1 of matrix i - with kTrans,
// rows 2(l%4), +1 of column l/4. Only moves data: the fragments hold the same halves as 32-bit loads would.
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* row) {
#ifdef ELPIS_CUDA_EMU
    emu_ldmatrix_x4(r, row, kTrans);
#else
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    if (kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

// Max / sum over the 8 lanes of a warp that share lane % 4 (the g index of a fragment), a fixed butterfly.
__device__ __forceinline__ float max_over_g(float v) {
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 4));
    v = fmaxf(v, __shfl_xor_sync(kFull, v, 8));
    return fmaxf(v, __shfl_xor_sync(kFull, v, 16));
}

__device__ __forceinline__ float sum_over_g(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 8));
    return __fadd_rn(v, __shfl_xor_sync(kFull, v, 16));
}

// A block's rows are local rows 0 .. n-1 (local row lr is global row blockIdx.z + lr * gridDim.z): every
// per-row array below and the accumulators o[lr] are indexed by local row, so that below ctx - where every
// row of the block is active - the active rows are always a prefix.
struct Block {
    __half* q;       // [kMaxRows][kGroup][kQStride]
    __half* kv;      // staged K and V rows [kKVRows][kKStride]
    __half* p;       // [kMaxRows][kQPad][kPStride]
    __half* qzero;   // [kQStride] zeros: the padding query columns' rows
    float* m;        // [kStats] running max
    float* l;        // [kStats] running sum
    float* alpha;    // [kStats] this tile's rescale factor
    float* tmax;     // [2][kStats] this tile's max per half (16 positions)
    float* tsum;     // [2][kStats] this tile's sum of P per half
    uint32_t* slot;  // [kStaged] cache slot of each staged row (kNoSlot: zeros)
    uint32_t* end;   // [kMaxRows] end of the row's positions in this split (0: the row is not in it)
    uint32_t* mask;  // [kMaxRows]
    uint8_t* srow;   // [kMaxRows][kTile] staged row of each (row, position of the tile), see run_tile
};

constexpr uint32_t kNoSlot = 0xffffffffu;

// Diagnostic build (ELPIS_MMA_CLOCKS, never served): thread 0 of one block in the middle of the grid adds the
// cycles of each phase of its tiles to g_phase_cycles (read by elpis_tree_attention_mma_clocks), to find
// where a tile's time goes. It adds one barrier between P and the V staging, so that the two are timed
// apart; the normal build has neither.
#ifdef ELPIS_MMA_CLOCKS
constexpr uint32_t kClockSlots = 10;  // phases 0..5, tiles, block cycles, block ns, blocks measured
__device__ unsigned long long g_phase_cycles[kClockSlots];
__device__ __forceinline__ bool clocked_block() {
    return threadIdx.x == 0 && blockIdx.y == gridDim.y / 2 && blockIdx.x == 0 && blockIdx.z == 0;
}
#define ELPIS_PHASE(k)                                    \
    do {                                                  \
        if (clocked_block()) {                            \
            const long long now_ = clock64();             \
            g_phase_cycles[k] += now_ - clk;              \
            clk = now_;                                   \
        }                                                 \
    } while (0)
#else
#define ELPIS_PHASE(k) \
    do {               \
    } while (0)
#endif

// Staged row holding row r's position `pos` of a tile starting at t0: the tile's own row for a committed
// position, the tree slot of its ancestor at that depth (the proved schedule's slot), the zero row past
// the row's span.
__device__ __forceinline__ uint32_t staged_row(const Block& b, uint32_t r, uint32_t pos, uint32_t t0, uint32_t ctx) {
    if (pos >= b.end[r]) return kZeroRow;
    if (pos < ctx) return pos - t0;
    return kTreeRow + (elpis_sched_slot(ctx, b.mask[r], pos) - ctx);
}

// Dequantise the staged rows' groups (row i / 8, head-dim group i % 8) position-major into b.kv.
template <uint32_t kBits>
__device__ __forceinline__ void stage(const Block& b, const uint32_t* __restrict__ packed,
                                      const __half* __restrict__ scales, const int32_t* __restrict__ block_table,
                                      uint32_t rows_used, uint32_t h) {
    for (uint32_t i = threadIdx.x; i < rows_used * kQGroupsPerHead; i += kThreads) {
        const uint32_t row = i / kQGroupsPerHead, grp = i % kQGroupsPerHead;  // 16-byte stores along a row
        __align__(16) __half vals[kQGroup];
        const uint32_t slot = b.slot[row];
        if (slot == kNoSlot) {
#pragma unroll
            for (uint32_t j = 0; j < kQGroup; j++) vals[j] = __float2half_rn(0.0f);
        } else {
            const size_t idx = qcache_group(block_table, slot, h, grp);
            dequant_group<kBits, !kFold>(packed + idx * kBits, scales[idx], vals);
        }
        uint4* dst = reinterpret_cast<uint4*>(b.kv + row * kKStride + grp * kQGroup);
        const uint4* src = reinterpret_cast<const uint4*>(vals);
#pragma unroll
        for (uint32_t c = 0; c < 4; c++) dst[c] = src[c];
    }
}

// Pipelined staging (ELPIS_MMA_PREFETCH, on by default). A tile's packed words are loaded into registers one
// tile ahead, so the loads' latency hides behind the previous tile's arithmetic (the kernel runs one block per
// SM: nothing else would cover it), and every thread decodes half a group, so all 512 threads dequantise (the
// direct staging above keeps half of them idle). The two halves of a group meet for the last butterfly
// (index bit 4) through a shuffle. Every value goes through dequant_group's operations in dequant_group's
// order, so the staged fp16 values - and so every output bit - are those of the direct staging; the emulated
// and GPU tests build both and compare (0 builds the direct staging). Measured on the H200 before the
// staged-row table: 5-7 % faster than the direct staging (bench/results/tree/README.md, call 15).
#ifndef ELPIS_MMA_PREFETCH
#define ELPIS_MMA_PREFETCH 1
#endif

constexpr uint32_t kHalfGroup = kQGroup / 2;
static_assert(kTile * kQGroupsPerHead * 2 == kThreads, "one pass of half-group items stages a tile's rows");
static_assert(kStaged <= 2 * kTile, "a tail tile's extra rows fit in a second pass");

// One group's packed words and scale, loaded ahead of its tile (zeros for a row with no slot: a position past
// the context, the zero row, an unused tree slot; whoever stages it knows which rows those are, so no flag is
// kept here, where every thread would hold one across the tile for K and V).
template <uint32_t kBits>
struct Packed {
    uint32_t w[kBits];
    __half scale;
};

// Item `i` (a thread) of a pass over 32 staged rows: (row, group, half), a group's halves in lanes i and i^1.
__device__ __forceinline__ void pass_item(uint32_t i, uint32_t& row, uint32_t& grp, uint32_t& half) {
    half = i & 1u;
    grp = (i >> 1) & 7u;
    row = (i >> 4) & 31u;
}

// Slot of staged row `row` (< kTile) of the tile at t0: what run_tile writes to b.slot for the tile's rows.
__device__ __forceinline__ uint32_t tile_slot(uint32_t t0, uint32_t row, uint32_t ctx) {
    return t0 + row < ctx ? t0 + row : kNoSlot;
}

template <uint32_t kBits>
__device__ __forceinline__ Packed<kBits> fetch_group(const uint32_t* __restrict__ packed,
                                                    const __half* __restrict__ scales,
                                                    const int32_t* __restrict__ block_table, uint32_t slot,
                                                    uint32_t h, uint32_t grp) {
    Packed<kBits> p;
    if (slot != kNoSlot) {
        const size_t idx = qcache_group(block_table, slot, h, grp);
#pragma unroll
        for (uint32_t i = 0; i < kBits; i++) p.w[i] = packed[idx * kBits + i];
        p.scale = scales[idx];
    } else {
#pragma unroll
        for (uint32_t i = 0; i < kBits; i++) p.w[i] = 0;
        p.scale = __float2half_rn(0.0f);
    }
    return p;
}

// The words holding half `half` of a group's codes, placed so that value j (< 16) of the half reads its field
// of each bit plane at the compile-time bit j * width of word base + (j * width) / 32: a plane of width >= 2
// keeps its `width / 2` words of the half, the 1-bit plane its word shifted down by 16 * half. The selects
// run once per group, not once per value; the codes are group_code's.
template <uint32_t kBits>
__device__ __forceinline__ void half_words(const uint32_t (&w)[kBits], uint32_t half, uint32_t (&hw)[kBits]) {
#pragma unroll
    for (uint32_t i = 0; i < kBits; i++) hw[i] = 0;
#pragma unroll
    for (uint32_t width = 1; width <= 8; width <<= 1) {
        if (!(kBits & width)) continue;
        const uint32_t base = kBits & ~(2u * width - 1u);
        if (width == 1) {
            hw[base] = w[base] >> (half ? kHalfGroup : 0u);
        } else {
#pragma unroll
            for (uint32_t i = 0; i < width / 2; i++) hw[base + i] = half ? w[base + width / 2 + i] : w[base + i];
        }
    }
}

// code_value of value j of the half, with the code's float made from its bits: 2^22 + code has the bits
// 0x4A800000 | (code << 1) (the ulp at 2^22 is 1/2), and (2^22 + code) - (2^22 + mid) is exact, so it equals
// float(code) - mid, which is exact too; the product with the step is rounded once, as in code_value.
template <uint32_t kBits>
__device__ __forceinline__ float half_value(const uint32_t (&hw)[kBits], uint32_t j, float step) {
    constexpr float kBiasedMid = 4194304.0f + (static_cast<float>(1u << (kBits - 1)) - 0.5f);
    uint32_t bits = 0x4A800000u;
#pragma unroll
    for (uint32_t width = 1; width <= 8; width <<= 1) {
        if (!(kBits & width)) continue;
        const uint32_t base = kBits & ~(2u * width - 1u), bit = j * width;
        const uint32_t field = (hw[base + (bit >> 5)] >> (bit & 31u)) & ((1u << width) - 1u);
        bits |= field << ((kBits & (width - 1u)) + 1u);
    }
    return __fmul_rn(__fsub_rn(__int_as_float(static_cast<int>(bits)), kBiasedMid), step);
}

// Store half `half` of a group's fp16 values into staged row `row` (two 16-byte stores), zeros if !valid.
__device__ __forceinline__ void store_half(const Block& b, const __half (&vals)[kHalfGroup], bool valid,
                                           uint32_t row, uint32_t grp, uint32_t half) {
    uint4* dst = reinterpret_cast<uint4*>(b.kv + row * kKStride + grp * kQGroup + kHalfGroup * half);
    const uint4* src = reinterpret_cast<const uint4*>(vals);
    const uint4 zero{0u, 0u, 0u, 0u};
    dst[0] = valid ? src[0] : zero;
    dst[1] = valid ? src[1] : zero;
}

// Decode half `half` of a group into staged row `row`, zeros if !valid (every lane of the warp calls it: the
// last butterfly is a shuffle with the partner lane; `store` false only computes). Same operations as
// dequant_group; the last butterfly's lo + hi (half 0) and lo - hi (half 1) are one fma with an exact product
// (+-1 * v), so each is rounded once, as the add and the subtract are.
template <uint32_t kBits>
__device__ __forceinline__ void decode_half(const Block& b, const Packed<kBits>& p, uint32_t row, uint32_t grp,
                                            uint32_t half, bool store, bool valid) {
    const float step = kFold ? group_raw_step<kBits>(p.scale) : group_step<kBits>(p.scale);
    uint32_t hw[kBits];
    half_words<kBits>(p.w, half, hw);
    float v[kHalfGroup];
#pragma unroll
    for (uint32_t j = 0; j < kHalfGroup; j++) v[j] = half_value<kBits>(hw, j, step);
    if (!kFold) {
        hadamard_butterflies(v);  // index bits 0..3, within the half
        // index bit 4: value j (half 0) is lo, value 16 + j (half 1) is hi
        const float sign = half ? -1.0f : 1.0f;
#pragma unroll
        for (uint32_t j = 0; j < kHalfGroup; j++) {
            const float other = __shfl_xor_sync(kFull, v[j], 1);
            v[j] = __fmaf_rn(v[j], sign, other);  // half 0: v + other; half 1: other - v
        }
    }
    if (!store) return;
    __align__(16) __half vals[kHalfGroup];
#pragma unroll
    for (uint32_t j = 0; j < kHalfGroup; j++) vals[j] = __float2half_rn(v[j]);
    store_half(b, vals, valid, row, grp, half);
}

// Stage the tile at t0 from the group loaded ahead (the tile's own rows, those below ctx holding values)
// and, in a tail tile, the tree rows and the zero row (rows kTile.., loaded now: they exist only in the block's
// last tiles).
template <uint32_t kBits>
__device__ __forceinline__ void stage_ahead(const Block& b, const Packed<kBits>& ahead,
                                            const uint32_t* __restrict__ packed, const __half* __restrict__ scales,
                                            const int32_t* __restrict__ block_table, bool tail, uint32_t h,
                                            uint32_t t0, uint32_t ctx) {
    uint32_t row, grp, half;
    pass_item(threadIdx.x, row, grp, half);
    decode_half<kBits>(b, ahead, row, grp, half, true, !tail || tile_slot(t0, row, ctx) != kNoSlot);
    if (tail) {
        const uint32_t extra = kTile + row;
        const bool store = extra < kStaged;
        const uint32_t slot = store ? b.slot[extra] : kNoSlot;
        decode_half<kBits>(b, fetch_group<kBits>(packed, scales, block_table, slot, h, grp), extra, grp, half,
                           store, slot != kNoSlot);
    }
}

// The group this thread stages for the tile at t0, loaded ahead of it.
template <uint32_t kBits>
__device__ __forceinline__ Packed<kBits> fetch_ahead(const uint32_t* __restrict__ packed,
                                                    const __half* __restrict__ scales,
                                                    const int32_t* __restrict__ block_table, uint32_t t0,
                                                    uint32_t ctx, uint32_t h) {
    uint32_t row, grp, half;
    pass_item(threadIdx.x, row, grp, half);
    return fetch_group<kBits>(packed, scales, block_table, tile_slot(t0, row, ctx), h, grp);
}

// A tile below ctx splits its warps (run_tile): warps 0..7 compute the scores and P of whole rows, warps 8..15
// dequantise V meanwhile, one whole group a thread.
constexpr uint32_t kScoreWarps = kWarps / 2;
static_assert(kTile * kQGroupsPerHead == (kWarps - kScoreWarps) * 32, "one V group per staging thread");
static_assert(kMaxRows <= 2 * kScoreWarps, "a score warp's rows: one, or two past 8 rows");

// The group a V-staging thread (warp >= kScoreWarps) stages: staged row `row` of the tile, head-dim group `grp`.
__device__ __forceinline__ void group_item(uint32_t& row, uint32_t& grp) {
    const uint32_t i = threadIdx.x - kScoreWarps * 32u;
    row = i / kQGroupsPerHead;
    grp = i % kQGroupsPerHead;
}

// The V group this thread stages for the tile at t0 (a tile below ctx), loaded ahead of it; nothing for the
// score warps.
template <uint32_t kBits>
__device__ __forceinline__ Packed<kBits> fetch_v_group(const uint32_t* __restrict__ packed,
                                                      const __half* __restrict__ scales,
                                                      const int32_t* __restrict__ block_table, uint32_t t0,
                                                      uint32_t ctx, uint32_t h) {
    uint32_t row = 0, grp = 0;
    const bool stager = (threadIdx.x >> 5) >= kScoreWarps;
    if (stager) group_item(row, grp);
    return fetch_group<kBits>(packed, scales, block_table, stager ? tile_slot(t0, row, ctx) : kNoSlot, h, grp);
}

// Stage the tile's V (below ctx, so every row has a slot) into rows kVRow.. from the groups loaded ahead:
// dequant_group's operations on the words in registers, so the direct staging's values. Staging warps only.
template <uint32_t kBits>
__device__ __forceinline__ void stage_v_groups(const Block& b, const Packed<kBits>& p) {
    uint32_t row, grp;
    group_item(row, grp);
    __align__(16) __half vals[kQGroup];
    dequant_words<kBits, !kFold>(p.w, p.scale, vals);
    uint4* dst = reinterpret_cast<uint4*>(b.kv + (kVRow + row) * kKStride + grp * kQGroup);
    const uint4* src = reinterpret_cast<const uint4*>(vals);
#pragma unroll
    for (uint32_t c = 0; c < 4; c++) dst[c] = src[c];
}

// k: every thread's half group of the next tile's K (pass_item), v: a V-staging thread's group of the next tile
// below ctx (group_item).
struct Ahead {
    Packed<kKBits> k;
    Packed<kVBits> v;
};

// This lane's ldmatrix row of the Q fragments of local row r, k-steps 2kp and 2kp+1 (add 32 kp): matrices
// (b0, b1) of the first k-step, then of the second; the padding query columns read the zero row.
__device__ __forceinline__ const __half* q_row(const Block& b, uint32_t r, uint32_t lane) {
    const uint32_t n = lane & 7u, koff = 8u * (lane >> 3);
    return (n < kGroup ? b.q + (r * kGroup + n) * kQStride : b.qzero) + koff;
}

// Scores S^T = K Q^T of local row r over positions 16 mt .. 16 mt + 15 of the tile, k-steps 0..15 in order.
// `k_row` is this lane's ldmatrix row of the A fragments at k-step 0 (matrices: positions +0 / +8, head dims
// +0 / +8); with kShared the two rows r0 and r0+1 share each A fragment.
template <bool kShared>
__device__ __forceinline__ void scores(const Block& b, float (&acc0)[4], float (&acc1)[4], const __half* k_row,
                                       uint32_t r0, uint32_t lane) {
    const __half* q0 = q_row(b, r0, lane);
    const __half* q1 = q_row(b, r0 + 1u, lane);
#pragma unroll 2
    for (uint32_t kp = 0; kp < kHeadDim / 32; kp++) {
        uint32_t b0[4], b1[4];
        ldsm_x4<false>(b0, q0 + 32u * kp);
        if (kShared) ldsm_x4<false>(b1, q1 + 32u * kp);
#pragma unroll
        for (uint32_t s = 0; s < 2; s++) {
            const uint32_t kk = 2u * kp + s;
            uint32_t a[4];
            ldsm_x4<false>(a, k_row + 16u * kk);
            mma16816(acc0, a, b0[2 * s], b0[2 * s + 1]);
            if (kShared) mma16816(acc1, a, b1[2 * s], b1[2 * s + 1]);
        }
    }
}

// The phases of a tile (run_tile below). Warp w: positions 16 mt.. (mt = w & 1) of the scores and P, and local
// row w >> 1, or rows 2 (w >> 1) and the next when the block has more than 8 (they share each A fragment below
// ctx); head dims 16 w.. of the output.
struct TileRows {
    uint32_t mt, r0, nr;
    bool pair;
};

__device__ __forceinline__ TileRows tile_rows(uint32_t warp, uint32_t n) {
    TileRows w;
    w.mt = warp & 1u;
    w.pair = n > kWarps / 2;
    w.r0 = w.pair ? 2u * (warp >> 1) : warp >> 1;
    w.nr = w.pair ? 2u : 1u;
    return w;
}

// Row r's scores over positions 16 mt.. of the tile at t0 (this lane's fragment `a`) scaled, and -inf from the
// row's `end` (b.end[r], read by the caller); this half-tile's max of query columns 2t and 2t + 1 into mx and
// b.tmax.
__device__ __forceinline__ void mask_scores(const Block& b, float (&a)[4], uint32_t r, uint32_t end, uint32_t mt,
                                            uint32_t t0, float scale, float (&mx)[2]) {
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    const uint32_t p_lo = t0 + 16u * mt + g, p_hi = p_lo + 8u;
    const float ninf = __int_as_float(0xff800000);
    const bool v_lo = p_lo < end, v_hi = p_hi < end;
    a[0] = v_lo ? __fmul_rn(a[0], scale) : ninf;
    a[1] = v_lo ? __fmul_rn(a[1], scale) : ninf;
    a[2] = v_hi ? __fmul_rn(a[2], scale) : ninf;
    a[3] = v_hi ? __fmul_rn(a[3], scale) : ninf;
    mx[0] = max_over_g(fmaxf(a[0], a[2]));
    mx[1] = max_over_g(fmaxf(a[1], a[3]));
    if (g == 0) {
        b.tmax[mt * kStats + r * kQPad + 2u * t] = mx[0];
        b.tmax[mt * kStats + r * kQPad + 2u * t + 1u] = mx[1];
    }
}

// P = fp16(exp(s - m_new)) of row r's query column 2t + c over positions 16 mt.. (`a`: mask_scores' output)
// into b.p, and this half-tile's sum of P (a fixed butterfly) into b.tsum.
__device__ __forceinline__ void write_p(const Block& b, const float (&a)[4], uint32_t r, uint32_t mt, uint32_t c,
                                        float m_new) {
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    const uint32_t j = 2u * t + c, st = r * kQPad + j;
    const __half ph_lo = __float2half_rn(expf(a[c] - m_new));
    const __half ph_hi = __float2half_rn(expf(a[2 + c] - m_new));
    __half* prow = b.p + st * kPStride + 16u * mt + g;
    if (j < kGroup) {
        prow[0] = ph_lo;
        prow[8] = ph_hi;
    }
    const float part = sum_over_g(__fadd_rn(__half2float(ph_lo), __half2float(ph_hi)));
    if (g == 0) b.tsum[mt * kStats + st] = part;
}

// Scores of the warp's rows over its 16 positions (K in staged rows 0.., in a tail tile gathered through each
// row's staged-row table), scaled and masked, and this half-tile's max per (row, query column) into b.tmax.
__device__ __forceinline__ void score_phase(const Block& b, float (&acc)[2][4], const TileRows& w, bool tail,
                                            uint32_t active, uint32_t t0, float scale) {
    const uint32_t lane = threadIdx.x & 31u;
    // this lane's ldmatrix row: matrix i = lane / 8 -> positions +8 (i & 1), head dims +8 (i >> 1)
    const uint32_t a_pos = 16u * w.mt + 8u * ((lane >> 3) & 1u) + (lane & 7u), a_dim = 8u * (lane >> 4);
    if (!tail) {
        const __half* k_row = b.kv + a_pos * kKStride + a_dim;
        if (w.pair && ((active >> (w.r0 + 1u)) & 1u))
            scores<true>(b, acc[0], acc[1], k_row, w.r0, lane);
        else if ((active >> w.r0) & 1u)
            scores<false>(b, acc[0], acc[1], k_row, w.r0, lane);
    } else {
#pragma unroll
        for (uint32_t k = 0; k < 2; k++) {
            const uint32_t r = w.r0 + k;
            if (k >= w.nr || !((active >> r) & 1u)) continue;
            const __half* k_row = b.kv + b.srow[r * kTile + a_pos] * kKStride + a_dim;
            scores<false>(b, acc[k], acc[k], k_row, r, lane);
        }
    }
#pragma unroll
    for (uint32_t k = 0; k < 2; k++) {
        const uint32_t r = w.r0 + k;
        if (k >= w.nr || !((active >> r) & 1u)) continue;
        float mx[2];
        mask_scores(b, acc[k], r, b.end[r], w.mt, t0, scale, mx);
    }
}

// P = fp16(exp(s - new max)) into b.p, this half-tile's sum of P (fixed butterfly) into b.tsum, and each
// (row, query column)'s rescale factor into b.alpha.
__device__ __forceinline__ void softmax_phase(const Block& b, const float (&acc)[2][4], const TileRows& w,
                                              uint32_t active) {
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
#pragma unroll
    for (uint32_t k = 0; k < 2; k++) {
        const uint32_t r = w.r0 + k;
        if (k >= w.nr || !((active >> r) & 1u)) continue;
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) {
            const uint32_t st = r * kQPad + 2u * t + c;
            const float m_new = fmaxf(b.m[st], fmaxf(b.tmax[st], b.tmax[kStats + st]));
            write_p(b, acc[k], r, w.mt, c, m_new);
            // the rescale factor: 0 on the row's first tile (old max -inf)
            if (g == 0 && w.mt == 0) b.alpha[st] = expf(b.m[st] - m_new);
        }
    }
}

// The running (max, sum) per (row, query column), from this tile's halves.
__device__ __forceinline__ void update_stats(const Block& b, uint32_t active) {
    const uint32_t tid = threadIdx.x;
    if (tid < kStats) {
        const uint32_t r = tid / kQPad, j = tid % kQPad;
        if (((active >> r) & 1u) && j < kGroup) {
            const float m_new = fmaxf(b.m[tid], fmaxf(b.tmax[tid], b.tmax[kStats + tid]));
            b.l[tid] = __fadd_rn(__fmul_rn(b.l[tid], b.alpha[tid]), __fadd_rn(b.tsum[tid], b.tsum[kStats + tid]));
            b.m[tid] = m_new;
        }
    }
}

// O^T = alpha O^T + V^T P^T: warp -> head dims 16*warp.., each row's two k-steps (positions 0-15, 16-31) in
// order. V is in staged rows v_row.. (below ctx; a tail tile gathers each row's through its table). The A
// fragments (V^T) come from the position-major V by transposing ldmatrix rows: matrix i = lane / 8 -> head
// dims +8 (i & 1), positions +8 (i >> 1).
__device__ __forceinline__ void output_phase(const Block& b, float (&o)[kMaxRows][4], bool tail, uint32_t active,
                                             uint32_t n, uint32_t v_row) {
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, t = lane & 3u;
    const uint32_t v_pos = 8u * (lane >> 4) + (lane & 7u), v_dim = 16u * warp + 8u * ((lane >> 3) & 1u);
    // this lane's ldmatrix row of a row's P fragments: query column lane % 8, positions +8 (lane / 8)
    const __half* p_row = b.p + (lane & 7u) * kPStride + 8u * (lane >> 3);
    if (!tail) {
        // Every row of the block is active: rows go in steps of kRowChunk with no per-row branch. A step's
        // rows past n are rows no tile of this block touches: P zero (never written), alpha 1, never output.
        uint32_t va[2][4];
        ldsm_x4<true>(va[0], b.kv + (v_row + v_pos) * kKStride + v_dim);
        ldsm_x4<true>(va[1], b.kv + (v_row + 16u + v_pos) * kKStride + v_dim);
#pragma unroll
        for (uint32_t c = 0; c < kMaxRows / kRowChunk; c++) {
            if (c * kRowChunk >= n) break;
#pragma unroll
            for (uint32_t i = 0; i < kRowChunk; i++) {
                const uint32_t r = c * kRowChunk + i;
                uint32_t pb[4];
                ldsm_x4<false>(pb, p_row + r * kQPad * kPStride);
                const float a0 = b.alpha[r * kQPad + 2u * t], a1 = b.alpha[r * kQPad + 2u * t + 1u];
                o[r][0] = __fmul_rn(o[r][0], a0);
                o[r][1] = __fmul_rn(o[r][1], a1);
                o[r][2] = __fmul_rn(o[r][2], a0);
                o[r][3] = __fmul_rn(o[r][3], a1);
                mma16816(o[r], va[0], pb[0], pb[1]);
                mma16816(o[r], va[1], pb[2], pb[3]);
            }
        }
    } else {
#pragma unroll
        for (uint32_t r = 0; r < kMaxRows; r++) {
            if (!((active >> r) & 1u)) continue;
            const float a0 = b.alpha[r * kQPad + 2u * t], a1 = b.alpha[r * kQPad + 2u * t + 1u];
            o[r][0] = __fmul_rn(o[r][0], a0);
            o[r][1] = __fmul_rn(o[r][1], a1);
            o[r][2] = __fmul_rn(o[r][2], a0);
            o[r][3] = __fmul_rn(o[r][3], a1);
            uint32_t pb[4];
            ldsm_x4<false>(pb, p_row + r * kQPad * kPStride);
#pragma unroll
            for (uint32_t kk = 0; kk < kTile / 16; kk++) {
                uint32_t va[4];
                ldsm_x4<true>(va, b.kv + b.srow[r * kTile + 16u * kk + v_pos] * kKStride + v_dim);
                mma16816(o[r], va, pb[2 * kk], pb[2 * kk + 1]);
            }
        }
    }
}

// Scores S^T = K Q^T of local row r0 (and r0 + 1 with kTwo) over all 32 positions of a tile below ctx, k-steps
// 0..15 in order for each (row, m-tile): each k-step loads the rows' Q fragments once and the two m-tiles' K
// fragments once, and each accumulator sees score()'s operands in score()'s order.
template <bool kTwo>
__device__ __forceinline__ void scores_tile(const Block& b, float (&acc)[2][2][4], uint32_t r0, uint32_t lane) {
    const __half* q0 = q_row(b, r0, lane);
    const __half* q1 = q_row(b, r0 + 1u, lane);
    // this lane's ldmatrix row: matrix i = lane / 8 -> positions +8 (i & 1), head dims +8 (i >> 1)
    const __half* k0 = b.kv + (8u * ((lane >> 3) & 1u) + (lane & 7u)) * kKStride + 8u * (lane >> 4);
    const __half* k1 = k0 + 16u * kKStride;
#pragma unroll 2
    for (uint32_t kp = 0; kp < kHeadDim / 32; kp++) {
        uint32_t b0[4], b1[4];
        ldsm_x4<false>(b0, q0 + 32u * kp);
        if (kTwo) ldsm_x4<false>(b1, q1 + 32u * kp);
#pragma unroll
        for (uint32_t s = 0; s < 2; s++) {
            const uint32_t kk = 2u * kp + s;
            uint32_t a0[4], a1[4];
            ldsm_x4<false>(a0, k0 + 16u * kk);
            ldsm_x4<false>(a1, k1 + 16u * kk);
            mma16816(acc[0][0], a0, b0[2 * s], b0[2 * s + 1]);
            mma16816(acc[0][1], a1, b0[2 * s], b0[2 * s + 1]);
            if (kTwo) {
                mma16816(acc[1][0], a0, b1[2 * s], b1[2 * s + 1]);
                mma16816(acc[1][1], a1, b1[2 * s], b1[2 * s + 1]);
            }
        }
    }
}

// A score warp's part of a tile below ctx (warp w < kScoreWarps: local row w, or rows 2w and 2w + 1 with kTwo):
// the scores of its rows over the whole tile, then their P, sums and rescale factors, with score_phase's and
// softmax_phase's operations: the same b.tmax, b.p, b.tsum and b.alpha, and each new max taken from the two
// halves' maxima as softmax_phase takes them, from registers instead of b.tmax. Its shared-memory reads (the
// rows' ends and running maxima, which nothing writes during the phase) come first, so that no store orders
// them, and the rows' chains of shuffles and exponentials sit in one branch-free block, where they overlap
// instead of running one (row, column) after another.
template <bool kTwo>
__device__ __forceinline__ void score_softmax(const Block& b, uint32_t r0, uint32_t t0, float scale) {
    constexpr uint32_t kRows = kTwo ? 2u : 1u;
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    uint32_t end[kRows];
    float m_old[kRows][2];
#pragma unroll
    for (uint32_t k = 0; k < kRows; k++) {
        end[k] = b.end[r0 + k];
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) m_old[k][c] = b.m[(r0 + k) * kQPad + 2u * t + c];
    }
    float acc[2][2][4] = {};
    scores_tile<kTwo>(b, acc, r0, lane);
    float mx[kRows][2][2];  // [row][m-tile][c]: the half-tile's max of query column 2t + c
#pragma unroll
    for (uint32_t k = 0; k < kRows; k++)
#pragma unroll
        for (uint32_t mt = 0; mt < 2; mt++) mask_scores(b, acc[k][mt], r0 + k, end[k], mt, t0, scale, mx[k][mt]);
#pragma unroll
    for (uint32_t k = 0; k < kRows; k++) {
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) {
            const uint32_t r = r0 + k, st = r * kQPad + 2u * t + c;
            const float m_new = fmaxf(m_old[k][c], fmaxf(mx[k][0][c], mx[k][1][c]));
#pragma unroll
            for (uint32_t mt = 0; mt < 2; mt++) write_p(b, acc[k][mt], r, mt, c, m_new);
            if (g == 0) b.alpha[st] = expf(m_old[k][c] - m_new);  // 0 on the row's first tile (old max -inf)
        }
    }
}

// The score warps' rows below ctx, where the active rows are 0 .. n-1: warp w has row w, or rows 2w and 2w + 1
// past 8 rows (the second past n when n is odd).
__device__ __forceinline__ void score_softmax_rows(const Block& b, uint32_t warp, uint32_t n, uint32_t t0,
                                                   float scale) {
    const bool pair = n > kScoreWarps;
    const uint32_t r0 = pair ? 2u * warp : warp;
    if (pair && r0 + 1u < n)
        score_softmax<true>(b, r0, t0, scale);
    else if (r0 < n)
        score_softmax<false>(b, r0, t0, scale);
}

// One tile of kTile absolute positions from t0 for the local rows in `active` (below ctx: all n of them).
// `ahead` holds this tile's packed groups on entry and the next tile's (at `next`, if below `block_end`) on exit,
// except that a tile below ctx may stage the next tile's K itself (then `k_ready` is true on exit, and `ahead.k`
// holds the tile after next's).
//
// Below ctx (with ELPIS_MMA_PREFETCH) a tile overlaps its staging with the tensor-core phases, whose time is
// mostly shared-memory reads. K and V have rows of their own. Warps 0..7 compute the scores and P of whole rows
// (one each, or two past 8 rows; each k-step's fragments serve both m-tiles and both rows, so a tile reads 25 %
// fewer shared-memory bytes than score_phase's split, and P needs no barrier after the scores) while warps
// 8..15 dequantise V; then every warp runs the output, staging the next tile's K on the way (odd warps before,
// even ones after). Two barriers a tile instead of four. Every staged value and every instruction on a row's
// operands are the sequential order's, so are the bits. Tail tiles (and the direct staging's build) keep the
// sequential order in rows 0..kStaged-1.
__device__ __forceinline__ void run_tile(const Block& b, float (&o)[kMaxRows][4], Ahead& ahead, bool& k_ready,
                                         uint32_t t0, uint32_t block_end, uint32_t n, uint32_t rows, uint32_t ctx,
                                         float scale, uint32_t h, const uint32_t* __restrict__ qk,
                                         const __half* __restrict__ sk, const uint32_t* __restrict__ qv,
                                         const __half* __restrict__ sv, const int32_t* __restrict__ block_table,
                                         long long& clk) {
    const uint32_t tid = threadIdx.x, warp = tid >> 5;
    const bool tail = t0 + kTile > ctx;  // holds positions >= ctx: rows read their own tree slots
    const uint32_t staged = tail ? kStaged : kTile;
    const uint32_t next = t0 + kTile;
    // Below ctx every local row of the block is active in every tile (its span reaches past ctx and its split's
    // end past the tile), so the active rows are the prefix 0 .. n-1; a tail tile checks each row's end.
    uint32_t active = (1u << n) - 1u;
#if ELPIS_MMA_PREFETCH
    if (!tail) {
        ELPIS_PHASE(0);
        if (!k_ready) {  // the block's first tile
            stage_ahead<kKBits>(b, ahead.k, qk, sk, block_table, false, h, t0, ctx);
            if (next < block_end) ahead.k = fetch_ahead<kKBits>(qk, sk, block_table, next, ctx, h);
            __syncthreads();
        }
        ELPIS_PHASE(1);
        // the next tile below ctx, unless past the block (a tail tile's staged rows overlap V's)
        const bool below_next = next < block_end && next + kTile <= ctx;
        if (warp < kScoreWarps) {
            score_softmax_rows(b, warp, n, t0, scale);
        } else {
            stage_v_groups<kVBits>(b, ahead.v);
            if (below_next) ahead.v = fetch_v_group<kVBits>(qv, sv, block_table, next, ctx, h);
        }
        __syncthreads();
        ELPIS_PHASE(2);
        const bool stage_first = (warp & 1u) != 0u;
        update_stats(b, active);
        const bool k_first = below_next && stage_first, k_last = below_next && !stage_first;
        if (k_first) stage_ahead<kKBits>(b, ahead.k, qk, sk, block_table, false, h, next, ctx);
        output_phase(b, o, false, active, n, kVRow);
        if (k_last) stage_ahead<kKBits>(b, ahead.k, qk, sk, block_table, false, h, next, ctx);
        if (below_next && next + kTile < block_end)
            ahead.k = fetch_ahead<kKBits>(qk, sk, block_table, next + kTile, ctx, h);
        k_ready = below_next;
        __syncthreads();  // the next tile reads K and (m, l) and restages V and P
        ELPIS_PHASE(5);
        return;
    }
#endif
    // The slot and staged-row tables serve the tail tile only (rows read their own tree slots there); a tile
    // below ctx stages its own 32 positions for every row, so it skips them and their barrier. The direct
    // staging reads b.slot on every tile.
    if (tail) {
        active = 0;
        for (uint32_t r = 0; r < kMaxRows; r++) active |= (b.end[r] > t0 ? 1u : 0u) << r;
    }
    if (tid < staged) {
        uint32_t slot = kNoSlot;
        if (tid < kTile) {
            if (t0 + tid < ctx) slot = t0 + tid;
        } else if (tid < kZeroRow) {
            if (tid - kTreeRow < rows) slot = ctx + (tid - kTreeRow);
        }
        b.slot[tid] = slot;
    }
    // Each (row, position) of the tile looks its staged row up once, here, one per thread: the tail paths
    // below then read a table instead of inlining the slot map (a 16-step walk of the ancestor mask) at
    // every use.
    static_assert(kMaxRows * kTile <= kThreads && kZeroRow < 256, "one table entry per thread, in a byte");
    // (the first clause folds the guard away in the 16-row build, which keeps that build's code as it was)
    if (kMaxRows * kTile == kThreads || tid < kMaxRows * kTile) {
        const uint32_t r = tid / kTile, i = tid % kTile;
        b.srow[tid] = static_cast<uint8_t>(((active >> r) & 1u) ? staged_row(b, r, t0 + i, t0, ctx) : kZeroRow);
    }
    __syncthreads();
    ELPIS_PHASE(0);
#if ELPIS_MMA_PREFETCH
    stage_ahead<kKBits>(b, ahead.k, qk, sk, block_table, tail, h, t0, ctx);
    if (next < block_end) ahead.k = fetch_ahead<kKBits>(qk, sk, block_table, next, ctx, h);
#else
    stage<kKBits>(b, qk, sk, block_table, staged, h);
#endif
    __syncthreads();
    ELPIS_PHASE(1);
    const TileRows w = tile_rows(warp, n);
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    score_phase(b, acc, w, tail, active, t0, scale);
    __syncthreads();
    ELPIS_PHASE(2);
    softmax_phase(b, acc, w, active);
#ifdef ELPIS_MMA_CLOCKS
    __syncthreads();
    ELPIS_PHASE(3);
#endif
    // The direct staging, in either build (only a block's last tiles are tail tiles, so nothing is loaded
    // ahead for their V): the zero row's slot stays kNoSlot; tree rows and the tile's committed rows as for K.
    stage<kVBits>(b, qv, sv, block_table, staged, h);
    __syncthreads();
    ELPIS_PHASE(4);
    update_stats(b, active);
    output_phase(b, o, tail, active, n, 0);
    __syncthreads();  // the next tile restages K, V and P and reads (m, l)
    ELPIS_PHASE(5);
}

// The fold's queries (ELPIS_MMA_HADAMARD_FOLD): each 32-value group of the block's query heads rotated once, in
// fp32 - the Hadamard's butterflies over index bits 0..4 in order, then fp32(1/sqrt(32)), each operation rounded
// once - and staged as fp16. Query group i: local head i / 8 (lr * kGroup + j), head-dim group i % 8.
__device__ __forceinline__ void stage_folded_queries(const Block& b, const __half* __restrict__ q, uint32_t n,
                                                     uint32_t h) {
    for (uint32_t i = threadIdx.x; i < n * kGroup * kQGroupsPerHead; i += kThreads) {
        const uint32_t head = i / kQGroupsPerHead, grp = i % kQGroupsPerHead;
        const uint32_t lr = head / kGroup, j = head % kGroup, row = blockIdx.z + lr * gridDim.z;
        const __half* src = q + (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * kHeadDim + grp * kQGroup;
        __align__(16) __half vals[kQGroup];
        const uint4* src4 = reinterpret_cast<const uint4*>(src);
        uint4* vals4 = reinterpret_cast<uint4*>(vals);
#pragma unroll
        for (uint32_t c = 0; c < 4; c++) vals4[c] = src4[c];
        float v[kQGroup];
#pragma unroll
        for (uint32_t k = 0; k < kQGroup; k++) v[k] = __half2float(vals[k]);
        hadamard_butterflies(v);
#pragma unroll
        for (uint32_t k = 0; k < kQGroup; k++) vals[k] = __float2half_rn(__fmul_rn(v[k], kRsqrt32));
        uint4* dst = reinterpret_cast<uint4*>(b.q + head * kQStride + grp * kQGroup);
#pragma unroll
        for (uint32_t c = 0; c < 4; c++) dst[c] = vals4[c];
    }
}

// One block: split `gridDim.y - 1 - blockIdx.y`, K/V head `blockIdx.x`, rows blockIdx.z + lr * gridDim.z whose
// span reaches the split. Writes the split's partial (max, sum, acc[256]) per (row, query head), as
// tree_attention.cu does.
__global__ void ELPIS_MMA_BOUNDS tree_attention_mma_split(
    const __half* __restrict__ q, const uint32_t* __restrict__ qk, const __half* __restrict__ sk,
    const uint32_t* __restrict__ qv, const __half* __restrict__ sv, const int32_t* __restrict__ block_table,
    const uint32_t* __restrict__ depth, const uint32_t* __restrict__ ancestors, uint32_t rows, const CtxArg ctx_arg,
    float scale, uint32_t max_splits, float* __restrict__ part_acc, float* __restrict__ part_ml) {
    ELPIS_DYNAMIC_SMEM(smem, kSmemBytes);
    const uint32_t ctx = ctx_of(ctx_arg);  // a split past the context's last one finds no row and writes nothing
    float* stats = reinterpret_cast<float*>(smem + kOffStats);
    const Block b{reinterpret_cast<__half*>(smem),
                  reinterpret_cast<__half*>(smem + kOffKV),
                  reinterpret_cast<__half*>(smem + kOffP),
                  reinterpret_cast<__half*>(smem + kOffQZero),
                  stats,
                  stats + kStats,
                  stats + 2 * kStats,
                  stats + 3 * kStats,
                  stats + 5 * kStats,
                  reinterpret_cast<uint32_t*>(smem + kOffSlots),
                  reinterpret_cast<uint32_t*>(smem + kOffRows),
                  reinterpret_cast<uint32_t*>(smem + kOffRows) + kMaxRows,
                  reinterpret_cast<uint8_t*>(smem + kOffSrow)};
    // Blocks start in the order of their linear index (x fastest), so the grid runs the heads fastest and the
    // splits last to first: the long splits past 4096, 16384 and 65536 positions start before the short ones
    // below them, longest first, and the short ones fill in behind (started in split order, a 32K call's 16-tile
    // blocks came last and ran alone). Which block computes a split does not change its arithmetic.
    const uint32_t split = gridDim.y - 1u - blockIdx.y, h = blockIdx.x, tid = threadIdx.x;
    const uint32_t lane = tid & 31u, warp = tid >> 5, g = lane >> 2, t = lane & 3u;
    const uint32_t begin = elpis_sched_split_begin(split);
    // Rows are dealt round-robin to gridDim.z blocks per (split, head): local row lr is global row
    // blockIdx.z + lr * gridDim.z. A row's arithmetic does not depend on which rows share its block.
    const uint32_t n = rows > blockIdx.z ? (rows - blockIdx.z + gridDim.z - 1) / gridDim.z : 0u;

    if (tid < kMaxRows) {
        uint32_t end = 0, mask = 0;
        if (tid < n) {
            const uint32_t row = blockIdx.z + tid * gridDim.z;
            const uint32_t span = elpis_sched_span(ctx, depth[row]);
            if (split < elpis_sched_splits(span)) end = elpis_sched_split_end(span, split);
            mask = ancestors[row];
        }
        b.end[tid] = end;
        b.mask[tid] = mask;
    }
    if (tid == 0) b.slot[kZeroRow] = kNoSlot;
    if (kFold) {
        stage_folded_queries(b, q, n, h);
    } else {
        constexpr uint32_t kChunks = kHeadDim / 8;  // 16-byte chunks of a query head
        for (uint32_t i = tid; i < n * kGroup * kChunks; i += kThreads) {
            const uint32_t head = i / kChunks, c = i % kChunks;  // head = lr * kGroup + j
            const uint32_t lr = head / kGroup, j = head % kGroup, row = blockIdx.z + lr * gridDim.z;
            const uint4* src = reinterpret_cast<const uint4*>(
                q + (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * kHeadDim);
            reinterpret_cast<uint4*>(b.q + head * kQStride)[c] = src[c];
        }
    }
    for (uint32_t i = tid; i < kStats * kPStride / 2; i += kThreads) reinterpret_cast<uint32_t*>(b.p)[i] = 0;
    if (tid < kQStride / 2) reinterpret_cast<uint32_t*>(b.qzero)[tid] = 0;
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

#ifdef ELPIS_MMA_CLOCKS
    long long clk = clock64();
    const long long clk0 = clk;
    unsigned long long ns0 = 0;
    if (clocked_block()) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
#else
    long long clk = 0;  // unused: phases are timed in the diagnostic build only
#endif
    Ahead ahead;
#if ELPIS_MMA_PREFETCH
    if (begin < block_end) {
        ahead.k = fetch_ahead<kKBits>(qk, sk, block_table, begin, ctx, h);
        if (begin + kTile <= ctx) ahead.v = fetch_v_group<kVBits>(qv, sv, block_table, begin, ctx, h);
    }
#endif
    bool k_ready = false;  // K of the next tile already staged (run_tile)
    for (uint32_t t0 = begin; t0 < block_end; t0 += kTile) {
        run_tile(b, o, ahead, k_ready, t0, block_end, n, rows, ctx, scale, h, qk, sk, qv, sv, block_table, clk);
#ifdef ELPIS_MMA_CLOCKS
        if (clocked_block()) g_phase_cycles[6] += 1;
#endif
    }
#ifdef ELPIS_MMA_CLOCKS
    if (clocked_block()) {
        unsigned long long ns1 = 0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
        g_phase_cycles[7] += clock64() - clk0;
        g_phase_cycles[8] += ns1 - ns0;
        g_phase_cycles[9] += 1;
    }
#endif

#pragma unroll
    for (uint32_t r = 0; r < kMaxRows; r++) {
        if (b.end[r] == 0) continue;
        const uint32_t row = blockIdx.z + r * gridDim.z;
#pragma unroll
        for (uint32_t e = 0; e < 4; e++) {
            const uint32_t d = 16u * warp + g + (e >= 2 ? 8u : 0u), j = 2u * t + (e & 1u);
            if (j >= kGroup) continue;
            const size_t part = (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * max_splits + split;
            part_acc[part * kHeadDim + d] = o[r][e];
        }
    }
    if (tid < kMaxRows * kGroup) {
        const uint32_t r = tid / kGroup, j = tid % kGroup;
        if (b.end[r] != 0) {
            const uint32_t row = blockIdx.z + r * gridDim.z;
            const size_t part = (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * max_splits + split;
            part_ml[part * 2] = b.m[r * kQPad + j];
            part_ml[part * 2 + 1] = b.l[r * kQPad + j];
        }
    }
}

// Blocks per (split, K/V head): one serves every row, which dequantises each tile once. Only when the grid
// would leave multiprocessors idle are the rows dealt to several blocks, and never past one wave (one block
// per SM: the kernel's registers allow no more). A block's time is set by its tiles, not its rows (on the
// H200, 16 rows cost 1.2x 8 rows), so a second wave of blocks that repeat the same tiles costs their full
// time again: at 32K the 8-row kernel took 0.38 ms with one block per split (device call 13) and 0.55 ms
// with the rows dealt to two (call 15, direct staging both times).
uint32_t row_groups(uint32_t rows, uint32_t max_splits) {
    int device = 0, sms = 1;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        sms = 1;
    const uint32_t blocks = max_splits * kKvHeads;
    const uint32_t fit = static_cast<uint32_t>(sms) / blocks;  // blocks per (split, head) in one wave
    return fit < 1u ? 1u : (fit > rows ? rows : fit);
}

// The split kernel's shared-memory opt-in, once per process; 0 or a cudaError_t.
int allow_split_smem() {
    static bool done = false;
    return allow_dynamic_smem(tree_attention_mma_split, kSmemBytes, done);
}

// Both entries: `max_splits` (the grid and the partial buffers' stride) covers every row's span.
int launch_mma(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
               const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors, uint32_t rows,
               const CtxArg ctx, uint32_t max_splits, float scale, void* out, float* lse, float* workspace,
               cudaStream_t s) {
    if (max_splits > kMaxGridY) return static_cast<int>(cudaErrorInvalidValue);
    if (const int err = allow_split_smem()) return err;
    float* part_acc = workspace;
    float* part_ml = workspace + static_cast<uint64_t>(rows) * kQHeads * max_splits * kHeadDim;
    tree_attention_mma_split<<<dim3(kKvHeads, max_splits, row_groups(rows, max_splits)), kThreads, kSmemBytes, s>>>(
        static_cast<const __half*>(q), static_cast<const uint32_t*>(qk), static_cast<const __half*>(sk),
        static_cast<const uint32_t*>(qv), static_cast<const __half*>(sv), block_table, depth, ancestors, rows, ctx,
        scale, max_splits, part_acc, part_ml);
    tree_attention_combine<kFold><<<dim3(rows, kQHeads), kHeadDim, 0, s>>>(depth, ctx, max_splits, part_acc, part_ml,
                                                                          static_cast<__half*>(out), lse);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

uint32_t elpis_tree_attention_qcache_bits(void) { return kKBits * 16u + kVBits; }

uint32_t elpis_tree_attention_mma_smem_bytes(void) { return static_cast<uint32_t>(kSmemBytes); }

// The rows a call of this build may have (ELPIS_BUILD_MAX_ROWS, or the schedule's 16).
uint32_t elpis_tree_attention_mma_max_rows(void) { return kMaxRows; }

#ifndef ELPIS_CUDA_EMU
// Blocks of the split kernel one multiprocessor of the current GPU holds at once (its registers and shared
// memory), or a negative cudaError_t (diagnostics: a build asking for two gets them where shared memory allows).
int elpis_tree_attention_mma_blocks_per_sm(void) {
    if (const int err = allow_split_smem()) return -err;
    int blocks = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tree_attention_mma_split, kThreads, kSmemBytes);
    return err == cudaSuccess ? blocks : -static_cast<int>(err);
}
#endif

#ifdef ELPIS_MMA_CLOCKS
// The diagnostic build's counters (see ELPIS_PHASE): copied to `out` [kClockSlots], then zeroed.
int elpis_tree_attention_mma_clocks(unsigned long long* out) {
    cudaError_t err = cudaMemcpyFromSymbol(out, g_phase_cycles, sizeof(g_phase_cycles));
    if (err != cudaSuccess) return static_cast<int>(err);
    const unsigned long long zeros[kClockSlots] = {};
    return static_cast<int>(cudaMemcpyToSymbol(g_phase_cycles, zeros, sizeof(zeros)));
}
#endif

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
    return launch_mma(q, qk, sk, qv, sv, block_table, depth, ancestors, rows, CtxArg{ctx, nullptr},
                      elpis_tree_attention_max_splits(ctx, max_depth), scale, out, lse, workspace,
                      static_cast<cudaStream_t>(stream));
}

// The CUDA-graph form: the context is read from ctx_dev (uint32 [1], device memory) when the kernels run,
// so one captured launch serves every context up to max_ctx; the grid and the workspace are sized for
// max_ctx and a depth of rows - 1 (splits past a row's span find nothing to do and write nothing). The
// caller keeps ctx <= max_ctx and the block table covering slots 0 .. ctx+rows-1. Same arithmetic as
// elpis_tree_attention_mma at the same context: only where ctx comes from and the buffers' stride differ.
int elpis_tree_attention_mma_dev(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                                 const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors,
                                 uint32_t rows, const uint32_t* ctx_dev, uint32_t max_ctx, float scale, void* out,
                                 float* lse, float* workspace, uint64_t workspace_floats, void* stream) {
    if (rows == 0 || rows > kMaxRows || ctx_dev == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (workspace_floats < elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1))
        return static_cast<int>(cudaErrorInvalidValue);
    return launch_mma(q, qk, sk, qv, sv, block_table, depth, ancestors, rows, CtxArg{0, ctx_dev},
                      elpis_tree_attention_max_splits(max_ctx, rows - 1), scale, out, lse, workspace,
                      static_cast<cudaStream_t>(stream));
}

}  // extern "C"
