"""The verify gate (patches/kernels/verify_gate.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: it copies the staged inputs only after the host writes its sequence number into the
flag, copies nothing when its timeout passes first (and says so in the status word), ignores another launch's
number, and refuses arguments it could misread. The GPU test is tests/exl3/test_verify_gate.py."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

from elpis.exl3 import verify_gate
from tests.kernels import cuda_emu

SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("verify_gate_emu")
    built = cuda_emu.build_emulated(verify_gate.SOURCE, out, launches=1)
    return verify_gate.bind(built)


class Block:
    """A control block (flag, status) and two copies' buffers in ordinary memory (the emulation's view)."""

    def __init__(self, words_a: int, words_b: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.words = np.zeros(8, dtype=np.uint32)
        self.src_a = rng.integers(0, 1 << 32, size=4 * words_a, dtype=np.uint32)
        self.src_b = rng.integers(0, 1 << 32, size=4 * words_b, dtype=np.uint32)
        self.dst_a = np.full(4 * words_a, 7, dtype=np.uint32)
        self.dst_b = np.full(4 * words_b, 7, dtype=np.uint32)

    def launch(self, lib: ctypes.CDLL, seq: int, timeout_ns: int) -> int:
        base = self.words.ctypes.data
        return lib.elpis_verify_gate(
            base + 4 * verify_gate.FLAG_WORD, seq, timeout_ns, base + 4 * verify_gate.STATUS_WORD,
            self.dst_a.ctypes.data, self.src_a.ctypes.data, self.dst_a.nbytes,
            self.dst_b.ctypes.data, self.src_b.ctypes.data, self.dst_b.nbytes, None,
        )  # fmt: skip

    @property
    def status(self) -> int:
        return int(self.words[verify_gate.STATUS_WORD])


def _open_later(block: Block, seq: int, delay_s: float) -> threading.Thread:
    def opener() -> None:
        time.sleep(delay_s)
        block.words[verify_gate.FLAG_WORD] = seq

    thread = threading.Thread(target=opener)
    thread.start()
    return thread


@pytest.mark.parametrize(("words_a", "words_b"), [(10240, 3), (1, 1025), (4096, 0)])
def test_the_gate_copies_once_the_host_writes_its_number(lib, words_a: int, words_b: int) -> None:
    block = Block(words_a, words_b, seed=words_a + words_b)
    opener = _open_later(block, seq=5, delay_s=0.05)
    t0 = time.monotonic()
    assert block.launch(lib, seq=5, timeout_ns=30 * SECOND) == 0  # the emulated launch runs to its end
    opener.join()
    assert time.monotonic() - t0 >= 0.04  # it waited for the flag
    assert verify_gate.gate_state(block.status, 5) == "open"
    assert np.array_equal(block.dst_a, block.src_a) and np.array_equal(block.dst_b, block.src_b)


def test_a_gate_that_times_out_copies_nothing_and_says_so(lib) -> None:
    block = Block(64, 8, seed=1)
    block.words[verify_gate.FLAG_WORD] = 4  # the previous launch's number does not open this one
    t0 = time.monotonic()
    assert block.launch(lib, seq=5, timeout_ns=SECOND // 20) == 0
    assert time.monotonic() - t0 >= 0.04
    assert verify_gate.gate_state(block.status, 5) == "timed out"
    assert block.status == 5 | verify_gate.TIMED_OUT
    assert (block.dst_a == 7).all() and (block.dst_b == 7).all()


def test_the_state_of_a_launch_reads_only_its_own_status() -> None:
    assert verify_gate.gate_state(9, 9) == "open"
    assert verify_gate.gate_state(9 | verify_gate.TIMED_OUT, 9) == "timed out"
    assert verify_gate.gate_state(-(1 << 31) | 9, 9) == "timed out"  # the word as a signed int32 reads it
    assert verify_gate.gate_state(8, 9) == "waiting"
    assert verify_gate.gate_state(8 | verify_gate.TIMED_OUT, 9) == "waiting"
    assert verify_gate.next_seq(0) == 1 and verify_gate.next_seq(41) == 42
    assert verify_gate.next_seq(verify_gate.TIMED_OUT - 1) == 1  # never 0, never the timed-out bit


def test_arguments_it_could_misread_are_refused(lib) -> None:
    block = Block(4, 4, seed=2)
    base = block.words.ctypes.data
    flag, status = base, base + 16
    a, s = block.dst_a.ctypes.data, block.src_a.ctypes.data

    def gate(seq=3, timeout=SECOND, dst=a, src=s, nbytes=64, f=flag, st=status) -> int:
        return lib.elpis_verify_gate(f, seq, timeout, st, dst, src, nbytes, None, None, 0, None)

    assert gate(seq=0) == -1 and gate(seq=verify_gate.TIMED_OUT) == -1
    assert gate(timeout=0) == -1
    assert gate(nbytes=40) == -1  # not whole 16-byte words
    assert gate(dst=a + 4) == -1 and gate(src=s + 8) == -1  # misaligned
    assert gate(f=None) == -1 and gate(st=None) == -1
    assert block.status == 0 and (block.dst_a == 7).all()  # nothing ran
    out = ctypes.c_void_p()
    assert lib.elpis_host_device_pointer(s, ctypes.byref(out)) == 0 and out.value == s
