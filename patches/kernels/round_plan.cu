// The head of a greedy tree round on the GPU (issue 9, item 2: no host round trip inside a round): from the
// draft block's candidates, still in device memory, the tree the host would build, and every input of the
// tree verify that depends on it. Staged: built and tested under CPU emulation
// (tests/kernels/test_round_plan_emu.py), not yet served; the plan is elpis/spec/README.md, "The round on the
// GPU". Its partner after the verify is round_tail.cu.
//
// What the host does today, and what this kernel does instead, step for step (each step's Python is the
// reference the emulated tests compare with, output for output):
//   1. the tree's size (elpis.spec.generate.SpeculativeGenerator._tree with a drafter and no verify costs):
//      rows = min(tree budget, max context - kvp), depth = min(rows - 1, remaining - 1); a depth below 1
//      gives the anchor alone;
//   2. the candidates (elpis.exl3.drafter.unpack_candidates over the first min(depth, block rows) rows of
//      pack_candidates' float32 layout): the chain token first, its log-probability clamped to <= 0 as
//      Python's min(0.0, lp), then the row's top-k ids other than the chain token, k in all;
//   3. the tree (elpis.spec.tree.build_tree): per depth, duplicates and -inf dropped, a stable sort by
//      log-probability; then the best-first selection of rows with scores summed in double precision, as
//      Python's floats are, ties to the lexicographically smaller rank path;
//   4. the verify's inputs (elpis.exl3.tree_graph.TreeGraphs._int_values, over tree_verify.layout_tree): the
//      tree padded to the graph's `run` rows with leaves under the root, its masks from the proven acceptor
//      library as device code (elpis_check_masks, ext/accept_device.cuh), the Gated DeltaNet plan from the
//      proved gdn_plan.h (gdn_tree_plan.cuh), kvp, the position ids and the token ids (padding: the anchor);
//   5. the acceptor's cells for round_tail.cu (elpis.exl3.round_tail.tree_cells): rows, the remaining
//      budget, the stops, the parents and the draft tokens; the target cells stay 0.
// The request's values that change between rounds (the anchor, kvp, the remaining budget) and those fixed
// for the request (max context, tree budget, stops) are read from a state block in device memory, so one
// captured graph serves every round; the graph's own shape (block rows, k, run, vocabulary) is in the
// launch's arguments.
//
// A refusal where Python raises (a candidate id that float32 cannot carry or outside the vocabulary, a state
// out of range) and an idle round (no room, no budget, or the state's `done` set) write the status into the
// record and 0 into the cells' row count, which the acceptor refuses: round_tail then commits nothing. The
// verify's inputs are then those of the anchor alone. Nothing here is arithmetic on floats but the scores'
// double-precision sums and comparisons.
//
// Three launches, each thread deciding alone (so each is a single-thread kernel, which tests/kernels/ptx_interp.py
// runs on nvcc's PTX): round_plan_kernel (one thread) builds the tree, its masks and the Gated DeltaNet plan's
// checked tree into a scratch block in device memory; round_plan_rows_kernel (one thread a block, a block per
// (row, part)) computes each row's visit and each of its taps, the plan's parts, which one thread took 0.5 ms of
// a 0.64 ms launch for (H100, device call 151); round_plan_finish_kernel (one thread) assembles the plan and
// writes the verify's inputs, the cells and the record.
#include <cuda_runtime.h>
#include <stdint.h>

#include "accept_device.cuh"
#include "gdn_tree_plan.cuh"
#include "round_state.cuh"

