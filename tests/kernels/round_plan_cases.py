"""Cases and launches shared by the round kernels' tests. The host's reference of
`patches/kernels/round_plan.cu` (`host_plan`: the tree's size, the candidates, the tree, the verify's inputs
and the acceptor's cells, composed from the served Python) and its seeded cases (`random_block`: ties,
duplicates, the chain token among the top-k, -inf, log-probabilities above 0; `random_request`) live in
`elpis.exl3.round_check`, which checks the served builds at load; they are re-exported here. Plus the
emulated build's launches, and random verified trees for `patches/kernels/round_tail.cu`'s tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from elpis.exl3 import gdn_tree, round_check, round_plan
from elpis.exl3.round_check import (  # noqa: F401  (re-exported for the tests)
    Expected,
    Request,
    host_plan,
    poisoned_verify_inputs,
    random_block,
    random_request,
)


def random_round(rng: random.Random) -> tuple[list[int], list[int], list[int], list[int], int]:
    """`round_check.random_round` of 1..16 rows."""
    return round_check.random_round(rng, rng.randint(1, 16))


VERIFY_INPUTS = ("seqlens", "position", "ctx", "masks", "plan", "ids")  # the kernel's VerifyInputs order
# The interpreted launches' scratch block: at least the kernel's PlanScratch (elpis_round_plan_scratch_bytes;
# test_round_plan_emu.py checks the bound on the emulated build)
SCRATCH_BYTES = 4096


def _plan_call(lib, packed: np.ndarray, k: int, vocab: int, state, inputs: dict[str, np.ndarray], cells,
               record) -> int:  # fmt: skip
    """elpis_round_plan of the emulated build `lib` on numpy arrays: its return code."""
    scratch = np.zeros((lib.elpis_round_plan_scratch_bytes() + 7) // 8, dtype=np.int64)
    return lib.elpis_round_plan(
        packed.ctypes.data, packed.shape[0], k, len(inputs["ids"]), vocab, state.ctypes.data,
        *(inputs[n].ctypes.data for n in VERIFY_INPUTS), cells.ctypes.data, record.ctypes.data,
        scratch.ctypes.data, scratch.nbytes, None,
    )  # fmt: skip


def emulated_plan(lib, packed: np.ndarray, run: int, vocab: int, state: np.ndarray, *, k: int | None = None):
    """One call of the kernel's emulated build `lib` on `state` (int64 [STATE_WORDS]): the launch's error
    code, then the record, the verify inputs by name (lists) and the cells (None, None, None for a refused
    launch). Each output is poisoned first, so an unwritten one shows."""
    packed = np.ascontiguousarray(packed, dtype=np.float32)
    k = (packed.shape[1] - 2) // 2 if k is None else k
    errors = []

    def launch(packed, vocab, state, inputs, cells, record) -> None:
        errors.append(_plan_call(lib, packed, k, vocab, state, inputs, cells, record))

    words, inputs, cells = round_check.plan_outputs(launch, packed, run, vocab, state)
    if errors[0]:
        return errors[0], None, None, None
    return 0, round_plan.read_record(words), inputs, cells


def emulated_tail_launch(lib) -> Callable[[dict[str, np.ndarray]], None]:
    """round_tail.cu's emulated build as a `round_check.Launch` (numpy buffers, `round_check.buffers`)."""

    def launch(b: dict[str, np.ndarray]) -> None:
        err = lib.elpis_round_tail(
            b["cells"].ctypes.data, b["ids"].ctypes.data, b["bad"].ctypes.data, len(b["ids"]),
            b["state"].ctypes.data, b["pages"].ctypes.data, len(b["pages"]), b["page_count"].ctypes.data,
            b["record"].ctypes.data,
            b["moves_out"].ctypes.data, b["plan_out"].ctypes.data, b["cond_index"].ctypes.data,
            len(b["cond_index"]), b["cond_kvp"].ctypes.data, None,
        )  # fmt: skip
        assert err == 0

    return launch


def interpreted_tail_launch(program) -> Callable[[dict[str, np.ndarray]], None]:
    """round_tail.cu's PTX (a `ptx_interp.PtxProgram`) as a `round_check.Launch`, the arguments of
    elpis_round_tail's launch in the kernel's order."""
    from tests.kernels.ptx_interp import Machine

    def launch(b: dict[str, np.ndarray]) -> None:
        Machine().call(
            program.entry("round_tail_kernel"), b["cells"], b["ids"], b["bad"], len(b["ids"]), b["state"],
            b["pages"], len(b["pages"]), b["page_count"], b["record"], b["moves_out"], b["plan_out"],
            b["cond_index"], len(b["cond_index"]), b["cond_kvp"],
        )  # fmt: skip

    return launch


def emulated_plan_launch(lib) -> Callable[..., None]:
    """round_plan.cu's emulated build as a `round_check.PlanLaunch` (outputs filled in place)."""

    def launch(packed, vocab: int, state, inputs: dict[str, np.ndarray], cells, record) -> None:
        packed = np.ascontiguousarray(packed, dtype=np.float32)
        assert _plan_call(lib, packed, (packed.shape[1] - 2) // 2, vocab, state, inputs, cells, record) == 0

    return launch


def interpreted_plan_launch(program) -> Callable[..., None]:
    """round_plan.cu's PTX (a `ptx_interp.PtxProgram`) as a `round_check.PlanLaunch`: the verify inputs'
    addresses passed in their VerifyInputs struct, by value, as elpis_round_plan's launch does."""
    import struct

    from tests.kernels.ptx_interp import Machine

    def launch(packed, vocab: int, state, inputs: dict[str, np.ndarray], cells, record) -> None:
        m = Machine()
        at = {name: m.put(inputs[name]) for name in VERIFY_INPUTS}
        verify_inputs = struct.pack("<6Q", *at.values())
        packed = np.ascontiguousarray(packed, dtype=np.float32)
        k, run = (packed.shape[1] - 2) // 2, len(inputs["ids"])
        state_at = m.put(state.copy())
        # the scratch block the three launches share, poisoned as device memory would be
        scratch = m.put(np.full(SCRATCH_BYTES, 0xCD, dtype=np.uint8))
        m.run(program.entry("round_plan_kernel"), [m.put(packed), packed.shape[0], k, run, vocab, state_at,
                                                   scratch])  # fmt: skip
        blocks = run * (1 + gdn_tree.TAPS)  # a block a (row, part): the visit, then each tap
        for block in range(blocks):
            m.run(program.entry("round_plan_rows_kernel"), [scratch], block=block, blocks=blocks)
        cells_at, record_at = m.put(cells), m.put(record)
        m.run(program.entry("round_plan_finish_kernel"), [run, state_at, scratch, verify_inputs, cells_at,
                                                          record_at])  # fmt: skip
        cells[...] = m.get(cells_at, cells)
        record[...] = m.get(record_at, record)
        for name in VERIFY_INPUTS:
            inputs[name][...] = m.get(at[name], inputs[name])

    return launch
