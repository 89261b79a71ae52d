"""The proven acceptor as the GPU runs it: ext/accept_device.cu's PTX, as nvcc compiles it for sm_86 and
sm_90, run on the CPU by the PTX interpreter (tests/kernels/ptx_interp.py), one decision per launch.

A sample of every reference-table section gives the table's outputs, and decisions with fields pushed out of
the domain give the CPU library's error codes (elpis.accept.batch). The GPU test runs the whole table on a
GPU (tests/accept/test_device_acceptor.py, `-m gpu`); this one runs in CI, which has nvcc and no GPU. It is
there because the compiler, not only the source, can be wrong: nvcc 13.0 miscompiled the commit plan that the
round's decision inlines beside this code (patches/kernels/gdn_tree_plan.cuh, device calls 142-146).
"""

from __future__ import annotations

import numpy as np
import pytest

import elpis.accept
from elpis import nvcc
from elpis.accept import abi, device
from tests.kernels.ptx_interp import Machine, PtxProgram
from tests.nvcc_marks import needs_nvcc

pytestmark = needs_nvcc

PER_SECTION = 100  # decisions of each table section, spread over it and random


@pytest.fixture(scope="module", params=nvcc.ARCHS)
def ptx(request: pytest.FixtureRequest) -> PtxProgram:
    device.verify_build(device.ACCEPT_BUILD_DIR)
    built = nvcc.compile_to(device.SOURCE, "ptx", arch=request.param, include_dirs=(device.ACCEPT_BUILD_DIR,))
    return PtxProgram(built.read_text())


def interpreted(program: PtxProgram, kind: str, cells: np.ndarray) -> dict[str, np.ndarray]:
    """The kind's kernel on `cells`, decision i as block i of one-thread blocks; outputs poisoned first."""
    n = len(cells)
    out = {"codes": np.full(n, -99, dtype=np.int32)}
    if kind == "tree":
        out["paths"] = np.full(n, 0xDEAD, dtype=np.uint64)
    if kind == "masks":
        out["depth"] = np.full((n, abi.MAX_ROWS), 0xEE, dtype=np.uint8)
        out["ancestors"] = np.full((n, abi.MAX_ROWS), 0xEEEE, dtype=np.uint16)
    m = Machine()
    at = {name: m.put(value) for name, value in {"cells": np.ascontiguousarray(cells), **out}.items()}
    entry = program.entry(f"{kind}_kernel")
    for i in range(n):
        m.run(entry, [at["cells"], n, *(at[name] for name in out)], block=i, blocks=n)
    return {name: m.get(at[name], value) for name, value in out.items()}


def test_a_sample_of_the_reference_table_decides_as_the_table(ptx: PtxProgram) -> None:
    rng = np.random.default_rng(7)
    for section in device.pack_table().sections:
        n = len(section.cells)
        rows = np.unique(np.concatenate([np.linspace(0, n - 1, PER_SECTION // 2).astype(np.int64),
                                         rng.integers(0, n, PER_SECTION // 2)]))  # fmt: skip
        got = interpreted(ptx, section.kind, section.cells[rows])
        for name, want in section.expected.items():
            same = np.array_equal(got[name].astype(np.int64), want[rows].astype(np.int64))
            assert same, (section.name, name)


def test_decisions_out_of_the_domain_get_the_cpu_librarys_codes(ptx: PtxProgram) -> None:
    rng = np.random.default_rng(8)
    bad_fields = {  # (column, values) pairs that the checked entries refuse, each with its own code
        "chain": [(abi.CHAIN_K, [-1, 17]), (abi.CHAIN_BUDGET, [0, 2**48]), (abi.CHAIN_NSTOPS, [-1, 5]),
                  (abi.CHAIN_DRAFT, [-1, 2**32])],
        "tree": [(abi.TREE_ROWS, [0, 17]), (abi.TREE_BUDGET, [0, -5]), (abi.TREE_NSTOPS, [5]),
                 (abi.TREE_PARENTS, [0]), (abi.TREE_PARENTS + 3, [3, -1]), (abi.TREE_DRAFT, [2**33])],
        "masks": [(abi.MASKS_ROWS, [0, 17]), (abi.MASKS_PARENTS, [0, 5]), (abi.MASKS_PARENTS + 3, [7])],
    }  # fmt: skip
    sections = {s.kind: s for s in device.pack_table().sections}  # one section of each kind
    for kind, faults in bad_fields.items():
        cells = sections[kind].cells[rng.integers(0, len(sections[kind].cells), 24)].copy()
        for row in range(len(cells)):
            column, values = faults[row % len(faults)]
            cells[row, column] = values[int(rng.integers(len(values)))]
        want = elpis.accept.batch(kind, cells)
        got = interpreted(ptx, kind, cells)
        assert (got["codes"] < 0).sum() >= len(cells) // 2, f"{kind}: too few refusals to mean much"
        assert got["codes"].tolist() == want["codes"].astype(np.int64).tolist(), kind
        if kind == "masks":  # a refused decision's rows are zero on the GPU (the CPU entry leaves them)
            refused = got["codes"] != 0
            assert not got["depth"][refused].any() and not got["ancestors"][refused].any()
