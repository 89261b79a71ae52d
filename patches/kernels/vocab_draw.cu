// A sampled request's draw without top_k, on the GPU (issue 9: sampled rounds on the GPU; patch exl3-vocab-draw).
//
// elpis.spec.sampling draws a request without top_k from its whole vocabulary (`_kept_fixed`, `_fixed_draws`):
// every token's weight w = exp(x * (1/T) - max) in float64 and fixed-point weight floor(w * 2^44); top_p keeps
// the shortest prefix of a stable descending sort whose weights reach ceil(top_p * the row's mass), min_p keeps
// w >= min_p, and the kept tokens are drawn by inverse CDF in id order with the (seed, position) uniform. On the
// host that is a sort of the vocabulary and a read-back a call; OpenAI clients send no top_k, so it is the sampled
// request they send. Here, with the same operations on the same values (the products and the difference correctly
// rounded as torch's, exp the same CUDA math function torch's exp calls), so every token is the host's:
//
//   mass: one block a span of a row (the proved partition of bend/row_spans.bend, read by the proved strides of
//         bend/row_scan_schedule.bend, row_scan.cuh) sums the span's fixed-point weights; integers, so the sum
//         does not depend on the order.
//   head (top_p < 1, or min_p > 0): a thread a row ranks the row's largest weights (sampling.top_weights, count
//         of them) as sample_draw.cu does, walks top_p's prefix against the whole row's mass, and draws over the
//         prefix's tokens with w >= min_p (sample_draw_steps.cuh). The prefix must end on a weight clear of the
//         smallest weight read (a token not read weighs at most that one, within exp's rounding), and with top_p
//         = 1 the smallest weight read must be clear below min_p; otherwise the row is left undecided (-5) for:
//   nucleus (the rows the head leaves undecided): top_p's prefix over the whole row by an exact radix select on
//         the logits' bits (below, before nucleus_hist_kernel), then the kept weights summed a span and the token
//         found in id order as the pick does. Where the row's spans do not fit the pick's shared memory the
//         nucleus does not run and such a row stays -5: the host decides from the whole vocabulary.
//   pick (top_p = 1, min_p = 0: every token kept): a block a row finds the span its target falls in from the
//         spans' sums, recomputes that span's weights into shared memory, and finds the token in id order.
//
//   out[r] = the drawn id, or -5 (a row the head and nucleus leave undecided; the host decides), -2 where the
//            row's maximum is not finite (the caller refuses the row), -4 where the parameters read are out of
//            range or are the other launch's (top_p = 1 and min_p = 0 is the pick's, anything else the head's).
//
// Inputs: logits fp16 (the verify's output, read in place), fp32 or float64 (a penalised request's adjusted rows):
// `vocab` values a row, row r at logits + r * row_stride, rows 16-byte aligned (8 for float64); scale float64 [1]
// (the inverse temperature) and best float64 [rows] (each row's max of x * (1/T)), params int64 [3] (the seed,
// top_p's and min_p's float64 bits) and positions int64 [rows] (row r draws for positions[r] + offset) in device
// memory, read when the launch runs, so one captured graph serves every request of its launch; workspace: uint64
// [rows, spans] for the pick, elpis_vocab_draw_head_words for the head (the nucleus's bins, kept weights and
// cuts). Ampere instructions only (integer and float64 arithmetic, shared-memory atomics, 16-byte read-only loads).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "row_scan.cuh"
#include "sample_draw_steps.cuh"

