"""Integrity of the speculative round: every round has an identity, and what comes back is checked
against what was asked before anything from it is used.

Today the round is synchronous; on the GPU it will be pipelined (the host reads each round's record one
round behind), and there results can be lost, delivered twice, arrive late or be damaged between the
kernel that wrote them and the host that reads them. So the loop already works as if it were pipelined:

- `RoundId` names a round attempt: the sequence epoch (one per `begin`), the round number, the attempt
  (a discarded round is recomputed under attempt + 1), the context position it verified at, and a digest
  of the verified tokens and parents.
- `RoundLink` is the producer side over any `Backend`: it runs `verify` and, right after, takes a digest
  of the logits (`logits_digest`) and tags the result with the round it answers and the position the
  backend actually verified at; it runs `commit` only for the round whose verify is pending at the
  position it verified at, and acknowledges with the position reached. A backend that pipelines its
  rounds would produce `VerifyResult` / `CommitAck` itself and be its own link.
- `RoundTracker` is the consumer side: before sampling it checks that the result is the one asked for
  and that its rows are intact (shape, dtype, no NaN or +inf, digest recomputed); after a commit it
  checks the acknowledgement.

Each failure raises a `RoundFault` subclass: `CorruptRow`, `DroppedRound`, `RepeatedRound`,
`StaleCommit`, `StaleRound`. The generator then discards the round (nothing from it was committed or
emitted), abandons the backend's pending verify, and recomputes it, a bounded number of times.

The digest is the per-row sum, modulo 2^32, of the logits' float32 bit patterns. Integer addition modulo
2^32 is associative and commutative, so the producer and the consumer get the same digest bit for bit
whatever reduction order or device computes it; a single flipped bit anywhere changes its row's sum by
+-2^k, which is never 0 modulo 2^32, so every single-bit corruption is detected. It reads each logit once
(about 0.1 ms for 8 rows of 248,320 on one CPU core).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from elpis.backend import Backend, BackendError
from elpis.spec.sampling import checked_greedy, greedy_ids


class RoundFault(BackendError):
    """A round whose result or acknowledgement failed a check: discard it and recompute it."""

    kind = "fault"


class CorruptRow(RoundFault):
    """A verify result whose logits are malformed or changed after the producer took their digest."""

    kind = "corrupt"


class DroppedRound(RoundFault):
    """A result that never arrived, a later round's result, or an acknowledgement of a round never
    verified."""

    kind = "dropped"


class RepeatedRound(RoundFault):
    """A result delivered again: an earlier round's (or attempt's), or this one's a second time."""

    kind = "repeated"


class StaleRound(RoundFault):
    """A result of another sequence, or one computed at another position or for another tree."""

    kind = "stale"


class StaleCommit(RoundFault):
    """A commit or acknowledgement that does not match the pending verify and the backend's position."""

    kind = "stale-commit"


class LateInputs(RoundFault):
    """A verify queued before its tree was known that ran without it: its gate timed out before the host
    opened it (`elpis.exl3.verify_gate`), so it computed a harmless dummy tree instead."""

    kind = "late-inputs"


FAULT_KINDS = tuple(
    c.kind for c in (CorruptRow, DroppedRound, RepeatedRound, StaleRound, StaleCommit, LateInputs)
)


@dataclass(frozen=True)
class RoundId:
    epoch: int  # one per sequence (backend.begin)
    number: int  # rounds committed before this one in the sequence
    attempt: int  # 0, then +1 for each recomputation after a discard
    position: int  # committed tokens in the backend state when verified (the anchor excluded)
    request: int  # tree_digest of the verified tokens and parents

    def order(self) -> tuple[int, int]:
        return self.number, self.attempt

    def __str__(self) -> str:
        return f"round {self.number} attempt {self.attempt} (epoch {self.epoch}, position {self.position})"


