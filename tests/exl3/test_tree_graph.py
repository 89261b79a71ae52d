"""GPU tests of CUDA-graph-captured tree verifies (`load_backend(tree=True, tree_graphs=True)`,
`elpis.exl3.tree_graph`) on the synthetic checkpoint of ELPIS_SMALL_DIR (the full-size one on the device).

What they establish:
(a) a replay gives the bits of the eager tree mode, at 16 rows and at 8 rows, and of the key's warm-up call;
    for several trees, contexts and both ends of a context bucket. At 8 rows this holds because an eager tree
    verify runs the module path the graphs capture (`capture.plain_module_path`): until session 47 it took
    ExLlamaV3's captured MLP blocks, which serve runs of at most 8 rows, where a replay runs the rows GEMM;
(b) tree speculation through replays gives exactly the tokens of plain decoding through replays (trees of
    1..16 rows holding the continuation, always-wrong trees), for both row counts;
(c) commits through the captured commit graph leave the state the eager commit leaves: every later verify's
    logits over a run of accepted trees equal the eager tree mode's, bit for bit (16 rows);
(d) captures stay bounded by the keys: one verify and one commit graph per (rows, context bucket, recurrent
    slot, state row);
(e) after `elpis.exl3.graph_warmup.capture_graphs` (what `load_backend` runs by default), rounds across a
    bucket boundary capture nothing (verify, commit, draft block or conditioning), their logits equal the
    eager tree mode's bit for bit, and the product path with the draft's trees gives plain decoding's tokens;
(f) a tree's logits do not depend on the backend's run size (8 or 16 rows).
"""

from __future__ import annotations

import random

import pytest

from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import (
    check_lossless,
    random_tree,
    replay,
    run_rows,
    tree_generate,
    tree_logits,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0,
        tree=True, tree_graphs=True, capture_graphs=False,  # lazily: the first call of a key is its warm-up
    )  # fmt: skip
    b.prefix.enabled = False
    yield b


def eager(backend):
    """The backend without its graphs, for comparison (restored by the caller)."""
    graphs, backend.graphs = backend.graphs, None
    return graphs


def replay_against_eager(backend, ids, tokens, parents, where: str) -> None:
    """A tree's logits through the graphs twice (the key's warm-up or a replay, then a replay) and in the
    eager tree mode: all three bit for bit equal."""
    import torch

    replays = backend.graphs.replays
    first = tree_logits(backend, ids, tokens, parents)  # warm-up (first call of a key) or replay
    again = tree_logits(backend, ids, tokens, parents)
    assert backend.graphs.replays > replays, f"{where}: the second call of a key did not replay"
    graphs = eager(backend)
    try:
        reference = tree_logits(backend, ids, tokens, parents)
    finally:
        backend.graphs = graphs
    assert torch.equal(again, first), f"{where}: replay differs from warm-up"
    assert torch.equal(again, reference), f"{where}: replay differs from eager"


def test_replay_equals_eager_at_16_rows(backend):
    vocab = backend.info.vocab_size
    rng = random.Random(3)
    with run_rows(backend, 16):
        for length in (700, 4000, 4070):  # 4070 + 16 rows ends past the 4096 bucket: the next bucket
            ids = prompt(length, length, vocab)
            for size in (1, 5, 16):
                tokens, parents = random_tree(size, [], rng, vocab)
                tokens[0] = ids[-1]
                replay_against_eager(backend, ids, tokens, parents, f"ctx {length}, {size} rows")


def test_replay_equals_eager_at_8_rows(backend):
    vocab = backend.info.vocab_size
    rng = random.Random(4)
    with run_rows(backend, 8):
        for length in (900, 9000):
            ids = prompt(length, length, vocab)
            for size in (1, 3, 8, 8):
                tokens, parents = random_tree(size, [], rng, vocab)
                tokens[0] = ids[-1]
                replay_against_eager(backend, ids, tokens, parents, f"ctx {length}, {size} rows")


@pytest.mark.parametrize("run", (8, 16))
def test_graph_speculation_is_lossless(backend, run):
    with run_rows(backend, run):
        check_lossless(backend, [n for n in (1, 2, 4, 8, 12, 16) if n <= run])
    assert backend.graphs.replays > 0


def test_a_trees_logits_do_not_depend_on_the_run_size(backend):
    """The same tree of at most 8 rows replayed in a backend running every verify at 8 rows and at 16: the
    same logits, bit for bit. Each kernel of a replayed verify is row-invariant by construction (a row's bits
    come from its own operands, whatever the other rows or their count), so this is their consequence,
    checked; a backend choosing its run size per round (16 rows at short contexts, 8 at long ones) would rest
    on it."""
    import torch

    vocab = backend.info.vocab_size
    rng = random.Random(5)
    for length in (900, 9000):
        ids = prompt(length, length + 1, vocab)
        for size in (1, 4, 8):
            tokens, parents = random_tree(size, [], rng, vocab)
            tokens[0] = ids[-1]
            by_run = {}
            for run in (8, 16):
                with run_rows(backend, run):
                    tree_logits(backend, ids, tokens, parents)  # the key's warm-up if it is new
                    by_run[run] = tree_logits(backend, ids, tokens, parents)
            assert torch.equal(by_run[8], by_run[16]), f"ctx {length}, {size} rows: the run sizes differ"


