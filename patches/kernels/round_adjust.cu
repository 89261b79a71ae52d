// A request's logit adjustments for every row of a tree verify, on the GPU (issue 9: penalised requests' rounds
// on the GPU; elpis/exl3/round_adjust.py, registry switch exl3-round-adjust).
//
// elpis.spec.penalties.History.adjusted gives row r of a verify, in float64, the request's repetition,
// frequency and presence penalties and its logit_bias, counting the committed tokens (`counts`: generated
// ones; `seen`: the prompt's and the generated ones) plus the tokens of the row's own path (its ancestors after
// the anchor, and itself). Here one launch does the same for every row, reading the tree from the acceptor's
// cells (rows, parents, draft tokens) that the round plan wrote, so a round queued before the one ahead of it is
// read back adjusts its rows on the GPU. For token t of row r, with k the times t is on the row's path:
//   c = counts[t] + k (exact: integers), s = seen[t] > 0 or k > 0, x = the logit as float64 (exact);
//   repetition (flags & 1): x = s ? (x > 0 ? x * inv_r : x * r) : x   (torch's x / r on a GPU multiplies by
//                           the reciprocal; penalties.py writes that product on every device);
//   frequency/presence (flags & 2): x = x - (c * f + [c > 0] * q);
//   bias (flags & 4): x = x + bias[t].
// Each operation correctly rounded on its own (the _rn intrinsics: no contraction into a fused multiply-add),
// as torch's one-operation kernels compute them, so every value is the host's bit for bit.
//
// Inputs: logits fp16 [run, row_stride] (the verify's output, read in place; `vocab` values a row), cells int64
// [ELPIS_TREE_CELLS] (elpis.accept.abi: rows at 0, parents at 7, draft tokens at 23; a row past the tree's
// `rows` is adjusted with an empty path), counts and seen float64 [vocab], bias float64 [vocab], params int64
// [5]: the flags, then the float64 bits of r, 1 / r, f and q. Output: adjusted float64 [run, vocab]. Ampere
// instructions only (float64 arithmetic, shared memory).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr uint32_t kThreads = 256;
constexpr int kMaxRows = 16;                                 // elpis.accept.abi.MAX_ROWS
constexpr int kCellRows = 0, kCellParents = 7, kCellDraft = 23;  // the acceptor's cell layout
constexpr int64_t kRepetition = 1, kFrequencyPresence = 2, kBias = 4;

__global__ void __launch_bounds__(kThreads)
    round_adjust_kernel(const __half* __restrict__ logits, uint32_t row_stride, uint32_t vocab,
                        const int64_t* __restrict__ cells, const double* __restrict__ counts,
                        const double* __restrict__ seen, const double* __restrict__ bias,
                        const int64_t* __restrict__ params, double* __restrict__ out) {
    __shared__ int64_t path[kMaxRows];
    __shared__ int path_len;
    const uint32_t r = blockIdx.y;
    if (threadIdx.x == 0) {
        // the row's path after the anchor, walked up its parents (the plan wrote a tree: parents[i] < i)
        const int64_t rows = cells[kCellRows];
        int n = 0;
        int64_t node = r;
        if (rows >= 1 && rows <= kMaxRows && static_cast<int64_t>(r) < rows) {
            while (node > 0 && n < kMaxRows) {
                path[n++] = cells[kCellDraft + node];
                node = cells[kCellParents + node];
            }
        }
        path_len = n;
    }
    __syncthreads();
    const int64_t flags = params[0];
    const double rep = __longlong_as_double(params[1]), inv_rep = __longlong_as_double(params[2]);
    const double freq = __longlong_as_double(params[3]), pres = __longlong_as_double(params[4]);
    const int n = path_len;
    const __half* row = logits + uint64_t(r) * row_stride;
    double* dst = out + uint64_t(r) * vocab;
    for (uint32_t t = blockIdx.x * kThreads + threadIdx.x; t < vocab; t += gridDim.x * kThreads) {
        int k = 0;
        for (int i = 0; i < n; i++) k += path[i] == static_cast<int64_t>(t);
        const double c = __dadd_rn(counts[t], static_cast<double>(k));
        const bool s = seen[t] > 0.0 || k > 0;
        double x = static_cast<double>(__half2float(row[t]));
        if ((flags & kRepetition) && s) x = x > 0.0 ? __dmul_rn(x, inv_rep) : __dmul_rn(x, rep);
        if (flags & kFrequencyPresence) {
            const double present = c > 0.0 ? 1.0 : 0.0;
            x = __dsub_rn(x, __dadd_rn(__dmul_rn(c, freq), __dmul_rn(present, pres)));
        }
        if (flags & kBias) x = __dadd_rn(x, bias[t]);
        dst[t] = x;
    }
}

}  // namespace

extern "C" {

// The parameters block's words (elpis.exl3.round_adjust.PARAM_WORDS checks it).
int elpis_round_adjust_param_words(void) { return 5; }

// Queue the adjustment of `run` rows on `stream` (a cudaStream_t passed as an address); see the top of the file.
// Returns 0, -1 for arguments out of range, or the launch's cudaError_t.
int elpis_round_adjust(const void* logits, uint32_t row_stride, uint32_t vocab, uint32_t run, const int64_t* cells,
                       const double* counts, const double* seen, const double* bias, const int64_t* params,
                       double* out, void* stream) {
    if (logits == nullptr || cells == nullptr || counts == nullptr || seen == nullptr || bias == nullptr ||
        params == nullptr || out == nullptr)
        return -1;
    if (run == 0 || run > kMaxRows || vocab == 0 || vocab > row_stride) return -1;
    const uint32_t spans = (vocab + kThreads * 8 - 1) / (kThreads * 8);  // eight values a thread
    const dim3 grid(spans, run);
    round_adjust_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const __half*>(logits), row_stride, vocab, cells, counts, seen, bias, params, out);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
