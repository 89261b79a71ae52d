// The logits of a span of one row of a head's output, for kernels that read a row with several blocks, one a span
// (verify_epilogue.cu, draft_candidates.cu): one block reading a whole row of the model's vocabulary, 485 KiB of
// fp16, kept one multiprocessor busy while the others idled. A block must also keep many bytes in flight: each
// thread reads 16-byte vectors, two loads before it uses either (2-byte loads, one at a time, leave a block
// latency-bound at a few GB/s). Rows must start 16-byte aligned.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

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
    __device__ static uint32_t bits(const __half* row, uint32_t c) { return __half_as_ushort(row[c]); }
    __device__ static float value(uint32_t b) { return __half2float(ushort_as_half(static_cast<unsigned short>(b))); }
};
template <>
struct Logit<float> {
    static constexpr uint32_t kPerVector = 4;
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

// A row cut into `count` spans of `vectors` 16-byte vectors each (the last may be shorter; none is empty, unless the
// row is shorter than a vector), the row's single values past its last vector in the last span: spans of 2^base
// vectors, or longer ones (a power of two) where those would be more than 2^cap. The partition is the proved
// schedule of bend/row_spans.bend (build/kernels/row_spans.h; laws: every vector in exactly one span, at most 2^cap
// spans): span s is vectors [s * vectors, min((s + 1) * vectors, total)), which each_logit_of_span reads. Host code
// only: the kernels take the spans as launch arguments. `total` must be below ELPIS_ROWSPANS_MAX_TOTAL (the
// entries refuse longer rows: rows_fit).
struct Spans {
    uint32_t count, vectors;
};
__host__ __device__ inline Spans spans_of(uint32_t vocab, uint32_t fp16, uint32_t base, uint32_t cap) {
    const uint32_t total = elpis_rowspans_vectors(vocab, fp16);
    const uint32_t shift = elpis_rowspans_span_shift(total, base, cap);
    return Spans{elpis_rowspans_span_count(total, shift), 1u << shift};
}
// Whether a row of `vocab` logits is inside the schedule's proved domain.
__host__ __device__ inline bool rows_fit(uint32_t vocab, uint32_t fp16) {
    return elpis_rowspans_vectors(vocab, fp16) < ELPIS_ROWSPANS_MAX_TOTAL;
}
// log2 of a kernel's span length or most spans a row, a power of two inside the schedule's domain (compile time).
constexpr uint32_t exact_log2(uint32_t x) { return x <= 1u ? 0u : 1u + exact_log2(x >> 1); }
template <uint32_t kValue, uint32_t kMaxLog2>
constexpr uint32_t log2_in_domain() {
    static_assert(kValue >= 1u && (kValue & (kValue - 1u)) == 0u, "a power of two");
    static_assert(exact_log2(kValue) <= kMaxLog2, "inside the row spans' proved domain");
    return exact_log2(kValue);
}

// The logits in a 16-byte vector of fp16 rows (`fp16`) or fp32 ones: the schedule's vector width.
__host__ __device__ inline uint32_t per_vector(uint32_t fp16) { return 1u << elpis_rowspans_vector_shift(fp16); }

// f(bits, index) of the logits thread threadIdx.x of kThreads takes from span s of a row at `row` (16-byte
// aligned) cut into `spans` (`vocab` values in all): the span's vectors t, t + kThreads, ... ascending, two loads
// in flight, then (last span) the single values past the last vector. Each thread sees its logits in ascending
// index order.
template <typename T, uint32_t kThreads, typename F>
__device__ __forceinline__ void each_logit_of_span(const T* row, uint32_t vocab, Spans spans, uint32_t s, F&& f) {
    const uint32_t total = vocab / Logit<T>::kPerVector, first = s * spans.vectors;
    const uint32_t end = min(first + spans.vectors, total);
    const uint32_t tail = s + 1u == spans.count ? total * Logit<T>::kPerVector : vocab;
    const uint32_t t = threadIdx.x;
    const uint4* vec = reinterpret_cast<const uint4*>(row);
    for (uint32_t c = first + t; c < end; c += 2 * kThreads) {
        const bool two = c + kThreads < end;
        const uint4 a = __ldg(vec + c);
        const uint4 b = two ? __ldg(vec + c + kThreads) : make_uint4(0u, 0u, 0u, 0u);
        each_of_vector<T>(a, c, f);
        if (two) each_of_vector<T>(b, c + kThreads, f);
    }
    for (uint32_t i = tail + t; i < vocab; i += kThreads) f(Logit<T>::bits(row, i), i);
}

}  // namespace row_scan
