// EXL3 GEMM for 1-16 rows: every weight decoded once, on tensor cores (mma.sync m16n8k16, Ampere
// instructions only), for the verify rows and plain decoding of issue 9.
//
// y = ((x * suh) H) D H * svh, where D [k, n] is the decoded 4- or 6-bit mul1 trellis (the body's linears and
// the output head) and H the normalised 128-point Sylvester Hadamard on each group of 128 (the format:
// shared/notes/exllamav3_internals.md 1.3).
//
// One call serves a group of up to four linears that share their input x (Q/K/V, GDN qkv/z, MLP gate/up), in
// two launches:
//  1. rows_gemm_input: a_i = fp16((x * suh_i) H) in fp32 arithmetic for every member i, written in the order
//     the mma B fragments are read (rows past m are zero; 8 or 16 rows).
//  2. rows_gemm_kernel: the weights are the mma's A operand (16 output columns x 16 k), the rows its B
//     operand (16 k x 8 rows), so one mma serves a whole 16x16 weight tile for 8 rows. A lane decodes the
//     eight trellis positions 8*lane .. 8*lane+7 of a tile, which are exactly its A fragment. The schedule
//     (proved, build/kernels/gemm_schedule.h) is stream-K over units (n-block of 128 columns, 128-group of
//     k), n-block major, over the n-blocks of all members one after another (a narrow member, K or V, shares
//     the grid with the wide ones instead of leaving it idle): block b takes the units [begin(b), end(b)) of
//     an even partition; within an n-block warp w takes k-tile 8g+w of each of the block's groups g,
//     ascending; the block sums its warps in ascending order; the blocks that share an n-block leave
//     partials, which the last of them to arrive sums in ascending block order before it applies H and svh.
//     The block count depends on k, the members' n, the trellis width and the GPU, never on the row count,
//     and every mma takes one row per B column: a row's result is the same whatever the other rows are or
//     how many there are.
// Arithmetic: fp32 accumulation; a decoded weight is the codebook's fp16 value (one fp16 fma rounding,
// as the format defines it); the transforms in fp32 with one fp16 rounding of the activations and of y.
// A member's y is written fp16 [m, n] (the default), fp32 [m, n], or bf16 channel-major [n, m]: the fp16 y
// rounded once more to bf16, the buffer ExLlamaV3's Gated DeltaNet forward makes of its qkv for the conv with a
// cast and a transposed copy (two kernels a layer), so that here it makes neither.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemm_schedule.h"

