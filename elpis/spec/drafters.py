"""Drafters: propose candidate tokens for the positions after the anchor.

`NgramDrafter` (prompt lookup) works with any backend and costs no model pass. The others exist for the
invariance tests: `OracleDrafter` runs the target itself and proposes the true continuation (every row is
accepted), `RandomDrafter` proposes noise, `AdversarialDrafter` mixes the truth with stop tokens and
near-misses in shifting ranks, `AlwaysWrongDrafter` never proposes the true token. A drafter only ever
changes speed, never the committed text.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

from elpis.backend import Backend, DraftBlock
from elpis.spec.grammar import Constraint, Grammar
from elpis.spec.penalties import History
from elpis.spec.sampling import SamplingParams, sample_row


class NgramDrafter:
    """Prompt lookup: continue the longest suffix of the context that occurred earlier in it.

    Among the earlier occurrences of the longest matching suffix (at most `max_matches`, most recent
    first), position d's candidates are the tokens that follow the occurrences still agreeing with the
    top-1 chain so far, with log(count / agreeing occurrences) as log-probability. A continuation may run
    into the tokens proposed in this very block, so a periodic context is continued past its end.
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_matches: int = 64) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_matches < 1:
            raise ValueError(f"max_matches must be >= 1, got {max_matches}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches
        self.reset()

    def reset(self) -> None:
        self._tokens: list[int] = []
        # n-gram -> end indices j of its earlier occurrences that have a following token (j + 1 < len).
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def _sync(self, context: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(context) < known or list(context[:known]) != self._tokens:
            self.reset()
            known = 0
        for token in context[known:]:
            self._tokens.append(int(token))
            end = len(self._tokens) - 2  # this n-gram end just gained its following token
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                self._ends.setdefault(tuple(self._tokens[end - n + 1 : end + 1]), []).append(end)

    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        self._sync(context)
        tokens = self._tokens
        if depth < 1 or top_k < 1:
            return DraftBlock([])
        matches: list[int] = []
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            matches = self._ends.get(tuple(tokens[-n:]), [])
            if matches:
                break
        alive = list(reversed(matches[-self.max_matches :]))  # most recent first
        proposed: list[int] = []
        candidates: list[list[tuple[int, float]]] = []
        for d in range(depth):
            following: list[tuple[int, int]] = []  # (match end, token following it at this depth)
            for end in alive:
                index = end + 1 + d
                token = tokens[index] if index < len(tokens) else proposed[index - len(tokens)]
                following.append((end, token))
            if not following:
                break
            counts = Counter(token for _, token in following)
            first_seen: dict[int, int] = {}
            for rank, (_, token) in enumerate(following):
                first_seen.setdefault(token, rank)
            ranked = sorted(counts, key=lambda t: (-counts[t], first_seen[t]))[:top_k]
            candidates.append([(t, math.log(counts[t] / len(following))) for t in ranked])
            best = ranked[0]
            proposed.append(best)
            alive = [end for end, token in following if token == best]
        return DraftBlock(candidates)


class OracleDrafter:
    """The target itself, run on a second backend instance of the same model: proposes the continuation
    the target will commit (greedy, or sampled with the request's own seed and positions), with the next
    most likely tokens as alternatives.

    It keeps its own sequence running and extends it only as far as asked, so over a whole request it
    costs one plain decode; a context that disagrees with what it has seen (another request, or a target
    that diverged) restarts it from that context.

    A request that adjusts its logits (penalties, logit_bias) or has a grammar needs `prompt_length`: both
    read the generated tokens apart from the prompt's.
    """

    MAX_ALTERNATIVES = 8

    def __init__(self, backend: Backend, sampling: SamplingParams, prompt_length: int | None = None,
                 grammar: Grammar | None = None) -> None:
        if (sampling.adjusts_logits or grammar is not None) and prompt_length is None:
            raise ValueError("an oracle for a request that adjusts its logits or has a grammar needs the "
                             "prompt's length")
        self.backend, self.sampling, self.prompt_length = backend, sampling, prompt_length
        self.grammar = grammar
        self._sequence: list[int] = []  # the oracle's committed context, anchor last
        self._levels: dict[int, list[tuple[int, float]]] = {}  # absolute position -> candidates
        self._history: History | None = None
        self._constraint: Constraint | None = None
        self._active = False

    def reset(self) -> None:
        if self._active:
            self.backend.finish()
        self._sequence, self._levels, self._history, self._active = [], {}, None, False
        self._constraint = None

    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        return DraftBlock(self.continuation_with_alternatives(context, depth, top_k))

    def continuation_with_alternatives(self, context: Sequence[int], depth: int,
                                       top_k: int) -> list[list[tuple[int, float]]]:
        import torch

        if depth < 1 or top_k < 1:
            return []
        length = len(context)
        common = min(length, len(self._sequence))
        if not (self._active and self._sequence[:common] == list(context[:common])):
            self.reset()
            self.backend.begin(list(context))
            self._sequence, self._active = list(context), True
            if self.sampling.adjusts_logits:
                start = self.prompt_length
                assert start is not None
                self._history = History(self.sampling, context[:start], self.backend.info.vocab_size)
                self._history.commit(context[start:])
            if self.grammar is not None:
                self._constraint = self.grammar.start()
                self._constraint.commit(context[self.prompt_length:])
        wanted = min(length + depth, self.backend.info.max_context)
        while len(self._sequence) < wanted:
            row = self.backend.verify([self._sequence[-1]], [-1])[0]
            position = len(self._sequence)
            # Tokens the target already committed are followed, not re-drawn: the state then comes from
            # decode steps only, like the target's (a fresh prefill may differ in the last bits).
            if position < length:
                token = context[position]
            else:
                drawn = row if self._history is None else self._history.adjusted(row.unsqueeze(0), [()])[0]
                if self._constraint is not None:
                    drawn = self._constraint.masked(drawn.unsqueeze(0), [()])[0]
                token = sample_row(drawn, self.sampling, position)
            if self._history is not None:
                self._history.commit([token])
            if self._constraint is not None:
                self._constraint.commit([token])
            logprobs = torch.log_softmax(row.to(torch.float64), dim=0)
            others = torch.topk(logprobs, self.MAX_ALTERNATIVES).indices.tolist()
            self._levels[position] = [(token, 0.0)] + [
                (int(t), min(float(logprobs[t]), 0.0)) for t in others if int(t) != token
            ]
            self.backend.commit([0])
            self._sequence.append(token)
        return [self._levels[p][:top_k] for p in range(length, min(length + depth, len(self._sequence)))]


class RandomDrafter:
    """Uniformly random candidates with random log-probabilities, deterministic per (seed, context
    length)."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size, self.seed = vocab_size, seed

    def reset(self) -> None:
        pass

    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        rng = random.Random(f"random-drafter/{self.seed}/{len(context)}")
        return DraftBlock([
            [(rng.randrange(self.vocab_size), -rng.random() * 4.0) for _ in range(max(top_k, 0))]
            for _ in range(max(depth, 0))
        ])


class AdversarialDrafter:
    """Aims at the acceptor's corners: the true continuation for a random stretch, then stop tokens,
    near-miss ids (true +- 1), duplicates and ties, with the truth moved to a lower rank or left out."""

    def __init__(self, oracle: OracleDrafter, stop_ids: Sequence[int], vocab_size: int,
                 seed: int = 0) -> None:
        self.oracle, self.stop_ids, self.vocab_size, self.seed = oracle, tuple(stop_ids), vocab_size, seed

    def reset(self) -> None:
        self.oracle.reset()

    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        truth = [level[0][0] for level in self.oracle.continuation_with_alternatives(context, depth, 1)]
        rng = random.Random(f"adversarial-drafter/{self.seed}/{len(context)}")
        honest = rng.randrange(len(truth) + 1)  # positions proposed truthfully at rank 0
        levels: list[list[tuple[int, float]]] = []
        for d, true_token in enumerate(truth):
            near = [(true_token + 1) % self.vocab_size, (true_token - 1) % self.vocab_size]
            decoys = [*self.stop_ids, *near, true_token]  # true_token repeated below: a duplicate
            rng.shuffle(decoys)
            if d < honest:
                ordered = [true_token, *decoys]
            elif rng.random() < 0.5:
                ordered = [decoys[0], true_token, *decoys[1:]]  # truth at rank 1: a sibling path
            else:
                ordered = [t for t in decoys if t != true_token]  # truth left out
            tie = rng.random() < 0.3  # equal scores exercise the builder's tie-breaks
            ordered = ordered[: max(top_k, 1)]
            levels.append([(t, 0.0 if tie else -0.1 * rank) for rank, t in enumerate(ordered)])
        return DraftBlock(levels)


class AlwaysWrongDrafter:
    """Never proposes the token the target will commit next (it asks the oracle and avoids it)."""

    def __init__(self, oracle: OracleDrafter, vocab_size: int) -> None:
        self.oracle, self.vocab_size = oracle, vocab_size

    def reset(self) -> None:
        self.oracle.reset()

    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        truth = [level[0][0] for level in self.oracle.continuation_with_alternatives(context, depth, 1)]
        return DraftBlock([
            [((t + 1 + i) % self.vocab_size, -0.5 * i) for i in range(max(top_k, 1))] for t in truth
        ])
