// Gated DeltaNet (causal conv + gated delta rule) over a token tree, row-invariant by construction
// (issue 8, item 3).
//
// Geometry (Qwen3.8-27B linear-attention layers): 16 key heads and 48 value heads (groups of 3) of 128
// dims, conv over 10240 channels [q 16x128 | k 16x128 | v 48x128] with 4 taps, no conv bias; up to 16 rows.
//
// Inputs: the layout the engine holds after the in-projections (ExLlamaV3's GDN layer: the qkv projection
// cast to bf16, beta and g from gated_delta_net_fused_op_2; z stays with the gated norm that follows):
//   qkv         bf16 [n_in, 10240]   pre-conv projection, one row per tree row, element (row, channel) at
//                                    row * row_stride + channel * channel_stride: token-major (10240, 1) or the
//                                    channel-major [10240, n] buffer ExLlamaV3's layer casts it to (1, n)
//   beta        bf16 [n_in, 48]      sigmoid(b)
//   g           fp32 [n_in, 48]      log decay, -exp(A_log) * softplus(a + dt_bias)
//   conv_weight bf16 [10240, 4]      depthwise taps, oldest input first
//   conv_state  bf16 [10240, stride] committed window: columns 0..3 hold the last 4 inputs, oldest first
//                                    (ExLlamaV3's conv ring row; columns >= 4 are left alone); the
//                                    conv reads columns 1..3
//   state       fp32 [48, 128, 128]  committed recurrent state S[head][k][v]
// Outputs: out fp32 [rows, 48, 128] and/or out_bf16 bf16 [rows, 48, 128] (round to nearest): the core
// output o = S^T q of each row, before the gated norm. Commit also rewrites `state` and `conv_state`.
//
// Math per row r at depth d with path p_0 (root) .. p_d = r, from the committed state:
//   x_e = qkv[p_e] (e >= 0), x_e = conv_state column 4 + e (e = -3..-1)
//   c = silu(sum_j w_j x_{d-3+j})                       (per channel; taps in order j = 0..3)
//   q = c_q / sqrt(|c_q|^2 + 1e-6) / sqrt(128), k = c_k / sqrt(|c_k|^2 + 1e-6), v = c_v
//   for each path row in order: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q (last one)
//
// Work split: one block per (value head, slice of 16 value columns): 48 x 8 blocks of 256 threads. Each
// warp owns 2 columns; lane l holds k rows 16i + (l % 16), i = 0..7, of its column in registers, so both
// 128-long dot products of a step are an 8-term serial fmaf chain plus a fixed xor butterfly (8, 4, 2, 1)
// inside 16 lanes: a step needs no block barrier. Before the walk (phase A) thread t convolves q/k channel t
// of every row, then v channel t % 16 of row t / 16; warp w normalises the (row, q|k) pairs w, w + 8, ...
// Where a launch spends its time is measured by the ELPIS_GDN_CLOCKS build (elpis/bench/scripts/
// gdn_tree_timeline.py; bench/results/tree/README.md, session 25).
//
// Why this walk, by bytes moved: the committed state (3 MB per layer) is read once per call, the inputs
// (a few KB per row, L2-resident) once per block, and nothing else touches global memory (a commit writes
// the 3 MB once more). A per-row state copy in global memory would move 3 MB per row (48 MB for 16 rows);
// recomputing each row along its path from the committed state would cost sum(depth + 1) steps (136 for a
// 16-chain) instead of R. Instead the block visits the rows depth first, children in order of increasing
// subtree size (the largest last): the state of the row just visited stays in registers for its first
// child, and a row with two or more children parks its state on a small on-chip stack (lane-private shared
// memory) until its last child takes it. A parked row always has a pending child whose subtree holds at
// most half of its own, so at most 3 states are parked for 16 rows (16 -> 7 -> 3). The plan (visit order,
// load/store slot per visit, conv tap sources) is the Bend program bend/gdn_plan.bend, with its laws proved
// by `elpis prove` and compiled by `make build` to build/kernels/gdn_plan.h (checked there against the Bend
// interpreter); the host glue below only validates the masks and refuses any plan beyond the 3 slots.
//
// Row invariance: every number a row's output depends on (its conv, norms, decay, each step along its path)
// is computed by the same instructions in the same order, whatever its row index, the other rows, the tree
// shape or the visiting order: the visiting order only decides where a state waits, and a parked state is
// an exact copy. So a tree row at depth d equals a 1-row call at the state after its first d path tokens,
// and a commit (a chain) leaves exactly the state that committing one token at a time leaves. All
// arithmetic is spelled with _rn intrinsics (no contraction left to the compiler), no fast math, no atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "gdn_tree_plan.cuh"  // the plan of a call (GdnTreePlan), from the proved gdn_plan.h

