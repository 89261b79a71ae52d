"""The backend interface: one sequence at a time, verify a token tree in one call, commit a path.

Two implementations: `elpis.reference` (exact numerics, any device) and `elpis.exl3` (ExLlamaV3 on a GPU).
The speculation loop and the server never branch on which one runs.

Vocabulary of a round:
  - the *committed context* is every token whose effect is in the backend state, plus the *anchor*: the
    last committed token, whose own forward pass has not run yet.
  - `verify(tokens, parents)` runs R rows in one call. Row 0 is the anchor (`parents[0] == -1`), rows
    1..R-1 are draft tokens with `parents[r] < r`. Row r's logits are the target's next-token logits after
    committed context + the tokens on the path root..r (each row sees exactly its ancestors and itself, at
    positions given by its depth).
  - `commit(rows)` takes a root-first path `[0, r1, ..., r_{c-1}]` (the acceptor's committed rows) and makes
    the state equal to the state after running the anchor and the draft tokens of r1..r_{c-1} one by one.
    The target token of the last committed row becomes the next anchor, supplied by the caller as
    `tokens[0]` of the next `verify`.
  - Plain decoding is `verify([anchor], [-1])` then `commit([0])`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from elpis.spec.sampling import SamplingParams


@dataclass(frozen=True)
class BackendInfo:
    name: str  # "reference" or "exl3"
    model_id: str  # the id served at /v1/models
    vocab_size: int  # width of a logits row (may exceed the tokenizer's vocabulary: padding ids)
    max_context: int  # committed tokens + rows of one verify must stay within this
    stop_token_ids: tuple[int, ...]  # the model's own end-of-turn / end-of-text ids
    device: str  # "cpu", "cuda:0", ...


class BackendError(RuntimeError):
    """A fatal engine failure: the server turns unhealthy instead of answering garbage."""


@runtime_checkable
class Backend(Protocol):
    info: BackendInfo

    def begin(self, prompt: Sequence[int]) -> int:
        """Start a sequence whose committed context is `prompt` (`prompt[-1]` is the anchor).

        Reuses the longest cached prefix of `prompt` and prefills the rest. Returns how many prompt
        tokens were served from the prefix cache (reported as `cached_tokens`).
        """
        ...

    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Logits of every row, float32 `[len(tokens), info.vocab_size]`, on the backend's device."""
        ...

    def commit(self, rows: Sequence[int]) -> None:
        """Advance the state along the accepted root-first path of the last `verify`."""
        ...

    def finish(self) -> None:
        """End the sequence; its state may stay cached for later prefix reuse."""
        ...

    def position(self) -> int:
        """Number of committed tokens whose effect is in the state (the anchor excluded)."""
        ...


@dataclass(frozen=True)
class DraftBlock:
    """What a drafter proposes after the anchor: for each depth 1..D, candidates best first.

    `candidates[d]` holds `(token_id, log_prob)` pairs for draft position d+1. For a chain drafter each
    list has one entry. A tree builder picks rows from these (best-first by summed log-probability).
    """

    candidates: list[list[tuple[int, float]]]


@runtime_checkable
class Drafter(Protocol):
    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        """Candidates for up to `depth` positions after `context` (whose last token is the anchor)."""
        ...

    def reset(self) -> None:
        """Forget per-sequence state (called when a new sequence begins)."""
        ...


# A sampled round on the device that could not draw a row of its committed path there (the row's top_k head
# ties past the logits the device reads, or its top_p prefix runs past them, or a row's maximum is not
# finite): nothing is committed, and the host decides the position (`DeviceRounds.settle`, then a host round),
# as it draws such a row from the whole vocabulary.
UNDRAWN = "undrawn"


@dataclass(frozen=True)
class DeviceRound:
    """One round decided on the backend's device (`DeviceRounds.round`): the tree's rows, the target tokens it
    committed (their count is the acceptor's; empty when `fault` names why nothing was committed, and the
    same round is then verified again, or with `UNDRAWN` decided by the host), whether the acceptor ended the
    request (a stop token or max_tokens), and the faults its result met on the way back that were detected
    and recovered (the result fetched again: it is the same round's)."""

    tree_rows: int
    tokens: tuple[int, ...]
    ends: bool
    fault: str | None = None
    recovered: tuple[str, ...] = ()
    # a request with top_logprobs: each committed token's (id, log-probability, alternatives), from its row's
    # raw logits as the host computes them (`elpis.spec.sampling.top_logprobs`); None otherwise
    logprobs: tuple[tuple[int, float, list[tuple[int, float]]], ...] | None = None


@runtime_checkable
class DeviceRounds(Protocol):
    """Speculative rounds whose tree, acceptance and commit run on the backend's device, with one host
    read-back per round (elpis.exl3.device_round). The generator uses it, when the backend has one, for
    requests whose targets it decides (`draws`: greedy or sampled, with or without penalties and
    logit_bias; with logprobs only where `reports_logprobs`), and for a grammar's requests until the grammar
    opens: their rounds end at the awaited opening token as at a stop, and host rounds (or device rounds
    started again) go on from there."""

    reports_logprobs: bool  # whether rounds here report the committed tokens' log-probabilities (`start`)

    def serves(self) -> bool:
        """Whether the backend's current mode runs its speculative rounds here (a backend switched to chain
        verifies, as the bench's chain system does on a tree load, runs them on the host)."""
        ...

    def draws(self, sampling: SamplingParams) -> bool:
        """Whether rounds here decide a request's targets under `sampling` (the host's tokens, row by row):
        greedy or drawn, with or without penalties and logit_bias."""
        ...

    def start(self, *, context: Sequence[int], remaining: int, tree_budget: int, stops: Sequence[int],
              top_k: int, sampling: SamplingParams | None = None, generated: int = 0,
              top_logprobs: int | None = None) -> None:
        """Take over the backend's begun sequence, whose tokens so far are `context` (the prompt, then every
        committed token; its last is the anchor the next round starts from): `remaining` tokens to generate at
        most, a round ending at the first of `stops` it commits, each row's target decided under `sampling`
        (None: the raw argmax), whose penalties count the last `generated` tokens of `context` as generated,
        each round reporting its tokens' log-probabilities with `top_logprobs` alternatives (None: none; only
        where `reports_logprobs`). A sequence may be taken over again after host rounds or after rounds here
        that ended at a stop."""
        ...

    def settle(self) -> DeviceRound | None:
        """Read the rounds still in flight without queuing more (after an `UNDRAWN` round, before the host
        decides its position): the one that committed, or None when none did (the host is then where the
        undrawn round was)."""
        ...

    def drain(self) -> None:
        """Wait for the rounds still in flight (queued ahead of a round that ended) and drop them, so that
        host rounds can go on with the sequence."""
        ...

    def round(self) -> DeviceRound:
        """Run one round and move the backend's state by what it committed."""
        ...
