"""Fault tolerance of the speculative round: injected faults are detected, the round is discarded and
recomputed, and the output stays exactly plain decoding's.

Faults are injected by `FaultyBackend` into the real reference backend's results (tiny random models):
corrupted logits, lost results, repeated results, stale commit acknowledgements (one kind at a time and
mixed) and late results of an earlier sequence, over both models and prompts, greedy and sampled, with no
drafter, oracle chains, adversarial trees and the n-gram drafter. Every run must equal fault-free plain
decoding (tokens, text, finish reason, log-probabilities) with injected == detected faults and one
recovered round per faulty round. A fault on every attempt must end in BackendError with nothing
committed from that round, and with the checks switched off the same faults must change the output or
break the run (the tests have teeth).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import cache

import pytest
import torch

from elpis.backend import BackendError
from elpis.spec import GenerationRequest, GenerationStats, SamplingParams, SpeculativeGenerator
from elpis.spec.drafters import AdversarialDrafter, NgramDrafter, OracleDrafter
from elpis.spec.faults import IN_SEQUENCE, FaultSchedule, FaultyBackend
from elpis.spec.integrity import (
    CommitAck,
    CorruptRow,
    DroppedRound,
    RepeatedRound,
    RoundFault,
    RoundLink,
    RoundTracker,
    StaleCommit,
    StaleRound,
    VerifyResult,
    logits_digest,
)
from elpis.spec.sampling import greedy_tokens

PROMPTS = (
    "The quick brown fox jumps over",
    "one two three, one two three, one two three, one two",
)
MAX_TOKENS = 16
MODES = ("plain", "chain", "tree", "ngram")  # no drafter, oracle chains, adversarial trees, n-gram trees
KINDS = (*IN_SEQUENCE, "mixed")


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list
    stats: GenerationStats

    def output(self) -> tuple:
        return self.token_ids, self.text, self.finish_reason, self.logprobs


def _request(model, prompt_index: int, temperature: float, seed: int) -> GenerationRequest:
    prompt = tuple(model.tokenizer.encode(PROMPTS[prompt_index]))
    sampling = SamplingParams(temperature=temperature, top_k=40 if temperature else 0, seed=seed)
    return GenerationRequest(prompt, MAX_TOKENS, sampling, ignore_eos=True, top_logprobs=2)


def _generator(
    backend, model, request: GenerationRequest, mode: str, retries: int = 3
) -> SpeculativeGenerator:
    oracle = OracleDrafter(model.backend(), request.sampling)
    drafter, budget, top_k = {
        "plain": (None, 1, 1),
        "chain": (oracle, 4, 1),
        "tree": (
            AdversarialDrafter(oracle, backend.info.stop_token_ids, backend.info.vocab_size, seed=3),
            8,
            4,
        ),
        "ngram": (NgramDrafter(max_ngram=3), 6, 2),
    }[mode]
    return SpeculativeGenerator(
        backend,
        model.tokenizer,
        drafter=drafter,
        tree_budget=budget,
        draft_top_k=top_k,
        round_retries=retries,
    )


def _run(backend, model, request: GenerationRequest, mode: str, retries: int = 3) -> Result:
    steps = list(_generator(backend, model, request, mode, retries).generate(request))
    last = steps[-1]
    assert last.finish_reason is not None and last.stats is not None
    logprobs = [lp for s in steps for lp in s.logprobs]
    return Result(
        [t for s in steps for t in s.token_ids],
        "".join(s.text for s in steps),
        last.finish_reason,
        logprobs,
        last.stats,
    )


@pytest.fixture(scope="module")
def fault_free(tiny_models):
    """Fault-free runs, computed once per (model, prompt, temperature, seed, mode)."""

    @cache
    def outcome(model_seed: int, prompt_index: int, temperature: float, seed: int, mode: str) -> Result:
        model = tiny_models[model_seed]
        return _run(model.backend(), model, _request(model, prompt_index, temperature, seed), mode)

    return outcome


def _cases() -> list[tuple[str, str, int, int, float, int]]:
    """(kind, mode, model seed, prompt index, temperature, seed): every kind in every mode, each kind
    greedy in two modes and sampled in the other two, on both models and both prompts."""
    cases = []
    for i, kind in enumerate(KINDS):
        for j, mode in enumerate(MODES):
            cases.append((kind, mode, i % 2, (i + j // 2) % 2, (0.0, 0.9)[(i + j) % 2], 10 * i + j))
    return cases


def _schedule(kind: str, rounds: int, seed: int) -> FaultSchedule:
    if kind != "mixed":
        return FaultSchedule.seeded(seed, rounds, min(3, rounds - 1), kinds=(kind,))
    schedule = FaultSchedule.seeded(seed, rounds, min(len(IN_SEQUENCE), rounds - 1))
    # One round also fails twice in a row, with two different faults, before it is recomputed cleanly.
    faults = dict(schedule.faults)
    last = max(faults)
    faults[last] = (*faults[last], "corrupt" if faults[last][0] != "corrupt" else "dropped")
    return replace(schedule, faults=faults)


@pytest.mark.parametrize(("kind", "mode", "model_seed", "prompt_index", "temperature", "seed"), _cases())
def test_faults_are_detected_and_the_output_is_plain_decoding(
    tiny_models,
    fault_free,
    kind: str,
    mode: str,
    model_seed: int,
    prompt_index: int,
    temperature: float,
    seed: int,
) -> None:
    model = tiny_models[model_seed]
    request = _request(model, prompt_index, temperature, seed)
    plain = fault_free(model_seed, prompt_index, temperature, seed, "plain")
    clean = fault_free(model_seed, prompt_index, temperature, seed, mode)
    assert clean.output() == plain.output() and clean.stats.rounds_discarded == 0
    schedule = _schedule(kind, clean.stats.rounds, seed)
    faulty = FaultyBackend(model.backend(), schedule)
    result = _run(faulty, model, request, mode)

    assert result.output() == plain.output()
    # Every scheduled fault was reached (the rounds are those of the clean run), injected and detected.
    assert faulty.injected == schedule.total() and sum(faulty.injected.values()) >= 1
    detected = result.stats.faults_detected
    assert Counter(detected) == faulty.injected
    assert result.stats.rounds_discarded == sum(faulty.injected.values())
    assert result.stats.rounds_recovered == len(schedule.faults)
    # The recomputed rounds are the clean run's rounds: same tree sizes, same commits.
    assert result.stats.committed_per_round == clean.stats.committed_per_round
    assert result.stats.tree_rows == clean.stats.tree_rows
    assert [r.number for r in faulty.committed] == list(range(clean.stats.rounds))


def test_the_modes_verify_trees_and_accept_drafts(tiny_models, fault_free) -> None:
    """The cases above are only worth something if drafts are accepted and trees branch."""
    accepted, branched = Counter(), set()
    for _kind, mode, model_seed, prompt_index, temperature, seed in _cases():
        stats = fault_free(model_seed, prompt_index, temperature, seed, mode).stats
        accepted[mode] += sum(stats.accepted_depths)
        if mode in ("tree", "ngram"):
            model = tiny_models[model_seed]
            link = _BranchCounter(model.backend())
            _run(link, model, _request(model, prompt_index, temperature, seed), mode)
            branched |= {mode} if link.branched else set()
    assert accepted["chain"] > 0 and accepted["tree"] > 0
    assert accepted["plain"] == 0
    assert "tree" in branched


class _BranchCounter(RoundLink):
    """The reference backend as its own link, noting whether any verified tree branched."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.info, self.branched = inner.info, False
        self.begin, self.finish, self.position = inner.begin, inner.finish, inner.position

    def verify_round(self, round_id, tokens, parents):
        self.branched |= any(parents[r] != r - 1 for r in range(1, len(parents)))
        return super().verify_round(round_id, tokens, parents)