namespace {

// Threads of a block, a power of two; values a span and the most spans a row (a test build takes fewer and
// shorter: the tokens do not depend on them).
#ifndef ELPIS_VOCAB_DRAW_THREADS
#define ELPIS_VOCAB_DRAW_THREADS 256
#endif
#ifndef ELPIS_VOCAB_DRAW_SPAN_VALUES
#define ELPIS_VOCAB_DRAW_SPAN_VALUES 4096
#endif
#ifndef ELPIS_VOCAB_DRAW_MAX_SPANS
#define ELPIS_VOCAB_DRAW_MAX_SPANS 64
#endif
// The exp of the weights: CUDA's, as torch's. An emulated test build names a deliberately non-monotone one to check
// that the nucleus never rests on exp being monotone (nucleus_kept_kernel's check).
#ifndef ELPIS_VOCAB_DRAW_EXP
#define ELPIS_VOCAB_DRAW_EXP exp
#endif
constexpr uint32_t kThreads = ELPIS_VOCAB_DRAW_THREADS;
constexpr uint32_t kSpanValues = ELPIS_VOCAB_DRAW_SPAN_VALUES;
static_assert(kThreads >= 32 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0, "a power of two block");
static_assert(kSpanValues >= 8 && kSpanValues <= 8192, "a span's weights fit the pick's shared memory");
// log2 of a span's values and of the most spans a row, inside the row spans' proved domain
constexpr uint32_t kSpanShift = row_scan::log2_in_domain<kSpanValues, ELPIS_ROWSPANS_MAX_BASE>();
constexpr uint32_t kSpanCap = row_scan::log2_in_domain<ELPIS_VOCAB_DRAW_MAX_SPANS, ELPIS_ROWSPANS_MAX_CAP>();
constexpr uint32_t kHeadThreads = 32;  // the head: a row a thread
using sample_steps::finite;
using sample_steps::Params;
using sample_steps::read_params;

// The row kinds: fp16 and fp32 rows in 16-byte vectors (row_scan.cuh), float64 rows a value at a time.
constexpr uint32_t kFp16 = 0, kFp32 = 1, kFp64 = 2;

// log2 of the values in a span's unit: a 16-byte vector of fp16 or fp32 values, or one float64 value.
__host__ __device__ inline uint32_t unit_shift(uint32_t kind) {
    return kind == kFp64 ? 0u : elpis_rowspans_vector_shift(kind == kFp16 ? 1u : 0u);
}
// The units of a row of `vocab` values (the values past the last vector belong to the last span).
__host__ __device__ inline uint32_t units_of(uint32_t kind, uint32_t vocab) {
    return kind == kFp64 ? vocab : elpis_rowspans_vectors(vocab, kind == kFp16 ? 1u : 0u);
}
__host__ __device__ inline row_scan::Spans spans_of(uint32_t kind, uint32_t vocab) {
    const uint32_t total = units_of(kind, vocab);
    const uint32_t shift = elpis_rowspans_span_shift(total, kSpanShift - unit_shift(kind), kSpanCap);
    return row_scan::Spans{elpis_rowspans_span_count(total, shift), shift};
}
// The values [begin, end) of span s.
__host__ __device__ inline void span_values(uint32_t kind, uint32_t vocab, row_scan::Spans spans, uint32_t s,
                                            uint32_t* begin, uint32_t* end) {
    const uint32_t u = unit_shift(kind), total = units_of(kind, vocab);
    *begin = elpis_rowspans_span_begin(s, spans.shift) << u;
    *end = s + 1u == spans.count ? vocab : elpis_rowspans_span_end(total, s, spans.shift) << u;
}

// A logit's bits as an unsigned key that orders as the values do (negative values reversed below the positive).
template <uint32_t kWidth>
__host__ __device__ inline uint64_t sortable(uint64_t bits) {
    constexpr uint64_t sign = uint64_t(1) << (kWidth - 1), mask = kWidth == 64 ? ~uint64_t(0) : (sign << 1) - 1;
    return (bits & sign) ? (~bits & mask) : (bits | sign);
}
template <uint32_t kWidth>
__host__ __device__ inline uint64_t unsortable(uint64_t key) {
    constexpr uint64_t sign = uint64_t(1) << (kWidth - 1), mask = kWidth == 64 ? ~uint64_t(0) : (sign << 1) - 1;
    return (key & sign) ? (key ^ sign) : (~key & mask);
}

// f(x, i) for each value x (exact in float64) at index i that thread threadIdx.x reads of span s of a row; keyed:
// f(key, x, i) with the value's bits as a key that orders as the values do (the nucleus's select); value_of: the
// value of a key.
template <typename T>
struct Values {
    static constexpr uint32_t kWidth = 8 * sizeof(T);
    template <typename F>
    __device__ static void keyed(const T* row, uint32_t vocab, row_scan::Spans spans, uint32_t s, F&& f) {
        row_scan::each_logit_of_span<T, kThreads>(row, vocab, spans, s, [&](uint32_t b, uint32_t i) {
            f(sortable<kWidth>(b), static_cast<double>(row_scan::Logit<T>::value(b)), i);
        });
    }
    template <typename F>
    __device__ static void of_span(const T* row, uint32_t vocab, row_scan::Spans spans, uint32_t s, F&& f) {
        row_scan::each_logit_of_span<T, kThreads>(row, vocab, spans, s, [&](uint32_t b, uint32_t i) {
            f(static_cast<double>(row_scan::Logit<T>::value(b)), i);
        });
    }
    __device__ static double value_of(uint64_t key) {
        return static_cast<double>(row_scan::Logit<T>::value(static_cast<uint32_t>(unsortable<kWidth>(key))));
    }
};
template <>
struct Values<double> {
    template <typename F>
    __device__ static void of_span(const double* row, uint32_t vocab, row_scan::Spans spans, uint32_t s, F&& f) {
        const uint32_t first = elpis_rowspans_span_begin(s, spans.shift);
        const uint32_t end = elpis_rowspans_span_end(vocab, s, spans.shift);
        row_scan::each_of_stride<kThreads>(first, end, [&](uint32_t i) { f(row[i], i); });
    }
    template <typename F>
    __device__ static void keyed(const double* row, uint32_t vocab, row_scan::Spans spans, uint32_t s, F&& f) {
        of_span(row, vocab, spans, s, [&](double x, uint32_t i) {
            f(sortable<64>(static_cast<uint64_t>(__double_as_longlong(x))), x, i);
        });
    }
    __device__ static double value_of(uint64_t key) {
        return __longlong_as_double(static_cast<long long>(unsortable<64>(key)));
    }
};

// sampling._weights of one value: exp(x * (1/T) - best), each operation rounded once (no fma contraction). exp of
// anything below -1000 (-inf included) is 0, the smallest subnormal being exp(-744.4): skipping it there is the same
// value, and without that branch ptxas spilled registers around exp's out-of-range path inlined sixteen times a
// vector pair (68-156 bytes on sm_90).
__device__ __forceinline__ double weight_of(double x, double inverse, double best) {
    const double d = __dsub_rn(__dmul_rn(x, inverse), best);
    return d < -1000.0 ? 0.0 : ELPIS_VOCAB_DRAW_EXP(d);
}
// ... then _fixed_weights: floor(w * 2^44).
__device__ __forceinline__ uint64_t fixed_weight(double x, double inverse, double best) {
    return sample_steps::fixed_of(weight_of(x, inverse, best));
}

// Block (span s, row r): the span's fixed-point weights summed into sums[r * spans + s] (0 for a row whose maximum
// is not finite: the draw refuses it).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    vocab_mass_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab, row_scan::Spans spans,
                      const double* __restrict__ scale, const double* __restrict__ best,
                      unsigned long long* __restrict__ sums) {
    __shared__ unsigned long long slots[kThreads];
    const uint32_t t = threadIdx.x, s = blockIdx.x, r = blockIdx.y;
    const double inverse = *scale, peak = best[r];
    unsigned long long acc = 0;
    if (finite(peak)) {
        Values<T>::of_span(logits + static_cast<size_t>(r) * row_stride, vocab, spans, s,
                           [&](double x, uint32_t) { acc += fixed_weight(x, inverse, peak); });
    }
    slots[t] = acc;
    __syncthreads();
    row_scan::halving_tree<kThreads>([&](uint32_t a, uint32_t b) { slots[a] += slots[b]; });
    if (t == 0) sums[static_cast<size_t>(r) * spans.count + s] = slots[0];
}

