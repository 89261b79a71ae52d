// A top_k request's draw from each row's largest logits, on the GPU (issue 9: the host's share of a sampled
// round; patch exl3-sample-draw).
//
// elpis.spec.sampling draws a top_k request's token from each row's top_k + TOP_PAD largest logits: their
// weights w = exp(x * (1/T) - max) in float64 are computed by torch (the same operations whichever path
// follows), then the host ranks them, checks the head's edge, cuts top_k, top_p and min_p and draws by
// inverse CDF over fixed-point weights with the (seed, position) uniform. That host part took ~0.3 of a
// sampled call's ~0.5 ms for 16 rows on an H100 (bench/results/server/README.md, session 55). Here one
// thread a row does the same steps (sample_draw_steps.cuh, shared with vocab_draw.cu) on the same float64
// values, in integers and comparisons only (no rounding but w * 2^-40's product, correctly rounded like the
// host's), so every token is the host's:
//   out[r] = the drawn id, or
//           -5 where the head's edge does not clear the smallest weight read (ties may run past the logits
//              read: the caller decides that call from the whole vocabulary, as the host does), or
//           -2 where the row's maximum is not finite (the caller refuses the row),
//           -4 where the parameters read are out of range (below).
// The steps, in the host's order (sampling._top_candidates, _heads, _nucleus, _kept_lists, _draw):
//   1. rank the `count` (w, id) pairs by w descending, ties by lower id;
//   2. edge = the width-th weight, floor = the last; refuse (-5) when count < vocab, floor > 0 and not
//      edge > floor * (1 + 2^-40);
//   3. the head: the ranked pairs with w >= edge and w > 0, at most top_k of them;
//   4. top_p < 1: the shortest prefix of the head whose fixed-point weights floor(w * 2^44) reach
//      ceil(top_p * their sum) (top_p = m / 2^s exactly, the product in 128 bits);
//   5. the kept pairs (w >= min_p) in id order; target = floor(u * total) with u = k / 2^53 the position's
//      splitmix uniform; the first id whose cumulative weight passes the target.
//
// Inputs: weights float64 and ids int64 [rows, count] (row r at + r * count), best float64 [rows] (each row's
// max of x * (1/T)), 1 <= width <= count <= kMaxCount, width <= top_k, and in device memory, so that a
// captured graph serves every request of its shape (rounds on the GPU, elpis.exl3.device_round):
//   params int64 [3]: the seed, then top_p's and min_p's float64 bits;
//   positions int64 [rows]: row r draws for absolute position positions[r] + offset (>= 0).
// A row whose parameters are out of range (top_p outside (0, 1], min_p outside [0, 1], a negative position)
// gets -4: the caller's own checks refuse them. Ampere instructions only (integer and float64 arithmetic).
#include <cuda_runtime.h>
#include <stdint.h>

#include "sample_draw_steps.cuh"

namespace {

using sample_steps::kMaxCount;
constexpr uint32_t kThreads = 32;  // a row a thread: a verify's 16 rows are one warp

__global__ void __launch_bounds__(kThreads)
    sample_draw_kernel(const double* weights, const int64_t* ids, const double* best, uint32_t rows,
                       uint32_t count, uint32_t vocab, uint32_t width, uint32_t top_k, const int64_t* params,
                       const int64_t* positions, int64_t offset, int64_t* out) {
    const uint32_t r = blockIdx.x * kThreads + threadIdx.x;
    if (r >= rows) return;
    sample_steps::Params p;
    if (!sample_steps::read_params(params, positions, offset, r, &p)) {
        out[r] = sample_steps::kParamsRefused;
        return;
    }
    if (!sample_steps::finite(best[r])) {
        out[r] = sample_steps::kNotFinite;
        return;
    }
    const double* w = weights + uint64_t(r) * count;
    const int64_t* id = ids + uint64_t(r) * count;
    // 1. the ranking
    uint16_t order[kMaxCount];
    sample_steps::rank(w, id, count, order);
    // 2. the edge against the smallest weight read
    const double edge = w[order[width - 1]], floor_w = w[order[count - 1]];
    if (!sample_steps::clears_floor(edge, floor_w, count < vocab)) {
        out[r] = sample_steps::kUndecided;
        return;
    }
    // 3. the head: a prefix of the ranking (w >= edge, then w > 0), at most top_k long
    uint32_t head = 0;
    while (head < count && head < top_k && w[order[head]] >= edge && w[order[head]] > 0.0) head++;
    // 4. top_p's prefix over the head's fixed-point weights
    if (p.top_p < 1.0) {
        uint64_t mass = 0;
        for (uint32_t i = 0; i < head; i++) mass += sample_steps::fixed_of(w[order[i]]);
        const uint64_t reach = sample_steps::reach_of(p.top_p, mass);
        uint64_t total = 0;
        uint32_t n = 0;
        while (n < head) {
            total += sample_steps::fixed_of(w[order[n]]);
            n++;
            if (total >= reach) break;
        }
        head = n;
    }
    // 5. the kept tokens in id order, and the draw over their fixed-point weights
    out[r] = sample_steps::draw_kept(w, id, order, head, p.min_p, p.seed, uint64_t(p.position));
}

}  // namespace

extern "C" {

// The most weights a row (count) the kernel takes.
uint32_t elpis_sample_draw_max_count() { return kMaxCount; }

// Queue the draws of `rows` rows on `stream` (a cudaStream_t passed as an address); see the top of the file for
// the inputs and out's values. Returns 0, -1 for arguments out of range, or the launch's cudaError_t.
int elpis_sample_draw(const double* weights, const int64_t* ids, const double* best, uint32_t rows,
                      uint32_t count, uint32_t vocab, uint32_t width, uint32_t top_k, const int64_t* params,
                      const int64_t* positions, int64_t offset, int64_t* out, void* stream) {
    if (weights == nullptr || ids == nullptr || best == nullptr || params == nullptr || positions == nullptr ||
        out == nullptr)
        return -1;
    if (rows == 0 || rows > 65535u * kThreads || count == 0 || count > kMaxCount || count > vocab) return -1;
    if (width == 0 || width > count || width > top_k) return -1;
    const uint32_t blocks = (rows + kThreads - 1) / kThreads;
    sample_draw_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        weights, ids, best, rows, count, vocab, width, top_k, params, positions, offset, out);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
