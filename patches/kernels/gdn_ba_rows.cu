// The Gated DeltaNet gate projections b and a of 1-16 rows in one launch, row-invariant by construction
// (issue 9, item 3: fused projections).
//
// What it replaces: in a tree verify, ExLlamaV3's GDN layer (the torch path the tree kernels hook into)
// projects the hidden rows through in_proj_b and in_proj_a, two unquantized fp16 linears of 5120 -> 48 with
// fp32 outputs, as two cuBLAS split-K GEMMs and their two reductions: 0.63 ms of a 16-row round on the H200
// (bench/results/profile/profile-tree16-gdnloads-call49-*, 13 µs per layer against ~1 MB of weights).
// Here both come from one kernel over the weights stored transposed once ([2 * nv, k]: b's rows, then a's).
//
// Served through the patch exl3-gdn-ba (off until its GPU tests, gate verdict and round A/B are in:
// patches/registry.json), which elpis.exl3.tree_verify applies inside tree verifies.
//
// Inputs: x fp16 [rows, k] (row stride x_stride elements), wt fp16 [2 * nv, k] contiguous; outputs b and a
// fp32 [rows, nv] contiguous. Any k; 2 * nv a multiple of kColumns; 1 <= rows <= 16.
//
// Work split: one block of 256 threads per group of kColumns output columns (24 blocks for nv = 48). Thread t
// sums, for each row and column of its block, the products x[r][j] * w[c][j] over j = t, t + 256, ... in
// ascending order (fp32 fmaf of the fp16 values, exact products); the 256 partial sums are then folded by a
// fixed xor butterfly inside each warp (16, 8, 4, 2, 1) and the 8 warp sums in ascending warp order. So each
// output is one fixed sequence of fp32 operations on its own row's x and its column's weights: the same
// whatever the other rows hold, how many rows there are, and which block or SM computes it. A tree row
// therefore gets the bits of a 1-row call on the same hidden state (plain decoding).
//
// Ampere instructions only (plain loads, fmaf, shuffles); no atomics, no fast math.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;
constexpr int kColumns = 4;  // output columns per block
constexpr unsigned kFull = 0xffffffffu;

__global__ void __launch_bounds__(kThreads)
    gdn_ba_rows_kernel(const __half* __restrict__ x, int32_t x_stride, const __half* __restrict__ wt, int32_t k,
                       int32_t nv, int32_t rows, float* __restrict__ out_b, float* __restrict__ out_a) {
    __shared__ float warp_sums[kWarps][kMaxRows][kColumns];
    const int t = threadIdx.x;
    const int lane = t & 31;
    const int warp = t >> 5;
    const int column0 = blockIdx.x * kColumns;  // first of this block's columns of [b | a]

    float acc[kMaxRows][kColumns];
#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
#pragma unroll
        for (int c = 0; c < kColumns; c++) acc[r][c] = 0.0f;
    }
#pragma unroll 4  // loads of four passes in flight together; each sum still runs over j in ascending order
    for (int j = t; j < k; j += kThreads) {
        float w[kColumns];
#pragma unroll
        for (int c = 0; c < kColumns; c++) w[c] = __half2float(wt[static_cast<size_t>(column0 + c) * k + j]);
#pragma unroll
        for (int r = 0; r < kMaxRows; r++) {
            if (r < rows) {
                const float xv = __half2float(x[static_cast<size_t>(r) * x_stride + j]);
#pragma unroll
                for (int c = 0; c < kColumns; c++) acc[r][c] = __fmaf_rn(xv, w[c], acc[r][c]);
            }
        }
    }
    // Fold the block's 256 partial sums of every (row, column): a fixed butterfly per warp, then the warps in
    // order.
#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
        if (r < rows) {
#pragma unroll
            for (int c = 0; c < kColumns; c++) {
                float v = acc[r][c];
                for (int m = 16; m > 0; m >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, m));
                if (lane == 0) warp_sums[warp][r][c] = v;
            }
        }
    }
    __syncthreads();
    if (t < rows * kColumns) {
        const int r = t / kColumns;
        const int c = t % kColumns;
        float v = warp_sums[0][r][c];
        for (int w = 1; w < kWarps; w++) v = __fadd_rn(v, warp_sums[w][r][c]);
        const int column = column0 + c;
        if (column < nv) {
            out_b[static_cast<size_t>(r) * nv + column] = v;
        } else {
            out_a[static_cast<size_t>(r) * nv + (column - nv)] = v;
        }
    }
}

}  // namespace

extern "C" {

int elpis_gdn_ba_columns_per_block(void) { return kColumns; }

int elpis_gdn_ba_max_rows(void) { return kMaxRows; }

// b = x @ wt[:nv].T and a = x @ wt[nv:].T for `rows` rows, on `stream` (a cudaStream_t passed as an address).
// Device pointers; shapes are validated by elpis/exl3/gdn_ba.py. Returns 0, -1 for arguments out of range, or
// the launch's cudaError_t.
int elpis_gdn_ba_rows(const void* x, int32_t x_stride, const void* wt, int32_t k, int32_t nv, uint32_t rows,
                      float* out_b, float* out_a, void* stream) {
    if (rows == 0 || rows > static_cast<uint32_t>(kMaxRows) || k <= 0 || nv <= 0 || x_stride < k ||
        (2 * nv) % kColumns != 0) {
        return -1;
    }
    gdn_ba_rows_kernel<<<(2 * nv) / kColumns, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const __half*>(x), x_stride, static_cast<const __half*>(wt), k, nv, static_cast<int32_t>(rows),
        out_b, out_a);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
