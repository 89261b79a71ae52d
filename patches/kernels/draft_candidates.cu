// A draft block's candidates in two launches (issue 9: the round's kernels between the draft and the tree). The
// tree builder needs per block row the selector's chain token and the k most likely tokens, each with its
// log-probability under the row's log-softmax over the whole vocabulary (`drafter.pack_candidates`' layout).
// torch made them in about eight launches (a cast, the log-softmax's max and sum passes, gather, topk's radix
// passes, cat); its `topk` call alone was 0.14 ms of host time a round (call 124's profile,
// bench/results/tree/README.md), and rounds on the GPU queue every launch from the host.
//
// A row is cut into spans of 2^kSpanShift 16-byte vectors (at most 2^kSpanCap a row: the proved partition of
// bend/row_spans.bend, row_scan.cuh), one block a span, so that a
// block of 7 rows covers the GPU instead of 7 multiprocessors (session 39's one block a row: 268 us against
// torch's 144 on the H200, call 149). A span's block reads its logits twice (the second read from L2):
//   pass 0  each thread's largest (value, index) key; the block's k-th largest of these is a floor: the k
//           thread maxima at or above it are k keys of the span, so none of the span's k best is below it.
//           The largest is the span's maximum m (NaN when it holds a NaN).
//   pass 1  each thread keeps the 16 best keys at or above the floor it sees, sorted, in registers (above the
//           floor an insertion is rare, so a warp seldom waits on one), and sums exp(x - m) in index order;
//           the block then takes the span's k best of all threads' lists in k rounds of a block maximum, and
//           its sum S_s by a fixed reduction tree.
// Which thread reads which logits, and the order of the blocks' maxima and sums (warp butterflies, then warp 0 over
// the warps), is the proved schedule bend/row_scan_schedule.bend (row_scan.cuh): it depends on the block size alone.
// The merge launch, one block a row, takes the row's k best of its spans' k best (the row's k best are among
// them: every key is unique), the row's maximum M (the best key's), and S = sum over spans in a fixed order of
// S_s * exp(m_s - M) (a span of -inf only adds nothing). A log-probability is (x - M) - log(S) in fp32,
// log_softmax's formula; only S's summation differs from torch's, so it can differ from torch's in the last bits
// (tests/kernels/test_draft_candidates_emu.py bounds the error against fp64). The candidates only shape the
// tree: the acceptor commits the target's own tokens whatever the draft proposes, so these bits never reach the
// output (elpis/spec/README.md).
// Order of candidates: a NaN before every number (as torch.topk), then the larger value, then the lower index
// (torch leaves ties unordered); -0 and +0 are equal. A row with a NaN or +inf, or of -inf only, gets NaN
// log-probabilities everywhere, as torch's log_softmax gives.
//
// Inputs: fp16 (what ExLlamaV3's head writes) or fp32 rows of `vocab` logits, row r at logits + r * row_stride,
// 16-byte aligned rows (vector loads); chain int64 [rows]; a workspace of the spans' keys and sums
// (elpis_draft_candidates_spans gives the spans a row); out fp32 [rows, 2 + 2k]: chain id, its log-probability, k
// ids, k log-probabilities. A chain id outside [0, vocab) gets a NaN log-probability. Ampere instructions only.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "row_scan.cuh"

