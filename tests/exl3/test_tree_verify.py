"""GPU tests of tree verify on the exl3 engine (`Exl3Backend(tree=True)`, `elpis.exl3.tree_verify`) on the
synthetic --small checkpoint (ELPIS_SMALL_DIR, else written to a temporary directory).

What they establish:
(a) tree-mode speculative decoding (trees of 1, 2, 4, 8, 12, 16 rows holding the known continuation, and
    trees that are always wrong) gives exactly the tokens of tree-mode plain decoding (one row per verify):
    K/V compaction, the GDN path replay and the draft feed are lossless;
(b) a tree row's logits are bit-identical to the plain decoding step of its path, whatever its row index,
    its siblings, the tree shape and size;
(c) the product path (speculation core, DFlash2 top-k candidates as trees of 8 and 16 rows, compiled tree
    acceptor) gives the plain decoding tokens;
(d) the stock chain path is unchanged once the patches are installed, and tree-mode greedy output against
    the stock chain path is reported (agreement and logit error; different kernels, not required bitwise);
(e) (a) again at a 32K-token context.
(a)-(c) run for both tree shapes a backend can be set to (`TREE_RUNS`: every verify 8 rows, or 16).
Decisions are made by the proven acceptor (`elpis.accept.tree`; `make build` / `elpis build` first).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Callable, Sequence

import pytest

from elpis.exl3.tree_verify import TREE_RUNS, tree_run
from tests.exl3.test_gpu import decoder, oracle_generate, prompt  # noqa: F401  (decoder: a fixture)

pytestmark = pytest.mark.gpu

SIZES = (1, 2, 4, 8, 12, 16)
TOKENS = 24


def log(record: dict) -> None:
    """One JSON line for the device log (ELPIS_TREE_LOG), and stdout."""
    line = json.dumps(record, sort_keys=True)
    print(line)
    path = os.environ.get("ELPIS_TREE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@contextlib.contextmanager
def run_rows(backend, run: int):
    """The backend with every tree verify at `run` rows (between sequences only), as loaded afterwards."""
    loaded = backend.fixed_rows
    backend.fixed_rows = run
    try:
        yield backend
    finally:
        backend.fixed_rows = loaded


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0, tree=True,
        tree_graphs=False,  # the eager forward (test_tree_graph.py covers the replayed one)
    )  # fmt: skip
    b.prefix.enabled = False  # every begin() prefills cold: runs compare against exactly the same state
    yield b


# A proposer builds one round's tree: (tokens with the anchor at row 0, parents), given the number of tokens
# already generated, the anchor and the tokens still to generate.
Proposer = Callable[[int, int, int], tuple[list[int], list[int]]]


def tree_generate(
    backend,
    ids: Sequence[int],
    tokens: int,
    propose: Proposer,
    *,
    arm: bool = False,
    seen: list | None = None,
) -> tuple[list[int], list[int]]:
    """Greedy rounds in tree mode, each decided by the proven tree acceptor. Returns (tokens, per round).
    `arm`: queue each verify behind the verify gate first, as the drafter does (`Exl3Backend.prelaunch`);
    `seen`: collects a copy of every verify's logits."""
    from elpis import accept

    backend.begin(list(ids))
    out, anchor, per_round = [], ids[-1], []
    try:
        while len(out) < tokens:
            remaining = tokens - len(out)
            rows, parents = propose(len(out), anchor, remaining)
            if arm:
                backend.prelaunch()
            logits = backend.verify(rows, parents)
            if seen is not None:
                seen.append(logits.clone())
            assert logits.shape == (len(rows), backend.info.vocab_size)
            targets = [int(t) for t in logits.argmax(dim=-1).tolist()]
            decision = accept.tree(parents, rows, targets, [], remaining)
            backend.commit(list(decision.rows))
            committed = [targets[r] for r in decision.rows]
            out += committed
            anchor = committed[-1]
            per_round.append(decision.count)
    finally:
        backend.finish()
    return out, per_round


def plain(done: int, anchor: int, remaining: int) -> tuple[list[int], list[int]]:
    return [anchor], [-1]


def random_tree(
    size: int, path: Sequence[int], rng: random.Random, vocab: int
) -> tuple[list[int], list[int]]:
    """A random tree of `size` rows whose rows include the chain `path` (tokens after the anchor) from the
    root, at random row indices; the other rows hang anywhere with random tokens."""
    path = list(path)[: size - 1]
    extra = size - 1 - len(path)
    order = ["path"] * len(path) + ["other"] * extra
    rng.shuffle(order)
    tokens, parents, last_path_row = [0], [-1], 0
    for kind in order:
        r = len(tokens)
        if kind == "path":
            parents.append(last_path_row)
            tokens.append(path.pop(0))
            last_path_row = r
        else:
            parents.append(rng.randrange(r))
            tokens.append(rng.randrange(vocab))
    return tokens, parents


