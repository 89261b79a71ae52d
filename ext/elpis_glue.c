/* Validation, poisoning and output checks around the generated acceptors. See elpis_glue.h for the
 * cell layouts and the error codes. No decision logic lives here. */
#include "elpis_glue.h"

#include <stdbool.h>

#include "acceptors.h"

_Static_assert(sizeof(int64_t) == 8 && sizeof(uint32_t) == 4 && sizeof(int32_t) == 4, "fixed widths");
_Static_assert(ELPIS_CHAIN_TARGET + ELPIS_MAX_ROWS == ELPIS_CHAIN_CELLS, "chain layout");
_Static_assert(ELPIS_TREE_TARGET + ELPIS_MAX_ROWS == ELPIS_TREE_CELLS, "tree layout");
_Static_assert(ELPIS_MASKS_PARENTS + ELPIS_MAX_ROWS == ELPIS_MASKS_CELLS, "masks layout");

/* Two fillings of every unused slot. A correct acceptor never reads them, so both runs agree; one that
 * does read them sees a tempting value in run 0 (a matching draft, a stop, a child of the root) and a
 * repelling one in run 1, and the runs disagree. */
enum { RUNS = 2 };

static bool id_ok(int64_t v) { return v >= 0 && v <= (int64_t)UINT32_MAX; }

static bool ids_ok(const int64_t *cells, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!id_ok(cells[i])) return false;
    }
    return true;
}

static bool budget_ok(int64_t b) { return b >= 1 && b <= (int64_t)ELPIS_BUDGET_MAX; }

static bool stop_count_ok(int64_t ns) { return ns >= 0 && ns <= ELPIS_MAX_STOPS; }

/* Checks parents[0] == -1 and 0 <= parents[r] < r for the used rows. */
static bool parents_ok(const int64_t *parents, int64_t rows) {
    if (parents[0] != -1) return false;
    for (int64_t r = 1; r < rows; r++) {
        if (parents[r] < 0 || parents[r] >= r) return false;
    }
    return true;
}

static void fill_stops(uint32_t stops[ELPIS_MAX_STOPS], const int64_t *cells, uint32_t ns,
                       uint32_t poison) {
    for (uint32_t j = 0; j < ELPIS_MAX_STOPS; j++) stops[j] = j < ns ? (uint32_t)cells[j] : poison;
}

int32_t elpis_chain_checked(const int64_t *cells) {
    const int64_t k = cells[ELPIS_CHAIN_K];
    if (k < 0 || k > ELPIS_MAX_DRAFT) return ELPIS_ERR_SIZE;
    const int64_t ns = cells[ELPIS_CHAIN_NSTOPS];
    if (!stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_CHAIN_BUDGET];
    if (!budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!ids_ok(cells + ELPIS_CHAIN_STOPS, ns) || !ids_ok(cells + ELPIS_CHAIN_DRAFT, k) ||
        !ids_ok(cells + ELPIS_CHAIN_TARGET, k + 1))
        return ELPIS_ERR_ID;

    const uint32_t uk = (uint32_t)k, uns = (uint32_t)ns;
    uint32_t counts[RUNS];
    bool ends[RUNS];
    for (int run = 0; run < RUNS; run++) {
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
        fill_stops(stops, cells + ELPIS_CHAIN_STOPS, uns, run == 0 ? target[0] : ~target[0]);
        counts[run] = run == 0 ? 0 : UINT32_MAX;
        ends[run] = run != 0;
        elpis_chain_accept(uk, draft, target, uns, stops, (uint64_t)budget, &counts[run], &ends[run]);
    }
    const uint32_t count = counts[0];
    if (count != counts[1] || ends[0] != ends[1]) return ELPIS_ERR_INTERNAL;
    if (count < 1 || count > uk + 1 || (uint64_t)count > (uint64_t)budget) return ELPIS_ERR_INTERNAL;
    return (int32_t)(count << 1 | (ends[0] ? 1u : 0u));
}

int32_t elpis_tree_checked(const int64_t *cells, uint8_t path[16]) {
    const int64_t rows = cells[ELPIS_TREE_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_TREE_PARENTS;
    if (!parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;
    const int64_t ns = cells[ELPIS_TREE_NSTOPS];
    if (!stop_count_ok(ns)) return ELPIS_ERR_STOPS;
    const int64_t budget = cells[ELPIS_TREE_BUDGET];
    if (!budget_ok(budget)) return ELPIS_ERR_BUDGET;
    if (!ids_ok(cells + ELPIS_TREE_STOPS, ns) || !ids_ok(cells + ELPIS_TREE_DRAFT, rows) ||
        !ids_ok(cells + ELPIS_TREE_TARGET, rows))
        return ELPIS_ERR_ID;

    const uint32_t ur = (uint32_t)rows, uns = (uint32_t)ns;
    int32_t parents[ELPIS_MAX_ROWS];
    uint32_t paths[RUNS][ELPIS_MAX_ROWS], counts[RUNS];
    bool ends[RUNS];
    for (int run = 0; run < RUNS; run++) {
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
        fill_stops(stops, cells + ELPIS_TREE_STOPS, uns, run == 0 ? target[0] : ~target[0]);
        for (uint32_t i = 0; i < ELPIS_MAX_ROWS; i++) paths[run][i] = UINT32_MAX;
        counts[run] = run == 0 ? 0 : UINT32_MAX;
        ends[run] = run != 0;
        elpis_tree_accept(ur, parents, draft, target, uns, stops, (uint64_t)budget, paths[run],
                          &counts[run], &ends[run]);
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

int32_t elpis_masks_checked(const int64_t *cells, uint8_t depth[16], uint16_t ancestors[16]) {
    const int64_t rows = cells[ELPIS_MASKS_ROWS];
    if (rows < 1 || rows > ELPIS_MAX_ROWS) return ELPIS_ERR_SIZE;
    const int64_t *parent_cells = cells + ELPIS_MASKS_PARENTS;
    if (!parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;

    const uint32_t ur = (uint32_t)rows;
    uint32_t depths[RUNS][ELPIS_MAX_ROWS], ancs[RUNS][ELPIS_MAX_ROWS];
    for (int run = 0; run < RUNS; run++) {
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

size_t elpis_chain_batch(const int64_t *cells, size_t n, int32_t *codes) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        codes[i] = elpis_chain_checked(cells + i * ELPIS_CHAIN_CELLS);
        bad += codes[i] < 0;
    }
    return bad;
}

size_t elpis_tree_batch(const int64_t *cells, size_t n, int32_t *codes, uint64_t *paths) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t path[ELPIS_MAX_ROWS];
        const int32_t code = elpis_tree_checked(cells + i * ELPIS_TREE_CELLS, path);
        uint64_t packed = 0;
        for (uint32_t j = 0; code > 0 && j < (uint32_t)code >> 1; j++) packed |= (uint64_t)path[j] << (4 * j);
        codes[i] = code;
        paths[i] = packed;
        bad += code < 0;
    }
    return bad;
}

size_t elpis_masks_batch(const int64_t *cells, size_t n, int32_t *codes, uint8_t *depth,
                         uint16_t *ancestors) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        codes[i] = elpis_masks_checked(cells + i * ELPIS_MASKS_CELLS, depth + i * ELPIS_MAX_ROWS,
                                       ancestors + i * ELPIS_MAX_ROWS);
        bad += codes[i] < 0;
    }
    return bad;
}