namespace {

constexpr int kKeyHeads = 16;
constexpr int kValueHeads = 48;
constexpr int kGroup = kValueHeads / kKeyHeads;
constexpr int kDim = 128;  // key and value head dim
constexpr int kConvDim = 2 * kKeyHeads * kDim + kValueHeads * kDim;
constexpr int kKOffset = kKeyHeads * kDim;      // first k channel
constexpr int kVOffset = 2 * kKeyHeads * kDim;  // first v channel
constexpr int kTaps = 4;
constexpr int kMaxRows = 16;
constexpr int kSlice = 16;  // value columns per block
constexpr int kSlices = kDim / kSlice;
constexpr int kThreads = 256;
constexpr int kPerLane = kDim / 16;  // k rows of a column held by one lane
constexpr int kStackSlots = 3;
constexpr int kStagePitch = kSlice + 1;  // padded row of the state staging buffer
constexpr int kInPitch = kThreads + kSlice;  // staged input rows: the block's q/k channels, then its v slice
constexpr int kStateLoads = kDim * kSlice / kThreads;  // state slice elements staged per thread
constexpr unsigned kFull = 0xffffffffu;

static_assert(kThreads == 2 * kDim, "phase A gives each thread one q or k channel");
static_assert(kThreads / 32 * 2 == kSlice, "each warp owns two columns of the slice");
static_assert(kThreads / kSlice >= kMaxRows, "one thread per (v channel, row) of a block");
static_assert(2 * kMaxRows % (kThreads / 32) == 0, "the warps share the (row, q|k) norms evenly");
static_assert(kStackSlots * kPerLane * kThreads >= kDim * kStagePitch, "staging fits in the stack area");
static_assert(kDim * kSlice % kThreads == 0, "each thread stages the same number of state elements");
static_assert(kStackSlots * kPerLane * kThreads * 4 >= kDim * kStagePitch * 4 + kMaxRows * kInPitch * 2,
              "the state staging and the staged input rows fit in the stack area together");
static_assert(kStackSlots == ELPIS_GDN_PLAN_SLOTS && kTaps == ELPIS_GDN_PLAN_TAPS &&
                  static_cast<unsigned>(kMaxRows) == ELPIS_GDN_PLAN_MAX_ROWS,
              "the kernel's stack, taps and rows are the ones the proved plan assumes");

}  // namespace

