"""Greedy tree rounds whose decisions run on the GPU (issue 9, item 2): first stage, one host synchronisation
per round. Staged, not yet served: its GPU test (tests/exl3/test_device_round.py) has not run.

A host round (`elpis.spec.generate`) reads the draft's candidates back, builds the tree, fills the verify's
inputs, reads the verify's row checks and greedy tokens back, runs the acceptor and fills the commit's inputs:
two synchronisations, with the GPU idle while the host works. Here one round is queued in stream order with
nothing read back in between:

  draft block (the captured DFlash2 graph) -> its candidates (`drafter.pack_candidates` of the log-softmax
  and top-k, on the GPU) -> `round_plan` (the tree, the verify key's inputs but the block table, the
  acceptor's cells) -> the captured verify (its embedding gathered on the GPU: `exl3-embed-gather`) -> the
  row checks and greedy targets (`sampling.greedy_ids`) -> `round_tail` (the proven acceptor, the commit
  graph's inputs, the state block advanced) -> the captured commit -> both records into pinned memory.

The host then reads the two records (the one synchronisation), moves its own bookkeeping (the sequence's
tokens, position and anchor) and conditions the draft on the committed path, which still needs the count on
the host (elpis/spec/README.md, "The round on the GPU", step 3). What is committed is the acceptor's decision
over the verify's own greedy tokens, as in a host round, so the text is plain decoding's; only the tree may
differ, since the row count is the budget's (no verify-cost choice, a captured graph's rows are fixed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from elpis.accept import abi
from elpis.backend import BackendError, DeviceRound
from elpis.exl3 import round_plan, round_tail
from elpis.exl3.drafter import pack_candidates
from elpis.spec.sampling import greedy_ids

if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend
    from elpis.exl3.tree_graph import Captured


PATCH = "exl3-device-rounds"  # the registry switch (patches/registry.json), read by load_backend

# Tail statuses that discard a round (the next one verifies the same position again), as fault kinds
FAULTS = {round_tail.STATUS_FLAGGED_ROW: "corrupt", round_tail.STATUS_NON_FINITE: "corrupt"}


@dataclass(frozen=True)
class DeviceRoundResult:
    """One round's two records: the tree it verified and what it committed (nothing unless tail.status is
    0)."""

    plan: round_plan.PlannedTree
    tail: round_tail.RoundTail


class DeviceRounds:
    """Rounds on the GPU for the active sequence of one tree-mode backend with captured verifies, captured
    draft blocks and the embedding gather (each required: without them the host must see the tree)."""

    def __init__(self, backend: Exl3Backend) -> None:
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
        self.backend = backend
        dev = backend.engine.device
        self.device = dev
        self.state = torch.zeros((round_plan.STATE_WORDS,), dtype=torch.int64, device=dev)
        self.cells = torch.zeros((abi.TREE_CELLS,), dtype=torch.int64, device=dev)
        self.records = torch.zeros((round_plan.RECORD_WORDS + round_tail.RECORD_WORDS,), dtype=torch.int32,
                                   device=dev)  # fmt: skip
        self.host_records = torch.zeros(self.records.shape, dtype=torch.int32, pin_memory=True)
        self.pages = torch.zeros((backend.num_pages,), dtype=torch.int32, device=dev)
        self.pages_sent = 0
        self.top_k = 0
        self.anchor: int | None = None
        self.done = torch.cuda.Event()
        self.last: DeviceRoundResult | None = None  # the last round's records (tests and the bench read them)
        self.rounds = 0  # rounds run, discarded ones included

    # -- a request ------------------------------------------------------------------------------------------
    def start(self, *, remaining: int, tree_budget: int, stops: Sequence[int], top_k: int) -> None:
        """Take over the backend's active sequence (begun, nothing pending) for rounds on the GPU."""
        b = self.backend
        if not b.active or b.pending is not None or b.anchor is None:
            raise BackendError(
                "rounds on the GPU start on a begun sequence with its anchor and no pending verify"
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
        self.anchor = b.anchor
        words = round_plan.state_block(
            anchor=b.anchor, kvp=b.position(), remaining=remaining, max_context=b.info.max_context,
            tree_budget=tree_budget, stops=stops,
        )  # fmt: skip
        self.state.copy_(torch.from_numpy(words))  # from pageable memory: synchronous, once per request
        self.pages_sent = 0

    # -- one round ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def round(self) -> DeviceRound:
        """Queue one round, wait for its records, and move the host's bookkeeping with what it committed."""
        b = self.backend
        assert b.graphs is not None and b.drafter is not None and b.drafter.graphs is not None
        if self.anchor is None:
            raise BackendError("round() before start()")
        kvp, run = b.position(), b.tree_run()
        if kvp + run > b.info.max_context + abi.MAX_ROWS:
            raise BackendError(f"a verify of {run} rows at position {kvp} runs past the context")
        b.ensure_pages(kvp + max(run, b.block_size))
        self._send_pages()
        c = b.graphs.captured(b.state, kvp, run)
        if c is None:
            raise BackendError(
                f"no captured verify of {run} rows at position {kvp}: rounds on the GPU replay the verifies "
                "captured at load (elpis.exl3.graph_warmup)"
            )
        chain, logits = b.drafter.block(self.anchor)
        packed = self._candidates(chain, logits)
        verify_inputs = {
            "seqlens": c.seqlens, "position": c.position_ids.view(-1), "ctx": c.inputs.ctx,
            "masks": c.inputs.masks, "plan": c.inputs.plan, "ids": c.ids,
        }  # fmt: skip
        plan_record = self.records[: round_plan.RECORD_WORDS]
        tail_record = self.records[round_plan.RECORD_WORDS :]
        round_plan.plan(packed, b.info.vocab_size, self.state, verify_inputs, self.cells, plan_record)
        b.graphs.put_table(c, b.pages)
        assert c.graph is not None and c.out is not None
        c.graph.replay()
        b.graphs.replays += 1
        out = c.out[0, :run, : b.info.vocab_size]
        bad = self._row_checks(out)
        ids = greedy_ids(out)
        moves, commit_plan = b.graphs.commit_inputs(c)
        pages = self.pages[: self.pages_sent]  # the sequence's own: a slot past them is refused, not page 0
        round_tail.decide(self.cells, ids, bad, self.state, pages, tail_record, moves, commit_plan)
        b.graphs.run_commit(c)
        self.host_records.copy_(self.records, non_blocking=True)
        self.done.record()
        self.done.synchronize()
        words = self.host_records.tolist()
        result = DeviceRoundResult(
            round_plan.read_record(words[: round_plan.RECORD_WORDS]),
            round_tail.read_record(words[round_plan.RECORD_WORDS :]),
        )
        self._settle(c, result, kvp)
        self.last = result
        self.rounds += 1
        tail = result.tail
        fault = None if tail.status == 0 else FAULTS.get(tail.status)
        if tail.status == round_tail.STATUS_SLOT_OUTSIDE_PAGES:
            raise BackendError("the round on the GPU committed to a K/V slot outside the sequence's pages")
        if tail.status != 0 and fault is None:
            raise BackendError(f"the acceptor on the GPU refused the round's cells (code {tail.status})")
        return DeviceRound(result.plan.rows, tail.tokens, tail.ends, fault)

    def _candidates(self, chain: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The draft block's candidates as `DFlash2Drafter.propose` packs them, for every block row."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chain_lp = logprobs.gather(1, chain[:, None])[:, 0]
        top = torch.topk(logprobs, min(self.top_k, logprobs.shape[-1]), dim=-1)
        return pack_candidates(chain, chain_lp, top.indices, top.values).contiguous()

    def _row_checks(self, out: torch.Tensor) -> torch.Tensor:
        """int32 [run]: 1 for a verified row holding NaN or +inf (`check_rows`' test, on the GPU). The host's
        digest check has no counterpart: the logits never leave the device."""
        return (~(out.amax(dim=1) < torch.inf)).to(torch.int32)

    def _send_pages(self) -> None:
        """The sequence's pages into the device copy `round_tail` maps slots through (new pages only)."""
        pages = self.backend.pages
        if len(pages) > self.pages_sent:
            new = torch.tensor(pages[self.pages_sent :], dtype=torch.int32)
            self.pages[self.pages_sent : len(pages)].copy_(new.pin_memory(), non_blocking=True)
            self.pages_sent = len(pages)

    def _settle(self, c: Captured, result: DeviceRoundResult, kvp: int) -> None:
        """The host's side of a committed round: the tokens whose K/V were kept, the position, the anchor, and
        the draft's conditioning on the committed path. A round not committed changes nothing."""
        plan, tail = result.plan, result.tail
        if tail.kvp != kvp:
            raise BackendError(
                f"the round on the GPU was verified at position {tail.kvp}, the host is at {kvp}"
            )
        if plan.status < 0:
            raise BackendError(f"the round's tree on the GPU: {round_plan.STATUS_MESSAGES[plan.status]}")
        if tail.status != 0:
            return
        b = self.backend
        assert b.graphs is not None and c.export is not None
        path = list(tail.path)
        # the verify's block table, as a host verify leaves it for the conditioning
        b._last_table = b.block_table(b.graphs.table_width(kvp, c.position_ids.shape[1]))
        b.condition_draft(c.export, path, kvp, replayed=True)
        # decode pages are never named for reuse (Exl3Backend.commit), so only the tokens and position move
        b.tokens.extend(plan.tokens[r] for r in path)
        b.state.position = len(b.tokens)
        b.anchor = None
        self.anchor = tail.tokens[-1]
