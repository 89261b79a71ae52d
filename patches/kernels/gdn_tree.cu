// Gated DeltaNet (causal conv + gated delta rule) over a token tree, row-invariant by construction
// (issue 8, item 3).
//
// Geometry (Qwen3.8-27B linear-attention layers): 16 key heads and 48 value heads (groups of 3) of 128
// dims, conv over 10240 channels [q 16x128 | k 16x128 | v 48x128] with 4 taps, no conv bias; up to 16 rows.
//
// Inputs: the layout the engine holds after the in-projections (ExLlamaV3's GDN layer: the qkv projection
// cast to bf16, beta and g from gated_delta_net_fused_op_2; z stays with the gated norm that follows):
//   qkv         bf16 [n_in, 10240]   pre-conv projection, one row per tree row (token-major)
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
// inside 16 lanes: a step needs no block barrier.
//
// Why this walk, by bytes moved: the committed state (3 MB per layer) is read once per call, the inputs
// (a few KB per row, L2-resident) once per block, and nothing else touches global memory (a commit writes
// the 3 MB once more). A per-row state copy in global memory would move 3 MB per row (48 MB for 16 rows);
// recomputing each row along its path from the committed state would cost sum(depth + 1) steps (136 for a
// 16-chain) instead of R. Instead the block visits the rows depth first, children in order of increasing
// subtree size (the largest last): the state of the row just visited stays in registers for its first
// child, and a row with two or more children parks its state on a small on-chip stack (lane-private shared
// memory) until its last child takes it. A parked row always has a pending child whose subtree holds at
// most half of its own, so at most 3 states are parked for 16 rows (16 -> 7 -> 3); the host plan checks the
// bound and refuses otherwise.
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
constexpr unsigned kFull = 0xffffffffu;

static_assert(kThreads == 2 * kDim, "phase A gives each thread one q or k channel");
static_assert(kThreads / 32 * 2 == kSlice, "each warp owns two columns of the slice");
static_assert(kStackSlots * kPerLane * kThreads >= kDim * kStagePitch, "staging fits in the stack area");

}  // namespace

// The plan of one call, computed on the host (elpis_gdn_tree_plan) and passed by value.
struct GdnTreePlan {
    int32_t rows;                    // logical rows; out row r is logical row r
    int8_t order[kMaxRows];          // visiting order (logical rows)
    int8_t load[kMaxRows];           // per visit: stack slot holding the parent's state, -1: registers
    int8_t store[kMaxRows];          // per visit: stack slot to park this row's state in, -1: none
    int8_t in_row[kMaxRows];         // input row (of qkv/beta/g) of each logical row
    int8_t src[kMaxRows][kTaps];     // conv inputs per tap: input row >= 0, or -1 - committed column
    int8_t max_stack;                // slots used (informational)
};

