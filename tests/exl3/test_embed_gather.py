"""GPU tests of the embedding gather (`elpis.exl3.embed_gather`, registry switch `exl3-embed-gather`) on the
synthetic checkpoint of ELPIS_SMALL_DIR (else written to a temporary directory).

What they establish:
(a) the kernel, reading ExLlamaV3's own host table through mapped pinned memory, writes exactly
    `Embedding.forward`'s output for int32 and int64 ids, and an id outside the table raises the error word;
(b) a captured tree verify that gathers its own input leaves in its input buffer the bits ExLlamaV3's host
    lookup gives, and its logits equal the eager tree mode's bit for bit (first call and replays, 1-16 rows,
    both sides of a context bucket);
(c) a captured draft block that gathers its anchor's row has the input layer's exact output in its input
    buffer, and its drafts equal those of a draft block filled on the host;
(d) tree speculation through the gathering graphs gives plain decoding's tokens.
"""

from __future__ import annotations

import random

import pytest

from tests.exl3.test_gpu import prompt
from tests.exl3.test_tree_graph import replay_against_eager
from tests.exl3.test_tree_verify import check_lossless, random_tree, run_rows

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend(small):
    import os

    from elpis.exl3 import load_backend

    old = os.environ.get("ELPIS_PATCH_EMBED_GATHER")
    os.environ["ELPIS_PATCH_EMBED_GATHER"] = "1"
    try:
        b = load_backend(
            small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0,
            tree=True, tree_graphs=True, capture_graphs=False,
        )  # fmt: skip
    finally:
        if old is None:
            del os.environ["ELPIS_PATCH_EMBED_GATHER"]
        else:
            os.environ["ELPIS_PATCH_EMBED_GATHER"] = old
    b.prefix.enabled = False
    assert b.graphs is not None and b.graphs.table is not None, "the tree graphs do not gather"
    assert b.drafter is not None and b.drafter.graphs is not None and b.drafter.graphs.table is not None
    yield b


def gathered(backend, ids, scale: float = 1.0):
    """What the gather writes for `ids` (a device tensor), on the host."""
    import torch

    table = backend.graphs.table
    out = torch.empty((ids.numel(), table.hidden), dtype=torch.float32, device="cuda")
    table.gather(out, ids, scale)
    return out.cpu()


def host_lookup(backend, ids):
    import torch

    return backend.graphs.embedding.forward(torch.tensor([list(ids)], dtype=torch.long), {})


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_the_kernel_writes_exllamav3s_embedding_output(backend, id_dtype):
    import torch

    table = backend.graphs.table
    vocab = backend.info.vocab_size
    ids = [0, vocab - 1, 5, 5, *random.Random(1).sample(range(vocab), 12)]
    out = torch.full((1, len(ids), table.hidden), 7.0, dtype=torch.float32, device="cuda")
    table.gather(out, torch.tensor(ids, dtype=getattr(torch, id_dtype), device="cuda"))
    torch.cuda.synchronize()
    assert int(table.error.item()) == 0
    assert torch.equal(out.cpu(), host_lookup(backend, ids))
    assert not torch.equal(out[0, 0], out[0, 1]), "rows of different ids are equal: the table is not read"


def test_an_id_outside_the_table_is_caught(backend):
    import torch

    from elpis.exl3.embed_gather import check_ids

    table = backend.graphs.table
    out = torch.zeros((2, table.hidden), dtype=torch.float32, device="cuda")
    table.gather(out, torch.tensor([1, table.vocab], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    try:
        assert int(table.error.item()) == 1
        assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()
    finally:
        table.error.zero_()
    with pytest.raises(ValueError, match="outside"):
        check_ids([table.vocab], table.vocab)


def test_gathered_verifies_equal_the_eager_tree_mode(backend):
    import torch

    vocab = backend.info.vocab_size
    rng = random.Random(5)
    with run_rows(backend, 16):
        for length in (700, 4070):  # 4070 + 16 rows ends past the 4096 bucket
            ids = prompt(length, length, vocab)
            for size in (1, 7, 16):
                tokens, parents = random_tree(size, [], rng, vocab)
                tokens[0] = ids[-1]
                replay_against_eager(backend, ids, tokens, parents, f"ctx {length}, {size} rows")
                captured = next(reversed(backend.graphs.graphs.values()))
                padded = tokens + [tokens[0]] * (16 - size)  # what the backend pads a tree with
                assert captured.ids.tolist() == padded, f"ctx {length}, {size} rows: the uploaded ids differ"
                # (the forward updates its input buffer in place, so the gather is checked on its own)
                assert torch.equal(gathered(backend, captured.ids), host_lookup(backend, padded)[0]), (
                    f"ctx {length}, {size} rows: the gathered input is not ExLlamaV3's embedding"
                )


def test_gathered_draft_blocks_equal_host_filled_ones(backend):
    import torch

    from elpis.exl3.draft_graph import DraftGraphs, block_pages

    graphs = backend.drafter.graphs
    host = DraftGraphs(backend.engine)  # the same engine, the input filled on the host as before
    vocab = backend.info.vocab_size
    for length in (700, 4090):
        ids = prompt(length, length + 1, vocab)
        backend.begin(ids)
        try:
            for anchor in (ids[-1], 3, vocab - 1):
                chain, logits = (t.clone() for t in backend.drafter.block(anchor))  # warm-up or replay
                kvp = backend.position()
                width = graphs.width(kvp)
                c = graphs.graphs[width]
                assert c.anchor.tolist() == [anchor]
                x = torch.cat((gathered(backend, c.anchor, graphs.scale), graphs.template[0, 1:].cpu()))
                expected_x = graphs.input_layer.forward(torch.tensor([[anchor]], dtype=torch.long), {})
                assert torch.equal(x[None], expected_x), (
                    f"ctx {length}, anchor {anchor}: the gathered input differs"
                )
                pages = block_pages(backend.pages, kvp, graphs.block_size)
                ref_chain, ref_logits = host.warm_up(anchor, pages, kvp, width)
                assert torch.equal(chain, ref_chain) and torch.equal(logits, ref_logits), (
                    f"ctx {length}, anchor {anchor}: the draft differs from a host-filled block"
                )
        finally:
            backend.finish()
    assert graphs.replays > 0


def test_gathered_speculation_is_lossless(backend):
    with run_rows(backend, 16):
        check_lossless(backend, [1, 4, 16])
    assert backend.graphs.replays > 0
