// Diagnostic build of the round's decision kernel (round_tail_diag.py): patches/kernels/round_tail.cu as it
// ships, except that each place that returns the acceptor's "internal" refusal returns -1000 - its source
// line instead of -6, so a refused round says which check refused it. Plus one kernel that runs the generated
// tree acceptor on the same cells with the two poison fillings of ext/accept_checks.h and writes the raw
// outputs of both runs, to compare with the CPU acceptor.
#include "elpis_glue.h"
#undef ELPIS_ERR_INTERNAL
#define ELPIS_ERR_INTERNAL (-1000 - __LINE__)
#include "round_tail.cu"

// raw[0..1]: count of run 0 / 1; raw[2..3]: ends; raw[4 + 16 * run + i]: path of each run.
__global__ void raw_tree_kernel(const int64_t* cells, const int64_t* ids, int64_t* raw) {
    const uint32_t ur = static_cast<uint32_t>(cells[ELPIS_TREE_ROWS]);
    const uint32_t uns = static_cast<uint32_t>(cells[ELPIS_TREE_NSTOPS]);
    for (int run = 0; run < 2; run++) {
        int32_t parents[ELPIS_MAX_ROWS];
        uint32_t draft[ELPIS_MAX_ROWS], target[ELPIS_MAX_ROWS], stops[ELPIS_MAX_STOPS], path[ELPIS_MAX_ROWS];
        for (uint32_t r = 0; r < ur; r++) {
            parents[r] = static_cast<int32_t>(cells[ELPIS_TREE_PARENTS + r]);
            draft[r] = static_cast<uint32_t>(cells[ELPIS_TREE_DRAFT + r]);
            target[r] = static_cast<uint32_t>(ids[r]);
        }
        for (uint32_t r = ur; r < ELPIS_MAX_ROWS; r++) {
            parents[r] = run == 0 ? 0 : static_cast<int32_t>(r) - 1;
            draft[r] = run == 0 ? target[0] : ~target[r - 1];
            target[r] = run == 0 ? target[0] : ~target[0];
        }
        for (uint32_t j = 0; j < ELPIS_MAX_STOPS; j++)
            stops[j] = j < uns ? static_cast<uint32_t>(cells[ELPIS_TREE_STOPS + j]) : (run == 0 ? target[0] : ~target[0]);
        for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++) path[i] = UINT32_MAX;
        uint32_t count = run == 0 ? 0 : UINT32_MAX;
        bool ends = run != 0;
        elpis_tree_accept(ur, parents, draft, target, uns, stops, static_cast<uint64_t>(cells[ELPIS_TREE_BUDGET]),
                          path, &count, &ends);
        raw[run] = count;
        raw[2 + run] = ends;
        for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++) raw[4 + 16 * run + i] = path[i];
    }
}

// -G builds leave the stack size to the launch ("cannot be statically determined"): give them room.
extern "C" int elpis_diag_set_stack(size_t bytes) {
    return static_cast<int>(cudaDeviceSetLimit(cudaLimitStackSize, bytes));
}

extern "C" int elpis_raw_tree(const int64_t* cells, const int64_t* ids, int64_t* raw) {
    raw_tree_kernel<<<1, 1>>>(cells, ids, raw);
    return static_cast<int>(cudaDeviceSynchronize());
}
