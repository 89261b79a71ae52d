"""The speculation loop: draft a tree, verify it in one call, let the proven acceptor decide, commit.

One round:
  1. the drafter proposes candidates after the committed context; `build_tree` picks rows (anchor first);
  2. `backend.verify` computes every row's logits in one call;
  3. every row's target token is drawn by `sample_rows`, keyed by (seed, absolute position), from its logits
     as the request's penalties and logit_bias adjust them over the row's own path (`elpis.spec.penalties`)
     and its grammar masks them there (`elpis.spec.grammar`);
  4. `elpis.accept.tree` decides which rows are committed (stops and the remaining max_tokens included);
  5. `backend.commit` advances the state along those rows; the drafter sees the longer context next time.
Steps 2-5 run through `elpis.spec.integrity`: the round has an identity, the verify result and the commit
acknowledgement are checked against it (lost, repeated, stale or corrupted results), and a round that
fails a check is discarded (nothing from it is committed or emitted), its pending verify abandoned, and
recomputed up to `round_retries` times before the generation fails with BackendError. The stats count
the faults detected (by kind) and the rounds recovered.
Without a drafter every tree is the anchor alone: that is plain decoding, the baseline of every
invariance test. Text is produced token by token (detokeniser, stop strings) so round boundaries never
change it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from elpis import accept
from elpis.accept.abi import BUDGET_MAX
from elpis.backend import UNDRAWN, Backend, BackendError, DeviceRounds, Drafter
from elpis.spec.detok import Decoder, IncrementalDetokenizer
from elpis.spec.grammar import Constraint
from elpis.spec.integrity import RoundFault, RoundId, RoundLink, RoundTracker
from elpis.spec.penalties import History, tree_paths
from elpis.spec.request import (
    MAX_STOP_TOKEN_IDS,
    GenerationRequest,
    GenerationStats,
    Step,
    TokenLogprob,
    stop_ids_for,
)
from elpis.spec.run_choice import RunChoice
from elpis.spec.sampling import sample_rows, top_logprobs
from elpis.spec.stops import StopStringScanner
from elpis.spec.thinking import ThinkingTracker
from elpis.spec.tree import (
    MAX_ROWS,
    DraftTree,
    build_tree,
    choose_row_count,
    tree_shape,
    verify_costs,
    with_forced,
)

DEFAULT_TREE_BUDGET = 8
DEFAULT_DRAFT_TOP_K = 4
DEFAULT_ROUND_RETRIES = 3  # recomputations of one round after discarded attempts, before giving up

_EPOCHS = itertools.count(1)  # sequence epochs, unique in the process: a result of another sequence is stale
MAX_HOST_STRETCH = 64  # host rounds at most between two tries of the device after undrawn rounds (_Backoff)


@dataclass
class _Backoff:
    """Host rounds owed after undrawn device rounds. The host decides an undrawn round's position; where the
    device leaves round after round to the host (rows too flat for its draw: a top_p prefix past the weights
    it reads), each undrawn round in a row doubles the host rounds run before the device is tried again (1, 2,
    4, ... MAX_HOST_STRETCH), since each try costs a round that commits nothing; a round the device commits
    resets it. Session 57 measured such rounds at 50.8 ms where host rounds took 18.4 (H100, a random model's
    flat rows under top_p 0.8, every round undrawn)."""

    owed: int = 0
    stretch: int = 1

    def undrawn(self) -> None:
        """An undrawn round: the host decides it, the first of its stretch, and is owed the rest."""
        self.owed, self.stretch = self.stretch - 1, min(2 * self.stretch, MAX_HOST_STRETCH)

    def drawn(self) -> None:
        self.stretch = 1

    def host_turn(self) -> bool:
        """Whether this round is owed to the host (and count it)."""
        if not self.owed:
            return False
        self.owed -= 1
        return True


class SpeculativeGenerator:
    def __init__(self, backend: Backend, tokenizer: Decoder, drafter: Drafter | None = None,
                 tree_budget: int = DEFAULT_TREE_BUDGET, draft_top_k: int = DEFAULT_DRAFT_TOP_K,
                 round_retries: int = DEFAULT_ROUND_RETRIES) -> None:
        if not 1 <= tree_budget <= MAX_ROWS:
            raise ValueError(f"tree budget must be in 1..{MAX_ROWS} rows (anchor included), "
                             f"got {tree_budget}")
        if draft_top_k < 1:
            raise ValueError(f"draft_top_k must be >= 1, got {draft_top_k}")
        if round_retries < 0:
            raise ValueError(f"round_retries must be >= 0, got {round_retries}")
        self.backend, self.tokenizer, self.drafter = backend, tokenizer, drafter
        self.tree_budget = tree_budget if drafter is not None else 1
        self.draft_top_k = draft_top_k
        self.round_retries = round_retries

    def stop_ids(self, request: GenerationRequest) -> tuple[int, ...]:
        return stop_ids_for(request, self.backend.info.stop_token_ids)

    def _validate(self, request: GenerationRequest, stops: Sequence[int]) -> None:
        info = self.backend.info
        if request.max_tokens > BUDGET_MAX:
            raise ValueError(f"max_tokens must be at most {BUDGET_MAX}, got {request.max_tokens}")
        if len(request.prompt_ids) > info.max_context:
            raise ValueError(f"prompt has {len(request.prompt_ids)} tokens; "
                             f"the context holds {info.max_context}")
        biased = tuple(t for t, _ in request.sampling.logit_bias)
        grammar = request.grammar
        if grammar is not None and grammar.tokenizer.vocab_size != info.vocab_size:
            raise ValueError(f"the grammar was built for {grammar.tokenizer.vocab_size} token ids; the model "
                             f"has {info.vocab_size}")
        closing = request.thinking.close if request.thinking is not None else ()
        named = (("prompt", request.prompt_ids), ("stop token", stops), ("logit_bias token", biased),
                 ("thinking's closing token", closing))
        for name, ids in named:
            bad = [t for t in ids if t >= info.vocab_size]
            if bad:
                raise ValueError(f"{name} ids {bad[:4]} are outside the vocabulary "
                                 f"(0..{info.vocab_size - 1})")

    def _tree(self, context: list[int], remaining: int, room: int, costs: list[float] | None,
              budget: int | None = None, constraint: Constraint | None = None) -> DraftTree:
        rows, depth = tree_shape(budget or self.tree_budget, room, remaining)
        if self.drafter is None or depth < 1:
            return DraftTree((context[-1],), (-1,), (0,), (0.0,))
        block = self.drafter.propose(context, depth, self.draft_top_k)
        if constraint is not None:
            block = with_forced(block, constraint.forced_tokens(depth))
        tree = build_tree(context[-1], block, rows, max_depth=depth, vocab_size=self.backend.info.vocab_size)
        return tree.prefix(choose_row_count(tree, costs[:rows] if costs else None))

    def _forced_tree(self, context: list[int], forced: Sequence[int], remaining: int, room: int) -> DraftTree:
        """A forced round's tree: the anchor and then the forced tokens but the last, a chain of as many rows
        as a round of this generator may verify here (`tree_shape`), the forced tokens' count at most."""
        rows, depth = tree_shape(self.tree_budget, room, remaining)
        count = min(len(forced), rows, depth + 1)
        tokens = (context[-1], *forced[: count - 1])
        return DraftTree(tokens, tuple(range(-1, count - 1)), tuple(range(count)), (0.0,) * count)

    def _round(self, link: RoundLink, tracker: RoundTracker, tree: DraftTree, context: list[int],
               request: GenerationRequest, stops: tuple[int, ...], remaining: int,
               stats: GenerationStats,
               history: History | None,
               constraint: Constraint | None,
               forced: Sequence[int] = ()) -> tuple[torch.Tensor, list[int], accept.TreeDecision]:
        """Verify, sample, accept and commit one round; an attempt failing a check is discarded and the
        same tree verified again. Returns the checked (raw) logits, the targets and the committed decision.
        `history`: the request's adjustments, `constraint` its grammar (None when it has none). `forced`: a
        forced round's targets, one a row of its chain (`_forced_tree`), in place of the rows' draws: the
        acceptor commits them as it commits drawn ones, up to a stop token or the remaining tokens."""
        base = len(context)  # absolute position of the token the anchor row draws
        adjusted = history is not None or constraint is not None
        paths = tree_paths(tree.tokens, tree.parents) if adjusted else []
        faults: list[RoundFault] = []
        for attempt in range(self.round_retries + 1):
            # The position expected is the loop's own count (anchor excluded), not the backend's word.
            asked = tracker.round_id(stats.rounds, attempt, base - 1, tree.tokens, tree.parents)
            try:
                result = link.verify_round(asked, tree.tokens, tree.parents)
                # The grammar's masks are host work on the tree alone: done while the device verifies.
                masks = constraint.row_masks(paths) if constraint is not None else None
                if forced:
                    logits, targets = tracker.check_verify(asked, len(tree), result), list(forced)
                elif request.sampling.greedy and not adjusted:
                    logits, targets = tracker.check_verify_greedy(asked, len(tree), result)  # with the checks
                else:
                    logits = tracker.check_verify(asked, len(tree), result)
                    rows = logits
                    if history is not None:
                        rows = history.adjusted(rows, paths)
                    if constraint is not None:
                        rows = constraint.apply(rows, masks)
                    targets = sample_rows(rows, request.sampling, [base + d for d in tree.depths])
                decision = accept.tree(tree.parents, tree.tokens, targets, stops, remaining)
                if not (1 <= decision.count == len(decision.rows) and decision.rows[0] == 0):
                    raise RuntimeError(f"acceptor returned an impossible decision {decision}")
                tracker.check_commit(asked, decision.rows, link.commit_round(asked, decision.rows))
            except RoundFault as fault:
                faults.append(fault)
                stats.count_fault(fault.kind)
                self._discard(link, asked, fault)
                continue
            if faults:
                stats.rounds_recovered += 1
            return logits, targets, decision
        kinds = ", ".join(f.kind for f in faults)
        raise BackendError(f"round {stats.rounds} failed all {len(faults)} attempts ({kinds}); "
                           f"nothing of it was committed; last fault: {faults[-1]}") from faults[-1]

    def _discard(self, link: RoundLink, asked: RoundId, fault: RoundFault) -> None:
        """Undo a failed attempt: possible only while the committed state is the one it started from."""
        position = self.backend.position()
        if position != asked.position:
            raise BackendError(f"{asked} failed a check ({fault}) after the backend moved to position "
                               f"{position}: its state can no longer be trusted") from fault
        try:
            link.abandon_round()
        except BackendError as error:
            raise BackendError(f"{asked} failed a check ({fault}) and cannot be discarded: "
                               f"{error}") from fault

    def generate(self, request: GenerationRequest,
                 should_stop: Callable[[], bool] = lambda: False) -> Iterator[Step]:
        """Run one request to the end; one Step per round, the last one has finish_reason and stats.

        A bad request raises ValueError here, before anything runs; the backend sequence begins at the
        first `next()` and is always finished, also when the caller abandons the iterator."""
        stops = self.stop_ids(request)
        self._validate(request, stops)
        return self._run(request, stops, should_stop)

    def _run(self, request: GenerationRequest, stops: tuple[int, ...],
             should_stop: Callable[[], bool]) -> Iterator[Step]:
        cached = self.backend.begin(request.prompt_ids)
        try:
            yield from self._rounds(request, stops, cached, should_stop)
        finally:
            self.backend.finish()

    def _rounds(self, request: GenerationRequest, stops: tuple[int, ...], cached: int,
                should_stop: Callable[[], bool]) -> Iterator[Step]:
        backend = self.backend
        if self.drafter is not None:
            self.drafter.reset()
        context = list(request.prompt_ids)
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_ids)
        scanner = StopStringScanner(request.stop_strings)
        stats = GenerationStats(prompt_tokens=len(request.prompt_ids), cached_tokens=cached)
        want_logprobs = request.top_logprobs is not None
        params = request.sampling
        constraint = request.grammar.start() if request.grammar is not None else None
        history = (History(params, request.prompt_ids, self.backend.info.vocab_size)
                   if params.adjusts_logits else None)
        host_round = self._host_rounds(request, stops, context, stats, constraint, history)

        def fresh_source() -> Callable[[int, int], _Committed]:
            return self._round_source(request, stops, context, stats, constraint, history, host_round)

        next_round = fresh_source()
        thinking = ThinkingTracker(request.thinking) if request.thinking is not None else None

        def final(ids: list[int], logprobs: list[TokenLogprob] | None, reason: str) -> Step:
            if scanner.cut is None and scanner.feed(detokenizer.flush()):
                reason = "stop"
            return Step(ids, scanner.release(final=True), logprobs, reason, stats, scanner.matched)

        while True:
            if should_stop():
                yield final([], [] if want_logprobs else None, "cancelled")
                return
            remaining = request.max_tokens - stats.completion_tokens
            room = backend.info.max_context - backend.position()
            if room < 1:
                yield final([], [] if want_logprobs else None, "length")
                return
            closing = thinking.due() if thinking is not None else ()
            if closing:  # the reasoning's budget is spent: its closing tokens, committed by the host
                done = host_round(remaining, room, closing)
            else:  # no round commits past what the budget has left
                done = next_round(thinking.cap(remaining) if thinking is not None else remaining, room)
            committed = list(done.tokens)
            if thinking is not None:
                thinking.saw(committed, forced=bool(closing))
            if done.ends and committed[-1] not in stops and len(committed) < remaining:
                # The round ended at the budget's cap, not at the request's end: rounds on the device, which
                # ended there (what they queued past it idles), start again from here with the request's.
                done = replace(done, ends=False)
                self._drain_device()
                next_round = fresh_source()
            context.extend(committed)
            stats.rounds += 1
            stats.committed_per_round.append(len(committed))
            stats.accepted_depths.append(len(committed) - 1)
            stats.tree_rows.append(done.tree_rows)

            ids: list[int] = []
            logprobs: list[TokenLogprob] | None = [] if want_logprobs else None
            hit_stop_string = False
            for i, token in enumerate(committed):
                ids.append(token)
                if logprobs is not None and done.logprobs is not None:  # the device's, as the host's below
                    logprobs.append(done.logprobs[i])
                elif logprobs is not None:
                    assert done.logits is not None
                    logprobs.append(top_logprobs(done.logits[i], token, request.top_logprobs or 0))
                if token in stops:
                    break  # the acceptor ended the round here; a stop token's text is never emitted
                if scanner.feed(detokenizer.push(token)):
                    hit_stop_string = True
                    break
            stats.completion_tokens += len(ids)
            if hit_stop_string:
                yield Step(ids, scanner.release(final=True), logprobs, "stop", stats, scanner.matched)
                return
            if done.ends:
                yield final(ids, logprobs, "stop" if committed[-1] in stops else "length")
                return
            yield Step(ids, scanner.release(final=False), logprobs)

    def _round_source(self, request: GenerationRequest, stops: tuple[int, ...], context: list[int],
                      stats: GenerationStats, constraint: Constraint | None, history: History | None,
                      host_round: Callable[[int, int], _Committed]) -> Callable[[int, int], _Committed]:
        """How each round is run: on the backend's device for a request whose targets the device decides
        (`DeviceRounds.draws`: greedy, sampled with a draw it takes, adjusted where it adjusts) and, if it
        asks for logprobs, whose rounds there report them (`reports_logprobs`), when the backend has rounds
        there (`elpis.backend.DeviceRounds`) and a drafter is set, else on the host. A round the device could
        not draw (`UNDRAWN`) is the host's, and the device's rounds start again after it (after more host
        rounds where undrawn rounds follow each other: `_Backoff`); the request's history (penalties,
        logit_bias) is one for both, each committed token counted. A grammar's request runs there too while
        its grammar is closed: each round ends at the opening token the grammar awaits, as at a stop, and the
        rounds after the last one are the host's, which mask their rows. `constraint`, `history` and
        `host_round` are the request's, shared by every source it makes (a new one starts the device's rounds
        again: `_rounds`, after a round that ended short of the request's end)."""
        device = getattr(self.backend, "device_rounds", None)
        params = request.sampling
        logprobs_here = request.top_logprobs is None or getattr(device, "reports_logprobs", False)
        on_device = (device is not None and self.drafter is not None and logprobs_here
                     and device.serves() and device.draws(params))
        if not on_device:
            return host_round
        prompt_length = len(request.prompt_ids)

        def start(remaining: int, ends_at: tuple[int, ...]) -> None:
            device.start(context=context, remaining=remaining, tree_budget=self.tree_budget, stops=ends_at,
                         top_k=self.draft_top_k, sampling=params, generated=len(context) - prompt_length,
                         top_logprobs=request.top_logprobs)

        def device_round() -> _Committed | None:
            done = self._device_round(device, stats)
            if done is not None and history is not None:
                history.commit(done.tokens)  # for the host's rounds after these
            return done

        backoff = _Backoff()
        if constraint is None:
            started = False

            def round_on_device(remaining: int, room: int) -> _Committed:
                nonlocal started
                if backoff.host_turn():
                    return host_round(remaining, room)
                if not started:
                    start(remaining, stops)
                    started = True
                done = device_round()
                if done is None:  # undrawn: the host decides this round; the device starts again after it
                    started = False
                    backoff.undrawn()
                    return host_round(remaining, room)
                backoff.drawn()
                return done

            return round_on_device
        if len(stops) >= MAX_STOP_TOKEN_IDS and any(t not in stops for t in constraint.grammar.opens_after):
            return host_round  # no stop slot left for an opening token
        running: int | None = None  # the opening token the device's rounds end at, while they run

        def round_until_open(remaining: int, room: int) -> _Committed:
            nonlocal running
            awaited = constraint.awaited
            if awaited is None or backoff.host_turn():  # opened (and drained), or the host's turn
                return host_round(remaining, room)
            if running != awaited:
                # an awaited stop ends the request before the grammar opens: no slot of its own
                start(remaining, stops if awaited in stops else (*stops, awaited))
                running = awaited
            done = device_round()
            if done is None:  # undrawn: the host decides this round (and commits it to the grammar)
                running = None
                backoff.undrawn()
                return host_round(remaining, room)
            backoff.drawn()
            constraint.commit(done.tokens)
            if done.ends and awaited not in stops and done.tokens[-1] == awaited:
                # The round ended at the opening token, not the request (unless max_tokens ends it there).
                device.drain()
                running = None
                return replace(done, ends=len(done.tokens) >= remaining)
            return done

        return round_until_open

    def _host_rounds(self, request: GenerationRequest, stops: tuple[int, ...], context: list[int],
                     stats: GenerationStats, constraint: Constraint | None,
                     history: History | None) -> HostRound:
        """Rounds on the host: the tree built here, the verify's rows adjusted (`history`, the request's
        penalties and bias) and masked and sampled here; or, with `forced` tokens, a forced round: the tree is
        the anchor and the first of them in a chain, and its targets are theirs (`_round`)."""
        backend = self.backend
        link = backend if isinstance(backend, RoundLink) else RoundLink(backend)
        tracker = RoundTracker(next(_EPOCHS), backend.info.vocab_size)
        costs = None
        choice: RunChoice | None = None
        if self.drafter is not None:
            costs = verify_costs(getattr(backend, "verify_cost", None), self.tree_budget)
            choice = getattr(backend, "run_choice", None)

        def host_round(remaining: int, room: int, forced: Sequence[int] = ()) -> _Committed:
            budget = run = None
            if forced:
                tree = self._forced_tree(context, forced, remaining, room)
            else:
                if choice is not None:  # the row count the backend verifies at (`elpis.spec.run_choice`)
                    run = choice.choose(backend.position(), self.tree_budget)
                    budget = choice.budget_at(run, self.tree_budget)
                    choice.chose(run, self.tree_budget)
                tree = self._tree(context, remaining, room, costs, budget, constraint)
            logits, targets, decision = self._round(link, tracker, tree, context, request, stops, remaining,
                                                    stats, history, constraint, forced[: len(tree)])
            committed = tuple(targets[r] for r in decision.rows)
            if history is not None:
                history.commit(committed)
            if constraint is not None:
                constraint.commit(committed)
            if choice is not None and run is not None and not decision.ends:
                choice.observe(run, self.tree_budget, tree.parents, decision.rows)
            return _Committed(committed, decision.ends, len(tree), [logits[r] for r in decision.rows])

        return host_round

    def _drain_device(self) -> None:
        """Drop the device's rounds in flight (queued past a round that ended), if it has rounds."""
        device = getattr(self.backend, "device_rounds", None)
        if device is not None:
            device.drain()

    def _device_round(self, device: DeviceRounds, stats: GenerationStats) -> _Committed | None:
        """One round on the device; a round it discards (a row failed its checks) is verified again, up to
        `round_retries` times, as a host round's would be. Faults its result met on the way back (fetched
        again by the device rounds) are counted, and the round with them as recovered. None: the device could
        not draw a row of the round (`UNDRAWN`, counted) and nothing in flight committed: the caller has the
        host decide the position, where the device's rounds stopped."""
        faults: list[str] = []  # the discarded attempts'
        met = 0  # faults of any kind this round met
        for _ in range(self.round_retries + 1):
            done = device.round()
            if done.fault == UNDRAWN:
                stats.count_fault(UNDRAWN)
                settled = device.settle()
                if settled is None:
                    return None
                done = settled
            for kind in done.recovered:
                stats.count_fault(kind, discarded=False)
            met += len(done.recovered)
            if done.fault is None:
                if not 1 <= len(done.tokens) <= done.tree_rows:
                    raise BackendError(f"a round on the device committed {len(done.tokens)} tokens from a "
                                       f"tree of {done.tree_rows} rows")
                if met or faults:
                    stats.rounds_recovered += 1
                return _Committed(done.tokens, done.ends, done.tree_rows, None, done.logprobs)
            faults.append(done.fault)
            stats.count_fault(done.fault)
        raise BackendError(f"round {stats.rounds} failed all {len(faults)} attempts on the device "
                           f"({', '.join(faults)}); nothing of it was committed")


class HostRound(Protocol):
    """A request's host rounds (`SpeculativeGenerator._host_rounds`): `forced` tokens make a forced round."""

    def __call__(self, remaining: int, room: int, forced: Sequence[int] = ()) -> _Committed: ...


@dataclass(frozen=True)
class _Committed:
    """What a round committed: the target tokens, whether the acceptor ended the request, the tree's rows, and
    each committed token's logits row (host rounds; None on the device, which keeps no logits), or, from the
    device, a logprobs request's log-probabilities of them, computed there from the same rows."""

    tokens: tuple[int, ...]
    ends: bool
    tree_rows: int
    logits: list[torch.Tensor] | None
    logprobs: tuple[TokenLogprob, ...] | None = None