namespace {

// Where element (row, channel) of qkv lies, in elements (token-major: kConvDim, 1; channel-major: 1, rows).
struct QkvLayout {
    int32_t row_stride, channel_stride;
    __device__ __forceinline__ size_t at(int row, int ch) const {
        return static_cast<size_t>(row) * row_stride + static_cast<size_t>(ch) * channel_stride;
    }
};

struct GdnTreeArgs {
    const __nv_bfloat16* qkv;
    QkvLayout qkv_layout;
    const __nv_bfloat16* beta;
    const float* g;
    const __nv_bfloat16* conv_weight;
    const __nv_bfloat16* conv_state;
    int32_t conv_stride;
    const float* state_in;
    float* state_out;  // commit: the state after the last visited row (a chain's end), else null
    float* out;        // [rows, 48, 128] or null
    __nv_bfloat16* out_bf16;
};

__device__ __forceinline__ float bf(const __nv_bfloat16 x) { return __bfloat162float(x); }

// Diagnostic build (ELPIS_GDN_CLOCKS, never served): thread 0 of every block writes %globaltimer at the body's
// marks (words 0-7) and its multiprocessor (word 8) into gdn_clock[block]; elpis/bench/scripts/
// gdn_tree_timeline.py reads them. Between two barriers a mark times warp 0 only.
#ifdef ELPIS_GDN_CLOCKS
constexpr int kClockWords = 9;  // start, staged, convolved, barrier 1, normed, barrier 2, walked, end, SM
__device__ unsigned long long gdn_clock[kSlices * kValueHeads][kClockWords];
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define ELPIS_GDN_MARK(word)                                                                          \
    do {                                                                                              \
        if (threadIdx.x == 0) gdn_clock[blockIdx.y * kSlices + blockIdx.x][word] = global_ns();      \
    } while (0)
#define ELPIS_GDN_MARK_SM()                                                                           \
    do {                                                                                              \
        unsigned sm;                                                                                  \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                              \
        if (threadIdx.x == 0) gdn_clock[blockIdx.y * kSlices + blockIdx.x][kClockWords - 1] = sm;    \
    } while (0)
#else
#define ELPIS_GDN_MARK(word) \
    do {                     \
    } while (0)
#define ELPIS_GDN_MARK_SM() \
    do {                    \
    } while (0)
#endif

// silu(sum_j w_j x_j) of one channel of logical row r, taps in order. x: the channel's staged input rows
// (s_in column, pitch kInPitch), hist[c - 1]: its committed window column c (1..3), w: its taps.
__device__ __forceinline__ float conv_channel(const GdnTreePlan& plan, int r, const __nv_bfloat16* x,
                                              const float (&hist)[kTaps - 1], const float (&w)[kTaps]) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kTaps; j++) {
        const int s = plan.src[r][j];
        // a committed column by selects, not a dynamic register index (which would go to local memory)
        const float committed = s == -2 ? hist[0] : (s == -3 ? hist[1] : hist[2]);
        const float v = s >= 0 ? bf(x[s * kInPitch]) : committed;
        acc = j == 0 ? __fmul_rn(w[j], v) : __fmaf_rn(w[j], v, acc);
    }
    return __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
}

// Load one channel's committed window columns 1..3 and its taps.
__device__ __forceinline__ void load_taps(const GdnTreeArgs& a, int ch, float (&hist)[kTaps - 1], float (&w)[kTaps]) {
#pragma unroll
    for (int c = 1; c < kTaps; c++) hist[c - 1] = bf(a.conv_state[static_cast<size_t>(ch) * a.conv_stride + c]);
#pragma unroll
    for (int j = 0; j < kTaps; j++) w[j] = bf(a.conv_weight[ch * kTaps + j]);
}

// Stage one channel of every logical row's input row into x (pitch kInPitch). All of its global loads are
// issued before its first shared store, so their latencies overlap (a store between two loads through generic
// pointers would order them one after the other). Issuing every channel's loads before any store (session 25,
// device call 113) held more registers and made a 16-row call 0.8 us slower.
__device__ __forceinline__ void stage_channel(const GdnTreeArgs& a, const GdnTreePlan& plan, int ch,
                                              __nv_bfloat16* x) {
    __nv_bfloat16 raw[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
        raw[r] = r < plan.rows ? a.qkv[a.qkv_layout.at(plan.in_row[r], ch)] : __nv_bfloat16{};
    }
#pragma unroll
    for (int r = 0; r < kMaxRows; r++) {
        if (r < plan.rows) x[plan.in_row[r] * kInPitch] = raw[r];
    }
}

// Sum over the 16 lanes of a half warp; every lane of the half ends with the same bits.
__device__ __forceinline__ float half_warp_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 8));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
    return v;
}