namespace {

// Threads of a block, a power of two (a test build may take fewer: only the sums' reduction trees change).
#ifndef ELPIS_DRAFT_CANDIDATES_THREADS
#define ELPIS_DRAFT_CANDIDATES_THREADS 256
#endif
// 16-byte vectors a span, and the most spans a row (a longer row gets longer spans). A test build takes short
// spans so that small vocabularies are cut into several.
#ifndef ELPIS_DRAFT_CANDIDATES_SPAN_VECTORS
#define ELPIS_DRAFT_CANDIDATES_SPAN_VECTORS 1024
#endif
#ifndef ELPIS_DRAFT_CANDIDATES_MAX_SPANS
#define ELPIS_DRAFT_CANDIDATES_MAX_SPANS 64
#endif
constexpr uint32_t kThreads = ELPIS_DRAFT_CANDIDATES_THREADS;
static_assert(kThreads >= 32 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0, "a power of two block");
// log2 of the block: whole warps, at most 32 of them (inside the row scan schedule's proved domain)
constexpr uint32_t kThreadShift = row_scan::kBlockShift<kThreads>;
static_assert(kThreadShift >= ELPIS_ROWSCAN_WARP_SHIFT, "whole warps");
// log2 of the span's vectors and of the most spans a row (powers of two inside the row spans' proved domain)
constexpr uint32_t kSpanShift = row_scan::log2_in_domain<ELPIS_DRAFT_CANDIDATES_SPAN_VECTORS, ELPIS_ROWSPANS_MAX_BASE>();
constexpr uint32_t kSpanCap = row_scan::log2_in_domain<ELPIS_DRAFT_CANDIDATES_MAX_SPANS, ELPIS_ROWSPANS_MAX_CAP>();
constexpr uint32_t kWarps = kThreads >> ELPIS_ROWSCAN_WARP_SHIFT;  // the schedule's elpis_rowscan_warps(kThreadShift)
constexpr int kMaxK = 16;
constexpr uint32_t kIndexBits = 24;  // ids travel as float32 in the packed row: exact below 2^24
constexpr uint64_t kIndexMask = (uint64_t(1) << kIndexBits) - 1;

#ifdef ELPIS_CUDA_EMU
inline uint32_t shfl_xor_u32(uint32_t v, uint32_t m) { return emu_shfl_u32(v, (threadIdx.x & 31u) ^ m); }
#else
__device__ __forceinline__ uint32_t shfl_xor_u32(uint32_t v, uint32_t m) {
    return __shfl_xor_sync(0xffffffffu, v, m);
}
#endif

using row_scan::Logit;

// A logit's place in the candidates' order, from its bits (larger first: NaN above +inf, -0 as +0), and the
// value back from that place.
template <typename T>
struct Order;
template <>
struct Order<__half> {
    static constexpr uint64_t kNan = uint64_t(1) << 16;
    __device__ static uint64_t of(uint32_t b) {
        if ((b & 0x7fffu) > 0x7c00u) return kNan;
        if (b == 0x8000u) b = 0u;
        return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
    }
    __device__ static float value(uint64_t order) {
        if (order == kNan) return __int_as_float(0x7fffffff);
        const uint32_t o = static_cast<uint32_t>(order);
        return Logit<__half>::value((o & 0x8000u) ? (o & 0x7fffu) : (~o & 0xffffu));
    }
};
template <>
struct Order<float> {
    static constexpr uint64_t kNan = uint64_t(1) << 32;
    __device__ static uint64_t of(uint32_t b) {
        if ((b & 0x7fffffffu) > 0x7f800000u) return kNan;
        if (b == 0x80000000u) b = 0u;
        return (b & 0x80000000u) ? uint64_t(~b) : uint64_t(b | 0x80000000u);
    }
    __device__ static float value(uint64_t order) {
        if (order == kNan) return __int_as_float(0x7fffffff);
        const uint32_t o = static_cast<uint32_t>(order);
        return Logit<float>::value((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
    }
};

// The 16 best keys a thread has seen, sorted, largest first; 0 is below every key (every logit's order is at
// least that of -inf, which is above 0).
struct Best {
    uint64_t keys[kMaxK];
    __device__ void clear() {
#pragma unroll
        for (int j = 0; j < kMaxK; j++) keys[j] = 0;
    }
    __device__ void insert(uint64_t key) {
        if (key <= keys[kMaxK - 1]) return;
        // every slot from the back: the one before it moves down while the key is above it, the key lands in
        // the first slot it is not above the slot before
#pragma unroll
        for (int j = kMaxK - 1; j > 0; j--)
            keys[j] = key > keys[j - 1] ? keys[j - 1] : (key > keys[j] ? key : keys[j]);
        keys[0] = key > keys[0] ? key : keys[0];
    }
    __device__ void pop() {
#pragma unroll
        for (int j = 0; j < kMaxK - 1; j++) keys[j] = keys[j + 1];
        keys[kMaxK - 1] = 0;
    }
};

__device__ __forceinline__ uint64_t make_key(uint64_t order, uint32_t index) {
    return (order << kIndexBits) | (kIndexMask - index);
}
__device__ __forceinline__ uint32_t key_index(uint64_t key) {
    return static_cast<uint32_t>(kIndexMask - (key & kIndexMask));
}
__device__ __forceinline__ uint64_t key_order(uint64_t key) { return key >> kIndexBits; }

__device__ __forceinline__ uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }
__device__ __forceinline__ float shfl_xor_f32(float v, uint32_t m) {
    return __int_as_float(static_cast<int>(shfl_xor_u32(static_cast<uint32_t>(__float_as_int(v)), m)));
}
// A warp's sum by the schedule's butterfly: lane i adds s_i + s_(i^d), lane i^d the same two numbers the other way
// round, so every lane ends with the same bits.
__device__ __forceinline__ float warp_sum_f32(float v) {
    row_scan::each_butterfly_xor([&](uint32_t m) { v += shfl_xor_f32(v, m); });
    return v;
}
__device__ __forceinline__ uint64_t warp_max(uint64_t v) {
    row_scan::each_butterfly_xor([&](uint32_t m) {
        const uint32_t lo = shfl_xor_u32(static_cast<uint32_t>(v), m);
        const uint32_t hi = shfl_xor_u32(static_cast<uint32_t>(v >> 32), m);
        v = max_key(v, (uint64_t(hi) << 32) | lo);
    });
    return v;
}

// The block's k best keys of all threads' lists into chosen[0..k), largest first, in k rounds of a block
// maximum (each round's winner pops it: keys are unique, by their index). Every thread reads chosen after it.
__device__ __forceinline__ void block_top(Best& best, uint32_t k, uint64_t* warp_best, uint64_t* chosen) {
    const uint32_t lane = elpis_rowscan_lane_of(threadIdx.x), warp = elpis_rowscan_warp_of(threadIdx.x);
    for (uint32_t q = 0; q < k; q++) {
        const uint64_t head = warp_max(best.keys[0]);
        if (lane == 0) warp_best[warp] = head;
        __syncthreads();
        if (warp == 0) {
            const uint64_t w = warp_max(lane < kWarps ? warp_best[lane] : 0);
            if (lane == 0) chosen[q] = w;
        }
        __syncthreads();
        if (best.keys[0] == chosen[q]) best.pop();
    }
}

using row_scan::Spans;
__host__ __device__ inline Spans spans_of(uint32_t vocab, uint32_t fp16) {
    return row_scan::spans_of(vocab, fp16, kSpanShift, kSpanCap);
}

// A block's sum of one float a thread, by a fixed tree (warp butterflies, then warp 0 over the warps' sums);
// every thread gets the same bits.
__device__ __forceinline__ float block_sum(float v, float* warp_sum) {
    const uint32_t lane = elpis_rowscan_lane_of(threadIdx.x), warp = elpis_rowscan_warp_of(threadIdx.x);
    v = warp_sum_f32(v);
    if (lane == 0) warp_sum[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const float s = warp_sum_f32(lane < kWarps ? warp_sum[lane] : 0.0f);
        if (lane == 0) warp_sum[kWarps] = s;
    }
    __syncthreads();
    return warp_sum[kWarps];
}

// Block (span s, row r): the span's k best keys into keys[(r * spans + s) * k ..] and its sum of exp(x - m) into
// sums[r * spans + s].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    draft_candidates_span_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab, uint32_t k,
                                 Spans spans, uint64_t* __restrict__ keys, float* __restrict__ sums) {
    __shared__ uint64_t warp_best[kWarps];
    __shared__ uint64_t chosen[kMaxK];
    __shared__ float warp_sum[kWarps + 1];
    const uint32_t s = blockIdx.x, r = blockIdx.y;
    const T* row = logits + static_cast<size_t>(r) * row_stride;

    // pass 0: each thread's largest key; the k-th largest of them is the floor, the largest the span's maximum
    Best best;
    best.clear();
    row_scan::each_logit_of_span<T, kThreads>(row, vocab, spans, s, [&](uint32_t b, uint32_t i) {
        best.keys[0] = max_key(best.keys[0], make_key(Order<T>::of(b), i));
    });
    block_top(best, k, warp_best, chosen);
    const uint64_t floor = chosen[k - 1], floor_order = key_order(floor);
    const float m = Order<T>::value(key_order(chosen[0]));
    // pass 1: each thread's 16 best keys at or above the floor, and its sum of exp(x - m) in index order
    best.clear();
    float sum = 0.0f;
    row_scan::each_logit_of_span<T, kThreads>(row, vocab, spans, s, [&](uint32_t b, uint32_t i) {
        sum += expf(Logit<T>::value(b) - m);
        const uint64_t order = Order<T>::of(b);
        if (order >= floor_order) {
            const uint64_t key = make_key(order, i);
            if (key >= floor) best.insert(key);
        }
    });
    block_top(best, k, warp_best, chosen);
    sum = block_sum(sum, warp_sum);
    const size_t at = static_cast<size_t>(r) * spans.count + s;
    if (threadIdx.x < k) keys[at * k + threadIdx.x] = chosen[threadIdx.x];
    if (threadIdx.x == 0) sums[at] = sum;
}

// Block r: the row's candidates from its spans' keys and sums.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    draft_candidates_merge_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab,
                                  const int64_t* __restrict__ chain, uint32_t k, uint32_t spans,
                                  const uint64_t* __restrict__ keys, const float* __restrict__ sums,
                                  float* __restrict__ out) {
    __shared__ uint64_t warp_best[kWarps];
    __shared__ uint64_t chosen[kMaxK];
    __shared__ float warp_sum[kWarps + 1];
    const uint32_t t = threadIdx.x, r = blockIdx.x;
    const uint64_t* row_keys = keys + static_cast<size_t>(r) * spans * k;
    const float* row_sums = sums + static_cast<size_t>(r) * spans;

    Best best;
    best.clear();
    row_scan::each_of_stride<kThreads>(0u, spans * k, [&](uint32_t i) { best.insert(row_keys[i]); });
    block_top(best, k, warp_best, chosen);
    const float m = Order<T>::value(key_order(chosen[0]));
    // S: each thread its spans t, t + kThreads, ... in order (the schedule's stride), then the block's tree. A span
    // of -inf only (its maximum -inf, its own sum NaN) adds nothing; where every span is, S is 0 and every
    // log-probability NaN.
    float part = 0.0f;
    row_scan::each_of_stride<kThreads>(0u, spans, [&](uint32_t s) {
        const float ms = Order<T>::value(key_order(row_keys[s * k]));
        if (ms != -INFINITY) part += row_sums[s] * expf(ms - m);
    });
    const float log_sum = logf(block_sum(part, warp_sum));

    const T* row = logits + static_cast<size_t>(r) * row_stride;
    float* o = out + static_cast<size_t>(r) * (2 + 2 * k);
    if (t < k) {
        o[2 + t] = static_cast<float>(key_index(chosen[t]));
        o[2 + k + t] = (Order<T>::value(key_order(chosen[t])) - m) - log_sum;
    }
    if (t == 0) {
        const int64_t c = chain[r];
        const bool inside = c >= 0 && c < static_cast<int64_t>(vocab);
        o[0] = static_cast<float>(c);
        const float nan = __int_as_float(0x7fffffff);
        const float x = inside ? Logit<T>::value(Logit<T>::bits(row, static_cast<uint32_t>(c))) : nan;
        o[1] = (x - m) - log_sum;
    }
}

}  // namespace

