"""Tree rounds whose decisions run on the GPU (issue 9, item 2), with no host synchronisation inside a round
and the host one round behind. Served by default since session 41 (switch exl3-device-rounds, on) for
greedy requests where it applies: its GPU tests (tests/exl3/test_device_round.py), the 24 GiB test and the
whole GPU suite pass with it on, and it is 0.5-0.8 ms a round faster than host rounds at 1K and 8K (H100,
calls 153-154 and 157). Since session 56 sampled top_k requests run here too where exl3-sample-draw is on,
and requests with penalties or logit_bias where exl3-round-adjust is on, and since session 57 sampled requests
without top_k where exl3-vocab-draw is on (over their whole vocabulary; those with top_p or min_p only with
exl3-vocab-draw-heads) (`draws`; each row adjusted and drawn in the round: `_targets`), and since session 58
requests with logprobs where exl3-round-logprobs is on: each round keeps its verify's logits in its record
slot's buffer (one device copy in the round's graph), and the host computes the committed rows'
log-probabilities from them as a host round does, on a side stream, while the GPU runs the next round
(`_read`).

A host round (`elpis.spec.generate`) reads the draft's candidates back, builds the tree, fills the verify's
inputs, reads the verify's row checks and greedy tokens back, runs the acceptor and fills the commit's inputs:
two synchronisations, with the GPU idle while the host works. Here a round is queued in stream order from the
request's state block in device memory (anchor, kvp, remaining budget; `round_plan.state_block`):

  the captured draft block (its anchor and kvp copied from the state block) -> its candidates
  (the drafter's candidates: the log-softmax and top-k, on the GPU) -> `round_plan` (the tree, the verify
  key's inputs but the block table, the acceptor's cells) -> the captured verify (its embedding gathered on
  the GPU: `exl3-embed-gather`) -> the row checks and greedy targets (`sampling.greedy_ids`), in two launches
  (`verify_epilogue`) -> `round_tail` (the proven acceptor, the commit graph's inputs, the draft's
  conditioning inputs, the state block advanced) -> the captured commit -> the draft's conditioning on the
  committed path padded to a fixed row count (`DraftGraphs.condition_from`) -> both records into pinned
  memory and an event.

Since session 42 a round key's rounds after its first are one launch of a graph composed of those pieces
(`elpis.exl3.round_graph`, switch exl3-round-graph, on): the same kernels on the same addresses, with only the
two block tables' uploads (where their pages changed) and the launch left to the host.

`round()` queues the next round before it waits for the oldest one's event, so the GPU runs a round while the
host reads the one before and emits its tokens. The host chooses only what a captured graph cannot: the draft
block's and the verify's keys (their context buckets) and the block tables. A round commits at most a draft
block's rows, so while every kvp the queued rounds can reach falls in the same buckets the next round is
queued ahead; otherwise the host waits for the round in flight first. A round that fails its row checks leaves
the state alone, so the round after it (already queued) verifies the same position again. A round queued past
the request's end finds `done` set and idles (nothing committed); `drain()` waits for what is still in flight.

Each round's records travel back through their own slot (on the device and in pinned memory), stamped by the
tail with the request's epoch and the round's number. A record that is not the round the host waits for (the
copy did not land: `dropped`; an earlier round's: `repeated`; another request's: `stale`) is detected there
and read again from the round's device slot, which no later round writes before this one is read: the round's
decision is already on the GPU (it committed there), so recovering it means fetching it again, not
recomputing it. `RecordFaults` injects those faults for the tests; a corrupted verify row is the row checks'
(`corrupt`: the round is discarded and verified again).

What is committed is the acceptor's decision over the verify's own greedy tokens, as in a host round, so the
text is plain decoding's; only the tree may differ from a host round's (the row count is the budget's, cut to
the round's run). With a run choice (`choice`, `elpis.spec.run_choice`; registry switch exl3-run-choice) each
round's verify runs at the row count the choice names when the round is queued (each count's captured graphs
and buffers are kept side by side, and the state block's tree budget is rewritten in stream order when it
changes), and each round read back tells the choice what it committed; a row's logits are the same at every
row count, so the text is too. Conditioning on padded rows writes the committed rows'
K/V as the host's conditioning does only if a row's draft K/V do not depend on the rows beside it
(tests/exl3/test_draft_graph.py::test_padded_conditioning_keeps_the_committed_rows_bits); the draft only
proposes, so that matters for the acceptance rate, not the text.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from elpis.accept import abi
from elpis.backend import UNDRAWN, BackendError, DeviceRound
from elpis.exl3 import (
    round_adjust,
    round_check,
    round_graph,
    round_plan,
    round_tail,
    sample_draw,
    verify_epilogue,
    vocab_draw,
)
from elpis.exl3.draft_graph import block_pages
from elpis.exl3.tree_graph import verify_pages
from elpis.spec import sampling
from elpis.spec.faults import DROPPED, REPEATED, STALE
from elpis.spec.request import TokenLogprob
from elpis.spec.run_choice import RunChoice
from elpis.spec.sampling import MAX_TOP_LOGPROBS, SamplingParams

if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend
    from elpis.exl3.draft_graph import ConditionCaptured, DraftCaptured
    from elpis.exl3.tree_graph import Captured


PATCH = "exl3-device-rounds"  # the registry switch (patches/registry.json), read by load_backend
LOGPROBS_PATCH = "exl3-round-logprobs"  # requests with logprobs run here too (`reports_logprobs`)

# Tail statuses that discard a round (the next one verifies the same position again), as fault kinds
FAULTS = {round_tail.STATUS_FLAGGED_ROW: "corrupt", round_tail.STATUS_NON_FINITE: "corrupt"}
IN_FLIGHT = 2  # rounds queued at most: the one the host reads next and the one queued ahead of it
RECORD_WORDS = round_plan.RECORD_WORDS + round_tail.RECORD_WORDS  # a round's two records, plan then tail
ROUND_WORD = round_plan.RECORD_WORDS + round_tail.REC_ROUND  # where a round's number lies in them
EPOCH_WORD = round_plan.RECORD_WORDS + round_tail.REC_EPOCH
NOT_ARRIVED = -1  # the round number a host slot holds until its round's copy lands
TRANSIT_FAULTS = (DROPPED, REPEATED, STALE)
_EPOCHS = itertools.count(1)  # request epochs, unique in the process (the record keeps 31 bits of them)


def record_fault(words: Sequence[int], epoch: int, number: int) -> str | None:
    """Why a round's records (`RECORD_WORDS` read back) are not round `number` of request `epoch`, or None
    when they are: the copy never landed (`dropped`), another request's (`stale`), an earlier round's
    (`repeated`). A later round's cannot be there (a slot is reused only after its round is read): refused."""
    if len(words) != RECORD_WORDS:
        raise ValueError(f"a round's records are {RECORD_WORDS} words, got {len(words)}")
    got = words[ROUND_WORD]
    if got == NOT_ARRIVED:
        return DROPPED
    if words[EPOCH_WORD] != epoch:
        return STALE
    if got < number:
        return REPEATED
    if got > number:
        raise BackendError(f"round {number}'s record slot holds round {got}, which was not yet queued")
    return None


