// The logits of a span of one row of a head's output, for kernels that read a row with several blocks, one a span
// (verify_epilogue.cu, draft_candidates.cu): one block reading a whole row of the model's vocabulary, 485 KiB of
// fp16, kept one multiprocessor busy while the others idled. A block must also keep many bytes in flight: each
// thread reads 16-byte vectors, two loads before it uses either (2-byte loads, one at a time, leave a block
// latency-bound at a few GB/s). Rows must start 16-byte aligned. Which span a block reads is the proved schedule
// bend/row_spans.bend (build/kernels/row_spans.h); which thread reads what of it, and in which order a block combines
// what its threads read, is the proved schedule bend/row_scan_schedule.bend (build/kernels/row_scan_schedule.h):
// nothing of either takes the row count, a row's index or the data.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "row_scan_schedule.h"
#include "row_spans.h"

namespace row_scan {

#ifdef ELPIS_CUDA_EMU
inline __half ushort_as_half(unsigned short u) {
    __half h;
    std::memcpy(&h, &u, 2);
    return h;
}
#else
__device__ __forceinline__ __half ushort_as_half(unsigned short u) { return __ushort_as_half(u); }
#endif

// Logits in one 16-byte vector, and one logit's bits and value.
template <typename T>
struct Logit;
template <>
struct Logit<__half> {
    static constexpr uint32_t kPerVector = 8;
    static constexpr uint32_t kFp16 = 1;  // the schedules' width argument
    __device__ static uint32_t bits(const __half* row, uint32_t c) { return __half_as_ushort(row[c]); }
    __device__ static float value(uint32_t b) { return __half2float(ushort_as_half(static_cast<unsigned short>(b))); }
};
template <>
struct Logit<float> {
    static constexpr uint32_t kPerVector = 4;
    static constexpr uint32_t kFp16 = 0;
    __device__ static uint32_t bits(const float* row, uint32_t c) {
        return static_cast<uint32_t>(__float_as_int(row[c]));
    }
    __device__ static float value(uint32_t b) { return __int_as_float(static_cast<int>(b)); }
};

// The widths the row spans' schedule counts vectors in (its law rowspans_vector_widths: 2^3 fp16, 2^2 fp32).
static_assert(Logit<__half>::kPerVector == 8u && Logit<float>::kPerVector == 4u, "16-byte vectors");

// f(bits, index) of the logits [c * kPerVector, (c + 1) * kPerVector) from one vector, in index order.
template <typename T, typename F>
__device__ __forceinline__ void each_of_vector(uint4 w, uint32_t c, F& f) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    const uint32_t base = c * Logit<T>::kPerVector;
#pragma unroll
    for (uint32_t i = 0; i < 4; i++) {
        if constexpr (Logit<T>::kPerVector == 8) {
            f(words[i] & 0xffffu, base + 2 * i);
            f(words[i] >> 16, base + 2 * i + 1);
        } else {
            f(words[i], base + i);
        }
    }
}

// A row cut into `count` spans of 2^shift 16-byte vectors each (the last may be shorter; none is empty, unless the
// row is shorter than a vector), the row's single values past its last vector in the last span: spans of 2^base
// vectors, or longer ones (a power of two) where those would be more than 2^cap. The partition is the proved
// schedule of bend/row_spans.bend (build/kernels/row_spans.h; laws: every vector in exactly one span, at most 2^cap
// spans): span s is vectors [elpis_rowspans_span_begin(s, shift), elpis_rowspans_span_end(total, s, shift)), which
// each_logit_of_span reads. The host computes the spans: the kernels take them as launch arguments. `total` must be
// below ELPIS_ROWSPANS_MAX_TOTAL (the entries refuse longer rows: rows_fit).
struct Spans {
    uint32_t count, shift;
};
__host__ __device__ inline Spans spans_of(uint32_t vocab, uint32_t fp16, uint32_t base, uint32_t cap) {
    const uint32_t total = elpis_rowspans_vectors(vocab, fp16);
    const uint32_t shift = elpis_rowspans_span_shift(total, base, cap);
    return Spans{elpis_rowspans_span_count(total, shift), shift};
}
// Whether a row of `vocab` logits is inside the schedule's proved domain.
__host__ __device__ inline bool rows_fit(uint32_t vocab, uint32_t fp16) {
    return elpis_rowspans_vectors(vocab, fp16) < ELPIS_ROWSPANS_MAX_TOTAL;
}
// log2 of a kernel's span length, most spans a row or block size, a power of two inside a schedule's domain (compile
// time).
constexpr uint32_t exact_log2(uint32_t x) { return x <= 1u ? 0u : 1u + exact_log2(x >> 1); }
template <uint32_t kValue, uint32_t kMaxLog2>
constexpr uint32_t log2_in_domain() {
    static_assert(kValue >= 1u && (kValue & (kValue - 1u)) == 0u, "a power of two");
    static_assert(exact_log2(kValue) <= kMaxLog2, "inside the row spans' proved domain");
    return exact_log2(kValue);
}
// log2 of a block of kThreads: at most 1,024 threads, the row scan schedule's proved domain.
template <uint32_t kThreads>
constexpr uint32_t kBlockShift = log2_in_domain<kThreads, ELPIS_ROWSCAN_MAX_THREAD_SHIFT>();

