// Tree-verify attention for long contexts: tree_attention_mma.cu's fold build (ELPIS_MMA_HADAMARD_FOLD 1, the
// served one) with the cache's values dequantised straight into tensor-core fragments, never staged as fp16.
//
// Why: at 262K the served kernel spends ~6,500 cycles on a 32-position tile with 8 rows, against ~1,000 of
// tensor work (bench/results/tree/README.md, sessions 31-47). Its score warps wait on ldmatrix of K that the
// staging warps dequantised into shared memory, behind two block barriers a tile, with one row each (two
// dependent mma chains). Here the packed 3-bit words (3/16 of the fp16 bytes) are copied to shared memory with
// cp.async a pass ahead, and every lane decodes the values its own fragments need:
// - scores: warp w takes the 16 positions 16 (w % 8).. of a 128-position pass and the local rows of parity
//   w / 8 (up to 4 independent mma chains a warp); its K fragment of each k-step is decoded once and serves
//   those rows;
// - output: warp w takes head dims 16 w.. as in the served kernel; its V^T fragment of each k-step is decoded
//   once (each V value by one lane of the block) and serves every row.
//
// Same bits as the served fold build, by construction:
// - a value is fp16_rn((float(code) - mid) * (scale / 2^(bits-1))), the fold's staging (code_value with
//   group_raw_step), with the code's float made exactly as decode_half makes it;
// - every fragment holds the halves ldmatrix gives the served kernel, so every mma.sync sees the served
//   operands, chained in the served order: a score's 16 k-steps in order from zero; per 32-position tile
//   (the softmax's unit, kept) the running output rescaled, then its two k-steps;
// - the softmax is the served one per 32-position tile, in tile order: the tile's exact max from its two
//   halves' maxima, P = fp16(exp(s - max)), the halves' sums by the same butterfly, l = l * alpha + (sum0 +
//   sum1). A pass computes the scores of its 4 tiles first and then runs their statistics in tile order.
// So a row's bits do not depend on which kernel computes it, and the emulated and GPU tests compare the two
// builds bit for bit. Positions past a row's span (the served zero row) give zero fragments, as staged zeros do.
//
// A block serves at most kRows local rows (rows are dealt round-robin to blockIdx.z, as in the served kernel;
// a row's arithmetic does not depend on its block's other rows). Ampere instructions only (mma.sync,
// ldmatrix, cp.async); dynamic shared memory kSmemBytes (under sm_86's 99 KB).
#include "tree_attention_common.cuh"