@pytest.mark.parametrize("kind", IN_SEQUENCE)
def test_without_the_checks_the_same_faults_change_the_output(
    tiny_models, fault_free, monkeypatch, kind: str
) -> None:
    model = tiny_models[0]
    request = _request(model, 1, 0.9, seed=4)
    plain = fault_free(0, 1, 0.9, 4, "plain")
    mode = "plain" if kind == "corrupt" else "chain"
    rounds = fault_free(0, 1, 0.9, 4, mode).stats.rounds
    # Corruptions in the exponent's top bit of every round's (only) row; the others at three rounds.
    schedule = (
        FaultSchedule({n: (kind,) for n in range(rounds)}, seed=1, bits=(30,))
        if kind == "corrupt"
        else FaultSchedule.seeded(5, rounds, 3, kinds=(kind,))
    )

    # With the checks: detected and recovered.
    assert _run(FaultyBackend(model.backend(), schedule), model, request, mode).output() == plain.output()

    # Without them: the consumer takes whatever arrives and believes every acknowledgement.
    monkeypatch.setattr(RoundTracker, "check_verify", lambda self, asked, rows, result: result.logits)
    monkeypatch.setattr(RoundTracker, "check_verify_greedy", _unchecked_greedy)
    monkeypatch.setattr(RoundTracker, "check_commit", lambda self, asked, rows, ack: None)
    faulty = FaultyBackend(model.backend(), schedule)
    try:
        outcome = _run(faulty, model, request, mode).output()
    except Exception as error:  # a lost result, a row count that does not fit, a state left behind
        outcome = error
    assert outcome != plain.output(), f"{kind} faults did not matter without the checks"
    assert sum(faulty.injected.values()) >= 1