// Host (and test) side: the plan for a tree given as tree_masks (depth, ancestor bitmasks) of `rows`
// logical rows, logical row r reading input row in_row[r] (null: r). Returns 0 or a negative code:
// -1 rows out of range, -2 bad masks (not a tree rooted at row 0 with parents before children),
// -3 in_row out of range, -4 stack bound exceeded (cannot happen for a valid tree of <= 16 rows).
static int gdn_tree_plan(uint32_t rows, const int32_t* depth, const uint32_t* ancestors, const int32_t* in_row,
                         GdnTreePlan* plan) {
    if (rows == 0 || rows > static_cast<uint32_t>(kMaxRows)) return -1;
    int parent[kMaxRows];
    int size[kMaxRows];
    int children[kMaxRows];
    const int n = static_cast<int>(rows);
    for (int r = 0; r < n; r++) {
        const uint32_t a = ancestors[r];
        if (!((a >> r) & 1u) || (r < 31 && (a >> (r + 1)) != 0)) return -2;
        if (__builtin_popcount(a) != depth[r] + 1) return -2;
        const uint32_t above = a & ~(1u << r);
        if (r == 0) {
            if (above != 0 || depth[0] != 0) return -2;
            parent[0] = -1;
        } else {
            if (above == 0) return -2;
            const int p = 31 - __builtin_clz(above);
            if (ancestors[p] != above || depth[p] + 1 != depth[r]) return -2;
            parent[r] = p;
        }
        if (in_row != nullptr && (in_row[r] < 0 || in_row[r] >= kMaxRows)) return -3;
        size[r] = 1;
        children[r] = 0;
    }
    for (int r = n - 1; r > 0; r--) {
        size[parent[r]] += size[r];
        children[parent[r]] += 1;
    }
    plan->rows = n;
    for (int r = 0; r < n; r++) {
        plan->in_row[r] = static_cast<int8_t>(in_row != nullptr ? in_row[r] : r);
        // path[e] = ancestor at depth e (root first)
        int path[kMaxRows];
        for (int node = r; node >= 0; node = parent[node]) path[depth[node]] = node;
        for (int j = 0; j < kTaps; j++) {
            const int e = depth[r] - (kTaps - 1) + j;
            plan->src[r][j] = static_cast<int8_t>(e >= 0 ? plan->in_row[path[e]] : -1 - (kTaps + e));
        }
    }
    // Depth-first, children by (subtree size, row) ascending; an explicit stack of rows to visit.
    int todo[kMaxRows];
    int ntodo = 0;
    int visits = 0;
    int slots[kMaxRows];  // parked rows, bottom first
    int nslots = 0;
    int pending[kMaxRows];  // children not yet visited
    for (int r = 0; r < n; r++) pending[r] = children[r];
    int prev = -1;
    int max_stack = 0;
    todo[ntodo++] = 0;
    while (ntodo > 0) {
        const int r = todo[--ntodo];
        const int p = parent[r];
        int load = -1;
        if (visits > 0 && p != prev) {
            if (nslots == 0 || slots[nslots - 1] != p) return -2;
            load = nslots - 1;
        }
        if (p >= 0) {
            pending[p] -= 1;
            if (pending[p] == 0 && nslots > 0 && slots[nslots - 1] == p) nslots -= 1;  // last child took it
        }
        int store = -1;
        if (children[r] >= 2) {
            if (nslots == kStackSlots) return -4;
            store = nslots;
            slots[nslots++] = r;
            if (nslots > max_stack) max_stack = nslots;
        }
        plan->order[visits] = static_cast<int8_t>(r);
        plan->load[visits] = static_cast<int8_t>(load);
        plan->store[visits] = static_cast<int8_t>(store);
        visits++;
        prev = r;
        // push children so the smallest subtree pops first: push in descending (size, row)
        int kids[kMaxRows];
        int nk = 0;
        for (int c = r + 1; c < n; c++)
            if (parent[c] == r) kids[nk++] = c;
        for (int i = 1; i < nk; i++)  // insertion sort ascending by (size, row)
            for (int j = i; j > 0 && (size[kids[j]] < size[kids[j - 1]] ||
                                      (size[kids[j]] == size[kids[j - 1]] && kids[j] < kids[j - 1]));
                 j--) {
                const int t = kids[j];
                kids[j] = kids[j - 1];
                kids[j - 1] = t;
            }
        for (int i = nk - 1; i >= 0; i--) todo[ntodo++] = kids[i];
    }
    if (visits != n) return -2;
    plan->max_stack = static_cast<int8_t>(max_stack);
    return 0;
}

namespace {

struct GdnTreeArgs {
    const __nv_bfloat16* qkv;
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

// silu(sum_j w_j x_j) of one channel of logical row r, taps in order.
__device__ __forceinline__ float conv_channel(const GdnTreeArgs& a, const GdnTreePlan& plan, int r, int ch) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kTaps; j++) {
        const int s = plan.src[r][j];
        const float x = s >= 0 ? bf(a.qkv[static_cast<size_t>(s) * kConvDim + ch])
                               : bf(a.conv_state[static_cast<size_t>(ch) * a.conv_stride + (-1 - s)]);
        const float w = bf(a.conv_weight[ch * kTaps + j]);
        acc = j == 0 ? __fmul_rn(w, x) : __fmaf_rn(w, x, acc);
    }
    return __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
}