def replay(truth: Sequence[int], size: int, seed: int, vocab: int) -> Proposer:
    """Random trees of `size` rows holding the known continuation (most rows on the path get accepted)."""
    rng = random.Random(seed)

    def propose(done: int, anchor: int, remaining: int) -> tuple[list[int], list[int]]:
        ahead = list(truth[done : done + min(size - 1, remaining - 1)])
        tokens, parents = random_tree(size, ahead, rng, vocab)
        tokens[0] = anchor
        return tokens, parents

    return propose


def always_wrong(truth: Sequence[int], size: int, seed: int, vocab: int) -> Proposer:
    """Random trees whose depth-1 rows never hold the next true token: only the anchor row is accepted."""
    rng = random.Random(seed)

    def propose(done: int, anchor: int, remaining: int) -> tuple[list[int], list[int]]:
        tokens, parents = random_tree(size, [], rng, vocab)
        tokens[0] = anchor
        for r in range(1, size):
            if parents[r] == 0 and tokens[r] == truth[done]:
                tokens[r] = (tokens[r] + 1) % vocab
        return tokens, parents

    return propose


def test_bad_trees_and_paths_refused(backend):
    ids = prompt(300, 4, backend.info.vocab_size)
    backend.begin(ids)
    try:
        with pytest.raises(ValueError, match="not a tree"):
            backend.verify([ids[-1], 5, 6], [-1, 2, 0])
        with pytest.raises(ValueError, match=r"1\.\.16"):
            backend.verify([ids[-1]] * 17, [-1] + [0] * 16)
        with run_rows(backend, 8), pytest.raises(ValueError, match="over the backend's 8-row verifies"):
            backend.verify([ids[-1]] * 9, [-1] + [0] * 8)
        backend.verify([ids[-1], 5, 6, 7], [-1, 0, 0, 1])
        with pytest.raises(ValueError, match="root-first path"):
            backend.commit([0, 2, 3])
        with pytest.raises(ValueError, match="not one of the 4 verified rows"):
            backend.commit([0, 4])  # a padding row
        backend.commit([0, 1, 3])
        assert backend.position() == len(ids) - 1 + 3
    finally:
        backend.finish()


def path_logits(backend, ids: Sequence[int], path: Sequence[int]):
    """Plain decoding along `path` (tokens after the anchor): the logits of each step, one row per verify."""
    import torch

    backend.begin(list(ids))
    rows = []
    try:
        for token in [ids[-1], *path]:
            rows.append(backend.verify([token], [-1])[0].clone())
            backend.commit([0])
    finally:
        backend.finish()
    return torch.stack(rows)


def tree_logits(backend, ids: Sequence[int], tokens: list[int], parents: list[int]):
    backend.begin(list(ids))
    try:
        return backend.verify(tokens, parents).clone()
    finally:
        backend.finish()


@pytest.mark.parametrize("run", TREE_RUNS)
def test_row_logits_are_row_invariant(backend, run):
    """The path's rows give the plain decoding logits bit for bit, at any row index, beside any siblings, in
    any tree shape and size."""
    with run_rows(backend, run):
        check_row_invariance(backend, [n for n in (5, 6, 8, 12, 16, 16, 9, 7) if n <= run])


def check_row_invariance(backend, sizes: Sequence[int]) -> None:
    import torch

    vocab = backend.info.vocab_size
    ids = prompt(900, 31, vocab)
    rng = random.Random(5)
    path = [rng.randrange(vocab) for _ in range(4)]
    reference = path_logits(backend, ids, path)
    for trial, size in enumerate(sizes):
        tokens, parents = random_tree(size, path, rng, vocab)
        tokens[0] = ids[-1]
        logits = tree_logits(backend, ids, tokens, parents)
        on_path, row = [0], 0
        for token in path:
            row = next(r for r in range(len(tokens)) if parents[r] == row and tokens[r] == token)
            on_path.append(row)
        for depth, r in enumerate(on_path):
            same = torch.equal(logits[r], reference[depth])
            if not same:
                diff = (logits[r] - reference[depth]).abs().max().item()
                log({"test": "row_invariance", "run": backend.fixed_rows, "trial": trial, "row": r,
                     "depth": depth, "max_abs_diff": diff})  # fmt: skip
            assert same, f"trial {trial}: row {r} (depth {depth}) of {parents} differs from plain decoding"
    log({"test": "row_invariance", "run": backend.fixed_rows, "trials": len(sizes), "ok": True})


@pytest.mark.parametrize("run", TREE_RUNS)
def test_tree_speculation_is_lossless(backend, run):
    with run_rows(backend, run):
        check_lossless(backend, [n for n in SIZES if n <= run])


