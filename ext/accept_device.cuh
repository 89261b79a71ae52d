/* The proven acceptor as CUDA device code.
 *
 * `acceptors.c` is the C that `make build` generates from the proved Bend implementation (build/accept/).
 * Every function in it carries ELPIS_FN, which acceptors.h defines as `__host__ __device__` under nvcc, so
 * the very same text the CPU library is compiled from becomes device code here; nothing is re-implemented.
 *
 * Around it, one checked entry per decision kind does for one packed decision what the CPU glue
 * (ext/elpis_glue.c) does: the same packed int64 cell layout (elpis_glue.h), the same validation in the
 * same order with the same error codes, the same two calls with different poison in every unused slot,
 * and the same output range checks. So a decision gives byte for byte the CPU library's result, which
 * elpis/accept/device.py checks over the whole reference table. Like the glue, this holds no decision
 * logic: which tokens are committed is decided only by the generated code.
 *
 * Header-only on purpose: our CUDA libraries are built without relocatable device code, so a kernel that
 * decides on the GPU (the round pipeline) includes this header, once per library, and calls
 * elpis_dev_chain_checked / elpis_dev_tree_checked / elpis_dev_masks_checked (or the raw generated
 * functions elpis_chain_accept, elpis_tree_accept, elpis_tree_masks with already-validated inputs). The
 * entries are __host__ __device__: ext/accept_device.cu also exposes them on the host, so CPU tests run
 * this exact code over the table without a GPU.
 */
#ifndef ELPIS_ACCEPT_DEVICE_CUH
#define ELPIS_ACCEPT_DEVICE_CUH

#include <stdint.h>

#include "elpis_glue.h" /* cell layout, domain limits and error codes: the one definition of the ABI */
#include "acceptors.c"  /* the generated acceptors (build/accept/, or a test's mutated copy) */

#define ELPIS_DEV_FN ELPIS_FN static inline

ELPIS_DEV_FN bool elpis_dev_id_ok(int64_t v) { return v >= 0 && v <= (int64_t)UINT32_MAX; }

ELPIS_DEV_FN bool elpis_dev_ids_ok(const int64_t *cells, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!elpis_dev_id_ok(cells[i])) return false;
    }
    return true;
}

ELPIS_DEV_FN bool elpis_dev_budget_ok(int64_t b) { return b >= 1 && b <= (int64_t)ELPIS_BUDGET_MAX; }

ELPIS_DEV_FN bool elpis_dev_stop_count_ok(int64_t ns) { return ns >= 0 && ns <= ELPIS_MAX_STOPS; }

/* parents[0] == -1 and 0 <= parents[r] < r for every used row. */
ELPIS_DEV_FN bool elpis_dev_parents_ok(const int64_t *parents, int64_t rows) {
    if (parents[0] != -1) return false;
    for (int64_t r = 1; r < rows; r++) {
        if (parents[r] < 0 || parents[r] >= r) return false;
    }
    return true;
}

ELPIS_DEV_FN void elpis_dev_fill_stops(uint32_t stops[ELPIS_MAX_STOPS], const int64_t *cells, uint32_t ns,
                                       uint32_t poison) {
    for (uint32_t j = 0; j < ELPIS_MAX_STOPS; j++) stops[j] = j < ns ? (uint32_t)cells[j] : poison;
}