namespace {

constexpr int kMaxRows = ELPIS_MAX_ROWS;
constexpr int kMaxDepth = kMaxRows - 1;
constexpr int kMaxK = 16;                        // candidates per depth the kernel holds
constexpr int kFrontier = 2 * kMaxRows;          // each pop pushes at most two entries
constexpr float kExactIds = 16777216.0f;         // 2^24: float32 carries every id below it exactly
static_assert(sizeof(GdnTreePlan) <= kPlanCapacity, "a packed Gated DeltaNet plan fits the verify's plan input");
constexpr double kMaxDouble = 1.7976931348623157e308;  // below -kMaxDouble: -inf

// The record (int32 words), elpis.exl3.round_plan.REC_*.
constexpr int kRecStatus = 0, kRecRows = 1, kRecTokens = 2, kRecParents = kRecTokens + kMaxRows;
constexpr int kRecordWords = kRecParents + kMaxRows;

// Status: 0 a tree to verify; 1 idle (no room, no budget, or done); < 0 refused.
constexpr int32_t kIdle = 1, kBadState = -1, kUnreadableId = -2, kIdOutsideVocab = -3, kBadLogProb = -4,
                  kInternal = -5;

struct Node {
    double neg_score;       // -(summed log-probability), the heap key's first element
    uint8_t ranks[kMaxDepth];
    int32_t len;            // the rank path's length: the node's depth
    int32_t parent;         // the row it hangs under
};

// Python's tuple order on (neg_score, ranks, parent): floats by value (-0.0 == 0.0), then the rank paths
// element by element, a proper prefix first.
__device__ __forceinline__ bool node_less(const Node& a, const Node& b) {
    if (a.neg_score < b.neg_score) return true;
    if (b.neg_score < a.neg_score) return false;
    const int n = a.len < b.len ? a.len : b.len;
    for (int i = 0; i < n; i++) {
        if (a.ranks[i] != b.ranks[i]) return a.ranks[i] < b.ranks[i];
    }
    if (a.len != b.len) return a.len < b.len;
    return a.parent < b.parent;
}

struct Tree {
    int32_t rows;
    int64_t tokens[kMaxRows];
    int32_t parents[kMaxRows];
    double scores[kMaxRows];
};

struct Levels {
    int32_t count;                 // depths with candidates (a depth with none ends the block)
    int32_t size[kMaxDepth];
    int64_t token[kMaxDepth][kMaxK];
    double lp[kMaxDepth][kMaxK];
};

// The kernel's working set, in shared memory rather than on the thread's stack: the frame stays within CUDA's
// default 1 KiB stack (800 bytes, ptxas), as round_tail.cu's does, so no launch has to grow local memory.
struct Work {
    int32_t n[kMaxDepth];            // unpacked candidates per depth
    int64_t tok[kMaxDepth][kMaxK];
    double lps[kMaxDepth][kMaxK];
    Node frontier[kFrontier];
    Levels levels;
    Tree tree;
    int64_t mask_cells[ELPIS_MASKS_CELLS];
    uint8_t depth8[kMaxRows];
    uint16_t anc16[kMaxRows];
};

// What the first launch leaves for the other two, in device memory (the caller's scratch).
struct PlanScratch {
    int32_t status;       // the round's status so far
    int32_t prepared;     // 0: the masks and the plan's tree are made, the rows' parts to run; else kInternal
    int64_t kvp;          // the verify's kvp (0 for a refused state)
    Tree tree;
    int32_t depth[kMaxRows];
    uint32_t ancestors[kMaxRows];
    GdnPlanTree plan_tree;
    GdnPlanParts parts;
};

// Python's int() of a float id already checked finite and below 2^24: truncation toward zero.
__device__ __forceinline__ int64_t id_of(float v) { return static_cast<int64_t>(v); }

// Python's min(0.0, lp): lp when lp < 0.0, else 0.0 (NaN and -0.0 included).
__device__ __forceinline__ double clamp_lp(float v) {
    const double d = static_cast<double>(v);
    return d < 0.0 ? d : 0.0;
}

// Steps 2 and 3's candidates: unpack_candidates over `depth` packed rows, then build_tree's
// _clean_candidates. Returns 0 or a refusal.
__device__ int32_t candidate_levels(const float* packed, int32_t k, int32_t depth, int64_t vocab, Work* w) {
    const int32_t width = 2 + 2 * k;
    Levels* lv = &w->levels;
    int32_t* n = w->n;
    int64_t (*tok)[kMaxK] = w->tok;
    double (*lps)[kMaxK] = w->lps;
    // unpack_candidates: every row's ids readable first (its max(...) >= 2^24 check), then the rows
    for (int32_t d = 0; d < depth; d++) {
        const float* row = packed + static_cast<size_t>(d) * width;
        for (int32_t i = -1; i < k; i++) {
            const float v = i < 0 ? row[0] : row[2 + i];
            if (!(v < kExactIds)) return kUnreadableId;  // >= 2^24 or NaN: Python's check or int() raises
            if (!(v > -kExactIds)) return kUnreadableId;  // -inf: int() raises
        }
        n[d] = 0;
        tok[d][n[d]] = id_of(row[0]);
        lps[d][n[d]++] = clamp_lp(row[1]);
        for (int32_t i = 0; i < k && n[d] < k; i++) {
            const int64_t t = id_of(row[2 + i]);
            if (t != tok[d][0]) {
                tok[d][n[d]] = t;
                lps[d][n[d]++] = clamp_lp(row[2 + k + i]);
            }
        }
    }
    // _clean_candidates, depth by depth: refusals in order, duplicates (the first kept) and -inf dropped, a
    // depth with none ends the block, then a stable sort, best first
    lv->count = 0;
    for (int32_t d = 0; d < depth; d++) {
        int32_t m = 0;
        for (int32_t i = 0; i < n[d]; i++) {
            const int64_t t = tok[d][i];
            const double lp = lps[d][i];
            if (t < 0 || t >= vocab) return kIdOutsideVocab;
            if (lp != lp || lp > 0.0) return kBadLogProb;
            bool seen = false;  // Python's `seen` holds the tokens kept so far (a -inf one is not kept)
            for (int32_t j = 0; j < m; j++) seen = seen || lv->token[d][j] == t;
            if (seen || lp < -kMaxDouble) continue;  // -inf
            // stable insertion: after every kept candidate whose log-probability is >= this one's
            int32_t at = m;
            while (at > 0 && lv->lp[d][at - 1] < lp) {
                lv->token[d][at] = lv->token[d][at - 1];
                lv->lp[d][at] = lv->lp[d][at - 1];
                at--;
            }
            lv->token[d][at] = t;
            lv->lp[d][at] = lp;
            m++;
        }
        if (m == 0) break;
        lv->size[d] = m;
        lv->count = d + 1;
    }
    return 0;
}

// build_tree's selection: at most max_rows rows (anchor included). The frontier is popped by a scan for the
// least entry (at most kFrontier of them), which is the order heapq pops them in: every key is distinct.
__device__ int32_t select_rows(Work* w, int64_t anchor, int32_t max_rows) {
    const Levels* lv = &w->levels;
    Tree* tree = &w->tree;
    Node* frontier = w->frontier;
    int32_t size = 0;
    tree->rows = 1;
    tree->tokens[0] = anchor;
    tree->parents[0] = -1;
    tree->scores[0] = 0.0;
    if (lv->count > 0) {
        Node& first = frontier[size++];
        first.neg_score = -lv->lp[0][0];
        first.ranks[0] = 0;
        first.len = 1;
        first.parent = 0;
    }
    while (size > 0 && tree->rows < max_rows) {
        int32_t best = 0;
        for (int32_t i = 1; i < size; i++)
            if (node_less(frontier[i], frontier[best])) best = i;
        const Node node = frontier[best];
        frontier[best] = frontier[--size];
        const int32_t depth = node.len, row = tree->rows++;
        const int32_t rank = node.ranks[depth - 1];
        tree->tokens[row] = lv->token[depth - 1][rank];
        tree->parents[row] = node.parent;
        tree->scores[row] = -node.neg_score;
        const double parent_score = tree->scores[node.parent];
        if (size + 2 > kFrontier) return kInternal;
        if (rank + 1 < lv->size[depth - 1]) {  // the next sibling
            Node& s = frontier[size++];
            s = node;
            s.ranks[depth - 1] = static_cast<uint8_t>(rank + 1);
            s.neg_score = -(parent_score + lv->lp[depth - 1][rank + 1]);
        }
        if (depth < lv->count) {  // the best child
            Node& c = frontier[size++];
            c = node;
            c.ranks[depth] = 0;
            c.len = depth + 1;
            c.parent = row;
            c.neg_score = -(-node.neg_score + lv->lp[depth][0]);
        }
    }
    return 0;
}

struct VerifyInputs {
    int32_t* seqlens;    // [1] kvp
    int32_t* position;   // [run] kvp + depth
    int32_t* ctx;        // [1] kvp
    int32_t* masks;      // [2 run] depth, then ancestors
    uint8_t* plan;       // [kPlanCapacity] the Gated DeltaNet plan's bytes, zero-padded
    int32_t* ids;        // [run] tokens, padding rows the anchor
};

// Step 4, first part: the tree padded to `run` rows, its masks, and the checked tree of its Gated DeltaNet plan.
// Returns 0 or kInternal.
__device__ int32_t prepare_plan(Work* w, int32_t run, PlanScratch* sc) {
    const Tree& tree = w->tree;
    int64_t* cells = w->mask_cells;
    cells[ELPIS_MASKS_ROWS] = run;
    for (int32_t r = 0; r < kMaxRows; r++)
        cells[ELPIS_MASKS_PARENTS + r] = r < tree.rows ? tree.parents[r] : 0;  // padding: leaves under the root
    if (elpis_dev_masks_row(cells, w->depth8, w->anc16) != 0) return kInternal;
    for (int32_t r = 0; r < kMaxRows; r++) {
        sc->depth[r] = r < run ? w->depth8[r] : 0;
        sc->ancestors[r] = r < run ? w->anc16[r] : 0u;
    }
    if (gdn_tree_plan_begin(static_cast<uint32_t>(run), sc->depth, sc->ancestors, nullptr, &sc->plan_tree) != 0)
        return kInternal;
    return 0;
}

// Step 4, last part: the plan from its rows' parts, and the verify's inputs. Returns 0 or kInternal.
__device__ int32_t write_verify_inputs(const PlanScratch* sc, int32_t run, const VerifyInputs& out) {
    const Tree& tree = sc->tree;
    GdnTreePlan plan{};
    if (sc->prepared != 0 || gdn_tree_plan_end(&sc->plan_tree, &sc->parts, &plan) != 0) return kInternal;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&plan);
    for (int32_t i = 0; i < kPlanCapacity; i++)
        out.plan[i] = i < static_cast<int32_t>(sizeof(GdnTreePlan)) ? bytes[i] : 0;
    out.seqlens[0] = static_cast<int32_t>(sc->kvp);
    out.ctx[0] = static_cast<int32_t>(sc->kvp);
    for (int32_t r = 0; r < run; r++) {
        out.position[r] = static_cast<int32_t>(sc->kvp + sc->depth[r]);
        out.masks[r] = sc->depth[r];
        out.masks[run + r] = static_cast<int32_t>(sc->ancestors[r]);
        out.ids[r] = static_cast<int32_t>(r < tree.rows ? tree.tokens[r] : tree.tokens[0]);
    }
    return 0;
}

