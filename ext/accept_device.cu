/* Batches of acceptor decisions on the GPU, one thread per decision, from packed int64 cells (the CPU
 * glue's layout, ext/elpis_glue.h). Every decision is made by the generated acceptors compiled as device
 * code, behind the same checked entries the CPU glue runs (accept_checks.h, via accept_device.cuh); the
 * outputs are exactly those of the CPU batch entries (elpis_*_batch):
 *   chain: codes[i]                      (count << 1 | ends, or a negative error code)
 *   tree:  codes[i], paths[i]            (committed rows packed four bits each)
 *   masks: codes[i], depth[i*16 + r], ancestors[i*16 + r]  (zero rows for a refused decision)
 * The launchers take the device index, device pointers and a stream (a cudaStream_t passed as an
 * address), never synchronize, and return the launch's cudaError_t (0 on success). The same entries
 * compiled for the host (elpis_accept_host_*) let CPU tests run this exact code without a GPU.
 */
#include <cuda_runtime.h>

#include "accept_device.cuh"

namespace {

constexpr int kThreads = 128;

__global__ void chain_kernel(const int64_t *__restrict__ cells, int64_t n, int32_t *__restrict__ codes) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    codes[i] = elpis_check_chain(cells + i * ELPIS_CHAIN_CELLS);
}

__global__ void tree_kernel(const int64_t *__restrict__ cells, int64_t n, int32_t *__restrict__ codes,
                            uint64_t *__restrict__ paths) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint8_t path[ELPIS_MAX_ROWS];
    const int32_t code = elpis_check_tree(cells + i * ELPIS_TREE_CELLS, path);
    codes[i] = code;
    paths[i] = elpis_check_pack_path(code, path);
}

__global__ void masks_kernel(const int64_t *__restrict__ cells, int64_t n, int32_t *__restrict__ codes,
                             uint8_t *__restrict__ depth, uint16_t *__restrict__ ancestors) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    codes[i] = elpis_dev_masks_row(cells + i * ELPIS_MASKS_CELLS, depth + i * ELPIS_MAX_ROWS,
                                   ancestors + i * ELPIS_MAX_ROWS);
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

/* n beyond what one grid covers is refused rather than silently truncated. */
bool bad_count(int64_t n) { return n < 0 || (n + kThreads - 1) / kThreads > 0x7fffffffLL; }

/* This library links its own CUDA runtime, whose current device is per thread: follow the caller's. */
cudaError_t use_device(int device) {
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess) return err;
    return current == device ? cudaSuccess : cudaSetDevice(device);
}

}  // namespace

extern "C" {

/* Layout constants this library was compiled with, for the loader to compare with elpis.accept.abi. */
int64_t elpis_accept_device_constant(int32_t which) {
    switch (which) {
        case 0: return ELPIS_GLUE_ABI;
        case 1: return ELPIS_CHAIN_CELLS;
        case 2: return ELPIS_TREE_CELLS;
        case 3: return ELPIS_MASKS_CELLS;
        case 4: return ELPIS_MAX_ROWS;
        case 5: return ELPIS_BUDGET_MAX;
        default: return -1;
    }
}

int elpis_accept_device_chain(int device, const int64_t *cells, int64_t n, int32_t *codes, void *stream) {
    if (bad_count(n)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    const cudaError_t err = use_device(device);
    if (err != cudaSuccess) return (int)err;
    chain_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(cells, n, codes);
    return (int)cudaGetLastError();
}

int elpis_accept_device_tree(int device, const int64_t *cells, int64_t n, int32_t *codes, uint64_t *paths,
                             void *stream) {
    if (bad_count(n)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    const cudaError_t err = use_device(device);
    if (err != cudaSuccess) return (int)err;
    tree_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(cells, n, codes, paths);
    return (int)cudaGetLastError();
}

int elpis_accept_device_masks(int device, const int64_t *cells, int64_t n, int32_t *codes, uint8_t *depth,
                              uint16_t *ancestors, void *stream) {
    if (bad_count(n)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    const cudaError_t err = use_device(device);
    if (err != cudaSuccess) return (int)err;
    masks_kernel<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(cells, n, codes, depth, ancestors);
    return (int)cudaGetLastError();
}

/* The generated code has no recursion, so the kernels' static frames (sized by ptxas, checked against
 * `bytes` by tests/accept/test_device_acceptor.py) fit the default per-thread stack: this only makes
 * sure the context's limit is at least `bytes`, raising it only if something lowered it. */
int elpis_accept_device_ensure_stack(int device, size_t bytes) {
    cudaError_t err = use_device(device);
    if (err != cudaSuccess) return (int)err;
    size_t current = 0;
    err = cudaDeviceGetLimit(&current, cudaLimitStackSize);
    if (err != cudaSuccess || current >= bytes) return (int)err;
    return (int)cudaDeviceSetLimit(cudaLimitStackSize, bytes);
}

const char *elpis_accept_device_error(int code) { return cudaGetErrorString((cudaError_t)code); }

/* The same checked entries run on the host (host pointers), for tests on machines without a GPU. */
void elpis_accept_host_chain(const int64_t *cells, int64_t n, int32_t *codes) {
    for (int64_t i = 0; i < n; i++) codes[i] = elpis_check_chain(cells + i * ELPIS_CHAIN_CELLS);
}

void elpis_accept_host_tree(const int64_t *cells, int64_t n, int32_t *codes, uint64_t *paths) {
    for (int64_t i = 0; i < n; i++) {
        uint8_t path[ELPIS_MAX_ROWS];
        codes[i] = elpis_check_tree(cells + i * ELPIS_TREE_CELLS, path);
        paths[i] = elpis_check_pack_path(codes[i], path);
    }
}

void elpis_accept_host_masks(const int64_t *cells, int64_t n, int32_t *codes, uint8_t *depth,
                             uint16_t *ancestors) {
    for (int64_t i = 0; i < n; i++)
        codes[i] = elpis_dev_masks_row(cells + i * ELPIS_MASKS_CELLS, depth + i * ELPIS_MAX_ROWS,
                                       ancestors + i * ELPIS_MAX_ROWS);
}

}  // extern "C"
