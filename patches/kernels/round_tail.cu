// The decision of a greedy tree round on the GPU, the commit's inputs it implies, and the request's state for
// the next round (issue 9, item 2: no host round trip inside a round). Staged: built and tested under CPU
// emulation (tests/kernels/test_round_tail_emu.py), not yet served; the plan is elpis/spec/README.md, "The
// round on the GPU". Its partner before the verify is round_plan.cu, which writes the cells.
//
// After a tree verify of `run` rows, from device memory only:
//   cells      the round's acceptor cells (elpis.accept.abi's tree layout, TREE_CELLS int64) for a tree of
//              at most `run` rows (the verify pads it): rows, budget, stops, parents, draft tokens; the
//              target cells are filled here. round_plan.cu writes 0 rows for a round it refused or found
//              idle, which the acceptor refuses: such a round commits nothing;
//   ids        every verified row's greedy target (elpis.spec.sampling.greedy_ids: argmax, lowest id on
//              ties; -1 where the row's maximum is not finite), int64 [run], or a sampled request's drawn one
//              (sample_draw.cu, vocab_draw.cu), -5 (kUndecided) where the draw left the row to the host. The
//              acceptor reads the targets of the rows on the path it commits and no others, so an undecided
//              row off that path is decided as if its target were 0 (any id: it is never read) and the round
//              commits; on the path it refuses the round (status 2), which the host then decides. Any other
//              negative target, on any row, refuses the round as before;
//   bad        the row checks, int32 [run]: nonzero for a row holding NaN or +inf or whose digest changed;
//   state      the request's state block (round_state.cuh), read for kvp and advanced on a commit;
//   pages      the verify key's block table row, int32 [width]: the sequence's cache pages first (the K/V
//              slots' pages, as TreeGraphs.commit takes them), then padding;
//   page_count int32 [1]: how many of `pages` are the sequence's. It is read from device memory, not passed
//              as an argument, so a captured round (elpis.exl3.round_graph) serves every page count of its
//              table: the host uploads it with the table. A count outside 1..width commits nothing (status 3).
// Only the tree's rows are checked and decided: the padding rows past them are never read by a real row.
// One thread decides with the proven acceptor (elpis_check_tree: the generated code, as device code, with
// the checks the CPU glue runs; ext/accept_device.cuh) and writes, for the committed path:
//   moves_out  int64 [4][run - 1]: tree_verify.commit_moves(kvp, path, run, pages), the accepted rows' K/V
//              slot moves padded with self-copies of the verify's last slot;
//   plan_out   uint8 [kPlanCapacity]: gdn_tree.packed_commit_plan(path) (gdn_tree_plan.cuh, the proved plan),
//              zero-padded;
//   record     int32 [kRecordWords]: status (0: committed; 1: a row failed its checks; 2: a greedy maximum
//              was not finite; 3: a slot outside the pages; < 0: the acceptor's refusal code,
//              elpis.accept.abi.ERR_*), the committed count, whether the round ends the request (a stop token
//              or the budget), the end row, the kvp the round was verified at, the path (kMaxRows entries,
//              255 past the count), the committed tokens (-1 past the count), and the round's identity: the
//              request's epoch and the round's number (state's kStEpoch and kStRound, low 32 bits);
//   cond_index, cond_kvp  the draft's conditioning inputs, of a fixed shape: the committed path's rows padded to
//              cond_rows (>= run) with its last row, and the kvp its K/V go to (the draft never reads a position at or
//              past its length, and the next conditioning overwrites the padding's; a round not committed
//              conditions on row 0 alone, padded, at the same kvp, which the retry overwrites);
//   state      on status 0: kvp + count, the budget less count, the last committed token as the anchor, and
//              done when the round ends the request. Otherwise unchanged, so the next round verifies the
//              same position again: that is how a failed round is discarded and recomputed. The round
//              number advances on every round, committed or not.
// A round that is not committed gets the no-op inputs (self-copies, a zero plan), which commit nothing.
//
// Ampere instructions only (plain loads and stores); nothing here is arithmetic on floats.
#include <cuda_runtime.h>
#include <stdint.h>

#include "accept_device.cuh"
#include "gdn_tree_plan.cuh"
#include "round_state.cuh"