extern "C" {

int elpis_draft_candidates_threads(void) { return static_cast<int>(kThreads); }

// The spans a row of `vocab` logits is cut into (fp16 where `fp16`, else fp32): the workspace takes
// rows * spans * (8 k + 4) bytes. -1 for a row longer than the spans' proved domain.
int elpis_draft_candidates_spans(uint32_t fp16, uint32_t vocab) {
    return row_scan::rows_fit(vocab, fp16) ? static_cast<int>(spans_of(vocab, fp16).count) : -1;
}

// out fp32 [rows, 2 + 2k] (drafter.pack_candidates' layout) from `rows` logit rows (fp16 where `fp16`, else fp32;
// `vocab` values each, row r at logits + r * row_stride, 16-byte aligned) and chain int64 [rows], on `stream`
// (a cudaStream_t passed as an address), through `workspace` (8-byte aligned, `workspace_bytes` long, at least
// what elpis_draft_candidates_spans says). Returns 0, -1 for arguments out of range, or the launch's cudaError_t.
int elpis_draft_candidates(const void* logits, uint32_t fp16, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                           const void* chain, uint32_t k, void* workspace, uint64_t workspace_bytes, void* out,
                           void* stream) {
    const uint32_t per_vector = row_scan::per_vector(fp16);
    if (logits == nullptr || chain == nullptr || out == nullptr || workspace == nullptr || rows == 0u ||
        rows > 65535u || vocab == 0u || vocab > row_stride || vocab > kIndexMask || fp16 > 1u ||
        !row_scan::rows_fit(vocab, fp16) || k == 0u ||
        k > uint32_t(kMaxK) || k > vocab || reinterpret_cast<uintptr_t>(logits) % 16u != 0u ||
        row_stride % per_vector != 0u || reinterpret_cast<uintptr_t>(workspace) % 8u != 0u)
        return -1;
    const Spans spans = spans_of(vocab, fp16);
    const uint64_t span_rows = uint64_t(rows) * spans.count;
    if (workspace_bytes < span_rows * (8u * k + 4u)) return -1;
    auto* keys = static_cast<uint64_t*>(workspace);
    auto* sums = reinterpret_cast<float*>(keys + span_rows * k);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const auto* ids = static_cast<const int64_t*>(chain);
    auto* o = static_cast<float*>(out);
    const dim3 grid(spans.count, rows);
    if (fp16) {
        const auto* x = static_cast<const __half*>(logits);
        draft_candidates_span_kernel<__half><<<grid, kThreads, 0, st>>>(x, row_stride, vocab, k, spans, keys, sums);
        draft_candidates_merge_kernel<__half><<<rows, kThreads, 0, st>>>(x, row_stride, vocab, ids, k, spans.count,
                                                                        keys, sums, o);
    } else {
        const auto* x = static_cast<const float*>(logits);
        draft_candidates_span_kernel<float><<<grid, kThreads, 0, st>>>(x, row_stride, vocab, k, spans, keys, sums);
        draft_candidates_merge_kernel<float><<<rows, kThreads, 0, st>>>(x, row_stride, vocab, ids, k, spans.count,
                                                                       keys, sums, o);
    }
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
