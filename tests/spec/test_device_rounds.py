"""The generator's path for backends that run greedy rounds on their device (`elpis.backend.DeviceRounds`).

On the GPU the rounds are `elpis.exl3.device_round` (tree, acceptance and commit in CUDA kernels; its own
tests: tests/kernels/test_round_*_emu.py and the GPU test tests/exl3/test_device_round.py). Here the
protocol is served on the CPU by `HostDeviceRounds`, which decides each round the way those kernels do
(the tree from the drafter at the full row budget, the verify's greedy targets, the proven acceptor, the
commit; a round with a flagged row commits nothing), over the reference backend. The generator must turn
those rounds into exactly plain decoding's text (stop tokens, stop strings, max_tokens), retry a discarded
round and count it, draw a sampled request's rows where the device draws them (`draws`) and hand a round the
device could not draw (`UNDRAWN`) to the host, and keep host rounds for the other sampled requests and
logprobs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from elpis import accept
from elpis.backend import UNDRAWN, BackendError, DeviceRound
from elpis.spec import GenerationRequest, SamplingParams
from elpis.spec.drafters import NgramDrafter, OracleDrafter, RandomDrafter
from elpis.spec.grammar import Grammar
from elpis.spec.penalties import History, tree_paths
from elpis.spec.request import MAX_STOP_TOKEN_IDS
from elpis.spec.sampling import SamplingParams as Params
from elpis.spec.sampling import greedy_tokens, sample_rows, top_logprobs
from elpis.spec.tree import build_tree, tree_shape
from tests.grammar_cases import WEATHER, check_weather

PROMPT = "one two three, one two three, one two three, one two"
Transit = dict[int, str] | None  # attempt -> the fault its result met on the way back


class HostDeviceRounds:
    """DeviceRounds over a reference backend, deciding as elpis.exl3.device_round's kernels do; `faults` are
    the round numbers (counting attempts) whose verify gets a flagged row, `transit` those whose result met a
    fault on its way back and was fetched again (elpis.exl3.device_round.checked_records), by kind. With
    `drawing`, sampled top_k requests' rows are drawn here (`sample_rows` for each row's position, as the
    draw kernel does), and with `adjusting` rows are adjusted for penalties and logit_bias first (a History
    of the request's prompt and generated tokens, each row counting its own path, as the adjust kernel does);
    `undrawn` are the attempts whose draw the device leaves to the host, and `in_flight_commits` those of
    them after which the round still in flight commits (`settle`)."""

    def __init__(self, backend, drafter, faults: Sequence[int] = (), transit: Transit = None) -> None:
        self.backend, self.drafter, self.faults = backend, drafter, set(faults)
        self.transit = transit or {}
        self.drawing = False
        self.adjusting = False
        self.history: History | None = None
        self.undrawn: set[int] = set()
        self.in_flight_commits: set[int] = set()
        self.settles = 0
        self.sampling: Params | None = None
        self.attempts = 0
        self.started = False
        self.serving = True  # False: the backend's mode keeps rounds on the host (`serves`)
        self.sequence: list[int] = []  # the prompt and every committed token (start() takes it)
        self.starts: list[tuple[int, ...]] = []  # each start's stop ids
        self.committed: list[int] = []  # every token these rounds committed
        self.drains = 0
        self.reports_logprobs = False  # True: logprobs requests run here, each round reporting its tokens'
        self.top_logprobs: int | None = None

    def serves(self) -> bool:
        return self.serving

    def draws(self, params: Params) -> bool:
        if params.adjusts_logits and not self.adjusting:
            return False
        return params.greedy or (self.drawing and params.top_k > 0)

    def start(self, *, context: Sequence[int], remaining: int, tree_budget: int, stops: Sequence[int],
              top_k: int, sampling: Params | None = None, generated: int = 0,
              top_logprobs: int | None = None) -> None:
        if top_logprobs is not None and not self.reports_logprobs:
            raise ValueError("the device reports no logprobs")
        self.top_logprobs = top_logprobs
        if len(context) != self.backend.position() + 1:
            raise BackendError(f"context of {len(context)} tokens at position {self.backend.position()}")
        if sampling is not None and not self.draws(sampling):
            raise ValueError("the device does not draw this request's rows")
        self.sampling = None if sampling is None or sampling.greedy else sampling
        self.history = None
        if sampling is not None and sampling.adjusts_logits:
            cut = len(context) - generated
            self.history = History(sampling, context[:cut], self.backend.info.vocab_size)
            self.history.commit(context[cut:])
        self.sequence = list(context)
        self.remaining, self.tree_budget, self.stops, self.top_k = remaining, tree_budget, tuple(stops), top_k
        self.started = True
        self.starts.append(self.stops)

    def drain(self) -> None:
        self.drains += 1

    def settle(self) -> DeviceRound | None:
        self.settles += 1
        return self.round() if self.attempts in self.in_flight_commits else None

    def round(self) -> DeviceRound:
        b = self.backend
        room = b.info.max_context - b.position()
        rows, depth = tree_shape(self.tree_budget, room, self.remaining)
        context = self.sequence
        if depth >= 1:
            block = self.drafter.propose(context, depth, self.top_k)
            tree = build_tree(context[-1], block, rows, max_depth=depth, vocab_size=b.info.vocab_size)
            tokens, parents = tree.tokens, tree.parents
        else:
            tokens, parents = (context[-1],), (-1,)
        raw = logits = b.verify(tokens, parents)
        if self.history is not None:
            logits = self.history.adjusted(logits, tree_paths(tokens, parents))
        if self.sampling is None:
            targets = greedy_tokens(logits)
        else:  # each row draws the token after it: the anchor's is at len(context)
            depth: list[int] = []
            for parent in parents:
                depth.append(0 if parent < 0 else depth[parent] + 1)
            targets = sample_rows(logits, self.sampling, [len(context) + d for d in depth])
        self.attempts += 1
        recovered = (self.transit[self.attempts],) if self.attempts in self.transit else ()
        if self.attempts in self.faults:
            b.abandon()
            return DeviceRound(len(tokens), (), False, "corrupt", recovered)
        if self.attempts in self.undrawn:
            b.abandon()
            return DeviceRound(len(tokens), (), False, UNDRAWN, recovered)
        decision = accept.tree(list(parents), list(tokens), targets, list(self.stops), self.remaining)
        b.commit(decision.rows)
        committed = tuple(targets[r] for r in decision.rows)
        if self.history is not None:
            self.history.commit(committed)
        self.remaining -= decision.count
        self.sequence.extend(committed)
        self.committed.extend(committed)
        logprobs = None
        if self.top_logprobs is not None:  # from the raw rows, as exl3's rounds read their kept logits
            pairs = zip(decision.rows, committed, strict=True)
            logprobs = tuple(top_logprobs(raw[r], t, self.top_logprobs) for r, t in pairs)
        return DeviceRound(len(tokens), committed, decision.ends, recovered=recovered, logprobs=logprobs)


class WithDeviceRounds:
    """A reference backend whose rounds the generator runs through `device_rounds`."""

    def __init__(self, inner, drafter, faults: Sequence[int] = (), transit: Transit = None) -> None:
        self.inner, self.info = inner, inner.info
        self.verify, self.commit, self.abandon = inner.verify, inner.commit, inner.abandon
        self.finish, self.position = inner.finish, inner.position
        self.begin = inner.begin
        self.device_rounds = HostDeviceRounds(self, drafter, faults, transit)


def _request(model, max_tokens: int = 24, **extra) -> GenerationRequest:
    return GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), max_tokens, SamplingParams(), **extra)


def _drafters(model, request):
    return {
        "oracle": OracleDrafter(model.backend(), request.sampling),
        "ngram": NgramDrafter(max_ngram=3),
        "random": RandomDrafter(model.backend().info.vocab_size, seed=3),
    }


@pytest.mark.parametrize("budget", [1, 4, 16])
@pytest.mark.parametrize("name", ["oracle", "ngram", "random"])
def test_rounds_on_the_device_give_plain_decodings_text(tiny_models, run, name: str, budget: int) -> None:
    model = tiny_models[0]
    for extra in ({}, {"max_tokens": 5}, {"stop_strings": ("three",)}, {"ignore_eos": True}):
        request = _request(model, **extra)
        plain = run(model.backend(), model.tokenizer, request)
        drafter = _drafters(model, request)[name]
        backend = WithDeviceRounds(model.backend(), drafter)
        got = run(backend, model.tokenizer, request, drafter, tree_budget=budget)
        assert got.same_output(plain), extra
        assert backend.device_rounds.attempts == got.stats.rounds >= 1  # every round ran on the "device"
        assert all(rows <= budget for rows in got.stats.tree_rows)
        if name == "oracle" and budget > 1 and len(plain.token_ids) > 2:
            assert max(got.stats.committed_per_round) > 1


def test_a_discarded_round_is_verified_again_and_counted(tiny_models, run) -> None:
    model = tiny_models[1]
    request = _request(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)  # about a token a round: many rounds
    backend = WithDeviceRounds(model.backend(), drafter, faults=(2, 3, 7))
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain) and backend.device_rounds.attempts > 7
    # attempts 2 and 3 are one round's first two; attempt 7 another round's first
    assert got.stats.faults_detected == {"corrupt": 3} and got.stats.rounds_recovered == 2


def test_results_fetched_again_are_counted_as_detected_and_recovered(tiny_models, run) -> None:
    model = tiny_models[1]
    request = _request(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)
    transit = {2: "dropped", 4: "repeated", 5: "stale", 6: "dropped"}
    backend = WithDeviceRounds(model.backend(), drafter, faults=(5,), transit=transit)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain) and backend.device_rounds.attempts > 6
    # attempt 5 is discarded (a flagged row); its retry, attempt 6, is the same round: three rounds recovered
    assert got.stats.faults_detected == {"dropped": 2, "repeated": 1, "stale": 1, "corrupt": 1}
    assert got.stats.rounds_recovered == 3
    assert got.stats.rounds_discarded == 1  # the flagged attempt: results fetched again are kept


def test_a_round_failing_every_attempt_fails_the_request(tiny_models, run) -> None:
    model = tiny_models[0]
    request = _request(model)
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter, faults=range(1, 100))
    with pytest.raises(BackendError, match="failed all 4 attempts on the device"):
        run(backend, model.tokenizer, request, drafter, tree_budget=8)


# -- sampled requests whose rows the device draws ------------------------------------------------------------
SAMPLED = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.02}


def _sampled(model, seed: int = 11, max_tokens: int = 24) -> GenerationRequest:
    return GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), max_tokens, Params(seed=seed, **SAMPLED))


def _drawing(model, drafter) -> WithDeviceRounds:
    backend = WithDeviceRounds(model.backend(), drafter)
    backend.device_rounds.drawing = True
    return backend


@pytest.mark.parametrize("name", ["oracle", "ngram", "random"])
def test_sampled_rounds_drawn_on_the_device_give_plain_decodings_text(tiny_models, run, name: str) -> None:
    model = tiny_models[0]
    for seed in (11, 12):
        request = _sampled(model, seed)
        plain = run(model.backend(), model.tokenizer, request)
        drafter = _drafters(model, request)[name]
        backend = _drawing(model, drafter)
        got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
        assert got.same_output(plain), seed
        assert backend.device_rounds.attempts == got.stats.rounds >= 1  # every round drawn on the "device"
        if name == "oracle" and len(plain.token_ids) > 2:
            assert max(got.stats.committed_per_round) > 1  # the oracle's sampled drafts are accepted


def test_a_round_the_device_does_not_draw_is_decided_by_the_host(tiny_models, run) -> None:
    """An undrawn round commits nothing; the round in flight after it commits nothing either (settled), the
    host decides that position, and the device's rounds start again from the context after it."""
    model = tiny_models[1]
    request = _sampled(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)  # about a token a round: many rounds
    backend = _drawing(model, drafter)
    rounds = backend.device_rounds
    rounds.undrawn = {2, 5}
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert got.stats.faults_detected == {UNDRAWN: 2} and rounds.settles == 2
    assert len(rounds.starts) == 3  # the first, then one after each host round
    assert got.stats.rounds == rounds.attempts  # two undrawn attempts, two host rounds in their place


def test_undrawn_rounds_in_a_row_leave_the_device_ever_longer_stretches_of_host_rounds(tiny_models,
                                                                                       run) -> None:
    """A device that leaves every round to the host (rows too flat for its draw) is tried again after 1, 2,
    4, ... host rounds, not after each one: a few tries over the request, plain decoding's text; a round it
    commits in between resets the stretch."""
    model = tiny_models[1]
    request = _sampled(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)
    backend = _drawing(model, drafter)
    rounds = backend.device_rounds
    rounds.undrawn = set(range(1, 1000))
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    tries = rounds.attempts
    assert got.stats.faults_detected == {UNDRAWN: tries}
    # tries after 1, 2, 4, ... host rounds: the k-th try comes after 2^k - 1 rounds
    assert got.stats.rounds >= 2 ** (tries - 1) - 1 and tries <= got.stats.rounds.bit_length() + 1
    rounds = _drawing(model, drafter).device_rounds
    rounds.undrawn = {1, 2, 3, 5, 6}  # three in a row (1 + 2 host rounds after the first two), a commit, two
    got = run(rounds.backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    # attempts 1-3 undrawn (then 1, 2, 4 host rounds), 4 commits (the stretch resets), 5 and 6 undrawn (1, 2)
    assert rounds.attempts >= 7 and got.stats.faults_detected == {UNDRAWN: 5}


def test_a_round_in_flight_that_commits_after_an_undrawn_one_is_taken(tiny_models, run) -> None:
    model = tiny_models[1]
    request = _sampled(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)
    backend = _drawing(model, drafter)
    rounds = backend.device_rounds
    rounds.undrawn, rounds.in_flight_commits = {2}, {2}
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert got.stats.faults_detected == {UNDRAWN: 1} and rounds.settles == 1
    assert len(rounds.starts) == 1  # no host round: the device went on
    assert rounds.committed == plain.token_ids[: len(rounds.committed)]


# -- requests with penalties and logit_bias, adjusted on the device ------------------------------------------
# the tiny models then repeat these tokens, which the penalties see
FAVOURED = ((101, 100.0), (202, 100.0), (303, 100.0))
ADJUSTED = {
    "greedy-frequency": {"frequency_penalty": 2.0, "presence_penalty": 1.5},
    "greedy-everything": {"repetition_penalty": 1.3, "frequency_penalty": 2.0, "presence_penalty": 1.0},
    "sampled-presence": {**SAMPLED, "presence_penalty": 1.5},
    "sampled-everything": {**SAMPLED, "repetition_penalty": 1.5, "frequency_penalty": 2.0},
}


def _adjusting(model, drafter) -> WithDeviceRounds:
    backend = _drawing(model, drafter)
    backend.device_rounds.adjusting = True
    return backend


@pytest.mark.parametrize("name", ["oracle", "random"])
@pytest.mark.parametrize("kind", ADJUSTED)
def test_adjusted_rounds_on_the_device_give_plain_decodings_text(tiny_models, run, kind: str,
                                                                  name: str) -> None:  # fmt: skip
    """Penalties and bias adjusted on the device, each row counting its own path, the history started from
    the prompt: plain decoding's text under the same adjustments (which change it)."""
    model = tiny_models[0]
    prompt = tuple(model.tokenizer.encode(PROMPT))
    request = GenerationRequest(prompt, 24, Params(seed=11, logit_bias=FAVOURED, **ADJUSTED[kind]))
    plain = run(model.backend(), model.tokenizer, request)
    biased = {k: v for k, v in ADJUSTED[kind].items() if k in SAMPLED}
    biased_only = GenerationRequest(prompt, 24, Params(seed=11, logit_bias=FAVOURED, **biased))
    assert plain.token_ids != run(model.backend(), model.tokenizer, biased_only).token_ids  # penalties matter
    drafter = (OracleDrafter(model.backend(), request.sampling, prompt_length=len(prompt)) if name == "oracle"
               else RandomDrafter(model.backend().info.vocab_size, seed=3))  # fmt: skip
    backend = _adjusting(model, drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert backend.device_rounds.attempts == got.stats.rounds >= 1
    if name == "oracle":
        assert max(got.stats.committed_per_round) > 2  # deep paths, each counted into its own rows


def test_an_undrawn_adjusted_round_is_decided_by_the_host_with_the_devices_tokens_counted(tiny_models,
                                                                                         run) -> None:
    """After device rounds commit tokens, a host round (the undrawn position) adjusts its rows by a history
    that counts them too, and the device's rounds start again from the whole history."""
    model = tiny_models[1]
    prompt = tuple(model.tokenizer.encode(PROMPT))
    params = Params(seed=12, logit_bias=FAVOURED, **ADJUSTED["sampled-everything"])
    request = GenerationRequest(prompt, 24, params)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)
    backend = _adjusting(model, drafter)
    rounds = backend.device_rounds
    rounds.undrawn = {3, 6, 9, 12, 15}
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert got.stats.faults_detected == {UNDRAWN: 5} and len(rounds.starts) == 6


@pytest.mark.parametrize(
    "sampling",
    [pytest.param({"temperature": 0.8, "top_p": 0.9}, id="no-top_k"),
     pytest.param({**SAMPLED, "presence_penalty": 1.5}, id="penalised")],
)
def test_sampled_requests_the_device_does_not_draw_keep_host_rounds(tiny_models, run, sampling: dict) -> None:
    model = tiny_models[0]
    request = GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), 12, Params(seed=5, **sampling))
    plain = run(model.backend(), model.tokenizer, request)
    drafter = NgramDrafter(max_ngram=3)
    backend = _drawing(model, drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert not backend.device_rounds.started and backend.device_rounds.attempts == 0


@pytest.mark.parametrize(
    "request_kind",
    [pytest.param({"top_logprobs": 2}, id="logprobs"), pytest.param({"temperature": 0.7}, id="sampled"),
     pytest.param({"presence_penalty": 1.5}, id="greedy-with-a-penalty"),
     pytest.param({"logit_bias": ((799, 5.0),)}, id="greedy-with-a-bias")],
)
def test_sampled_and_logprobs_requests_keep_host_rounds(tiny_models, run, request_kind: dict) -> None:
    """Device rounds that do not draw (`draws` False, as exl3's with exl3-sample-draw off) take the verify's
    raw argmax: a request that samples, wants logprobs or adjusts its logits (penalties, logit_bias) keeps
    host rounds."""
    model = tiny_models[0]
    kind = dict(request_kind)
    top_logprobs = kind.pop("top_logprobs", None)
    request = GenerationRequest(
        tuple(model.tokenizer.encode(PROMPT)), 12, SamplingParams(seed=5, **kind), top_logprobs=top_logprobs,
    )  # fmt: skip
    plain = run(model.backend(), model.tokenizer, request)
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert not backend.device_rounds.started and backend.device_rounds.attempts == 0


def test_an_impossible_device_round_is_refused(tiny_models, run) -> None:
    model = tiny_models[0]
    request = _request(model)
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter)
    backend.device_rounds.round = lambda: DeviceRound(2, (1, 2, 3), False)  # more tokens than rows
    with pytest.raises(BackendError, match="committed 3 tokens from a tree of 2 rows"):
        run(backend, model.tokenizer, request, drafter, tree_budget=8)