// Whether a request keeps every token (the pick's; anything else is the head's).
__device__ __forceinline__ bool keeps_everything(const Params& p) { return p.top_p == 1.0 && p.min_p == 0.0; }

__device__ __forceinline__ uint64_t row_mass(const unsigned long long* sums, uint32_t spans, uint32_t r) {
    uint64_t mass = 0;
    for (uint32_t s = 0; s < spans; s++) mass += sums[static_cast<size_t>(r) * spans + s];
    return mass;
}

// Thread r: the head's draw (top of the file) from the row's `count` largest weights and its spans' sums.
__global__ void __launch_bounds__(kHeadThreads)
    vocab_head_kernel(const double* weights, const int64_t* ids, const double* best, uint32_t rows, uint32_t count,
                      uint32_t vocab, const unsigned long long* sums, uint32_t spans, const int64_t* params,
                      const int64_t* positions, int64_t offset, int64_t* out) {
    const uint32_t r = blockIdx.x * kHeadThreads + threadIdx.x;
    if (r >= rows) return;
    Params p;
    if (!read_params(params, positions, offset, r, &p) || keeps_everything(p)) {
        out[r] = sample_steps::kParamsRefused;
        return;
    }
    if (!finite(best[r])) {
        out[r] = sample_steps::kNotFinite;
        return;
    }
    const double* w = weights + uint64_t(r) * count;
    const int64_t* id = ids + uint64_t(r) * count;
    uint16_t order[sample_steps::kMaxCount];
    sample_steps::rank(w, id, count, order);
    const double floor_w = w[order[count - 1]];
    const bool partial = count < vocab;  // tokens not read weigh at most floor_w (within exp's rounding)
    uint32_t head = count;
    if (p.top_p < 1.0) {
        const uint64_t reach = sample_steps::reach_of(p.top_p, row_mass(sums, spans, r));
        uint64_t total = 0;
        uint32_t n = 0;
        bool reached = false;
        while (n < count) {
            const double wn = w[order[n]];
            if (!sample_steps::clears_floor(wn, floor_w, partial)) break;
            total += sample_steps::fixed_of(wn);
            n++;
            if (total >= reach) {
                reached = true;
                break;
            }
        }
        if (!reached) {
            out[r] = sample_steps::kUndecided;
            return;
        }
        head = n;
    } else if (partial && !(floor_w * (1.0 + sample_steps::kEdgeGap) < p.min_p)) {
        out[r] = sample_steps::kUndecided;  // a token not read may reach min_p
        return;
    }
    out[r] = sample_steps::draw_kept(w, id, order, head, p.min_p, p.seed, uint64_t(p.position));
}

// The draw in id order over a row's kept weights (sampling._fixed_draws), by the whole block: the target floor(u *
// total) of the kept weights' total (`span_sums`: each span's kept weights, summed), the span it falls in, that
// span's kept weights recomputed into shared memory (weigh(key, x, i): a token's kept weight, 0 where it is not
// kept), and the token in id order; thread 0 writes it to *out. Every thread of the block must call it.
template <typename T, typename Weigh>
__device__ void pick_in_id_order(const T* row, uint32_t kind, uint32_t vocab, row_scan::Spans spans,
                                 const unsigned long long* span_sums, const Params& p, Weigh&& weigh, int64_t* out) {
    __shared__ unsigned long long weights[kSpanValues + 8];  // the span's weights (the last span's singles too)
    __shared__ unsigned long long parts[kThreads];
    __shared__ uint32_t found;
    __shared__ unsigned long long before, target;
    const uint32_t t = threadIdx.x;
    if (t == 0) {
        unsigned long long total = 0;
        for (uint32_t s = 0; s < spans.count; s++) total += span_sums[s];
        target = sample_steps::draw_target(p.seed, uint64_t(p.position), total);
        unsigned long long cumulative = 0;
        found = spans.count - 1;  // target < total (a uniform below 1), so some span passes it
        for (uint32_t s = 0; s < spans.count; s++) {
            const unsigned long long next = cumulative + span_sums[s];
            if (next > target) {
                found = s;
                break;
            }
            cumulative = next;
        }
        before = cumulative;
    }
    __syncthreads();
    uint32_t begin = 0, end = 0;
    span_values(kind, vocab, spans, found, &begin, &end);
    Values<T>::keyed(row, vocab, spans, found,
                     [&](uint64_t key, double x, uint32_t i) { weights[i - begin] = weigh(key, x, i); });
    __syncthreads();
    // thread c sums the c-th run of `per` weights, then thread 0 walks the runs and the run holding the target
    const uint32_t n = end - begin, per = (n + kThreads - 1) / kThreads;
    unsigned long long part = 0;
    for (uint32_t i = t * per; i < n && i < (t + 1) * per; i++) part += weights[i];
    parts[t] = part;
    __syncthreads();
    if (t == 0) {
        unsigned long long cumulative = before;
        int64_t token = -3;  // no token passed the target: impossible, the span's sum passes it
        for (uint32_t c = 0; c < kThreads && token < 0; c++) {
            if (cumulative + parts[c] <= target) {
                cumulative += parts[c];
                continue;
            }
            for (uint32_t i = c * per; i < n && i < (c + 1) * per; i++) {
                cumulative += weights[i];
                if (cumulative > target) {
                    token = static_cast<int64_t>(begin + i);
                    break;
                }
            }
        }
        *out = token;
    }
}