def tree_digest(tokens: Sequence[int], parents: Sequence[int]) -> int:
    """64-bit digest of a verify request (its rows' tokens and parents)."""
    data = ",".join(map(str, tokens)) + ";" + ",".join(map(str, parents))
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "little")


def logits_digest(logits: torch.Tensor) -> torch.Tensor:
    """int32 [rows]: each row's float32 bit patterns summed modulo 2^32 (see the module docstring)."""
    return logits.view(torch.int32).sum(dim=1, dtype=torch.int32)


@dataclass(frozen=True)
class VerifyResult:
    round: RoundId  # the round this answers, with the position the backend verified at
    logits: torch.Tensor  # float32 [rows, vocab]
    digest: torch.Tensor  # logits_digest(logits) taken by the producer right after verify


@dataclass(frozen=True)
class CommitAck:
    round: RoundId  # the round whose commit this acknowledges
    rows: tuple[int, ...]  # the committed rows
    position: int  # the backend's position after the commit


class RoundLink:
    """The producer side of rounds over any Backend (see the module docstring). Wrappers that inject
    faults subclass it; `SpeculativeGenerator` uses a backend that is a RoundLink as its own link."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: RoundId | None = None  # the round whose verify awaits its commit

    # Both return None when nothing arrived (a lost result); this synchronous link always answers.
    def verify_round(
        self, round_id: RoundId, tokens: Sequence[int], parents: Sequence[int]
    ) -> VerifyResult | None:
        position = self.backend.position()
        logits = self.backend.verify(tokens, parents)
        answered = replace(round_id, position=position)
        self.pending = answered
        # A malformed result gets an empty digest: the consumer refuses it by its shape or dtype.
        well_formed = logits.dtype == torch.float32 and logits.dim() == 2
        digest = logits_digest(logits) if well_formed else torch.empty(0, dtype=torch.int32)
        return VerifyResult(answered, logits, digest)

    def commit_round(self, round_id: RoundId, rows: Sequence[int]) -> CommitAck | None:
        if self.pending is None:
            raise DroppedRound(f"commit of {round_id}, which was never verified (no verify is pending)")
        if round_id != self.pending:
            raise StaleCommit(f"commit of {round_id}, but the pending verify is {self.pending}")
        position = self.backend.position()
        if position != round_id.position:
            raise StaleCommit(f"commit of {round_id}, but the backend is at position {position}")
        self.backend.commit(rows)
        self.pending = None
        return CommitAck(round_id, tuple(rows), self.backend.position())

    def abandon_round(self) -> None:
        """Drop the pending verify, if any, leaving the committed state as it was."""
        self.pending = None
        abandon = getattr(self.backend, "abandon", None)
        if abandon is None:
            raise BackendError(
                f"the {self.backend.info.name} backend has no abandon(): a discarded round's "
                "verify cannot be dropped, so the round cannot be recomputed"
            )
        abandon()


class RoundTracker:
    """The consumer side: checks each round's verify result and commit acknowledgement."""

    def __init__(self, epoch: int, vocab_size: int) -> None:
        self.epoch, self.vocab_size = epoch, vocab_size
        self.delivered: RoundId | None = None  # the last result accepted

    def round_id(
        self, number: int, attempt: int, position: int, tokens: Sequence[int], parents: Sequence[int]
    ) -> RoundId:
        return RoundId(self.epoch, number, attempt, position, tree_digest(tokens, parents))

    def check_verify(self, asked: RoundId, rows: int, result: VerifyResult | None) -> torch.Tensor:
        """The result's logits if it answers `asked` with `rows` intact rows; else a RoundFault."""
        result = self._answering(asked, result)
        check_rows(result, rows, self.vocab_size)
        self.delivered = result.round
        return result.logits

    def check_verify_greedy(
        self, asked: RoundId, rows: int, result: VerifyResult | None
    ) -> tuple[torch.Tensor, list[int]]:
        """`check_verify`, and every row's greedy token (`sampling.greedy_tokens`) read back in the same
        transfer as the row checks: one host synchronisation for both."""
        result = self._answering(asked, result)
        ids = check_rows(result, rows, self.vocab_size, greedy=True)
        self.delivered = result.round
        assert ids is not None
        return result.logits, checked_greedy(ids)

    def _answering(self, asked: RoundId, result: VerifyResult | None) -> VerifyResult:
        """`result` if it answers `asked`; a RoundFault if it is lost, repeated, stale or another tree's."""
        if result is None:
            raise DroppedRound(f"no verify result arrived for {asked}")
        got = result.round
        if got.epoch != asked.epoch:
            raise StaleRound(f"a verify result of sequence epoch {got.epoch} arrived for {asked}")
        if got.order() > asked.order():
            raise DroppedRound(f"the result of {got} arrived while {asked} was expected: {asked}'s was lost")
        if got.order() < asked.order() or got == self.delivered:
            raise RepeatedRound(f"the result of {got} was delivered again while {asked} was expected")
        if got.request != asked.request:
            raise StaleRound(f"the result of {got} answers another tree than the one asked")
        if got.position != asked.position:
            raise StaleRound(f"{asked} was verified at position {got.position} instead of {asked.position}")
        return result

    def check_commit(self, asked: RoundId, rows: Sequence[int], ack: CommitAck | None) -> None:
        """Nothing if `ack` acknowledges committing `rows` of `asked`; else a RoundFault."""
        if ack is None:
            raise DroppedRound(f"no commit acknowledgement arrived for {asked}")
        got = ack.round
        if got.epoch == asked.epoch and got.order() > asked.order():
            raise DroppedRound(
                f"a commit acknowledgement for {got}, which never verified, arrived for {asked}"
            )
        if got != asked:
            raise StaleCommit(f"a commit acknowledgement for {got} arrived for {asked}")
        if ack.rows != tuple(rows):
            raise StaleCommit(
                f"{asked}: rows {list(ack.rows)} were acknowledged, rows {list(rows)} committed"
            )
        if ack.position != asked.position + len(rows):
            raise StaleCommit(
                f"{asked}: the backend is at position {ack.position} after committing "
                f"{len(rows)} tokens, expected {asked.position + len(rows)}"
            )


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """bool [rows] on the logits' device: a row holding NaN or +inf (its maximum is then NaN or +inf; -inf is
    a legal masked token)."""
    return ~(logits.amax(dim=1) < math.inf)


