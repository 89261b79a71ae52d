// The Gated DeltaNet gate projections b and a of 1-16 rows, row-invariant by construction (issue 9, item 3:
// fused projections).
//
// What it replaces: in a tree verify, ExLlamaV3's GDN layer (the torch path the tree kernels hook into)
// projects the hidden rows through in_proj_b and in_proj_a, two unquantized fp16 linears of 5120 -> 48 with
// fp32 outputs, as two cuBLAS split-K GEMMs and their two reductions: 0.63 ms of a 16-row round on the H200
// (bench/results/profile/profile-tree16-gdnloads-call49-*, 13 µs per layer against ~1 MB of weights).
// Here both come from two launches over the weights stored transposed once ([2 * nv, k]: b's rows, then a's).
//
// Served through the patch exl3-gdn-ba (off until its GPU tests, gate verdict and round A/B are in:
// patches/registry.json), which elpis.exl3.tree_verify applies inside tree verifies.
//
// Inputs: x fp16 [rows, k] (row stride x_stride elements), wt fp16 [2 * nv, k] contiguous, both 16-byte
// aligned; k and x_stride multiples of 8; 2 * nv a multiple of kColumns; 1 <= rows <= 16. Scratch: partials
// fp32 [splits, rows, 2 * nv], splits = ceil(k / kSpan). Outputs b and a fp32 [rows, nv] contiguous.
//
// Why two launches: the work is ~1 MB of weights and up to 160 KB of x per layer; one block per column group
// (the first version of this kernel: 24 blocks, scalar loads) left 108 of 132 SMs idle and waited on its loads
// (15 µs per layer at 16 rows, slower than cuBLAS). So k is split too: launch 1 runs one block of 128 threads
// per (group of kColumns columns, span of kSpan = 1024 elements of k), 120 blocks at the real geometry, each
// thread loading its 8 elements of every row and column with one 16-byte load each; launch 2 adds the spans.
//
// Order of every sum (fixed, whatever the other rows hold or how many there are): thread t of span s takes
// j = s * kSpan + 8t .. +7 in ascending order (fp32 fmaf of the fp16 values: exact products); the 128 thread
// sums of a span fold by a fixed xor butterfly inside each warp (16, 8, 4, 2, 1) and the 4 warp sums in
// ascending warp order; launch 2 adds the spans in ascending order. So a tree row gets the bits of a 1-row
// call on the same hidden state (plain decoding). The spans, each thread's chunk, the butterfly's distances
// and each column's block and slot come from the proved schedule (bend/gdn_ba_schedule.bend, compiled by
// `make build` to build/kernels/gdn_ba_schedule.h; laws: proofs/gdn_ba_schedule_proof.bend): every value of
// k is summed by exactly one (span, thread, place), no span is empty, a chunk is wholly inside k or past it,
// the butterfly covers the warp, and no function of it takes the row count.
//
// Ampere instructions only (16-byte loads, fmaf, shuffles); no atomics, no fast math.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gdn_ba_schedule.h"

