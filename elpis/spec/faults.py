"""Fault injection for the speculative round: a real backend whose round results are damaged on schedule.

`FaultyBackend` wraps any Backend (in the tests, the exact-numerics reference backend running a real tiny
model) and is its `RoundLink` (see `integrity.py`), so the generator's rounds pass through it. At the
(round, attempt) pairs named by a `FaultSchedule` it injects one fault into what the real backend produced:

- `corrupt`: flips one bit of one logit of the result, after the producer took the digest;
- `dropped`: the backend verifies, but its result never reaches the consumer;
- `repeated`: the backend verifies, but the consumer receives the previous round's result again;
- `stale-commit`: the commit never reaches the backend, and the consumer receives the previous round's
  acknowledgement (a stale acknowledgement of an old verify);
- `stale`: the backend verifies, but the consumer receives the last result of the wrapper's previous
  sequence (a late answer to an earlier, e.g. cancelled, request). Injected only from the second
  sequence on; in the first there is nothing to replay and the fault is not counted.

Each scheduled fault is applied once per sequence. `injected` counts them by kind, with the names of
`RoundFault.kind`, so a test can require injected == detected == recovered. Every fault is a change
to a real result, never a model stand-in: undetected, each would change the output or break the round
(tests/spec/test_faults.py checks that).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from elpis.backend import Backend, BackendInfo
from elpis.spec.integrity import CommitAck, RoundId, RoundLink, VerifyResult

CORRUPT, DROPPED, REPEATED, STALE_COMMIT, STALE = "corrupt", "dropped", "repeated", "stale-commit", "stale"
IN_SEQUENCE = (CORRUPT, DROPPED, REPEATED, STALE_COMMIT)  # injectable in any sequence
KINDS = (*IN_SEQUENCE, STALE)
NEEDS_EARLIER_ROUND = (REPEATED, STALE_COMMIT)  # they replay what an earlier round produced


@dataclass(frozen=True)
class FaultSchedule:
    """`faults[round]` = the fault kinds of that round's attempts 0, 1, ... (attempts past the list run
    clean). `seed` drives where a corruption lands (row, column, bit)."""

    faults: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    seed: int = 0
    # The bits a corruption may flip (float32: 31 sign, 23-30 exponent, 0-22 mantissa).
    bits: tuple[int, ...] = tuple(range(32))

    def __post_init__(self) -> None:
        faults = {int(n): tuple(kinds) for n, kinds in self.faults.items()}
        for number, kinds in faults.items():
            if number < 0:
                raise ValueError(f"round numbers start at 0, got {number}")
            for kind in kinds:
                if kind not in KINDS:
                    raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
                if kind in NEEDS_EARLIER_ROUND and number == 0:
                    raise ValueError(f"a {kind} fault replays an earlier round: it cannot be at round 0")
        object.__setattr__(self, "faults", faults)
        object.__setattr__(self, "bits", tuple(int(b) for b in self.bits))
        if not self.bits or any(not 0 <= b < 32 for b in self.bits):
            raise ValueError(f"bits to flip must be in 0..31, got {self.bits}")

    @classmethod
    def seeded(
        cls,
        seed: int,
        rounds: int,
        count: int,
        kinds: Iterable[str] = IN_SEQUENCE,
        bits: Sequence[int] = range(32),
    ) -> FaultSchedule:
        """`count` faults at distinct rounds in 1..rounds-1, kinds drawn in turn from a shuffle of `kinds`
        (so every kind occurs once `count` >= the number of kinds)."""
        rng = random.Random(seed)
        kinds = list(kinds)
        if not 1 <= count <= rounds - 1:
            raise ValueError(f"{count} faults do not fit in rounds 1..{rounds - 1}")
        rng.shuffle(kinds)
        chosen = sorted(rng.sample(range(1, rounds), count))
        return cls({n: (kinds[i % len(kinds)],) for i, n in enumerate(chosen)}, seed=seed, bits=tuple(bits))

    def kind_at(self, round_id: RoundId) -> str | None:
        kinds = self.faults.get(round_id.number, ())
        return kinds[round_id.attempt] if round_id.attempt < len(kinds) else None

    def total(self) -> Counter[str]:
        return Counter(kind for kinds in self.faults.values() for kind in kinds)


class FaultyBackend(RoundLink):
    """A Backend (every call forwarded to `inner`) whose rounds are damaged as `schedule` says."""

    def __init__(self, inner: Backend, schedule: FaultSchedule) -> None:
        super().__init__(inner)
        self.info: BackendInfo = inner.info
        self.schedule = schedule
        self.rng = random.Random(schedule.seed)
        self.injected: Counter[str] = Counter()
        self.log: list[tuple[RoundId, str, str]] = []  # (round, kind, what was done)
        self.committed: list[RoundId] = []  # rounds whose commit reached the backend
        self.position_at_finish: int | None = None
        self._done: set[tuple[int, int, int]] = set()  # (epoch, number, attempt) already injected
        self._last_result: VerifyResult | None = None
        self._earlier_sequence: VerifyResult | None = None  # the last result of an earlier sequence
        self._last_ack: CommitAck | None = None

    # --- Backend: forwarded --------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> int:
        self._earlier_sequence = self._last_result or self._earlier_sequence
        self._last_result, self._last_ack, self.pending = None, None, None
        return self.backend.begin(prompt)

    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        return self.backend.verify(tokens, parents)

    def commit(self, rows: Sequence[int]) -> None:
        self.backend.commit(rows)

    def finish(self) -> None:
        self.position_at_finish = self.backend.position()
        self.backend.finish()

    def position(self) -> int:
        return self.backend.position()

    # --- the round link, with faults ----------------------------------------------------------------

    def _fault(self, round_id: RoundId, stage: tuple[str, ...]) -> str | None:
        kind = self.schedule.kind_at(round_id)
        key = (round_id.epoch, round_id.number, round_id.attempt)
        if kind not in stage or key in self._done:
            return None
        self._done.add(key)
        self.injected[kind] += 1
        return kind

    def verify_round(
        self, round_id: RoundId, tokens: Sequence[int], parents: Sequence[int]
    ) -> VerifyResult | None:
        result = super().verify_round(round_id, tokens, parents)
        stages = (CORRUPT, DROPPED, REPEATED) + ((STALE,) if self._earlier_sequence is not None else ())
        kind = self._fault(round_id, stages)
        if result is None or kind is None:
            self._last_result = result
            return result
        if kind == CORRUPT:
            return self._corrupt(result)
        if kind == DROPPED:
            self.log.append((round_id, kind, "result lost"))
            return None
        if kind == STALE:
            late = self._earlier_sequence
            assert late is not None
            self.log.append((round_id, kind, f"delivered {late.round} of an earlier sequence"))
            return late
        previous = self._last_result
        assert previous is not None, "a repeated fault needs an earlier round (FaultSchedule checks it)"
        self.log.append((round_id, kind, f"delivered {previous.round} again"))
        return previous

    def _corrupt(self, result: VerifyResult) -> VerifyResult:
        logits = result.logits.clone()  # the fault is in the delivered copy, not in the backend's state
        rows, cols = logits.shape
        row, col, bit = (
            self.rng.randrange(rows),
            self.rng.randrange(cols),
            self.rng.choice(self.schedule.bits),
        )
        mask = 1 << bit if bit < 31 else -(1 << 31)  # int32 cannot hold +2^31: the sign bit's mask is -2^31
        bits = logits.view(torch.int32)
        bits[row, col] ^= mask
        self.log.append((result.round, CORRUPT, f"flipped bit {bit} of row {row} column {col}"))
        return replace(result, logits=logits)

    def commit_round(self, round_id: RoundId, rows: Sequence[int]) -> CommitAck | None:
        if self._fault(round_id, (STALE_COMMIT,)) == STALE_COMMIT:
            previous = self._last_ack
            assert previous is not None, (
                "a stale-commit fault needs an earlier round (FaultSchedule checks it)"
            )
            self.log.append((round_id, STALE_COMMIT, f"commit not applied; acknowledged {previous.round}"))
            return previous
        ack = super().commit_round(round_id, rows)
        self.committed.append(round_id)
        self._last_ack = ack
        return ack