__device__ bool state_ok(const int64_t* st, int32_t run) {
    const int64_t budget = st[kStTreeBudget], nstops = st[kStNStops];
    return st[kStKvp] >= 0 && st[kStMaxContext] >= 1 && st[kStMaxContext] < (int64_t(1) << 31) - kMaxRows &&
           st[kStKvp] < (int64_t(1) << 31) - kMaxRows && budget >= 1 && budget <= run && nstops >= 0 &&
           nstops <= ELPIS_MAX_STOPS;
}

// Launch 1 (one thread): steps 1-3 and step 4's masks and the plan's checked tree, into the scratch block.
__global__ void round_plan_kernel(const float* __restrict__ packed, int32_t block_rows, int32_t k, int32_t run,
                                  int64_t vocab, const int64_t* __restrict__ state, PlanScratch* __restrict__ sc) {
    __shared__ Work work;
    Tree& tree = work.tree;
    int64_t st[kStateWords];
    for (int i = 0; i < kStateWords; i++) st[i] = state[i];
    int32_t status = 0;
    const int64_t anchor = st[kStAnchor], kvp = st[kStKvp], remaining = st[kStRemaining];
    tree.rows = 1;
    tree.tokens[0] = anchor;
    tree.parents[0] = -1;
    tree.scores[0] = 0.0;
    if (!state_ok(st, run) || anchor < 0 || anchor >= vocab) {
        status = kBadState;
    } else if (st[kStDone] != 0 || remaining < 1 || st[kStMaxContext] - kvp < 1) {
        status = kIdle;
    } else {
        const int64_t room = st[kStMaxContext] - kvp;
        const int64_t rows = st[kStTreeBudget] < room ? st[kStTreeBudget] : room;
        const int64_t depth = rows - 1 < remaining - 1 ? rows - 1 : remaining - 1;
        if (depth >= 1) {
            const int32_t used = static_cast<int32_t>(depth < block_rows ? depth : block_rows);
            status = candidate_levels(packed, k, used, vocab, &work);
            if (status == 0) status = select_rows(&work, anchor, static_cast<int32_t>(rows));
        }
    }
    if (status != 0) {  // the anchor alone (an out-of-range anchor gives padding a readable id: 0)
        tree.rows = 1;
        tree.tokens[0] = anchor >= 0 && anchor < vocab ? anchor : 0;
    }
    sc->status = status;
    sc->kvp = status == kBadState ? 0 : kvp;
    sc->tree = tree;
    sc->prepared = prepare_plan(&work, run, sc);
}

