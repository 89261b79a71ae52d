"""Every CUDA source builds for sm_86 and sm_90 from one source, with Ampere instructions only.

CI has nvcc but no GPU; `.ci/run` sets ELPIS_REQUIRE_NVCC=1 so a missing compiler fails instead of skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis import nvcc
from tests.nvcc_marks import needs_nvcc

AMPERE_PROBE = r"""
#include <cstdint>
// mma.sync, ldmatrix and cp.async: the instructions our kernels are allowed to use.
extern "C" __global__ void probe(const uint32_t* a, float* out) {
    __shared__ uint32_t tile[32 * 4];
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(&tile[threadIdx.x * 4]));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(a + threadIdx.x * 4));
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    uint32_t r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
    float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(r0), "r"(r1), "r"(r2), "r"(r3), "r"(r0), "r"(r1));
    out[threadIdx.x] = d0 + d1 + d2 + d3;
}
"""

# Builds for both targets, but its sm_90 path uses a Hopper-only instruction: the check must refuse it.
HOPPER_PATH = r"""
extern "C" __global__ void probe(unsigned* out) {
#if __CUDA_ARCH__ >= 900
    unsigned pred;
    asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred));
    out[threadIdx.x] = pred;
#else
    out[threadIdx.x] = threadIdx.x == 0;
#endif
}
"""


def test_ptx_scan_ignores_comments_and_finds_hopper_instructions() -> None:
    assert nvcc.hopper_only_instructions("// wgmma.mma_async is only mentioned here\nmma.sync.aligned") == []
    assert nvcc.hopper_only_instructions("\twgmma.fence.sync.aligned;\n\tcp.async.bulk.tensor") == [
        "cp.async.bulk",
        "wgmma.",
    ]


def test_bad_arch_is_refused() -> None:
    with pytest.raises(ValueError, match="bad CUDA architecture"):
        nvcc.compile_to(Path("x.cu"), "ptx", arch="86")


@needs_nvcc
def test_ampere_probe_passes(tmp_path: Path) -> None:
    src = tmp_path / "probe.cu"
    src.write_text(AMPERE_PROBE)
    nvcc.check_ampere_only(src)


@needs_nvcc
def test_hopper_only_path_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "hopper.cu"
    src.write_text(HOPPER_PATH)
    with pytest.raises(nvcc.NvccError, match=r"elect\.sync"):
        nvcc.check_ampere_only(src)


# A template that calls a function only the device pass declares: the device pass (cubin, ptx) accepts it,
# nvcc's host pass does not (device call 85 met this in exl3_gemm_rows.cu).
HOST_PASS_ONLY_ERROR = """
#ifdef __CUDA_ARCH__
__device__ void helper(float* p) { *p = 1.0f; }
#endif
template <int N> __device__ void use(float* p) { helper(p); }
__global__ void k(float* p) { use<1>(p); }
"""


@needs_nvcc
def test_a_source_only_the_device_pass_accepts_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "host_pass.cu"
    src.write_text(HOST_PASS_ONLY_ERROR)
    nvcc.compile_to(src, "cubin", arch="sm_90", out_dir=tmp_path)  # the device pass alone accepts it
    with pytest.raises(nvcc.NvccError, match="helper"):
        nvcc.check_ampere_only(src)


@needs_nvcc
def test_compiler_errors_carry_nvccs_message(tmp_path: Path) -> None:
    src = tmp_path / "broken.cu"
    src.write_text("__global__ void k() { undeclared_name = 1; }\n")
    with pytest.raises(nvcc.NvccError, match="undeclared_name"):
        nvcc.compile_to(src, "ptx", arch="sm_86", out_dir=tmp_path)


# Every kernel build CI checks: each source as it builds by default, and the builds a registry switch selects
# (a define the served library passes), checked alike.
SWITCHED_DEFINES = {"tree_attention_mma.cu": [{"ELPIS_MMA_HADAMARD_FOLD": 1}]}  # exl3-attn-hadamard-fold
Build = tuple[Path, dict[str, int]]
KERNEL_BUILDS: list[Build] = [
    (source, defines)
    for source in nvcc.kernel_sources()
    for defines in [{}, *SWITCHED_DEFINES.get(source.name, [])]
]


def _build_id(build: Build) -> str:
    source, defines = build
    return "-".join([source.name, *(f"{k}={v}" for k, v in defines.items())])


@needs_nvcc
@pytest.mark.parametrize("build", KERNEL_BUILDS, ids=_build_id)
def test_every_kernel_builds_for_ampere_and_hopper_from_one_source(build: Build) -> None:
    source, defines = build
    nvcc.check_ampere_only(source, defines=defines)


def test_ptx_entry_instructions_counts_each_kernel_body() -> None:
    ptx = """