// Block r: every token kept; the draw's target among the spans' sums, then that span's weights in id order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    vocab_pick_kernel(const T* __restrict__ logits, uint32_t kind, uint32_t row_stride, uint32_t vocab,
                      row_scan::Spans spans, const double* __restrict__ scale, const double* __restrict__ best,
                      const unsigned long long* __restrict__ sums, const int64_t* __restrict__ params,
                      const int64_t* __restrict__ positions, int64_t offset, int64_t* __restrict__ out) {
    const uint32_t t = threadIdx.x, r = blockIdx.x;
    Params p;
    const bool valid = read_params(params, positions, offset, r, &p) && keeps_everything(p);
    const double inverse = *scale, peak = best[r];
    if (!valid || !finite(peak)) {  // the same answer on every thread of the block: all return here
        if (t == 0) out[r] = valid ? sample_steps::kNotFinite : sample_steps::kParamsRefused;
        return;
    }
    pick_in_id_order(logits + static_cast<size_t>(r) * row_stride, kind, vocab, spans,
                     sums + static_cast<size_t>(r) * spans.count, p,
                     [&](uint64_t, double x, uint32_t) { return fixed_weight(x, inverse, peak); }, out + r);
}

// ---- The nucleus: the rows the head leaves undecided (out[r] == kUndecided), decided over the whole vocabulary.
// A row's top_p prefix of the stable descending sort is {w > w*} and the first c of {w == w*} by id, for the
// boundary weight w* and count c. w = exp(x * (1/T) - best) does not decrease as the logit x grows, so the tokens
// above a logit value are a prefix of that order, and w* is found by a radix select on x's bits made sortable (16,
// 32 or 64 of them), eight bits a pass, each pass summing the candidates' fixed-point weights a digit (integers:
// the sums do not depend on the order). The tokens of w*'s class may span several logit values (x = +0 and -0,
// or values too close to move the difference with best): the class is widened while the next logit value present
// above or below weighs w* too. Then the kept tokens' weights (with min_p) are summed a span and drawn from in id
// order as the pick does. That the order of the logits is the weights' rests on exp being monotone, which CUDA does
// not promise (its exp is within an ulp): the kept pass checks every token's weight against w* by its key (above the
// class heavier, in it equal, below lighter), and a row where one is not is left to the host, so the tokens are the
// host's either way. Four launches after the head: the first digit's sums a span, the rest of the cut a row,
// the kept weights a span, the draw a row; every block of a row the head decided returns at once. --------------

constexpr uint32_t kDigitBits = 8, kBins = 1u << kDigitBits;
// A row's cut: the lowest and highest key of w*'s class, the last id kept, the status, w*'s bits, and whether the
// kept pass found a token's weight out of its key's order (then the row is left undecided).
constexpr uint32_t kCutWords = 6;
constexpr uint64_t kCutFailed = 0, kCutPrefix = 1, kCutAll = 2;  // status: kCutFailed leaves the row undecided

// The key bits a row kind's logits have.
template <typename T>
constexpr uint32_t kKeyBits = 8 * sizeof(T);
template <typename T>
__device__ __forceinline__ uint32_t digit_of(uint64_t key, uint32_t pass) {
    return static_cast<uint32_t>(key >> (kKeyBits<T> - kDigitBits * (pass + 1))) & (kBins - 1);
}

// A row's cut as the kept pass and the draw read it, once a block: which tokens it keeps (kCutPrefix: above the
// class, or in it up to the last id kept; kCutAll: every token).
struct Cut {
    unsigned long long lo, hi, last;
    bool all;
    __device__ bool keeps(uint64_t key, uint32_t i) const {
        return all || key > hi || (key >= lo && key <= hi && i <= last);
    }
};
__device__ __forceinline__ Cut cut_of(const unsigned long long* cut) {
    return Cut{cut[0], cut[1], cut[2], cut[3] == kCutAll};
}

// Block (span s, row r) of a row left undecided: the span's fixed-point weights summed by the first digit of their
// keys into hist[(r * spans + s) * kBins + digit] (every digit written).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    nucleus_hist_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab, row_scan::Spans spans,
                        const double* __restrict__ scale, const double* __restrict__ best,
                        const int64_t* __restrict__ out, unsigned long long* __restrict__ hist) {
    __shared__ unsigned long long bins[kBins];
    const uint32_t t = threadIdx.x, s = blockIdx.x, r = blockIdx.y;
    if (out[r] != sample_steps::kUndecided) return;
    for (uint32_t b = t; b < kBins; b += kThreads) bins[b] = 0;
    __syncthreads();
    const double inverse = *scale, peak = best[r];
    Values<T>::keyed(logits + static_cast<size_t>(r) * row_stride, vocab, spans, s,
                     [&](uint64_t key, double x, uint32_t) {
                         const uint64_t q = fixed_weight(x, inverse, peak);
                         if (q != 0u) atomicAdd(&bins[digit_of<T>(key, 0)], static_cast<unsigned long long>(q));
                     });
    __syncthreads();
    unsigned long long* mine = hist + (static_cast<size_t>(r) * spans.count + s) * kBins;
    for (uint32_t b = t; b < kBins; b += kThreads) mine[b] = bins[b];
}

// Thread 0's step of the select: the highest digit whose bin, with every higher one, reaches `reach`; bins above it
// are added to *above. False where none does (impossible: the bins hold the candidates' whole weight).
__device__ inline bool settle(const unsigned long long* bins, unsigned long long reach, unsigned long long* above,
                              uint32_t* digit) {
    for (uint32_t b = kBins; b-- > 0;) {
        if (*above + bins[b] >= reach) {
            *digit = b;
            return true;
        }
        *above += bins[b];
    }
    return false;
}

