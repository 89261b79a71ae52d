/* Hand-written glue around the generated acceptors (acceptors.c).
 *
 * Every entry takes one packed int64 cell buffer, validates every used cell, copies the inputs into
 * fixed-size arrays whose unused slots hold poison, calls the generated function twice with two
 * different poison fillings, requires both runs to agree, and range-checks the outputs. The glue holds
 * no decision logic: which tokens are committed is decided only by the generated code.
 *
 * Error codes (negative, checked in this fixed order; the first failing check wins):
 *   -1  bad size:   chain k outside 0..15, tree/masks rows outside 1..16
 *   -2  bad parent: parents[0] != -1, or parents[r] outside 0..r-1 for 1 <= r < rows (tree, masks)
 *   -3  bad stop count: outside 0..4
 *   -4  bad budget: outside 1..2^48-1
 *   -5  bad id: a used draft, target or stop cell outside 0..2^32-1
 *   -6  internal: the generated code's outputs are out of range, or the two poison runs disagree
 *       (it read an unused slot or left an output unwritten). Never caused by the caller's input.
 * Success returns count << 1 | ends (always >= 2) for chain and tree, 0 for masks.
 */
#ifndef ELPIS_GLUE_H
#define ELPIS_GLUE_H

#include <stddef.h>
#include <stdint.h>

#define ELPIS_GLUE_ABI 1

#define ELPIS_MAX_DRAFT 15
#define ELPIS_MAX_ROWS 16
#define ELPIS_MAX_STOPS 4
#define ELPIS_BUDGET_MAX 281474976710655 /* 2^48 - 1 */

#define ELPIS_ERR_SIZE (-1)
#define ELPIS_ERR_PARENT (-2)
#define ELPIS_ERR_STOPS (-3)
#define ELPIS_ERR_BUDGET (-4)
#define ELPIS_ERR_ID (-5)
#define ELPIS_ERR_INTERNAL (-6)

/* Chain cells: k, budget, stop count, stops[4], draft[15], target[16]. */
#define ELPIS_CHAIN_K 0
#define ELPIS_CHAIN_BUDGET 1
#define ELPIS_CHAIN_NSTOPS 2
#define ELPIS_CHAIN_STOPS 3
#define ELPIS_CHAIN_DRAFT 7
#define ELPIS_CHAIN_TARGET 22
#define ELPIS_CHAIN_CELLS 38

/* Tree cells: rows, budget, stop count, stops[4], parents[16], draft[16], target[16]. */
#define ELPIS_TREE_ROWS 0
#define ELPIS_TREE_BUDGET 1
#define ELPIS_TREE_NSTOPS 2
#define ELPIS_TREE_STOPS 3
#define ELPIS_TREE_PARENTS 7
#define ELPIS_TREE_DRAFT 23
#define ELPIS_TREE_TARGET 39
#define ELPIS_TREE_CELLS 55

/* Mask cells: rows, parents[16]. */
#define ELPIS_MASKS_ROWS 0
#define ELPIS_MASKS_PARENTS 1
#define ELPIS_MASKS_CELLS 17

int32_t elpis_chain_checked(const int64_t *cells);
/* path receives the committed rows [0, count); the rest is left as 255. */
int32_t elpis_tree_checked(const int64_t *cells, uint8_t path[16]);
/* depth and ancestors receive rows [0, rows); the rest is zero. */
int32_t elpis_masks_checked(const int64_t *cells, uint8_t depth[16], uint16_t ancestors[16]);

/* Batch entries: decision i reads cells[i * CELLS ...]; codes[i] gets the single-call result. Tree
 * paths are packed four bits per committed row (row j of the path in bits 4j..4j+3, zero after count).
 * Each returns how many codes are negative. */
size_t elpis_chain_batch(const int64_t *cells, size_t n, int32_t *codes);
size_t elpis_tree_batch(const int64_t *cells, size_t n, int32_t *codes, uint64_t *paths);
size_t elpis_masks_batch(const int64_t *cells, size_t n, int32_t *codes, uint8_t *depth,
                         uint16_t *ancestors);

#endif