def check_lossless(backend, sizes: Sequence[int]) -> None:
    vocab = backend.info.vocab_size
    for seed, length in ((21, 700), (22, 1900)):
        ids = prompt(length, seed, vocab)
        truth, rounds = tree_generate(backend, ids, TOKENS, plain)
        assert rounds == [1] * TOKENS
        for size in sizes:
            t0 = time.perf_counter()
            got, rounds = tree_generate(backend, ids, TOKENS, replay(truth, size, seed * 100 + size, vocab))
            seconds = round(time.perf_counter() - t0, 3)
            first = next((i for i, (a, b) in enumerate(zip(got, truth, strict=True)) if a != b), None)
            record = {"prompt": seed, "run": backend.fixed_rows, "size": size, "rounds": rounds,
                      "first_diff": first, "seconds": seconds}  # fmt: skip
            log({"test": "tree_replay", **record})
            assert first is None, f"prompt {seed}, {size}-row trees: output differs at token {first}"
            if size > 1:
                assert max(rounds) > 1, f"{size}-row trees holding the continuation were never accepted"
            got, rounds = tree_generate(backend, ids, TOKENS, always_wrong(truth, size, seed + size, vocab))
            assert rounds == [1] * TOKENS
            first = next((i for i, (a, b) in enumerate(zip(got, truth, strict=True)) if a != b), None)
            log({"test": "tree_wrong", "prompt": seed, "run": backend.fixed_rows, "size": size,
                 "first_diff": first})  # fmt: skip
            assert first is None, f"prompt {seed}, {size}-row wrong trees: output differs at token {first}"


def test_product_path_with_draft_trees(backend, decoder):  # noqa: F811
    """The speculation core with the DFlash2 drafter's top-k candidates building trees (8 and 16 rows) and
    the compiled tree acceptor: the tokens of tree-mode plain decoding."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    ids = prompt(1000, 51, backend.info.vocab_size)
    for budget, top_k in ((8, 2), (16, 4), (6, 3)):
        with run_rows(backend, tree_run(budget)):
            truth, _ = tree_generate(backend, ids, TOKENS, plain)
            gen = SpeculativeGenerator(
                backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=top_k
            )
            request = GenerationRequest(
                prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=SamplingParams(), ignore_eos=True
            )
            out, stats = [], None
            for step in gen.generate(request):
                out.extend(step.token_ids)
                if step.finish_reason is not None:
                    stats = step.stats
        first = next((i for i, (a, b) in enumerate(zip(out, truth, strict=False)) if a != b), None)
        log({"test": "product_tree", "budget": budget, "run": tree_run(budget), "top_k": top_k,
             "first_diff": first,
             "committed_per_round": stats.committed_per_round if stats else None})  # fmt: skip
        assert out == truth, f"tree budget {budget}, top-{top_k}: differs from plain decoding at {first}"


def test_chain_path_untouched_and_tree_against_stock(backend):
    """After tree mode ran (patches installed), chain mode still gives its own tokens; tree-mode greedy vs
    the chain path (stock kernels) is reported: agreement and the first step's logit error."""
    from elpis.exl3 import tree_verify

    vocab = backend.info.vocab_size
    ids = prompt(1200, 41, vocab)
    tree_tokens, _ = tree_generate(backend, ids, TOKENS, plain)
    assert tree_verify.installed()
    loaded = backend.fixed_rows
    backend.tree, backend.fixed_rows = False, 8
    try:
        chain_tokens, _, _ = oracle_generate(backend, ids, TOKENS)
        chain_again, _, _ = oracle_generate(backend, ids, TOKENS, drafter=backend.drafter)
        backend.begin(ids)
        try:
            chain_first = backend.verify([ids[-1]], [-1])[0].double()
        finally:
            backend.finish()
    finally:
        backend.tree, backend.fixed_rows = True, loaded
    assert chain_again == chain_tokens, "chain mode with the draft differs from chain mode without it"
    backend.begin(ids)
    try:
        tree_first = backend.verify([ids[-1]], [-1])[0].double()
    finally:
        backend.finish()
    agree = next(
        (i for i, (a, b) in enumerate(zip(tree_tokens, chain_tokens, strict=True)) if a != b), TOKENS
    )
    scale = chain_first.abs().max().item()
    err = (tree_first - chain_first).abs().max().item()
    log(
        {
            "test": "tree_vs_stock_chain",
            "tokens_agree_before_first_diff": agree,
            "of": TOKENS,
            "first_step_max_abs_logit_diff": err,
            "first_step_max_abs_logit": scale,
            "first_step_argmax_same": int(tree_first.argmax()) == int(chain_first.argmax()),
        }
    )
    assert err <= 0.1 * max(scale, 1.0), (
        f"tree-mode logits differ from the chain path by {err} (scale {scale})"
    )


def test_long_context_lossless(backend):
    """At a 32K-token context (63 attention splits): replayed 4- and 16-row trees equal plain decoding."""
    vocab = backend.info.vocab_size
    ids = prompt(32000, 61, vocab)
    t0 = time.perf_counter()
    truth, _ = tree_generate(backend, ids, 16, plain)
    plain_seconds = round(time.perf_counter() - t0, 3)
    for size in (4, 16):
        got, rounds = tree_generate(backend, ids, 16, replay(truth, size, 7000 + size, vocab))
        first = next((i for i, (a, b) in enumerate(zip(got, truth, strict=True)) if a != b), None)
        log({"test": "tree_replay_32k", "size": size, "rounds": rounds, "first_diff": first,
             "plain_seconds_incl_prefill": plain_seconds})  # fmt: skip
        assert first is None, f"32K context, {size}-row trees: output differs at token {first}"
        assert max(rounds) > 1