@dataclass(frozen=True)
class DeviceRoundResult:
    """One round's two records: the tree it verified and what it committed (nothing unless tail.status is
    0)."""

    plan: round_plan.PlannedTree
    tail: round_tail.RoundTail
    recovered: tuple[str, ...] = ()  # faults of the records' way back, detected and read again
    logprobs: tuple[TokenLogprob, ...] | None = None  # the committed tokens', for logprobs requests


def queue_reach(
    settled: int,
    in_flight: int,
    *,
    run: int,
    block: int,
    max_context: int,
    draft_width: Callable[[int], int],
    verify_width: Callable[[int], int],
) -> int | None:
    """The highest kvp a round queued after `in_flight` others (not yet read back; the host's position is
    `settled`) can start at, or None where it cannot be queued yet: a round commits at most min(run, block)
    tokens, and the kvps it may start at span two context buckets of the draft block's or the verify's graphs
    (whose keys the host must name), or reach past the context. With nothing in flight the host knows kvp."""
    low, high = settled, settled + in_flight * min(run, block)
    if high + run > max_context + abi.MAX_ROWS:
        if in_flight:
            return None
        raise BackendError(f"a verify of {run} rows at position {high} runs past the context")
    same = draft_width(low) == draft_width(high) and verify_width(low) == verify_width(high)
    return high if same else None


def checked_records(
    host: torch.Tensor, device_slot: torch.Tensor, epoch: int, number: int
) -> tuple[list[int], tuple[str, ...]]:
    """Round `number`'s records from its host slot, or, when they are not that round's (`record_fault`), from
    its device slot, copied into the host slot again: the words and the fault met (none, or one)."""
    words = host.tolist()
    fault = record_fault(words, epoch, number)
    if fault is None:
        return words, ()
    host.copy_(device_slot)
    words = host.tolist()
    again = record_fault(words, epoch, number)
    if again is not None:
        raise BackendError(f"round {number}'s records arrived {fault}, and read from the device: {again}")
    return words, (fault,)


@dataclass
class _Queued:
    """A round in flight: its number in the request, its record slot, the event after the records' copy,
    under `RecordFaults` what the host slot held before that copy (what a copy that never lands leaves), and
    its verify's row count."""

    number: int
    slot: int
    event: torch.cuda.Event
    before: list[int]
    run: int  # the rows its verify ran


@dataclass
class RecordFaults:
    """Faults in a round's records on their way back, injected into the pinned host slot once the round's
    event has fired (tests and fault drills): `faults[n]` is the kind that round n of each request (counting
    discarded rounds) gets on its first read. `dropped`: the slot as it was before the copy; `repeated`: the
    previous round's records (not at round 0); `stale`: the last records of the previous request (from the
    second request on; before it there is nothing to replay and nothing is injected). `injected` counts
    them."""

    faults: Mapping[int, str]
    injected: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for number, kind in self.faults.items():
            if kind not in TRANSIT_FAULTS:
                raise ValueError(
                    f"a record fault is one of {', '.join(TRANSIT_FAULTS)}, not {kind!r} (a corrupted verify "
                    "row is the row checks'; the commit is queued on the GPU in stream order, no "
                    "acknowledgement travels back to go stale)"
                )
            if kind == REPEATED and number < 1:
                raise ValueError("a repeated record replays an earlier round: not at round 0")

    def damage(self, number: int, slot: torch.Tensor, before: list[int], previous: list[int] | None,
               other_request: list[int] | None) -> None:  # fmt: skip
        """Overwrite the host slot of round `number` as its scheduled fault would leave it."""
        kind = self.faults.get(number)
        source = {DROPPED: before, REPEATED: previous, STALE: other_request}.get(kind or "")
        if source is None:
            return
        slot.copy_(torch.tensor(source, dtype=torch.int32))
        self.injected[kind or ""] += 1