def rounds_logits(backend, ids, truth, size: int) -> list:
    """Every verify's logits over a generation with replayed trees of `size` rows (most rows accepted)."""
    seen = []
    verify = backend.verify

    def recording(tokens, parents):
        logits = verify(tokens, parents)
        seen.append(logits.clone())
        return logits

    backend.verify = recording
    try:
        tree_generate(backend, ids, 40, replay(truth, size, 99, backend.info.vocab_size))
    finally:
        del backend.verify
    return seen


def eager_rounds(backend, ids) -> tuple[list[int], list]:
    """Plain decoding's 40 tokens after `ids`, and every verify's logits over a run of mostly accepted 6-row
    trees, both in the eager tree mode (the reference for replays)."""
    graphs = eager(backend)
    try:
        truth, _ = tree_generate(backend, ids, 40, lambda done, anchor, remaining: ([anchor], [-1]))
        return truth, rounds_logits(backend, ids, truth, 6)
    finally:
        backend.graphs = graphs


def test_graph_commits_leave_the_eager_state(backend):
    import torch

    ids = prompt(1500, 77, backend.info.vocab_size)
    with run_rows(backend, 16):
        truth, want = eager_rounds(backend, ids)
        graphs = backend.graphs
        commits = graphs.captures
        got = rounds_logits(backend, ids, truth, 6)
    assert graphs.captures > commits or graphs.replays > 0
    assert len(got) == len(want) > 1
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"round {i}: logits after graph commits differ from eager tree mode"


def test_an_abandoned_verify_leaves_nothing_behind(backend):
    """verify, abandon, verify again, commit: the same logits and the same next round as without the
    abandoned verify (what the speculation core's fault recovery relies on)."""
    import torch

    vocab = backend.info.vocab_size
    ids = prompt(1200, 12, vocab)
    tokens, parents = random_tree(6, [], random.Random(8), vocab)
    tokens[0] = ids[-1]
    runs = []
    for abandon in (False, True):
        backend.begin(ids)
        try:
            first = backend.verify(tokens, parents).clone()
            if abandon:
                backend.abandon()
                again = backend.verify(tokens, parents).clone()
                assert torch.equal(again, first)
            backend.commit([0])
            nxt = int(first[0].argmax())
            runs.append(backend.verify([nxt], [-1]).clone())
            backend.commit([0])
        finally:
            backend.finish()
    assert torch.equal(runs[0], runs[1])


def test_captures_are_bounded_by_keys(backend):
    graphs = backend.graphs
    assert graphs.captures >= 1
    assert len(graphs.graphs) <= 4
    # every key was captured once (a verify and a commit graph), whatever the number of calls
    assert graphs.captures < graphs.replays


def test_graphs_captured_at_load_leave_nothing_to_capture(backend, decoder):  # noqa: F811
    import torch

    from elpis.exl3.graph_warmup import capture_graphs
    from elpis.exl3.tree_graph import context_buckets
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    vocab = backend.info.vocab_size
    ids = prompt(4060, 31, vocab)  # 40 tokens from 4,059: the rounds cross from the 4,096 bucket into 8,192
    blocks = backend.drafter.graphs
    with run_rows(backend, 16):
        truth, want = eager_rounds(backend, ids)
        graphs = backend.graphs
        report = capture_graphs(backend)
        assert report.buckets == context_buckets(65536 + 16, backend.engine.cache_tokens)
        held = {(key[0], key[1]) for key in graphs.graphs}
        assert all((16, bucket) in held for bucket in report.buckets), "a bucket was not captured at load"
        before = (graphs.captures, blocks.captures, blocks.condition_captures)
        got = rounds_logits(backend, ids, truth, 6)
        gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16, draft_top_k=4)
        request = GenerationRequest(
            prompt_ids=tuple(ids), max_tokens=40, sampling=SamplingParams(), ignore_eos=True
        )
        drafted = [t for step in gen.generate(request) for t in step.token_ids]
    after = (graphs.captures, blocks.captures, blocks.condition_captures)
    assert after == before, f"rounds captured (verify+commit, draft, conditioning) {before} -> {after}"
    assert len(got) == len(want) > 1
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"round {i}: a load-time graph's logits differ from eager tree mode"
    assert drafted == truth, "the product path through load-time graphs differs from plain decoding"
