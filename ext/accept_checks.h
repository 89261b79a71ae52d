/* The checked acceptor entries: the one definition of how a packed decision is validated, poisoned,
 * decided and range-checked, shared by the CPU glue (elpis_glue.c, plain C11) and the device acceptor
 * (accept_device.cuh, nvcc).
 *
 * Every function carries ELPIS_FN, the qualifier of the generated acceptors (acceptors.h): empty for the
 * host build, `__host__ __device__` under nvcc, so the CPU library and the GPU kernels run this same text.
 * Each entry validates every used cell in the fixed order of elpis_glue.h (the first failing check's
 * error code wins), copies the inputs into fixed-size arrays whose unused slots hold poison, calls the
 * generated function twice with two different poison fillings, requires both runs to agree, and
 * range-checks the outputs. No decision logic lives here: which tokens are committed is decided only by
 * the generated code.
 *
 * C11 only, like the glue: nothing but <stdint.h>/<stdbool.h> and our own headers. Include it after the
 * generated acceptors' header (or their C, for the device build), which defines ELPIS_FN.
 */
#ifndef ELPIS_ACCEPT_CHECKS_H
#define ELPIS_ACCEPT_CHECKS_H

#include <stdbool.h>
#include <stdint.h>

#include "acceptors.h" /* ELPIS_FN and the three generated entry points */
#include "elpis_glue.h" /* cell layout, domain limits and error codes: the one definition of the ABI */

#define ELPIS_CHECK_FN ELPIS_FN static inline

/* Two fillings of every unused slot. A correct acceptor never reads them, so both runs agree; one that
 * does read them sees a tempting value in run 0 (a matching draft, a stop, a child of the root) and a
 * repelling one in run 1, and the runs disagree. */
#define ELPIS_CHECK_RUNS 2

ELPIS_CHECK_FN bool elpis_check_id_ok(int64_t v) { return v >= 0 && v <= (int64_t)UINT32_MAX; }

ELPIS_CHECK_FN bool elpis_check_ids_ok(const int64_t *cells, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!elpis_check_id_ok(cells[i])) return false;
    }
    return true;
}

ELPIS_CHECK_FN bool elpis_check_budget_ok(int64_t b) { return b >= 1 && b <= (int64_t)ELPIS_BUDGET_MAX; }

ELPIS_CHECK_FN bool elpis_check_stop_count_ok(int64_t ns) { return ns >= 0 && ns <= ELPIS_MAX_STOPS; }

/* parents[0] == -1 and 0 <= parents[r] < r for every used row. */
ELPIS_CHECK_FN bool elpis_check_parents_ok(const int64_t *parents, int64_t rows) {
    if (parents[0] != -1) return false;
    for (int64_t r = 1; r < rows; r++) {
        if (parents[r] < 0 || parents[r] >= r) return false;
    }
    return true;
}

ELPIS_CHECK_FN void elpis_check_fill_stops(uint32_t stops[ELPIS_MAX_STOPS], const int64_t *cells, uint32_t ns,
                                           uint32_t poison) {
    for (uint32_t j = 0; j < ELPIS_MAX_STOPS; j++) stops[j] = j < ns ? (uint32_t)cells[j] : poison;
}

/* One chain decision: count << 1 | ends (>= 2), or a negative error code. */
ELPIS_CHECK_FN int32_t elpis_check_chain(const int64_t *cells) {
    const int64_t k = cells[ELPIS_CHAIN_K];
    if (k < 0 || k > ELPIS_MAX_DRAFT) return ELPIS_ERR_SIZE;
    const int64_t ns = cells[ELPIS_CHAIN_NSTOPS];
    if (!elpis_check_stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_CHAIN_BUDGET];
    if (!elpis_check_budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!elpis_check_ids_ok(cells + ELPIS_CHAIN_STOPS, ns) ||
        !elpis_check_ids_ok(cells + ELPIS_CHAIN_DRAFT, k) ||
        !elpis_check_ids_ok(cells + ELPIS_CHAIN_TARGET, k + 1))
        return ELPIS_ERR_ID;

    const uint32_t uk = (uint32_t)k, uns = (uint32_t)ns;
    uint32_t counts[ELPIS_CHECK_RUNS];
    bool ends[ELPIS_CHECK_RUNS];
    for (int run = 0; run < ELPIS_CHECK_RUNS; run++) {
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
        elpis_check_fill_stops(stops, cells + ELPIS_CHAIN_STOPS, uns, run == 0 ? target[0] : ~target[0]);
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
ELPIS_CHECK_FN int32_t elpis_check_tree(const int64_t *cells, uint8_t path[ELPIS_MAX_ROWS]) {
    const int64_t rows = cells[ELPIS_TREE_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_TREE_PARENTS;
    if (!elpis_check_parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;
    const int64_t ns = cells[ELPIS_TREE_NSTOPS];
    if (!elpis_check_stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_TREE_BUDGET];
    if (!elpis_check_budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!elpis_check_ids_ok(cells + ELPIS_TREE_STOPS, ns) ||
        !elpis_check_ids_ok(cells + ELPIS_TREE_DRAFT, rows) ||
        !elpis_check_ids_ok(cells + ELPIS_TREE_TARGET, rows))
        return ELPIS_ERR_ID;

    const uint32_t ur = (uint32_t)rows, uns = (uint32_t)ns;
    int32_t parents[ELPIS_MAX_ROWS];
    uint32_t paths[ELPIS_CHECK_RUNS][ELPIS_MAX_ROWS], counts[ELPIS_CHECK_RUNS];
    bool ends[ELPIS_CHECK_RUNS];
    for (int run = 0; run < ELPIS_CHECK_RUNS; run++) {
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
        elpis_check_fill_stops(stops, cells + ELPIS_TREE_STOPS, uns, run == 0 ? target[0] : ~target[0]);
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

/* One masks decision: 0, or a negative error code; depth and ancestors get rows [0, rows), zero after
 * (on a refusal they are left unwritten). */
ELPIS_CHECK_FN int32_t elpis_check_masks(const int64_t *cells, uint8_t depth[ELPIS_MAX_ROWS],
                                         uint16_t ancestors[ELPIS_MAX_ROWS]) {
    const int64_t rows = cells[ELPIS_MASKS_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_MASKS_PARENTS;
    if (!elpis_check_parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;

    const uint32_t ur = (uint32_t)rows;
    uint32_t depths[ELPIS_CHECK_RUNS][ELPIS_MAX_ROWS], ancs[ELPIS_CHECK_RUNS][ELPIS_MAX_ROWS];
    for (int run = 0; run < ELPIS_CHECK_RUNS; run++) {
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

/* A tree path as the batch entries return it: four bits per committed row (row j in bits 4j..4j+3),
 * zero after count and for a refused decision. */
ELPIS_CHECK_FN uint64_t elpis_check_pack_path(int32_t code, const uint8_t path[ELPIS_MAX_ROWS]) {
    uint64_t packed = 0;
    for (uint32_t j = 0; code > 0 && j < (uint32_t)code >> 1; j++) packed |= (uint64_t)path[j] << (4 * j);
    return packed;
}

#endif