// The lowest key above `hi` and the highest below `lo` present in a row, with how many tokens hold each (a count of
// 0: none).
struct Neighbours {
    unsigned long long up, down;
    uint32_t up_n, down_n;
};

// Block r of a row left undecided: the rest of the select (the other digits, over the whole row), w*'s class, and
// the id of the class's c-th token; written to cuts[r * kCutWords, +kCutWords). top_p = 1 (min_p alone) keeps all.
// A block a multiprocessor named in the bound: without it ptxas held the float64 build to 32 registers on sm_90 and
// spilled 40 bytes (a row's cut is 16-odd blocks of the whole GPU, not an occupancy question).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    nucleus_cut_kernel(const T* __restrict__ logits, uint32_t kind, uint32_t row_stride, uint32_t vocab,
                       row_scan::Spans spans, const double* __restrict__ scale, const double* __restrict__ best,
                       const unsigned long long* __restrict__ sums, const unsigned long long* __restrict__ hist,
                       const int64_t* __restrict__ params, const int64_t* __restrict__ positions, int64_t offset,
                       const int64_t* __restrict__ out, unsigned long long* __restrict__ cuts) {
    constexpr uint32_t kPasses = kKeyBits<T> / kDigitBits;
    __shared__ unsigned long long bins[kBins];
    __shared__ uint32_t counts[kBins];
    __shared__ unsigned long long prefix, above, reach, lo, hi, widened_above, members;
    __shared__ uint32_t digit, tie_span;
    __shared__ unsigned long long tie_rank;
    __shared__ bool ok, widened;
    __shared__ Neighbours near[kThreads];
    __shared__ uint32_t span_members[1u << kSpanCap];
    __shared__ uint8_t in_class[kSpanValues + 8];
    __shared__ uint32_t parts[kThreads];
    const uint32_t t = threadIdx.x, r = blockIdx.x;
    if (out[r] != sample_steps::kUndecided) return;
    Params p;
    read_params(params, positions, offset, r, &p);  // in range: the head read them
    unsigned long long* cut = cuts + static_cast<size_t>(r) * kCutWords;
    if (p.top_p == 1.0) {  // min_p alone: every token passes the cut
        if (t == 0) cut[0] = cut[1] = cut[2] = cut[4] = cut[5] = 0, cut[3] = kCutAll;
        return;
    }
    const T* row = logits + static_cast<size_t>(r) * row_stride;
    const double inverse = *scale, peak = best[r];
    // the first digit: the spans' bins summed
    for (uint32_t b = t; b < kBins; b += kThreads) {
        unsigned long long total = 0;
        for (uint32_t s = 0; s < spans.count; s++) total += hist[(static_cast<size_t>(r) * spans.count + s) * kBins + b];
        bins[b] = total;
    }
    __syncthreads();
    if (t == 0) {
        reach = sample_steps::reach_of(p.top_p, row_mass(sums, spans.count, r));
        above = 0;
        ok = settle(bins, reach, &above, &digit);
        prefix = digit;
    }
    __syncthreads();
    // the other digits: the row's tokens whose keys start with the prefix, each pass over the whole row; the last
    // pass's bins hold one logit value each, so they count tokens and weigh each value once
    for (uint32_t pass = 1; pass < kPasses && ok; pass++) {
        const bool last = pass + 1 == kPasses;
        for (uint32_t b = t; b < kBins; b += kThreads) bins[b] = 0, counts[b] = 0;
        __syncthreads();
        const uint32_t shift = kKeyBits<T> - kDigitBits * pass;
        const unsigned long long want = prefix;
        for (uint32_t s = 0; s < spans.count; s++) {
            Values<T>::keyed(row, vocab, spans, s, [&](uint64_t key, double x, uint32_t) {
                if ((key >> shift) != want) return;
                if (last) {
                    atomicAdd(&counts[digit_of<T>(key, pass)], 1u);
                } else {
                    const uint64_t q = fixed_weight(x, inverse, peak);
                    if (q != 0u) atomicAdd(&bins[digit_of<T>(key, pass)], static_cast<unsigned long long>(q));
                }
            });
        }
        __syncthreads();
        if (last) {
            for (uint32_t b = t; b < kBins; b += kThreads) {
                const double x = Values<T>::value_of((want << kDigitBits) | b);
                bins[b] = counts[b] == 0u ? 0u : counts[b] * fixed_weight(x, inverse, peak);
            }
            __syncthreads();
        }
        if (t == 0) {
            ok = settle(bins, reach, &above, &digit);
            prefix = (want << kDigitBits) | digit;
        }
        __syncthreads();
    }
    if (!ok) {
        if (t == 0) cut[3] = kCutFailed;
        return;
    }
    // w*'s class: the key found, widened while the next key present above or below weighs the same. The same pass
    // counts each span's tokens of the class as it stands, which the id cut below reads once the class holds.
    const double w_star = weight_of(Values<T>::value_of(prefix), inverse, peak);
    const uint64_t q_star = sample_steps::fixed_of(w_star);
    if (t == 0) {
        lo = hi = prefix;
        members = counts[digit];
        widened_above = 0;
    }
    for (;;) {
        for (uint32_t s = t; s < spans.count; s += kThreads) span_members[s] = 0;
        __syncthreads();
        unsigned long long up = ~0ull, down = 0;
        uint32_t up_n = 0, down_n = 0;
        const unsigned long long low = lo, high = hi;
        for (uint32_t s = 0; s < spans.count; s++) {
            uint32_t in = 0;
            Values<T>::keyed(row, vocab, spans, s, [&](uint64_t key, double, uint32_t) {
                in += key >= low && key <= high;
                if (key > high && key <= up) up_n = key == up ? up_n + 1 : 1, up = key;
                if (key < low && key >= down) down_n = key == down ? down_n + 1 : 1, down = key;
            });
            if (in != 0u) atomicAdd(&span_members[s], in);
        }
        near[t] = Neighbours{up, down, up_n, down_n};
        __syncthreads();
        row_scan::halving_tree<kThreads>([&](uint32_t a, uint32_t b) {
            Neighbours& x = near[a];
            const Neighbours& y = near[b];
            if (y.up < x.up) x.up = y.up, x.up_n = y.up_n;
            else if (y.up == x.up) x.up_n += y.up_n;
            if (y.down > x.down) x.down = y.down, x.down_n = y.down_n;
            else if (y.down == x.down) x.down_n += y.down_n;
        });
        if (t == 0) {
            const Neighbours& n = near[0];
            widened = false;
            if (n.up_n != 0u && weight_of(Values<T>::value_of(n.up), inverse, peak) == w_star) {
                hi = n.up, members += n.up_n, widened_above += n.up_n, widened = true;
            }
            if (n.down_n != 0u && weight_of(Values<T>::value_of(n.down), inverse, peak) == w_star) {
                lo = n.down, members += n.down_n, widened = true;
            }
        }
        __syncthreads();
        if (!widened) break;
    }
    // c: the class's tokens kept, the fewest whose weights take the tokens above the class to the reach
    const unsigned long long low = lo, high = hi;
    const unsigned long long above_class = above - q_star * widened_above;
    const unsigned long long wanted = q_star == 0u ? 0u : (reach - above_class + q_star - 1) / q_star;
    if (!(wanted >= 1u && wanted <= members)) {  // impossible: the last digit's bin holds the reach
        if (t == 0) cut[3] = kCutFailed;
        return;
    }
    // the class's wanted-th token by id: its span from the spans' counts, then in id order there
    if (t == 0) {
        unsigned long long cumulative = 0;
        tie_span = spans.count;  // the span holding it
        for (uint32_t s = 0; s < spans.count; s++) {
            if (cumulative + span_members[s] >= wanted) {
                tie_span = s;
                break;
            }
            cumulative += span_members[s];
        }
        tie_rank = wanted - cumulative;  // its rank among the span's class tokens
    }
    __syncthreads();
    if (tie_span == spans.count) {  // impossible: the class holds `members` >= wanted tokens
        if (t == 0) cut[3] = kCutFailed;
        return;
    }
    uint32_t begin = 0, end = 0;
    span_values(kind, vocab, spans, tie_span, &begin, &end);
    Values<T>::keyed(row, vocab, spans, tie_span,
                     [&](uint64_t key, double, uint32_t i) { in_class[i - begin] = key >= low && key <= high; });
    __syncthreads();
    const uint32_t n = end - begin, per = (n + kThreads - 1) / kThreads;
    uint32_t part = 0;
    for (uint32_t i = t * per; i < n && i < (t + 1) * per; i++) part += in_class[i];
    parts[t] = part;
    __syncthreads();
    if (t == 0) {
        unsigned long long rank = tie_rank;
        uint64_t last = ~0ull;
        for (uint32_t c = 0; c < kThreads && last == ~0ull; c++) {
            if (parts[c] < rank) {
                rank -= parts[c];
                continue;
            }
            for (uint32_t i = c * per; i < n && i < (c + 1) * per; i++) {
                rank -= in_class[i];
                if (in_class[i] && rank == 0u) {
                    last = begin + i;
                    break;
                }
            }
        }
        cut[0] = low, cut[1] = high, cut[2] = last, cut[3] = last == ~0ull ? kCutFailed : kCutPrefix;
        cut[4] = static_cast<unsigned long long>(__double_as_longlong(w_star)), cut[5] = 0;
    }
}