def test_a_late_result_of_an_earlier_sequence_is_stale(tiny_models, fault_free, monkeypatch) -> None:
    model = tiny_models[0]
    first, second = _request(model, 0, 0.0, seed=6), _request(model, 1, 0.9, seed=7)
    schedule = FaultSchedule({1: ("stale",), 3: ("stale", "repeated")})
    faulty = FaultyBackend(model.backend(), schedule)
    # The first sequence has nothing earlier to replay: no fault is injected there.
    assert _run(faulty, model, first, "chain").output() == fault_free(0, 0, 0.0, 6, "plain").output()
    assert not faulty.injected
    result = _run(faulty, model, second, "chain")
    assert result.output() == fault_free(0, 1, 0.9, 7, "plain").output()
    assert faulty.injected == Counter(stale=2, repeated=1) == Counter(result.stats.faults_detected)
    assert result.stats.rounds_recovered == 2

    # Without the checks the late result is taken for this sequence's.
    monkeypatch.setattr(RoundTracker, "check_verify", lambda self, asked, rows, result: result.logits)
    monkeypatch.setattr(RoundTracker, "check_verify_greedy", _unchecked_greedy)
    faulty = FaultyBackend(model.backend(), FaultSchedule({1: ("stale",)}))
    _run(faulty, model, first, "chain")
    try:
        outcome = _run(faulty, model, second, "chain").output()
    except Exception as error:  # a row count that does not fit
        outcome = error
    assert outcome != fault_free(0, 1, 0.9, 7, "plain").output()
    assert faulty.injected == Counter(stale=1)


@pytest.mark.parametrize("kinds", [(k,) * 4 for k in IN_SEQUENCE] + [IN_SEQUENCE])
def test_a_fault_on_every_attempt_fails_the_generation_and_commits_nothing_of_that_round(
    tiny_models, fault_free, kinds: tuple[str, ...]
) -> None:
    model = tiny_models[1]
    request = _request(model, 0, 0.0, seed=9)
    plain = fault_free(1, 0, 0.0, 9, "plain")
    faulty = FaultyBackend(model.backend(), FaultSchedule({2: kinds}, seed=2))
    emitted: list[int] = []
    with pytest.raises(BackendError) as caught:
        for step in _generator(faulty, model, request, "chain", retries=3).generate(request):
            emitted.extend(step.token_ids)
    error = caught.value
    assert type(error) is BackendError and isinstance(error.__cause__, RoundFault)
    message = str(error)
    assert "round 2 failed all 4 attempts" in message and "nothing of it was committed" in message
    assert all(kind in message for kind in kinds)
    # Rounds 0 and 1 committed (4 tokens each, oracle chains), round 2 nothing; what was emitted is plain.
    assert [r.number for r in faulty.committed] == [0, 1]
    assert emitted == plain.token_ids[:8]
    assert faulty.position_at_finish == len(request.prompt_ids) - 1 + 8
    assert faulty.injected == Counter(kinds)