namespace {

constexpr int kMaxRows = ELPIS_MAX_ROWS;
constexpr int kRecStatus = 0, kRecCount = 1, kRecEnds = 2, kRecEnd = 3, kRecKvp = 4, kRecPath = 5;
constexpr int kRecTokens = kRecPath + kMaxRows;
constexpr int kRecEpoch = kRecTokens + kMaxRows, kRecRound = kRecEpoch + 1;
constexpr int kRecordWords = kRecRound + 1;
constexpr int32_t kFlaggedRow = 1, kNonFinite = 2, kSlotOutsidePages = 3;
constexpr int64_t kUndecided = -5;  // a drawn target the draw left to the host (the ids above)
static_assert(sizeof(GdnTreePlan) <= kPlanCapacity, "a packed commit plan fits the commit's plan input");

// The cache page and offset of sequence slot s, or false past the sequence's pages.
__device__ __forceinline__ bool slot_page(int64_t s, const int32_t* pages, int32_t npages, int64_t* page,
                                          int64_t* offset) {
    if (s < 0 || s >= static_cast<int64_t>(npages) * kPage) return false;
    *page = pages[s / kPage];
    *offset = s % kPage;
    return true;
}

// tree_verify.commit_moves: (source, destination) slots of every path row not at its sequential slot, then
// self-copies of the verify's last slot, as pages and offsets; `count` 0 gives the self-copies alone.
__device__ bool write_moves(const uint8_t* path, int32_t count, int64_t kvp, int32_t run, const int32_t* pages,
                            int32_t npages, int64_t* moves) {
    const int32_t cols = run - 1;
    const int64_t pad = kvp + run - 1;
    int32_t n = 0;
    bool ok = true;
    for (int32_t i = 0; i <= cols; i++) {
        int64_t src = pad, dst = pad;
        bool real = false;
        while (n < count && !real) {  // the next path row that moves
            const int32_t row = path[n];
            real = row != n;
            if (real) {
                src = kvp + row;
                dst = kvp + n;
            }
            n++;
        }
        if (i == cols) {
            ok = ok && !real;  // a path of at most run rows has at most run - 1 moves
            break;
        }
        ok = ok && slot_page(src, pages, npages, &moves[i], &moves[cols + i]) &&
             slot_page(dst, pages, npages, &moves[2 * cols + i], &moves[3 * cols + i]);
    }
    return ok;
}

__global__ void round_tail_kernel(const int64_t* __restrict__ cells_in, const int64_t* __restrict__ ids,
                                  const int32_t* __restrict__ bad, int32_t run, int64_t* __restrict__ state,
                                  const int32_t* __restrict__ pages, int32_t width,
                                  const int32_t* __restrict__ page_count, int32_t* __restrict__ record,
                                  int64_t* __restrict__ moves_out, uint8_t* __restrict__ plan_out,
                                  int64_t* __restrict__ cond_index, int32_t cond_rows, int32_t* __restrict__ cond_kvp) {
    __shared__ int64_t cells[ELPIS_TREE_CELLS];  // shared, not on the thread's stack, which is 1,040 bytes
                                                 // at -O3 all the same (ptxas -v, sm_86 and sm_90): past
                                                 // CUDA's default 1 KiB, so the driver raises the limit at
                                                 // the first launch, the load-time check's (round_check.py)
    __shared__ GdnTreePlan plan;
    for (int i = 0; i < ELPIS_TREE_CELLS; i++) cells[i] = cells_in[i];
    const int64_t kvp = state[kStKvp];
    const int64_t rows = cells[ELPIS_TREE_ROWS];
    // a count the table cannot hold leaves no page: every slot is outside, so nothing is committed
    const int32_t counted = page_count[0];
    const int32_t npages = counted >= 1 && counted <= width ? counted : 0;
    int32_t status = 0;
    uint8_t path[kMaxRows];
    int32_t count = 0, ends = 0, end = -1;
    if (rows < 1 || rows > run) {
        status = ELPIS_ERR_SIZE;  // refused or idle (0 rows from round_plan), or more rows than were verified
    } else {
        for (int r = 0; r < rows; r++) {
            if (bad[r] != 0) status = kFlaggedRow;
        }
        for (int r = 0; r < rows && status == 0; r++) {
            if (ids[r] < 0 && ids[r] != kUndecided) status = kNonFinite;
        }
    }
    if (status == 0) {
        for (int r = 0; r < rows; r++) cells[ELPIS_TREE_TARGET + r] = ids[r] == kUndecided ? 0 : ids[r];
        const int32_t code = elpis_check_tree(cells, path);
        if (code < 2) {  // a decision commits at least the anchor: count << 1 | ends >= 2
            status = code < 0 ? code : ELPIS_ERR_INTERNAL;
        } else {
            count = code >> 1;
            ends = code & 1;
            end = path[count - 1];
            for (int i = 0; i < count; i++) {
                if (ids[path[i]] == kUndecided) status = kNonFinite;  // the path reads it: the host decides
            }
        }
    }
    if (status == 0 && !write_moves(path, count, kvp, run, pages, npages, moves_out)) status = kSlotOutsidePages;
    plan = GdnTreePlan{};
    if (status == 0) {
        int32_t rows_of_path[kMaxRows];
        for (int i = 0; i < count; i++) rows_of_path[i] = path[i];
        if (gdn_tree_commit_plan(static_cast<uint32_t>(count), rows_of_path, &plan) != 0)
            status = ELPIS_ERR_INTERNAL;
    }
    if (status != 0) {  // the no-op inputs: self-copies of the last slot (page 0's first slot without it)
        count = 0;
        ends = 0;
        end = -1;
        if (!write_moves(path, 0, kvp, run, pages, npages, moves_out)) {
            for (int i = 0; i < 4 * (run - 1); i++) moves_out[i] = 0;
        }
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&plan);
    for (int i = 0; i < kPlanCapacity; i++)
        plan_out[i] = status == 0 && i < static_cast<int>(sizeof(GdnTreePlan)) ? bytes[i] : 0;
    record[kRecStatus] = status;
    record[kRecCount] = count;
    record[kRecEnds] = ends;
    record[kRecEnd] = end;
    record[kRecKvp] = static_cast<int32_t>(kvp);
    for (int i = 0; i < kMaxRows; i++) {
        const bool in = i < count;
        record[kRecPath + i] = in ? path[i] : 255;
        record[kRecTokens + i] = in ? static_cast<int32_t>(ids[path[i]]) : -1;
    }
    const int64_t round = state[kStRound];
    record[kRecEpoch] = static_cast<int32_t>(state[kStEpoch]);
    record[kRecRound] = static_cast<int32_t>(round);
    state[kStRound] = round + 1;
    for (int i = 0; i < cond_rows; i++) cond_index[i] = count > 0 ? path[i < count ? i : count - 1] : 0;
    cond_kvp[0] = static_cast<int32_t>(kvp);
    if (status == 0) {
        state[kStKvp] = kvp + count;
        state[kStRemaining] -= count;
        state[kStAnchor] = ids[path[count - 1]];
        state[kStDone] = ends;
    }
}

}  // namespace