namespace {

constexpr uint32_t kWarps = ELPIS_GEMM_WARPS;      // warps per block = k-tiles per group
constexpr uint32_t kGroupK = ELPIS_GEMM_GROUP_K;   // k per group (one Hadamard block)
constexpr uint32_t kBlockN = 128;                  // output columns per block (one Hadamard block)
constexpr uint32_t kTilesN = kBlockN / 16;         // weight tiles per warp per k-tile
// 32-bit words of one 16x16 tile of a K-bit trellis (256 K bits), and of them the ones a lane loads.
__host__ __device__ constexpr uint32_t words_per_tile(int bits) { return 8u * uint32_t(bits); }
__host__ __device__ constexpr int lane_words(int bits) { return bits == 4 ? 1 : 2; }
constexpr uint32_t kRedStride = kBlockN + 4;       // padded row of the reduction buffer (no bank conflicts)
constexpr float kInvSqrt128 = 0.08838834764831845f;
constexpr uint32_t kMaxMembers = 4;                // linears per call (one shared input)
constexpr uint32_t kMaxNBlocks = 4096;             // n-blocks per call, all members together
constexpr uint32_t kBf16Shift = 8;                 // out_modes: bit kBf16Shift + i, member i's bf16 [n, m]
enum OutMode : uint32_t { kOutF16 = 0, kOutF32 = 1, kOutBf16ChannelMajor = 2 };
#ifndef ELPIS_GEMM_STAGES
#define ELPIS_GEMM_STAGES 3
#endif
#ifndef ELPIS_GEMM_STAGES6
#define ELPIS_GEMM_STAGES6 2
#endif
// k-tiles of words in flight per warp (the 6-bit trellis holds twice the words per tile in registers)
__host__ __device__ constexpr int stages(int bits) { return bits == 4 ? ELPIS_GEMM_STAGES : ELPIS_GEMM_STAGES6; }

static_assert(kWarps == 8 && kGroupK == 128, "the kernel's warp layout is for 8 k-tiles per group");

// ---- small exact operations (bit patterns in, bit patterns out) -------------------------------------------

#ifdef ELPIS_CUDA_EMU
inline uint32_t shfl_u32(uint32_t v, uint32_t src) { return emu_shfl_u32(v, src); }
inline float shfl_xor_f32(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
inline uint32_t dp4a_u32(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t s = c;
    for (int i = 0; i < 4; i++) s += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return s;
}
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t v = (uint64_t(b) << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= uint32_t((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
inline uint32_t shr64(uint32_t lo, uint32_t hi, uint32_t s) { return uint32_t(((uint64_t(hi) << 32) | lo) >> s); }
inline uint32_t shl64(uint32_t lo, uint32_t hi, uint32_t s) { return uint32_t((((uint64_t(hi) << 32) | lo) << s) >> 32); }
// fp16x2 fma with one rounding: the fp32 fma is exact for the codebook's operands (22 + 11 bits)
inline uint32_t hfma2_bits(uint32_t x, uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int i = 0; i < 2; i++) {
        _Float16 hx, ha, hb;
        const uint16_t ux = uint16_t(x >> (16 * i)), ua = uint16_t(a >> (16 * i)), ub = uint16_t(b >> (16 * i));
        std::memcpy(&hx, &ux, 2); std::memcpy(&ha, &ua, 2); std::memcpy(&hb, &ub, 2);
        const _Float16 hr = _Float16(std::fma(float(hx), float(ha), float(hb)));
        uint16_t ur; std::memcpy(&ur, &hr, 2);
        r |= uint32_t(ur) << (16 * i);
    }
    return r;
}
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { emu_mma_m16n8k16(d, a, b0, b1); }
inline uint32_t atomic_inc(uint32_t* p) { return (*p)++; }
inline uint32_t load_words(const uint32_t* p) { return *p; }
inline uint2 load_frag(const uint2* p) { return *p; }
#define ELPIS_FENCE() do {} while (0)
template <typename T> inline T* pin(T* p) { return p; }
inline void load_scale4(const __half* p, float (&s)[4]) {
    for (int j = 0; j < 4; j++) s[j] = __half2float(p[j]);
}
inline float load_partial(const float* p) { return *p; }
#else
__device__ __forceinline__ uint32_t shfl_u32(uint32_t v, uint32_t src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ float shfl_xor_f32(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ uint32_t dp4a_u32(uint32_t a, uint32_t b, uint32_t c) { return __dp4a(a, b, c); }
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
__device__ __forceinline__ uint32_t shr64(uint32_t lo, uint32_t hi, uint32_t s) { return __funnelshift_r(lo, hi, s); }
__device__ __forceinline__ uint32_t shl64(uint32_t lo, uint32_t hi, uint32_t s) { return __funnelshift_l(lo, hi, s); }
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t x, uint32_t a, uint32_t b) {
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t atomic_inc(uint32_t* p) { return atomicAdd(p, 1u); }
// The trellis is read once per GEMM: stream it past L1.
__device__ __forceinline__ uint32_t load_words(const uint32_t* p) { return __ldcs(p); }
__device__ __forceinline__ uint2 load_frag(const uint2* p) { return __ldg(p); }
#define ELPIS_FENCE() __threadfence()
// The pointer held in registers: the compiler cannot rebuild it from the kernel parameters (it did, with the
// member selects, before every stage's loads).
template <typename T>
__device__ __forceinline__ T* pin(T* p) {
    asm volatile("" : "+l"(p));
    return p;
}
// Four consecutive fp16 scales (8-byte aligned) as floats, in one load.
__device__ __forceinline__ void load_scale4(const __half* p, float (&s)[4]) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
    s[0] = __half2float(__ushort_as_half(uint16_t(w.x))), s[1] = __half2float(__ushort_as_half(uint16_t(w.x >> 16)));
    s[2] = __half2float(__ushort_as_half(uint16_t(w.y))), s[3] = __half2float(__ushort_as_half(uint16_t(w.y >> 16)));
}
// A partial another block wrote, read after the acquiring fence (which invalidates this multiprocessor's L1, so a
// plain load sees it). Volatile, so every load of the fold goes out where it stands, before the adds that use
// them: with `ld.cg` (a strong load) the compiler put each add right after its load, one L2 round trip per
// partial (device call 87).
__device__ __forceinline__ float load_partial(const float* p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
#endif

// The 16-bit trellis state of each of a lane's eight positions 8L..8L+7, from its word L (`lo`) and word
// L-1 (`hi`, circular within the tile): position 8L+j reads bits 4(7-j) .. 4(7-j)+15 of hi:lo. Byte-aligned
// windows are one byte permute with zero fill; the others are the same after a funnel shift by 4.
__device__ __forceinline__ void states8(uint32_t lo, uint32_t hi, uint32_t (&w)[8]) {
    const uint32_t s4 = shr64(lo, hi, 4), s16 = shr64(lo, hi, 16), s20 = shr64(lo, hi, 20);
    w[7] = prmt(lo, 0u, 0x4410u);
    w[6] = prmt(s4, 0u, 0x4410u);
    w[5] = prmt(lo, 0u, 0x4421u);
    w[4] = prmt(s4, 0u, 0x4421u);
    w[3] = prmt(lo, 0u, 0x4432u);
    w[2] = prmt(s4, 0u, 0x4432u);
    w[1] = prmt(s16, 0u, 0x4421u);
    w[0] = prmt(s20, 0u, 0x4421u);
}

// The same for a 6-bit trellis (48 words a tile): position 8L+j reads the 16 stream bits that start at 48L + 6j - 10.
// Lane L = 2i loads words 3i and 3i+1 (`a`, `b`) and takes word 3i-1 (`p`, circular) from lane L-1; lane 2i+1
// loads words 3i+1 and 3i+2 and needs no third. As one 96-bit value p:a:b (p most significant), lane 2i's window j
// ends 58 - 6j bits above the least significant bit, lane 2i+1's 42 - 6j: shifted left by `d` = 0 or 16 bits,
// every lane reads the windows at 58 - 6j.
__device__ __forceinline__ void states8_6(uint32_t p, uint32_t a, uint32_t b, uint32_t d, uint32_t (&w)[8]) {
    const uint32_t hi = shl64(a, p, d), mid = shl64(b, a, d), lo = b << d;
    w[0] = shr64(mid, hi, 26) & 0xffffu;
    w[1] = shr64(mid, hi, 20) & 0xffffu;
    w[2] = shr64(mid, hi, 14) & 0xffffu;
    w[3] = prmt(mid, 0u, 0x4421u);  // (hi:mid) >> 8
    w[4] = shr64(mid, hi, 2) & 0xffffu;
    w[5] = shr64(lo, mid, 28) & 0xffffu;
    w[6] = shr64(lo, mid, 22) & 0xffffu;
    w[7] = prmt(lo, 0u, 0x4432u);  // (mid:lo) >> 16
}

// mul1 codebook, two states to an fp16 pair (low half: s0): fp16(1024 + bytesum(s * 0x83DCD12D)) * 1/147.7
// - 10.39 with the format's fp16 constants (0x1eee, 0xc931), one rounding.
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
    const uint32_t h0 = dp4a_u32(s0 * 0x83DCD12Du, 0x01010101u, 0x6400u);
    const uint32_t h1 = dp4a_u32(s1 * 0x83DCD12Du, 0x01010101u, 0x6400u);
    return hfma2_bits(prmt(h0, h1, 0x5410u), 0x1eee1eeeu, 0xc931c931u);
}

// A lane's A fragment of one 16x16 weight tile (rows: output columns, columns: k): registers 0-3 hold
// (n g, k 2q..2q+1), (n g+8, k 2q..), (n g, k 2q+8..), (n g+8, k 2q+8..); positions 8L+j sit at
// k = 2q + (j&1) + 8((j>>1)&1), n = g + 8(j>>2).
__device__ __forceinline__ void decode_states(const uint32_t (&w)[8], uint32_t (&a)[4]) {
    a[0] = decode_pair(w[0], w[1]);
    a[1] = decode_pair(w[4], w[5]);
    a[2] = decode_pair(w[2], w[3]);
    a[3] = decode_pair(w[6], w[7]);
}

// Offset of the first word lane `lane` loads of a tile (lane_words(kBits) consecutive words).
template <int kBits>
__device__ __forceinline__ uint32_t lane_word(uint32_t lane) {
    return kBits == 4 ? lane : 3u * (lane >> 1) + (lane & 1u);
}

// A lane's A fragment of a tile from the words it loaded (a warp-wide exchange: every lane calls it).
template <int kBits>
__device__ __forceinline__ void decode_tile(const uint32_t (&words)[lane_words(kBits)], uint32_t lane,
                                            uint32_t (&a)[4]) {
    uint32_t w[8];
    if constexpr (kBits == 4) {
        states8(words[0], shfl_u32(words[0], (lane + 31u) & 31u), w);
    } else {
        const uint32_t prev = shfl_u32(words[1], (lane + 31u) & 31u);
        states8_6(prev, words[0], words[1], (lane & 1u) * 16u, w);
    }
    decode_states(w, a);
}

// In-place 128-point Sylvester transform (unnormalised) of the values 4*lane + j held by a warp.
__device__ __forceinline__ void fwht128(float (&v)[4], uint32_t lane) {
    float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
    v[0] = a + c; v[1] = b + d; v[2] = a - c; v[3] = b - d;
#pragma unroll
    for (int bit = 0; bit < 5; bit++) {
        const bool upper = (lane >> bit) & 1u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float other = shfl_xor_f32(v[j], 1 << bit);
            v[j] = upper ? other - v[j] : v[j] + other;
        }
    }
}

// ---- launch 1: the input transform -------------------------------------------------------------------------

// Index (in halves) of element (row, kk) of k-tile t in the fragment order: per (t, row half), lane
// g*4+q holds (row g, k 2q, 2q+1) then (row g, k 2q+8, 2q+9).
__device__ __forceinline__ uint32_t frag_index(uint32_t t, uint32_t row, uint32_t kk, uint32_t row_halves) {
    const uint32_t q = (kk & 7u) >> 1, which = kk >> 3;
    return ((((t * row_halves + (row >> 3)) * 32u + (row & 7u) * 4u + q) * 2u + which) * 2u) + (kk & 1u);
}

// values[mi] by unrolled selects: a dynamic index into a kernel parameter's array would copy the parameter to
// local memory.
template <typename T>
__device__ __forceinline__ T pick(const T (&values)[kMaxMembers], uint32_t mi) {
    T v = values[0];
#pragma unroll
    for (uint32_t j = 1; j < kMaxMembers; j++)
        if (mi == j) v = values[j];
    return v;
}

struct MemberScales {
    const __half* suh[kMaxMembers];
};

// The transform's end for the four values 4*lane + j (x * suh, or 0 past the rows) of one row: H, the
// normalisation, one fp16 rounding, written in the fragment order.
__device__ __forceinline__ void transform_store(float (&v)[4], __half* __restrict__ frag, uint32_t lane, uint32_t row,
                                                uint32_t k0, uint32_t row_halves) {
    fwht128(v, lane);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t kg = k0 + j;
        frag[frag_index(kg >> 4, row, kg & 15u, row_halves)] = __float2half_rn(v[j] * kInvSqrt128);
    }
}

// grid (k / 128, rows_padded / 4, members), 128 threads: warp w transforms row 4*blockIdx.y + w of group
// blockIdx.x for member blockIdx.z, into that member's fragments (frag_halves apart).
__global__ void __launch_bounds__(128) rows_gemm_input(const __half* __restrict__ x, const MemberScales scales,
                                                       __half* __restrict__ a_frag, uint32_t m, uint32_t k,
                                                       uint32_t row_halves, uint64_t frag_halves) {
    const uint32_t lane = threadIdx.x & 31u, row = blockIdx.y * 4u + (threadIdx.x >> 5);
    const uint32_t k0 = blockIdx.x * kGroupK + lane * 4u;
    const __half* const suh = pick(scales.suh, blockIdx.z);
    __half* const frag = a_frag + blockIdx.z * frag_halves;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        v[j] = row < m ? __half2float(x[size_t(row) * k + k0 + j]) * __half2float(suh[k0 + j]) : 0.0f;
    transform_store(v, frag, lane, row, k0, row_halves);
}

// silu(g) * u of a pair, in fp16 arithmetic: the operations, in their order, of ExLlamaV3 1.6.5's fp16 SiLU-and-
// multiply (act_mul_kernel_h, act_limit 0): e = exp(-g), r = 1 / (1 + e), (g * r) * u, each an fp16 intrinsic.
__device__ __forceinline__ __half2 silu_mul_h2(__half2 g, __half2 u) {
    const __half2 e = h2exp(__hneg2(g));
    const __half2 r = h2rcp(__hadd2(__float2half2_rn(1.0f), e));
    return __hmul2(__hmul2(g, r), u);
}

// As rows_gemm_input (whose first lines it repeats rather than share: a shared helper reordered the served
// kernel's address arithmetic in its PTX), with x = silu(g) * u computed here (silu_mul_h2) from g, u [m, k] fp16, and written to
// act [m, k] by the first member's blocks: an MLP's activation and its down projection's input transform in
// one launch, the same bits as the two.
__global__ void __launch_bounds__(128) rows_gemm_input_silu_mul(const __half* __restrict__ g,
                                                                const __half* __restrict__ u,
                                                                __half* __restrict__ act, const MemberScales scales,
                                                                __half* __restrict__ a_frag, uint32_t m, uint32_t k,
                                                                uint32_t row_halves, uint64_t frag_halves) {
    const uint32_t lane = threadIdx.x & 31u, row = blockIdx.y * 4u + (threadIdx.x >> 5);
    const uint32_t k0 = blockIdx.x * kGroupK + lane * 4u;
    const __half* const suh = pick(scales.suh, blockIdx.z);
    __half* const frag = a_frag + blockIdx.z * frag_halves;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (row < m) {
        const size_t at = size_t(row) * k + k0;
        __half2 x2[2];
#pragma unroll
        for (int p = 0; p < 2; p++) {
            x2[p] = silu_mul_h2(reinterpret_cast<const __half2*>(g + at)[p], reinterpret_cast<const __half2*>(u + at)[p]);
            if (blockIdx.z == 0u) reinterpret_cast<__half2*>(act + at)[p] = x2[p];
        }
        const __half x[4] = {__low2half(x2[0]), __high2half(x2[0]), __low2half(x2[1]), __high2half(x2[1])};
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = __half2float(x[j]) * __half2float(suh[k0 + j]);
    }
    transform_store(v, frag, lane, row, k0, row_halves);
}

// ---- an RMSNorm and the input transform in one launch --------------------------------------------------------

// The operations of ExLlamaV3 1.6.5's rms_norm_kernel as its extension is built (--use_fast_math: adds,
// multiplies and fmas flushing subnormals to zero, an approximate division and reciprocal square root),
// spelled out because elpis's kernels build without fast math. Under the CPU emulation they are the plain
// operations (the emulation checks indexing and structure; the GPU test checks the bits).
#ifdef ELPIS_CUDA_EMU
inline float add_ftz(float a, float b) { return a + b; }
inline float mul_ftz(float a, float b) { return a * b; }
inline float fma_ftz(float a, float b, float c) { return std::fma(a, b, c); }
inline float div_approx_ftz(float a, float b) { return a / b; }
inline float rsqrt_approx_ftz(float a) { return 1.0f / std::sqrt(a); }
#else
__device__ __forceinline__ float add_ftz(float a, float b) {
    float r;
    asm("add.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mul_ftz(float a, float b) {
    float r;
    asm("mul.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float fma_ftz(float a, float b, float c) {
    float r;
    asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
__device__ __forceinline__ float div_approx_ftz(float a, float b) {
    float r;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float rsqrt_approx_ftz(float a) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
#endif

constexpr uint32_t kNormThreads = 1024;  // ExLlamaV3's block for a row of more than 4096 values

struct NormArgs {
    const void* x;          // [m, k] fp16 (clamped to +-65504 as read) or fp32
    float* residual;        // [m, k] fp32, or null: with it, residual += x and the norm is of the sum
    const void* weight;     // [k] fp16 or bf16
    __half* y;              // [m, k] fp16: the normalised rows
    float eps, bias, scale; // the norm's epsilon, constant bias (added to the weight when not 0) and scale
    uint32_t x_fp32, weight_bf16;
};

// Four inputs of column c (values 4c .. 4c + 3) of a row, as the norm reads them.
__device__ __forceinline__ void norm_read(const NormArgs& a, size_t at, float (&v)[4]) {
    if (a.x_fp32) {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = static_cast<const float*>(a.x)[at + j];
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float h = __half2float(static_cast<const __half*>(a.x)[at + j]);
            v[j] = fmaxf(-65504.0f, fminf(h, 65504.0f));
        }
    }
}

// grid (rows_padded), kNormThreads threads: block `row` normalises its row as ExLlamaV3's two-pass kernel does
// (thread t sums float4 columns t, t + 1024, ... with an fma chain, a warp xor butterfly 16 .. 1, then one over
// the 32 warp sums; y = (x * w') * rmf, w' = w + bias, rmf = rsqrt(sum / k + eps) * scale; with a residual the
// first pass writes the sums back to it), writes y, then transforms its y for every member as rows_gemm_input
// does: thread t's column c is lane t % 32's part of 128-group c / 32, warp-uniform. Rows past m get zero
// fragments, as rows_gemm_input gives them.
__global__ void __launch_bounds__(kNormThreads) rows_gemm_norm_input(const NormArgs a, const MemberScales scales,
                                                                     uint32_t count, __half* __restrict__ a_frag,
                                                                     uint32_t m, uint32_t k, uint32_t row_halves,
                                                                     uint64_t frag_halves) {
    __shared__ float sums[kNormThreads / 32];
    const uint32_t t = threadIdx.x, lane = t & 31u, warp = t >> 5, row = blockIdx.x, columns = k / 4u;
    const size_t row_off = size_t(row) * k;
    constexpr uint32_t kMaxColumns = 2;  // per thread: k up to 8192
    float y[kMaxColumns][4] = {};
    if (row < m) {
        float sum = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < kMaxColumns; i++) {
            const uint32_t c = t + i * kNormThreads;
            if (c >= columns) break;
            float v[4];
            norm_read(a, row_off + 4u * c, v);
            if (a.residual != nullptr) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    v[j] = add_ftz(v[j], a.residual[row_off + 4u * c + j]);
                    a.residual[row_off + 4u * c + j] = v[j];
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) sum = fma_ftz(v[j], v[j], sum);
            // the second pass reads the same values again (from the residual it wrote, or the input)
#pragma unroll
            for (int j = 0; j < 4; j++) y[i][j] = v[j];
        }
        for (int off = 16; off > 0; off /= 2) sum = add_ftz(sum, __shfl_xor_sync(0xffffffffu, sum, off));
        if (lane == 0u) sums[warp] = sum;
        __syncthreads();
        sum = sums[lane];
        for (int off = 16; off > 0; off /= 2) sum = add_ftz(sum, __shfl_xor_sync(0xffffffffu, sum, off));
        const float rmf = mul_ftz(rsqrt_approx_ftz(add_ftz(div_approx_ftz(sum, float(k)), a.eps)), a.scale);
#pragma unroll
        for (uint32_t i = 0; i < kMaxColumns; i++) {
            const uint32_t c = t + i * kNormThreads;
            if (c >= columns) break;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float w = a.weight_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.weight)[4u * c + j])
                                        : __half2float(static_cast<const __half*>(a.weight)[4u * c + j]);
                if (a.bias != 0.0f) w = add_ftz(w, a.bias);
                const __half h = __float2half_rn(mul_ftz(mul_ftz(y[i][j], w), rmf));
                a.y[row_off + 4u * c + j] = h;
                y[i][j] = __half2float(h);
            }
        }
    }
    for (uint32_t mi = 0; mi < count; mi++) {
        const __half* const suh = pick(scales.suh, mi);
        __half* const frag = a_frag + mi * frag_halves;
#pragma unroll
        for (uint32_t i = 0; i < kMaxColumns; i++) {
            const uint32_t c = t + i * kNormThreads;
            if (c >= columns) break;  // warp-uniform: columns is a multiple of 32
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = row < m ? y[i][j] * __half2float(suh[4u * c + j]) : 0.0f;
            transform_store(v, frag, lane, row, 4u * c, row_halves);
        }
    }
}

// ---- the decode alone (tests): D [k, n] fp16 from the trellis, one warp per 16x16 tile -------------------

template <int kBits>
__global__ void __launch_bounds__(32) rows_gemm_decode(const uint32_t* __restrict__ trellis, __half* __restrict__ d,
                                                       uint32_t n) {
    const uint32_t lane = threadIdx.x, kt = blockIdx.y, nt = blockIdx.x, g = lane >> 2, q = lane & 3u;
    const uint32_t* tile = trellis + (size_t(kt) * (n / 16u) + nt) * words_per_tile(kBits) + lane_word<kBits>(lane);
    uint32_t words[lane_words(kBits)];
#pragma unroll
    for (int e = 0; e < lane_words(kBits); e++) words[e] = tile[e];
    uint32_t a[4];
    decode_tile<kBits>(words, lane, a);
    uint16_t* const out = reinterpret_cast<uint16_t*>(d);
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint32_t row = kt * 16u + 2u * q + ((r & 2) ? 8u : 0u), col = nt * 16u + g + ((r & 1) ? 8u : 0u);
        out[size_t(row) * n + col] = uint16_t(a[r] & 0xffffu);
        out[size_t(row + 1u) * n + col] = uint16_t(a[r] >> 16);
    }
}

