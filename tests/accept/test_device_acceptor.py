"""The proven acceptor compiled from the same generated C as CUDA device code (elpis.accept.device).

CPU tests (nvcc, no GPU): the generated text marks every function for host and device, the device
library has no recursion and its deepest call chain fits CUDA's default stack, the exact device code
(its checked entries and the generated acceptors, compiled for the host by nvcc) reproduces the whole
reference table and the CPU library on random and invalid decisions, a mutated copy fails the check,
the packing and the decoding.
GPU tests (`-m gpu`, elpis/bench/scripts/device_part_accept.sh): the whole table on the GPU, the mutated
copy failing it there, random batches equal to the CPU acceptor's, side streams and CUDA graph capture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import elpis.accept
from elpis import nvcc
from elpis.accept import abi, device, identity, table
from elpis.accept.device import DeviceAcceptor, DeviceTableMismatch
from tests.nvcc_marks import needs_nvcc

CUDA_DEFAULT_STACK_BYTES = 1024  # cudaLimitStackSize's documented default per thread
HOST_ARCH = "sm_86"  # any target works for the host half of the library; the CUDA build caches it
# Seeds unlike the table's (elpis.accept.table), so these decisions are new to the library.
RANDOM_SEEDS = {"chain": 0xD3B1CE_01, "tree": 0xD3B1CE_02, "masks": 0xD3B1CE_03}
RANDOM_BLOCKS = {
    "chain": table.random_chain_block,
    "tree": table.random_tree_block,
    "masks": table.random_masks_block,
}


# --- helpers ------------------------------------------------------------------------------------------


def random_cells(kind: str, n: int, seed_offset: int = 0) -> np.ndarray:
    """Random in-domain decisions with, in about one row in eight, one field pushed out of the domain (or
    two, to exercise the glue's checking order), so error codes are compared too."""
    cells = RANDOM_BLOCKS[kind](RANDOM_SEEDS[kind] + seed_offset, 0, n).copy()
    rng = np.random.default_rng(RANDOM_SEEDS[kind] + seed_offset)
    size, budget, nstops, first_id = {
        "chain": (abi.CHAIN_K, abi.CHAIN_BUDGET, abi.CHAIN_NSTOPS, abi.CHAIN_STOPS),
        "tree": (abi.TREE_ROWS, abi.TREE_BUDGET, abi.TREE_NSTOPS, abi.TREE_STOPS),
        "masks": (abi.MASKS_ROWS, None, None, None),
    }[kind]
    faults: list[tuple[int, list[int]]] = [(size, [-1, 17, 2**40, 16 if kind == "chain" else 0])]
    if kind in ("chain", "tree"):
        draft = abi.CHAIN_DRAFT if kind == "chain" else abi.TREE_DRAFT
        faults += [(budget, [0, -5, 2**48, 2**62]), (nstops, [-1, 5, 99])]
        faults += [(draft, [-1, 2**32]), (first_id, [-1, 2**33])]
    if kind in ("tree", "masks"):
        first_parent = abi.TREE_PARENTS if kind == "tree" else abi.MASKS_PARENTS
        faults += [(first_parent, [0, 5]), (first_parent + 3, [3, -1, 7])]
    for row in np.flatnonzero(rng.random(n) < 0.125):
        for _ in range(1 + int(rng.random() < 0.3)):
            column, values = faults[int(rng.integers(len(faults)))]
            cells[row, column] = values[int(rng.integers(len(values)))]
    return cells


def assert_same_outputs(got: dict[str, np.ndarray], want: dict[str, np.ndarray], kind: str) -> None:
    assert set(got) == set(want), (set(got), set(want))
    codes_got, codes_want = got["codes"].astype(np.int64), want["codes"].astype(np.int64)
    bad = np.flatnonzero(codes_got != codes_want)
    assert bad.size == 0, f"{kind}: {bad.size} codes differ, first at {bad[:5].tolist()}"
    # A refused masks decision has no depth or ancestors (the CPU entry leaves its rows unwritten).
    defined = codes_want == 0 if kind == "masks" else np.ones(len(codes_want), dtype=bool)
    for name in set(want) - {"codes"}:
        assert got[name].dtype == want[name].dtype, name
        assert np.array_equal(got[name][defined], want[name][defined]), f"{kind}: {name} differs"
    if kind == "masks":
        assert not got["depth"][~defined].any() and not got["ancestors"][~defined].any()


def mutate_chain_rule(src: Path, dst: Path) -> None:
    """A copy of the generated C whose chain rule continues on a mismatch instead of stopping (the one
    `!=` comparison of tokens flipped to `==`); it still builds and passes every scan-free check."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / identity.GENERATED_H, dst / identity.GENERATED_H)
    text = (src / identity.GENERATED_C).read_text()
    code = re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group()), text, flags=re.S)
    hits = [m.start() for m in re.finditer(r"\(v_\w+ != v_\w+\)", code)]
    assert len(hits) == 1, f"expected one token inequality in the generated C, found {len(hits)}"
    at = text.index("!=", hits[0])
    (dst / identity.GENERATED_C).write_text(text[:at] + "==" + text[at + 2 :])


def log_json(line: dict[str, Any]) -> None:
    """Results for the device run's log (ELPIS_DEVICE_LOG) and the test output."""
    text = json.dumps(line, sort_keys=True)
    print(text)
    path = os.environ.get("ELPIS_DEVICE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


# --- the generated text ----------------------------------------------------------------------------


def test_every_generated_function_is_marked_for_host_and_device(build_dir: Path) -> None:
    source = (build_dir / identity.GENERATED_C).read_text()
    header = (build_dir / identity.GENERATED_H).read_text()
    assert "#define ELPIS_FN __host__ __device__" in header and re.search(r"#define ELPIS_FN\n", header)
    starts = [line for line in source.splitlines() if re.match(r"(ELPIS_FN )?(static|void)\b", line)]
    unmarked = [line for line in starts if not line.startswith("ELPIS_FN ")]
    # The exported definitions take their execution space from their declarations in acceptors.h.
    exported = {line.split("(")[0].split()[-1] for line in unmarked}
    assert exported == {"elpis_chain_accept", "elpis_tree_accept", "elpis_tree_masks"}, unmarked
    assert all(not line.startswith("void") or line.split("(")[0].split()[-1] in exported for line in unmarked)
    for name in exported:
        assert re.search(rf"^ELPIS_FN void {name}\(", header, re.M), name
    assert len(starts) - len(unmarked) > 20  # helpers and every Bend def


# --- the device library, checked on the host --------------------------------------------------------


@pytest.fixture(scope="module")
def packed(build_dir: Path) -> device.PackedTable:
    return device.pack_table()


@pytest.fixture(scope="module")
def host_library(build_dir: Path) -> DeviceAcceptor:
    """The device library built for some GPU target and used through its host entries (the tests that
    use it are marked needs_nvcc)."""
    return DeviceAcceptor.load(arch=HOST_ARCH)


@needs_nvcc
def test_the_device_code_reproduces_the_whole_table_on_the_host(
    host_library: DeviceAcceptor, packed: device.PackedTable
) -> None:
    report = host_library.check_table(packed, on="host")
    assert report.decisions == table_total() == packed.decisions
    assert set(report.sections) == {s.name for s in table.SECTIONS}


def table_total() -> int:
    return sum(s.rows for s in table.SECTIONS)


@needs_nvcc
@pytest.mark.parametrize("kind", device.KINDS)
def test_the_device_code_equals_the_cpu_library_on_random_and_invalid_decisions(
    host_library: DeviceAcceptor, acceptor: Any, kind: str
) -> None:
    cells = random_cells(kind, 6000)
    want = elpis.accept.batch(kind, cells)
    assert (want["codes"] < 0).sum() > 300  # the invalid rows really are refused, with several codes
    assert len(set(want["codes"][want["codes"] < 0].tolist())) >= (2 if kind == "masks" else 4)
    assert_same_outputs(host_library.host_outputs(kind, cells), want, kind)


@needs_nvcc
@pytest.mark.slow
def test_a_mutated_chain_rule_fails_the_table_check_on_the_host(
    build_dir: Path, packed: device.PackedTable, tmp_path: Path
) -> None:
    mutate_chain_rule(build_dir, tmp_path / "generated")
    mutant = DeviceAcceptor.load(tmp_path / "generated", arch=HOST_ARCH, out_dir=tmp_path / "cuda")
    chains = device.PackedTable([s for s in packed.sections if s.kind == "chain"])
    with pytest.raises(DeviceTableMismatch) as caught:
        mutant.check_table(chains, on="host")
    assert caught.value.mismatches > 1000
    assert len(caught.value.examples) == device.EXAMPLES
    first = caught.value.examples[0]
    assert first.startswith("chain_") and "draft=" in first and "table count=" in first and "device " in first


@needs_nvcc
@pytest.mark.parametrize("arch", nvcc.ARCHS)
def test_no_kernel_recurses_and_the_deepest_call_chain_fits_the_stack(
    arch: str, build_dir: Path, tmp_path: Path
) -> None:
    """The generated C has no recursion (self tail calls are emitted as loops), so ptxas can size every
    frame: per kernel, its frame plus the deepest chain of its callees' frames must fit STACK_BYTES, and
    STACK_BYTES must not exceed CUDA's 1 KiB default (so the device acceptor reserves nothing extra).
    A regression to recursion (NVVM does not turn self tail calls into loops) fails here, on CPU."""
    flags = nvcc._flags(arch, (), {})
    ptx_file, cubin = tmp_path / "a.ptx", tmp_path / "a.cubin"
    compiler = str(nvcc.nvcc_path())
    subprocess.run([compiler, *flags, "-ptx", str(device.SOURCE), "-o", str(ptx_file)], check=True)
    verbose = subprocess.run(
        [compiler, *flags, "-cubin", "-Xptxas", "-v", str(device.SOURCE), "-o", str(cubin)],
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    frames = {
        name: int(size)
        for name, size in re.findall(r"Function properties for (\S+)\n\s+(\d+) bytes stack frame", verbose)
    }
    assert "Recursion" not in verbose and "recursion" not in verbose, verbose
    calls = call_graph(ptx_file.read_text())
    kernels = [name for name in calls if "kernel" in name]
    assert len(kernels) == 3 and set(calls) <= set(frames), (sorted(calls), sorted(frames))

    def need(fn: str, path: tuple[str, ...]) -> int:
        assert fn not in path, f"recursion through {fn}: {path}"
        return frames[fn] + max((need(g, (*path, fn)) for g in calls[fn]), default=0)

    bounds = {kernel: need(kernel, ()) for kernel in kernels}
    log_json({"device_stack_bound_bytes": bounds, "arch": arch, "stack_bytes": device.STACK_BYTES})
    assert max(bounds.values()) <= device.STACK_BYTES <= CUDA_DEFAULT_STACK_BYTES, bounds


def call_graph(ptx: str) -> dict[str, set[str]]:
    """function or kernel -> the functions its body calls, from PTX text."""
    graph: dict[str, set[str]] = {}
    heads = list(
        re.finditer(r"^\.(?:visible |weak )?\.?(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)\(", ptx, re.M)
    )
    for i, head in enumerate(heads):
        body = ptx[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(ptx)]
        graph.setdefault(head.group(1), set()).update(
            re.findall(r"\bcall(?:\.uni)?\s+(?:\(\w+\),\s*)?(\w+)", body)
        )
    return graph


# --- packing and messages ------------------------------------------------------------------------------


def test_packed_sections_line_up_with_the_cpu_acceptor(acceptor: Any, packed: device.PackedTable) -> None:
    """Packing is the table's own block order: a few thousand decisions spread over every section, run
    through the admitted CPU library, give exactly the stored expected outputs."""
    assert [s.name for s in packed.sections] == [s.name for s in table.SECTIONS]
    for section in packed.sections:
        assert section.cells.dtype == np.int64 and section.cells.flags.c_contiguous
        assert section.cells.shape == (len(section.expected["codes"]), device.CELLS[section.kind])
        rows = np.unique(np.linspace(0, len(section.cells) - 1, 700).astype(np.int64))
        rows = np.concatenate([rows, [len(section.cells) - 1]])
        got = elpis.accept.batch(section.kind, section.cells[rows])
        want = {name: array[rows] for name, array in section.expected.items()}
        assert_same_outputs(got, want, section.name)


def test_pack_table_refuses_a_table_that_is_not_the_pinned_one(build_dir: Path, tmp_path: Path) -> None:
    forged = tmp_path / identity.TABLE
    data = bytearray((build_dir / identity.TABLE).read_bytes())
    data[-1] ^= 1
    forged.write_bytes(bytes(data))
    with pytest.raises(device.DeviceAcceptorError, match="not the pinned"):
        device.pack_table(table_path=forged)


def test_verify_build_refuses_generated_c_that_is_not_the_recorded_one(
    build_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "accept"
    shutil.copytree(build_dir, copy)
    assert device.verify_build(copy)["identity_sha256"]
    source = copy / identity.GENERATED_C
    source.write_text(source.read_text() + "\n")
    with pytest.raises(device.DeviceAcceptorError, match=r"acceptors\.c: SHA-256"):
        device.verify_build(copy)
    with pytest.raises(RuntimeError, match="acceptor not built"):
        device.verify_build(tmp_path / "missing")


def test_mismatches_are_decoded() -> None:
    chain = np.zeros(abi.CHAIN_CELLS, dtype=np.int64)
    chain[[abi.CHAIN_K, abi.CHAIN_BUDGET, abi.CHAIN_NSTOPS]] = 2, 9, 1
    chain[abi.CHAIN_STOPS], chain[abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + 2] = 7, (4, 5)
    chain[abi.CHAIN_TARGET : abi.CHAIN_TARGET + 3] = (4, 6, 7)
    section = device.PackedSection("chain_x", "chain", chain[None, :], {"codes": np.asarray([4], np.int8)})
    text = device.describe(section, 0, {"codes": np.asarray([abi.ERR_ID], np.int32)})
    assert text == (
        "chain_x #0: chain k=2 draft=[4, 5] target=[4, 6, 7] stops=[7] budget=9: "
        f"table count=2 ends=False, device error -5 ({abi.ERROR_REASONS[abi.ERR_ID]})"
    )
    tree = {"codes": np.asarray([3 << 1 | 1]), "paths": np.asarray([0x520], np.uint64)}
    assert device.decode_outputs("tree", tree, 0) == "count=3 ends=True rows=[0, 2, 5]"
    masks = {"codes": np.asarray([0]), "depth": np.zeros((1, 16), np.uint8)}
    masks["ancestors"] = np.ones((1, 16), np.uint16)
    assert device.decode_outputs("masks", masks, 0).startswith("depth=[0, 0")


@needs_nvcc
def test_decide_refuses_what_the_kernels_cannot_read(host_library: DeviceAcceptor) -> None:
    torch = pytest.importorskip("torch")
    good = torch.zeros((4, abi.CHAIN_CELLS), dtype=torch.int64)
    cases = [
        ("chain", good.numpy(), "torch tensor"),
        ("chain", good.to(torch.int32), "int64"),
        ("chain", torch.zeros((4, abi.TREE_CELLS), dtype=torch.int64), r"shape \(n, 38\)"),
        ("tree", good, r"shape \(n, 55\)"),
        ("chain", torch.zeros((abi.CHAIN_CELLS, 4), dtype=torch.int64).t(), "contiguous"),
        ("chain", good, "CUDA device"),
        ("chains", good, "unknown decision kind"),
    ]
    for kind, cells, message in cases:
        with pytest.raises(ValueError, match=message):
            host_library.decide(kind, cells)


# --- on the GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_library(build_dir: Path) -> DeviceAcceptor:
    return DeviceAcceptor.load()


@pytest.fixture(scope="module")
def gpu_packed(build_dir: Path) -> device.PackedTable:
    return device.pack_table(device="cuda")


@pytest.mark.gpu
def test_the_whole_table_on_the_gpu(gpu_library: DeviceAcceptor, gpu_packed: device.PackedTable) -> None:
    gpu_library.check_table(gpu_packed)  # warm: lazy module load, stack limit check
    report = gpu_library.check_table(gpu_packed)
    assert report.decisions == table_total()
    log_json(report.as_json())


@pytest.mark.gpu
def test_a_mutated_chain_rule_fails_the_gpu_table_check(
    build_dir: Path, gpu_packed: device.PackedTable, tmp_path: Path
) -> None:
    mutate_chain_rule(build_dir, tmp_path / "generated")
    mutant = DeviceAcceptor.load(tmp_path / "generated", out_dir=tmp_path / "cuda")
    with pytest.raises(DeviceTableMismatch) as caught:
        mutant.check_table(gpu_packed)
    assert caught.value.mismatches > 1000 and caught.value.total == table_total()
    assert caught.value.examples[0].startswith("chain_")
    log_json({"metric": "accept_mutant_gpu_mismatches", "mismatches": caught.value.mismatches})


@pytest.mark.gpu
@pytest.mark.parametrize("kind", device.KINDS)
def test_random_batches_on_the_gpu_equal_the_cpu_acceptor(
    gpu_library: DeviceAcceptor, acceptor: Any, kind: str
) -> None:
    import torch

    for offset, n in ((1, 1), (2, 127), (3, 50_000)):
        cells = random_cells(kind, n, offset)
        got = gpu_library.gpu_outputs(kind, torch.from_numpy(cells).cuda())
        assert_same_outputs(got, elpis.accept.batch(kind, cells), kind)


@pytest.mark.gpu
def test_decide_on_a_side_stream_into_preallocated_outputs_and_in_a_cuda_graph(
    gpu_library: DeviceAcceptor, acceptor: Any
) -> None:
    import torch

    cells = random_cells("tree", 4096, 9)
    want = elpis.accept.batch("tree", cells)
    on_gpu = torch.from_numpy(cells).cuda()
    out = {"codes": torch.full((4096,), 99, dtype=torch.int32, device="cuda")}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = gpu_library.decide("tree", on_gpu, out=out)
    side.synchronize()
    assert result["codes"] is out["codes"]
    assert np.array_equal(result["codes"].cpu().numpy(), want["codes"].astype(np.int32))

    graph = torch.cuda.CUDAGraph()
    out["codes"].fill_(99)
    out["paths"] = torch.zeros(4096, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        gpu_library.decide("tree", on_gpu, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert np.array_equal(out["codes"].cpu().numpy(), want["codes"].astype(np.int32))
    assert np.array_equal(out["paths"].cpu().numpy().view(np.uint64), want["paths"])


@pytest.mark.gpu
def test_admission_checks_the_table_once_per_gpu(build_dir: Path) -> None:
    first = device.admitted()
    assert device.admitted() is first
    assert first.generated_dir == build_dir.resolve()


@needs_nvcc
def test_another_kernel_can_decide_on_the_gpu_through_the_header(build_dir: Path, tmp_path: Path) -> None:
    """What the round pipeline will do: its own kernel includes accept_device.cuh and decides in place."""
    source = tmp_path / "round_probe.cu"
    source.write_text(
        '#include "accept_device.cuh"\n'
        'extern "C" __global__ void decide(const int64_t* tree, const int64_t* chain, int32_t* codes,\n'
        "                                   uint64_t* path) {\n"
        "    uint8_t rows[ELPIS_MAX_ROWS];\n"
        "    codes[0] = elpis_check_tree(tree, rows);\n"
        "    path[0] = elpis_check_pack_path(codes[0], rows);\n"
        "    codes[1] = elpis_check_chain(chain);\n"
        "}\n"
    )
    ptx = nvcc.compile_to(source, "ptx", arch="sm_86", out_dir=tmp_path).read_text()
    assert ".entry decide(" in ptx and not nvcc.hopper_only_instructions(ptx)