// L2 norms of the (row, q|k) pairs warp, warp + 8, ... (kPairs of them): the lane sums channels 4l..4l+3 in
// order, then the warp's xor butterfly (16, then half_warp_sum's 8, 4, 2, 1); q also takes 1/sqrt(128). The
// kPairs pairs go through each step together, so their latencies overlap; each pair's operations are the same.
// A pair past the block's rows runs the same steps on zeros and reads nothing: a read of a real row there
// would race with that row's normalisation in place by another warp (found on the PTX by
// tests/kernels/test_gdn_tree_ptx.py), though its values were never used.
template <int kPairs>
__device__ __forceinline__ void normalise_pairs(float (*s_qk)[2 * kDim], int rows, int warp, int lane) {
    float nx[kPairs][4];
    float ss[kPairs];
#pragma unroll
    for (int it = 0; it < kPairs; it++) {
        const int pair = warp + it * (kThreads / 32);
        if (pair < 2 * rows) {
            const float* x = &s_qk[pair >> 1][(pair & 1) * kDim + 4 * lane];
#pragma unroll
            for (int i = 0; i < 4; i++) nx[it][i] = x[i];
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) nx[it][i] = 0.0f;
        }
        ss[it] = __fmul_rn(nx[it][0], nx[it][0]);
        ss[it] = __fmaf_rn(nx[it][1], nx[it][1], ss[it]);
        ss[it] = __fmaf_rn(nx[it][2], nx[it][2], ss[it]);
        ss[it] = __fmaf_rn(nx[it][3], nx[it][3], ss[it]);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
#pragma unroll
        for (int it = 0; it < kPairs; it++) ss[it] = __fadd_rn(ss[it], __shfl_xor_sync(kFull, ss[it], m));
    }
#pragma unroll
    for (int it = 0; it < kPairs; it++) {
        const int pair = warp + it * (kThreads / 32);
        float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss[it], 1e-6f)));
        if ((pair & 1) == 0) inv = __fmul_rn(inv, 0.088388347648318441f);
        if (pair < 2 * rows) {
            float* x = &s_qk[pair >> 1][(pair & 1) * kDim + 4 * lane];
#pragma unroll
            for (int i = 0; i < 4; i++) x[i] = __fmul_rn(nx[it][i], inv);
        }
    }
}

// Row r's output of value column `column` of `head`, written by the half warp's first lane.
__device__ __forceinline__ void write_output(const GdnTreeArgs& a, int r, int head, int column, int sub, float o) {
    if (sub != 0) return;
    const size_t i = (static_cast<size_t>(r) * kValueHeads + head) * kDim + column;
    if (a.out != nullptr) a.out[i] = o;
    if (a.out_bf16 != nullptr) a.out_bf16[i] = __float2bfloat16_rn(o);
}