def test_a_backend_whose_rounds_are_not_served_here_keeps_host_rounds(tiny_models, run) -> None:
    """A greedy request on a backend whose device rounds say they do not serve its mode (an Exl3Backend
    switched to chain verifies: the bench's chain system on a tree load) runs host rounds, with plain
    decoding's output."""
    model = tiny_models[0]
    request = _request(model)
    plain = run(model.backend(), model.tokenizer, request)
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter)
    backend.device_rounds.serving = False
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain) and got.stats.rounds >= 1
    assert not backend.device_rounds.started and backend.device_rounds.attempts == 0


# -- a grammar's request: rounds on the device until the grammar opens ------------------------------------
GRAMMAR_PROMPT = "Describe the weather as JSON:"


@pytest.fixture(scope="module")
def grammar_model(tiny_models):
    return tiny_models[1]  # the conftest's `vocabulary` is this model's


def _grammar_request(model, grammar: Grammar | None, max_tokens: int = 48, **extra) -> GenerationRequest:
    prompt = tuple(model.tokenizer.encode(GRAMMAR_PROMPT, special=False))
    return GenerationRequest(prompt, max_tokens, SamplingParams(), grammar=grammar, **extra)


def _free_tokens(model, run) -> list[int]:
    return run(model.backend(), model.tokenizer, _grammar_request(model, None, max_tokens=8)).token_ids


