// The logits of one row of a head's output, or of a span of it, for kernels that read a row with one block
// (verify_epilogue.cu) or with several (draft_candidates.cu, one block a span). A block must keep many bytes in
// flight: each thread reads 16-byte vectors, two loads before it uses either (2-byte loads, one at a time, leave a
// block latency-bound at a few GB/s). Rows must start 16-byte aligned.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

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

// f(bits, index) of the logits a thread of kThreads takes from part of a row at `row` (16-byte aligned): the
// whole vectors [first, end), thread threadIdx.x taking vectors first + t, first + t + kThreads, ... ascending,
// then the single values [tail, vocab). Each thread sees its logits in ascending index order.
template <typename T, uint32_t kThreads, typename F>
__device__ __forceinline__ void each_logit_span(const T* row, uint32_t first, uint32_t end, uint32_t tail,
                                                uint32_t vocab, F&& f) {
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

// f(bits, index) of every logit of the row at `row` (16-byte aligned, `vocab` values) that thread threadIdx.x
// of kThreads takes: vectors t, t + kThreads, ... ascending, then the values past the last whole vector.
template <typename T, uint32_t kThreads, typename F>
__device__ __forceinline__ void each_logit(const T* row, uint32_t vocab, F&& f) {
    const uint32_t vectors = vocab / Logit<T>::kPerVector;
    each_logit_span<T, kThreads>(row, 0u, vectors, vectors * Logit<T>::kPerVector, vocab, f);
}

}  // namespace row_scan
