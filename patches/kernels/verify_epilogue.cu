// A verify's row results in one launch (issue 9: host time per round and the kernels between the verify and the
// commit). After a tree verify, rounds on the GPU (elpis/exl3/device_round.py) need per row the greedy target and
// the row check; torch made them from the logits in eight launches (amax, compare and negate, cast; argmax,
// gather, isfinite, where). Here one block per row reads the row once and writes, exactly as that composition:
//   ids[r]     elpis.spec.sampling.greedy_ids: the argmax, lowest id on ties, -1 where the row's maximum is not
//              finite (NaN or +inf anywhere in the row, or every logit -inf);
//   flags[r]   elpis.spec.integrity.nonfinite_rows: 1 where the row holds NaN or +inf, else 0;
//   digests[r] (when not null) elpis.spec.integrity.logits_digest: the row's float32 bit patterns summed modulo
//              2^32.
// Every output is an integer: the NaN-first maximum with its lowest index and a wrapping integer sum come out
// the same whatever order the block combines its threads in, so the reduction tree below cannot change them.
//
// Inputs: logits fp16 (what ExLlamaV3's head writes, and the verify graph's output) or fp32 rows of `vocab`
// values, row r at logits + r * row_stride (the verify's output read in place), 1 <= rows, 1 <= vocab <=
// row_stride, rows 16-byte aligned (row_scan.cuh reads them 16 bytes a load). An fp16 logit is compared as its
// exact fp32 value, as torch compares it; the digest is defined on fp32 logits only. Ampere instructions only
// (16-byte read-only loads, warp-free shared-memory reduction).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "row_scan.cuh"

namespace {

// Threads of a row's block, a power of two (a test build may take fewer: the outputs do not depend on it).
#ifndef ELPIS_VERIFY_EPILOGUE_THREADS
#define ELPIS_VERIFY_EPILOGUE_THREADS 512
#endif
constexpr uint32_t kThreads = ELPIS_VERIFY_EPILOGUE_THREADS;
static_assert(kThreads >= 32 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0, "a power of two block");
constexpr uint32_t kNoIndex = 0xffffffffu;

// Whether (v, i) comes before (best, at) in the order the argmax keeps: a NaN before any number (the lower
// index between NaNs), then the larger value, then the lower index.
__device__ __forceinline__ bool before(float v, uint32_t i, float best, uint32_t at) {
    const bool v_nan = v != v, best_nan = best != best;
    if (v_nan || best_nan) return v_nan && (!best_nan || i < at);
    return v > best || (v == best && i < at);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    verify_epilogue_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab,
                           int64_t* __restrict__ ids, int32_t* __restrict__ flags, int32_t* __restrict__ digests) {
    __shared__ float best_v[kThreads];
    __shared__ uint32_t best_i[kThreads];
    __shared__ uint32_t sums[kThreads];
    const uint32_t t = threadIdx.x, r = blockIdx.x;
    const T* row = logits + static_cast<size_t>(r) * row_stride;
    float best = -__int_as_float(0x7f800000);  // -inf: any logit of the row comes before it or ties at a lower id
    uint32_t at = kNoIndex, sum = 0u;
    row_scan::each_logit<T, kThreads>(row, vocab, [&](uint32_t b, uint32_t c) {
        const float v = row_scan::Logit<T>::value(b);
        sum += static_cast<uint32_t>(__float_as_int(v));
        if (before(v, c, best, at)) best = v, at = c;
    });
    best_v[t] = best, best_i[t] = at, sums[t] = sum;
    __syncthreads();
    for (uint32_t half = kThreads / 2; half > 0; half >>= 1) {
        if (t < half) {
            const float v = best_v[t + half];
            const uint32_t i = best_i[t + half];
            if (before(v, i, best_v[t], best_i[t])) best_v[t] = v, best_i[t] = i;
            sums[t] += sums[t + half];
        }
        __syncthreads();
    }
    if (t == 0) {
        const float m = best_v[0];
        const bool finite = m == m && m < __int_as_float(0x7f800000) && m > -__int_as_float(0x7f800000);
        ids[r] = finite ? static_cast<int64_t>(best_i[0]) : -1;
        flags[r] = m < __int_as_float(0x7f800000) ? 0 : 1;  // NaN compares false: flagged, as ~(amax < inf)
        if (digests != nullptr) digests[r] = static_cast<int32_t>(sums[0]);
    }
}

}  // namespace

extern "C" {

int elpis_verify_epilogue_threads(void) { return kThreads; }

// ids int64 [rows], flags int32 [rows] and (unless null; fp32 logits only) digests int32 [rows] of `rows` logit
// rows (fp16 where `fp16`, else fp32; `vocab` values each, row r at logits + r * row_stride), on `stream` (a
// cudaStream_t passed as an address; rows 16-byte aligned). Returns 0, -1 for arguments out of range, or the
// launch's cudaError_t.
int elpis_verify_epilogue(const void* logits, uint32_t fp16, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                          void* ids, void* flags, void* digests, void* stream) {
    if (logits == nullptr || ids == nullptr || flags == nullptr || rows == 0u || rows > 65535u || vocab == 0u ||
        vocab > row_stride || fp16 > 1u || (fp16 && digests != nullptr) || reinterpret_cast<uintptr_t>(logits) % 16u ||
        (row_stride * (fp16 ? 2u : 4u)) % 16u != 0u)
        return -1;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    auto* id = static_cast<int64_t*>(ids);
    auto* flag = static_cast<int32_t*>(flags);
    auto* digest = static_cast<int32_t*>(digests);
    if (fp16)
        verify_epilogue_kernel<__half><<<rows, kThreads, 0, s>>>(static_cast<const __half*>(logits), row_stride,
                                                                 vocab, id, flag, digest);
    else
        verify_epilogue_kernel<float><<<rows, kThreads, 0, s>>>(static_cast<const float*>(logits), row_stride,
                                                                vocab, id, flag, digest);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