def test_the_retry_bound_is_the_generators(tiny_models, fault_free) -> None:
    model = tiny_models[1]
    request = _request(model, 0, 0.0, seed=9)
    plain = fault_free(1, 0, 0.0, 9, "plain")
    schedule = FaultSchedule({1: ("corrupt", "dropped")}, seed=2)
    with pytest.raises(BackendError, match="round 1 failed all 2 attempts"):
        _run(FaultyBackend(model.backend(), schedule), model, request, "chain", retries=1)
    result = _run(FaultyBackend(model.backend(), schedule), model, request, "chain", retries=2)
    assert result.output() == plain.output()
    assert result.stats.faults_detected == {"corrupt": 1, "dropped": 1} and result.stats.rounds_recovered == 1
    with pytest.raises(ValueError, match="round_retries"):
        SpeculativeGenerator(model.backend(), model.tokenizer, round_retries=-1)


class _CommitsThenLies(FaultyBackend):
    """Applies round 1's commit, then acknowledges it as round 0: the state moved under a failed check."""

    def commit_round(self, round_id, rows):
        ack = super().commit_round(round_id, rows)
        return replace(ack, round=replace(round_id, number=0)) if round_id.number == 1 else ack


def test_a_failed_check_after_the_state_moved_is_fatal(tiny_models) -> None:
    model = tiny_models[0]
    request = _request(model, 0, 0.0, seed=1)
    with pytest.raises(BackendError, match=r"moved to position .* can no longer be trusted") as caught:
        _run(_CommitsThenLies(model.backend(), FaultSchedule()), model, request, "chain")
    assert isinstance(caught.value.__cause__, StaleCommit)


def test_a_backend_that_cannot_abandon_a_verify_fails_closed(tiny_models, recording) -> None:
    model = tiny_models[0]
    request = _request(model, 0, 0.0, seed=1)
    faulty = FaultyBackend(recording(model.backend()), FaultSchedule({1: ("corrupt",)}))
    with pytest.raises(BackendError, match="has no abandon"):
        _run(faulty, model, request, "chain")


def test_schedules_refuse_what_cannot_be_injected() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        FaultSchedule({1: ("melted",)})
    for kind in ("repeated", "stale-commit"):
        with pytest.raises(ValueError, match="cannot be at round 0"):
            FaultSchedule({0: (kind,)})
    with pytest.raises(ValueError, match="bits"):
        FaultSchedule({1: ("corrupt",)}, bits=(32,))
    with pytest.raises(ValueError, match="do not fit"):
        FaultSchedule.seeded(0, rounds=3, count=3)
    schedule = FaultSchedule.seeded(7, rounds=20, count=8)
    assert schedule == FaultSchedule.seeded(7, rounds=20, count=8)  # seeded: reproducible
    assert set(schedule.total()) == set(IN_SEQUENCE) and 0 not in schedule.faults
    assert FaultSchedule({0: ("stale",)}).faults == {0: ("stale",)}  # it replays another sequence


# --- the checks on their own ---------------------------------------------------------------------------


def _unchecked_greedy(self, asked, rows, result) -> tuple[torch.Tensor, list[int]]:
    """check_verify_greedy with its checks taken out (the consumer believes whatever arrives)."""
    return result.logits, greedy_tokens(result.logits)


def _result(
    tracker: RoundTracker, logits: torch.Tensor, number: int = 0, attempt: int = 0, position: int = 5
) -> VerifyResult:
    asked = tracker.round_id(number, attempt, position, [1, 2], [-1, 0])
    return VerifyResult(asked, logits, logits_digest(logits))


