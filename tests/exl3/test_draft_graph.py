"""GPU tests of CUDA-graph-captured DFlash2 draft blocks (`load_backend(draft_graphs=True)`, the default;
`elpis.exl3.draft_graph`) on the synthetic checkpoint of ELPIS_SMALL_DIR (else written to a temporary
directory).

What they establish:
(a) a replay gives the bits of its key's eager warm-up (ExLlamaV3's plain module path on the same buffers)
    for other anchors and contexts than the captured ones, on both sides of a context bucket;
(b) replays follow their inputs: other anchors give other drafts;
(c) captures stay bounded by the keys: one per context bucket;
(d) the product path with the draft's top-k trees through replays gives the tokens of plain decoding;
(e) the draft's conditioning after a commit, replayed, writes the draft's cache bit for bit as ExLlamaV3's
    eager `update_kv_from_target` does, for other accepted rows than the captured ones.
How a replay compares with ExLlamaV3's eager draft (BC attention on) is logged, not required: the draft only
proposes.
"""

from __future__ import annotations

import pytest

from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import TOKENS, log, plain, run_rows, tree_generate

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0, tree=True,
        capture_graphs=False,  # lazily: the first call of a key is its warm-up
    )  # fmt: skip
    b.prefix.enabled = False
    assert b.drafter is not None and b.drafter.graphs is not None, "draft graphs are not on by default"
    yield b


def block(backend, anchor: int):
    chain, logits = backend.drafter.block(anchor)
    return chain.clone(), logits.clone()


def test_replay_equals_warm_up(backend):
    import torch

    graphs = backend.drafter.graphs
    vocab = backend.info.vocab_size
    # 700 and 4000 share the 4,096-token bucket (16 pages); 4090 + the block reaches into the next (32 pages)
    for length in (700, 4000, 4090):
        ids = prompt(length, length, vocab)
        backend.begin(ids)
        try:
            anchor = ids[-1]
            first = block(backend, anchor)  # warm-up (first call of a width) or replay
            replays = graphs.replays
            again = block(backend, anchor)
            assert graphs.replays == replays + 1, "the second call of a width did not replay"
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1]), f"ctx {length}"
            other = (anchor + 7919) % vocab
            replayed = block(backend, other)
            kvp = backend.position()
            width = graphs.width(kvp)
            chain, logits = graphs.warm_up(other, backend.pages, kvp, width)
            assert torch.equal(replayed[0], chain), f"ctx {length}: the replayed chain differs from warm-up"
            assert torch.equal(replayed[1], logits), f"ctx {length}: the replayed logits differ from warm-up"
            assert not torch.equal(replayed[1], again[1]), "another anchor gave the same logits"
            drafter_graphs, backend.drafter.graphs = backend.drafter.graphs, None
            try:
                stock = block(backend, other)  # ExLlamaV3's eager draft forward (BC attention on)
            finally:
                backend.drafter.graphs = drafter_graphs
            diff = float((stock[1].float() - replayed[1].float()).abs().max())
            same = bool(torch.equal(stock[0], replayed[0]))
            log({"test": "draft_graph_vs_eager", "ctx": length, "chain_equal": same, "logits_max_diff": diff})
        finally:
            backend.finish()
    assert graphs.captures == 2, f"{graphs.captures} captures for two context buckets"


def test_draft_tree_speculation_through_replays_is_lossless(backend, decoder):  # noqa: F811
    from elpis.exl3.tree_verify import tree_run
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    graphs = backend.drafter.graphs
    ids = prompt(1000, 52, backend.info.vocab_size)
    for budget, top_k in ((8, 2), (16, 4)):
        with run_rows(backend, tree_run(budget)):
            truth, _ = tree_generate(backend, ids, TOKENS, plain)
            replays = graphs.replays
            gen = SpeculativeGenerator(
                backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=top_k
            )
            request = GenerationRequest(
                prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=SamplingParams(), ignore_eos=True
            )
            out = [t for step in gen.generate(request) for t in step.token_ids]
        assert graphs.replays > replays, "no draft block was replayed"
        assert graphs.condition_replays > 0, "no conditioning was replayed"
        first = next((i for i, (a, b) in enumerate(zip(out, truth, strict=False)) if a != b), None)
        assert out == truth, f"tree budget {budget}, top-{top_k}: differs from plain decoding at {first}"