def check_rows(result: VerifyResult, rows: int, vocab_size: int, *, greedy: bool = False) -> list[int] | None:
    """Shape, dtype, no NaN or +inf (-inf is a legal masked token), and the producer's digest. With `greedy`,
    also every row's `sampling.greedy_ids`, read back in the same transfer and returned once the rows
    passed (they are only meaningful then)."""
    logits = result.logits
    if logits.dtype != torch.float32 or tuple(logits.shape) != (rows, vocab_size):
        raise CorruptRow(
            f"{result.round}: verify returned {logits.dtype} {tuple(logits.shape)}, "
            f"expected float32 {(rows, vocab_size)}"
        )
    if result.digest.shape != (rows,):
        raise CorruptRow(
            f"{result.round}: the digest covers {tuple(result.digest.shape)} rows, expected {rows}"
        )
    # Both row checks (and the greedy tokens) are reduced on the logits' device and read back together: one
    # host transfer. A row's maximum is NaN or +inf exactly when the row holds one.
    checks = [nonfinite_rows(logits), logits_digest(logits) != result.digest]
    if greedy:
        checks.append(greedy_ids(logits))
    read = torch.stack([c.to(torch.int64) for c in checks]).tolist()
    nonfinite, changed = ([r for r, flag in enumerate(row) if flag] for row in read[:2])
    if nonfinite:
        raise CorruptRow(f"{result.round}: rows {nonfinite} hold NaN or +inf logits")
    if changed:
        raise CorruptRow(f"{result.round}: rows {changed} changed after verify (digest mismatch)")
    return read[2] if greedy else None