/* One chain decision: count << 1 | ends (>= 2), or a negative error code. */
ELPIS_DEV_FN int32_t elpis_dev_chain_checked(const int64_t *cells) {
    const int64_t k = cells[ELPIS_CHAIN_K];
    if (k < 0 || k > ELPIS_MAX_DRAFT) return ELPIS_ERR_SIZE;
    const int64_t ns = cells[ELPIS_CHAIN_NSTOPS];
    if (!elpis_dev_stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_CHAIN_BUDGET];
    if (!elpis_dev_budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!elpis_dev_ids_ok(cells + ELPIS_CHAIN_STOPS, ns) || !elpis_dev_ids_ok(cells + ELPIS_CHAIN_DRAFT, k) ||
        !elpis_dev_ids_ok(cells + ELPIS_CHAIN_TARGET, k + 1))
        return ELPIS_ERR_ID;

    const uint32_t uk = (uint32_t)k, uns = (uint32_t)ns;
    uint32_t counts[2];
    bool ends[2];
    /* Run 0 fills every unused slot with a tempting value (a matching draft, a stop), run 1 with a
     * repelling one: an acceptor that read an unused slot would make the runs disagree. */
    for (int run = 0; run < 2; run++) {
        uint32_t draft[ELPIS_MAX_DRAFT], target[ELPIS_MAX_ROWS], stops[ELPIS_MAX_STOPS];
        for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++)
            target[i] = i <= uk ? (uint32_t)cells[ELPIS_CHAIN_TARGET + i] : 0;
        for (uint32_t i = uk + 1; i < ELPIS_MAX_ROWS; i++) target[i] = run == 0 ? target[uk] : ~target[uk];
        for (uint32_t i = 0; i < ELPIS_MAX_DRAFT; i++) {
            if (i < uk)
                draft[i] = (uint32_t)cells[ELPIS_CHAIN_DRAFT + i];
            else
                draft[i] = run == 0 ? target[i] : ~target[i];
        }
        elpis_dev_fill_stops(stops, cells + ELPIS_CHAIN_STOPS, uns, run == 0 ? target[0] : ~target[0]);
        counts[run] = run == 0 ? 0 : UINT32_MAX;
        ends[run] = run != 0;
        elpis_chain_accept(uk, draft, target, uns, stops, (uint64_t)budget, &counts[run], &ends[run]);
    }
    const uint32_t count = counts[0];
    if (count != counts[1] || ends[0] != ends[1]) return ELPIS_ERR_INTERNAL;
    if (count < 1 || count > uk + 1 || (uint64_t)count > (uint64_t)budget) return ELPIS_ERR_INTERNAL;
    return (int32_t)(count << 1 | (ends[0] ? 1u : 0u));
}

/* One tree decision: count << 1 | ends, or a negative error code; path gets the committed rows, 255 after. */
ELPIS_DEV_FN int32_t elpis_dev_tree_checked(const int64_t *cells, uint8_t path[ELPIS_MAX_ROWS]) {
    const int64_t rows = cells[ELPIS_TREE_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_TREE_PARENTS;
    if (!elpis_dev_parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;
    const int64_t ns = cells[ELPIS_TREE_NSTOPS];
    if (!elpis_dev_stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_TREE_BUDGET];
    if (!elpis_dev_budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!elpis_dev_ids_ok(cells + ELPIS_TREE_STOPS, ns) ||
        !elpis_dev_ids_ok(cells + ELPIS_TREE_DRAFT, rows) ||
        !elpis_dev_ids_ok(cells + ELPIS_TREE_TARGET, rows))
        return ELPIS_ERR_ID;

    const uint32_t ur = (uint32_t)rows, uns = (uint32_t)ns;
    int32_t parents[ELPIS_MAX_ROWS];
    uint32_t paths[2][ELPIS_MAX_ROWS], counts[2];
    bool ends[2];
    for (int run = 0; run < 2; run++) {
        uint32_t draft[ELPIS_MAX_ROWS], target[ELPIS_MAX_ROWS], stops[ELPIS_MAX_STOPS];
        for (uint32_t r = 0; r < ur; r++) {
            parents[r] = (int32_t)parent_cells[r];
            draft[r] = (uint32_t)cells[ELPIS_TREE_DRAFT + r];
            target[r] = (uint32_t)cells[ELPIS_TREE_TARGET + r];
        }
        /* Run 0: extra rows look like matching children of the root; run 1: a chain of misfits. */
        for (uint32_t r = ur; r < ELPIS_MAX_ROWS; r++) {
            parents[r] = run == 0 ? 0 : (int32_t)r - 1;
            draft[r] = run == 0 ? target[0] : ~target[r - 1];
            target[r] = run == 0 ? target[0] : ~target[0];
        }
        elpis_dev_fill_stops(stops, cells + ELPIS_TREE_STOPS, uns, run == 0 ? target[0] : ~target[0]);
        for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++) paths[run][i] = UINT32_MAX;
        counts[run] = run == 0 ? 0 : UINT32_MAX;
        ends[run] = run != 0;
        elpis_tree_accept(ur, parents, draft, target, uns, stops, (uint64_t)budget, paths[run], &counts[run],
                          &ends[run]);
    }
    const uint32_t count = counts[0];
    if (count != counts[1] || ends[0] != ends[1]) return ELPIS_ERR_INTERNAL;
    if (count < 1 || count > ur || (uint64_t)count > (uint64_t)budget) return ELPIS_ERR_INTERNAL;
    /* The committed rows must form a root-first path of the tree. */
    if (paths[0][0] != 0 || paths[1][0] != 0) return ELPIS_ERR_INTERNAL;
    for (uint32_t i = 1; i < count; i++) {
        const uint32_t row = paths[0][i];
        if (row != paths[1][i] || row < 1 || row >= ur) return ELPIS_ERR_INTERNAL;
        if ((uint32_t)parents[row] != paths[0][i - 1]) return ELPIS_ERR_INTERNAL;
    }
    for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++) path[i] = i < count ? (uint8_t)paths[0][i] : 255;
    return (int32_t)(count << 1 | (ends[0] ? 1u : 0u));
}

