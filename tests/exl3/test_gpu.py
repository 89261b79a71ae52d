"""GPU tests of the exl3 backend on the synthetic --small checkpoint (run with `pytest -m gpu` on a CUDA
machine with the gpu extra). ELPIS_SMALL_DIR may name an existing `elpis synth --small` output; otherwise one
is written into a temporary directory.

What they establish: the checkpoint loads through ExLlamaV3's normal loader; generation through the
speculation core gives the same tokens with the DFlash2 draft on and off, and with a drafter whose
proposals are accepted; elpis's chain verify gives stock ExLlamaV3's own generator's tokens token for token;
prefix reuse (GPU tier, and disk across a restart) gives the same tokens as a cold run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from elpis.backend import DraftBlock

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0
    )
    yield b


@pytest.fixture(scope="module")
def decoder(small):
    from elpis.bench.worker import BenchDecoder

    return BenchDecoder(small / "target")


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    from elpis.bench.workload import prompt as make

    return make(n, seed, vocab)


def spec_generate(
    backend, decoder, ids: Sequence[int], tokens: int, drafter=None, budget: int = 8, draft_top_k: int = 1,
    sampling=None, top_logprobs: int | None = None,
):
    """The product path: the speculation core with the compiled, proven acceptor (chains by default:
    draft_top_k=1; greedy unless `sampling` says otherwise)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    gen = SpeculativeGenerator(
        backend, decoder, drafter=drafter, tree_budget=budget if drafter else 1, draft_top_k=draft_top_k
    )
    request = GenerationRequest(
        prompt_ids=tuple(ids), max_tokens=tokens, sampling=sampling or SamplingParams(), ignore_eos=True,
        top_logprobs=top_logprobs,
    )
    out, stats = [], None
    for step in gen.generate(request):
        out.extend(step.token_ids)
        if step.finish_reason is not None:
            stats = step.stats
    return out, stats.cached_tokens, stats.committed_per_round


def oracle_generate(backend, ids: Sequence[int], tokens: int, drafter=None, budget: int = 8):
    """The same chain rounds, greedy, with each acceptance decided by the test oracle
    (`elpis.accept.oracle`, the one place allowed to restate the rule), so the engine can be tested on a
    machine where the compiled acceptor is not built. Returns (tokens, cached, committed per round)."""
    import numpy as np

    from elpis.accept import abi, oracle

    cached = backend.begin(list(ids))
    out, context, anchor, per_round = [], list(ids), ids[-1], []
    try:
        while len(out) < tokens:
            remaining = tokens - len(out)
            depth = min(budget - 1, remaining - 1)
            draft: list[int] = []
            if drafter is not None and depth >= 1:
                draft = [c[0][0] for c in drafter.propose(context, depth, 1).candidates][:depth]
            logits = backend.verify([anchor, *draft], list(range(-1, len(draft))))
            targets = [int(t) for t in logits.argmax(dim=-1).tolist()]
            cells = np.zeros((1, abi.CHAIN_CELLS), dtype=np.int64)
            cells[0, abi.CHAIN_K] = len(draft)
            cells[0, abi.CHAIN_BUDGET] = remaining  # no stop ids: cells[0, abi.CHAIN_NSTOPS] stays 0
            cells[0, abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + len(draft)] = draft
            cells[0, abi.CHAIN_TARGET : abi.CHAIN_TARGET + len(targets)] = targets
            count = int(oracle.chain(cells)[0]) >> 1
            backend.commit(list(range(count)))
            committed = targets[:count]
            out += committed
            context += committed
            anchor = committed[-1]
            per_round.append(count)
    finally:
        backend.finish()
    return out, cached, per_round


def acceptor_built() -> bool:
    from elpis import accept

    try:
        accept.chain([], [1], [], 1)
    except RuntimeError as exc:
        if "not built" in str(exc):
            return False
        raise
    return True


class ReplayDrafter:
    """Proposes a known continuation: most rounds accept every row."""

    def __init__(self, prompt_len: int, continuation: Sequence[int]) -> None:
        self.prompt_len, self.continuation = prompt_len, list(continuation)

    def reset(self) -> None:
        pass

    def propose(self, context, depth, top_k) -> DraftBlock:
        done = len(context) - self.prompt_len
        ahead = self.continuation[done : done + depth]
        return DraftBlock([[(t, 0.0)] for t in ahead])


def test_small_checkpoint_loads(backend, small):
    info = backend.info
    assert info.name == "exl3" and info.vocab_size == 32768
    assert backend.drafter is not None
    assert 248046 in info.stop_token_ids
    cfg = json.loads((small / "target" / "config.json").read_text())
    assert cfg["synthetic"] is True


