"""GPU tests of greedy rounds on the GPU (`load_backend(device_rounds=True)`, `elpis.exl3.device_round`) on
the synthetic checkpoint of ELPIS_SMALL_DIR. Staged in session 34 (no device was lent): not yet run.

What they establish:
(a) the product path (the generator runs every greedy round through the backend's device rounds, each queued
    before the one ahead of it is read back) gives plain decoding's tokens, and every round ran on the GPU;
(b) with the draft's candidates replaced by the known continuation (most of each tree accepted), rounds
    commit several tokens each and the tokens are still plain decoding's: the tree, the verify's inputs, the
    acceptance, the commit and the padded conditioning written on the GPU agree with each other over many
    rounds, with rounds queued ahead;
(c) a round with a flagged row is discarded on the GPU (nothing committed, the state kept), verified again,
    counted, and the text is unchanged;
(d) records that meet a fault on their way back (a copy that never lands, an earlier round's, another
    request's: `RecordFaults`) are each detected, the round's records read again from its device slot, and
    the text is unchanged: injected == detected, each such round counted as recovered (session 35, staged).
"""

from __future__ import annotations

import pytest

from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import plain, tree_generate

pytestmark = pytest.mark.gpu

TOKENS = 40
SWITCHES = {"ELPIS_PATCH_EMBED_GATHER": "1", "ELPIS_PATCH_DEVICE_ROUNDS": "1"}


@pytest.fixture(scope="module")
def backend(small):
    mp = pytest.MonkeyPatch()
    for name, value in SWITCHES.items():
        mp.setenv(name, value)
    from elpis.exl3 import load_backend

    try:
        b = load_backend(
            small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0,
            tree=True, tree_graphs=True, capture_graphs=False, device_rounds=True,
        )  # fmt: skip
        b.prefix.enabled = False
        yield b
    finally:
        mp.undo()


def generate(backend, decoder, ids, budget: int = 16):  # noqa: F811
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=4)
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=SamplingParams(),
                                ignore_eos=True)  # fmt: skip
    steps = list(gen.generate(request))
    return [t for step in steps for t in step.token_ids], steps[-1].stats


def truth_of(backend, ids) -> list[int]:
    """Plain decoding's tokens (host rounds of the anchor alone); it also captures every verify key."""
    out, _ = tree_generate(backend, ids, TOKENS, plain)
    return out


def test_rounds_on_the_gpu_give_plain_decodings_tokens(backend, decoder):  # noqa: F811
    ids = prompt(1500, 51, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    before = backend.device_rounds.rounds
    got, stats = generate(backend, decoder, ids)
    assert got == truth, "rounds on the GPU differ from plain decoding"
    assert backend.device_rounds.rounds - before == stats.rounds >= 1
    assert not stats.faults_detected


class KnownContinuation:
    """The draft's candidates replaced by the known continuation (chain log-probability 0, the other top-k as
    drafted): the GPU builds deep trees of mostly accepted rows. The round's position is read on the GPU from
    the state block, since a round is queued before the one ahead of it is read back."""

    def __init__(self, rounds, truth: list[int], start: int) -> None:
        import torch

        from elpis.exl3 import round_plan

        self.inner, self.state, self.start = rounds._candidates, rounds.state, start
        self.kvp = round_plan.STATE_KVP
        pad = [truth[-1]] * 16  # past the end: any token (the budget stops the request there)
        self.truth = torch.tensor(truth + pad, dtype=torch.int64, device="cuda")

    def __call__(self, chain, logits):
        import torch

        packed = self.inner(chain, logits).clone()
        done = self.state[self.kvp] - self.start  # tokens committed so far, on the GPU
        rows = torch.arange(packed.shape[0], device=packed.device) + done
        packed[:, 0] = self.truth.index_select(0, rows).float()  # depth d + 1 predicts truth[done + d]
        packed[:, 1] = 0.0
        return packed


def test_deep_trees_of_the_known_continuation_commit_plain_decodings_tokens(backend, decoder):  # noqa: F811
    ids = prompt(2500, 52, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    rounds._candidates = KnownContinuation(rounds, truth, len(ids) - 1)
    ahead = rounds.queued_ahead  # the module's backend counts every request's rounds
    try:
        got, stats = generate(backend, decoder, ids)
    finally:
        del rounds._candidates
    assert got == truth
    assert max(stats.committed_per_round) >= 4, stats.committed_per_round
    assert stats.rounds < TOKENS // 2
    assert rounds.queued_ahead > ahead, "no round of this request was queued ahead of the one in flight"


def test_a_flagged_row_is_discarded_on_the_gpu_and_verified_again(backend, decoder):  # noqa: F811
    ids = prompt(1200, 53, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    checks = rounds._row_checks
    calls = {"n": 0}

    def flag_every_third(out):
        bad = checks(out)
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            bad[0] = 1
        return bad

    rounds._row_checks = flag_every_third
    try:
        got, stats = generate(backend, decoder, ids)
    finally:
        del rounds._row_checks
    assert got == truth, "a discarded round changed the text"
    flagged = stats.faults_detected.get("corrupt", 0)
    assert flagged >= 3 and stats.rounds_recovered == flagged


def test_records_faulted_on_their_way_back_are_read_again_from_the_gpu(backend, decoder):  # noqa: F811
    from collections import Counter

    from elpis.exl3.device_round import RecordFaults

    ids = prompt(1300, 54, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    generate(backend, decoder, prompt(900, 55, backend.info.vocab_size))  # a request before: stale replays it
    schedule = {1: "dropped", 2: "repeated", 3: "stale", 5: "dropped", 6: "repeated"}
    rounds.record_faults = RecordFaults(schedule)
    try:
        got, stats = generate(backend, decoder, ids)
        injected = rounds.record_faults.injected
    finally:
        rounds.record_faults = None
    assert got == truth, "a record read again changed the text"
    assert stats.rounds > 6, "the request ended before every scheduled fault"
    assert injected == Counter(schedule.values())
    assert stats.faults_detected == dict(injected) and stats.rounds_recovered == len(schedule)