// Block (span s, row r) of a row left undecided: the span's kept weights (the cut's tokens with w >= min_p) summed
// into kept[r * spans + s]; with a prefix cut, each token's weight checked against w* by its key (cut[5] set where
// one is out of order).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    nucleus_kept_kernel(const T* __restrict__ logits, uint32_t row_stride, uint32_t vocab, row_scan::Spans spans,
                        const double* __restrict__ scale, const double* __restrict__ best,
                        const int64_t* __restrict__ params, const int64_t* __restrict__ out,
                        unsigned long long* __restrict__ cuts, unsigned long long* __restrict__ kept) {
    __shared__ unsigned long long slots[kThreads];
    const uint32_t t = threadIdx.x, s = blockIdx.x, r = blockIdx.y;
    unsigned long long* cut = cuts + static_cast<size_t>(r) * kCutWords;
    if (out[r] != sample_steps::kUndecided || cut[3] == kCutFailed) return;
    const double inverse = *scale, peak = best[r], min_p = __longlong_as_double(params[2]);
    const Cut c = cut_of(cut);
    const double w_star = __longlong_as_double(static_cast<long long>(cut[4]));
    unsigned long long acc = 0;
    bool out_of_order = false;
    Values<T>::keyed(logits + static_cast<size_t>(r) * row_stride, vocab, spans, s,
                     [&](uint64_t key, double x, uint32_t i) {
                         const double w = weight_of(x, inverse, peak);
                         if (!c.all)  // heavier above the class, equal in it, lighter below
                             out_of_order |= key > c.hi ? !(w > w_star) : key < c.lo ? !(w < w_star) : w != w_star;
                         if (c.keeps(key, i) && w >= min_p) acc += sample_steps::fixed_of(w);
                     });
    if (out_of_order) cut[5] = 1;  // any block of the row may set it; the pick reads it after this launch
    slots[t] = acc;
    __syncthreads();
    row_scan::halving_tree<kThreads>([&](uint32_t a, uint32_t b) { slots[a] += slots[b]; });
    if (t == 0) kept[static_cast<size_t>(r) * spans.count + s] = slots[0];
}