def direct_rounds(backend, ids: list[int], tokens: int, draft: bool) -> list[int]:
    """Rounds straight on the backend, committing only the anchor row (always a valid commit: no draft
    token is accepted, so no acceptance decision is needed): exercises begin/propose/verify/commit."""
    backend.begin(ids)
    out, anchor = [], ids[-1]
    try:
        for _ in range(tokens):
            rows = [anchor]
            if draft:
                block = backend.drafter.propose(ids + out, 7, 1)
                rows += [c[0][0] for c in block.candidates]
            logits = backend.verify(rows, list(range(-1, len(rows) - 1)))
            assert logits.shape == (len(rows), backend.info.vocab_size) and logits.dtype.is_floating_point
            assert bool(logits.isfinite().all())
            backend.commit([0])
            anchor = int(logits[0].argmax())
            out.append(anchor)
    finally:
        backend.finish()
    return out


def test_engine_rounds_draft_on_off(backend):
    ids = prompt(2500, 9, backend.info.vocab_size)
    assert direct_rounds(backend, ids, 24, draft=True) == direct_rounds(backend, ids, 24, draft=False)


def test_draft_on_off_same_tokens(backend, decoder):
    vocab = backend.info.vocab_size
    for seed, length in ((1, 700), (2, 3000)):
        ids = prompt(length, seed, vocab)
        plain, _, _ = oracle_generate(backend, ids, 48)
        drafted, _, rounds = oracle_generate(backend, ids, 48, drafter=backend.drafter)
        first = next((i for i, (a, b) in enumerate(zip(drafted, plain, strict=True)) if a != b), None)
        assert first is None, f"prompt {seed}: the draft changed the output at token {first}"
        assert sum(rounds) == 48


def test_accepted_drafts_same_tokens(backend, decoder):
    """A drafter that proposes the true continuation: rows are accepted, the output must not change."""
    vocab = backend.info.vocab_size
    ids = prompt(1500, 3, vocab)
    plain, _, _ = oracle_generate(backend, ids, 64)
    replayed, _, rounds = oracle_generate(backend, ids, 64, drafter=ReplayDrafter(len(ids), plain))
    first = next((i for i, (a, b) in enumerate(zip(replayed, plain, strict=True)) if a != b), None)
    assert max(rounds) > 1, "the replay drafter should have been accepted"
    assert first is None, f"accepted drafts changed the output at token {first}"


def test_spec_core_path_equals_oracle_rounds(backend, decoder):
    """The product path (SpeculativeGenerator + compiled acceptor) commits what the oracle rounds commit."""
    if not acceptor_built():
        pytest.skip("the compiled acceptor is not built here (run make build first)")
    ids = prompt(1200, 10, backend.info.vocab_size)
    plain, _, _ = oracle_generate(backend, ids, 32)
    for drafter in (None, backend.drafter, ReplayDrafter(len(ids), plain)):
        assert spec_generate(backend, decoder, ids, 32, drafter=drafter)[0] == plain


def test_tree_parents_refused(backend):
    ids = prompt(300, 4, backend.info.vocab_size)
    backend.begin(ids)
    try:
        with pytest.raises(ValueError, match="chains only"):
            backend.verify([ids[-1], 5, 6], [-1, 0, 0])
    finally:
        backend.finish()


def test_matches_stock_generator(backend, decoder, small):
    """Stock ExLlamaV3 (its Generator, DFlash2 chain, argmax) and elpis (spec core + proven acceptor) give
    the same tokens from the same synthetic weights, prefilling in chunks of the same size (the backend's)."""
    import torch
    from exllamav3 import Cache, Config, Generator, Job, Model, Tokenizer
    from exllamav3.cache import CacheLayer_quant
    from exllamav3.generator.sampler import ArgmaxSampler

    from elpis.exl3.engine import MAX_HISTORY

    config = Config.from_directory(str(small / "target"))
    model = Model.from_config(config)
    cache = Cache(
        model,
        max_num_tokens=65536,
        layer_type=CacheLayer_quant,
        k_bits=3,
        v_bits=3,
        max_batch_size=1,
        max_history=MAX_HISTORY,
    )
    dconfig = Config.from_directory(str(small / "draft"))
    draft = Model.from_config(dconfig)
    dcache = Cache(
        draft,
        max_num_tokens=65536,
        layer_type=CacheLayer_quant,
        k_bits=3,
        v_bits=3,
        max_batch_size=1,
        max_history=MAX_HISTORY,
    )
    draft.load(device="cuda:0")
    model.load(device="cuda:0")
    gen = Generator(
        model,
        cache,
        Tokenizer.from_config(config),
        draft_model=draft,
        draft_cache=dcache,
        num_draft_tokens=7,
        max_chunk_size=backend.engine.prefill_chunk,
        max_batch_size=1,
    )
    try:
        for seed, length in ((5, 1000), (6, 5000)):
            ids = prompt(length, seed, backend.info.vocab_size)
            job = Job(
                input_ids=torch.tensor([ids]), max_new_tokens=40, sampler=ArgmaxSampler(), stop_conditions=[]
            )
            gen.enqueue(job)
            stock: list[int] = []
            while gen.num_remaining_jobs():
                for r in gen.iterate():
                    if r.get("stage") == "streaming" and r.get("token_ids") is not None:
                        stock += r["token_ids"].view(-1).tolist()
            ours, _, _ = oracle_generate(backend, ids, 40, drafter=backend.drafter)
            first = next((i for i, (a, b) in enumerate(zip(ours, stock, strict=False)) if a != b), None)
            assert first is None and len(ours) == len(stock) == 40, f"prompt {seed}: diverges at {first}"
    finally:
        gen.close()
        model.unload()
        draft.unload()