// The logits in a 16-byte vector of fp16 rows (`fp16`) or fp32 ones: the schedule's vector width.
__host__ __device__ inline uint32_t per_vector(uint32_t fp16) { return 1u << elpis_rowspans_vector_shift(fp16); }

// f(i) for each value thread threadIdx.x of kThreads reads of [first, end), ascending: the schedule's stride (every
// value of the range read by exactly one (thread, step); first <= end < ELPIS_ROWSCAN_MAX_END).
template <uint32_t kThreads, typename F>
__device__ __forceinline__ void each_of_stride(uint32_t first, uint32_t end, F&& f) {
    constexpr uint32_t kShift = kBlockShift<kThreads>;
    const uint32_t t = threadIdx.x, steps = elpis_rowscan_stride_steps(first, end, t, kShift);
    // not unrolled (nor was the hand-written loop this replaced): the ranges are a merge's few span results or a
    // row's few single values
#pragma unroll 1
    for (uint32_t j = 0; j < steps; j++) f(elpis_rowscan_stride_at(first, t, j, kShift));
}

// f(bits, index) of the logits thread threadIdx.x of kThreads takes from span s of a row at `row` (16-byte aligned)
// cut into `spans` (`vocab` values in all): the span's vectors by the schedule's stride, ascending, two steps' loads
// in flight, then (last span) the single values past the last vector by the same stride. Each thread sees its
// logits in ascending index order.
template <typename T, uint32_t kThreads, typename F>
__device__ __forceinline__ void each_logit_of_span(const T* row, uint32_t vocab, Spans spans, uint32_t s, F&& f) {
    constexpr uint32_t kShift = kBlockShift<kThreads>, kFp16 = Logit<T>::kFp16;
    const uint32_t total = elpis_rowspans_vectors(vocab, kFp16);
    const uint32_t first = elpis_rowspans_span_begin(s, spans.shift);
    const uint32_t end = elpis_rowspans_span_end(total, s, spans.shift);
    const uint32_t t = threadIdx.x, steps = elpis_rowscan_stride_steps(first, end, t, kShift);
    const uint4* vec = reinterpret_cast<const uint4*>(row);
    for (uint32_t j = 0; j < steps; j += 2) {
        const bool two = j + 1u < steps;
        const uint32_t c = elpis_rowscan_stride_at(first, t, j, kShift);
        const uint32_t d = elpis_rowscan_stride_at(first, t, j + 1u, kShift);
        const uint4 a = __ldg(vec + c);
        const uint4 b = two ? __ldg(vec + d) : make_uint4(0u, 0u, 0u, 0u);
        each_of_vector<T>(a, c, f);
        if (two) each_of_vector<T>(b, d, f);
    }
    each_of_stride<kThreads>(elpis_rowscan_span_singles(vocab, kFp16, s, spans.count), vocab,
                             [&](uint32_t i) { f(Logit<T>::bits(row, i), i); });
}

// The schedule's halving tree over a block's slots: at each level every thread t that combines calls combine(t,
// partner), the slot it folds into its own, then the block waits; slot 0 then holds every thread's partial, each
// once, combined in an order that depends on kThreads alone. Call it once every slot is written and visible.
template <uint32_t kThreads, typename F>
__device__ __forceinline__ void halving_tree(F&& combine) {
    constexpr uint32_t kShift = kBlockShift<kThreads>;
    const uint32_t t = threadIdx.x;
    for (uint32_t level = 0; level < elpis_rowscan_tree_levels(kShift); level++) {
        if (elpis_rowscan_tree_active(t, kShift, level) != 0u)
            combine(t, elpis_rowscan_tree_partner(t, kShift, level));
        __syncthreads();
    }
}

// The schedule's butterfly over a warp's lanes: f(xor distance) at each level, in order; a lane that combines its
// value with lane ^ distance's at each ends with every lane's value (the same bits on every lane where the combine
// is commutative).
template <typename F>
__device__ __forceinline__ void each_butterfly_xor(F&& f) {
#pragma unroll
    for (uint32_t level = 0; level < ELPIS_ROWSCAN_WARP_SHIFT; level++) f(elpis_rowscan_butterfly_xor(level));
}

}  // namespace row_scan