@pytest.mark.parametrize("budget", [4, 16])
@pytest.mark.parametrize("name", ["oracle", "ngram", "random"])
@pytest.mark.parametrize("openers", [(2,), (1, 4)], ids=["one-opener", "two-openers"])
def test_a_grammars_request_runs_on_the_device_until_its_grammar_opens(
    grammar_model, vocabulary, run, name: str, budget: int, openers: tuple[int, ...]
) -> None:
    """Rounds on the device end at each opening token the grammar awaits (a stop slot of its own), start
    again for the next one, and hand the sequence to host rounds, which mask their rows, once the grammar is
    open: plain decoding's text under the grammar, with every token up to the last opener the device's."""
    model = grammar_model
    free = _free_tokens(model, run)
    opening = tuple(free[i] for i in openers)
    for before, at in itertools.pairwise((-1, *openers)):  # each opener first met where the test expects it
        assert free[at] not in free[before + 1 : at]
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=opening)
    request = _grammar_request(model, grammar)
    plain = run(model.backend(), model.tokenizer, request)
    last = openers[-1]
    assert plain.token_ids[: last + 1] == free[: last + 1]  # free text until the grammar opens
    check_weather(model.tokenizer.decode(plain.token_ids[last + 1 : -1]))
    drafter = _drafters(model, request)[name]
    backend = WithDeviceRounds(model.backend(), drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=budget)
    assert got.same_output(plain)
    rounds = backend.device_rounds
    stops = tuple(model.backend().info.stop_token_ids)
    # one start for each opener, in turn, its stop slot after the request's stops
    assert rounds.starts == [(*stops, token) for token in opening]
    assert rounds.committed == plain.token_ids[: last + 1]  # the device's tokens end at the last opener
    assert rounds.drains == len(rounds.starts)
    assert got.stats.rounds > rounds.attempts  # the grammar's part ran on the host