def test_prefix_reuse_is_exact(backend, decoder):
    vocab = backend.info.vocab_size
    first = prompt(6000, 7, vocab)
    answer, _, _ = oracle_generate(backend, first, 16, drafter=backend.drafter)
    second = first + answer + prompt(700, 8, vocab)
    warm, cached, _ = oracle_generate(backend, second, 32, drafter=backend.drafter)
    assert cached >= 4096, cached
    backend.prefix.enabled = False
    try:
        cold, cold_cached, _ = oracle_generate(backend, second, 32, drafter=backend.drafter)
    finally:
        backend.prefix.enabled = True
    assert cold_cached == 0
    assert warm == cold


def test_snapshot_copies_what_stash_copies(backend):
    """elpis's snapshot (one pinned staging buffer, copied out by a worker thread) holds ExLlamaV3's `stash`
    bit for bit once settled, and writing it back restores the state."""
    import torch

    ids = prompt(3000, 21, backend.info.vocab_size)
    backend.begin(ids)
    try:
        with torch.inference_mode():  # the caches are inference tensors
            store = backend.prefix.store
            ours = store.save_state()  # filled by the store's worker thread
            store.settle()
            stashed = backend.state.stash()
            theirs = {}
            for key, (recurrent, conv) in ((k, v) for k, v in stashed.items() if isinstance(k, tuple)):
                name = ".".join(str(k) for k in key)
                theirs[f"{name}.recurrent"], theirs[f"{name}.conv"] = recurrent, conv
            assert sorted(ours) == sorted(theirs) and len(ours) >= 2
            for name, t in ours.items():
                assert t.device.type == "cpu" and not t.is_pinned(), name  # owned pageable copies
                assert t.dtype == theirs[name].dtype and torch.equal(t, theirs[name]), name
            layers = backend.state.cache.get_all_recurrent_layers()
            row = 2 * backend.state.slot + backend.state.parity
            next(iter(layers.values())).recurrent_state[row].add_(1.0)  # disturb, then restore
            store.load_state(ours, backend.position())
            again = store.save_state()
            store.settle()
            assert all(torch.equal(again[n], ours[n]) for n in ours)
    finally:
        backend.finish()


RESTART = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.exl3.test_gpu import oracle_generate, prompt
    from elpis.exl3 import load_backend
    small, disk, turn = Path({small!r}), {disk!r}, {turn}
    b = load_backend(small / "target", small / "draft", max_context=65536, model_id="small",
                     host_cache_gib=1.0, disk_cache_dir=disk, prefix_cache=disk is not None)
    vocab = b.info.vocab_size
    first = prompt(9000, 11, vocab)
    if turn == 1:
        answer, _, _ = oracle_generate(b, first, 24, drafter=b.drafter)
        print(json.dumps({{"answer": answer}}))
    else:
        answer = json.loads({answer!r})
        second = first + answer + prompt(500, 12, vocab)
        out, cached, _ = oracle_generate(b, second, 24, drafter=b.drafter)
        print(json.dumps({{"tokens": out, "cached": cached}}))
