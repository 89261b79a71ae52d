// A gate in front of a pre-launched tree verify (issue 9, item 2: no host round trip the GPU waits on).
//
// The verify graph's launch costs ~1 ms of host time, and the GPU waited through it after every draft
// read-back (bench/results/tree/README.md, session 16). So the host queues the verify while the draft runs,
// before it knows the tree (elpis.exl3.verify_gate, elpis.exl3.tree_graph): first the copies of a harmless
// input set (a verify of a dummy tree at the current position, which writes only the uncommitted slots a
// discarded round writes), then this gate, then the verify graph. The gate waits until the host writes `seq`
// into `flag` (pinned host memory, read over the bus), then copies the round's real inputs from host memory
// over the harmless ones. If `timeout_ns` passes first it copies nothing, so the verify runs the harmless
// set, and `status` says so: the host then discards that round. The set a verify reads is always one whole
// set, never a mix: the real set is read only after the flag, which the host writes only after the set.
//
// status (pinned host memory): seq when released, seq | kTimedOut when it timed out.
// Ampere instructions only (sm_70+: ld.acquire/ld.relaxed at system scope, __nanosleep, %globaltimer).
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr uint32_t kTimedOut = 0x80000000u;

struct GateCopy {
    uint4* dst;        // device memory
    const uint4* src;  // pinned host memory, mapped
    uint32_t words;    // 16-byte words
};

#ifdef ELPIS_CUDA_EMU
}  // namespace
#include <chrono>
#include <thread>
namespace {
inline uint32_t load_acquire_sys(const uint32_t* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
inline uint4 load_relaxed_sys(const uint4* p) { return *p; }
inline void store_relaxed_sys(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline uint64_t global_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
}
inline void nap() { std::this_thread::yield(); }
#else
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Host memory written by the host after this kernel started: a system-scope load, never an L1 line.
__device__ __forceinline__ uint4 load_relaxed_sys(const uint4* p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ void store_relaxed_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void nap() { __nanosleep(500); }  // each poll crosses the bus anyway
#endif

__device__ __forceinline__ void copy_words(const GateCopy& c) {
    const uint32_t step = kThreads * kUnroll;
    for (uint32_t base = 0; base < c.words; base += step) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {  // all loads first: kUnroll bus reads in flight per thread
            const uint32_t i = base + u * kThreads + threadIdx.x;
            if (i < c.words) v[u] = load_relaxed_sys(c.src + i);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const uint32_t i = base + u * kThreads + threadIdx.x;
            if (i < c.words) c.dst[i] = v[u];
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    verify_gate_kernel(const uint32_t* flag, uint32_t seq, uint64_t timeout_ns, uint32_t* status, GateCopy a,
                       GateCopy b) {
    __shared__ uint32_t released;
    if (threadIdx.x == 0) {
        const uint64_t start = global_ns();
        uint32_t seen = load_acquire_sys(flag);
        while (seen != seq && global_ns() - start < timeout_ns) {
            nap();
            seen = load_acquire_sys(flag);
        }
        released = seen == seq ? 1u : 0u;
        store_relaxed_sys(status, released ? seq : (seq | kTimedOut));
    }
    __syncthreads();
    if (!released) return;
    copy_words(a);
    copy_words(b);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

extern "C" {

unsigned elpis_verify_gate_timed_out_bit(void) { return kTimedOut; }

// The device's address of pinned host memory (the same address under unified addressing). Returns the
// cudaError_t of the lookup.
int elpis_host_device_pointer(void* host, void** dev) {
#ifdef ELPIS_CUDA_EMU
    *dev = host;
    return 0;
#else
    return static_cast<int>(cudaHostGetDevicePointer(dev, host, 0));
#endif
}

// Queue the gate on `stream` (a cudaStream_t passed as an address). flag and status: pinned host words the
// device can address; each copy (dst device, src pinned host, bytes) 16-byte aligned, bytes a multiple of 16
// (a copy of 0 bytes is skipped). seq in 1 .. kTimedOut - 1. Returns 0, -1 for arguments out of range, or
// the launch's cudaError_t.
int elpis_verify_gate(const uint32_t* flag, uint32_t seq, uint64_t timeout_ns, uint32_t* status, void* dst_a,
                      const void* src_a, uint64_t bytes_a, void* dst_b, const void* src_b, uint64_t bytes_b,
                      void* stream) {
    if (flag == nullptr || status == nullptr || seq == 0 || seq >= kTimedOut || timeout_ns == 0) return -1;
    const uint64_t limit = uint64_t(0xffffffffu) * 16u;
    if (bytes_a % 16 || bytes_b % 16 || bytes_a > limit || bytes_b > limit) return -1;
    if ((bytes_a && (!aligned16(dst_a) || !aligned16(src_a))) ||
        (bytes_b && (!aligned16(dst_b) || !aligned16(src_b)))) {
        return -1;
    }
    const GateCopy a{static_cast<uint4*>(dst_a), static_cast<const uint4*>(src_a),
                     static_cast<uint32_t>(bytes_a / 16)};
    const GateCopy b{static_cast<uint4*>(dst_b), static_cast<const uint4*>(src_b),
                     static_cast<uint32_t>(bytes_b / 16)};
    verify_gate_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(flag, seq, timeout_ns, status, a,
                                                                            b);
    return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