/* One masks decision: 0, or a negative error code; depth and ancestors get rows [0, rows), zero after. */
ELPIS_DEV_FN int32_t elpis_dev_masks_checked(const int64_t *cells, uint8_t depth[ELPIS_MAX_ROWS],
                                             uint16_t ancestors[ELPIS_MAX_ROWS]) {
    const int64_t rows = cells[ELPIS_MASKS_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_MASKS_PARENTS;
    if (!elpis_dev_parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;

    const uint32_t ur = (uint32_t)rows;
    uint32_t depths[2][ELPIS_MAX_ROWS], ancs[2][ELPIS_MAX_ROWS];
    for (int run = 0; run < 2; run++) {
        int32_t parents[ELPIS_MAX_ROWS];
        for (uint32_t r = 0; r < ELPIS_MAX_ROWS; r++) {
            if (r < ur)
                parents[r] = (int32_t)parent_cells[r];
            else
                parents[r] = run == 0 ? 0 : (int32_t)r - 1;
            depths[run][r] = run == 0 ? UINT32_MAX : 0;
            ancs[run][r] = run == 0 ? UINT32_MAX : 0;
        }
        elpis_tree_masks(ur, parents, depths[run], ancs[run]);
    }
    for (uint32_t r = 0; r < ur; r++) {
        const uint32_t d = depths[0][r], a = ancs[0][r];
        if (d != depths[1][r] || a != ancs[1][r]) return ELPIS_ERR_INTERNAL;
        /* Range only: row r sits at depth <= r and sees itself and the root, never a later row. */
        if (d > r || (a >> r) != 1u || (a & 1u) != 1u) return ELPIS_ERR_INTERNAL;
        if ((r == 0) != (d == 0)) return ELPIS_ERR_INTERNAL;
    }
    for (uint32_t r = 0; r < ELPIS_MAX_ROWS; r++) {
        depth[r] = r < ur ? (uint8_t)depths[0][r] : 0;
        ancestors[r] = r < ur ? (uint16_t)ancs[0][r] : 0;
    }
    return 0;
}

/* A masks decision into rows of the output arrays; a refused one gets zero rows (the CPU batch entry
 * leaves them unwritten), so device outputs are never uninitialised memory. */
ELPIS_DEV_FN int32_t elpis_dev_masks_row(const int64_t *cells, uint8_t depth[ELPIS_MAX_ROWS],
                                         uint16_t ancestors[ELPIS_MAX_ROWS]) {
    const int32_t code = elpis_dev_masks_checked(cells, depth, ancestors);
    if (code != 0) {
        for (uint32_t r = 0; r < ELPIS_MAX_ROWS; r++) {
            depth[r] = 0;
            ancestors[r] = 0;
        }
    }
    return code;
}

/* A tree path packed four bits per committed row (row j in bits 4j..4j+3, zero after count), as the CPU
 * batch entry packs it. */
ELPIS_DEV_FN uint64_t elpis_dev_pack_path(int32_t code, const uint8_t path[ELPIS_MAX_ROWS]) {
    uint64_t packed = 0;
    for (uint32_t j = 0; code > 0 && j < (uint32_t)code >> 1; j++) packed |= (uint64_t)path[j] << (4 * j);
    return packed;
}

#endif
