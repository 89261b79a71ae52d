"""The head of a greedy tree round on the GPU (`patches/kernels/round_plan.cu`; issue 9, item 2).

Staged, not yet served (the plan: elpis/spec/README.md, "The round on the GPU"). After the draft block, the
kernel turns the block's candidates (still on the device, in `drafter.pack_candidates`' layout) into the tree
the host would build (`spec.tree.tree_shape`, `drafter.unpack_candidates`, `spec.tree.build_tree`) and writes
every input of the captured tree verify that depends on it (`TreeGraphs._int_values` but the block table:
kvp, position ids, masks, the Gated DeltaNet plan, token ids) and the acceptor's cells for `round_tail`. What
changes between rounds comes from a state block in device memory (`state_block`), so one captured graph serves
every round. `read_record` turns the kernel's record into a `PlannedTree`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from elpis import nvcc
from elpis.accept import abi
from elpis.exl3 import gdn_tree
from elpis.exl3.tensors import check_one_device, check_tensor
from elpis.paths import PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "round_plan.cu"
MAX_ROWS = abi.MAX_ROWS
MAX_BLOCK_ROWS = MAX_ROWS - 1  # draft depths the kernel reads
MAX_K = 16  # candidates per depth the kernel holds
EXACT_FLOAT32_IDS = 1 << 24  # the largest vocabulary whose ids float32 carries exactly
# The state block (int64 words), as the kernel reads it (kSt*)
STATE_ANCHOR, STATE_KVP, STATE_REMAINING, STATE_MAX_CONTEXT, STATE_TREE_BUDGET, STATE_DONE = 0, 1, 2, 3, 4, 5
STATE_NSTOPS, STATE_STOPS = 6, 7
# the request's epoch (the host's) and the rounds decided so far (round_tail advances it every round)
STATE_EPOCH = STATE_STOPS + abi.MAX_STOPS
STATE_ROUND = STATE_EPOCH + 1
STATE_WORDS = STATE_ROUND + 1
# The record (int32 words): status, rows, tokens[16], parents[16] (-1 past the rows)
REC_STATUS, REC_ROWS, REC_TOKENS = 0, 1, 2
REC_PARENTS = REC_TOKENS + MAX_ROWS
RECORD_WORDS = REC_PARENTS + MAX_ROWS
STATUS_IDLE = 1
STATUS_MESSAGES = {
    STATUS_IDLE: "idle: no room in the context, no tokens left to generate, or the request is done",
    -1: "refused: the round's state block is out of range",
    -2: "refused: a draft candidate id that float32 cannot carry (2^24 or more, or not finite)",
    -3: "refused: a draft candidate id outside the vocabulary",
    -4: "refused: a draft log-probability that is NaN or above 0",
    -5: "internal: the kernel's own checks failed",
}

_I32, _U32, _U64, _VP = ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    # packed, block rows, k, run, vocab, state, six verify inputs, cells, record, scratch, its bytes, stream
    "elpis_round_plan": (_VP, _U32, _U32, _U32, _U32, _VP, *(_VP,) * 6, _VP, _VP, _VP, _U64, _VP),
    "elpis_round_plan_record_words": (),
    "elpis_round_plan_state_words": (),
    "elpis_round_plan_plan_capacity": (),
    "elpis_round_plan_scratch_bytes": (),
}


class PlannedTree(NamedTuple):
    """What the kernel planned. status 0: a tree of `rows` rows to verify; 1 (STATUS_IDLE): nothing to do, the
    verify's inputs are the anchor alone and the acceptor's cells are refused; < 0: refused (STATUS_MESSAGES),
    as the host's tree builder raises for the same candidates."""

    status: int
    rows: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated) and check its layouts."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    sizes = (lib.elpis_round_plan_record_words(), lib.elpis_round_plan_state_words(),
             lib.elpis_round_plan_plan_capacity())  # fmt: skip
    if sizes != (RECORD_WORDS, STATE_WORDS, gdn_tree.PLAN_CAPACITY):
        raise RuntimeError(
            f"round plan kernel: record, state and plan sizes {sizes}, expected "
            f"{(RECORD_WORDS, STATE_WORDS, gdn_tree.PLAN_CAPACITY)}"
        )
    return lib


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def state_block(
    *, anchor: int, kvp: int, remaining: int, max_context: int, tree_budget: int, stops: Sequence[int],
    done: bool = False, epoch: int = 0,
) -> np.ndarray:  # fmt: skip
    """The state block's int64 words for a request at kvp with `anchor` as its last token, before its first
    round; `epoch` (0..2^31-1) tells its rounds' records from another request's."""
    if len(stops) > abi.MAX_STOPS:
        raise ValueError(f"at most {abi.MAX_STOPS} stop ids, got {len(stops)}")
    if not 0 <= epoch < 1 << 31:
        raise ValueError(f"a request epoch is 0..2^31-1 (the record carries 32 bits), got {epoch}")
    words = np.zeros(STATE_WORDS, dtype=np.int64)
    words[STATE_ANCHOR], words[STATE_KVP], words[STATE_REMAINING] = anchor, kvp, remaining
    words[STATE_MAX_CONTEXT], words[STATE_TREE_BUDGET] = max_context, tree_budget
    words[STATE_DONE] = int(done)
    words[STATE_NSTOPS] = len(stops)
    words[STATE_STOPS : STATE_STOPS + len(stops)] = stops
    words[STATE_EPOCH] = epoch
    return words