// The kernel body: one block per (16-column slice, value head); the plan from a launch argument or, in the
// graph form, from shared memory (loaded from device memory): the same integers, the same arithmetic.
__device__ __forceinline__ void gdn_tree_body(const GdnTreeArgs& a, const GdnTreePlan& plan) {
    __shared__ float s_qk[kMaxRows][2 * kDim];  // normalised q (scaled) | k of the block's key head
    __shared__ float s_v[kMaxRows][kSlice];
    __shared__ float s_decay[kMaxRows];
    __shared__ float s_beta[kMaxRows];
    __shared__ __align__(16) float s_stack[kStackSlots * kPerLane * kThreads];  // also the state staging

    const int t = threadIdx.x;
    const int lane = t & 31;
    const int warp = t >> 5;
    const int slice = blockIdx.x;
    const int head = blockIdx.y;
    const int key_head = head / kGroup;
    const int rows = plan.rows;
    ELPIS_GDN_MARK(0);
    ELPIS_GDN_MARK_SM();
    float* stage = s_stack;  // [kDim][kStagePitch]
    // Phase A only: each input row's channels of this block, behind the staging in the stack area.
    __nv_bfloat16* s_x = reinterpret_cast<__nv_bfloat16*>(s_stack + kDim * kStagePitch);

    // Stage the committed state slice S[head][:, slice] (coalesced: 16 columns = 64 bytes per k row); the
    // loads first, then the shared stores, so the loads are in flight together.
    const float* s_in = a.state_in + static_cast<size_t>(head) * kDim * kDim + slice * kSlice;
    float loaded[kStateLoads];
#pragma unroll
    for (int i = 0; i < kStateLoads; i++) {
        const int e = t + i * kThreads;
        loaded[i] = s_in[static_cast<size_t>(e / kSlice) * kDim + e % kSlice];
    }

    // Phase A (rows in parallel, independent of the state): conv + SiLU of the key head's q and k channels
    // and the slice's v channels, the gates. Each thread first stages its channel of every row.
    const int qk_channel = t < kDim ? key_head * kDim + t : kKOffset + key_head * kDim + (t - kDim);
    float hist[kTaps - 1];
    float w[kTaps];
    // The v channels: thread t loads the input of channel vc of row vr, and after the first barrier convolves
    // it, so no warp stages or convolves more than its own q/k rows. The loads that need no shared store before
    // them (taps, gates, that input) go first, so they wait together with the q/k channel's.
    const int vc = t % kSlice;
    const int vr = t / kSlice;
    const int v_base = kVOffset + head * kDim + slice * kSlice;
    load_taps(a, qk_channel, hist, w);
    float v_hist[kTaps - 1];
    float v_w[kTaps];
    load_taps(a, v_base + vc, v_hist, v_w);
    float g = 0.0f;
    float beta = 0.0f;
    if (t < rows) {
        const size_t i = static_cast<size_t>(plan.in_row[t]) * kValueHeads + head;
        g = a.g[i];
        beta = bf(a.beta[i]);
    }
    const __nv_bfloat16 v_in = vr < rows ? a.qkv[a.qkv_layout.at(plan.in_row[vr], v_base + vc)] : __nv_bfloat16{};
    stage_channel(a, plan, qk_channel, &s_x[t]);
    if (vr < rows) s_x[kThreads + vc + plan.in_row[vr] * kInPitch] = v_in;
    const float decay = t < rows ? expf(g) : 0.0f;
#pragma unroll
    for (int i = 0; i < kStateLoads; i++) {
        const int e = t + i * kThreads;
        stage[(e / kSlice) * kStagePitch + e % kSlice] = loaded[i];
    }
    ELPIS_GDN_MARK(1);
    // Each thread reads back only its own channel's staged rows: no barrier needed before the conv.
#pragma unroll 4
    for (int r = 0; r < rows; r++) s_qk[r][t] = conv_channel(plan, r, &s_x[t], hist, w);
    if (t < rows) {
        s_decay[t] = decay;
        s_beta[t] = beta;
    }
    ELPIS_GDN_MARK(2);
    __syncthreads();
    ELPIS_GDN_MARK(3);
    // The v channel's rows were staged by other threads: convolved after the barrier (read after the next).
    if (vr < rows) s_v[vr][vc] = conv_channel(plan, vr, &s_x[kThreads + vc], v_hist, v_w);
    // L2 norms: warp w normalises (row, q|k) pairs w, w + 8, ...; one pair a warp takes them all up to 4 rows.
    if (2 * rows <= kThreads / 32) {
        normalise_pairs<1>(s_qk, rows, warp, lane);
    } else {
        normalise_pairs<2 * kMaxRows / (kThreads / 32)>(s_qk, rows, warp, lane);
    }
    // This lane's part of its column: rows k = 16i + sub of column `col`.
    const int col = 2 * warp + (lane >> 4);
    const int sub = lane & 15;
    float st[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; i++) st[i] = stage[(16 * i + sub) * kStagePitch + col];
    ELPIS_GDN_MARK(4);
    __syncthreads();  // the staging area becomes the stack; the normalised q/k are complete
    ELPIS_GDN_MARK(5);

    // Phase B: the walk. No block barrier: a warp's columns depend on nothing outside the warp. A visit's
    // output sum is finished in the next visit's butterfly, beside that visit's dot product: the next state
    // needs only the dot, so the output's shuffles leave the chain from one visit to the next.
    float o_part = 0.0f;  // the last visit's output, before its half-warp sum
    int o_row = -1;       // its logical row (-1: none yet)
    for (int visit = 0; visit < rows; visit++) {
        const int r = plan.order[visit];
        const int load = plan.load[visit];
        if (load >= 0) {
#pragma unroll
            for (int i = 0; i < kPerLane; i++) st[i] = s_stack[(load * kPerLane + i) * kThreads + t];
        }
        const float decay = s_decay[r];
        const float beta = s_beta[r];
        float kk[kPerLane];
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; i++) {
            kk[i] = s_qk[r][kDim + 16 * i + sub];
            st[i] = __fmul_rn(st[i], decay);
            dot = i == 0 ? __fmul_rn(kk[i], st[i]) : __fmaf_rn(kk[i], st[i], dot);
        }
#pragma unroll
        for (int m = 8; m >= 1; m >>= 1) {  // half_warp_sum of both
            const float dot_other = __shfl_xor_sync(kFull, dot, m);
            const float o_other = __shfl_xor_sync(kFull, o_part, m);
            dot = __fadd_rn(dot, dot_other);
            o_part = __fadd_rn(o_part, o_other);
        }
        if (o_row >= 0) write_output(a, o_row, head, slice * kSlice + col, sub, o_part);
        const float delta = __fmul_rn(__fsub_rn(s_v[r][col], dot), beta);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; i++) {
            st[i] = __fmaf_rn(kk[i], delta, st[i]);
            const float q = s_qk[r][16 * i + sub];
            o = i == 0 ? __fmul_rn(q, st[i]) : __fmaf_rn(q, st[i], o);
        }
        o_part = o;
        o_row = r;
        const int store = plan.store[visit];
        if (store >= 0) {
#pragma unroll
            for (int i = 0; i < kPerLane; i++) s_stack[(store * kPerLane + i) * kThreads + t] = st[i];
        }
    }

    o_part = half_warp_sum(o_part);
    write_output(a, o_row, head, slice * kSlice + col, sub, o_part);
    ELPIS_GDN_MARK(6);
    if (a.state_out != nullptr) {  // commit: write back the final state, coalesced through the staging
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kPerLane; i++) stage[(16 * i + sub) * kStagePitch + col] = st[i];
        __syncthreads();
        float* s_out = a.state_out + static_cast<size_t>(head) * kDim * kDim + slice * kSlice;
