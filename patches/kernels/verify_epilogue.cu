// A verify's row results in one launch (issue 9: host time per round and the kernels between the verify and the
// commit). After a tree verify, rounds on the GPU (elpis/exl3/device_round.py) need per row the greedy target and
// the row check; torch made them from the logits in eight launches (amax, compare and negate, cast; argmax,
// gather, isfinite, where). Here the row is read once, cut into spans of 2^kSpanShift 16-byte vectors (at most
// 2^kSpanCap a row, the proved partition of bend/row_spans.bend; 31 a row of the model's fp16 vocabulary), one
// block a span, so a verify's 16 rows cover the GPU
// instead of 16 multiprocessors; a merge block per row combines its spans and writes, exactly as that
// composition:
//   ids[r]     elpis.spec.sampling.greedy_ids: the argmax, lowest id on ties, -1 where the row's maximum is not
//              finite (NaN or +inf anywhere in the row, or every logit -inf);
//   flags[r]   elpis.spec.integrity.nonfinite_rows: 1 where the row holds NaN or +inf, else 0;
//   digests[r] (when not null) elpis.spec.integrity.logits_digest: the row's float32 bit patterns summed modulo
//              2^32.
// Every output is an integer: the NaN-first maximum with its lowest index and a wrapping integer sum come out
// the same whatever order the threads and spans are combined in, so neither the reduction trees nor the spans can
// change them. The order is fixed all the same: each thread reads and the block combines by the proved schedule
// bend/row_scan_schedule.bend (row_scan.cuh: the strides and the halving tree).
//
// Inputs: logits fp16 (what ExLlamaV3's head writes, and the verify graph's output) or fp32 rows of `vocab`
// values, row r at logits + r * row_stride (the verify's output read in place), 1 <= rows, 1 <= vocab <=
// row_stride, rows 16-byte aligned (row_scan.cuh reads them 16 bytes a load); a workspace of the spans' results
// (elpis_verify_epilogue_spans gives the spans a row). An fp16 logit is compared as its
// exact fp32 value, as torch compares it; the digest is defined on fp32 logits only. Ampere instructions only
// (16-byte read-only loads, warp-free shared-memory reduction).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "row_scan.cuh"

namespace {

// Threads of a block, a power of two (a test build may take fewer: the outputs do not depend on it).
#ifndef ELPIS_VERIFY_EPILOGUE_THREADS
#define ELPIS_VERIFY_EPILOGUE_THREADS 256
#endif
// 16-byte vectors a span and the most spans a row (a test build takes short spans: the outputs do not depend on
// them either).
#ifndef ELPIS_VERIFY_EPILOGUE_SPAN_VECTORS
#define ELPIS_VERIFY_EPILOGUE_SPAN_VECTORS 1024
#endif
#ifndef ELPIS_VERIFY_EPILOGUE_MAX_SPANS
#define ELPIS_VERIFY_EPILOGUE_MAX_SPANS 64
#endif
constexpr uint32_t kThreads = ELPIS_VERIFY_EPILOGUE_THREADS;
static_assert(kThreads >= 32 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0, "a power of two block");
static_assert(row_scan::kBlockShift<kThreads> <= ELPIS_ROWSCAN_MAX_THREAD_SHIFT, "the row scan schedule's domain");
// log2 of the span's vectors and of the most spans a row (powers of two inside the row spans' proved domain)
constexpr uint32_t kSpanShift = row_scan::log2_in_domain<ELPIS_VERIFY_EPILOGUE_SPAN_VECTORS, ELPIS_ROWSPANS_MAX_BASE>();
constexpr uint32_t kSpanCap = row_scan::log2_in_domain<ELPIS_VERIFY_EPILOGUE_MAX_SPANS, ELPIS_ROWSPANS_MAX_CAP>();
constexpr uint32_t kNoIndex = 0xffffffffu;

// Whether (v, i) comes before (best, at) in the order the argmax keeps: a NaN before any number (the lower
// index between NaNs), then the larger value, then the lower index.
__device__ __forceinline__ bool before(float v, uint32_t i, float best, uint32_t at) {
    const bool v_nan = v != v, best_nan = best != best;
    if (v_nan || best_nan) return v_nan && (!best_nan || i < at);
    return v > best || (v == best && i < at);
}

// The block's best (value, index) and wrapping sum, into thread 0's slots of the shared arrays, by the schedule's
// halving tree (slot t folds in its partner's slot p).
__device__ __forceinline__ void block_best(float* best_v, uint32_t* best_i, uint32_t* sums) {
    __syncthreads();
    row_scan::halving_tree<kThreads>([&](uint32_t t, uint32_t p) {
        const float v = best_v[p];
        const uint32_t i = best_i[p];
        if (before(v, i, best_v[t], best_i[t])) best_v[t] = v, best_i[t] = i;
        sums[t] += sums[p];
    });
}

// Block (span s, row r): the span's best (value, index) and sum into slot r * spans + s of the workspace.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    verify_epilogue_span_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab,
                                row_scan::Spans spans, float* __restrict__ span_v, uint32_t* __restrict__ span_i,
                                uint32_t* __restrict__ span_sum) {
    __shared__ float best_v[kThreads];
    __shared__ uint32_t best_i[kThreads];
    __shared__ uint32_t sums[kThreads];
    const uint32_t t = threadIdx.x, s = blockIdx.x, r = blockIdx.y;
    const T* row = logits + static_cast<size_t>(r) * row_stride;
    float best = -__int_as_float(0x7f800000);  // -inf: any logit of the row comes before it or ties at a lower id
    uint32_t at = kNoIndex, sum = 0u;
    row_scan::each_logit_of_span<T, kThreads>(row, vocab, spans, s, [&](uint32_t b, uint32_t c) {
        const float v = row_scan::Logit<T>::value(b);
        sum += static_cast<uint32_t>(__float_as_int(v));
        if (before(v, c, best, at)) best = v, at = c;
    });
    best_v[t] = best, best_i[t] = at, sums[t] = sum;
    block_best(best_v, best_i, sums);
    if (t == 0) {
        const size_t slot = static_cast<size_t>(r) * spans.count + s;
        span_v[slot] = best_v[0], span_i[slot] = best_i[0], span_sum[slot] = sums[0];
    }
}