""")


def _run_turn(small: Path, disk: str | None, turn: int, answer: list[int] | None = None) -> dict:
    script = RESTART.format(repo=str(REPO), small=str(small), disk=disk, turn=turn, answer=json.dumps(answer))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_restart_reuses_disk_prefix(small, tmp_path):
    disk = str(tmp_path / "prefix")
    answer = _run_turn(small, disk, 1)["answer"]
    warm = _run_turn(small, disk, 2, answer)  # a fresh process: only the disk tier can serve the prefix
    cold = _run_turn(small, None, 2, answer)
    assert warm["cached"] >= 8192, warm["cached"]
    assert cold["cached"] == 0
    assert warm["tokens"] == cold["tokens"]


@pytest.mark.parametrize(
    ("tree", "device_rounds"), [(False, False), (True, False), (True, True)],
    ids=["chain-8", "tree-16", "tree-16-device-rounds"],
)  # fmt: skip
def test_24gib_budget_full_model(tree: bool, device_rounds: bool):
    """The full configuration under a 24 GiB cap: 262,000-token prefill + 128 decoded tokens, in chain mode
    (8-row verifies) and in tree mode (every verify a 16-row tree through the tree kernels, replayed from
    captured CUDA graphs, which the memory then includes); and in tree mode with greedy rounds on the GPU
    (`exl3-device-rounds` with `exl3-embed-gather`: the served generator, its rounds' graphs, state blocks and
    record slots; since session 37), with whatever run choice the registry's switch gives (exl3-run-choice:
    both row counts' graphs captured; the JSON line names the rounds at each and the graphs' load-time
    times), then a second request continuing the first from the prefix cache, sampled with top_p and
    asking for logprobs (session 59: its rounds on the GPU too, the random model's flat rows drawn by the
    vocab draw's nucleus, and the logprobs' record buffers made). Needs the full synthetic checkpoints
    (ELPIS_FULL_TARGET / ELPIS_FULL_DRAFT); `elpis bench engine` records the same run."""
    target, draft = os.environ.get("ELPIS_FULL_TARGET"), os.environ.get("ELPIS_FULL_DRAFT")
    if not (target and draft):
        pytest.skip("set ELPIS_FULL_TARGET and ELPIS_FULL_DRAFT to the elpis synth --full/--draft outputs")
    budget = 16 if tree else 8
    # host rounds decide with the test oracle; rounds on the GPU exist only under the served generator, run
    # here as served (trees of the draft's top-k)
    generate = (
        f"spec_generate(b, BenchDecoder({target!r}), ids, 128, drafter=b.drafter, budget={budget}, "
        "draft_top_k=DEFAULT_DRAFT_TOP_K)"
        if device_rounds
        else f"oracle_generate(b, ids, 128, drafter=b.drafter, budget={budget})"
    )
    script = textwrap.dedent(f"""
        import json, os, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        if {device_rounds!r}:
            os.environ.update(ELPIS_PATCH_DEVICE_ROUNDS="1", ELPIS_PATCH_EMBED_GATHER="1",
                              ELPIS_PATCH_VOCAB_DRAW_NUCLEUS="1")
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(24 * 2**30 / total)
        from tests.exl3.test_gpu import oracle_generate, prompt, spec_generate
        from elpis.bench.worker import BenchDecoder
        from elpis.exl3 import load_backend
        from elpis.spec.generate import DEFAULT_DRAFT_TOP_K
        b = load_backend({target!r}, {draft!r}, tree={tree!r}, device_rounds={device_rounds!r} or None)
        ids = prompt(262000, 1, b.info.vocab_size)
        loaded = torch.cuda.max_memory_allocated()
        out, _, rounds = {generate}
        sampled_rounds = sampled_on_gpu = 0
        if {device_rounds!r}:  # a sampled logprobs request after it, from the prefix cache
            from elpis.spec import SamplingParams
            before = b.device_rounds.rounds
            # what the context has left (16 tokens past 262,128: call 229 asked for 64 and got 17)
            want = min(64, b.info.max_context - len(ids) - len(out))
            assert want >= 8, want
            more, cached, per_round = spec_generate(
                b, BenchDecoder({target!r}), [*ids, *out], want, drafter=b.drafter, budget={budget},
                draft_top_k=DEFAULT_DRAFT_TOP_K, sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=5),
                top_logprobs=5)
            assert len(more) == want and cached > 0, (len(more), want, cached)
            sampled_rounds, sampled_on_gpu = len(per_round), b.device_rounds.rounds - before
        choice = b.run_choice
        timed = b.warmup.round_seconds if b.warmup else {{}}
        print(json.dumps({{"tokens": len(out), "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                          "peak_after_load_gib": loaded / 2**30, "rounds": len(rounds), "tree": {tree!r},
                          "graph_replays": b.graphs.replays if b.graphs else None,
                          "device_rounds": b.device_rounds.rounds if b.device_rounds else None,
                          "sampled_rounds": sampled_rounds, "sampled_rounds_on_gpu": sampled_on_gpu,
                          "runs_chosen": choice.chosen if choice else None,
                          "round_seconds": {{f"{{r}}/{{k}}": t for (r, k), t in timed.items()}}}}))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps({"test": "24gib", **result}))
    assert result["tokens"] == 128 and result["peak_gib"] < 24.0
    if device_rounds:  # every round of both requests went through the GPU's rounds, not a host fallback
        assert result["sampled_rounds_on_gpu"] == result["sampled_rounds"] >= 1
        assert result["device_rounds"] == result["rounds"] + result["sampled_rounds"]