def test_max_tokens_ending_at_the_opener_ends_the_request(grammar_model, vocabulary, run) -> None:
    model = grammar_model
    free = _free_tokens(model, run)
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=(free[3],))
    request = _grammar_request(model, grammar, max_tokens=free.index(free[3]) + 1)
    plain = run(model.backend(), model.tokenizer, request)
    assert plain.finish_reason == "length" and plain.token_ids[-1] == free[3]
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain) and got.stats.rounds == backend.device_rounds.attempts


def test_an_opener_that_is_a_stop_needs_no_slot_and_ends_the_request(grammar_model, vocabulary, run) -> None:
    model = grammar_model
    free = _free_tokens(model, run)
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=(free[2],))
    request = _grammar_request(model, grammar, stop_token_ids=(free[2],))
    plain = run(model.backend(), model.tokenizer, request)
    assert plain.finish_reason == "stop" and plain.token_ids == free[:3]
    drafter = NgramDrafter(max_ngram=3)
    backend = WithDeviceRounds(model.backend(), drafter)
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert backend.device_rounds.starts == [(*model.backend().info.stop_token_ids, free[2])]


def test_a_grammar_open_from_the_start_or_without_a_free_stop_slot_keeps_host_rounds(
    grammar_model, vocabulary, run
) -> None:
    model = grammar_model
    free = _free_tokens(model, run)
    own = tuple(model.backend().info.stop_token_ids)
    unused = (t for t in range(5, 100) if t not in own and t not in free)
    others = tuple(itertools.islice(unused, MAX_STOP_TOKEN_IDS - len(own)))
    cases = [
        _grammar_request(model, Grammar.json_schema(vocabulary, WEATHER)),
        _grammar_request(model, Grammar.json_schema(vocabulary, WEATHER, opens_after=(free[2],)),
                         stop_token_ids=others),
    ]
    for request in cases:
        plain = run(model.backend(), model.tokenizer, request)
        drafter = NgramDrafter(max_ngram=3)
        backend = WithDeviceRounds(model.backend(), drafter)
        got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
        assert got.same_output(plain) and got.stats.rounds >= 1
        assert backend.device_rounds.attempts == 0