#pragma unroll
        for (int i = 0; i < kStateLoads; i++) {
            const int e = t + i * kThreads;
            s_out[static_cast<size_t>(e / kSlice) * kDim + e % kSlice] = stage[(e / kSlice) * kStagePitch + e % kSlice];
        }
    }
    ELPIS_GDN_MARK(7);
}

__global__ void __launch_bounds__(kThreads) gdn_tree_kernel(const GdnTreeArgs a, const GdnTreePlan plan) {
    gdn_tree_body(a, plan);
}

// The CUDA-graph form: the plan is read from device memory when the kernel runs, so one captured launch
// serves every tree of the call's row count.
__global__ void __launch_bounds__(kThreads) gdn_tree_kernel_dev(const GdnTreeArgs a,
                                                                const GdnTreePlan* __restrict__ plan) {
    __shared__ GdnTreePlan s_plan;
    if (threadIdx.x == 0) s_plan = *plan;
    __syncthreads();
    gdn_tree_body(a, s_plan);
}


// Commit of the conv window: columns 0..3 become the last 4 inputs along the chain of `plan` (in place;
// each thread reads its channel's old columns before writing). Runs after gdn_tree_kernel on the stream.
__device__ __forceinline__ void conv_commit_body(const __nv_bfloat16* qkv, QkvLayout layout,
                                                 __nv_bfloat16* conv_state, int32_t stride, const GdnTreePlan& plan) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= kConvDim) return;
    __nv_bfloat16* w = conv_state + static_cast<size_t>(ch) * stride;
    __nv_bfloat16 old[kTaps];
#pragma unroll
    for (int j = 0; j < kTaps; j++) old[j] = w[j];
    const int n = plan.rows;
#pragma unroll
    for (int j = 0; j < kTaps; j++) {
        const int e = n - kTaps + j;  // chain position of new column j
        w[j] = e >= 0 ? qkv[layout.at(plan.in_row[e], ch)] : old[kTaps + e];
    }
}

__global__ void gdn_conv_commit_kernel(const __nv_bfloat16* qkv, QkvLayout layout, __nv_bfloat16* conv_state,
                                       int32_t stride, const GdnTreePlan plan) {
    conv_commit_body(qkv, layout, conv_state, stride, plan);
}

// The CUDA-graph form: the plan read from device memory.
__global__ void gdn_conv_commit_kernel_dev(const __nv_bfloat16* qkv, QkvLayout layout, __nv_bfloat16* conv_state,
                                           int32_t stride, const GdnTreePlan* __restrict__ plan) {
    conv_commit_body(qkv, layout, conv_state, stride, *plan);
}

