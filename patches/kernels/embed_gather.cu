// The embedding rows of a captured forward's tokens, gathered on the GPU (issue 9, item 2: host time per
// round; patch exl3-embed-gather).
//
// ExLlamaV3 keeps the token embedding table (Qwen3.8: 248,320 x 5,120 fp16, 2.5 GB) in host memory and looks
// rows up on the host, so before each replayed tree verify the host gathered 16 rows, widened them to fp32 and
// uploaded them: ~0.3 ms of the path from the draft's read-back to the verify (bench/results/tree/README.md,
// session 26). Here the table is registered as mapped pinned memory once (elpis_host_register), the ids travel
// in the graph's integer upload, and this kernel, the first node of the graph, reads each row over the bus
// and writes what ExLlamaV3's Embedding.forward returns: the fp16 (or bf16) value widened to fp32, which is
// exact, times `scale` in fp32 when scale != 1 (the DFlash2 input layer's input_embedding_scale, a torch fp32
// multiply by the scalar rounded to fp32). An id outside [0, vocab) writes NaN rows and sets *error, so a
// bad id can never read outside the table nor pass unnoticed (the host checks ids before the upload too).
//
// Ampere instructions only: plain global loads of mapped host memory (sm_70+).
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte bus reads in flight per thread
constexpr uint32_t kFp16 = 0, kBf16 = 1;

// fp16 or bf16 bits widened to fp32, exactly, in integer operations (one defined result on the GPU and under
// the emulation). A NaN stays a NaN (quieted, as x86's vector conversion does; torch's CPU conversion is not
// consistent about NaN bits itself, so only finite and infinite values are promised bit for bit).
__device__ __forceinline__ float widen(uint16_t bits, uint32_t dtype) {
    if (dtype == kBf16) return __int_as_float(int(uint32_t(bits) << 16));  // bf16 is fp32's upper half
    const uint32_t sign = uint32_t(bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1fu, mant = bits & 0x3ffu;
    if (exp == 0x1fu) return __int_as_float(int(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0u)));
    if (exp != 0) return __int_as_float(int(sign | ((exp + 112u) << 23) | (mant << 13)));
    // zero or subnormal: mant x 2^-24, exact in fp32 (a normal number there)
    return __int_as_float(int(sign | uint32_t(__float_as_int(__fmul_rn(float(mant), 5.9604644775390625e-08f)))));
}

__global__ void __launch_bounds__(kThreads)
    embed_gather_kernel(const uint4* table, uint32_t dtype, uint32_t vocab, uint32_t row_words, const void* ids,
                        uint32_t id_bytes, float scale, float* out, uint32_t* error) {
    const int64_t id = id_bytes == 8 ? static_cast<const int64_t*>(ids)[blockIdx.x]
                                     : int64_t(static_cast<const int32_t*>(ids)[blockIdx.x]);
    float* dst = out + uint64_t(blockIdx.x) * row_words * 8u;
    if (id < 0 || id >= int64_t(vocab)) {
        for (uint32_t i = threadIdx.x; i < row_words * 8u; i += kThreads) dst[i] = __int_as_float(0x7fc00000);
        if (threadIdx.x == 0) *error = 1u;  // every writer writes the same word: no atomic needed
        return;
    }
    const uint4* src = table + uint64_t(id) * row_words;
    const uint32_t step = kThreads * kUnroll;
    for (uint32_t base = 0; base < row_words; base += step) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {  // every load first: the bus's latency is paid once per batch
            const uint32_t i = base + u * kThreads + threadIdx.x;
            if (i < row_words) v[u] = src[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const uint32_t i = base + u * kThreads + threadIdx.x;
            if (i >= row_words) continue;
            const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float lo = widen(uint16_t(w[j] & 0xffffu), dtype);
                float hi = widen(uint16_t(w[j] >> 16), dtype);
                if (scale != 1.0f) {
                    lo = __fmul_rn(lo, scale);
                    hi = __fmul_rn(hi, scale);
                }
                dst[8u * i + 2u * j] = lo;
                dst[8u * i + 2u * j + 1u] = hi;
            }
        }
    }
}

}  // namespace

extern "C" {

// Pin `bytes` of host memory at `host` and map it for the device; *dev receives the device's address of it.
// Returns the cudaError_t of the registration or of the lookup (0: registered).
int elpis_host_register(void* host, uint64_t bytes, void** dev) {
#ifdef ELPIS_CUDA_EMU
    (void)bytes;
    *dev = host;
    return 0;
#else
    cudaError_t err = cudaHostRegister(host, bytes, cudaHostRegisterMapped);
    if (err != cudaSuccess) return static_cast<int>(err);
    err = cudaHostGetDevicePointer(dev, host, 0);
    if (err != cudaSuccess) cudaHostUnregister(host);
    return static_cast<int>(err);
#endif
}

// Undo elpis_host_register. Returns the cudaError_t.
int elpis_host_unregister(void* host) {
#ifdef ELPIS_CUDA_EMU
    (void)host;
    return 0;
#else
    return static_cast<int>(cudaHostUnregister(host));
#endif
}

// Queue the gather of `rows` table rows on `stream` (a cudaStream_t passed as an address): out[r, :] =
// fp32(table[ids[r], :]) * scale. table: the device address of the mapped table, vocab x hidden 16-bit values
// (dtype 0: fp16, 1: bf16), 16-byte aligned, hidden a multiple of 8; ids: device int32 (id_bytes 4) or int64
// (id_bytes 8); out: device fp32 [rows, hidden]; error: a device word the kernel sets to 1 for an id out of
// range (the caller clears it). Returns 0, -1 for arguments out of range, or the launch's cudaError_t.
int elpis_embed_gather(const void* table, uint32_t dtype, uint32_t vocab, uint32_t hidden, const void* ids,
                       uint32_t id_bytes, uint32_t rows, float scale, float* out, uint32_t* error,
                       void* stream) {
    if (table == nullptr || ids == nullptr || out == nullptr || error == nullptr) return -1;
    if (dtype > kBf16 || vocab == 0 || hidden == 0 || hidden % 8 || rows == 0 || rows > 65535) return -1;
    if (id_bytes != 4 && id_bytes != 8) return -1;
    if ((reinterpret_cast<uintptr_t>(table) & 15u) || (reinterpret_cast<uintptr_t>(ids) & (id_bytes - 1))) {
        return -1;
    }
    embed_gather_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(table), dtype, vocab, hidden / 8, ids, id_bytes, scale, out, error);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
