// The steps of elpis.spec.sampling's draw that the GPU's draws share (sample_draw.cu: a top_k request's draw from
// each row's largest logits; vocab_draw.cu: a request without top_k, over its whole vocabulary): the (seed,
// position) uniform, top_p's exact reach, the ranking of a row's largest weights and the inverse CDF over the kept
// tokens' fixed-point weights. Integers and comparisons only, but w * 2^44's product, exact like the host's.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace sample_steps {

constexpr uint32_t kMaxCount = 256;   // the most weights a row: top_k <= 240 with the host's 16 of padding
constexpr int kFixedBits = 44;        // sampling.FIXED_BITS
constexpr double kEdgeGap = 0x1p-40;  // sampling.EDGE_GAP
// A row's answers where the draw does not draw it: left to the host (round_tail.cu's kUndecided, which the
// round's acceptor ignores off the committed path), a maximum not finite (the caller refuses the row), parameters
// out of range (the caller's own checks refuse them)
constexpr int64_t kUndecided = -5, kNotFinite = -2, kParamsRefused = -4;

__device__ __forceinline__ bool finite(double x) { return x - x == 0.0; }  // not NaN, not infinite

// A row's draw parameters, read from device memory: params int64 [3] (the seed, then top_p's and min_p's float64
// bits) and the row's position, positions[r] + offset. False where they are out of range (kParamsRefused): top_p
// outside (0, 1], min_p outside [0, 1], a negative position.
struct Params {
    uint64_t seed;
    double top_p, min_p;
    int64_t position;
};
__device__ __forceinline__ bool read_params(const int64_t* params, const int64_t* positions, int64_t offset,
                                            uint32_t r, Params* p) {
    p->seed = static_cast<uint64_t>(params[0]);
    p->top_p = __longlong_as_double(params[1]);
    p->min_p = __longlong_as_double(params[2]);
    p->position = positions[r] + offset;
    return p->top_p > 0.0 && p->top_p <= 1.0 && p->min_p >= 0.0 && p->min_p <= 1.0 && p->position >= 0;
}

// Whether weight w ranks clear of every token not read: those weigh at most floor_w, the smallest weight read,
// within exp's rounding (sampling.TOP_PAD's rule). Always where every token was read (`partial` false) or
// floor_w is 0 (the tokens not read weigh 0 too).
__device__ __forceinline__ bool clears_floor(double w, double floor_w, bool partial) {
    return !partial || !(floor_w > 0.0) || w > floor_w * (1.0 + kEdgeGap);
}

__device__ __forceinline__ uint64_t mul_hi(uint64_t a, uint64_t b) {
#ifdef ELPIS_CUDA_EMU
    return uint64_t((static_cast<unsigned __int128>(a) * b) >> 64);
#else
    return __umul64hi(a, b);
#endif
}

// sampling._fixed: floor(w * 2^44), exact (a product by a power of two)
__device__ __forceinline__ uint64_t fixed_of(double w) {
    return uint64_t(floor(w * double(uint64_t(1) << kFixedBits)));
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

// sampling._draw_target: floor(u * total) = floor(k * total / 2^53), for total < 2^64
__device__ __forceinline__ uint64_t draw_target(uint64_t seed, uint64_t position, uint64_t total) {
    const uint64_t k = uniform_bits(seed, position);
    return (mul_hi(k, total) << 11) | ((k * total) >> 53);
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

// order[0, count) = the pairs' indices ranked (weight descending, ties by lower id), by insertion: linear on
// torch.topk's output, already in descending order but for the order of ties.
__device__ __forceinline__ void rank(const double* w, const int64_t* id, uint32_t count, uint16_t* order) {
    for (uint32_t i = 0; i < count; i++) {
        uint32_t j = i;
        while (j > 0 && ranks_before(w[i], id[i], w[order[j - 1]], id[order[j - 1]])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = uint16_t(i);
    }
}

// The draw over the ranked prefix order[0, head): its pairs with w >= min_p in id order, the target floor(u *
// total) of their fixed-point weights' total, and the first id whose cumulative weight passes it (sampling._draw);
// -3 where none does (impossible while the most likely token is kept).
__device__ __forceinline__ int64_t draw_kept(const double* w, const int64_t* id, const uint16_t* order,
                                             uint32_t head, double min_p, uint64_t seed, uint64_t position) {
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
    for (uint32_t i = 0; i < n_kept; i++) total += fixed_of(w[kept[i]]);
    const uint64_t target = draw_target(seed, position, total);
    uint64_t cumulative = 0;
    for (uint32_t i = 0; i < n_kept; i++) {
        cumulative += fixed_of(w[kept[i]]);
        if (cumulative > target) return id[kept[i]];
    }
    return -3;
}

}  // namespace sample_steps