def read_record(words: Sequence[int]) -> PlannedTree:
    if len(words) != RECORD_WORDS:
        raise ValueError(f"a round plan record has {RECORD_WORDS} words, got {len(words)}")
    rows = int(words[REC_ROWS])
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"a round plan record of {rows} rows")
    tokens = tuple(int(t) for t in words[REC_TOKENS : REC_TOKENS + rows])
    parents = tuple(int(p) for p in words[REC_PARENTS : REC_PARENTS + rows])
    return PlannedTree(int(words[REC_STATUS]), rows, tokens, parents)


def plan(
    packed: torch.Tensor,
    vocab: int,
    state: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    cells: torch.Tensor,
    record: torch.Tensor,
) -> None:
    """Launch the kernel on the current stream: packed float32 [block rows, 2 + 2k] (the draft block's
    candidates), state int64 [STATE_WORDS], inputs the verify key's views (`seqlens`, `ctx` int32 [1];
    `position`, `ids` int32 [run]; `masks` int32 [2 run]; `plan` uint8 [PLAN_CAPACITY]), cells int64
    [TREE_CELLS], record int32 [RECORD_WORDS]; every one on the same device."""
    import torch

    check_tensor("packed", packed, torch.float32, (None, None))
    block_rows, width = packed.shape
    k = (width - 2) // 2
    if not (1 <= block_rows <= MAX_BLOCK_ROWS and width == 2 + 2 * k and 1 <= k <= MAX_K):
        raise ValueError(f"round plan: a candidate block of {block_rows} rows of {width} values")
    if not 1 <= vocab <= EXACT_FLOAT32_IDS:
        raise ValueError(f"round plan: a vocabulary of {vocab} ids (float32 carries ids below 2^24)")
    check_tensor("state", state, torch.int64, (STATE_WORDS,))
    check_tensor("ids", inputs["ids"], torch.int32, (None,))
    run = inputs["ids"].shape[0]
    for name, shape in (("seqlens", (1,)), ("ctx", (1,)), ("position", (run,)), ("masks", (2 * run,))):
        check_tensor(name, inputs[name], torch.int32, shape)
    check_tensor("plan", inputs["plan"], torch.uint8, (gdn_tree.PLAN_CAPACITY,))
    check_tensor("cells", cells, torch.int64, (abi.TREE_CELLS,))
    check_tensor("record", record, torch.int32, (RECORD_WORDS,))
    check_one_device("round plan", (packed, state, cells, record, *inputs.values()))
    lib = _library()
    # what the first of the kernel's three launches leaves for the other two, in 8-byte words
    words = (lib.elpis_round_plan_scratch_bytes() + 7) // 8
    scratch = torch.empty(words, dtype=torch.int64, device=packed.device)
    err = lib.elpis_round_plan(
        packed.data_ptr(), block_rows, k, run, vocab, state.data_ptr(), inputs["seqlens"].data_ptr(),
        inputs["position"].data_ptr(), inputs["ctx"].data_ptr(), inputs["masks"].data_ptr(),
        inputs["plan"].data_ptr(), inputs["ids"].data_ptr(), cells.data_ptr(), record.data_ptr(),
        scratch.data_ptr(), 8 * scratch.numel(), torch.cuda.current_stream(packed.device).cuda_stream,
    )  # fmt: skip
    if err:
        raise RuntimeError(f"round plan kernel: {'arguments refused' if err < 0 else f'CUDA error {err}'}")