// Launch 2 (one thread a block, blocks (row, part) numbered row * (1 + taps) + part): part 0 the row's visit,
// part 1 + j its tap j.
__global__ void round_plan_rows_kernel(PlanScratch* __restrict__ sc) {
    __shared__ GdnPlanTree plan_tree;
    const uint32_t r = blockIdx.x / (1u + kGdnPlanTaps), part = blockIdx.x % (1u + kGdnPlanTaps);
    if (sc->prepared != 0 || r >= static_cast<uint32_t>(sc->plan_tree.rows)) return;
    plan_tree = sc->plan_tree;
    if (part == 0)
        gdn_tree_plan_visit(&plan_tree, r, &sc->parts);
    else
        gdn_tree_plan_tap(&plan_tree, r, part - 1u, &sc->parts);
}

// Launch 3 (one thread): the plan, the verify's inputs, the acceptor's cells and the record.
__global__ void round_plan_finish_kernel(int32_t run, const int64_t* __restrict__ state,
                                         const PlanScratch* __restrict__ sc, VerifyInputs out,
                                         int64_t* __restrict__ cells, int32_t* __restrict__ record) {
    int64_t st[kStateWords];
    for (int i = 0; i < kStateWords; i++) st[i] = state[i];
    const Tree& tree = sc->tree;
    int32_t status = sc->status;
    if (write_verify_inputs(sc, run, out) != 0 && status == 0) status = kInternal;
    // the acceptor's cells: a refused or idle round gets 0 rows, which elpis_check_tree refuses
    for (int i = 0; i < ELPIS_TREE_CELLS; i++) cells[i] = 0;
    cells[ELPIS_TREE_ROWS] = status == 0 ? tree.rows : 0;
    cells[ELPIS_TREE_BUDGET] = st[kStRemaining];
    cells[ELPIS_TREE_NSTOPS] = st[kStNStops];
    for (int i = 0; i < ELPIS_MAX_STOPS; i++) cells[ELPIS_TREE_STOPS + i] = i < st[kStNStops] ? st[kStStops + i] : 0;
    for (int r = 0; r < tree.rows; r++) {
        cells[ELPIS_TREE_PARENTS + r] = tree.parents[r];
        cells[ELPIS_TREE_DRAFT + r] = tree.tokens[r];
    }
    record[kRecStatus] = status;
    record[kRecRows] = tree.rows;
    for (int r = 0; r < kMaxRows; r++) {
        const bool in = r < tree.rows;
        record[kRecTokens + r] = in ? static_cast<int32_t>(tree.tokens[r]) : -1;
        record[kRecParents + r] = in ? tree.parents[r] : -1;
    }
}

}  // namespace