def _verified_tree(backend, ids: list[int], stride: int):
    """Begin `ids` and verify an 8-row tree after it, then abandon the verify: (kvp, clones of its export
    states, its block table, the draft cache's tensors). The caller finishes the sequence."""
    vocab = backend.info.vocab_size
    backend.begin(ids)
    kvp = backend.position()
    tokens = [ids[-1]] + [(ids[-1] + stride * i) % vocab for i in range(1, 8)]
    backend.verify(tokens, [-1, 0, 1, 2, 0, 4, 1, 6])
    export = [t.clone() for t in backend.pending.export]  # clones: in place for the whole test
    table = backend._last_table
    backend.abandon()
    layers = backend.engine.draft_cache.layers.values()
    return kvp, export, table, [t for layer in layers for t in layer.get_tensors() if t is not None]


def _condition_eagerly(engine, export, rows: list[int], table, kvp: int) -> None:
    """ExLlamaV3's conditioning of the draft on verify rows `rows` (through `update_draft_kv`), eagerly."""
    import torch

    from elpis.exl3.draft_graph import update_draft_kv
    from elpis.exl3.upload import pinned

    index = torch.tensor(rows, device=export[0].device)
    update_draft_kv(engine, [t.index_select(1, index) for t in export], table, pinned([kvp], torch.int32))


def restore(tensors: list, saved: list) -> None:
    """Write the cache tensors back to a saved copy."""
    for t, kept in zip(tensors, saved, strict=True):
        t.copy_(kept)


def cache_rows(saved: list, pages: list[int], positions: range) -> list:
    """Each cache tensor's rows ([pages, PAGE, ...]) at the sequence's `positions`."""
    from elpis.exl3.prefix import PAGE

    where = ([pages[p // PAGE] for p in positions], [p % PAGE for p in positions])
    return [t[where] for t in saved]


def test_conditioning_replay_equals_eager(backend):
    import torch

    with torch.inference_mode():  # the caches hold inference tensors, as in the backend's commit
        _check_conditioning_replays(backend)


def _check_conditioning_replays(backend) -> None:
    import torch


    graphs = backend.drafter.graphs
    engine = backend.engine
    try:
        kvp, export, table, tensors = _verified_tree(backend, prompt(900, 900, backend.info.vocab_size), 131)
        before = [t.clone() for t in tensors]

        def same_as(reference: list) -> bool:
            return all(torch.equal(t, r) for t, r in zip(tensors, reference, strict=True))

        captures = graphs.condition_captures
        for path in ([0, 1, 2], [0, 4, 5], [0]):
            restore(tensors, before)
            _condition_eagerly(engine, export, path, table, kvp)
            eager = [t.clone() for t in tensors]
            assert not same_as(before), f"path {path}: the eager conditioning wrote nothing"
            for attempt in ("first", "again"):
                restore(tensors, before)
                graphs.condition(export, path, table, kvp)
                assert same_as(eager), f"path {path} ({attempt} call): the draft's cache differs from eager"
        assert graphs.condition_captures == captures + 2, "one capture per accepted-row count"
    finally:
        backend.finish()


def test_padded_conditioning_keeps_the_committed_rows_bits(backend):
    """The rounds on the GPU (elpis/spec/README.md, "The round on the GPU", step 3) would condition the draft
    on a fixed number of rows: the committed path padded with other rows of the verify. The draft never reads
    a cached position at or past its length, and the next conditioning overwrites them, so that is exact if
    the committed rows' K/V in the draft's 3-bit cache do not depend on the rows written beside them: checked
    here against the conditioning on the path alone, and that nothing before kvp is written."""
    import torch

    with torch.inference_mode():
        _check_padded_conditioning(backend)


def _check_padded_conditioning(backend) -> None:
    import torch

    from elpis.exl3.prefix import PAGE

    engine = backend.engine
    try:
        kvp, export, table, tensors = _verified_tree(backend, prompt(1300, 901, backend.info.vocab_size), 97)
        pages = list(backend.pages)
        assert tensors and all(t.shape[1] == PAGE for t in tensors), "cache tensors are [pages, PAGE, ...]"
        before = [t.clone() for t in tensors]

        def condition(rows: list[int]) -> list:
            restore(tensors, before)
            _condition_eagerly(engine, export, rows, table, kvp)
            return [t.clone() for t in tensors]

        def at(saved: list, positions: range) -> list:
            return cache_rows(saved, pages, positions)

        for path, padding in (([0, 1, 2], [5, 6, 7, 3, 4]), ([0, 4, 5], [7, 7, 7, 7, 7]), ([0], [1] * 7)):
            alone, padded = condition(path), condition(path + padding)
            kept = range(kvp, kvp + len(path))
            for a, b in zip(at(alone, kept), at(padded, kept), strict=True):
                assert torch.equal(a, b), f"path {path}: a committed row's draft K/V depend on other rows"
            earlier = range(max(0, kvp - 300), kvp)
            for a, b in zip(at(before, earlier), at(padded, earlier), strict=True):
                assert torch.equal(a, b), f"path {path}: the padded conditioning wrote before kvp"
    finally:
        backend.finish()
