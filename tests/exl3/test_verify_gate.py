"""GPU tests of verifies queued behind the verify gate (`load_backend(prelaunch=True)`,
`elpis.exl3.verify_gate`, `TreeGraphs.arm`) on the synthetic checkpoint of ELPIS_SMALL_DIR.

What they establish:
(a) a gated verify is a replay: over rounds of mostly accepted trees, every gated verify's logits equal the
    same round's ordinary replay bit for bit, and the committed tokens are plain decoding's;
(b) the product path (the DFlash2 drafter arms the gate while its block runs) gives plain decoding's tokens,
    and its verifies went through the gate;
(c) a host too slow for the gate (its release injected 60 ms late against a 5 ms timeout): every such round
    is detected (fault kind late-inputs), discarded and verified again, and the tokens are still plain
    decoding's;
(d) an armed gate that no verify opens (the request ends, or the round is abandoned) is opened on its
    harmless inputs at once: later work does not wait for the timeout, and later requests decode as before.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import plain, random_tree, replay, tree_generate

pytestmark = pytest.mark.gpu

TOKENS = 40


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0,
        tree=True, tree_graphs=True, capture_graphs=False, prelaunch=True,
    )  # fmt: skip
    b.prefix.enabled = False
    yield b


def rounds(backend, ids, propose, *, gated: bool) -> tuple[list[int], list]:
    """Greedy rounds decided by the proven acceptor; with `gated`, each verify is armed first, as the drafter
    arms it. Returns the tokens and every verify's logits."""
    seen: list = []
    out, _ = tree_generate(backend, ids, TOKENS, propose, arm=gated, seen=seen)
    return out, seen


def test_a_gated_verify_equals_the_ordinary_replay(backend):
    import torch

    graphs = backend.graphs
    vocab = backend.info.vocab_size
    for seed, length in ((5, 900), (6, 4070)):  # 4070: the rounds cross into the next context bucket
        ids = prompt(length, seed, vocab)
        truth, _ = rounds(backend, ids, plain, gated=False)  # captures every key these rounds use
        for size in (6, 16):
            _, want = rounds(backend, ids, replay(truth, size, seed, vocab), gated=False)
            before = graphs.gated_verifies
            got_tokens, got = rounds(backend, ids, replay(truth, size, seed, vocab), gated=True)
            assert graphs.gated_verifies - before == len(got), "a verify did not go through the gate"
            assert got_tokens == truth, f"prompt {seed}, {size} rows: gated rounds changed the tokens"
            assert len(got) == len(want) > 1
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert torch.equal(a, b), f"prompt {seed}, {size} rows, round {i}: gated != replayed logits"


def generate(backend, decoder, ids):  # noqa: F811
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16, draft_top_k=4)
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=SamplingParams(),
                                ignore_eos=True)  # fmt: skip
    steps = list(gen.generate(request))
    return [t for step in steps for t in step.token_ids], steps[-1].stats


def test_the_drafter_arms_the_gate_and_the_text_is_plain_decoding(backend, decoder):  # noqa: F811
    ids = prompt(1500, 44, backend.info.vocab_size)
    truth, _ = rounds(backend, ids, plain, gated=False)
    before = backend.graphs.gated_verifies
    drafted, stats = generate(backend, decoder, ids)
    assert drafted == truth, "speculation through gated verifies differs from plain decoding"
    assert backend.graphs.gated_verifies > before, "the drafter's rounds did not go through the gate"
    assert not stats.faults_detected


def test_a_gate_that_times_out_is_discarded_and_recomputed(backend, decoder):  # noqa: F811
    ids = prompt(1300, 45, backend.info.vocab_size)
    truth, _ = rounds(backend, ids, plain, gated=False)
    gate = backend.graphs.gate
    release, timeout = gate.release, gate.timeout_ns

    def late_release(seq: int) -> None:  # a host stalled between staging the inputs and opening the gate
        time.sleep(0.06)
        release(seq)

    gate.release, gate.timeout_ns = late_release, 5_000_000
    try:
        drafted, stats = generate(backend, decoder, ids)
    finally:
        gate.release, gate.timeout_ns = release, timeout
    assert drafted == truth, "a round whose gate timed out changed the text"
    late = stats.faults_detected.get("late-inputs", 0)
    assert late >= 1 and stats.rounds_recovered == late, stats


def first_rounds(backend, ids, tokens, parents, *, arm: bool, wait: bool = False):
    """One committed plain token (so the next key is captured), then an armed (or not) verify of the tree:
    its logits, the gated verifies it made, and the seconds `finish` took when the gate was left armed."""
    import torch

    graphs = backend.graphs
    backend.begin(list(ids))
    try:
        first = backend.verify([ids[-1]], [-1])
        backend.commit([0])
        tokens = [int(first[0].argmax()), *tokens[1:]]
        if arm:
            assert backend.prelaunch(), "the gate was not armed for a captured key"
        if wait:  # the host syncs instead of opening it: the gate times out and the harmless set runs
            torch.cuda.synchronize()
        before = graphs.gated_verifies
        logits = backend.verify(tokens, parents).clone()
        return logits, graphs.gated_verifies - before
    finally:
        backend.finish()


def test_a_verify_after_its_gate_timed_out_is_an_ordinary_replay(backend):
    import torch

    vocab = backend.info.vocab_size
    ids = prompt(1100, 46, vocab)
    tokens, parents = random_tree(7, [], random.Random(3), vocab)
    want, _ = first_rounds(backend, ids, tokens, parents, arm=False)
    want, _ = first_rounds(backend, ids, tokens, parents, arm=False)  # the first one captured the key
    gate = backend.graphs.gate
    timeout, gate.timeout_ns = gate.timeout_ns, 10_000_000
    try:
        got, gated = first_rounds(backend, ids, tokens, parents, arm=True, wait=True)
    finally:
        gate.timeout_ns = timeout
    assert gated == 0, "a verify went through a gate that had timed out"
    assert torch.equal(got, want)
    got, gated = first_rounds(backend, ids, tokens, parents, arm=True)
    assert gated == 1 and torch.equal(got, want)


def test_an_armed_gate_nobody_opens_holds_nothing_up(backend):
    import torch

    vocab = backend.info.vocab_size
    ids = prompt(1150, 47, vocab)
    truth, _ = rounds(backend, ids, plain, gated=False)
    backend.begin(list(ids))
    try:
        first = backend.verify([ids[-1]], [-1])
        backend.commit([0])
        assert int(first[0].argmax()) == truth[0]
        assert backend.prelaunch(), "the gate was not armed for a captured key"
    finally:
        t0 = time.perf_counter()
        backend.finish()  # the request ends before its next verify: the gate opens on the harmless set
        torch.cuda.synchronize()
    assert time.perf_counter() - t0 < 1.0, "work after the armed gate waited for its timeout"
    again, _ = rounds(backend, ids, plain, gated=False)
    assert again == truth, "a verify run on the harmless set changed what later requests decode"