// ---- launch 2: the GEMM ------------------------------------------------------------------------------------

template <int kRH, int kBits>
struct Stage {
    uint32_t words[kTilesN][lane_words(kBits)];
    uint2 frag[kRH];
};

// `words`: the n-block's first tile plus the lane's word offset.
template <int kRH, int kBits>
__device__ __forceinline__ void load_stage(Stage<kRH, kBits>& st, const uint32_t* __restrict__ words,
                                           const uint2* __restrict__ frags, uint32_t t, uint32_t tiles_n) {
    const uint32_t* p = words + size_t(t) * tiles_n * words_per_tile(kBits);
#pragma unroll
    for (uint32_t j = 0; j < kTilesN; j++)
#pragma unroll
        for (int e = 0; e < lane_words(kBits); e++) st.words[j][e] = load_words(p + j * words_per_tile(kBits) + e);
#pragma unroll
    for (int h = 0; h < kRH; h++) st.frag[h] = load_frag(frags + (size_t(t) * kRH + h) * 32u);
}

template <int kRH, int kBits>
__device__ __forceinline__ void mma_stage(const Stage<kRH, kBits>& st, float (&acc)[kTilesN][kRH][4], uint32_t lane) {
#pragma unroll
    for (uint32_t j = 0; j < kTilesN; j++) {
        uint32_t a[4];
        decode_tile<kBits>(st.words[j], lane, a);
#pragma unroll
        for (int h = 0; h < kRH; h++) mma_16816(acc[j][h], a, st.frag[h].x, st.frag[h].y);
    }
}