extern "C" {

int elpis_round_tail_record_words(void) { return kRecordWords; }

// Decide the round, write the commit's inputs and advance the state, on `stream` (a cudaStream_t passed as an
// address). Device pointers: cells int64 [ELPIS_TREE_CELLS], ids int64 [run], bad int32 [run], state int64
// [kStateWords], pages int32 [width], page_count int32 [1], record int32 [kRecordWords], moves_out int64
// [4][run - 1], plan_out uint8 [kPlanCapacity], cond_index int64 [cond_rows] (run <= cond_rows <= 16: a path has
// at most run rows), cond_kvp int32 [1]. Returns 0, -1 for arguments out of range, or the launch's cudaError_t.
int elpis_round_tail(const int64_t* cells, const int64_t* ids, const int32_t* bad, uint32_t run, int64_t* state,
                     const int32_t* pages, uint32_t width, const int32_t* page_count, int32_t* record,
                     int64_t* moves_out, uint8_t* plan_out, int64_t* cond_index, uint32_t cond_rows,
                     int32_t* cond_kvp, void* stream) {
    if (run == 0 || run > static_cast<uint32_t>(kMaxRows) || width == 0 || width > (1u << 22) || cond_rows < run ||
        cond_rows > static_cast<uint32_t>(kMaxRows)) {
        return -1;
    }
    round_tail_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
        cells, ids, bad, static_cast<int32_t>(run), state, pages, static_cast<int32_t>(width), page_count, record,
        moves_out, plan_out, cond_index, static_cast<int32_t>(cond_rows), cond_kvp);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