// Sum over the 16 lanes of a half warp; every lane of the half ends with the same bits.
__device__ __forceinline__ float half_warp_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 8));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
    v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
    return v;
}

__global__ void __launch_bounds__(kThreads) gdn_tree_kernel(const GdnTreeArgs a, const GdnTreePlan plan) {
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
    float* stage = s_stack;  // [kDim][kStagePitch]

    // Stage the committed state slice S[head][:, slice] (coalesced: 16 columns = 64 bytes per k row).
    const float* s_in = a.state_in + static_cast<size_t>(head) * kDim * kDim + slice * kSlice;
    for (int e = t; e < kDim * kSlice; e += kThreads) {
        const int k = e / kSlice;
        const int c = e % kSlice;
        stage[k * kStagePitch + c] = s_in[static_cast<size_t>(k) * kDim + c];
    }

    // Phase A (rows in parallel, independent of the state): conv + SiLU of the key head's q and k channels
    // and the slice's v channels, the gates.
    const int qk_channel = t < kDim ? key_head * kDim + t : kKOffset + key_head * kDim + (t - kDim);
    for (int r = 0; r < rows; r++) s_qk[r][t] = conv_channel(a, plan, r, qk_channel);
    if (t < kSlice) {
        const int v_channel = kVOffset + head * kDim + slice * kSlice + t;
        for (int r = 0; r < rows; r++) s_v[r][t] = conv_channel(a, plan, r, v_channel);
    }
    if (t < rows) {
        const size_t i = static_cast<size_t>(plan.in_row[t]) * kValueHeads + head;
        s_decay[t] = expf(a.g[i]);
        s_beta[t] = bf(a.beta[i]);
    }
    __syncthreads();
    // L2 norms: warp w normalises (row, q|k) pairs w, w + 8, ...; lane sums channels 4l..4l+3 in order.
    for (int pair = warp; pair < 2 * rows; pair += kThreads / 32) {
        float* x = &s_qk[pair >> 1][(pair & 1) * kDim + 4 * lane];
        float ss = __fmul_rn(x[0], x[0]);
        ss = __fmaf_rn(x[1], x[1], ss);
        ss = __fmaf_rn(x[2], x[2], ss);
        ss = __fmaf_rn(x[3], x[3], ss);
        ss = __fadd_rn(ss, __shfl_xor_sync(kFull, ss, 16));
        ss = half_warp_sum(ss);
        float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, 1e-6f)));
        if ((pair & 1) == 0) inv = __fmul_rn(inv, 0.088388347648318441f);  // q also takes 1/sqrt(128)
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = __fmul_rn(x[i], inv);
    }
    // This lane's part of its column: rows k = 16i + sub of column `col`.
    const int col = 2 * warp + (lane >> 4);
    const int sub = lane & 15;
    float st[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; i++) st[i] = stage[(16 * i + sub) * kStagePitch + col];
    __syncthreads();  // the staging area becomes the stack; the normalised q/k are complete

    // Phase B: the walk. No block barrier: a warp's columns depend on nothing outside the warp.
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
        dot = half_warp_sum(dot);
        const float delta = __fmul_rn(__fsub_rn(s_v[r][col], dot), beta);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; i++) {
            st[i] = __fmaf_rn(kk[i], delta, st[i]);
            const float q = s_qk[r][16 * i + sub];
            o = i == 0 ? __fmul_rn(q, st[i]) : __fmaf_rn(q, st[i], o);
        }
        o = half_warp_sum(o);
        if (sub == 0) {
            const size_t i = (static_cast<size_t>(r) * kValueHeads + head) * kDim + slice * kSlice + col;
            if (a.out != nullptr) a.out[i] = o;
            if (a.out_bf16 != nullptr) a.out_bf16[i] = __float2bfloat16_rn(o);
        }
        const int store = plan.store[visit];
        if (store >= 0) {
#pragma unroll
            for (int i = 0; i < kPerLane; i++) s_stack[(store * kPerLane + i) * kThreads + t] = st[i];
        }
    }

    if (a.state_out != nullptr) {  // commit: write back the final state, coalesced through the staging
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kPerLane; i++) stage[(16 * i + sub) * kStagePitch + col] = st[i];
        __syncthreads();
        float* s_out = a.state_out + static_cast<size_t>(head) * kDim * kDim + slice * kSlice;
        for (int e = t; e < kDim * kSlice; e += kThreads) {
            const int k = e / kSlice;
            const int c = e % kSlice;
            s_out[static_cast<size_t>(k) * kDim + c] = stage[k * kStagePitch + c];
        }
    }
}