extern "C" {

int elpis_round_plan_record_words(void) { return kRecordWords; }
int elpis_round_plan_state_words(void) { return kStateWords; }
int elpis_round_plan_plan_capacity(void) { return kPlanCapacity; }
int elpis_round_plan_scratch_bytes(void) { return static_cast<int>(sizeof(PlanScratch)); }

// Plan the round on `stream` (a cudaStream_t passed as an address). Device pointers: packed float32
// [block_rows][2 + 2k], state int64 [kStateWords], seqlens and ctx int32 [1], position and ids int32 [run],
// masks int32 [2 run], plan uint8 [256], cells int64 [ELPIS_TREE_CELLS], record int32 [kRecordWords], scratch
// (8-byte aligned, scratch_bytes long, at least elpis_round_plan_scratch_bytes()). Returns 0, -1 for arguments
// out of range, or the launches' cudaError_t.
int elpis_round_plan(const float* packed, uint32_t block_rows, uint32_t k, uint32_t run, uint32_t vocab,
                     const int64_t* state, int32_t* seqlens, int32_t* position, int32_t* ctx, int32_t* masks,
                     uint8_t* plan, int32_t* ids, int64_t* cells, int32_t* record, void* scratch,
                     uint64_t scratch_bytes, void* stream) {
    if (block_rows == 0 || block_rows > static_cast<uint32_t>(kMaxDepth) || k == 0 ||
        k > static_cast<uint32_t>(kMaxK) || run == 0 || run > static_cast<uint32_t>(kMaxRows) || vocab == 0 ||
        vocab > static_cast<uint32_t>(kExactIds) || scratch == nullptr ||
        reinterpret_cast<uintptr_t>(scratch) % 8u != 0u || scratch_bytes < sizeof(PlanScratch)) {
        return -1;
    }
    const VerifyInputs out{seqlens, position, ctx, masks, plan, ids};
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    auto* sc = static_cast<PlanScratch*>(scratch);
    round_plan_kernel<<<1, 1, 0, s>>>(packed, static_cast<int32_t>(block_rows), static_cast<int32_t>(k),
                                      static_cast<int32_t>(run), vocab, state, sc);
    round_plan_rows_kernel<<<run * (1u + kGdnPlanTaps), 1, 0, s>>>(sc);
    round_plan_finish_kernel<<<1, 1, 0, s>>>(static_cast<int32_t>(run), state, sc, out, cells, record);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
