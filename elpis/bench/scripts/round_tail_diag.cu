// Diagnostic build of the round's decision kernel (round_tail_diag.py): patches/kernels/round_tail.cu as it
// ships, except that each place that returns the acceptor's "internal" refusal returns -1000 - its source
// line instead of -6, so a refused round says which check refused it. Plus kernels that show the commit plan's
// part (below).
#include "elpis_glue.h"
#undef ELPIS_ERR_INTERNAL
#define ELPIS_ERR_INTERNAL (-1000 - __LINE__)
#include "round_tail.cu"

// -G builds leave the stack size to the launch ("cannot be statically determined"): give them room.
extern "C" int elpis_diag_set_stack(size_t bytes) {
    return static_cast<int>(cudaDeviceSetLimit(cudaLimitStackSize, bytes));
}

// The commit plan of a path on the GPU, three ways (call 145: the diagnostic build above showed the round
// tail's refusals come from gdn_tree_commit_plan, line 138). out[0]: gdn_tree_commit_plan's code (the path
// copied to a local array, as the tail does); out[1]: gdn_tree_plan's code with the chain's depth and
// ancestors read from global memory (not constants the compiler can see); out[2]: elpis_gdn_plan's result
// for the chain; out[3..]: its order, load, store (16 each) and taps (16 x 4); bytes: the first plan.
__global__ void commit_plan_kernel(const int32_t* path_in, uint32_t n, const int32_t* depth_in,
                                   const uint32_t* ancestors_in, int32_t* out, uint8_t* bytes) {
    int32_t path[kMaxRows];
    for (uint32_t i = 0; i < n; i++) path[i] = path_in[i];
    GdnTreePlan a{}, b{};
    out[0] = gdn_tree_commit_plan(n, path, &a);
    out[1] = gdn_tree_plan(n, depth_in, ancestors_in, path_in, &b);
    uint64_t parents[kGdnPlanRows] = {};
    for (uint32_t r = 1; r < n; r++) parents[r] = r - 1;
    int32_t order[kGdnPlanRows], load[kGdnPlanRows], store[kGdnPlanRows];
    uint32_t taps[kGdnPlanRows][kGdnPlanTaps];
    for (int i = 0; i < kGdnPlanRows; i++) {
        order[i] = load[i] = store[i] = -9;
        for (int j = 0; j < kGdnPlanTaps; j++) taps[i][j] = 999;
    }
    out[2] = elpis_gdn_plan(n, parents, order, load, store, taps);
    for (int i = 0; i < kGdnPlanRows; i++) {
        out[3 + i] = order[i];
        out[19 + i] = load[i];
        out[35 + i] = store[i];
        for (int j = 0; j < kGdnPlanTaps; j++) out[51 + 4 * i + j] = static_cast<int32_t>(taps[i][j]);
    }
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&a);
    for (int i = 0; i < static_cast<int>(sizeof(GdnTreePlan)); i++) bytes[i] = p[i];
}

extern "C" int elpis_commit_plan_diag(const int32_t* path, uint32_t n, const int32_t* depth,
                                      const uint32_t* ancestors, int32_t* out, uint8_t* bytes) {
    commit_plan_kernel<<<1, 1>>>(path, n, depth, ancestors, out, bytes);
    return static_cast<int>(cudaDeviceSynchronize());
}

// The round tail's own steps with every intermediate written out (staged after call 146: the commit plan refuses
// in the tail's context, out of line or not, but not given a path from global memory). out[0]: the acceptor's
// code; out[1..16]: its path; out[17]: gdn_tree_commit_plan into a shared plan (as the tail); out[18]: into a
// local plan; out[19]: the same path copied through global memory first (path_copy) into a local plan.
__global__ void tail_steps_kernel(const int64_t* cells_in, const int64_t* ids, int32_t* out, int32_t* path_copy) {
    __shared__ int64_t cells[ELPIS_TREE_CELLS];
    __shared__ GdnTreePlan shared_plan;
    for (int i = 0; i < ELPIS_TREE_CELLS; i++) cells[i] = cells_in[i];
    const int64_t rows = cells[ELPIS_TREE_ROWS];
    for (int r = 0; r < rows; r++) cells[ELPIS_TREE_TARGET + r] = ids[r];
    uint8_t path[kMaxRows];
    const int32_t code = elpis_check_tree(cells, path);
    out[0] = code;
    for (int i = 0; i < kMaxRows; i++) out[1 + i] = path[i];
    const int32_t count = code >> 1;
    int32_t rows_of_path[kMaxRows];
    for (int i = 0; i < count; i++) rows_of_path[i] = path[i];
    shared_plan = GdnTreePlan{};
    out[17] = gdn_tree_commit_plan(static_cast<uint32_t>(count), rows_of_path, &shared_plan);
    GdnTreePlan local_plan{};
    out[18] = gdn_tree_commit_plan(static_cast<uint32_t>(count), rows_of_path, &local_plan);
    for (int i = 0; i < count; i++) path_copy[i] = rows_of_path[i];
    __threadfence();
    GdnTreePlan copied_plan{};
    out[19] = gdn_tree_commit_plan(static_cast<uint32_t>(count), path_copy, &copied_plan);
}

extern "C" int elpis_tail_steps(const int64_t* cells, const int64_t* ids, int32_t* out, int32_t* path_copy) {
    tail_steps_kernel<<<1, 1>>>(cells, ids, out, path_copy);
    return static_cast<int>(cudaDeviceSynchronize());
}
