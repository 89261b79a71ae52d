// The decision of a greedy tree round on the GPU, and the commit's inputs chosen by it (issue 9, item 2: no
// host round trip inside a round). Staged: built and tested under CPU emulation
// (tests/kernels/test_round_tail_emu.py), not yet served; the plan is elpis/spec/README.md, "The round on the
// GPU".
//
// After a tree verify, from device memory only:
//   cells      the round's acceptor cells (elpis.accept.abi's tree layout, TREE_CELLS int64), written by the
//              host with everything known before the verify: rows, budget, stops, parents, draft tokens;
//              the target cells are filled here;
//   ids        every row's greedy target (elpis.spec.sampling.greedy_ids: argmax, lowest id on ties; -1
//              where the row's maximum is not finite), int64 [rows];
//   bad        the row checks, int32 [rows]: nonzero for a row holding NaN or +inf or whose digest changed;
//   candidates for every end row e < kMaxRows, the commit's inputs when the committed path ends at e (the
//              path from the root to e), as the host prepares them while the verify runs
//              (elpis.exl3.round_tail.commit_candidates): the K/V slot moves (int64 [4][move_cols]) and the
//              Gated DeltaNet commit plan (plan_bytes bytes); candidate kMaxRows is the no-op one.
// One thread decides with the proven acceptor (elpis_check_tree: the generated code, as device code, with
// the checks the CPU glue runs; ext/accept_device.cuh); then the block copies the chosen candidate into the
// commit graph's input buffers. Outputs:
//   record     int32 [kRecordWords]: status (0: committed; 1: a row failed its checks; 2: a greedy maximum
//              was not finite; < 0: the acceptor's refusal code, elpis.accept.abi.ERR_*), the committed
//              count, whether the round ends the request (a stop token or the budget), the end row, the
//              path (kMaxRows entries, 255 past the count) and the committed tokens (-1 past the count);
//   moves_out, plan_out: the chosen candidate's, the no-op candidate's when the status is not 0, so a round
//              that failed its checks commits nothing and the host can still discard and recompute it.
//
// Ampere instructions only (plain loads and stores, one barrier); nothing here is arithmetic on floats.
#include <cuda_runtime.h>
#include <stdint.h>

#include "accept_device.cuh"

namespace {

constexpr int kMaxRows = ELPIS_MAX_ROWS;
constexpr int kThreads = 128;
constexpr int kNoop = kMaxRows;  // the no-op candidate
constexpr int kRecStatus = 0, kRecCount = 1, kRecEnds = 2, kRecEnd = 3, kRecPath = 4;
constexpr int kRecTokens = kRecPath + kMaxRows;
constexpr int kRecordWords = kRecTokens + kMaxRows;
constexpr int kMaxMoveCols = kMaxRows - 1;
constexpr int kMaxPlanBytes = 4096;
constexpr int32_t kFlaggedRow = 1, kNonFinite = 2;

__global__ void __launch_bounds__(kThreads)
    round_tail_kernel(const int64_t* __restrict__ cells_in, const int64_t* __restrict__ ids,
                      const int32_t* __restrict__ bad, int32_t rows, const int64_t* __restrict__ cand_moves,
                      int32_t move_cols, const uint8_t* __restrict__ cand_plans, int32_t plan_bytes,
                      int32_t* __restrict__ record, int64_t* __restrict__ moves_out,
                      uint8_t* __restrict__ plan_out) {
    __shared__ int32_t chosen;
    __shared__ int64_t cells[ELPIS_TREE_CELLS];  // shared, not on the thread's stack: the acceptor's frame
                                                 // and this one stay within CUDA's default 1 KiB
    if (threadIdx.x == 0) {
        for (int i = 0; i < ELPIS_TREE_CELLS; i++) cells[i] = cells_in[i];
        int32_t status = 0;
        for (int r = 0; r < rows; r++) {
            if (bad[r] != 0) status = kFlaggedRow;
        }
        for (int r = 0; r < rows && status == 0; r++) {
            if (ids[r] < 0) status = kNonFinite;
        }
        uint8_t path[kMaxRows];
        int32_t count = 0, ends = 0, end = -1;
        if (status == 0) {
            if (cells[ELPIS_TREE_ROWS] != rows) {
                status = ELPIS_ERR_SIZE;  // the cells describe another tree than the verify's rows
            } else {
                for (int r = 0; r < rows; r++) cells[ELPIS_TREE_TARGET + r] = ids[r];
                const int32_t code = elpis_check_tree(cells, path);
                if (code < 2) {  // a decision commits at least the anchor: count << 1 | ends >= 2
                    status = code < 0 ? code : ELPIS_ERR_INTERNAL;
                } else {
                    count = code >> 1;
                    ends = code & 1;
                    end = path[count - 1];
                }
            }
        }
        record[kRecStatus] = status;
        record[kRecCount] = count;
        record[kRecEnds] = ends;
        record[kRecEnd] = end;
        for (int i = 0; i < kMaxRows; i++) {
            const bool in = i < count;
            record[kRecPath + i] = in ? path[i] : 255;
            record[kRecTokens + i] = in ? static_cast<int32_t>(ids[path[i]]) : -1;
        }
        chosen = status == 0 ? end : kNoop;
    }
    __syncthreads();
    const int64_t* moves = cand_moves + static_cast<size_t>(chosen) * 4 * move_cols;
    for (int i = threadIdx.x; i < 4 * move_cols; i += kThreads) moves_out[i] = moves[i];
    const uint8_t* plan = cand_plans + static_cast<size_t>(chosen) * plan_bytes;
    for (int i = threadIdx.x; i < plan_bytes; i += kThreads) plan_out[i] = plan[i];
}

}  // namespace

extern "C" {

int elpis_round_tail_record_words(void) { return kRecordWords; }

// Decide the round and copy the chosen commit inputs, on `stream` (a cudaStream_t passed as an address).
// Device pointers: cells int64 [ELPIS_TREE_CELLS], ids int64 [rows], bad int32 [rows], cand_moves int64
// [kMaxRows + 1][4][move_cols], cand_plans uint8 [kMaxRows + 1][plan_bytes], record int32 [kRecordWords],
// moves_out int64 [4][move_cols], plan_out uint8 [plan_bytes]. Returns 0, -1 for arguments out of range, or
// the launch's cudaError_t.
int elpis_round_tail(const int64_t* cells, const int64_t* ids, const int32_t* bad, uint32_t rows,
                     const int64_t* cand_moves, uint32_t move_cols, const uint8_t* cand_plans, uint32_t plan_bytes,
                     int32_t* record, int64_t* moves_out, uint8_t* plan_out, void* stream) {
    if (rows == 0 || rows > static_cast<uint32_t>(kMaxRows) || move_cols > static_cast<uint32_t>(kMaxMoveCols) ||
        plan_bytes == 0 || plan_bytes > static_cast<uint32_t>(kMaxPlanBytes)) {
        return -1;
    }
    round_tail_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        cells, ids, bad, static_cast<int32_t>(rows), cand_moves, static_cast<int32_t>(move_cols), cand_plans,
        static_cast<int32_t>(plan_bytes), record, moves_out, plan_out);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