def test_a_sampled_grammars_request_draws_on_the_device_until_its_grammar_opens(grammar_model, vocabulary,
                                                                               run) -> None:  # fmt: skip
    """A sampled request whose grammar opens after a token it draws freely: its rounds are drawn on the
    device up to that token (one of them undrawn and decided by the host), then host rounds mask their
    rows. Plain sampled decoding's text under the grammar."""
    model = grammar_model
    prompt = tuple(model.tokenizer.encode(GRAMMAR_PROMPT, special=False))
    sampling = Params(seed=13, **SAMPLED)
    free = run(model.backend(), model.tokenizer, GenerationRequest(prompt, 16, sampling)).token_ids
    at = next(i for i in range(4, len(free)) if free[i] not in free[:i])
    grammar = Grammar.json_schema(vocabulary, WEATHER, opens_after=(free[at],))
    request = GenerationRequest(prompt, 48, sampling, grammar=grammar)
    plain = run(model.backend(), model.tokenizer, request)
    assert plain.token_ids[: at + 1] == free[: at + 1]
    drafter = RandomDrafter(model.backend().info.vocab_size, seed=4)  # about a token a round
    backend = _drawing(model, drafter)
    rounds = backend.device_rounds
    rounds.undrawn = {2}
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    assert got.stats.faults_detected == {UNDRAWN: 1} and rounds.settles == 1
    opener = (*model.backend().info.stop_token_ids, free[at])
    assert rounds.starts == [opener, opener]  # started again after the host's round
    assert rounds.committed[-1] == free[at]  # the device's last round ended at the opening token
    assert got.stats.rounds > rounds.attempts  # the grammar's part ran on the host


