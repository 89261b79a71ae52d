"""The gate in front of a pre-launched tree verify (`patches/kernels/verify_gate.cu`; issue 9, item 2).

A replayed tree verify's launch (about a thousand kernels) is host time the GPU sat through after every draft
read-back: ~1 ms in session 16's profiled rounds, 0.25-0.4 ms for the whole prelaunch without the profiler
(bench/results/tree/README.md, session 19). With the registry switch `exl3-verify-prelaunch` on, the round
goes:

1. the drafter queues the draft block and the copy of its candidates to pinned memory;
2. `Exl3Backend.prelaunch` queues, behind them: copies of a harmless input set (a dummy tree at the current
   position), the gate, and the verify graph of the key the next verify will use (`TreeGraphs.arm`);
3. the host waits for the candidates only, builds the tree, writes the real inputs into pinned staging and
   releases the gate (`TreeGraphs.verify`), which copies them over the harmless set; the verify runs at once.

Nothing the verify computes changes: the graph, its buffers and the values in them are those of a replay.
If the gate times out (the host never released it), the verify runs the harmless set, which writes only the
uncommitted cache slots and the key's own buffers, as a discarded round does; the status word says so, and
the backend refuses to commit that round (`LateInputs`, a round fault: it is discarded and verified again).
Every other backend call releases an armed gate first, so nothing queued later waits on it.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from elpis import nvcc
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "verify_gate.cu"
PATCH = "exl3-verify-prelaunch"
TIMED_OUT = 0x80000000  # the status bit of a gate that opened on its timeout (the kernel's kTimedOut)
TIMEOUT_S = 2.0  # how long the GPU waits for the host before it runs the harmless set
FLAG_WORD, STATUS_WORD = 0, 4  # int32 words of the pinned control block (16 bytes apart)

_VP, _U32, _U64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_verify_gate": (_VP, _U32, _U64, _VP, _VP, _VP, _U64, _VP, _VP, _U64, _VP),
    "elpis_verify_gate_timed_out_bit": (),
    "elpis_host_device_pointer": (_VP, _VP),  # the second: the address of a c_void_p that receives it
}
RESTYPES: dict[str, type] = {"elpis_verify_gate_timed_out_bit": ctypes.c_uint}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated) and check its status bit."""
    nvcc.set_signatures(lib, ENTRY_ARGS, RESTYPES)
    if lib.elpis_verify_gate_timed_out_bit() != TIMED_OUT:
        raise RuntimeError(f"verify gate kernel: timed-out bit {lib.elpis_verify_gate_timed_out_bit():#x}")
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def next_seq(seq: int) -> int:
    """The sequence number after `seq`: 1 .. TIMED_OUT - 1, wrapping (0 is the flag's initial value)."""
    return seq % (TIMED_OUT - 1) + 1


def gate_state(status: int, seq: int) -> str:
    """What the status word says of launch `seq`: "open" (released by the host), "timed out", or
    "waiting" (the word still holds an earlier launch's status)."""
    status &= 0xFFFFFFFF
    if status == seq:
        return "open"
    if status == seq | TIMED_OUT:
        return "timed out"
    return "waiting"


class VerifyGate:
    """One control block (flag and status words in pinned host memory) and its launches, one at a time."""

    def __init__(self, lib: ctypes.CDLL | None = None, timeout_s: float = TIMEOUT_S) -> None:
        import torch

        if not 0 < timeout_s <= 60:
            raise ValueError(f"a gate's timeout must be in (0, 60] s, got {timeout_s}")
        self.lib = lib if lib is not None else _library()
        self.timeout_ns = int(timeout_s * 1e9)
        self.words = torch.zeros(8, dtype=torch.int32).pin_memory()
        self.view = self.words.numpy()  # the same memory: the host's stores and loads of the two words
        base = self.device_pointer(self.words.data_ptr())
        self.flag_ptr, self.status_ptr = base + 4 * FLAG_WORD, base + 4 * STATUS_WORD
        self.seq = 0
        self.launched_at = 0.0

    def device_pointer(self, host: int) -> int:
        """The device's address of pinned host memory at `host` (the same under unified addressing)."""
        out = ctypes.c_void_p()
        err = self.lib.elpis_host_device_pointer(host, ctypes.addressof(out))
        if err or not out.value:
            raise RuntimeError(f"verify gate: host memory at {host:#x} is not mapped for the device ({err})")
        return int(out.value)

    def launch(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: int) -> int:
        """Queue the gate on `stream` (a cudaStream_t as an int); once open it copies each (device dst,
        pinned host src) pair, at most two, of equal byte sizes. Returns the launch's sequence number."""
        if len(copies) > 2:
            raise ValueError(f"a gate copies at most two buffers, got {len(copies)}")
        args: list[int] = []
        for dst, src in copies:
            nbytes = dst.numel() * dst.element_size()
            if not (dst.is_cuda and dst.is_contiguous() and src.is_contiguous() and src.is_pinned()):
                raise ValueError("a gate copies pinned contiguous host memory into a contiguous CUDA tensor")
            if src.numel() * src.element_size() != nbytes:
                raise ValueError(f"a gate copy of {nbytes} bytes from {src.numel() * src.element_size()}")
            args += [dst.data_ptr(), self.device_pointer(src.data_ptr()), nbytes]
        args += [0, 0, 0] * (2 - len(copies))
        seq = next_seq(self.seq)
        err = self.lib.elpis_verify_gate(self.flag_ptr, seq, self.timeout_ns, self.status_ptr, *args, stream)
        if err:
            raise RuntimeError(f"verify gate: {'arguments refused' if err < 0 else f'CUDA error {err}'}")
        self.seq, self.launched_at = seq, time.monotonic()
        return seq

    def release(self, seq: int) -> None:
        """Open launch `seq`: every store the host made before this one is what the gate copies."""
        self.view[FLAG_WORD] = seq

    def state(self, seq: int) -> str:
        return gate_state(int(self.view[STATUS_WORD]), seq)