// Commit of the conv window: columns 0..3 become the last 4 inputs along the chain of `plan` (in place;
// each thread reads its channel's old columns before writing). Runs after gdn_tree_kernel on the stream.
__global__ void gdn_conv_commit_kernel(const __nv_bfloat16* qkv, __nv_bfloat16* conv_state, int32_t stride,
                                       const GdnTreePlan plan) {
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
        w[j] = e >= 0 ? qkv[static_cast<size_t>(plan.in_row[e]) * kConvDim + ch] : old[kTaps + e];
    }
}

int launch(const GdnTreeArgs& args, const GdnTreePlan& plan, bool commit, const __nv_bfloat16* qkv,
           __nv_bfloat16* conv_state, int32_t stride, cudaStream_t s) {
    gdn_tree_kernel<<<dim3(kSlices, kValueHeads), kThreads, 0, s>>>(args, plan);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
    if (commit) {
        gdn_conv_commit_kernel<<<(kConvDim + 255) / 256, 256, 0, s>>>(qkv, conv_state, stride, plan);
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

// Verify: one output row per tree row. depth/ancestors are host arrays (tree_masks), device pointers for
// the tensors (shapes validated by elpis/exl3/gdn_tree.py). Returns 0, a negative plan error or a
// cudaError_t.
int elpis_gdn_tree_verify(const void* qkv, const void* beta, const float* g, const void* conv_weight,
                          const void* conv_state, int32_t conv_stride, const float* state, uint32_t rows,
                          const int32_t* depth, const uint32_t* ancestors, float* out, void* out_bf16,
                          void* stream) {
    GdnTreePlan plan{};
    const int err = gdn_tree_plan(rows, depth, ancestors, nullptr, &plan);
    if (err != 0) return err;
    const GdnTreeArgs args{static_cast<const __nv_bfloat16*>(qkv), static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight),
                           static_cast<const __nv_bfloat16*>(conv_state), conv_stride, state, nullptr, out,
                           static_cast<__nv_bfloat16*>(out_bf16)};
    return launch(args, plan, false, nullptr, nullptr, conv_stride, static_cast<cudaStream_t>(stream));
}

// Commit: replay the accepted path (input rows path[0..n-1], root first) from the committed state, write
// the new state and conv window in place (and the path rows' outputs when out/out_bf16 are given).
int elpis_gdn_tree_commit(const void* qkv, const void* beta, const float* g, const void* conv_weight,
                          void* conv_state, int32_t conv_stride, float* state, uint32_t n, const int32_t* path,
                          float* out, void* out_bf16, void* stream) {
    if (n == 0 || n > static_cast<uint32_t>(kMaxRows)) return -1;
    int32_t depth[kMaxRows];
    uint32_t ancestors[kMaxRows];
    for (uint32_t i = 0; i < n; i++) {
        depth[i] = static_cast<int32_t>(i);
        ancestors[i] = (i == 31 ? 0xffffffffu : ((1u << (i + 1)) - 1u));
    }
    GdnTreePlan plan{};
    const int err = gdn_tree_plan(n, depth, ancestors, path, &plan);
    if (err != 0) return err;
    const auto* x = static_cast<const __nv_bfloat16*>(qkv);
    auto* conv = static_cast<__nv_bfloat16*>(conv_state);
    const GdnTreeArgs args{x, static_cast<const __nv_bfloat16*>(beta), g,
                           static_cast<const __nv_bfloat16*>(conv_weight), conv, conv_stride, state, state, out,
                           static_cast<__nv_bfloat16*>(out_bf16)};
    return launch(args, plan, true, x, conv, conv_stride, static_cast<cudaStream_t>(stream));
}

}  // extern "C"