def test_the_digest_is_the_bit_patterns_sum_and_sees_every_single_bit_flip() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 1000, generator=generator) * 8
    bits = logits.view(torch.int32).to(torch.int64)
    expected = [(sum(row.tolist()) + 2**31) % 2**32 - 2**31 for row in bits]  # any order, modulo 2^32
    assert logits_digest(logits).tolist() == expected
    assert logits_digest(logits.flip(1)).tolist() == expected
    for bit in range(32):
        flipped = logits.clone()
        flipped.view(torch.int32)[1, 31 * bit] ^= 1 << bit if bit < 31 else -(1 << 31)
        changed = (logits_digest(flipped) != logits_digest(logits)).tolist()
        assert changed == [False, True, False], f"a flip of bit {bit} went unseen"


def test_corrupt_rows_are_refused() -> None:
    tracker = RoundTracker(epoch=1, vocab_size=8)
    good = _result(tracker, torch.zeros(2, 8))
    assert tracker.check_verify(good.round, 2, good) is good.logits

    tracker = RoundTracker(epoch=1, vocab_size=8)
    masked = torch.zeros(2, 8)
    masked[1, 3] = -math.inf  # a masked token is legal
    assert tracker.check_verify(good.round, 2, _result(tracker, masked)) is not None
    for bad, why in ((math.nan, r"NaN or \+inf"), (math.inf, r"NaN or \+inf")):
        logits = torch.zeros(2, 8)
        logits[1, 3] = bad
        with pytest.raises(CorruptRow, match=rf"rows \[1\] hold {why}"):
            RoundTracker(1, 8).check_verify(good.round, 2, _result(tracker, logits))
    for logits in (torch.zeros(3, 8), torch.zeros(2, 9), torch.zeros(2, 8, dtype=torch.float64)):
        with pytest.raises(CorruptRow, match=r"expected float32 \(2, 8\)"):
            RoundTracker(1, 8).check_verify(good.round, 2, VerifyResult(good.round, logits, torch.zeros(0)))
    changed = good.logits.clone()
    changed[0, 0] = 1.0
    with pytest.raises(CorruptRow, match=r"rows \[0\] changed after verify"):
        RoundTracker(1, 8).check_verify(good.round, 2, VerifyResult(good.round, changed, good.digest))


def test_the_greedy_check_reads_the_tokens_with_the_checks_and_refuses_the_same_rows() -> None:
    tracker = RoundTracker(epoch=1, vocab_size=8)
    logits = torch.zeros(3, 8)
    logits[0, 5], logits[1, 2], logits[1, 6] = 1.0, 4.0, 4.0  # row 1: a tie, the lowest id wins
    logits[2] = -math.inf
    logits[2, 7] = -1.0  # masked tokens around a finite maximum
    good = _result(tracker, logits)
    got, tokens = tracker.check_verify_greedy(good.round, 3, good)
    assert got is good.logits and tokens == [5, 2, 7] == greedy_tokens(logits)
    assert tracker.delivered == good.round
    with pytest.raises(RepeatedRound):  # the identity checks are check_verify's
        tracker.check_verify_greedy(good.round, 3, good)
    for bad, why in ((math.nan, r"NaN or \+inf"), (math.inf, r"NaN or \+inf")):
        corrupt = logits.clone()
        corrupt[1, 3] = bad
        with pytest.raises(CorruptRow, match=rf"rows \[1\] hold {why}"):
            RoundTracker(1, 8).check_verify_greedy(good.round, 3, _result(tracker, corrupt))
    changed = logits.clone()
    changed[0, 0] = 2.0
    with pytest.raises(CorruptRow, match=r"rows \[0\] changed after verify"):
        RoundTracker(1, 8).check_verify_greedy(good.round, 3, VerifyResult(good.round, changed, good.digest))
    masked = logits.clone()
    masked[0] = -math.inf  # every token masked: intact, but there is no greedy token
    with pytest.raises(ValueError, match="non-finite row maximum"):
        RoundTracker(1, 8).check_verify_greedy(good.round, 3, _result(tracker, masked))


