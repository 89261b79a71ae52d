/* The proven acceptor as CUDA device code.
 *
 * `acceptors.c` is the C that `make build` generates from the proved Bend implementation (build/accept/).
 * Every function in it carries ELPIS_FN, which acceptors.h defines as `__host__ __device__` under nvcc, so
 * the very same text the CPU library is compiled from becomes device code here; nothing is re-implemented.
 *
 * Around it, the checked entries of accept_checks.h (elpis_check_chain / elpis_check_tree /
 * elpis_check_masks, and elpis_check_pack_path) are the very text the CPU glue (ext/elpis_glue.c) runs,
 * compiled here for host and device: the same packed int64 cell layout (elpis_glue.h), the same validation
 * in the same order with the same error codes, the same two calls with different poison in every unused
 * slot, and the same output range checks. So a decision gives byte for byte the CPU library's result,
 * which elpis/accept/device.py checks over the whole reference table. Like the glue, this holds no
 * decision logic: which tokens are committed is decided only by the generated code.
 *
 * Header-only on purpose: our CUDA libraries are built without relocatable device code, so a kernel that
 * decides on the GPU (the round pipeline) includes this header, once per library, and calls
 * elpis_check_chain / elpis_check_tree / elpis_check_masks (or the raw generated functions
 * elpis_chain_accept, elpis_tree_accept, elpis_tree_masks with already-validated inputs). The
 * entries are __host__ __device__: ext/accept_device.cu also exposes them on the host, so CPU tests run
 * this exact code over the table without a GPU.
 */
#ifndef ELPIS_ACCEPT_DEVICE_CUH
#define ELPIS_ACCEPT_DEVICE_CUH

#include <stdint.h>

#include "acceptors.c"     /* the generated acceptors (build/accept/, or a test's mutated copy) */
#include "accept_checks.h" /* the checked entries, the very text the CPU glue runs */

/* A masks decision into rows of the output arrays; a refused one gets zero rows (the CPU batch entry
 * leaves them unwritten), so device outputs are never uninitialised memory. */
ELPIS_CHECK_FN int32_t elpis_dev_masks_row(const int64_t *cells, uint8_t depth[ELPIS_MAX_ROWS],
                                           uint16_t ancestors[ELPIS_MAX_ROWS]) {
    const int32_t code = elpis_check_masks(cells, depth, ancestors);
    if (code != 0) {
        for (uint32_t r = 0; r < ELPIS_MAX_ROWS; r++) {
            depth[r] = 0;
            ancestors[r] = 0;
        }
    }
    return code;
}

#endif