// Block r: the row's outputs from its spans' results.
__global__ void __launch_bounds__(kThreads)
    verify_epilogue_merge_kernel(uint32_t spans, const float* __restrict__ span_v,
                                 const uint32_t* __restrict__ span_i, const uint32_t* __restrict__ span_sum,
                                 int64_t* __restrict__ ids, int32_t* __restrict__ flags,
                                 int32_t* __restrict__ digests) {
    __shared__ float best_v[kThreads];
    __shared__ uint32_t best_i[kThreads];
    __shared__ uint32_t sums[kThreads];
    const uint32_t t = threadIdx.x, r = blockIdx.x;
    float best = -__int_as_float(0x7f800000);
    uint32_t at = kNoIndex, sum = 0u;
    row_scan::each_of_stride<kThreads>(0u, spans, [&](uint32_t s) {
        const size_t slot = static_cast<size_t>(r) * spans + s;
        if (before(span_v[slot], span_i[slot], best, at)) best = span_v[slot], at = span_i[slot];
        sum += span_sum[slot];
    });
    best_v[t] = best, best_i[t] = at, sums[t] = sum;
    block_best(best_v, best_i, sums);
    if (t == 0) {
        const float m = best_v[0];
        const bool finite = m == m && m < __int_as_float(0x7f800000) && m > -__int_as_float(0x7f800000);
        ids[r] = finite ? static_cast<int64_t>(best_i[0]) : -1;
        flags[r] = m < __int_as_float(0x7f800000) ? 0 : 1;  // NaN compares false: flagged, as ~(amax < inf)
        if (digests != nullptr) digests[r] = static_cast<int32_t>(sums[0]);
    }
}

__host__ __device__ inline row_scan::Spans spans_of(uint32_t vocab, uint32_t fp16) {
    return row_scan::spans_of(vocab, fp16, kSpanShift, kSpanCap);
}

}  // namespace

extern "C" {

int elpis_verify_epilogue_threads(void) { return kThreads; }

// The spans a row of `vocab` logits is cut into (fp16 where `fp16`, else fp32): the workspace takes
// rows * spans * 12 bytes. -1 for a row longer than the spans' proved domain.
int elpis_verify_epilogue_spans(uint32_t fp16, uint32_t vocab) {
    return row_scan::rows_fit(vocab, fp16) ? static_cast<int>(spans_of(vocab, fp16).count) : -1;
}

// ids int64 [rows], flags int32 [rows] and (unless null; fp32 logits only) digests int32 [rows] of `rows` logit
// rows (fp16 where `fp16`, else fp32; `vocab` values each, row r at logits + r * row_stride), on `stream` (a
// cudaStream_t passed as an address; rows 16-byte aligned), through `workspace` (4-byte aligned,
// `workspace_bytes` long, at least what elpis_verify_epilogue_spans says). Returns 0, -1 for arguments out of
// range, or the launch's cudaError_t.
int elpis_verify_epilogue(const void* logits, uint32_t fp16, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                          void* ids, void* flags, void* digests, void* workspace, uint64_t workspace_bytes,
                          void* stream) {
    if (logits == nullptr || ids == nullptr || flags == nullptr || workspace == nullptr || rows == 0u ||
        rows > 65535u || vocab == 0u || vocab > row_stride || fp16 > 1u || !row_scan::rows_fit(vocab, fp16) ||
        (fp16 && digests != nullptr) ||
        reinterpret_cast<uintptr_t>(logits) % 16u || row_stride % row_scan::per_vector(fp16) != 0u ||
        reinterpret_cast<uintptr_t>(workspace) % 4u != 0u)
        return -1;
    const row_scan::Spans spans = spans_of(vocab, fp16);
    const uint64_t slots = uint64_t(rows) * spans.count;
    if (workspace_bytes < 12u * slots) return -1;
    auto* span_v = static_cast<float*>(workspace);
    auto* span_i = reinterpret_cast<uint32_t*>(span_v + slots);
    auto* span_sum = span_i + slots;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const dim3 grid(spans.count, rows);
    if (fp16)
        verify_epilogue_span_kernel<__half><<<grid, kThreads, 0, st>>>(static_cast<const __half*>(logits),
                                                                       row_stride, vocab, spans, span_v, span_i,
                                                                       span_sum);
    else
        verify_epilogue_span_kernel<float><<<grid, kThreads, 0, st>>>(static_cast<const float*>(logits), row_stride,
                                                                      vocab, spans, span_v, span_i, span_sum);
    verify_epilogue_merge_kernel<<<rows, kThreads, 0, st>>>(spans.count, span_v, span_i, span_sum,
                                                           static_cast<int64_t*>(ids), static_cast<int32_t*>(flags),
                                                           static_cast<int32_t*>(digests));
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