// Groups [gb, ge) of n-block nb through the warps (warp w: k-tile 8g+w of each group g, ascending), then the
// warps' sums in ascending order: `total` holds this thread's outputs, rows 8h + (t >> 7) + 2i, column t & 127.
template <int kRH, int kBits>
__device__ __forceinline__ void accumulate(const uint2* __restrict__ a_frag, const uint32_t* __restrict__ trellis,
                                           uint32_t nb, uint32_t gb, uint32_t ge, uint32_t tiles_n,
                                           float (&red)[kWarps][8][kRedStride], float (&total)[kRH][4]) {
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, g = lane >> 2, q = lane & 3u;
    float acc[kTilesN][kRH][4];
#pragma unroll
    for (uint32_t j = 0; j < kTilesN; j++)
#pragma unroll
        for (int h = 0; h < kRH; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][h][e] = 0.0f;

    constexpr int kStages = stages(kBits);
    const uint32_t* words = pin(trellis + size_t(nb) * kTilesN * words_per_tile(kBits) + lane_word<kBits>(lane));
    const uint2* frags = a_frag + lane;
    Stage<kRH, kBits> st[kStages];
#pragma unroll
    for (int i = 0; i < kStages; i++)
        if (gb + i < ge) load_stage(st[i], words, frags, elpis_gemm_ktile(gb + i, warp), tiles_n);
    for (uint32_t g0 = gb; g0 < ge; g0 += kStages) {
#pragma unroll
        for (int i = 0; i < kStages; i++) {
            if (g0 + i < ge) {
                mma_stage(st[i], acc, lane);
                if (g0 + i + kStages < ge)
                    load_stage(st[i], words, frags, elpis_gemm_ktile(g0 + i + kStages, warp), tiles_n);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < kRH; h++) {
#pragma unroll
        for (uint32_t j = 0; j < kTilesN; j++) {
            const uint32_t c = j * 16u + g;
            red[warp][2 * q][c] = acc[j][h][0];
            red[warp][2 * q + 1][c] = acc[j][h][1];
            red[warp][2 * q][c + 8] = acc[j][h][2];
            red[warp][2 * q + 1][c + 8] = acc[j][h][3];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t idx = threadIdx.x + 256u * i, r = idx >> 7, c = idx & 127u;
            float v = red[0][r][c];
#pragma unroll
            for (uint32_t w = 1; w < kWarps; w++) v += red[w][r][c];
            total[h][i] = v;
        }
        __syncthreads();
    }
}

// y [rows < m, n-block nb] = (total H) / sqrt(128) * svh, one row per warp (red is scratch; ends on a barrier).
template <int kRH>
__device__ __forceinline__ void finish(const float (&total)[kRH][4], float (&red)[kWarps][8][kRedStride],
                                       const float (&scale)[4], void* __restrict__ out, uint32_t mode,
                                       uint32_t m, uint32_t n, uint32_t nb) {
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    float* const part = &red[0][0][0];  // [16 rows][kRedStride]
#pragma unroll
    for (int h = 0; h < kRH; h++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t idx = threadIdx.x + 256u * i;
            part[(8u * h + (idx >> 7)) * kRedStride + (idx & 127u)] = total[h][i];
        }
    __syncthreads();
    const uint32_t c0 = nb * kBlockN + lane * 4u;
    for (uint32_t r = warp; r < m; r += kWarps) {
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = part[r * kRedStride + lane * 4u + j];
        fwht128(v, lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float y = (v[j] * kInvSqrt128) * scale[j];
            if (mode == kOutF32)
                static_cast<float*>(out)[size_t(r) * n + c0 + j] = y;
            else if (mode == kOutBf16ChannelMajor)  // fp16 first: the bits of the fp16 y cast to bf16
                static_cast<__nv_bfloat16*>(out)[size_t(c0 + j) * m + r] =
                    __float2bfloat16_rn(__half2float(__float2half_rn(y)));
            else
                static_cast<__half*>(out)[size_t(r) * n + c0 + j] = __float2half_rn(y);
        }
    }
    __syncthreads();
}

// Diagnostic build (ELPIS_GEMM_CLOCKS, never served): thread 0 of every block writes its timeline into
// gemm_clock[block]: %globaltimer at the start, after each n-block's main loop (up to three) and at the end,
// the n-blocks it finished, its multiprocessor, and for the last n-block whose partials it summed, when it saw
// the final count and when the sum was done (elpis/bench/scripts/rows_gemm_timeline.py reads them).
#ifdef ELPIS_GEMM_CLOCKS
// start, loop ends[3], end, n-blocks, finished, SM; of the last n-block it folded: count seen, fold done
constexpr uint32_t kClockBlocks = 4096, kClockWords = 10;
__device__ unsigned long long gemm_clock[kClockBlocks][kClockWords];
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint32_t sm_id() {
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#define ELPIS_CLOCK(word, value) \
    do { if (threadIdx.x == 0u && blockIdx.x < kClockBlocks) gemm_clock[blockIdx.x][word] = (value); } while (0)
#endif

// Partials of each output per round of the fold's loads: two were faster than four or eight (device call 91:
// 10.64 ms for a 16-row verify's GEMMs against 11.22 and 10.72; the main loop compiles differently with each).
#ifndef ELPIS_GEMM_FOLD_BATCH
#define ELPIS_GEMM_FOLD_BATCH 2
#endif
constexpr uint32_t kFoldBatch = ELPIS_GEMM_FOLD_BATCH;

// total[h][i] = the sum, in ascending block order, of the partials of this thread's outputs (rows 8h + (t >> 7) + 2i,
// column t & 127) in `first` (the first block's slot) and the `more` slots after it. The loads of all the outputs go
// out together, kFoldBatch partials of each at a time (past the last partial the address is the last one's, and the add
// is skipped), before their adds. A row past m reads row 0's partials; its sum is never stored.
template <int kRH>
__device__ __forceinline__ void fold_partials(const float* __restrict__ first, uint32_t m, uint32_t more, float (&total)[kRH][4]) {
    const size_t stride = size_t(m) * kBlockN;
    const float* src[kRH][4];
#pragma unroll
    for (int h = 0; h < kRH; h++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t idx = threadIdx.x + 256u * i, r = 8u * h + (idx >> 7), c = idx & 127u;
            src[h][i] = first + size_t(r < m ? r : 0u) * kBlockN + c;
            total[h][i] = load_partial(src[h][i]);
        }
    for (uint32_t s = 1u; s <= more; s += kFoldBatch) {
        float part[kRH][4][kFoldBatch];
#pragma unroll
        for (int h = 0; h < kRH; h++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (uint32_t e = 0; e < kFoldBatch; e++)
                    part[h][i][e] = load_partial(src[h][i] + (s + e <= more ? s + e : more) * stride);
#pragma unroll
        for (int h = 0; h < kRH; h++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (uint32_t e = 0; e < kFoldBatch; e++)
                    if (s + e <= more) total[h][i] += part[h][i][e];
    }
}

// The members of one call: member i owns the n-blocks [nb_end[i-1], nb_end[i]) of the call's n-block order (the
// slots past count hold the total, so they own none).
struct Members {
    const uint32_t* trellis[kMaxMembers];
    const __half* svh[kMaxMembers];
    void* out[kMaxMembers];
    uint32_t nb_end[kMaxMembers];
    uint32_t count;
    uint32_t out_modes;    // bit i: member i writes fp32; bit kBf16Shift + i: bf16 channel-major (else fp16)
    uint64_t frag_halves;  // one member's input fragments
};

// Where n-block nb (of the call's n-block order) lies: its member mi, that member's first n-block nb0 and width n,
// and the groups [gb, ge) of it that the units [u0, u1) hold.
struct Place {
    uint32_t mi, nb0, n, gb, ge;
};

__device__ __forceinline__ Place place_of(const Members& members, uint32_t nb, uint32_t groups, uint32_t u0,
                                          uint32_t u1) {
    uint32_t mi = 0, nb0 = 0;
#pragma unroll
    for (uint32_t j = 0; j + 1u < kMaxMembers; j++)
        if (nb >= members.nb_end[j]) mi = j + 1u, nb0 = members.nb_end[j];
    const uint32_t base = nb * groups;
    return {mi, nb0, (pick(members.nb_end, mi) - nb0) * kBlockN, (u0 > base ? u0 : base) - base,
            (u1 < base + groups ? u1 : base + groups) - base};
}

// Stream-K over units (n-block, group), n-block major over all members' n-blocks: block b takes units
// [begin(b), end(b)) of the proved partition, so every block gets the same work to one unit. A block that holds a
// whole n-block finishes it; the blocks sharing one write their partials to slot b + nb of `workspace`
// ([slots][m][128] floats: the pairs (block, n-block) lie on a monotone staircase, so b + nb is unique) and the
// last to arrive (counted in `counters`, one zero word per n-block, left zero again) sums them in ascending block
// order and finishes it. Two blocks per multiprocessor (the grid is one wave of them): up to 128 registers.
// ELPIS_GEMM_MIN_BLOCKS (2 unless a diagnostic build asks): the launch bound's blocks a multiprocessor, which sets the
// registers a thread (65,536 / (256 x 2) = 128) and, through resident_blocks, the stream-K grid.
#ifndef ELPIS_GEMM_MIN_BLOCKS
#define ELPIS_GEMM_MIN_BLOCKS 2
#endif
template <int kRH, int kBits>
__global__ void __launch_bounds__(256, ELPIS_GEMM_MIN_BLOCKS)
    rows_gemm_kernel(const uint2* __restrict__ a_frag, const Members members, uint32_t m, uint32_t k,
                     float* __restrict__ workspace, uint32_t* __restrict__ counters) {
    __shared__ float red[kWarps][8][kRedStride];
    __shared__ uint32_t last_flag;
    const uint32_t b = blockIdx.x, blocks = gridDim.x;
    const uint32_t groups = k / kGroupK, units = groups * pick(members.nb_end, members.count - 1u);
    const uint32_t u0 = elpis_gemm_split_begin(units, blocks, b), u1 = elpis_gemm_split_end(units, blocks, b);
#ifdef ELPIS_GEMM_CLOCKS
    uint32_t clock_nbs = 0, clock_finished = 0;
    ELPIS_CLOCK(0, global_ns());
    ELPIS_CLOCK(7, sm_id());
#endif
    for (uint32_t nb = u0 / groups; nb * groups < u1; nb++) {
        const Place pl = place_of(members, nb, groups, u0, u1);
        const uint32_t mi = pl.mi, nb0 = pl.nb0, n = pl.n, base = nb * groups;
        float total[kRH][4];
        accumulate<kRH, kBits>(a_frag + mi * (members.frag_halves / 4u), pick(members.trellis, mi), nb - nb0, pl.gb,
                               pl.ge, n / 16u, red, total);
#ifdef ELPIS_GEMM_CLOCKS
        if (clock_nbs < 3u) ELPIS_CLOCK(1u + clock_nbs, global_ns());
        clock_nbs++;
#endif
        const uint32_t first = elpis_gemm_owner(units, blocks, base);
        const uint32_t last = elpis_gemm_owner(units, blocks, base + groups - 1u);
        if (first != last) {
#pragma unroll
            for (int h = 0; h < kRH; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t idx = threadIdx.x + 256u * i, r = 8u * h + (idx >> 7), c = idx & 127u;
                    if (r < m) workspace[(size_t(b + nb) * m + r) * kBlockN + c] = total[h][i];
                }
            ELPIS_FENCE();
            __syncthreads();
            if (threadIdx.x == 0) last_flag = atomic_inc(&counters[nb]) == last - first;
            __syncthreads();
            if (!last_flag) continue;
            ELPIS_FENCE();
#ifdef ELPIS_GEMM_CLOCKS
            ELPIS_CLOCK(8, global_ns());
#endif
            fold_partials<kRH>(workspace + size_t(first + nb) * m * kBlockN, m, last - first, total);
#ifdef ELPIS_GEMM_CLOCKS
            ELPIS_CLOCK(9, global_ns());
#endif
            if (threadIdx.x == 0) counters[nb] = 0u;
        }
        float scale[4];  // this lane's four output scales, one load
        load_scale4(pick(members.svh, mi) + (nb - nb0) * kBlockN + (threadIdx.x & 31u) * 4u, scale);
        const uint32_t mode = (members.out_modes >> mi) & 1u ? kOutF32
                              : (members.out_modes >> (kBf16Shift + mi)) & 1u ? kOutBf16ChannelMajor : kOutF16;
        finish<kRH>(total, red, scale, pick(members.out, mi), mode, m, n, nb - nb0);
#ifdef ELPIS_GEMM_CLOCKS
        clock_finished++;
#endif
    }
#ifdef ELPIS_GEMM_CLOCKS
    ELPIS_CLOCK(4, global_ns());
    ELPIS_CLOCK(5, clock_nbs);
    ELPIS_CLOCK(6, clock_finished);
#endif
}

uint32_t row_halves_for(uint32_t m) { return m > 8u ? 2u : 1u; }

bool bits_ok(uint32_t bits) { return bits == 4u || bits == 6u; }

// The stream-K grid's block count for this GPU and trellis width: its multiprocessors times the blocks of the
// 16-row kernel one holds (two on the H200 and the RTX 3090), so the grid is one full wave with every
// multiprocessor equally loaded. Every row count uses this one number, so the partition (hence the summation
// order) is the same for 1 and for 16 rows.
uint32_t resident_blocks(uint32_t bits) {
    static uint32_t cached[64][2] = {};
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    if (device < 0 || device >= 64) return 1u;
    uint32_t& slot = cached[device][bits == 6u ? 1 : 0];
    if (slot == 0u) {
        int fit = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (bits == 6u)
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, rows_gemm_kernel<2, 6>, 256, 0);
        else
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, rows_gemm_kernel<2, 4>, 256, 0);
        slot = uint32_t(sms > 0 ? sms : 1) * uint32_t(fit > 0 ? fit : 1);
    }
    return slot;
}

// Blocks of the stream-K grid for k and the members' n together: resident_blocks(bits), or one per unit when
// there are fewer (a function of k, n, the trellis width and the GPU, never of the row count).
uint32_t blocks_for(uint32_t k, uint32_t n, uint32_t bits) {
    return elpis_gemm_blocks((k / kGroupK) * (n / kBlockN), resident_blocks(bits));
}

}  // namespace

extern "C" {

// Rows, k and n (one member's) the kernel takes: 1..16 rows, k and n multiples of 128.
uint32_t elpis_rows_gemm_supported(uint32_t m, uint32_t k, uint32_t n) {
    return m >= 1u && m <= 16u && k >= kGroupK && k % kGroupK == 0u && n >= kBlockN && n % kBlockN == 0u &&
           k / kGroupK <= 4096u && n / kBlockN <= kMaxNBlocks;
}

// Members one call takes; n-blocks of 128 columns, all members together.
uint32_t elpis_rows_gemm_max_members(void) { return kMaxMembers; }
uint32_t elpis_rows_gemm_max_nblocks(void) { return kMaxNBlocks; }

// Trellis widths the kernel decodes (4 and 6 bits per weight, mul1 codebook).
uint32_t elpis_rows_gemm_bits_supported(uint32_t bits) { return bits_ok(bits); }

// n: all members' output columns together; bits: 4 or 6 (0 for another width).
uint32_t elpis_rows_gemm_blocks(uint32_t k, uint32_t n, uint32_t bits) {
    return bits_ok(bits) ? blocks_for(k, n, bits) : 0u;
}

// The stream-K block count's input besides k and n (resident_blocks above).
uint32_t elpis_rows_gemm_resident_blocks(uint32_t bits) { return bits_ok(bits) ? resident_blocks(bits) : 0u; }

#ifdef ELPIS_GEMM_CLOCKS
// The diagnostic timeline of the last launch (kClockBlocks x kClockWords words) into host memory `dst`.
int elpis_rows_gemm_clocks(void* dst) {
    return static_cast<int>(cudaMemcpyFromSymbol(dst, gemm_clock, sizeof(gemm_clock)));
}
#endif

// Scratch sizes: the input fragments of one member (halves) and the split partials (floats; n: all members
// together).
uint64_t elpis_rows_gemm_frag_halves(uint32_t m, uint32_t k) { return uint64_t(k) * 16u * row_halves_for(m); }
uint64_t elpis_rows_gemm_workspace_floats(uint32_t m, uint32_t k, uint32_t n, uint32_t bits) {
    return bits_ok(bits) ? (uint64_t(blocks_for(k, n, bits)) + n / kBlockN) * m * kBlockN : 0u;
}
// Zeroed words the counters must hold: one per n-block (n: all members together).
uint32_t elpis_rows_gemm_counters(uint32_t n) { return n / kBlockN; }

// D [k, n] fp16 (row-major) = the decoded trellis (`bits` per weight), for tests against the format's reference.
int elpis_rows_gemm_decode(const void* trellis, void* d, uint32_t k, uint32_t n, uint32_t bits, void* stream) {
    if (k % 16u != 0u || n % 16u != 0u || k == 0u || n == 0u || k / 16u > 65535u || !bits_ok(bits))
        return static_cast<int>(cudaErrorInvalidValue);
    const auto kernel = bits == 4u ? rows_gemm_decode<4> : rows_gemm_decode<6>;
    kernel<<<dim3(n / 16u, k / 16u), 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint32_t*>(trellis), static_cast<__half*>(d), n);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"

namespace {

// The checks and launches shared by the entries below; `input(grid, scales, frags, row_halves, frag_halves, s)`
// launches the input transform.
template <typename Input>
int rows_gemm_call(const Input& input, uint32_t m, uint32_t k, uint32_t count, const void* const* suh,
                   const void* const* trellis, const void* const* svh, void* const* out, const uint32_t* n,
                   uint32_t out_modes, uint32_t bits, void* a_frag, uint64_t frag_halves, float* workspace,
                   uint64_t workspace_floats, uint32_t* counters, uint32_t counters_len, void* stream) {
    if (count < 1u || count > kMaxMembers || !bits_ok(bits)) return static_cast<int>(cudaErrorInvalidValue);
    const uint32_t member_bits = (1u << count) - 1u;  // a mode for members past count, or two for one, is refused
    if (out_modes & ~(member_bits | (member_bits << kBf16Shift)) || out_modes & (out_modes >> kBf16Shift))
        return static_cast<int>(cudaErrorInvalidValue);
    Members members{};
    MemberScales scales{};
    uint32_t n_total = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (!elpis_rows_gemm_supported(m, k, n[i])) return static_cast<int>(cudaErrorInvalidValue);
        if (reinterpret_cast<uintptr_t>(svh[i]) % 8u != 0u)  // read four scales at a time
            return static_cast<int>(cudaErrorInvalidValue);
        n_total += n[i];
        members.trellis[i] = static_cast<const uint32_t*>(trellis[i]);
        members.svh[i] = static_cast<const __half*>(svh[i]);
        members.out[i] = out[i];
        members.nb_end[i] = n_total / kBlockN;
        scales.suh[i] = static_cast<const __half*>(suh[i]);
    }
    const uint64_t one = elpis_rows_gemm_frag_halves(m, k);
    if (n_total / kBlockN > kMaxNBlocks || frag_halves < one * count ||
        workspace_floats < elpis_rows_gemm_workspace_floats(m, k, n_total, bits) ||
        counters_len < elpis_rows_gemm_counters(n_total))
        return static_cast<int>(cudaErrorInvalidValue);
    for (uint32_t i = count; i < kMaxMembers; i++) members.nb_end[i] = n_total / kBlockN;  // owns no n-block
    members.count = count;
    members.out_modes = out_modes;
    members.frag_halves = one;
    const uint32_t rh = row_halves_for(m);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    input(dim3(k / kGroupK, rh * 2u, count), scales, static_cast<__half*>(a_frag), rh, one, s);
    const dim3 grid(blocks_for(k, n_total, bits));
    const uint2* frags = static_cast<const uint2*>(a_frag);
    const auto kernel = bits == 4u ? (rh == 1u ? rows_gemm_kernel<1, 4> : rows_gemm_kernel<2, 4>)
                                   : (rh == 1u ? rows_gemm_kernel<1, 6> : rows_gemm_kernel<2, 6>);
    kernel<<<grid, 256, 0, s>>>(frags, members, m, k, workspace, counters);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

// For each of `count` (1..4) EXL3 linears i sharing the input x [m, k] fp16: out[i] [m, n[i]] (fp32 where bit i
// of out_modes is set; bf16 [n[i], m], channel-major, where bit 8 + i is; else fp16) = the linear (`bits`-bit
// mul1 trellis[i] [k/16, n[i]/16, 16 * bits] uint16, suh[i] [k], svh[i] [n[i]] fp16) of x. a_frag holds count * frag_halves(m, k) halves; workspace and counters are sized for
// the members' n together. Returns 0 or a CUDA error code (cudaErrorInvalidValue: a shape or scratch size
// outside what the entries above say).
int elpis_rows_gemm(const void* x, uint32_t m, uint32_t k, uint32_t count, const void* const* suh,
                    const void* const* trellis, const void* const* svh, void* const* out, const uint32_t* n,
                    uint32_t out_modes, uint32_t bits, void* a_frag, uint64_t frag_halves, float* workspace,
                    uint64_t workspace_floats, uint32_t* counters, uint32_t counters_len, void* stream) {
    const auto input = [&](dim3 grid, const MemberScales& scales, __half* frag, uint32_t rh, uint64_t one,
                           cudaStream_t s) {
        rows_gemm_input<<<grid, 128, 0, s>>>(static_cast<const __half*>(x), scales, frag, m, k, rh, one);
    };
    return rows_gemm_call(input, m, k, count, suh, trellis, svh, out, n, out_modes, bits, a_frag, frag_halves,
                          workspace, workspace_floats, counters, counters_len, stream);
}

// As elpis_rows_gemm with the input x = silu(g) * u (g, u [m, k] fp16, the fp16 arithmetic of ExLlamaV3's
// SiLU-and-multiply), which is also written to act [m, k] fp16: an MLP's activation and its down projection in
// two launches instead of three.
int elpis_rows_gemm_silu_mul(const void* g, const void* u, void* act, uint32_t m, uint32_t k, uint32_t count,
                             const void* const* suh, const void* const* trellis, const void* const* svh,
                             void* const* out, const uint32_t* n, uint32_t out_modes, uint32_t bits, void* a_frag,
                             uint64_t frag_halves, float* workspace, uint64_t workspace_floats, uint32_t* counters,
                             uint32_t counters_len, void* stream) {
    if (reinterpret_cast<uintptr_t>(g) % 4u != 0u || reinterpret_cast<uintptr_t>(u) % 4u != 0u ||
        reinterpret_cast<uintptr_t>(act) % 4u != 0u)  // read and written as fp16 pairs
        return static_cast<int>(cudaErrorInvalidValue);
    const auto input = [&](dim3 grid, const MemberScales& scales, __half* frag, uint32_t rh, uint64_t one,
                           cudaStream_t s) {
        rows_gemm_input_silu_mul<<<grid, 128, 0, s>>>(static_cast<const __half*>(g), static_cast<const __half*>(u),
                                                      static_cast<__half*>(act), scales, frag, m, k, rh, one);
    };
    return rows_gemm_call(input, m, k, count, suh, trellis, svh, out, n, out_modes, bits, a_frag, frag_halves,
                          workspace, workspace_floats, counters, counters_len, stream);
}

// The GEMM launch alone, over fragments an earlier launch wrote (elpis_rows_gemm_norm_input): the arguments of
// elpis_rows_gemm without x.
int elpis_rows_gemm_frags(uint32_t m, uint32_t k, uint32_t count, const void* const* suh, const void* const* trellis,
                          const void* const* svh, void* const* out, const uint32_t* n, uint32_t out_modes,
                          uint32_t bits, void* a_frag, uint64_t frag_halves, float* workspace,
                          uint64_t workspace_floats, uint32_t* counters, uint32_t counters_len, void* stream) {
    const auto none = [](dim3, const MemberScales&, __half*, uint32_t, uint64_t, cudaStream_t) {};
    return rows_gemm_call(none, m, k, count, suh, trellis, svh, out, n, out_modes, bits, a_frag, frag_halves,
                          workspace, workspace_floats, counters, counters_len, stream);
}

// ExLlamaV3's RMSNorm of x [m, k] (fp16 or fp32; with `residual` [m, k] fp32, the norm of residual += x, which
// it writes back: a Qwen3.5 block's sublayer outputs are fp32), weight [k] fp16 or bf16, into y [m, k] fp16, and in the same launch the
// input fragments of `count` members (suh[i] [k] fp16) for elpis_rows_gemm_frags. Takes the rows ExLlamaV3 norms
// in two passes of 1,024 threads with at most two float4 columns a thread (4096 < k <= 8192), 1..16 rows.
int elpis_rows_gemm_norm_input(const void* x, uint32_t x_fp32, float* residual, const void* weight,
                               uint32_t weight_bf16, void* y, float eps, float bias, float scale, uint32_t m,
                               uint32_t k, uint32_t count, const void* const* suh, void* a_frag,
                               uint64_t frag_halves, void* stream) {
    if (count < 1u || count > kMaxMembers || m < 1u || m > 16u || k % kGroupK != 0u || k / 4u <= kNormThreads ||
        k / 4u > 2u * kNormThreads || frag_halves < elpis_rows_gemm_frag_halves(m, k) * count)
        return static_cast<int>(cudaErrorInvalidValue);
    MemberScales scales{};
    for (uint32_t i = 0; i < count; i++) scales.suh[i] = static_cast<const __half*>(suh[i]);
    const NormArgs args{x, residual, weight, static_cast<__half*>(y), eps, bias, scale, x_fp32, weight_bf16};
    const uint32_t rh = row_halves_for(m);
    rows_gemm_norm_input<<<rh * 8u, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        args, scales, count, static_cast<__half*>(a_frag), m, k, rh, elpis_rows_gemm_frag_halves(m, k));
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