// Block r of a row left undecided: the draw over its kept weights in id order (a cut that failed leaves it so).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    nucleus_pick_kernel(const T* __restrict__ logits, uint32_t kind, uint32_t row_stride, uint32_t vocab,
                        row_scan::Spans spans, const double* __restrict__ scale, const double* __restrict__ best,
                        const int64_t* __restrict__ params, const int64_t* __restrict__ positions, int64_t offset,
                        const unsigned long long* __restrict__ cuts, const unsigned long long* __restrict__ kept,
                        int64_t* __restrict__ out) {
    const uint32_t r = blockIdx.x;
    const unsigned long long* cut = cuts + static_cast<size_t>(r) * kCutWords;
    // read before any thread can write it: pick_in_id_order passes block barriers first
    if (out[r] != sample_steps::kUndecided || cut[3] == kCutFailed || cut[5] != 0) return;
    Params p;
    read_params(params, positions, offset, r, &p);
    const double inverse = *scale, peak = best[r];
    const Cut c = cut_of(cut);
    pick_in_id_order(logits + static_cast<size_t>(r) * row_stride, kind, vocab, spans,
                     kept + static_cast<size_t>(r) * spans.count, p,
                     [&](uint64_t key, double x, uint32_t i) -> unsigned long long {
                         if (!c.keeps(key, i)) return 0u;
                         const double w = weight_of(x, inverse, peak);
                         return w >= p.min_p ? sample_steps::fixed_of(w) : 0u;
                     },
                     out + r);
}

template <typename T>
void launch_mass(const void* logits, uint32_t row_stride, uint32_t vocab, uint32_t rows, row_scan::Spans spans,
                 const double* scale, const double* best, unsigned long long* sums, cudaStream_t st) {
    vocab_mass_kernel<T><<<dim3(spans.count, rows), kThreads, 0, st>>>(static_cast<const T*>(logits), row_stride,
                                                                      vocab, spans, scale, best, sums);
}

template <typename T>
void launch_pick(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                 row_scan::Spans spans, const double* scale, const double* best, const unsigned long long* sums,
                 const int64_t* params, const int64_t* positions, int64_t offset, int64_t* out, cudaStream_t st) {
    vocab_pick_kernel<T><<<rows, kThreads, 0, st>>>(static_cast<const T*>(logits), kind, row_stride, vocab, spans,
                                                   scale, best, sums, params, positions, offset, out);
}

// The nucleus's four launches after the head's, over the workspace after the spans' sums: the first digit's bins,
// the spans' kept weights, then the rows' cuts (layout: nucleus_words).
template <typename T>
void launch_nucleus(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                    row_scan::Spans spans, const double* scale, const double* best, unsigned long long* work,
                    const int64_t* params, const int64_t* positions, int64_t offset, int64_t* out, cudaStream_t st) {
    const T* row = static_cast<const T*>(logits);
    const size_t n = static_cast<size_t>(rows) * spans.count;
    unsigned long long *sums = work, *hist = sums + n, *kept = hist + n * kBins, *cuts = kept + n;
    nucleus_hist_kernel<T><<<dim3(spans.count, rows), kThreads, 0, st>>>(row, row_stride, vocab, spans, scale, best,
                                                                         out, hist);
    nucleus_cut_kernel<T><<<rows, kThreads, 0, st>>>(row, kind, row_stride, vocab, spans, scale, best, sums, hist,
                                                     params, positions, offset, out, cuts);
    nucleus_kept_kernel<T><<<dim3(spans.count, rows), kThreads, 0, st>>>(row, row_stride, vocab, spans, scale, best,
                                                                         params, out, cuts, kept);
    nucleus_pick_kernel<T><<<rows, kThreads, 0, st>>>(row, kind, row_stride, vocab, spans, scale, best, params,
                                                      positions, offset, cuts, kept, out);
}

// The head's workspace in 8-byte words: the spans' sums, and where the nucleus takes the rows (spans its shared
// memory holds: rows_fit's `whole`) its bins, kept weights and cuts too.
uint64_t head_words(uint32_t kind, uint32_t vocab, uint32_t rows, bool nucleus) {
    const uint64_t n = uint64_t(rows) * spans_of(kind, vocab).count;
    return nucleus ? n * (kBins + 2) + uint64_t(rows) * kCutWords : n;
}

// Whether a call's rows fit the kernels: the kind, the alignment, and spans inside the proved domain. `whole`:
// the pick's spans must also fit its shared memory (no longer than kSpanValues values).
bool rows_fit(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows, bool whole) {
    if (logits == nullptr || kind > kFp64 || rows == 0u || rows > 65535u || vocab == 0u || vocab > row_stride)
        return false;
    const uint32_t per = 1u << unit_shift(kind), bytes = kind == kFp16 ? 2u : kind == kFp32 ? 4u : 8u;
    if (reinterpret_cast<uintptr_t>(logits) % (per * bytes) != 0u || row_stride % per != 0u) return false;
    if (units_of(kind, vocab) >= ELPIS_ROWSPANS_MAX_TOTAL) return false;
    return !whole || spans_of(kind, vocab).shift + unit_shift(kind) <= kSpanShift;
}

// The mass launch on rows of `kind`; false where the workspace is short.
bool queue_mass(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                const double* scale, const double* best, void* sums, uint64_t sums_bytes, cudaStream_t st) {
    const row_scan::Spans spans = spans_of(kind, vocab);
    if (sums == nullptr || sums_bytes < 8u * uint64_t(rows) * spans.count || reinterpret_cast<uintptr_t>(sums) % 8u)
        return false;
    auto* out = static_cast<unsigned long long*>(sums);
    if (kind == kFp16)
        launch_mass<__half>(logits, row_stride, vocab, rows, spans, scale, best, out, st);
    else if (kind == kFp32)
        launch_mass<float>(logits, row_stride, vocab, rows, spans, scale, best, out, st);
    else
        launch_mass<double>(logits, row_stride, vocab, rows, spans, scale, best, out, st);
    return true;
}

}  // namespace

