"""Fixtures shared by the kernels' tests: the CPU emulation of each round kernel (cuda_emu.py), built once a
session, and torch on one thread for the tests of small tensor ops."""

from __future__ import annotations

import ctypes

import pytest
import torch

from elpis.exl3 import round_plan, round_tail, rows_gemm
from tests.kernels import cuda_emu


@pytest.fixture(scope="session")
def round_tail_emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """patches/kernels/round_tail.cu built for the CPU, its entries bound."""
    out = tmp_path_factory.mktemp("round_tail_emu")
    return round_tail.bind(cuda_emu.build_emulated(round_tail.SOURCE, out, launches=1, needs=("gdn_plan.h",)))


@pytest.fixture(scope="session")
def round_plan_emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """patches/kernels/round_plan.cu built for the CPU, its entries bound."""
    out = tmp_path_factory.mktemp("round_plan_emu")
    return round_plan.bind(cuda_emu.build_emulated(round_plan.SOURCE, out, launches=3, needs=("gdn_plan.h",)))


@pytest.fixture(scope="session")
def rows_gemm_emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """patches/kernels/exl3_gemm_rows.cu built for the CPU on an emulated 8-multiprocessor GPU, bound."""
    built = cuda_emu.build_emulated(
        rows_gemm.SOURCE, tmp_path_factory.mktemp("rows_gemm_emu"), launches=5, needs=("gemm_schedule.h",)
    )
    built.emu_set_sms(8)  # before the first call: the kernel caches its resident-block count
    return rows_gemm.bind(built)


@pytest.fixture
def one_torch_thread():
    """Small tensor ops: on a shared 2-core machine torch's second thread only spins (80x slower there)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