namespace {

constexpr uint32_t kKBits = ELPIS_QCACHE_K_BITS;
constexpr uint32_t kVBits = ELPIS_QCACHE_V_BITS;
// An 8-bit plane's field of lane t's values would need a per-lane word index (see k_pairs).
static_assert(kKBits < 8 && kVBits < 8, "the in-register decoding takes 2..7 bits");
constexpr uint32_t kTile = 32;                      // the served kernel's tile: the softmax's unit
// Tiles a pass (4 served; the emulated tests also build 1 and 2, so that short contexts run several passes a block).
#ifndef ELPIS_LONG_TILES
#define ELPIS_LONG_TILES 4
#endif
constexpr uint32_t kTiles = ELPIS_LONG_TILES;
constexpr uint32_t kPass = kTile * kTiles;          // positions a pass
constexpr uint32_t kWarps = 16;                     // warp w owns head dims 16w.. of the output
constexpr uint32_t kThreads = kWarps * 32;
constexpr uint32_t kRows = 8;                       // local rows a block
// Score warps per 16 positions (ELPIS_LONG_SCORE_CLASSES, 1 or 2): with 1, warps 0..7 score every row and warps
// 8..15 wait; with 2, warps 8..15 take rows 4..7 of the same positions and decode the same K fragments again.
#ifndef ELPIS_LONG_SCORE_CLASSES
#define ELPIS_LONG_SCORE_CLASSES 1
#endif
constexpr uint32_t kClasses = ELPIS_LONG_SCORE_CLASSES;
constexpr uint32_t kRowsPerWarp = kRows / kClasses;  // class c: local rows c * kRowsPerWarp ..
constexpr uint32_t kQPad = 8;                       // an n-tile: one row's 6 query heads and 2 zero columns
constexpr uint32_t kStats = kRows * kQPad;          // (row, query column) pairs
constexpr uint32_t kTreeRow = kPass;                // staged row of tree slot ctx + j: kTreeRow + j
constexpr uint32_t kStagedRows = kPass + kMaxRows;  // a pass's positions and the tree slots
constexpr uint8_t kZeroRow = 0xff;                  // staged-row table: a position past the row's span
constexpr uint32_t kPStride = kTile + 8;            // halves per P query row (conflict-free ldmatrix)
constexpr uint32_t kQStride = kHeadDim + 8;         // halves per staged query head (conflict-free ldmatrix)

static_assert(kHeadDim / 16 == kWarps && kPass / 16 <= kWarps / 2 && (kClasses == 1 || kClasses == 2),
              "the warp layout below");
static_assert(ELPIS_SCHED_SPLIT_MIN % kPass == 0, "passes never straddle a split");
static_assert(kStagedRows < kZeroRow, "a staged row's index fits the table's byte");

// Packed words of one staged row (one position, one K/V head): 8 groups of kBits words, padded so that the 8
// positions of a fragment's rows fall in distinct banks (a stride that is an odd multiple of 4 words).
template <uint32_t kBits>
struct Packing {
    static constexpr uint32_t kWords = kQGroupsPerHead * kBits;  // a multiple of 8
    static constexpr uint32_t kStride = kWords + 4;
    static constexpr uint32_t kChunks = kWords / 4;  // 16-byte copies of a row's words
    static_assert(kStride % 8 == 4 && (kStride * 4) % 16 == 0, "16-byte rows, conflict-free fragment reads");
};

// Dynamic shared memory (bytes).
constexpr size_t kQBytes = size_t(kRows) * kGroup * kQStride * 2;
constexpr size_t kOffQZero = kQBytes;
constexpr size_t kOffKW = kOffQZero + (size_t(kQStride) * 2 + 15) / 16 * 16;
constexpr size_t kOffKS = kOffKW + size_t(kStagedRows) * Packing<kKBits>::kStride * 4;
constexpr size_t kOffVW = kOffKS + size_t(kStagedRows) * kQGroupsPerHead * 2;
constexpr size_t kOffVS = kOffVW + size_t(kStagedRows) * Packing<kVBits>::kStride * 4;
constexpr size_t kOffP = kOffVS + size_t(kStagedRows) * kQGroupsPerHead * 2;
constexpr size_t kOffStats = kOffP + size_t(kTiles) * kStats * kPStride * 2;
constexpr uint32_t kStatFloats = 2 * kStats + 5 * kTiles * kStats;  // m, l; tmax, tsum [tile][half]; alpha
constexpr size_t kOffRows = kOffStats + size_t(kStatFloats) * 4;
constexpr size_t kOffSrow = kOffRows + (2 * kRows + kTiles) * 4;
constexpr size_t kSmemBytes = kOffSrow + size_t(kRows) * kPass;
static_assert(kSmemBytes <= 99 * 1024, "an RTX 3090 block gets at most 99 KB of shared memory");
static_assert(kOffKW % 16 == 0 && kOffKS % 16 == 0 && kOffVW % 16 == 0 && kOffVS % 16 == 0 && kOffP % 16 == 0 &&
                  (kPStride * 2) % 16 == 0 && (kQStride * 2) % 16 == 0,
              "16-byte copies and ldmatrix rows");

struct Block {
    __half* q;        // [kRows][kGroup][kQStride] the fold's rotated queries
    __half* qzero;    // [kQStride] zeros: the padding query columns' rows
    uint32_t* kw;     // [kStagedRows][Packing<kKBits>::kStride] packed K words of head h
    __half* ks;       // [kStagedRows][8] K scales
    uint32_t* vw;     // V likewise
    __half* vs;
    __half* p;        // [kTiles][kStats][kPStride]
    float* m;         // [kStats] running max
    float* l;         // [kStats] running sum
    float* tmax;      // [kTiles][2][kStats] a tile's max per half (16 positions)
    float* tsum;      // [kTiles][2][kStats] a tile's sum of P per half
    float* alpha;     // [kTiles][kStats] a tile's rescale factor
    uint32_t* end;    // [kRows] end of the row's positions in this split (0: the row is not in it)
    uint32_t* mask;   // [kRows]
    uint32_t* act;    // [kTiles] local rows active in each tile of the pass (positions of theirs reach it)
    uint8_t* srow;    // [kRows][kPass] staged row of (row, position of the pass) in a pass that reaches ctx
};

// mma.sync m16n8k16 and ldmatrix x4, as in tree_attention_mma.cu (fragment layouts there).
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

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* row) {
#ifdef ELPIS_CUDA_EMU
    emu_ldmatrix_x4(r, row, false);
#else
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

// 16 bytes global -> shared, asynchronously (cp.async, Ampere); a group of them completes at copy_wait.
__device__ __forceinline__ void copy16(void* dst, const void* src) {
#ifdef ELPIS_CUDA_EMU
    std::memcpy(dst, src, 16);
#else
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
#endif
}

__device__ __forceinline__ void copy_commit() {
#ifndef ELPIS_CUDA_EMU
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most one committed group of this thread is still in flight (the newest).
__device__ __forceinline__ void copy_wait_all_but_newest() {
#ifndef ELPIS_CUDA_EMU
    asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}

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

// Two fp16 values as one fragment register, the first in the low half (what ldmatrix gives).
__device__ __forceinline__ uint32_t pack_halves(float lo, float hi) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}

__device__ __forceinline__ uint32_t as_u32(__half2 h) {
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

// The decoding in fp16 pairs. A value is fp16_rn((float(code) - mid) * step) with step = scale / 2^(bits-1)
// (group_raw_step, code_value). In fp32 both operations are exact - code - mid is a half-integer of at most 8
// significant bits, step an fp16 times a power of two, their product at most 19 bits - so the value is the
// exact product rounded once to fp16. The same comes out of fp16 arithmetic whenever step itself is an fp16
// (it is unless scale / 2^(bits-1) falls below fp16's subnormal quantum): 512 + code has the fp16 bits
// 0x6000 | (code << 1) (the ulp in [512, 1024) is 1/2), (512 + code) - (512 + mid) is exact, and the product
// with step is rounded once (HMUL2, IEEE round-to-nearest with subnormals). A group whose step is not an fp16
// takes the fp32 operations instead.
template <uint32_t kBits>
__device__ __forceinline__ uint32_t biased_pair_bits(uint32_t code_pair) {
    return 0x60006000u | (code_pair << 1);
}

template <uint32_t kBits>
__device__ __forceinline__ uint32_t decode_pair(uint32_t code_pair, __half2 step2) {
    constexpr float kMid = 512.0f + static_cast<float>(1u << (kBits - 1)) - 0.5f;
    const __half2 mid2 = __float2half2_rn(kMid);  // exact: a half-integer below 1024
    return as_u32(__hmul2(__hsub2(as_half2(biased_pair_bits<kBits>(code_pair)), mid2), step2));
}

// The step of a group in fp32 and in fp16, and whether the fp16 one is exact (the pair decoding's condition).
struct Step {
    float f;
    __half h;
    bool exact;
};

template <uint32_t kBits>
__device__ __forceinline__ Step group_steps(__half scale) {
    Step s;
    s.f = group_raw_step<kBits>(scale);
    s.h = __float2half_rn(s.f);
    s.exact = __half2float(s.h) == s.f;  // false for NaN, true for 0 and inf
    return s;
}

// (float(code) - mid) * step in fp32 for a code's biased bits: 2^22 + code has the bits 0x4A800000 |
// (code << 1), and (2^22 + code) - (2^22 + mid) is exact (tree_attention_mma.cu's half_value).
template <uint32_t kBits>
__device__ __forceinline__ float biased_value(uint32_t code_bits, float step) {
    constexpr float kBiasedMid = 4194304.0f + (static_cast<float>(1u << (kBits - 1)) - 0.5f);
    return __fmul_rn(__fsub_rn(__int_as_float(static_cast<int>(0x4A800000u | code_bits)), kBiasedMid), step);
}

// Codes of values kC + 2t (low half) and kC + 2t + 1 (high half) of a group whose words are in registers: a plane
// of width w keeps value j's field at plane bit j * w. For the pairs a lane reads (kC in {0, 8, 16, 24}, t < 4,
// w <= 4) both fields lie in one word fixed by kC; only the shift depends on t.
template <uint32_t kBits, uint32_t kC>
__device__ __forceinline__ uint32_t lane_code_pair(const uint32_t (&w)[kBits], uint32_t t) {
    static_assert(kC % 8 == 0 && kC < 32, "a lane's pairs");
    uint32_t code = 0;
#pragma unroll
    for (uint32_t width = 1; width <= 4; width <<= 1) {
        if (!(kBits & width)) continue;
        const uint32_t base = kBits & ~(2u * width - 1u), bit = kC * width, mask = (1u << width) - 1u;
        const uint32_t x = w[base + (bit >> 5)] >> ((bit & 31u) + 2u * t * width);
        const uint32_t pair = (x & mask) | ((x << (16u - width)) & (mask << 16));
        code |= pair << (kBits & (width - 1u));
    }
    return code;
}

// Code of value j of a group from its words in shared memory (j any lane's own: the word index is computed).
template <uint32_t kBits>
__device__ __forceinline__ uint32_t smem_code(const uint32_t* words, uint32_t j) {
    uint32_t code = 0;
#pragma unroll
    for (uint32_t width = 1; width <= 4; width <<= 1) {
        if (!(kBits & width)) continue;
        const uint32_t base = kBits & ~(2u * width - 1u), bit = j * width;
        code |= ((words[base + (bit >> 5)] >> (bit & 31u)) & ((1u << width) - 1u)) << (kBits & (width - 1u));
    }
    return code;
}

// A pair of codes (low, high halves) as values with steps (s_lo, s_hi): in fp16 pairs when both steps are fp16s,
// else each in fp32 (the same bits).
template <uint32_t kBits>
__device__ __forceinline__ uint32_t pair_values(uint32_t code_pair, const Step& s_lo, const Step& s_hi) {
    if (s_lo.exact && s_hi.exact) return decode_pair<kBits>(code_pair, __halves2half2(s_lo.h, s_hi.h));
    return pack_halves(biased_value<kBits>((code_pair & 0xffffu) << 1, s_lo.f),
                       biased_value<kBits>((code_pair >> 16) << 1, s_hi.f));
}

// Lane (g, t)'s K values of group `grp` at staged row `row` for the k-steps 2 grp (h 0) and 2 grp + 1 (h 1):
// pairs (dims 2t, 2t+1) and (2t+8, 2t+9) of the k-step, as registers [h][e] (e: +8). Zeros for kZeroRow.
__device__ __forceinline__ void k_pairs(const Block& b, uint32_t row, uint32_t grp, uint32_t t,
                                        uint32_t (&pr)[2][2]) {
    if (row == kZeroRow) {
        pr[0][0] = pr[0][1] = pr[1][0] = pr[1][1] = 0u;
        return;
    }
    uint32_t w[kKBits];
    const uint32_t* src = b.kw + row * Packing<kKBits>::kStride + grp * kKBits;
#pragma unroll
    for (uint32_t i = 0; i < kKBits; i++) w[i] = src[i];
    const Step step = group_steps<kKBits>(b.ks[row * kQGroupsPerHead + grp]);
    pr[0][0] = pair_values<kKBits>(lane_code_pair<kKBits, 0>(w, t), step, step);
    pr[0][1] = pair_values<kKBits>(lane_code_pair<kKBits, 8>(w, t), step, step);
    pr[1][0] = pair_values<kKBits>(lane_code_pair<kKBits, 16>(w, t), step, step);
    pr[1][1] = pair_values<kKBits>(lane_code_pair<kKBits, 24>(w, t), step, step);
}

// The A fragments (K, positions x dims) of k-steps 2 grp and 2 grp + 1 for staged rows r_lo (fragment row g) and
// r_hi (row g + 8): a[h] = {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, ldmatrix's layout.
__device__ __forceinline__ void k_fragments(const Block& b, uint32_t r_lo, uint32_t r_hi, uint32_t grp, uint32_t t,
                                            uint32_t (&a)[2][4]) {
    uint32_t lo[2][2], hi[2][2];
    k_pairs(b, r_lo, grp, t, lo);
    k_pairs(b, r_hi, grp, t, hi);
#pragma unroll
    for (uint32_t h = 0; h < 2; h++) {
        a[h][0] = lo[h][0];
        a[h][1] = hi[h][0];
        a[h][2] = lo[h][1];
        a[h][3] = hi[h][1];
    }
}

// Codes of head dims j0 and j0 + 8 of group `grp` at staged row `row`, and the group's steps (a zero row: codes
// and steps 0, whose fp16 products are +0 or -0 by the code's side of mid: the zero row is all +0, so the
// caller keeps its own zeros).
struct VCodes {
    uint32_t c0, c1;
    Step step;
};

__device__ __forceinline__ VCodes v_codes(const Block& b, uint32_t row, uint32_t grp, uint32_t j0) {
    const uint32_t* words = b.vw + row * Packing<kVBits>::kStride + grp * kVBits;
    VCodes c;
    c.c0 = smem_code<kVBits>(words, j0);
    c.c1 = smem_code<kVBits>(words, j0 + 8u);
    c.step = group_steps<kVBits>(b.vs[row * kQGroupsPerHead + grp]);
    return c;
}

// The A fragment (V^T: dims x positions) of one k-step for warp `warp`'s head dims: rows g and g + 8 are dims
// 16 warp + g, +8; columns are the staged rows of positions 2t, 2t+1 (regs 0, 1) and 2t+8, 2t+9 (regs 2, 3).
// A position past the row's span (kZeroRow) gives +0, as the served kernel's zero row.
__device__ __forceinline__ void v_fragment(const Block& b, const uint32_t (&rows)[4], uint32_t warp, uint32_t g,
                                           uint32_t (&a)[4]) {
    const uint32_t grp = warp >> 1, j0 = 16u * (warp & 1u) + g;
    VCodes c[4];
    bool zero[4];
#pragma unroll
    for (uint32_t i = 0; i < 4; i++) {
        zero[i] = rows[i] == kZeroRow;
        c[i] = v_codes(b, zero[i] ? 0u : rows[i], grp, j0);
    }
#pragma unroll
    for (uint32_t k = 0; k < 2; k++) {  // positions 2t, 2t+1 (k 0) and 2t+8, 2t+9 (k 1)
        const VCodes& lo = c[2 * k];
        const VCodes& hi = c[2 * k + 1];
        const uint32_t keep = (zero[2 * k] ? 0u : 0xffffu) | (zero[2 * k + 1] ? 0u : 0xffff0000u);
        a[2 * k] = pair_values<kVBits>(lo.c0 | (hi.c0 << 16), lo.step, hi.step) & keep;
        a[2 * k + 1] = pair_values<kVBits>(lo.c1 | (hi.c1 << 16), lo.step, hi.step) & keep;
    }
}

// This lane's ldmatrix row of local row r's Q fragments for k-steps 2kp, 2kp + 1 (add 32 kp), as in the served
// kernel: padding query columns read the zero row.
__device__ __forceinline__ const __half* q_row(const Block& b, uint32_t r, uint32_t lane) {
    const uint32_t n = lane & 7u, koff = 8u * (lane >> 3);
    return (n < kGroup ? b.q + (r * kGroup + n) * kQStride : b.qzero) + koff;
}

// Copy the packed words and scales of `packed`/`scales` for the pass at s0 into `words`/`sc` (asynchronously):
// its positions below ctx and, in a pass that reaches ctx, the tree slots ctx .. ctx + rows - 1.
template <uint32_t kBits>
__device__ __forceinline__ void stage_pass(uint32_t* words, __half* sc, const uint32_t* __restrict__ packed,
                                           const __half* __restrict__ scales, const int32_t* __restrict__ block_table,
                                           uint32_t s0, uint32_t count, uint32_t ctx, uint32_t rows, uint32_t h) {
    constexpr uint32_t kChunks = Packing<kBits>::kChunks + 1;  // the words, then the 8 scales
    const bool tail = s0 + count > ctx;
    const uint32_t own = tail ? (ctx > s0 ? ctx - s0 : 0u) : count;  // staged positions of the pass
    const uint32_t items = (own + (tail ? rows : 0u)) * kChunks;
    for (uint32_t i = threadIdx.x; i < items; i += kThreads) {
        const uint32_t k = i / kChunks, c = i % kChunks;
        const uint32_t row = k < own ? k : kTreeRow + (k - own);
        const uint32_t slot = k < own ? s0 + k : ctx + (k - own);
        const size_t group0 = qcache_group(block_table, slot, h, 0);
        if (c < Packing<kBits>::kChunks)
            copy16(words + row * Packing<kBits>::kStride + 4u * c, packed + group0 * kBits + 4u * c);
        else
            copy16(sc + row * kQGroupsPerHead, scales + group0);
    }
}

// Staged row of row r's position `pos` in the pass at s0 (the served kernel's staged_row).
__device__ __forceinline__ uint8_t staged_row(const Block& b, uint32_t r, uint32_t pos, uint32_t s0, uint32_t ctx) {
    if (pos >= b.end[r]) return kZeroRow;
    if (pos < ctx) return static_cast<uint8_t>(pos - s0);
    return static_cast<uint8_t>(kTreeRow + (elpis_sched_slot(ctx, b.mask[r], pos) - ctx));
}

// The fold's queries, as tree_attention_mma.cu stages them (stage_folded_queries): each 32-value group rotated in
// fp32 by the Hadamard's butterflies over index bits 0..4 in order, times fp32(1/sqrt(32)), then fp16.
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

// Scores S^T = K Q^T over the warp's 16 positions (pass rows p_lo = 16 mt + g, p_lo + 8) for its rows r0 ..
// r0 + kRowsPerWarp - 1 (those in `active`), k-steps 0..15 in order, scaled and masked (-inf from the row's
// end), and each half-tile's max per (row, query column) into b.tmax. In a pass below ctx every row reads the
// pass's own staged rows and shares each K fragment; in a pass that reaches ctx each row reads its own (b.srow).
__device__ __forceinline__ void score_warp(const Block& b, float (&acc)[kRowsPerWarp][4], uint32_t active,
                                           bool tail, uint32_t mt, uint32_t r0, uint32_t s0, float scale) {
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    const uint32_t p_lo = 16u * mt + g, p_hi = p_lo + 8u, tile = mt >> 1, half = mt & 1u;
#pragma unroll
    for (uint32_t k = 0; k < kRowsPerWarp; k++) acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.0f;
    if (!tail) {
        for (uint32_t grp = 0; grp < kQGroupsPerHead; grp++) {
            uint32_t a[2][4];
            k_fragments(b, p_lo, p_hi, grp, t, a);
#pragma unroll
            for (uint32_t k = 0; k < kRowsPerWarp; k++) {
                const uint32_t r = r0 + k;
                if (!((active >> r) & 1u)) continue;
                uint32_t qb[4];
                ldsm_x4(qb, q_row(b, r, lane) + 32u * grp);
                mma16816(acc[k], a[0], qb[0], qb[1]);
                mma16816(acc[k], a[1], qb[2], qb[3]);
            }
        }
    } else {
#pragma unroll
        for (uint32_t k = 0; k < kRowsPerWarp; k++) {
            const uint32_t r = r0 + k;
            if (!((active >> r) & 1u)) continue;
            const uint32_t r_lo = b.srow[r * kPass + p_lo], r_hi = b.srow[r * kPass + p_hi];
            for (uint32_t grp = 0; grp < kQGroupsPerHead; grp++) {
                uint32_t a[2][4];
                k_fragments(b, r_lo, r_hi, grp, t, a);
                uint32_t qb[4];
                ldsm_x4(qb, q_row(b, r, lane) + 32u * grp);
                mma16816(acc[k], a[0], qb[0], qb[1]);
                mma16816(acc[k], a[1], qb[2], qb[3]);
            }
        }
    }
    const float ninf = __int_as_float(0xff800000);
#pragma unroll
    for (uint32_t k = 0; k < kRowsPerWarp; k++) {
        const uint32_t r = r0 + k;
        if (!((active >> r) & 1u)) continue;
        const uint32_t end = b.end[r];
        const bool v_lo = s0 + p_lo < end, v_hi = s0 + p_hi < end;
        acc[k][0] = v_lo ? __fmul_rn(acc[k][0], scale) : ninf;
        acc[k][1] = v_lo ? __fmul_rn(acc[k][1], scale) : ninf;
        acc[k][2] = v_hi ? __fmul_rn(acc[k][2], scale) : ninf;
        acc[k][3] = v_hi ? __fmul_rn(acc[k][3], scale) : ninf;
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) {
            const float mx = max_over_g(fmaxf(acc[k][c], acc[k][2 + c]));
            if (g == 0) b.tmax[(tile * 2u + half) * kStats + r * kQPad + 2u * t + c] = mx;
        }
    }
}

// Tile `tile`'s max of (row, query column) st, from its two halves.
__device__ __forceinline__ float tile_max(const Block& b, uint32_t tile, uint32_t st) {
    return fmaxf(b.tmax[(2u * tile) * kStats + st], b.tmax[(2u * tile + 1u) * kStats + st]);
}

// P = fp16(exp(s - the running max after this tile)) of the warp's rows into b.p, each half-tile's sum of P (the
// served butterfly) into b.tsum, and the tile's rescale factor into b.alpha. The running max before a tile is
// the pass's incoming max folded with the maxima of the pass's earlier tiles (fmaxf: exact, in any order, so
// the served sequence's value); padding columns restart from -inf at every tile, as the served kernel's do.
__device__ __forceinline__ void p_warp(const Block& b, const float (&acc)[kRowsPerWarp][4], uint32_t active,
                                       uint32_t mt, uint32_t r0) {
    const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u, tile = mt >> 1, half = mt & 1u;
    const float ninf = __int_as_float(0xff800000);
#pragma unroll
    for (uint32_t k = 0; k < kRowsPerWarp; k++) {
        const uint32_t r = r0 + k;
        if (!((active >> r) & 1u)) continue;
#pragma unroll
        for (uint32_t c = 0; c < 2; c++) {
            const uint32_t j = 2u * t + c, st = r * kQPad + j;
            float m_old = ninf;
            if (j < kGroup) {
                m_old = b.m[st];
                for (uint32_t i = 0; i < tile; i++) m_old = fmaxf(m_old, tile_max(b, i, st));
            }
            const float m_new = fmaxf(m_old, tile_max(b, tile, st));
            if (g == 0 && half == 0) b.alpha[tile * kStats + st] = expf(m_old - m_new);  // 0 on a row's first tile
            const __half ph_lo = __float2half_rn(expf(acc[k][c] - m_new));
            const __half ph_hi = __float2half_rn(expf(acc[k][2 + c] - m_new));
            __half* prow = b.p + (tile * kStats + st) * kPStride + 16u * half + g;
            if (j < kGroup) {
                prow[0] = ph_lo;
                prow[8] = ph_hi;
            }
            const float part = sum_over_g(__fadd_rn(__half2float(ph_lo), __half2float(ph_hi)));
            if (g == 0) b.tsum[(tile * 2u + half) * kStats + st] = part;
        }
    }
}

// One block: split `gridDim.y - 1 - blockIdx.y`, K/V head `blockIdx.x`, local rows blockIdx.z + lr * gridDim.z.
// Writes the split's partial (max, sum, acc[256]) per (row, query head), as tree_attention_mma.cu does.
__global__ void __launch_bounds__(kThreads) tree_attention_long_split(
    const __half* __restrict__ q, const uint32_t* __restrict__ qk, const __half* __restrict__ sk,
    const uint32_t* __restrict__ qv, const __half* __restrict__ sv, const int32_t* __restrict__ block_table,
    const uint32_t* __restrict__ depth, const uint32_t* __restrict__ ancestors, uint32_t rows, const CtxArg ctx_arg,
    float scale, uint32_t max_splits, float* __restrict__ part_acc, float* __restrict__ part_ml) {
    ELPIS_DYNAMIC_SMEM(smem, kSmemBytes);
    const uint32_t ctx = ctx_of(ctx_arg);
    float* stats = reinterpret_cast<float*>(smem + kOffStats);
    const Block b{reinterpret_cast<__half*>(smem),
                  reinterpret_cast<__half*>(smem + kOffQZero),
                  reinterpret_cast<uint32_t*>(smem + kOffKW),
                  reinterpret_cast<__half*>(smem + kOffKS),
                  reinterpret_cast<uint32_t*>(smem + kOffVW),
                  reinterpret_cast<__half*>(smem + kOffVS),
                  reinterpret_cast<__half*>(smem + kOffP),
                  stats,
                  stats + kStats,
                  stats + 2 * kStats,
                  stats + 2 * kStats + 2 * kTiles * kStats,
                  stats + 2 * kStats + 4 * kTiles * kStats,
                  reinterpret_cast<uint32_t*>(smem + kOffRows),
                  reinterpret_cast<uint32_t*>(smem + kOffRows) + kRows,
                  reinterpret_cast<uint32_t*>(smem + kOffRows) + 2 * kRows,
                  reinterpret_cast<uint8_t*>(smem + kOffSrow)};
    // the grid's order: heads fastest, splits last to first (longest first), as in the served kernel
    const uint32_t split = gridDim.y - 1u - blockIdx.y, h = blockIdx.x, tid = threadIdx.x;
    const uint32_t lane = tid & 31u, warp = tid >> 5, g = lane >> 2, t = lane & 3u;
    const uint32_t begin = elpis_sched_split_begin(split);
    const uint32_t n = rows > blockIdx.z ? (rows - blockIdx.z + gridDim.z - 1) / gridDim.z : 0u;  // <= kRows

    if (tid < kRows) {
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
    stage_folded_queries(b, q, n, h);
    for (uint32_t i = tid; i < kTiles * kStats * kPStride / 2; i += kThreads) reinterpret_cast<uint32_t*>(b.p)[i] = 0;
    if (tid < kQStride / 2) reinterpret_cast<uint32_t*>(b.qzero)[tid] = 0;
    if (tid < kStats) {
        b.m[tid] = __int_as_float(0xff800000);
        b.l[tid] = 0.0f;
    }
    __syncthreads();

    uint32_t block_end = 0;
    for (uint32_t r = 0; r < kRows; r++) block_end = max(block_end, b.end[r]);
    float o[kRows][4];
#pragma unroll
    for (uint32_t r = 0; r < kRows; r++) o[r][0] = o[r][1] = o[r][2] = o[r][3] = 0.0f;

    // Copies in flight, oldest first: K of a pass, then V of it, then K of the next (issued once the scores no
    // longer read K), then V of the next (once the output no longer reads V). Each wait leaves the newest.
    auto pass_count = [&](uint32_t s0) { return min(kPass, (block_end - s0 + kTile - 1) / kTile * kTile); };
    if (begin < block_end) {
        stage_pass<kKBits>(b.kw, b.ks, qk, sk, block_table, begin, pass_count(begin), ctx, rows, h);
        copy_commit();
        stage_pass<kVBits>(b.vw, b.vs, qv, sv, block_table, begin, pass_count(begin), ctx, rows, h);
        copy_commit();
    }
    // score warps: warp w < 8 * kClasses takes positions 16 (w % 8).. of a pass and local rows r0 ..
    const uint32_t mt = warp & 7u, r0 = (warp >> 3) * kRowsPerWarp;
    const bool scorer = warp < 8u * kClasses;
    for (uint32_t s0 = begin; s0 < block_end; s0 += kPass) {
        const uint32_t count = pass_count(s0), tiles = count / kTile, next = s0 + kPass;
        const bool tail = s0 + count > ctx;  // holds positions >= ctx: rows read their own tree slots
        if (tail) {
            for (uint32_t i = tid; i < kRows * kPass; i += kThreads) {
                const uint32_t r = i / kPass, p = i % kPass;
                b.srow[i] = r < n && p < count ? staged_row(b, r, s0 + p, s0, ctx) : kZeroRow;
            }
        }
        if (tid < kTiles) {  // the rows whose positions in this split reach the tile
            uint32_t act = 0;
            for (uint32_t r = 0; r < n; r++) act |= (tid < tiles && b.end[r] > s0 + kTile * tid ? 1u : 0u) << r;
            b.act[tid] = act;
        }
        copy_wait_all_but_newest();  // this pass's K
        __syncthreads();
        const uint32_t tile = mt >> 1;
        const uint32_t mine = scorer && tile < tiles ? b.act[tile] & (((1u << kRowsPerWarp) - 1u) << r0) : 0u;
        float acc[kRowsPerWarp][4];
        if (mine) score_warp(b, acc, mine, tail, mt, r0, s0, scale);
        __syncthreads();
        if (next < block_end) stage_pass<kKBits>(b.kw, b.ks, qk, sk, block_table, next, pass_count(next), ctx, rows, h);
        copy_commit();
        if (mine) p_warp(b, acc, mine, mt, r0);
        copy_wait_all_but_newest();  // this pass's V
        __syncthreads();
        // The running (max, sum) after the pass, tile by tile in order (the served update_stats).
        if (tid < kStats && tid % kQPad < kGroup) {
            const uint32_t r = tid / kQPad;
            float m = b.m[tid], l = b.l[tid];
            for (uint32_t i = 0; i < tiles; i++) {
                if (!((b.act[i] >> r) & 1u)) continue;
                m = fmaxf(m, tile_max(b, i, tid));
                l = __fadd_rn(__fmul_rn(l, b.alpha[i * kStats + tid]),
                              __fadd_rn(b.tsum[(2 * i) * kStats + tid], b.tsum[(2 * i + 1) * kStats + tid]));
            }
            b.m[tid] = m;
            b.l[tid] = l;
        }
        // O^T = alpha O^T + V^T P^T per tile in order: warp -> head dims 16 warp.., each row's two k-steps
        // (positions 0-15, 16-31 of the tile).
        const __half* p_row = b.p + (lane & 7u) * kPStride + 8u * (lane >> 3);
        for (uint32_t i = 0; i < tiles; i++) {
            const uint32_t active = b.act[i];
            uint32_t va[2][4];
            if (!tail) {
#pragma unroll
                for (uint32_t kk = 0; kk < 2; kk++) {
                    const uint32_t p0 = kTile * i + 16u * kk + 2u * t;
                    const uint32_t pos[4] = {p0, p0 + 1u, p0 + 8u, p0 + 9u};
                    v_fragment(b, pos, warp, g, va[kk]);
                }
            }
#pragma unroll
            for (uint32_t r = 0; r < kRows; r++) {
                if (!((active >> r) & 1u)) continue;
                if (tail) {
#pragma unroll
                    for (uint32_t kk = 0; kk < 2; kk++) {
                        const uint8_t* sr = b.srow + r * kPass + kTile * i + 16u * kk + 2u * t;
                        const uint32_t pos[4] = {sr[0], sr[1], sr[8], sr[9]};
                        v_fragment(b, pos, warp, g, va[kk]);
                    }
                }
                const uint32_t st = r * kQPad + 2u * t;
                const float a0 = b.alpha[i * kStats + st], a1 = b.alpha[i * kStats + st + 1u];
                uint32_t pb[4];
                ldsm_x4(pb, p_row + (i * kStats + r * kQPad) * kPStride);
                o[r][0] = __fmul_rn(o[r][0], a0);
                o[r][1] = __fmul_rn(o[r][1], a1);
                o[r][2] = __fmul_rn(o[r][2], a0);
                o[r][3] = __fmul_rn(o[r][3], a1);
                mma16816(o[r], va[0], pb[0], pb[1]);
                mma16816(o[r], va[1], pb[2], pb[3]);
            }
        }
        __syncthreads();  // the next pass restages V, P and the tables
        if (next < block_end) stage_pass<kVBits>(b.vw, b.vs, qv, sv, block_table, next, pass_count(next), ctx, rows, h);
        copy_commit();
    }

#pragma unroll
    for (uint32_t r = 0; r < kRows; r++) {
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
    if (tid < kRows * kGroup) {
        const uint32_t r = tid / kGroup, j = tid % kGroup;
        if (b.end[r] != 0) {
            const uint32_t row = blockIdx.z + r * gridDim.z;
            const size_t part = (static_cast<size_t>(row) * kQHeads + h * kGroup + j) * max_splits + split;
            part_ml[part * 2] = b.m[r * kQPad + j];
            part_ml[part * 2 + 1] = b.l[r * kQPad + j];
        }
    }
}

// Blocks per (split, K/V head): enough for kRows rows a block, more only when the grid would leave
// multiprocessors idle (the served kernel's rule), never more than the rows.
uint32_t row_groups(uint32_t rows, uint32_t max_splits) {
    int device = 0, sms = 1;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        sms = 1;
    const uint32_t least = (rows + kRows - 1) / kRows;
    const uint32_t fit = static_cast<uint32_t>(sms) / (max_splits * kKvHeads);
    const uint32_t groups = fit > rows ? rows : fit;
    return groups < least ? least : groups;
}

int launch_long(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors, uint32_t rows,
                const CtxArg ctx, uint32_t max_splits, float scale, void* out, float* lse, float* workspace,
                cudaStream_t s) {
    if (max_splits > kMaxGridY) return static_cast<int>(cudaErrorInvalidValue);
    static bool smem_set = false;
    if (const int err = allow_dynamic_smem(tree_attention_long_split, kSmemBytes, smem_set)) return err;
    float* part_acc = workspace;
    float* part_ml = workspace + static_cast<uint64_t>(rows) * kQHeads * max_splits * kHeadDim;
    tree_attention_long_split<<<dim3(kKvHeads, max_splits, row_groups(rows, max_splits)), kThreads, kSmemBytes, s>>>(
        static_cast<const __half*>(q), static_cast<const uint32_t*>(qk), static_cast<const __half*>(sk),
        static_cast<const uint32_t*>(qv), static_cast<const __half*>(sv), block_table, depth, ancestors, rows, ctx,
        scale, max_splits, part_acc, part_ml);
    tree_attention_combine<true><<<dim3(rows, kQHeads), kHeadDim, 0, s>>>(depth, ctx, max_splits, part_acc, part_ml,
                                                                         static_cast<__half*>(out), lse);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

uint32_t elpis_tree_attention_qcache_bits(void) { return kKBits * 16u + kVBits; }

uint32_t elpis_tree_attention_mma_smem_bytes(void) { return static_cast<uint32_t>(kSmemBytes); }

// The served fold build's entries (tree_attention_mma.cu), same arguments, same bits.
int elpis_tree_attention_mma(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                             const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors,
                             uint32_t rows, uint32_t ctx, uint32_t max_depth, float scale, void* out, float* lse,
                             float* workspace, uint64_t workspace_floats, void* stream) {
    if (rows == 0 || rows > kMaxRows || max_depth >= kMaxRows) return static_cast<int>(cudaErrorInvalidValue);
    if (workspace_floats < elpis_tree_attention_workspace_floats(rows, ctx, max_depth))
        return static_cast<int>(cudaErrorInvalidValue);
    return launch_long(q, qk, sk, qv, sv, block_table, depth, ancestors, rows, CtxArg{ctx, nullptr},
                       elpis_tree_attention_max_splits(ctx, max_depth), scale, out, lse, workspace,
                       static_cast<cudaStream_t>(stream));
}

int elpis_tree_attention_mma_dev(const void* q, const void* qk, const void* sk, const void* qv, const void* sv,
                                 const int32_t* block_table, const uint32_t* depth, const uint32_t* ancestors,
                                 uint32_t rows, const uint32_t* ctx_dev, uint32_t max_ctx, float scale, void* out,
                                 float* lse, float* workspace, uint64_t workspace_floats, void* stream) {
    if (rows == 0 || rows > kMaxRows || ctx_dev == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (workspace_floats < elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1))
        return static_cast<int>(cudaErrorInvalidValue);
    return launch_long(q, qk, sk, qv, sv, block_table, depth, ancestors, rows, CtxArg{0, ctx_dev},
                       elpis_tree_attention_max_splits(max_ctx, rows - 1), scale, out, lse, workspace,
                       static_cast<cudaStream_t>(stream));
}

}  // extern "C"