int launch(const GdnTreeArgs& args, const GdnTreePlan& plan, bool commit, __nv_bfloat16* conv_state,
           int32_t stride, cudaStream_t s) {
    gdn_tree_kernel<<<dim3(kSlices, kValueHeads), kThreads, 0, s>>>(args, plan);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
    if (commit) {
        gdn_conv_commit_kernel<<<(kConvDim + 255) / 256, 256, 0, s>>>(args.qkv, args.qkv_layout, conv_state, stride,
                                                                      plan);
        err = cudaGetLastError();
    }
    return static_cast<int>(err);
}

}  // namespace

extern "C" {

// The plan for tests and the binding: writes order/load/store (int32 [16] each), src (int32 [16*4]) and
// returns max_stack >= 0, or the negative plan error code.
int elpis_gdn_tree_plan(uint32_t rows, const int32_t* depth, const uint32_t* ancestors, const int32_t* in_row,
                        int32_t* order, int32_t* load, int32_t* store, int32_t* src) {
    GdnTreePlan plan{};
    const int err = gdn_tree_plan(rows, depth, ancestors, in_row, &plan);
    if (err != 0) return err;
    for (uint32_t i = 0; i < rows; i++) {
        order[i] = plan.order[i];
        load[i] = plan.load[i];
        store[i] = plan.store[i];
        for (int j = 0; j < kTaps; j++) src[i * kTaps + j] = plan.src[i][j];
    }
    return plan.max_stack;
}

int elpis_gdn_tree_stack_slots(void) { return kStackSlots; }

#ifdef ELPIS_GDN_CLOCKS
// The diagnostic timeline of the last launch (384 blocks x kClockWords words) into host memory `dst`.
int elpis_gdn_tree_clocks(void* dst) {
    return static_cast<int>(cudaMemcpyFromSymbol(dst, gdn_clock, sizeof(gdn_clock)));
}
#endif

// The plan of a tree as the bytes the graph form of the verify reads (sizeof(GdnTreePlan) of them, written to
// `out` of `capacity` bytes). Returns the size, or a negative plan error (-5: capacity too small).
int elpis_gdn_tree_plan_pack(uint32_t rows, const int32_t* depth, const uint32_t* ancestors, void* out,
                             uint32_t capacity) {
    if (capacity < sizeof(GdnTreePlan)) return -5;
    GdnTreePlan plan{};
    const int err = gdn_tree_plan(rows, depth, ancestors, nullptr, &plan);
    if (err != 0) return err;
    memcpy(out, &plan, sizeof(GdnTreePlan));
    return static_cast<int>(sizeof(GdnTreePlan));
}

// The plan of a commit along `path` (input rows, root first) as packed bytes for elpis_gdn_tree_commit_dev.
// Returns the size, or a negative plan error (-5: capacity too small).
int elpis_gdn_tree_commit_plan_pack(uint32_t n, const int32_t* path, void* out, uint32_t capacity) {
    if (n == 0 || n > static_cast<uint32_t>(kMaxRows)) return -1;
    if (capacity < sizeof(GdnTreePlan)) return -5;
    GdnTreePlan plan{};
    const int err = gdn_tree_commit_plan(n, path, &plan);
    if (err != 0) return err;
    memcpy(out, &plan, sizeof(GdnTreePlan));
    return static_cast<int>(sizeof(GdnTreePlan));
}

// Commit, CUDA-graph form: as elpis_gdn_tree_commit (no outputs), the path's plan packed by
// elpis_gdn_tree_commit_plan_pack and read from device memory when the kernels run.
int elpis_gdn_tree_commit_dev(const void* qkv, int32_t qkv_row_stride, int32_t qkv_channel_stride, const void* beta,
                              const float* g, const void* conv_weight, void* conv_state, int32_t conv_stride,
                              float* state, const void* plan_dev, void* stream) {
    if (plan_dev == nullptr) return -1;
    const auto* x = static_cast<const __nv_bfloat16*>(qkv);
    const QkvLayout layout{qkv_row_stride, qkv_channel_stride};
    auto* conv = static_cast<__nv_bfloat16*>(conv_state);
    const auto* plan = static_cast<const GdnTreePlan*>(plan_dev);
    const GdnTreeArgs args{x, layout, static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight), conv, conv_stride, state, state, nullptr,
                           nullptr};
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    gdn_tree_kernel_dev<<<dim3(kSlices, kValueHeads), kThreads, 0, s>>>(args, plan);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
    gdn_conv_commit_kernel_dev<<<(kConvDim + 255) / 256, 256, 0, s>>>(x, layout, conv, conv_stride, plan);
    return static_cast<int>(cudaGetLastError());
}