namespace {

constexpr int kThreads = ELPIS_GDNBA_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = ELPIS_GDNBA_CHUNK;   // fp16 elements per 16-byte load
constexpr int kSpan = ELPIS_GDNBA_SPAN_K;   // elements of k per block of launch 1
constexpr int kMaxRows = 16;
constexpr int kColumns = ELPIS_GDNBA_COLUMNS;  // output columns per block of launch 1
constexpr uint32_t kButterflySteps = ELPIS_GDNBA_BUTTERFLY_STEPS;
static_assert(kChunk == 8, "a thread's chunk is one 16-byte load of fp16 values");
static_assert(kSpan == kThreads * kChunk, "a span is one chunk per thread");
static_assert((1u << kButterflySteps) == 32u, "the butterfly folds a warp of 32 lanes");
constexpr int kSumThreads = 128;            // launch 2
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void unpack8(const uint4 raw, float out[kChunk]) {
    const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk / 2; i++) {
        const float2 f = __half22float2(h2[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// Launch 1: partials[s][r][column] = the sum over span s of x[r][j] * wt[column][j], for the block's columns.
__global__ void __launch_bounds__(kThreads)
    gdn_ba_span_kernel(const __half* __restrict__ x, int32_t x_stride, const __half* __restrict__ wt, int32_t k,
                       int32_t columns, int32_t rows, float* __restrict__ partials) {
    __shared__ float warp_sums[kWarps][kMaxRows][kColumns];
    const int t = threadIdx.x;
    const int lane = t & 31;
    const int warp = t >> 5;
    const uint32_t span = blockIdx.y;
    const uint32_t j0 = elpis_gdnba_chunk_begin(span, t);
    const bool here = j0 < static_cast<uint32_t>(k);  // k is a multiple of kChunk: the chunk is all in or out

    // Every load of the thread first, so they are in flight together.
    uint4 w_raw[kColumns];
    uint4 x_raw[kMaxRows];
#pragma unroll
    for (int c = 0; c < kColumns; c++) {
        const uint32_t column = elpis_gdnba_column_at(blockIdx.x, c);
        w_raw[c] = here ? __ldg(reinterpret_cast<const uint4*>(wt + static_cast<size_t>(column) * k + j0))
                        : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
        x_raw[r] = (here && r < rows)
                       ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(r) * x_stride + j0))
                       : make_uint4(0u, 0u, 0u, 0u);
    }
    float w[kColumns][kChunk];
#pragma unroll
    for (int c = 0; c < kColumns; c++) unpack8(w_raw[c], w[c]);

#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
        if (r < rows) {
            float xv[kChunk];
            unpack8(x_raw[r], xv);
#pragma unroll
            for (int c = 0; c < kColumns; c++) {
                float v = 0.0f;
#pragma unroll
                for (int i = 0; i < kChunk; i++) v = __fmaf_rn(xv[i], w[c][i], v);
#pragma unroll
                for (uint32_t i = 0; i < kButterflySteps; i++)
                    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, elpis_gdnba_butterfly(i)));
                if (lane == 0) warp_sums[warp][r][c] = v;
            }
        }
    }
    __syncthreads();
    if (t < rows * kColumns) {
        const int r = t / kColumns;
        const int c = t % kColumns;
        float v = warp_sums[0][r][c];
        for (int i = 1; i < kWarps; i++) v = __fadd_rn(v, warp_sums[i][r][c]);
        partials[(static_cast<size_t>(span) * rows + r) * columns + elpis_gdnba_column_at(blockIdx.x, c)] = v;
    }
}

// Launch 2: the spans of each (row, column) added in ascending order, written to b (columns < nv) or a.
__global__ void __launch_bounds__(kSumThreads)
    gdn_ba_sum_kernel(const float* __restrict__ partials, int32_t spans, int32_t nv, int32_t rows,
                      float* __restrict__ out_b, float* __restrict__ out_a) {
    const int columns = 2 * nv;
    const int i = blockIdx.x * kSumThreads + threadIdx.x;
    if (i >= rows * columns) return;
    const size_t stride = static_cast<size_t>(rows) * columns;
    float v = partials[i];
    for (int s = 1; s < spans; s++) v = __fadd_rn(v, partials[s * stride + i]);
    const int r = i / columns;
    const int column = i % columns;
    if (column < nv) {
        out_b[static_cast<size_t>(r) * nv + column] = v;
    } else {
        out_a[static_cast<size_t>(r) * nv + (column - nv)] = v;
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

extern "C" {

int elpis_gdn_ba_columns_per_block(void) { return kColumns; }

int elpis_gdn_ba_max_rows(void) { return kMaxRows; }

int elpis_gdn_ba_span(void) { return kSpan; }

// b = x @ wt[:nv].T and a = x @ wt[nv:].T for `rows` rows, on `stream` (a cudaStream_t passed as an address),
// with partials (fp32, ceil(k / kSpan) * rows * 2 * nv elements) as scratch. Device pointers; shapes are
// validated by elpis/exl3/gdn_ba.py. Returns 0, -1 for arguments out of range, or a launch's cudaError_t.
int elpis_gdn_ba_rows(const void* x, int32_t x_stride, const void* wt, int32_t k, int32_t nv, uint32_t rows,
                      float* partials, float* out_b, float* out_a, void* stream) {
    if (rows == 0 || rows > static_cast<uint32_t>(kMaxRows) || k <= 0 || nv <= 0 || x_stride < k ||
        k % kChunk != 0 || x_stride % kChunk != 0 || (2 * nv) % kColumns != 0 || !aligned16(x) ||
        !aligned16(wt)) {
        return -1;
    }
    const int spans = static_cast<int>(elpis_gdnba_spans(static_cast<uint32_t>(k)));
    const int columns = 2 * nv;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const uint32_t column_blocks = elpis_gdnba_column_block(static_cast<uint32_t>(columns) - 1u) + 1u;
    gdn_ba_span_kernel<<<dim3(column_blocks, spans), kThreads, 0, s>>>(
        static_cast<const __half*>(x), x_stride, static_cast<const __half*>(wt), k, columns,
        static_cast<int32_t>(rows), partials);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
    const int outputs = static_cast<int>(rows) * columns;
    gdn_ba_sum_kernel<<<(outputs + kSumThreads - 1) / kSumThreads, kSumThreads, 0, s>>>(
        partials, spans, nv, static_cast<int32_t>(rows), out_b, out_a);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
