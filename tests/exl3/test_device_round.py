"""GPU tests of greedy rounds on the GPU (`load_backend(device_rounds=True)`, `elpis.exl3.device_round`) on
the synthetic checkpoint of ELPIS_SMALL_DIR, with round graphs on (exl3-round-graph: rounds of a key after its
first are one composed graph launch; the tests that put a Python hook in place of a piece run in pieces).
Staged in session 34; passing on the GPU since session 39 (calls 149-161).

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
    the text is unchanged: injected == detected, each such round counted as recovered (session 35, staged);
(e)-(h) (session 38, staged): a round queued just below a context-bucket edge; the draft block and the
    draft's conditioning from device inputs (16 padded rows across a page boundary) against their host forms;
    graphs captured at load leave a request of rounds on the GPU nothing to capture;
(i)-(k) (session 50, staged): rounds that change their verify's row count (8 or 16) every round, on the GPU
    and (sampled) on the host, and the run choice over the graphs' load-time times, give plain decoding's
    tokens;
(l) (session 51, staged): a request with penalties and logit_bias keeps host rounds where exl3-round-adjust is
    off (the test turns it off), and with the known
    continuation drafted (several tokens a round, each row counting its own path) it commits plain
    decoding's tokens under the same adjustments, greedy and sampled;
(m) (session 53, staged): a greedy request whose grammar opens after a token the model writes runs its rounds
    on the GPU until that token, then host rounds under the grammar: plain decoding's tokens;
(n) (session 56, staged): sampled top_k requests with their rounds on the GPU (each row drawn there by
    `elpis.exl3.sample_draw`'s kernel from the request's parameters in device memory) give plain sampled
    decoding's tokens, with the draft's trees and with the known continuation's deep trees; two requests of
    other parameters and the same top_k run the same composed graphs;
(o) (session 56, staged): requests with penalties and logit_bias, greedy and sampled, with their rows adjusted
    on the GPU (`elpis.exl3.round_adjust`, each row counting its own path) give plain decoding's tokens under
    the same adjustments, with the draft's trees and with the known continuation's deep trees.
(q) (session 58, staged): a request under a thinking budget: rounds on the GPU capped at the budget, the
    closing tokens committed by a forced host round, rounds on the GPU again after them; plain decoding's
    tokens, greedy and sampled.
(r) (session 58, staged): requests with logprobs with their rounds on the GPU (exl3-round-logprobs): plain
    decoding's tokens and log-probabilities, greedy and sampled, with the draft's trees and the known
    continuation's deep ones; every round on the GPU.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import plain, tree_generate
from tests.spec.alternate_runs import Alternate

pytestmark = pytest.mark.gpu

TOKENS = 40
SWITCHES = {"ELPIS_PATCH_EMBED_GATHER": "1", "ELPIS_PATCH_DEVICE_ROUNDS": "1", "ELPIS_PATCH_ROUND_GRAPH": "1"}


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


def speculative(backend, decoder):  # noqa: F811
    """The product path's generator: the backend's DFlash2 draft, trees of up to 16 rows."""
    from elpis.spec import SpeculativeGenerator

    return SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16, draft_top_k=4)


def with_known_continuation(rounds, truth: list[int], start: int, run):
    """`run()`'s result, the draft's candidates replaced by the known continuation (`KnownContinuation`)."""
    rounds._candidates = KnownContinuation(rounds, truth, start)
    try:
        return run()
    finally:
        del rounds._candidates


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
    targets = rounds._targets
    calls = {"n": 0}

    def flag_every_third(out, positions):
        ids, bad = targets(out, positions)
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            bad[0] = 1
        return ids, bad

    rounds._targets = flag_every_third
    try:
        got, stats = generate(backend, decoder, ids)
    finally:
        del rounds._targets
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


def test_a_round_queued_just_below_a_bucket_edge_commits_plain_decodings_tokens(backend, decoder):  # noqa: F811
    """(e) Session 38's fix: a round whose verify reaches the next context bucket (kvp 4081-4087 for the 4096
    edge) while its draft block does not hands the draft only the pages its narrower table holds."""
    ids = prompt(4085, 56, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    got, stats = generate(backend, decoder, ids)
    assert got == truth
    assert stats.rounds >= 1


def test_the_draft_block_from_the_state_block_is_the_host_block(backend):
    """(f) `DraftGraphs.block_from` (anchor and kvp read from device memory, as rounds on the GPU give them)
    gives the bits of `block` with the same values from the host, on both sides of the 4096 bucket edge."""
    import torch

    with torch.inference_mode():  # the keys' buffers are inference tensors: rounds made them so
        _check_block_from(backend)


def _check_block_from(backend) -> None:
    import torch

    from elpis.exl3.draft_graph import block_pages

    graphs = backend.drafter.graphs
    for length in (700, 4090):
        ids = prompt(length, length + 1, backend.info.vocab_size)
        backend.begin(ids)
        try:
            anchor, kvp = ids[-1], backend.position()
            backend.ensure_pages(kvp + 1 + backend.block_size)
            pages = block_pages(backend.pages, kvp, backend.block_size)
            width = graphs.width(kvp)
            chain, logits = (t.clone() for t in graphs.block(anchor, pages, kvp, width))
            dev = torch.device(backend.engine.device)
            anchor_d = torch.tensor([anchor], dtype=torch.long, device=dev)
            kvp_d = torch.tensor([kvp], dtype=torch.long, device=dev)
            chain_d, logits_d = (t.clone() for t in graphs.block_from(anchor_d, kvp_d, pages, width))
            assert torch.equal(chain_d, chain), f"ctx {length}: the chain differs"
            assert torch.equal(logits_d, logits), f"ctx {length}: the logits differ"
        finally:
            backend.finish()


def test_conditioning_from_the_device_on_sixteen_padded_rows_is_the_host_conditioning(backend):
    """(g) `DraftGraphs.condition_from` as rounds on the GPU call it (the committed path padded to 16 rows
    with its last row, kvp and the verify's block table in device memory) writes the committed rows' draft
    K/V as the host's `condition` on the path alone, writes nothing before kvp, and here its 16 rows cross a
    page boundary (kvp 1529: rows 1529..1544 over the page edge at 1536)."""
    import torch

    from elpis.exl3.prefix import PAGE
    from tests.exl3.test_draft_graph import _verified_tree, cache_rows, restore

    graphs = backend.drafter.graphs
    with torch.inference_mode():  # the caches hold inference tensors, as in the backend's commit
        try:
            ids = prompt(1530, 57, backend.info.vocab_size)
            kvp, export, table, tensors = _verified_tree(backend, ids, 89)
            assert kvp % PAGE + 16 > PAGE, "the padded rows do not cross a page boundary"
            pages = list(backend.pages)
            before = [t.clone() for t in tensors]
            dev = export[0].device

            def at(saved: list, positions: range) -> list:
                return cache_rows(saved, pages, positions)

            for path in ([0, 1, 2], [0, 4, 5], [0]):
                restore(tensors, before)
                graphs.condition(export, path, table, kvp)
                host = [t.clone() for t in tensors]
                restore(tensors, before)
                index = torch.tensor(path + [path[-1]] * (16 - len(path)), dtype=torch.long, device=dev)
                kvp_d = torch.tensor([kvp], dtype=torch.int32, device=dev)
                graphs.condition_from(export, index, kvp_d, table.to(dev))
                device = [t.clone() for t in tensors]
                kept = range(kvp, kvp + len(path))
                for a, b in zip(at(host, kept), at(device, kept), strict=True):
                    assert torch.equal(a, b), f"path {path}: a committed row's draft K/V differ"
                earlier = range(max(0, kvp - 300), kvp)
                for a, b in zip(at(before, earlier), at(device, earlier), strict=True):
                    assert torch.equal(a, b), f"path {path}: the conditioning wrote before kvp"
        finally:
            backend.finish()


def test_graphs_captured_at_load_leave_rounds_on_the_gpu_nothing_to_capture(backend, decoder):  # noqa: F811
    """(h) `capture_graphs(device_rounds=True)` (what `load_backend` runs with graphs captured at load) also
    captures each verify key's conditioning from device inputs: a request of rounds on the GPU afterwards
    captures no graph at all, and its text is still plain decoding's."""
    from elpis.exl3.graph_warmup import capture_graphs

    report = capture_graphs(backend, device_rounds=True)
    blocks = backend.drafter.graphs
    counts = lambda: (backend.graphs.captures, blocks.captures, blocks.condition_captures)  # noqa: E731
    before = counts()
    ids = prompt(1500, 58, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    got, _ = generate(backend, decoder, ids)
    assert got == truth
    assert counts() == before, f"captured during the request: {before} -> {counts()} (warm-up {report})"


@pytest.fixture
def both_runs(backend):
    """The module's backend with both row counts' graphs captured and timed (`capture_graphs` over
    `tree_runs()`, as load_backend(run_choice=True) does), its rounds' choice reset after the test."""
    from elpis.exl3.graph_warmup import capture_graphs

    backend.runs = (8, 16)
    try:
        backend.warmup = capture_graphs(backend, device_rounds=True)
        yield backend
    finally:
        backend.run_choice = None
        backend.runs, backend.warmup = None, None


def test_rounds_that_switch_row_counts_every_round_give_plain_decodings_tokens(both_runs, decoder):  # noqa: F811
    """(i) Rounds at 16 and 8 rows in turn (each switch rewrites the state block's tree budget in stream
    order; an 8-row verify takes only its own positions' pages), with the known continuation's deep trees
    and with the draft's own: plain decoding's tokens."""
    backend = both_runs
    rounds = backend.device_rounds
    for seed, known in ((53, True), (54, False)):
        ids = prompt(1500, seed, backend.info.vocab_size)
        truth = truth_of(backend, ids)
        backend.run_choice = choice = Alternate()
        if known:
            rounds._candidates = KnownContinuation(rounds, truth, len(ids) - 1)
        try:
            got, stats = generate(backend, decoder, ids)
        finally:
            rounds.__dict__.pop("_candidates", None)
        assert got == truth, f"rounds switching row counts differ from plain decoding (known={known})"
        assert set(choice.queued) == {8, 16}
        assert all(rows <= run for run, rows, _ in choice.seen)
        if known:
            assert max(stats.committed_per_round) >= 4, stats.committed_per_round


def test_the_run_choice_over_the_timed_graphs_gives_plain_decodings_tokens(both_runs, decoder):  # noqa: F811
    """(j) The served choice (`RunChoice` over `round_cost`, the graphs' times at load): every bucket has
    both row counts timed, the text is plain decoding's, and where sixteen rows committed no more than eight
    (the random draft's trees) and cost more, eight ran in most rounds once measured."""
    from elpis.spec.run_choice import RunChoice

    backend = both_runs
    seconds = backend.warmup.round_seconds
    assert {run for run, _ in seconds} == {8, 16} and all(t > 0 for t in seconds.values())
    for bucket in backend.warmup.buckets:
        assert seconds[(16, bucket)] >= 0.9 * seconds[(8, bucket)], seconds
    backend.run_choice = choice = RunChoice(backend.tree_runs(), backend.round_cost, min_rounds=4)
    ids = prompt(1500, 55, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    got, _ = generate(backend, decoder, ids)
    assert got == truth
    assert choice.chosen[16] >= 4, choice.chosen  # the first rounds measure
    estimate = choice.estimate(16)
    if estimate[16] == estimate[8] and backend.round_cost(16, len(ids)) > backend.round_cost(8, len(ids)):
        assert choice.chosen.get(8, 0) > choice.chosen[16], (choice.chosen, estimate)


def test_sampled_host_rounds_at_the_chosen_row_count_give_plain_decodings_tokens(both_runs, decoder):  # noqa: F811
    """(k) Host rounds (a sampled request) with the backend's run choice taking 16 and 8 rows in turn: each
    verify runs at the smallest captured row count that holds its tree, an 8-row verify after a 16-row one
    takes only its own positions' pages, and the tokens are plain sampled decoding's (randomness keyed by
    position)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    backend = both_runs
    ids = prompt(1500, 56, backend.info.vocab_size)
    sampling = SamplingParams(temperature=0.9, seed=7)
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True)

    def tokens(gen) -> list[int]:
        return [t for step in gen.generate(request) for t in step.token_ids]

    truth = tokens(SpeculativeGenerator(backend, decoder))
    choice = Alternate()
    backend.run_choice = choice
    try:
        got = tokens(SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16,
                                          draft_top_k=4))  # fmt: skip
    finally:
        backend.run_choice = None
    assert got == truth, "sampled host rounds at changing row counts differ from plain sampled decoding"
    assert set(choice.queued) == {8, 16} and all(rows <= run for run, rows, _ in choice.seen)


class KnownHostDrafter:
    """Host drafter proposing the known continuation (one candidate a level) after the prompt."""

    def __init__(self, prompt_length: int, truth: list[int]) -> None:
        self.prompt_length, self.truth = prompt_length, truth

    def reset(self) -> None:
        pass

    def propose(self, context, depth: int, top_k: int):
        from elpis.backend import DraftBlock

        done = len(context) - self.prompt_length
        return DraftBlock([[(t, 0.0)] for t in self.truth[done : done + depth]])


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_penalised_requests_keep_host_rounds_and_plain_decodings_tokens(backend, decoder, temperature):  # noqa: F811
    """(l) Three tokens biased by +100 beside frequency, presence and repetition penalties: a row's target
    depends on the counts along its own path (checked: the penalties change the tokens)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    ids = prompt(1200, 57, backend.info.vocab_size)
    favoured = tuple((t, 100.0) for t in (101, 202, 303))

    def request(**adjust) -> GenerationRequest:
        sampling = SamplingParams(temperature=temperature, top_k=20 if temperature else 0, seed=9,
                                  logit_bias=favoured, **adjust)  # fmt: skip
        return GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True)

    def tokens(gen, req) -> tuple[list[int], object]:
        steps = list(gen.generate(req))
        return [t for step in steps for t in step.token_ids], steps[-1].stats

    penalised = request(frequency_penalty=2.0, presence_penalty=1.5, repetition_penalty=1.2)
    truth, _ = tokens(SpeculativeGenerator(backend, decoder), penalised)
    biased, _ = tokens(SpeculativeGenerator(backend, decoder), request())
    assert truth != biased, f"the penalties changed nothing: {truth}"
    rounds = backend.device_rounds
    before = rounds.rounds  # rounds read back from the GPU, every request's
    adjusting = rounds.adjusting
    rounds.adjusting = False  # host rounds, as with exl3-round-adjust off ((o) runs them on the GPU)
    try:
        known = KnownHostDrafter(len(ids), truth)
        got, stats = tokens(SpeculativeGenerator(backend, decoder, drafter=known, tree_budget=16), penalised)
    finally:
        rounds.adjusting = adjusting
    assert got == truth, "a penalised request with accepted drafts differs from plain penalised decoding"
    assert max(stats.committed_per_round) >= 4 and stats.rounds < TOKENS // 2, stats.committed_per_round
    assert rounds.rounds == before, "a penalised request ran a round on the GPU with adjusting rounds off"


def small_vocabulary(tokenizer_json: str, vocab_size: int):
    """The grammar's view of the small model's rows: its Qwen tokenizer cut to the first `vocab_size` ids
    (those BPE tokens and the merges among them; llguidance refuses a tokenizer larger than the model), the
    end of sequence the last row (the model's own stop ids lie past its rows)."""
    from elpis.spec.grammar import GrammarTokenizer

    data = json.loads(tokenizer_json)
    bpe = data["model"]
    kept = {token: i for token, i in bpe["vocab"].items() if i < vocab_size}
    assert len(kept) == vocab_size, "the small model's ids are not the tokenizer's first BPE tokens"

    def inside(merge) -> bool:
        parts = merge.split(" ") if isinstance(merge, str) else merge
        return "".join(parts) in kept and all(part in kept for part in parts)

    bpe["vocab"], bpe["merges"] = kept, [m for m in bpe["merges"] if inside(m)]
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < vocab_size]
    return GrammarTokenizer(json.dumps(data), vocab_size, (vocab_size - 1,))


def test_a_grammars_request_runs_on_the_gpu_until_its_grammar_opens(backend, decoder, monkeypatch):  # noqa: F811
    """(m) (session 53, staged) A greedy request whose grammar opens after a token the model writes freely
    (as a tool call's grammar opens at `<tool_call>`): its rounds run on the GPU, ending at that token as at a
    stop (the round queued ahead idles), then host rounds mask their rows. Plain decoding's tokens under the
    grammar (host rounds of the anchor alone), with the free part's rounds on the GPU."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
    from elpis.spec.grammar import Grammar

    ids = prompt(1300, 58, backend.info.vocab_size)
    free = truth_of(backend, ids)
    at = next(i for i in range(6, TOKENS) if free[i] not in free[:i])  # its first time, after a few rounds
    # The small model's own stop ids (Qwen's) lie past its rows, and a grammar refuses ignore_eos: its last
    # row stands in as the end of sequence, the grammar's too.
    monkeypatch.setattr(backend, "info", replace(backend.info, stop_token_ids=(backend.info.vocab_size - 1,)))
    vocabulary = small_vocabulary(decoder.inner.backend.to_str(), backend.info.vocab_size)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    grammar = Grammar.json_schema(vocabulary, schema, opens_after=(free[at],))
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS + 20, sampling=SamplingParams(),
                                grammar=grammar)  # fmt: skip

    def tokens(gen) -> tuple[list[int], object]:
        steps = list(gen.generate(request))
        return [t for step in steps for t in step.token_ids], steps[-1].stats

    truth, _ = tokens(SpeculativeGenerator(backend, decoder))
    assert truth[: at + 1] == free[: at + 1] and len(truth) > at + 2
    assert decoder.decode(truth[at + 1 :]).lstrip().startswith("{"), "the grammar did not hold"
    rounds = backend.device_rounds
    before = rounds.rounds
    got, stats = tokens(SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=16))
    assert got == truth, "a grammar's request with GPU rounds until it opens differs from plain decoding"
    on_gpu = rounds.rounds - before
    assert 1 <= on_gpu < stats.rounds, (on_gpu, stats.rounds)  # the free part on the GPU, the rest the host's
    assert sum(stats.committed_per_round[:on_gpu]) == at + 1  # the GPU's rounds ended at the opening token


def test_sampled_requests_draw_their_rounds_on_the_gpu(backend, decoder):  # noqa: F811
    """(n) Plain sampled decoding (host rounds of the anchor alone, the host's draw) against the product path
    with sampled rounds on the GPU: the draft's own trees (composed graphs; the second request, of other
    parameters and the same top_k, composes nothing), then the known continuation's deep trees (rows past
    the anchor accepted, so each row's position, its position id plus one, is the host's)."""
    from elpis.exl3 import sample_draw
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    rounds = backend.device_rounds
    sample_draw.load()
    was = rounds.sampled
    rounds.sampled = True
    cases = ((SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=7), 61),
             (SamplingParams(temperature=1.0, top_k=20, top_p=0.95, min_p=0.05, seed=8), 62))  # fmt: skip

    try:
        composed = None
        for sampling, seed in cases:
            assert rounds.draws(sampling)
            ids = prompt(1500, seed, backend.info.vocab_size)
            request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling,
                                        ignore_eos=True)  # fmt: skip

            def tokens(gen, request=request) -> tuple[list[int], object]:
                steps = list(gen.generate(request))
                return [t for step in steps for t in step.token_ids], steps[-1].stats

            truth, _ = tokens(SpeculativeGenerator(backend, decoder))
            assert truth != truth_of(backend, ids), "the sampled request drew the argmax throughout"
            before = rounds.rounds
            got, stats = tokens(speculative(backend, decoder))
            assert got == truth, f"sampled rounds on the GPU differ from plain sampled decoding ({sampling})"
            assert rounds.rounds - before == stats.rounds and not stats.faults_detected
            if composed is None:
                composed = rounds.round_graphs.composed
            else:
                assert rounds.round_graphs.composed == composed, "the second request composed new rounds"

            def deep(tokens=tokens) -> tuple[list[int], object]:
                return tokens(speculative(backend, decoder))

            got, stats = with_known_continuation(rounds, truth, len(ids) - 1, deep)
            assert got == truth, "the known continuation's sampled rounds differ from plain sampled decoding"
            assert max(stats.committed_per_round) >= 4, stats.committed_per_round
    finally:
        rounds.sampled = was


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_penalised_requests_adjust_their_rows_on_the_gpu(backend, decoder, temperature):  # noqa: F811
    """(o) The request of (l) (three tokens biased by +100 beside every penalty) with adjusting rounds on:
    every round on the GPU, each row adjusted there counting its own path, plain penalised decoding's tokens
    with the draft's own trees (composed) and with the known continuation's deep trees."""
    from elpis.exl3 import round_adjust, sample_draw
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    ids = prompt(1200, 57, backend.info.vocab_size)
    favoured = tuple((t, 100.0) for t in (101, 202, 303))
    sampling = SamplingParams(temperature=temperature, top_k=20 if temperature else 0, seed=9,
                              logit_bias=favoured, frequency_penalty=2.0, presence_penalty=1.5,
                              repetition_penalty=1.2)  # fmt: skip
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True)

    def tokens(gen) -> tuple[list[int], object]:
        steps = list(gen.generate(request))
        return [t for step in steps for t in step.token_ids], steps[-1].stats

    truth, _ = tokens(SpeculativeGenerator(backend, decoder))  # host rounds of the anchor alone
    rounds = backend.device_rounds
    round_adjust.load()
    sample_draw.load()
    was = rounds.adjusting, rounds.sampled
    rounds.adjusting = rounds.sampled = True
    try:
        assert rounds.draws(sampling)
        before = rounds.rounds
        got, stats = tokens(speculative(backend, decoder))
        assert got == truth, "penalised rounds on the GPU differ from plain penalised decoding"
        assert rounds.rounds - before == stats.rounds and not stats.faults_detected
        got, stats = with_known_continuation(rounds, truth, len(ids) - 1,
                                             lambda: tokens(speculative(backend, decoder)))  # fmt: skip
        assert got == truth, "the known continuation's penalised rounds differ from plain penalised decoding"
        assert max(stats.committed_per_round) >= 4, stats.committed_per_round
    finally:
        rounds.adjusting, rounds.sampled = was


@pytest.mark.parametrize("case", ["temperature", "top_p", "min_p", "penalised"])
def test_sampled_requests_without_top_k_draw_their_rounds_on_the_gpu(backend, decoder, case):  # noqa: F811
    """(p) Plain sampled decoding without top_k (host rounds of the anchor alone, the host's whole-vocabulary
    draw, no device draw installed) against the product path with whole-vocabulary rounds on the GPU
    (exl3-vocab-draw): every token kept (the pick; a penalised request's float64 rows too), and top_p and
    min_p (the head, and the nucleus, exl3-vocab-draw-nucleus, for the random model's flat rows, whose cut
    runs past the 256 weights the head reads), every round on the GPU, with the draft's own trees and with the
    known continuation's deep trees."""
    from elpis.exl3 import round_adjust, vocab_draw
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
    from elpis.spec import sampling as sampler

    favoured = tuple((t, 100.0) for t in (101, 202, 303))
    sampling = {
        "temperature": SamplingParams(temperature=0.8, seed=71),
        "top_p": SamplingParams(temperature=0.6, top_p=0.9, seed=72),
        "min_p": SamplingParams(temperature=1.0, min_p=0.02, seed=74),
        "penalised": SamplingParams(temperature=0.9, seed=73, logit_bias=favoured, presence_penalty=1.5),
    }[case]
    ids = prompt(1300, 70 + len(case), backend.info.vocab_size)
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True)

    def tokens(gen) -> tuple[list[int], object]:
        steps = list(gen.generate(request))
        return [t for step in steps for t in step.token_ids], steps[-1].stats

    installed = sampler._vocab_draw
    sampler.use_vocab_draw(None)  # the truth from the host's own draw
    try:
        truth, _ = tokens(SpeculativeGenerator(backend, decoder))
    finally:
        sampler.use_vocab_draw(installed)
    assert truth != truth_of(backend, ids), "the sampled request drew the argmax throughout"
    rounds = backend.device_rounds
    vocab_draw.load()
    round_adjust.load()
    was = rounds.whole_vocab, rounds.vocab_heads, rounds.vocab_nucleus, rounds.adjusting
    rounds.whole_vocab = rounds.vocab_heads = rounds.vocab_nucleus = rounds.adjusting = True
    try:
        assert rounds.draws(sampling)
        before = rounds.rounds
        got, stats = tokens(speculative(backend, decoder))
        assert got == truth, f"rounds without top_k on the GPU differ from plain sampled decoding ({case})"
        undrawn = stats.faults_detected.get("undrawn", 0)
        print(f"(p) {case}: {stats.rounds} rounds, {rounds.rounds - before} on the GPU, {undrawn} undrawn")
        assert rounds.rounds - before == stats.rounds and not stats.faults_detected
        got, stats = with_known_continuation(rounds, truth, len(ids) - 1,
                                             lambda: tokens(speculative(backend, decoder)))  # fmt: skip
        assert got == truth, "the known continuation's rounds without top_k differ from plain decoding"
        assert max(stats.committed_per_round) >= 4, stats.committed_per_round
    finally:
        rounds.whole_vocab, rounds.vocab_heads, rounds.vocab_nucleus, rounds.adjusting = was


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_thinking_budget_caps_the_gpus_rounds_and_closes_the_reasoning(backend, decoder, temperature):  # noqa: F811
    """(q) Plain decoding under a thinking budget against the product path: the GPU's rounds start capped at
    what the budget has left, end there, the host commits the closing tokens in a forced round, and the
    GPU's rounds start again after them; the tokens are plain decoding's, the closing tokens where the
    budget puts them."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
    from elpis.spec.thinking import ThinkingBudget

    rounds = backend.device_rounds
    sampling = SamplingParams(temperature=temperature, seed=9)
    assert rounds.draws(sampling)
    ids = prompt(1500, 63, backend.info.vocab_size)
    free = truth_of(backend, ids)
    close = tuple(t for t in range(1000, 2000) if t not in free)[:2]
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True,
                                thinking=ThinkingBudget(13, close))  # fmt: skip

    def tokens(gen) -> tuple[list[int], object]:
        steps = list(gen.generate(request))
        return [t for step in steps for t in step.token_ids], steps[-1].stats

    truth, _ = tokens(SpeculativeGenerator(backend, decoder))
    assert tuple(truth[13:15]) == close
    before = rounds.rounds
    got, stats = tokens(speculative(backend, decoder))
    assert got == truth, "rounds under a thinking budget differ from plain decoding"
    on_gpu = rounds.rounds - before
    assert 2 <= on_gpu < stats.rounds and not stats.faults_detected  # the forced round was the host's


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_requests_run_their_rounds_on_the_gpu(backend, decoder, temperature):  # noqa: F811
    """(r) Plain decoding with logprobs (host rounds of the anchor alone, the host's log-probabilities from
    each row) against the product path with logprobs rounds on the GPU (each round's logits kept on the
    GPU, the committed rows' log-probabilities read from them): the same tokens and the same values, bit for
    bit, with the draft's trees and with the known continuation's deep trees (rows past the anchor report
    theirs)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    rounds = backend.device_rounds
    was = rounds.reports_logprobs, rounds.sampled
    rounds.reports_logprobs = rounds.sampled = True
    sampling = SamplingParams(temperature=temperature, top_k=20 if temperature else 0, seed=12)
    ids = prompt(1500, 64, backend.info.vocab_size)
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=sampling, ignore_eos=True,
                                top_logprobs=5)  # fmt: skip

    def outcome(gen) -> tuple[list[int], list, object]:
        steps = list(gen.generate(request))
        return ([t for step in steps for t in step.token_ids], [lp for step in steps for lp in step.logprobs],
                steps[-1].stats)  # fmt: skip

    try:
        truth, truth_logprobs, _ = outcome(SpeculativeGenerator(backend, decoder))
        assert len(truth_logprobs) == TOKENS and all(len(lp[2]) == 5 for lp in truth_logprobs)
        before = rounds.rounds
        got, logprobs, stats = outcome(speculative(backend, decoder))
        assert got == truth, "logprobs rounds on the GPU differ from plain decoding"
        assert logprobs == truth_logprobs, "the GPU rounds' log-probabilities differ from the host's"
        assert rounds.rounds - before == stats.rounds and not stats.faults_detected

        def deep():
            return outcome(speculative(backend, decoder))

        got, logprobs, stats = with_known_continuation(rounds, truth, len(ids) - 1, deep)
        assert (got, logprobs) == (truth, truth_logprobs), "deep trees' logprobs differ from plain decoding's"
        assert max(stats.committed_per_round) >= 4, stats.committed_per_round
    finally:
        rounds.reports_logprobs, rounds.sampled = was
