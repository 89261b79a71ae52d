// A top_k request's draw from each row's largest logits, on the GPU (issue 9: the host's share of a sampled
// round; patch exl3-sample-draw).
//
// elpis.spec.sampling draws a top_k request's token from each row's top_k + TOP_PAD largest logits: their
// weights w = exp(x * (1/T) - max) in float64 are computed by torch (the same operations whichever path
// follows), then the host ranks them, checks the head's edge, cuts top_k, top_p and min_p and draws by
// inverse CDF over fixed-point weights with the (seed, position) uniform. That host part took ~0.3 of a
// sampled call's ~0.5 ms for 16 rows on an H100 (bench/results/server/README.md, session 55). Here one
// thread a row does the same steps on the same float64 values, in integers and comparisons only (no rounding
// but w * 2^-40's product, correctly rounded like the host's), so every token is the host's:
//   out[r] = the drawn id, or
//           -1 where the head's edge does not clear the smallest weight read (ties may run past the logits
//              read: the caller decides that call from the whole vocabulary, as the host does), or
//           -2 where the row's maximum is not finite (the caller refuses the row),
//           -4 where the parameters read are out of range (below).
// The steps, in the host's order (sampling._top_candidates, _heads, _nucleus, _kept_lists, _draw):
//   1. rank the `count` (w, id) pairs by w descending, ties by lower id;
//   2. edge = the width-th weight, floor = the last; refuse (-1) when count < vocab, floor > 0 and not
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

namespace {

constexpr uint32_t kThreads = 32;     // a row a thread: a verify's 16 rows are one warp
constexpr uint32_t kMaxCount = 256;   // the most weights a row: top_k <= 240 with the host's 16 of padding
constexpr int kFixedBits = 44;        // sampling.FIXED_BITS
constexpr double kEdgeGap = 0x1p-40;  // sampling.EDGE_GAP

__device__ __forceinline__ uint64_t mul_hi(uint64_t a, uint64_t b) {
#ifdef ELPIS_CUDA_EMU
    return uint64_t((static_cast<unsigned __int128>(a) * b) >> 64);
#else
    return __umul64hi(a, b);
#endif
}

// sampling._mix64: splitmix64's finaliser
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// sampling.position_uniform's 53 bits: u = k / 2^53
__device__ __forceinline__ uint64_t uniform_bits(uint64_t seed, uint64_t position) {
    const uint64_t key = mix64(seed ^ 0x9E3779B97F4A7C15ull);
    return mix64(key + position * 0xD1B54A32D192ED03ull) >> 11;
}

// ceil(top_p * mass) exactly, for 0 < top_p < 1 and mass < 2^63: top_p = m / 2^s with m < 2^53 an integer.
__device__ __forceinline__ uint64_t reach_of(double top_p, uint64_t mass) {
    int e = 0;
    const double f = frexp(top_p, &e);              // top_p = f * 2^e, 0.5 <= f < 1
    const uint64_t m = uint64_t(ldexp(f, 53));      // exact: f has at most 53 significant bits
    const int s = 53 - e;                           // >= 54 since top_p < 1
    const uint64_t lo = m * mass, hi = mul_hi(m, mass);
    if (s >= 128) return (lo | hi) ? 1u : 0u;       // 0 < m * mass / 2^s < 1
    uint64_t q, rem;
    if (s >= 64) {
        q = s == 64 ? hi : hi >> (s - 64);
        rem = (s == 64 ? 0 : hi & ((uint64_t(1) << (s - 64)) - 1)) | lo;
    } else {
        q = (lo >> s) | (hi << (64 - s));
        rem = lo & ((uint64_t(1) << s) - 1);
    }
    return q + (rem != 0);
}

// Whether (wa, ia) ranks before (wb, ib): the larger weight, then the lower id.
__device__ __forceinline__ bool ranks_before(double wa, int64_t ia, double wb, int64_t ib) {
    return wa > wb || (wa == wb && ia < ib);
}

__global__ void __launch_bounds__(kThreads)
    sample_draw_kernel(const double* weights, const int64_t* ids, const double* best, uint32_t rows,
                       uint32_t count, uint32_t vocab, uint32_t width, uint32_t top_k, const int64_t* params,
                       const int64_t* positions, int64_t offset, int64_t* out) {
    const uint32_t r = blockIdx.x * kThreads + threadIdx.x;
    if (r >= rows) return;
    const uint64_t seed = static_cast<uint64_t>(params[0]);
    const double top_p = __longlong_as_double(params[1]), min_p = __longlong_as_double(params[2]);
    const int64_t position = positions[r] + offset;
    if (!(top_p > 0.0 && top_p <= 1.0) || !(min_p >= 0.0 && min_p <= 1.0) || position < 0) {
        out[r] = -4;
        return;
    }
    const double peak = best[r];
    if (!(peak - peak == 0.0)) {  // NaN or infinite
        out[r] = -2;
        return;
    }
    const double* w = weights + uint64_t(r) * count;
    const int64_t* id = ids + uint64_t(r) * count;
    // 1. the ranking, by insertion (count is a few dozen for the served top_k)
    uint16_t order[kMaxCount];
    for (uint32_t i = 0; i < count; i++) {
        uint32_t j = i;
        while (j > 0 && ranks_before(w[i], id[i], w[order[j - 1]], id[order[j - 1]])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = uint16_t(i);
    }
    // 2. the edge against the smallest weight read
    const double edge = w[order[width - 1]], floor_w = w[order[count - 1]];
    if (count < vocab && floor_w > 0.0 && !(edge > floor_w * (1.0 + kEdgeGap))) {
        out[r] = -1;
        return;
    }
    // 3. the head: a prefix of the ranking (w >= edge, then w > 0), at most top_k long
    uint32_t head = 0;
    while (head < count && head < top_k && w[order[head]] >= edge && w[order[head]] > 0.0) head++;
    // 4. top_p's prefix over the head's fixed-point weights
    const double scale = double(uint64_t(1) << kFixedBits);
    if (top_p < 1.0) {
        uint64_t mass = 0;
        for (uint32_t i = 0; i < head; i++) mass += uint64_t(floor(w[order[i]] * scale));
        const uint64_t reach = reach_of(top_p, mass);
        uint64_t total = 0;
        uint32_t n = 0;
        while (n < head) {
            total += uint64_t(floor(w[order[n]] * scale));
            n++;
            if (total >= reach) break;
        }
        head = n;
    }
    // 5. the kept tokens in id order, and the draw over their fixed-point weights
    uint16_t kept[kMaxCount];
    uint32_t n_kept = 0;
    for (uint32_t i = 0; i < head; i++) {
        const uint32_t at = order[i];
        if (!(w[at] >= min_p)) continue;
        uint32_t j = n_kept++;
        while (j > 0 && id[at] < id[kept[j - 1]]) {
            kept[j] = kept[j - 1];
            j--;
        }
        kept[j] = uint16_t(at);
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_kept; i++) total += uint64_t(floor(w[kept[i]] * scale));
    const uint64_t k = uniform_bits(seed, uint64_t(position));
    const uint64_t target = (mul_hi(k, total) << 11) | ((k * total) >> 53);  // floor(k * total / 2^53)
    uint64_t cumulative = 0;
    int64_t token = -3;  // no token passed the target: impossible while the most likely one is kept
    for (uint32_t i = 0; i < n_kept; i++) {
        cumulative += uint64_t(floor(w[kept[i]] * scale));
        if (cumulative > target) {
            token = id[kept[i]];
            break;
        }
    }
    out[r] = token;
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