# -- a thinking budget ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [0, 6])
@pytest.mark.parametrize("name", ["oracle", "ngram"])
def test_rounds_on_the_device_under_a_thinking_budget_give_plain_decodings_text(tiny_models, run, name: str,
                                                                                limit: int) -> None:
    """The device's rounds start capped at what the budget has left; the round that reaches it ends them
    there (what they queued past it is drained), the host commits the closing tokens, and the device's
    rounds start again after them with the request's own remaining tokens."""
    from elpis.spec.thinking import ThinkingBudget

    model = tiny_models[0]
    free = run(model.backend(), model.tokenizer, _request(model, max_tokens=24, ignore_eos=True))
    close = tuple(t for t in range(1000, 2000) if t not in free.token_ids)[:2]
    request = _request(model, max_tokens=24, ignore_eos=True, thinking=ThinkingBudget(limit, close))
    plain = run(model.backend(), model.tokenizer, request)
    assert tuple(plain.token_ids[limit : limit + 2]) == close
    drafter = _drafters(model, request)[name]
    backend = WithDeviceRounds(model.backend(), drafter)
    rounds = backend.device_rounds
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain)
    # before the budget (none with a budget of 0) and after the closing tokens, rounds on the device
    assert len(rounds.starts) == (2 if limit else 1) and rounds.drains >= (1 if limit else 0)
    assert rounds.committed == [t for i, t in enumerate(plain.token_ids) if not limit <= i < limit + 2]