extern "C" {

int elpis_vocab_draw_threads(void) { return kThreads; }
uint32_t elpis_vocab_draw_max_count(void) { return sample_steps::kMaxCount; }

// The spans a row of `vocab` values of `kind` (0 fp16, 1 fp32, 2 float64) is cut into: the workspace takes
// rows * spans * 8 bytes. -1 for a kind out of range or a row longer than the spans' proved domain.
int elpis_vocab_draw_spans(uint32_t kind, uint32_t vocab) {
    if (kind > kFp64 || vocab == 0u || units_of(kind, vocab) >= ELPIS_ROWSPANS_MAX_TOTAL) return -1;
    return static_cast<int>(spans_of(kind, vocab).count);
}

// 1 where the pick takes rows of `vocab` values of `kind` (a span no longer than its shared memory holds), else 0.
int elpis_vocab_draw_picks(uint32_t kind, uint32_t vocab) {
    return elpis_vocab_draw_spans(kind, vocab) > 0 && spans_of(kind, vocab).shift + unit_shift(kind) <= kSpanShift;
}

// The head's workspace a call of `rows` rows of `vocab` values of `kind` takes, in 8-byte words (0: out of range).
uint64_t elpis_vocab_draw_head_words(uint32_t kind, uint32_t vocab, uint32_t rows) {
    if (elpis_vocab_draw_spans(kind, vocab) < 0 || rows == 0u) return 0;
    return head_words(kind, vocab, rows, elpis_vocab_draw_picks(kind, vocab) == 1);
}

// The head's draw (top_p < 1 or min_p > 0) of `rows` rows into out int64 [rows]: the mass of each row of `logits`,
// then the draw from each row's `count` largest weights (weights float64 and ids int64 [rows, count], from
// sampling.top_weights, whose best is `best`), then, with `nucleus` (registry switch exl3-vocab-draw-nucleus), the
// nucleus for the rows the head leaves undecided (where the spans fit its shared memory: elpis_vocab_draw_picks), on
// `stream` (a cudaStream_t passed as an address). `work`: elpis_vocab_draw_head_words words with the nucleus, the
// spans' sums (rows * spans) without. Returns 0, -1 for arguments out of range, or the launches' cudaError_t.
int elpis_vocab_draw_head(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                          const double* scale, const double* weights, const int64_t* ids, const double* best,
                          uint32_t count, uint32_t nucleus_on, const int64_t* params, const int64_t* positions,
                          int64_t offset, void* work, uint64_t work_bytes, int64_t* out, void* stream) {
    if (!rows_fit(logits, kind, row_stride, vocab, rows, false) || scale == nullptr || weights == nullptr ||
        ids == nullptr || best == nullptr || params == nullptr || positions == nullptr || out == nullptr)
        return -1;
    if (count == 0u || count > sample_steps::kMaxCount || count > vocab || nucleus_on > 1u) return -1;
    const bool nucleus = nucleus_on == 1u && rows_fit(logits, kind, row_stride, vocab, rows, true);
    if (work_bytes < 8u * head_words(kind, vocab, rows, nucleus)) return -1;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (!queue_mass(logits, kind, row_stride, vocab, rows, scale, best, work, work_bytes, st)) return -1;
    const row_scan::Spans spans = spans_of(kind, vocab);
    auto* words = static_cast<unsigned long long*>(work);
    const uint32_t blocks = (rows + kHeadThreads - 1) / kHeadThreads;
    vocab_head_kernel<<<blocks, kHeadThreads, 0, st>>>(weights, ids, best, rows, count, vocab, words, spans.count,
                                                       params, positions, offset, out);
    if (nucleus && kind == kFp16)
        launch_nucleus<__half>(logits, kind, row_stride, vocab, rows, spans, scale, best, words, params, positions,
                               offset, out, st);
    else if (nucleus && kind == kFp32)
        launch_nucleus<float>(logits, kind, row_stride, vocab, rows, spans, scale, best, words, params, positions,
                              offset, out, st);
    else if (nucleus)
        launch_nucleus<double>(logits, kind, row_stride, vocab, rows, spans, scale, best, words, params, positions,
                               offset, out, st);
    return static_cast<int>(cudaGetLastError());
}

// The pick's draw (top_p = 1 and min_p = 0) of `rows` rows into out int64 [rows]: the mass of each row of
// `logits` (whose maxima of x * (1/T) are `best`), then each row's token in id order. Returns as the head's.
int elpis_vocab_draw_pick(const void* logits, uint32_t kind, uint32_t row_stride, uint32_t vocab, uint32_t rows,
                          const double* scale, const double* best, const int64_t* params, const int64_t* positions,
                          int64_t offset, void* sums, uint64_t sums_bytes, int64_t* out, void* stream) {
    if (!rows_fit(logits, kind, row_stride, vocab, rows, true) || scale == nullptr || best == nullptr ||
        params == nullptr || positions == nullptr || out == nullptr)
        return -1;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (!queue_mass(logits, kind, row_stride, vocab, rows, scale, best, sums, sums_bytes, st)) return -1;
    const row_scan::Spans spans = spans_of(kind, vocab);
    const auto* done = static_cast<const unsigned long long*>(sums);
    if (kind == kFp16)
        launch_pick<__half>(logits, kind, row_stride, vocab, rows, spans, scale, best, done, params, positions,
                            offset, out, st);
    else if (kind == kFp32)
        launch_pick<float>(logits, kind, row_stride, vocab, rows, spans, scale, best, done, params, positions,
                           offset, out, st);
    else
        launch_pick<double>(logits, kind, row_stride, vocab, rows, spans, scale, best, done, params, positions,
                            offset, out, st);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
