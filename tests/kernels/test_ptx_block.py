"""The PTX interpreter's block mode (tests/kernels/ptx_interp.py: `Machine.run_block`) on small kernels nvcc
builds: every thread of a block, barriers, warp shuffles and the race detector. A reduction with its
barriers gives its sum and no race; the same source without one barrier is reported as a race (the detector
can fail); a butterfly of shuffles gives every lane the warp's sum; the shuffles' lane arithmetic is CUDA's
documented one; a shuffle some lanes of its mask never reach, and a barrier after a thread exited, are
refused."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from elpis import nvcc
from tests.kernels.ptx_interp import BlockReport, Entry, Machine, PtxProgram, PtxUnsupported, SyncFault
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

FULL = 0xFFFFFFFF

KERNELS = r"""
#define FULL 0xffffffffu
extern "C" __global__ void reduce(const unsigned* in, unsigned* out) {
    __shared__ unsigned s[256];
    const unsigned t = threadIdx.x;
    s[t] = in[blockIdx.x * blockDim.x + t];
#ifndef NO_FIRST_BARRIER
    __syncthreads();
#endif
    for (unsigned d = blockDim.x / 2; d > 0; d >>= 1) {
        if (t < d) s[t] += s[t + d];
#ifndef NO_LEVEL_BARRIER
        __syncthreads();
#endif
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
extern "C" __global__ void butterfly(const unsigned* in, unsigned* out) {
    unsigned v = in[threadIdx.x];
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(FULL, v, d);
    out[threadIdx.x] = v;
}
extern "C" __global__ void shuffles(const unsigned* in, unsigned* out, unsigned k) {
    const unsigned v = in[threadIdx.x], l = threadIdx.x;
    out[4 * l + 0] = __shfl_up_sync(FULL, v, k, 16);
    out[4 * l + 1] = __shfl_down_sync(FULL, v, k, 8);
    out[4 * l + 2] = __shfl_sync(FULL, v, in[32 + l], 16);
    out[4 * l + 3] = __shfl_xor_sync(FULL, v, k);
}
extern "C" __global__ void divergent(const unsigned* in, unsigned* out) {
    unsigned v = in[threadIdx.x];
    if (threadIdx.x < 16) v += __shfl_xor_sync(FULL, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}
extern "C" __global__ void early_exit(unsigned* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1u;
}
"""


def _program(tmp_path: Path, arch: str = "sm_86", **defines: int) -> PtxProgram:
    source = tmp_path / "block_kernels.cu"
    source.write_text(KERNELS)
    return PtxProgram(
        nvcc.compile_to(source, "ptx", arch=arch, defines=defines, out_dir=tmp_path).read_text()
    )


def _launch(
    entry: Entry, threads: int, inputs: np.ndarray, outputs: int, *scalars: int
) -> tuple[np.ndarray, BlockReport]:
    m = Machine()
    out = np.zeros(outputs, dtype=np.uint32)
    at_in, at_out = m.put(inputs), m.put(out)
    report = m.run_block(entry, [at_in, at_out, *scalars], threads=threads)
    return m.get(at_out, out), report


@pytest.mark.parametrize("arch", nvcc.ARCHS)
@pytest.mark.parametrize("threads", [32, 64, 256])
def test_a_reduction_with_its_barriers_sums_without_a_race(tmp_path: Path, arch: str, threads: int) -> None:
    entry = _program(tmp_path, arch).entry("reduce")
    values = np.array(random.Random(threads).choices(range(1 << 32), k=threads), dtype=np.uint32)
    out, report = _launch(entry, threads, values, 1)
    assert out[0] == int(values.astype(np.uint64).sum()) % (1 << 32)
    assert report.races == [] and report.unwritten_reads == []
    assert report.barriers == 1 + threads.bit_length() - 1  # the first and one a level


@pytest.mark.parametrize("missing", ["NO_FIRST_BARRIER", "NO_LEVEL_BARRIER"])
def test_a_reduction_without_a_barrier_is_reported_as_a_race(tmp_path: Path, missing: str) -> None:
    entry = _program(tmp_path, **{missing: 1}).entry("reduce")
    _, report = _launch(entry, 64, np.arange(64, dtype=np.uint32), 1)
    assert report.races, "no race reported"
    race = report.races[0]
    assert race.space == "shared" and race.first.thread != race.second.thread
    assert race.first.write or race.second.write
    assert "race on shared byte" in str(race)


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_a_butterfly_gives_every_lane_the_warps_sum(tmp_path: Path, arch: str) -> None:
    entry = _program(tmp_path, arch).entry("butterfly")
    for threads in (32, 64):
        values = np.array(random.Random(threads).choices(range(1 << 32), k=threads), dtype=np.uint32)
        out, report = _launch(entry, threads, values, threads)
        for w in range(threads // 32):
            assert set(out[32 * w : 32 * w + 32].tolist()) == {
                int(values[32 * w : 32 * w + 32].sum()) % (1 << 32)
            }
        assert report.shuffles == 5 * threads // 32 and report.races == []


def _cuda_shuffles(v: list[int], sources: list[int], k: int) -> list[int]:
    """up (width 16), down (width 8), an index (width 16) and xor by the CUDA programming guide's words: a
    lane keeps its own value where the source would leave its group of `width` lanes."""
    out = []
    for lane in range(32):
        up = v[lane - k] if lane % 16 >= k else v[lane]
        down = v[lane + k] if lane % 8 + k < 8 else v[lane]
        index = v[lane // 16 * 16 + sources[lane] % 16]
        out += [up, down, index, v[lane ^ k]]
    return out


@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_shuffles_read_the_lanes_cuda_names(tmp_path: Path, arch: str) -> None:
    entry = _program(tmp_path, arch).entry("shuffles")
    rng = random.Random(5)
    for k in (0, 1, 3, 7, 8, 15, 16, 31):
        values = [rng.getrandbits(32) for _ in range(32)]
        sources = [rng.getrandbits(32) for _ in range(32)]
        out, _ = _launch(entry, 32, np.array(values + sources, dtype=np.uint32), 128, k)
        assert out.tolist() == _cuda_shuffles(values, sources, k), k


def test_a_shuffle_not_every_lane_of_its_mask_reaches_is_refused(tmp_path: Path) -> None:
    entry = _program(tmp_path).entry("divergent")
    with pytest.raises(SyncFault, match="thread 16 of its warp is at line"):
        _launch(entry, 32, np.arange(32, dtype=np.uint32), 32)


def test_a_barrier_after_a_thread_exited_is_refused(tmp_path: Path) -> None:
    entry = _program(tmp_path).entry("early_exit")
    m = Machine()
    with pytest.raises(PtxUnsupported, match="exited"):
        m.run_block(entry, [m.put(np.zeros(32, dtype=np.uint32))], threads=32)