class DeviceRounds:
    """Rounds on the GPU for the active sequence of one tree-mode backend with captured verifies, captured
    draft blocks and the embedding gather (each required: without them the host must see the tree)."""

    def __init__(
        self, backend: Exl3Backend, *, round_graphs: bool | None = None, sampled: bool | None = None,
        adjusting: bool | None = None, whole_vocab: bool | None = None, vocab_heads: bool | None = None,
        vocab_nucleus: bool | None = None, logprobs: bool | None = None,
    ) -> None:
        """`round_graphs`: each round key's rounds as one composed graph launch (`elpis.exl3.round_graph`);
        None: the registry switch exl3-round-graph. `sampled`: sampled top_k requests' rounds here too, their
        targets drawn on the GPU (`elpis.exl3.sample_draw`); None: the registry switch exl3-sample-draw.
        `adjusting`: requests with penalties or logit_bias too, their rows adjusted on the GPU
        (`elpis.exl3.round_adjust`); None: the registry switch exl3-round-adjust. `whole_vocab`: sampled
        requests without top_k too, drawn over their whole vocabulary on the GPU (`elpis.exl3.vocab_draw`);
        None: the registry switch exl3-vocab-draw. `vocab_heads`: among those, the ones whose draw reads the
        rows' heads (top_p < 1 or min_p > 0) too; None: the registry switch exl3-vocab-draw-heads.
        `vocab_nucleus`: the heads' rows their weights do not decide drawn on the GPU too, over the whole row;
        None: the registry switch exl3-vocab-draw-nucleus. `logprobs`: requests with logprobs too
        (`reports_logprobs`); None: the registry switch exl3-round-logprobs."""
        graphs, drafter = backend.graphs, backend.drafter
        if not backend.tree or graphs is None or graphs.table is None:
            raise BackendError(
                "rounds on the GPU need tree mode, captured tree verifies and the embedding gather"
            )
        if drafter is None or drafter.graphs is None or drafter.graphs.table is None:
            raise BackendError(
                "rounds on the GPU need the DFlash2 draft with captured, gathered draft blocks"
            )
        if graphs.gate is not None:
            raise BackendError("rounds on the GPU queue their own verify: load without the verify gate")
        if not backend.export_layers:
            raise BackendError(
                "rounds on the GPU condition the draft on the verify's tap states after each commit: "
                "the verify exports none"
            )
        try:  # the round's kernels as this machine's CUDA compiler built them, against the host
            round_check.check_round_plan(round_check.gpu_plan_launch(backend.engine.device))
            round_check.check_round_tail(round_check.gpu_launch(backend.engine.device))
        except round_check.RoundKernelMismatch as exc:
            raise BackendError(str(exc)) from exc
        # the epilogue reads the captured verifies' logits in place, 16 bytes a load: refuse at load a head
        # whose rows that rule does not fit, rather than in the first round
        vocab = backend.info.vocab_size
        try:
            for c in graphs.graphs.values():
                if c.out is not None:
                    verify_epilogue.check_logits(c.out[0, :, :vocab])
        except ValueError as exc:
            raise BackendError(f"rounds on the GPU: {exc}") from exc
        verify_epilogue.load()
        self.backend = backend
        self.drafts = drafter.graphs
        self.block_candidates = drafter.candidates  # the host's drafter's: the same trees either way
        self._buffers(backend.engine.device, backend.tree_run(), pin_memory=True)
        from elpis.exl3 import patches

        if round_graphs is None:
            round_graphs = patches.enabled(round_graph.PATCH)
        if round_graphs:
            self.round_graphs = round_graph.RoundGraphs(round_graph.CudaComposer(backend.engine.device))
        self.sampled = patches.enabled(sample_draw.PATCH) if sampled is None else sampled
        if self.sampled:
            sample_draw.load()
        self.adjusting = patches.enabled(round_adjust.PATCH) if adjusting is None else adjusting
        if self.adjusting:
            round_adjust.load()
        self.whole_vocab = patches.enabled(vocab_draw.PATCH) if whole_vocab is None else whole_vocab
        self.vocab_heads = patches.enabled(vocab_draw.HEADS_PATCH) if vocab_heads is None else vocab_heads
        self.vocab_nucleus = (patches.enabled(vocab_draw.NUCLEUS_PATCH) if vocab_nucleus is None
                              else vocab_nucleus)  # fmt: skip
        if self.whole_vocab:
            vocab_draw.load()
        self.reports_logprobs = patches.enabled(LOGPROBS_PATCH) if logprobs is None else logprobs

    def _buffers(self, dev: torch.device | str, run: int, *, pin_memory: bool) -> None:
        """The state block, cells, record slots and conditioning inputs on `dev` (host slots pinned on a GPU
        machine), and the counters of a fresh driver."""
        self.state = torch.zeros((round_plan.STATE_WORDS,), dtype=torch.int64, device=dev)
        self.cells = torch.zeros((abi.TREE_CELLS,), dtype=torch.int64, device=dev)
        # one slot per round in flight, on the device and in pinned memory: a round's records stay on the
        # device until it is read, so a copy that went wrong can be made again
        self.records = torch.zeros((IN_FLIGHT, RECORD_WORDS), dtype=torch.int32, device=dev)
        self.host_records = torch.zeros((IN_FLIGHT, RECORD_WORDS), dtype=torch.int32, pin_memory=pin_memory)
        self.epoch = 0
        self.numbered = 0  # rounds queued for the request
        self.last_words: list[int] | None = None  # the last round read back, its records
        self.other_request: list[int] | None = None  # the previous request's last records
        self.record_faults: RecordFaults | None = None
        self.cond_kvp = torch.zeros((1,), dtype=torch.int32, device=dev)
        self._by_run: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._run_buffers(dev, run)
        self.budget = run  # the request's tree budget (`start`)
        self.state_budget = run  # the tree budget the state block holds (the queued rounds' run's)
        self.top_k = 0
        self.queued: deque[_Queued] = deque()
        self.next_slot = 0
        self.settled = 0  # the host's position: every round read back so far is in it
        self.rounds = 0  # rounds read back, discarded ones included
        self.queued_ahead = 0  # rounds queued before the previous one was read back
        # seconds the host spent blocked on rounds' events: a round's wall time less this is the host's own
        # (Python and launches, issue 9's host time per round)
        self.wait_seconds = 0.0
        self.round_graphs: round_graph.RoundGraphs | None = None  # composed rounds (`elpis.exl3.round_graph`)
        # a sampled request's draw: its parameters (`sample_draw.param_words`) and inverse temperature in
        # device memory, written at `start`, which the captured draws read when they run
        self.sampled = False  # whether sampled top_k requests' rounds run here (`draws`)
        self.whole_vocab = False  # whether sampled requests without top_k run here (`draws`)
        self.vocab_heads = False  # and among them those whose draw reads the rows' heads
        self.vocab_nucleus = False  # and whether the head's launch decides the rows its weights do not
        self.sampling: SamplingParams | None = None  # the request's, None for a greedy one
        self.draw_params = torch.zeros((sample_draw.PARAM_WORDS,), dtype=torch.int64, device=dev)
        self.inverse_temperature = torch.zeros((1,), dtype=torch.float64, device=dev)
        # a request's penalties and logit_bias: its history in device memory (made at the first such request),
        # and each row count's adjusted rows (float64 [run, vocab], made at its first adjusted round)
        self.adjusting = False  # whether requests that adjust their logits run here (`draws`)
        self.adjusts = False  # whether the request's rows are adjusted
        self.history: round_adjust.DeviceHistory | None = None
        self._adjusted: dict[int, torch.Tensor] = {}
        # a request's logprobs: its top_logprobs count (None: no logprobs), each record slot's copy of its
        # round's verify logits (made at the first such round, kept: composed graphs address it), and the
        # stream the host reads them on while the next round runs
        self.reports_logprobs = False  # whether requests with logprobs run here (`start`)
        self.top_logprobs: int | None = None
        self._kept: dict[int, torch.Tensor] = {}
        self._side: torch.cuda.Stream | None = None

    @property
    def choice(self) -> RunChoice | None:
        """Which row count each round's verify runs at: the backend's run choice (`elpis.spec.run_choice`),
        which its host rounds ask too; None: every round at the backend's own."""
        return self.backend.run_choice

    def _run_buffers(self, dev: torch.device | str, run: int) -> None:
        """The buffers of a row count's rounds, made once and kept (composed graphs address them): the
        conditioning's rows (a path has at most `run`), the verify's greedy targets and its row checks."""
        if run not in self._by_run:
            self._by_run[run] = (
                torch.zeros((run,), dtype=torch.long, device=dev),
                torch.zeros((run,), dtype=torch.long, device=dev),
                torch.zeros((run,), dtype=torch.int32, device=dev),
            )
        self.cond_index, self.ids, self.bad = self._by_run[run]

    # -- a request ------------------------------------------------------------------------------------------
    def serves(self) -> bool:
        """Rounds here are tree rounds: a backend switched to chain verifies (`tree` off) runs its rounds on
        the host."""
        return bool(self.backend.tree)

    def draws(self, params: SamplingParams) -> bool:
        """Whether a request's targets are decided here: greedy ones, sampled top_k ones with sampled rounds
        on and a top_k draw the kernel takes (`sample_draw.row_count`), sampled ones without top_k with
        whole-vocabulary draws on (those with top_p < 1 or min_p > 0 only with the heads' switch on too) and
        rows their kernels take (`vocab_draw.fits`: the verify's fp16 logits, a penalised request's float64
        rows), and any of them with penalties or logit_bias only where adjusting rounds are on."""
        if params.adjusts_logits and not self.adjusting:
            return False
        if params.greedy:
            return True
        vocab = self.backend.info.vocab_size
        if not params.top_k:
            rows = torch.float64 if params.adjusts_logits else torch.float16
            heads = self.vocab_heads or not vocab_draw.reads_head(params)
            return self.whole_vocab and heads and vocab_draw.fits(params, rows, vocab)
        return self.sampled and sample_draw.row_count(params, vocab) > 0

    def start(self, *, context: Sequence[int], remaining: int, tree_budget: int, stops: Sequence[int],
              top_k: int, sampling: SamplingParams | None = None, generated: int = 0,
              top_logprobs: int | None = None) -> None:
        """Take over the backend's active sequence (begun, nothing pending) for rounds on the GPU: right after
        its prompt, or again after host rounds or rounds here that ended at a stop. `context` is its tokens;
        the last is the anchor (the backend holds the others). `sampling`: the request's parameters, which
        `draws` must take (None: greedy without adjustments); `generated`: how many of `context`'s last tokens
        were generated (the rest is the prompt), which penalties count. `top_logprobs`: the request's count of
        alternatives when it asks for logprobs (only where `reports_logprobs`)."""
        self.drain()
        if sampling is not None and not self.draws(sampling):
            raise ValueError("rounds on the GPU do not draw this request's rows (DeviceRounds.draws)")
        if top_logprobs is not None and not self.reports_logprobs:
            raise ValueError("rounds on the GPU report no logprobs here (exl3-round-logprobs is off)")
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top_logprobs}")
        if not 0 <= generated <= len(context):
            raise ValueError(f"{generated} generated tokens in a context of {len(context)}")
        b = self.backend
        if not b.active or b.pending is not None:
            raise BackendError("rounds on the GPU start on a begun sequence with no pending verify")
        if len(context) != b.position() + 1 or (b.anchor is not None and context[-1] != b.anchor):
            raise BackendError(
                f"rounds on the GPU start from the backend's {b.position()} tokens plus its anchor; the "
                f"context has {len(context)} tokens ending in {context[-1] if context else None} "
                f"(anchor {b.anchor})"
            )
        if not 1 <= tree_budget <= b.tree_run():
            raise ValueError(
                f"a tree budget of 1..{b.tree_run()} rows (the captured verifies'), got {tree_budget}"
            )
        if not 1 <= top_k <= round_plan.MAX_K:
            raise ValueError(f"draft_top_k must be in 1..{round_plan.MAX_K} on the GPU, got {top_k}")
        if b.info.vocab_size > round_plan.EXACT_FLOAT32_IDS:
            raise ValueError("rounds on the GPU carry candidate ids in float32: the vocabulary is too large")
        self.top_k = top_k
        self.budget = self.state_budget = tree_budget
        if self.last_words is not None:
            self.other_request = self.last_words
        self.last_words, self.numbered = None, 0
        self.epoch = next(_EPOCHS) % (1 << 31)
        words = round_plan.state_block(
            anchor=int(context[-1]), kvp=b.position(), remaining=remaining, max_context=b.info.max_context,
            tree_budget=tree_budget, stops=stops, epoch=self.epoch,
        )  # fmt: skip
        self.state.copy_(torch.from_numpy(words))  # from pageable memory: synchronous, once per request
        self.adjusts = sampling is not None and sampling.adjusts_logits
        if self.adjusts:
            assert sampling is not None
            if self.history is None:
                self.history = round_adjust.DeviceHistory(b.info.vocab_size, self.state.device)
            cut = len(context) - generated
            self.history.start(sampling, context[:cut], context[cut:])
        self.sampling = None if sampling is None or sampling.greedy else sampling
        self.top_logprobs = top_logprobs
        if self.sampling is not None:
            self.draw_params.copy_(torch.tensor(sample_draw.param_words(self.sampling), dtype=torch.int64))
            self.inverse_temperature.fill_(self.sampling.inverse_temperature)  # a float64 holds it exactly
        self.settled = b.position()

    def drain(self) -> None:
        """Wait for the rounds still in flight and drop their records (the request ended before them)."""
        while self.queued:
            self.queued.popleft().event.synchronize()
        if self.round_graphs is not None:
            self.round_graphs.release(self.numbered)

    # -- rounds ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def round(self) -> DeviceRound:
        """The oldest round in flight, read back, with the host's bookkeeping moved by what it committed; the
        next round is queued before the wait whenever its keys are known."""
        if not self.queued:
            run = self._run(self.settled)
            start = self._reach(0, run)
            assert start is not None  # with nothing in flight the host knows kvp, or _reach raised
            self._queue(start, run)
        run = self._run(self.settled + len(self.queued) * self.backend.block_size)
        ahead = self._reach(len(self.queued), run)
        if ahead is not None:
            self._queue(ahead, run)
            self.queued_ahead += 1
        return self._outcome(self._read(self.queued.popleft()))

    def settle(self) -> DeviceRound | None:
        """Read the rounds in flight without queuing more: the one that committed, or None. After an undrawn
        round one more is in flight at most (IN_FLIGHT), queued from the same state, so it verified the same
        position: it commits only where the undrawn one met a fault of its own."""
        committed = None
        while self.queued:
            done = self._outcome(self._read(self.queued.popleft()))
            if done.fault is None:
                if committed is not None:
                    raise BackendError("two rounds in flight both committed after an undrawn round")
                committed = done
        return committed

    def _outcome(self, result: DeviceRoundResult) -> DeviceRound:
        """A round read back, as the generator takes it: what it committed, or the fault that discarded it (a
        sampled request's row the GPU did not draw: `UNDRAWN`, which the host decides)."""
        tail = result.tail
        if tail.status == round_tail.STATUS_SLOT_OUTSIDE_PAGES:
            raise BackendError("the round on the GPU committed to a K/V slot outside the sequence's pages")
        fault = None if tail.status == 0 else FAULTS.get(tail.status)
        if tail.status == round_tail.STATUS_NON_FINITE and self.sampling is not None:
            fault = UNDRAWN  # a drawn target < 0: the kernel's answer for a row it leaves to the host
        if tail.status != 0 and fault is None:
            raise BackendError(f"the acceptor on the GPU refused the round's cells (code {tail.status})")
        return DeviceRound(result.plan.rows, tail.tokens, tail.ends, fault, result.recovered, result.logprobs)

    def _run(self, kvp: int) -> int:
        """The row count of a round from about `kvp`: the run choice's, or the backend's."""
        if self.choice is None:
            return self.backend.tree_run()
        return self.choice.choose(kvp, self.budget)

    def _reach(self, in_flight: int, run: int) -> int | None:
        """`queue_reach` for this sequence and a round of `run` rows, with the draft blocks' and the
        verifies' context buckets."""
        b = self.backend
        graphs = b.graphs
        assert graphs is not None
        return queue_reach(
            self.settled, in_flight, run=run, block=b.block_size, max_context=b.info.max_context,
            draft_width=self.drafts.width, verify_width=lambda kvp: graphs.table_width(kvp, run),
        )  # fmt: skip

    def _queue(self, kvp: int, run: int) -> None:
        """Queue one round of `run` rows from the state block; `kvp` is the highest position it can start at
        (the keys and pages are those of every position it can start at): its composed graph when the round
        key has one (`elpis.exl3.round_graph`), else piece by piece, composing the key's graph after."""
        b = self.backend
        assert b.graphs is not None
        self._use_run(run)
        b.ensure_pages(kvp + max(run, b.block_size))  # what a host verify and draft block ensure
        c = b.graphs.captured(b.state, kvp, run)
        if c is None:
            raise BackendError(
                f"no captured verify of {run} rows at position {kvp}: rounds on the GPU replay the verifies "
                "captured at load (elpis.exl3.graph_warmup)"
            )
        slot = self.next_slot
        self.next_slot = (slot + 1) % IN_FLIGHT
        # the pages of the block from the highest start, as a host draft block takes them
        draft_pages = block_pages(b.pages, kvp, b.block_size)
        pages = verify_pages(b.pages, kvp, run)
        width = self.drafts.width(kvp)
        host = self.host_records[slot]
        host[ROUND_WORD] = NOT_ARRIVED  # its previous round was read: the slot is the host's to mark
        before = host.tolist() if self.record_faults is not None else []  # what a drill's dropped copy leaves
        keys = self._captured_keys(c, width)
        graph = None
        if keys is not None and self.round_graphs is not None:
            graph = self.round_graphs.get(self._graph_key(c, keys, slot))
        if graph is not None:
            assert self.round_graphs is not None
            self.drafts.put_table(graph.draft, draft_pages)
            b.graphs.put_table(c, pages)
            self.round_graphs.launch(graph)
            # the composed graph replays the draft block's, the verify's, the commit's and the conditioning's
            self.drafts.replays += 1
            self.drafts.condition_replays += 1
            b.graphs.replays += 2
        else:
            self._queue_pieces(c, width, draft_pages, pages, slot)
            keys = self._captured_keys(c, width)  # the pieces are captured now
            if keys is not None:
                self._compose(c, keys, slot)
        event = torch.cuda.Event()
        event.record()
        self.queued.append(_Queued(self.numbered, slot, event, before, run))
        self.numbered += 1
        if self.choice is not None:
            self.choice.chose(run, self.budget)

    def _use_run(self, run: int) -> None:
        """Point the round's buffers at `run`'s and, where the state block's tree budget is not the request's
        cut to `run`, write it there, in stream order: the round plan reads it when this round runs (the round
        before has read its own by then)."""
        self._run_buffers(self.state.device, run)
        budget = min(self.budget, run)
        if budget != self.state_budget:
            self.state[round_plan.STATE_TREE_BUDGET].fill_(budget)
            self.state_budget = budget

    def _queue_pieces(
        self, c: Captured, width: int, draft_pages: Sequence[int], pages: Sequence[int], slot: int
    ) -> None:
        """The round's pieces one by one (a key's first rounds capture the graphs they replay)."""
        b = self.backend
        assert b.graphs is not None and c.graph is not None and c.export is not None
        anchor, at = self._state_views()
        chain, logits = self.drafts.block_from(anchor, at, draft_pages, width)
        self._plan(chain, logits, c, slot)
        b.graphs.put_table(c, pages)
        c.graph.replay()
        b.graphs.replays += 1
        self._tail(c, slot)
        b.graphs.run_commit(c)
        # through the verify's block table, as a host commit conditions
        self.drafts.condition_from(c.export, self.cond_index, self.cond_kvp, c.block_table)
        self._copy_records(slot)

    def _state_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state block's anchor and kvp (int64 [1] views): the draft block's inputs."""
        state = self.state
        return (state[round_plan.STATE_ANCHOR : round_plan.STATE_ANCHOR + 1],
                state[round_plan.STATE_KVP : round_plan.STATE_KVP + 1])  # fmt: skip

    def _plan(self, chain: torch.Tensor, logits: torch.Tensor, c: Captured, slot: int) -> None:
        """The draft block's candidates, then the round plan into the verify key's inputs and the cells."""
        packed = self._candidates(chain, logits)
        verify_inputs = {
            "seqlens": c.seqlens, "position": c.position_ids.view(-1), "ctx": c.inputs.ctx,
            "masks": c.inputs.masks, "plan": c.inputs.plan, "ids": c.ids,
        }  # fmt: skip
        record = self.records[slot][: round_plan.RECORD_WORDS]
        round_plan.plan(packed, self.backend.info.vocab_size, self.state, verify_inputs, self.cells, record)

    def _tail(self, c: Captured, slot: int) -> None:
        """The verify's row checks and greedy targets, then the round tail (the acceptor, the commit's and the
        conditioning's inputs, the state block advanced). The tail refuses a K/V slot past the sequence's
        pages, whose count `put_table` uploads beside the block table: read on the device, so one composed
        graph serves every page count of its key."""
        b = self.backend
        assert b.graphs is not None and c.out is not None and c.page_count is not None
        out = c.out[0, : c.ids.shape[0], : b.info.vocab_size]
        ids, bad = self._targets(out, c.position_ids.view(-1))
        moves, commit_plan = b.graphs.commit_inputs(c)
        outputs = (self.records[slot][round_plan.RECORD_WORDS :], moves, commit_plan, self.cond_index,
                   self.cond_kvp)  # fmt: skip
        round_tail.decide(self.cells, ids, bad, self.state, c.block_table[0], c.page_count, *outputs)
        if self.adjusts:  # the tokens it committed join the history the next round's rows are adjusted by
            assert self.history is not None
            at = round_plan.RECORD_WORDS + round_tail.REC_TOKENS
            self.history.count(self.records[slot][at : at + abi.MAX_ROWS].to(torch.int64))
        if self.top_logprobs is not None:  # the raw logits, kept in the slot until the round is read
            self._kept_logits(slot, out)[: out.shape[0]].copy_(out)

    def _kept_logits(self, slot: int, out: torch.Tensor) -> torch.Tensor:
        """Record slot `slot`'s buffer of a round's verify logits (`out`'s dtype, every row a round can
        have), made at its first logprobs round (eager, before any capture of it) and kept."""
        if slot not in self._kept:
            shape = (abi.MAX_ROWS, out.shape[1])
            self._kept[slot] = torch.empty(shape, dtype=out.dtype, device=self.state.device)
        return self._kept[slot]

    def _logprobs(self, slot: int, tail: round_tail.RoundTail) -> tuple[TokenLogprob, ...]:
        """The committed tokens' log-probabilities from the slot's kept logits, each row widened to fp32 as
        the verify hands it to a host round (`Exl3Backend.verify`) and read by `sampling.top_logprobs`, as
        the host's: the same values. On a CUDA device on a side stream, so that reading them back waits for
        this round (already done) and not for the round queued after it."""
        rows = self._kept[slot]
        assert self.top_logprobs is not None
        count = self.top_logprobs

        def read() -> tuple[TokenLogprob, ...]:
            pairs = zip(tail.path, tail.tokens, strict=True)
            return tuple(sampling.top_logprobs(rows[r].float(), t, count) for r, t in pairs)

        if rows.device.type != "cuda":
            return read()
        if self._side is None:
            self._side = torch.cuda.Stream(device=rows.device)
        with torch.cuda.stream(self._side):
            return read()

    def _copy_records(self, slot: int) -> None:
        self.host_records[slot].copy_(self.records[slot], non_blocking=True)

    def _captured_keys(self, c: Captured, width: int) -> tuple[DraftCaptured, ConditionCaptured] | None:
        """The draft block's and the conditioning's captured keys a composed round of verify key `c` replays,
        or None where rounds are not composed: the switch off, a piece not yet captured, or a test's stand-in
        in place of the candidates or the targets (a Python hook runs each round, which a graph would not)."""
        if self.round_graphs is None or "_candidates" in self.__dict__ or "_targets" in self.__dict__:
            return None
        dc = self.drafts.captured_block(width)
        if dc is None or c.commit_graph is None or c.export is None:
            return None
        cond = self.drafts.captured_condition_from(c.export, self.cond_index.shape[0], c.block_table.shape[1])
        return None if cond is None else (dc, cond)

    def _graph_key(self, c: Captured, keys: tuple[DraftCaptured, ConditionCaptured], slot: int) -> tuple:
        """The round key of a composed graph: what the pieces' captures bake in (the captured keys are held
        by the graph, so their identities stay unique while it lives). Not the page count: the tail reads it
        from device memory."""
        dc, cond = keys
        return (id(c), id(dc), id(cond), slot, self.top_k, self._draw_shape(), self.adjusts,
                self.top_logprobs is not None)

    def _draw_shape(self) -> tuple[int, bool, bool] | None:
        """What a sampled request's captured draw bakes in: its top_k (its shapes), and without top_k whether
        it reads the rows' heads (`vocab_draw.reads_head`: which launch) and whether the nucleus follows the
        head's launch; None for a greedy request."""
        params = self.sampling
        if params is None:
            return None
        heads = not params.top_k and vocab_draw.reads_head(params)
        return params.top_k, heads, heads and self.vocab_nucleus

    def _compose(self, c: Captured, keys: tuple[DraftCaptured, ConditionCaptured], slot: int) -> None:
        """Compose the round key's graph from the pieces `_queue_pieces` ran (each captured by now)."""
        assert self.round_graphs is not None
        dc, cond = keys
        anchor, at = self._state_views()
        steps = (
            lambda: self.drafts.inputs_from(dc, anchor, at),
            dc.graph,
            lambda: self._plan(dc.chain, dc.logits, c, slot),
            c.graph,
            lambda: self._tail(c, slot),
            c.commit_graph,
            lambda: self.drafts.condition_inputs_from(cond, self.cond_index, self.cond_kvp, c.block_table),
            cond.graph,
            lambda: self._copy_records(slot),
        )
        key = self._graph_key(c, keys, slot)
        self.round_graphs.compose(key, steps, (dc, c, cond), self.numbered)

    def _read(self, q: _Queued) -> DeviceRoundResult:
        """Wait for a queued round and settle the host's side of it: the tokens whose K/V were kept and the
        position. A round not committed changes nothing."""
        waiting = time.perf_counter()
        q.event.synchronize()
        self.wait_seconds += time.perf_counter() - waiting
        host = self.host_records[q.slot]
        if self.record_faults is not None:
            self.record_faults.damage(q.number, host, q.before, self.last_words, self.other_request)
        words, recovered = checked_records(host, self.records[q.slot], self.epoch, q.number)
        if self.round_graphs is not None:
            self.round_graphs.release(q.number)
        self.last_words = words
        tail = round_tail.read_record(words[round_plan.RECORD_WORDS :])
        reads = self.top_logprobs is not None and tail.status == 0
        logprobs = self._logprobs(q.slot, tail) if reads else None
        result = DeviceRoundResult(
            round_plan.read_record(words[: round_plan.RECORD_WORDS]), tail, recovered, logprobs
        )
        plan, tail = result.plan, result.tail
        if tail.kvp != self.settled:
            raise BackendError(
                f"the round on the GPU was verified at position {tail.kvp}, the host is at {self.settled}"
            )
        if plan.status < 0:
            raise BackendError(f"the round's tree on the GPU: {round_plan.STATUS_MESSAGES[plan.status]}")
        self.rounds += 1
        if self.choice is not None and plan.status == 0 and tail.status == 0 and not tail.ends:
            self.choice.observe(q.run, self.budget, plan.parents, tail.path)
        if tail.status == 0:
            b = self.backend
            # decode pages are never named for reuse (Exl3Backend.commit): only the tokens and position move
            b.tokens.extend(plan.tokens[r] for r in tail.path)
            b.state.position = len(b.tokens)
            b.anchor = None
            self.settled = len(b.tokens)
        return result

    def _candidates(self, chain: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The draft block's candidates as `DFlash2Drafter.propose` packs them, for every block row."""
        return self.block_candidates(chain, logits, self.top_k).contiguous()

    def _targets(self, out: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every verified row's target (int64 [run]) and row check (int32 [run]: 1 for a row holding NaN or
        +inf, `check_rows`' test), into buffers the next round reuses in stream order, after this round's tail
        has read them. The checks and greedy targets (`sampling.greedy_ids`) are two launches
        (`verify_epilogue.row_results`). A sampled request's targets are then drawn over them: the weights
        `sampling.top_weights` computes, under the request's inverse temperature read from device memory,
        and the kernel's draw (`sample_draw`) for each row's position (its position id, `positions`, plus
        one: the token the row draws follows it), the host's tokens; a row it leaves to the host gets a
        target < 0, which the tail refuses (`UNDRAWN`). The host's digest check has no counterpart: the
        logits never leave the device. A request with penalties or logit_bias has its rows adjusted first
        (`round_adjust`, the history in device memory), and its targets are the adjusted rows' argmax or
        draw, as `History.adjusted` then `sample_rows` give them on the host."""
        verify_epilogue.row_results(out, self.ids, self.bad)
        rows = out
        if self.adjusts:  # the request's penalties and bias, each row counting its own path
            assert self.history is not None
            rows = self._adjusted_rows(out.shape)
            round_adjust.queue(out, self.cells, self.history, rows)
        params = self.sampling
        if params is not None:
            at = positions.to(torch.int64)
            if not params.top_k:  # over the whole vocabulary, as the host's draw
                vocab_draw.queue(rows, params, self.inverse_temperature, self.draw_params, at, 1, self.ids,
                                 nucleus=self.vocab_nucleus)
            else:
                width = min(params.top_k, out.shape[1])
                top = sampling.top_weights(rows, params, width, self.inverse_temperature)
                sample_draw.queue(top, params.top_k, self.draw_params, at, 1, self.ids)
        elif self.adjusts:
            self.ids.copy_(sampling.greedy_ids(rows))  # the adjusted argmax, -1 where not finite
        return self.ids, self.bad

    def _adjusted_rows(self, shape: torch.Size) -> torch.Tensor:
        """The row count's buffer of adjusted rows, made at its first adjusted round (eager, before any
        capture of it) and kept: a composed graph addresses it."""
        run = shape[0]
        if run not in self._adjusted:
            self._adjusted[run] = torch.empty(tuple(shape), dtype=torch.float64, device=self.state.device)
        return self._adjusted[run]