// Verify, CUDA-graph form: as elpis_gdn_tree_verify for `rows` rows, the plan packed by
// elpis_gdn_tree_plan_pack and read from device memory (plan_dev) when the kernel runs.
int elpis_gdn_tree_verify_dev(const void* qkv, int32_t qkv_row_stride, int32_t qkv_channel_stride, const void* beta,
                              const float* g, const void* conv_weight, const void* conv_state, int32_t conv_stride,
                              const float* state, uint32_t rows, const void* plan_dev, float* out, void* out_bf16,
                              void* stream) {
    if (rows == 0 || rows > static_cast<uint32_t>(kMaxRows) || plan_dev == nullptr) return -1;
    const GdnTreeArgs args{static_cast<const __nv_bfloat16*>(qkv), QkvLayout{qkv_row_stride, qkv_channel_stride},
                           static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight),
                           static_cast<const __nv_bfloat16*>(conv_state), conv_stride, state, nullptr, out,
                           static_cast<__nv_bfloat16*>(out_bf16)};
    gdn_tree_kernel_dev<<<dim3(kSlices, kValueHeads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        args, static_cast<const GdnTreePlan*>(plan_dev));
    return static_cast<int>(cudaGetLastError());
}

// Verify: one output row per tree row. depth/ancestors are host arrays (tree_masks), device pointers for
// the tensors (shapes validated by elpis/exl3/gdn_tree.py). Returns 0, a negative plan error or a
// cudaError_t.
int elpis_gdn_tree_verify(const void* qkv, int32_t qkv_row_stride, int32_t qkv_channel_stride, const void* beta,
                          const float* g, const void* conv_weight, const void* conv_state, int32_t conv_stride,
                          const float* state, uint32_t rows, const int32_t* depth, const uint32_t* ancestors,
                          float* out, void* out_bf16, void* stream) {
    GdnTreePlan plan{};
    const int err = gdn_tree_plan(rows, depth, ancestors, nullptr, &plan);
    if (err != 0) return err;
    const GdnTreeArgs args{static_cast<const __nv_bfloat16*>(qkv), QkvLayout{qkv_row_stride, qkv_channel_stride},
                           static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight),
                           static_cast<const __nv_bfloat16*>(conv_state), conv_stride, state, nullptr, out,
                           static_cast<__nv_bfloat16*>(out_bf16)};
    return launch(args, plan, false, nullptr, conv_stride, static_cast<cudaStream_t>(stream));
}

// Commit: replay the accepted path (input rows path[0..n-1], root first) from the committed state, write
// the new state and conv window in place (and the path rows' outputs when out/out_bf16 are given).
int elpis_gdn_tree_commit(const void* qkv, int32_t qkv_row_stride, int32_t qkv_channel_stride, const void* beta,
                          const float* g, const void* conv_weight, void* conv_state, int32_t conv_stride, float* state,
                          uint32_t n, const int32_t* path, float* out, void* out_bf16, void* stream) {
    GdnTreePlan plan{};
    const int err = gdn_tree_commit_plan(n, path, &plan);  // -1 for n outside 1..16
    if (err != 0) return err;
    auto* conv = static_cast<__nv_bfloat16*>(conv_state);
    const GdnTreeArgs args{static_cast<const __nv_bfloat16*>(qkv), QkvLayout{qkv_row_stride, qkv_channel_stride},
                           static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight), conv, conv_stride, state, state, out,
                           static_cast<__nv_bfloat16*>(out_bf16)};
    return launch(args, plan, true, conv, conv_stride, static_cast<cudaStream_t>(stream));
}

}  // extern "C"