.visible .entry first(
	.param .u64 a
)
{
	.reg .b32 	%r<4>;
	ld.param.u64 	%rd1, [a];
$L__BB0_1:
	@%p1 bra 	$L__BB0_2;
	add.s32 	%r1, %r2, %r3;
	ret;
}
.entry second()
{
	ret;
}
"""
    assert nvcc.ptx_entry_instructions(ptx) == {"first": 4, "second": 1}


@needs_nvcc
@pytest.mark.parametrize("build", KERNEL_BUILDS, ids=_build_id)
def test_every_kernel_fits_the_instruction_cache(build: Build) -> None:
    source, defines = build
    ptx = nvcc.compile_to(source, "ptx", arch="sm_86", defines=defines).read_text()
    counts = nvcc.ptx_entry_instructions(ptx)
    assert counts, f"{source.name}: no kernel entry found in its PTX"
    limit = nvcc.MAX_KERNEL_PTX_INSTRUCTIONS
    too_long = {k: n for k, n in counts.items() if n > limit}
    assert not too_long, f"{source.name}: kernels over {limit} PTX instructions: {too_long}"


# Spills ptxas reports that are known and accepted: (source, arch, part of the mangled entry name) -> bytes of
# spill stores at most, with the reason.
SPILL_ALLOWANCE = {
    # the 16-row kernel for the 6-bit head: 128 registers hold its accumulators and two stages of words; the
    # few spilled bytes are outside its main loop (SASS read in session 11)
    ("exl3_gemm_rows.cu", "sm_86", "rows_gemm_kernelILi2ELi6E"): 16,
}


@needs_nvcc
@pytest.mark.parametrize("arch", nvcc.ARCHS)
@pytest.mark.parametrize("build", KERNEL_BUILDS, ids=_build_id)
def test_no_kernel_spills_registers(build: Build, arch: str) -> None:
    """A spill in a hot loop costs local-memory traffic every iteration (the tree attention once made 524,288
    spill requests a call): every kernel fits its registers, but the allowances above."""
    source, defines = build
    usage = nvcc.ptxas_usage(nvcc.compile_to(source, "ptx", arch=arch, defines=defines), arch)
    assert usage, f"{source.name}: ptxas reported no kernel"
    for entry, u in usage.items():
        allowed = max(
            (
                b
                for (src, a, part), b in SPILL_ALLOWANCE.items()
                if src == source.name and a == arch and part in entry
            ),
            default=0,
        )
        assert u["spill_stores"] <= allowed, f"{source.name} {arch} {entry}: {u}"


@needs_nvcc
def test_two_threads_building_the_same_output_both_get_it(tmp_path: Path) -> None:
    """A tool building variants in parallel may ask for one build twice; both calls return the library."""
    from concurrent.futures import ThreadPoolExecutor

    src = tmp_path / "probe.cu"
    src.write_text(AMPERE_PROBE)
    out_dir = tmp_path / "out"
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: nvcc.compile_to(src, "ptx", arch="sm_86", out_dir=out_dir), range(2)))
    assert built[0] == built[1] and built[0].is_file()
    assert [p.name for p in out_dir.iterdir()] == [built[0].name]  # no temporary file left behind
