/* The CPU library's exported entries around the generated acceptors. See elpis_glue.h for the cell
 * layouts and the error codes. The checks themselves live in accept_checks.h, shared with the device
 * acceptor (accept_device.cuh); no decision logic lives here. */
#include "elpis_glue.h"

#include "accept_checks.h"
#include "acceptors.h"

_Static_assert(sizeof(int64_t) == 8 && sizeof(uint32_t) == 4 && sizeof(int32_t) == 4, "fixed widths");
_Static_assert(ELPIS_CHAIN_TARGET + ELPIS_MAX_ROWS == ELPIS_CHAIN_CELLS, "chain layout");
_Static_assert(ELPIS_TREE_TARGET + ELPIS_MAX_ROWS == ELPIS_TREE_CELLS, "tree layout");
_Static_assert(ELPIS_MASKS_PARENTS + ELPIS_MAX_ROWS == ELPIS_MASKS_CELLS, "masks layout");

int32_t elpis_chain_checked(const int64_t *cells) { return elpis_check_chain(cells); }

int32_t elpis_tree_checked(const int64_t *cells, uint8_t path[16]) { return elpis_check_tree(cells, path); }

int32_t elpis_masks_checked(const int64_t *cells, uint8_t depth[16], uint16_t ancestors[16]) {
    return elpis_check_masks(cells, depth, ancestors);
}

size_t elpis_chain_batch(const int64_t *cells, size_t n, int32_t *codes) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        codes[i] = elpis_check_chain(cells + i * ELPIS_CHAIN_CELLS);
        bad += codes[i] < 0;
    }
    return bad;
}

size_t elpis_tree_batch(const int64_t *cells, size_t n, int32_t *codes, uint64_t *paths) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t path[ELPIS_MAX_ROWS];
        const int32_t code = elpis_check_tree(cells + i * ELPIS_TREE_CELLS, path);
        codes[i] = code;
        paths[i] = elpis_check_pack_path(code, path);
        bad += code < 0;
    }
    return bad;
}

size_t elpis_masks_batch(const int64_t *cells, size_t n, int32_t *codes, uint8_t *depth,
                         uint16_t *ancestors) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        codes[i] = elpis_check_masks(cells + i * ELPIS_MASKS_CELLS, depth + i * ELPIS_MAX_ROWS,
                                     ancestors + i * ELPIS_MAX_ROWS);
        bad += codes[i] < 0;
    }
    return bad;
}