# -- logprobs requests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 3])
@pytest.mark.parametrize("sampling", [{}, SAMPLED, {"presence_penalty": 1.5, "logit_bias": ((799, 5.0),)}],
                         ids=["greedy", "sampled", "adjusted"])
def test_logprobs_requests_run_on_a_device_that_reports_them(tiny_models, run, sampling: dict,
                                                             count: int) -> None:
    """Where the device's rounds report the committed tokens' log-probabilities, a logprobs request runs
    there: plain decoding's tokens and log-probabilities (the model's own, before any adjustment), every
    round on the device."""
    model = tiny_models[0]
    request = GenerationRequest(tuple(model.tokenizer.encode(PROMPT)), 16, Params(seed=5, **sampling),
                                top_logprobs=count)  # fmt: skip
    plain = run(model.backend(), model.tokenizer, request)
    drafter = OracleDrafter(model.backend(), request.sampling, prompt_length=len(request.prompt_ids))
    backend = _adjusting(model, drafter)
    rounds = backend.device_rounds
    rounds.reports_logprobs = True
    got = run(backend, model.tokenizer, request, drafter, tree_budget=8)
    assert got.same_output(plain) and len(got.logprobs) == len(plain.token_ids)
    assert rounds.attempts == got.stats.rounds and rounds.started
    assert max(got.stats.committed_per_round) > 1  # rows past the anchor reported theirs
    assert all(len(entry[2]) == count for entry in got.logprobs)