def test_lost_repeated_and_stale_results_are_refused() -> None:
    tracker = RoundTracker(epoch=3, vocab_size=8)
    asked = tracker.round_id(4, 1, 10, [1, 2], [-1, 0])
    logits = torch.zeros(2, 8)

    def result(**changes) -> VerifyResult:
        return VerifyResult(replace(asked, **changes), logits, logits_digest(logits))

    with pytest.raises(DroppedRound, match="no verify result arrived"):
        tracker.check_verify(asked, 2, None)
    with pytest.raises(DroppedRound, match=r"round 5 attempt 0 .* arrived while round 4 attempt 1"):
        tracker.check_verify(asked, 2, result(number=5, attempt=0))
    with pytest.raises(DroppedRound):
        tracker.check_verify(asked, 2, result(attempt=2))
    for older in ({"number": 3}, {"attempt": 0}):
        with pytest.raises(RepeatedRound, match="delivered again"):
            tracker.check_verify(asked, 2, result(**older))
    with pytest.raises(StaleRound, match="epoch 2"):
        tracker.check_verify(asked, 2, result(epoch=2))
    with pytest.raises(StaleRound, match="another tree"):
        tracker.check_verify(asked, 2, result(request=asked.request + 1))
    with pytest.raises(StaleRound, match="verified at position 9 instead of 10"):
        tracker.check_verify(asked, 2, result(position=9))
    tracker.check_verify(asked, 2, result())
    with pytest.raises(RepeatedRound):  # the same result a second time
        tracker.check_verify(asked, 2, result())


def test_commit_acknowledgements_are_checked() -> None:
    tracker = RoundTracker(epoch=3, vocab_size=8)
    asked = tracker.round_id(4, 0, 10, [1, 2, 3], [-1, 0, 1])
    tracker.check_commit(asked, (0, 1), CommitAck(asked, (0, 1), 12))
    with pytest.raises(DroppedRound, match="no commit acknowledgement"):
        tracker.check_commit(asked, (0, 1), None)
    with pytest.raises(DroppedRound, match="never verified"):
        tracker.check_commit(asked, (0, 1), CommitAck(replace(asked, number=5), (0, 1), 12))
    for stale in (replace(asked, number=3), replace(asked, epoch=2), replace(asked, position=9)):
        with pytest.raises(StaleCommit, match="acknowledgement for"):
            tracker.check_commit(asked, (0, 1), CommitAck(stale, (0, 1), 12))
    with pytest.raises(StaleCommit, match=r"rows \[0\] were acknowledged"):
        tracker.check_commit(asked, (0, 1), CommitAck(asked, (0,), 12))
    with pytest.raises(StaleCommit, match="at position 11 after committing 2 tokens, expected 12"):
        tracker.check_commit(asked, (0, 1), CommitAck(asked, (0, 1), 11))


def test_the_link_commits_only_the_pending_round_at_its_position(tiny_models) -> None:
    model = tiny_models[0]
    backend = model.backend()
    prompt = model.tokenizer.encode(PROMPTS[0])
    backend.begin(prompt)
    link, tracker = RoundLink(backend), RoundTracker(epoch=9, vocab_size=backend.info.vocab_size)
    start = len(prompt) - 1
    asked = tracker.round_id(0, 0, start, [prompt[-1]], [-1])
    with pytest.raises(DroppedRound, match="never verified"):
        link.commit_round(asked, [0])
    result = link.verify_round(asked, [prompt[-1]], [-1])
    assert result is not None and result.round == asked
    with pytest.raises(StaleCommit, match="pending verify is"):
        link.commit_round(replace(asked, attempt=1), [0])
    assert backend.position() == start  # refused commits leave the state alone
    link.abandon_round()
    with pytest.raises(RuntimeError, match="needs a verify"):
        backend.commit([0])  # the abandoned verify is gone from the backend too
    result = link.verify_round(asked, [prompt[-1]], [-1])
    ack = link.commit_round(asked, [0])
    tracker.check_commit(asked, [0], ack)
    assert ack.position == backend.position() == start + 1
    backend.finish()
