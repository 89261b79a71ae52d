"""The driver of rounds on the GPU (`elpis.exl3.device_round.DeviceRounds`: `start`, `round`, `_queue`,
`_read`, `drain`) run end to end on the CPU: its kernels (the draft candidates, the plan, the verify epilogue,
the tail) are their own CUDA sources built for the CPU (tests/kernels/cuda_emu.py), and what only a GPU runs
(the captured verify, commit and draft graphs, CUDA events and streams) is played by stand-ins with the same
inputs and outputs. The stand-in model's greedy next token of a token t is f(t); its verify puts each row's
maximum on f(row's token), and its draft proposes f's chain with some tokens wrong. So every round's committed
tokens are known: plain decoding's.

What this checks that no other CPU test does: the driver's own bookkeeping (rounds queued ahead across
context-bucket edges, the pages each graph's table takes, the host's position, discarded rounds, record faults
across two requests). It found that a draft block queued just below a bucket edge was handed the verify's
pages, more than the draft's narrower table holds (session 38). The GPU twin is
tests/exl3/test_device_round.py."""

from __future__ import annotations

import ctypes
import random
import types
from pathlib import Path

import pytest
import torch

from elpis.backend import UNDRAWN
from elpis.exl3 import device_round as dr
from elpis.exl3 import (
    draft_candidates,
    drafter,
    gdn_tree,
    round_adjust,
    round_plan,
    round_tail,
    sample_draw,
    tensors,
    verify_epilogue,
    vocab_draw,
)
from elpis.exl3.draft_graph import block_pages
from elpis.exl3.tree_graph import Captured, bucket_pages, context_bucket, packed_sizes
from elpis.exl3.tree_verify import PAGE, GraphInputs
from elpis.exl3.upload import padded_table
from elpis.spec import sampling
from elpis.spec.penalties import History
from elpis.spec.sampling import SamplingParams, greedy_tokens, sample_rows
from tests.kernels import cuda_emu, test_vocab_draw_emu
from tests.spec.alternate_runs import Alternate

VOCAB, RUN, BLOCK, CACHE = 1000, 16, 8, 270_336


def f(t: int) -> int:
    """The stand-in model's greedy next token."""
    return (t * 31 + 7) % VOCAB


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    out = tmp_path_factory.mktemp("device_round_driver")
    plan = cuda_emu.build_emulated(round_plan.SOURCE, out / "plan", launches=3, needs=("gdn_plan.h",))
    tail = cuda_emu.build_emulated(round_tail.SOURCE, out / "tail", launches=1, needs=("gdn_plan.h",))
    # blocks of 32 threads (the outputs do not depend on the block: test_verify_epilogue_emu.py and
    # test_draft_candidates_emu.py), 8x fewer emulated threads a round than the served 256
    f, spans = tmp_path_factory, cuda_emu.build_span_kernels
    epilogue = spans(f, verify_epilogue, "ELPIS_VERIFY_EPILOGUE", launches=3, threads=32)
    candidates = spans(f, draft_candidates, "ELPIS_DRAFT_CANDIDATES", launches=4, threads=32)
    draw = sample_draw.bind(cuda_emu.build_emulated(sample_draw.SOURCE, out / "draw", launches=1))
    adjust = round_adjust.bind(cuda_emu.build_emulated(round_adjust.SOURCE, out / "adjust", launches=1))
    return round_plan.bind(plan), round_tail.bind(tail), epilogue, candidates, draw, adjust


@pytest.fixture(scope="module")
def vocab_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    # blocks of 32 threads and spans of 256 values: four spans a row of the stand-in's 1,000 (the tokens do
    # not depend on either: tests/kernels/test_vocab_draw_emu.py)
    return test_vocab_draw_emu.build(tmp_path_factory, 32, 256, 64)


@pytest.fixture
def cpu_rounds(kernels: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulated kernels in place of the GPU builds; events and streams are no-ops on one CPU queue."""
    plan_lib, tail_lib, epilogue_lib, candidates_lib, draw_lib, adjust_lib = kernels
    monkeypatch.setattr(sample_draw, "_library", lambda: draw_lib)
    monkeypatch.setattr(round_adjust, "_library", lambda: adjust_lib)
    monkeypatch.setattr(draft_candidates, "_library", lambda: candidates_lib)
    monkeypatch.setattr(round_plan, "_library", lambda: plan_lib)
    monkeypatch.setattr(round_tail, "_library", lambda: tail_lib)
    monkeypatch.setattr(verify_epilogue, "_library", lambda: epilogue_lib)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: types.SimpleNamespace(cuda_stream=None))
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")  # the bindings' checks run in full

    class Event:
        def record(self) -> None: ...
        def synchronize(self) -> None: ...

    monkeypatch.setattr(torch.cuda, "Event", Event)


class StandInVerify:
    """A captured verify's replay: logits whose row maximum is f(row's token), and the draft's export; with
    `sampled`, each row's logits are `sampled_logits` of its token (`ties`: TIED's flat row too)."""

    def __init__(self, c: Captured, sampled: bool = False, ties: bool = False) -> None:
        self.c, self.sampled, self.ties = c, sampled, ties

    def replay(self) -> None:
        c = self.c
        logits = torch.randn(1, c.out.shape[1], VOCAB + 8, dtype=torch.float16) * 0.1
        for r, t in enumerate(c.ids.tolist()):
            if self.sampled:
                logits[0, r, :VOCAB] = sampled_logits(t, self.ties)
            else:
                logits[0, r, f(t)] = 10.0
        c.out.copy_(logits)


TIED = 17  # the token after which the sampled stand-in's logits may tie far past a top_k head's edge


def sampled_logits(t: int, ties: bool = False) -> torch.Tensor:
    """The sampled stand-in model's fp16 logits after token t: noise fixed by t, f(t) the most likely; with
    `ties`, after TIED f(t) and a flat rest, whose head edge the draw leaves to the host (a round whose
    committed path reads such a row is then undrawn; round_tail ignores one off the path)."""
    if ties and t == TIED:
        row = torch.zeros(VOCAB)
    else:
        row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(t)) * 1.5
    row[f(t)] = 4.0
    return row.half()


def plain_sampled(prompt: list[int], n: int, params: SamplingParams, ties: bool = False) -> list[int]:
    """The sampled stand-in's plain decoding: each token drawn by the host for its absolute position."""
    out, t = [], prompt[-1]
    for i in range(n):
        t = sample_rows(sampled_logits(t, ties).unsqueeze(0), params, [len(prompt) + i])[0]
        out.append(t)
    return out


class StandInGraphs:
    """The tree verify's captured graphs, one per context bucket, with the real input buffers' layout."""

    table, gate = True, None

    def __init__(self, sampled: bool = False, ties: bool = False) -> None:
        self.keys: dict[tuple[int, int], Captured] = {}
        self.replays = 0
        self.commits = 0
        self.sampled, self.ties = sampled, ties

    def table_width(self, kvp: int, run: int) -> int:
        return bucket_pages(kvp + run, CACHE)

    def captured(self, state: object, kvp: int, run: int) -> Captured:
        bucket = context_bucket(kvp + run, CACHE)
        key = (bucket, run)
        if key not in self.keys:
            width = -(-bucket // PAGE)
            sizes = packed_sizes(width, run, gdn_tree.PLAN_CAPACITY)
            ints = torch.zeros((sum(p for _, p in sizes),), dtype=torch.int32)
            parts = torch.split(ints, [p for _, p in sizes])
            cut = (t[:n] for t, (n, _) in zip(parts, sizes, strict=True))
            table, seqlens, pos, ctx, masks, plan, ids = cut
            inputs = GraphInputs(ctx=ctx, masks=masks, plan=plan.view(torch.uint8), max_ctx=bucket)
            c = Captured(x=None, ids=ids, block_table=table.view(1, width), seqlens=seqlens,
                         position_ids=pos.view(1, run), inputs=inputs, ints=ints)  # fmt: skip
            c.out = torch.zeros(1, run, VOCAB + 8, dtype=torch.float16)  # ExLlamaV3's head writes fp16
            c.export = [torch.zeros(1, run, 4)]
            c.graph = StandInVerify(c, self.sampled, self.ties)
            self.keys[key] = c
        return self.keys[key]

    def put_table(self, c: Captured, pages: list[int]) -> None:
        """TreeGraphs.put_table's: the padded table and the sequence's page count (the tail reads it)."""
        width = c.block_table.shape[1]
        c.block_table.copy_(torch.tensor([padded_table(pages, width, "verify")]))
        if c.page_count is None:
            c.page_count = torch.zeros((1,), dtype=torch.int32)
        c.page_count.fill_(min(len(pages), width))

    def commit_inputs(self, c: Captured) -> tuple[torch.Tensor, torch.Tensor]:
        if c.moves is None:
            c.moves = torch.zeros((4, c.ids.shape[0] - 1), dtype=torch.long)
            c.commit_plan = torch.zeros((gdn_tree.PLAN_CAPACITY,), dtype=torch.uint8)
        return c.moves, c.commit_plan

    def run_commit(self, c: Captured) -> None:
        if c.commit_graph is None:
            c.commit_graph = StandInCommit(self)
        c.commit_graph.replay()


class StandInDraft:
    """The DFlash2 draft's captured blocks, one key per table width with its own buffers: f's chain from the
    anchor, each token wrong with probability `wrong`; its table is as narrow as the draft's own context
    bucket, as the real one's. Conditionings are keyed by (rows, width) and counted."""

    table = True

    def __init__(self, wrong: float) -> None:
        self.wrong = wrong
        self.conditioned = 0
        self.graphs: dict[int, types.SimpleNamespace] = {}
        self.conditions: dict[tuple[int, int], types.SimpleNamespace] = {}
        self.replays = self.condition_replays = 0

    def width(self, kvp: int) -> int:
        return bucket_pages(kvp + 1 + BLOCK, CACHE)

    def block_from(self, anchor: torch.Tensor, kvp: torch.Tensor, pages: list[int], width: int) -> tuple:
        c = self.graphs.get(width)
        if c is None:
            c = types.SimpleNamespace(
                block_table=torch.zeros((1, width), dtype=torch.int32),
                anchor=torch.zeros(1, dtype=torch.long), seqlens=torch.zeros(1, dtype=torch.int32),
                chain=torch.zeros(BLOCK - 1, dtype=torch.long),
                logits=torch.zeros(BLOCK - 1, VOCAB, dtype=torch.float16),  # ExLlamaV3's head writes fp16
            )  # fmt: skip
            c.graph = StandInBlock(self, c)
            self.graphs[width] = c
        self.put_table(c, pages)
        self.inputs_from(c, anchor, kvp)
        c.graph.replay()
        return c.chain, c.logits

    def captured_block(self, width: int) -> types.SimpleNamespace | None:
        return self.graphs.get(width)

    def put_table(self, c: types.SimpleNamespace, pages: list[int]) -> None:
        width = c.block_table.shape[1]  # what DraftGraphs.put_table does: refuses pages past the table
        c.block_table.copy_(torch.tensor([padded_table(pages, width, "draft graphs")]))

    @staticmethod
    def inputs_from(c: types.SimpleNamespace, anchor: torch.Tensor, kvp: torch.Tensor) -> None:
        c.anchor.copy_(anchor)
        c.seqlens.copy_(kvp)

    def condition_from(
        self, export: list, index: torch.Tensor, kvp: torch.Tensor, table: torch.Tensor
    ) -> None:
        key = (index.shape[0], table.shape[1])
        if key not in self.conditions:
            self.conditions[key] = types.SimpleNamespace(graph=StandInCondition(self))
        self.condition_inputs_from(self.conditions[key], index, kvp, table)
        self.conditions[key].graph.replay()

    def captured_condition_from(self, export: list, rows: int, width: int) -> types.SimpleNamespace | None:
        return self.conditions.get((rows, width))

    @staticmethod
    def condition_inputs_from(c: types.SimpleNamespace, index: torch.Tensor, kvp: torch.Tensor,
                              table: torch.Tensor) -> None:  # fmt: skip
        c.index, c.kvp, c.table = index.clone(), kvp.clone(), table.clone()


class StandInBlock:
    """A draft block key's replay: the chain and logits from the anchor in the key's buffer."""

    def __init__(self, draft: StandInDraft, c: types.SimpleNamespace) -> None:
        self.draft, self.c = draft, c

    def replay(self) -> None:
        chain, t = [], int(self.c.anchor.item())
        for _ in range(BLOCK - 1):
            t = f(t) if random.random() >= self.draft.wrong else random.randrange(VOCAB)
            chain.append(t)
        logits = torch.randn(BLOCK - 1, VOCAB)
        for d, t in enumerate(chain):
            logits[d, t] = 8.0
        self.c.chain.copy_(torch.tensor(chain, dtype=torch.long))
        self.c.logits.copy_(logits.half())


class StandInCondition:
    def __init__(self, draft: StandInDraft) -> None:
        self.draft = draft

    def replay(self) -> None:
        self.draft.conditioned += 1


class StandInCommit:
    def __init__(self, graphs: StandInGraphs) -> None:
        self.graphs = graphs

    def replay(self) -> None:
        self.graphs.commits += 1


class StandInComposer:
    """`round_graph.Composer` on one CPU queue: a captured piece is its function, run again at each launch;
    a composed graph runs its pieces (functions and stand-in graphs) in order."""

    def __init__(self) -> None:
        self.captured = 0

    def capture(self, fn: object) -> object:
        self.captured += 1
        return fn

    def compose(self, pieces: list) -> types.SimpleNamespace:
        def launch() -> None:
            for p in pieces:
                p() if callable(p) else p.replay()

        return types.SimpleNamespace(launch=launch)


class StandInBackend:
    """What the driver reads of Exl3Backend: the active sequence, its pages, the graphs, the draft and the run
    choice."""

    tree = True
    run_choice = None

    def __init__(self, prompt: list[int], wrong: float, sampled: bool = False, ties: bool = False) -> None:
        self.graphs = StandInGraphs(sampled, ties)
        self.drafter = types.SimpleNamespace(graphs=StandInDraft(wrong))
        self.info = types.SimpleNamespace(vocab_size=VOCAB, max_context=65_536)
        self.engine = types.SimpleNamespace(device="cpu")
        self.block_size = BLOCK
        self.tokens, self.anchor = list(prompt[:-1]), prompt[-1]
        self.pages: list[int] = []
        self.active, self.pending = True, None
        self.state = types.SimpleNamespace(position=len(self.tokens), slot=0, base_row=lambda: 0)

    def tree_run(self) -> int:
        return RUN

    def position(self) -> int:
        return len(self.tokens)

    def ensure_pages(self, tokens: int) -> None:
        while len(self.pages) * PAGE < tokens:
            self.pages.append(3 + 2 * len(self.pages))


def driver(backend: StandInBackend) -> dr.DeviceRounds:
    """The driver over the stand-in backend, its buffers on the CPU (its load-time kernel checks are
    tests/kernels/test_round_check.py's)."""
    rounds = dr.DeviceRounds.__new__(dr.DeviceRounds)
    rounds.backend, rounds.drafts = backend, backend.drafter.graphs
    rounds.block_candidates = draft_candidates.candidates  # the candidates kernels, emulated
    rounds._buffers("cpu", RUN, pin_memory=False)
    return rounds


def plain(prompt: list[int], n: int) -> list[int]:
    out, t = [], prompt[-1]
    for _ in range(n):
        t = f(t)
        out.append(t)
    return out


def generate(
    rounds: dr.DeviceRounds, tokens: int, *, stops: tuple[int, ...] = (), budget: int = RUN, top_k: int = 4,
    anchor: int | None = None, sampling: SamplingParams | None = None,
) -> tuple[list[int], list[str]]:
    """Tokens and faults (discarded rounds and records read again) of one request through `round`, which
    must say that it ended exactly when the tokens or a stop token end it. It starts from the backend's
    tokens and its anchor, or `anchor` (the last token committed before)."""
    b = rounds.backend
    context = [*b.tokens, b.anchor if anchor is None else anchor]
    rounds.start(context=context, remaining=tokens, tree_budget=budget, stops=list(stops), top_k=top_k,
                 sampling=sampling)  # fmt: skip
    got: list[int] = []
    faults: list[str] = []
    ended = False
    for _ in range(4 * tokens + 8):
        d = rounds.round()
        faults.extend([d.fault] if d.fault else d.recovered)
        got.extend(d.tokens)
        if d.ends:
            ended = True
            break
    rounds.drain()
    assert ended, "the request never ended"
    return got, faults


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("wrong", [0.0, 0.3, 0.8])
@pytest.mark.parametrize("prompt_len", [100, 4066, 4082, 8172])
def test_rounds_commit_plain_decodings_tokens_across_bucket_edges(prompt_len: int, wrong: float) -> None:
    """Rounds queued ahead inside a bucket and waiting at its edge (4096, 8192), including starts just below
    an edge where the verify's pages reach past the draft's table (4082): plain decoding's tokens, and the
    backend's sequence and position follow them."""
    random.seed(prompt_len + int(10 * wrong))
    torch.manual_seed(prompt_len)
    prompt = [random.randrange(VOCAB) for _ in range(prompt_len)]
    backend = StandInBackend(prompt, wrong)
    rounds = driver(backend)
    got, faults = generate(rounds, 60)
    assert got == plain(prompt, 60) and not faults
    assert backend.tokens == prompt + got[:-1] and backend.position() == prompt_len + 59
    assert rounds.queued_ahead > 0 and backend.graphs.commits == backend.drafter.graphs.conditioned


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("tokens", [1, 2, 7, 9, 17])
def test_the_request_ends_at_exactly_its_token_budget(tokens: int) -> None:
    """Rounds commit up to 8 tokens and are queued ahead: the last one still stops at max_tokens."""
    random.seed(tokens)
    prompt = [random.randrange(VOCAB) for _ in range(500)]
    got, _ = generate(driver(StandInBackend(prompt, 0.0)), tokens)
    assert got == plain(prompt, tokens)


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("at", [0, 3, 12])
def test_a_stop_token_ends_the_request_with_it(at: int) -> None:
    """The stop token is committed and ends the request, whatever row of a round it falls in."""
    random.seed(100 + at)
    prompt = [random.randrange(VOCAB) for _ in range(700)]
    truth = plain(prompt, 40)
    stop = truth[at]
    first = truth.index(stop)  # the first time plain decoding makes it
    got, _ = generate(driver(StandInBackend(prompt, 0.2)), 40, stops=(stop, VOCAB + 5))
    assert got == truth[: first + 1]


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("at", [0, 5, 19])
def test_rounds_ended_at_a_stop_start_again_from_the_committed_context(at: int) -> None:
    """A grammar's request ends its rounds here at the opening token it awaits, as at a stop, and starts them
    again later (`elpis.spec.generate`): the round queued ahead of the one that ended idles, and the rounds
    started from the committed context go on with plain decoding's tokens."""
    random.seed(300 + at)
    prompt = [random.randrange(VOCAB) for _ in range(600)]
    truth = plain(prompt, 60)
    pause = truth[at]
    first = truth.index(pause)
    backend = StandInBackend(prompt, 0.2)
    rounds = driver(backend)
    before, _ = generate(rounds, 60, stops=(pause,))
    assert before == truth[: first + 1]
    assert backend.tokens == prompt + before[:-1] and backend.anchor is None
    with pytest.raises(dr.BackendError, match="start from the backend's"):
        rounds.start(context=[*backend.tokens], remaining=5, tree_budget=RUN, stops=[], top_k=4)
    after, faults = generate(rounds, 60 - len(before), anchor=before[-1])
    assert before + after == truth and not faults
    assert backend.tokens == prompt + truth[:-1]


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize(("budget", "top_k"), [(1, 1), (4, 2), (8, 16), (16, 1)])
def test_other_tree_budgets_and_draft_widths_commit_plain_decodings_tokens(budget: int, top_k: int) -> None:
    random.seed(budget * 100 + top_k)
    prompt = [random.randrange(VOCAB) for _ in range(900)]
    got, _ = generate(driver(StandInBackend(prompt, 0.3)), 30, budget=budget, top_k=top_k)
    assert got == plain(prompt, 30)


@pytest.mark.usefixtures("cpu_rounds")
def test_flagged_rounds_are_discarded_and_verified_again(monkeypatch: pytest.MonkeyPatch) -> None:
    random.seed(5)
    prompt = [random.randrange(VOCAB) for _ in range(300)]
    rounds = driver(StandInBackend(prompt, 0.3))
    targets, calls = rounds._targets, [0]

    def every_third_flagged(out: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, bad = targets(out, positions)
        calls[0] += 1
        if calls[0] % 3 == 0:
            bad[0] = 1
        return ids, bad

    monkeypatch.setattr(rounds, "_targets", every_third_flagged)
    got, faults = generate(rounds, 60)
    assert got == plain(prompt, 60)
    assert faults and set(faults) == {"corrupt"}


@pytest.mark.usefixtures("cpu_rounds")
def test_record_faults_of_a_second_request_are_read_again() -> None:
    random.seed(9)
    first = [random.randrange(VOCAB) for _ in range(200)]
    rounds = driver(StandInBackend(first, 0.5))
    assert generate(rounds, 30)[0] == plain(first, 30)
    second = [random.randrange(VOCAB) for _ in range(300)]
    backend = StandInBackend(second, 0.7)
    rounds.backend, rounds.drafts = backend, backend.drafter.graphs
    schedule = {1: "dropped", 2: "repeated", 3: "stale", 5: "dropped", 6: "repeated"}
    rounds.record_faults = dr.RecordFaults(schedule)
    got, faults = generate(rounds, 40)
    assert got == plain(second, 40)
    assert sorted(faults) == ["dropped", "dropped", "repeated", "repeated", "stale"]
    assert dict(rounds.record_faults.injected) == {"dropped": 2, "repeated": 2, "stale": 1}


def test_the_fix_is_what_the_host_draft_block_does() -> None:
    """The draft block's pages are those of its positions from the highest start, taken by the one function
    DFlash2Drafter.block takes them with: the verify's pages at 4082 reach one page past what the draft's
    table holds, the block's pages do not."""
    kvp = 4082
    verify_pages = -(-(kvp + RUN) // PAGE)
    draft_pages = -(-(kvp + 1 + BLOCK) // PAGE)
    assert verify_pages > bucket_pages(kvp + 1 + BLOCK, CACHE) >= draft_pages
    pages = list(range(verify_pages))
    assert block_pages(pages, kvp, BLOCK) == pages[:draft_pages]
    assert "block_pages(b.pages, kvp, b.block_size)" in Path(dr.__file__).read_text()
    assert "block_pages(backend.pages, kvp, block)" in Path(drafter.__file__).read_text()


@pytest.mark.usefixtures("cpu_rounds")
def test_a_request_after_the_backends_row_count_changed_takes_the_new_count() -> None:
    """The driver is made at the backend's row count; a later request on a backend whose verifies take 8 rows
    (tests and tools change it between requests) sizes the verify's targets and the conditioning's rows to
    8, not the 16 it was made with (GPU call 156 found the epilogue refusing [16] targets for [8] rows)."""
    random.seed(21)
    prompt = [random.randrange(VOCAB) for _ in range(400)]
    backend = StandInBackend(prompt, 0.3)
    rounds = driver(backend)
    assert rounds.ids.shape == (RUN,)
    backend.tree_run = lambda: 8  # type: ignore[method-assign]
    got, _ = generate(rounds, 30, budget=8)
    assert got == plain(prompt, 30)
    assert rounds.ids.shape == rounds.bad.shape == rounds.cond_index.shape == (8,)


@pytest.mark.usefixtures("cpu_rounds")
def test_composed_rounds_of_another_row_count_live_beside_the_firsts() -> None:
    """Each row count's buffers are made once and kept, so a request at another count composes its rounds
    beside the first count's, which stay valid: back at the first count (the same captured keys), its rounds
    launch the graphs composed before and compose nothing."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(22)
    prompt = [random.randrange(VOCAB) for _ in range(400)]
    first = StandInBackend(prompt, 0.3)
    rounds = driver(first)
    rounds.round_graphs = RoundGraphs(StandInComposer())
    assert generate(rounds, 30)[0] == plain(prompt, 30)
    composed = rounds.round_graphs.composed
    assert composed
    second = [random.randrange(VOCAB) for _ in range(300)]
    backend = StandInBackend(second, 0.3)
    backend.tree_run = lambda: 8  # type: ignore[method-assign]
    rounds.backend, rounds.drafts = backend, backend.drafter.graphs
    got, _ = generate(rounds, 30, budget=8)
    assert got == plain(second, 30)
    assert rounds.ids.shape == rounds.bad.shape == rounds.cond_index.shape == (8,)
    assert rounds.round_graphs.composed > composed
    composed, launches = rounds.round_graphs.composed, rounds.round_graphs.launches
    third = [random.randrange(VOCAB) for _ in range(400)]
    backend = StandInBackend(third, 0.3)
    backend.graphs, backend.drafter = first.graphs, first.drafter  # the first count's captured keys
    rounds.backend, rounds.drafts = backend, first.drafter.graphs
    assert generate(rounds, 30)[0] == plain(third, 30)
    assert rounds.round_graphs.composed == composed
    assert rounds.round_graphs.launches > launches


def recorded(rounds: dr.DeviceRounds, tokens: int) -> tuple[list[int], list[list[int]]]:
    """`generate`'s tokens, and each round's records as read back (the request's epoch left out)."""
    records: list[list[int]] = []
    read = rounds._read

    def recording(q: dr._Queued) -> dr.DeviceRoundResult:
        result = read(q)
        assert rounds.last_words is not None
        words = list(rounds.last_words)
        words[dr.EPOCH_WORD] = 0
        records.append(words)
        return result

    rounds._read = recording  # type: ignore[method-assign]
    try:
        got, faults = generate(rounds, tokens)
    finally:
        del rounds._read
    assert not faults
    return got, records


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("prompt_len", [300, 4082, 8150])
def test_composed_rounds_are_the_pieces_rounds(prompt_len: int) -> None:
    """Rounds of composed graphs (`round_graph.RoundGraphs`, here over stand-in pieces) queue the pieces of
    each key's first rounds in the same order with the same inputs: every round's records are those of the
    rounds queued piece by piece, across page and bucket edges (4096, 8192), where the keys change; a key's
    rounds after its first two (one a record slot) are launches; an LRU of two keeps at most two composed
    graphs, and those it evicts are dropped once no round in flight may have launched them."""
    from elpis.exl3.round_graph import RoundGraphs

    def serve(graphs: RoundGraphs | None) -> tuple[list[int], list[list[int]], dr.DeviceRounds]:
        random.seed(prompt_len)
        torch.manual_seed(prompt_len)
        prompt = [random.randrange(VOCAB) for _ in range(prompt_len)]
        rounds = driver(StandInBackend(prompt, 0.3))
        rounds.round_graphs = graphs
        got, records = recorded(rounds, 70)
        assert got == plain(prompt, 70)
        return got, records, rounds

    _, pieces, _ = serve(None)
    graphs = RoundGraphs(StandInComposer(), limit=2)
    _, composed, rounds = serve(graphs)
    assert composed == pieces
    assert graphs.launches >= len(composed) // 2 and graphs.composed >= 2
    assert len(graphs.graphs) <= 2 and not graphs.retired  # generate drained the rounds
    backend = rounds.backend
    conditions = list(backend.drafter.graphs.conditions.values())
    for g in graphs.graphs.values():  # each holds the three captured keys its pieces address
        assert g.condition is not None and any(g.condition is c for c in conditions)
        assert g.draft is not None and g.verify is not None
    # every round queued (the last ones past the request's end too) committed and conditioned once
    assert backend.graphs.commits == backend.drafter.graphs.conditioned == rounds.numbered


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("prompt_len", [490, 1010])
def test_a_page_edge_inside_a_bucket_composes_nothing_new(prompt_len: int) -> None:
    """The round tail reads the sequence's page count from device memory (`put_table` uploads it with the
    table), so a request whose pages grow inside one context bucket (512, 1024: edges below MIN_BUCKET) keeps
    its two composed graphs (one a record slot) and gives the pieces' records; a second request on the same
    keys, of another length and so another page count, composes nothing and launches every round."""
    from elpis.exl3.round_graph import RoundGraphs

    def serve(rounds: dr.DeviceRounds, length: int, keys: StandInBackend | None = None) -> list[list[int]]:
        random.seed(length)
        torch.manual_seed(length)
        prompt = [random.randrange(VOCAB) for _ in range(length)]
        backend = StandInBackend(prompt, 0.3)
        if keys is not None:  # the captured keys of an earlier request's backend
            backend.graphs, backend.drafter = keys.graphs, keys.drafter
        rounds.backend, rounds.drafts = backend, backend.drafter.graphs
        got, records = recorded(rounds, 70)
        assert got == plain(prompt, 70)
        assert len(backend.pages) > -(-length // PAGE)  # the request crossed a page edge
        return records

    pieces = driver(StandInBackend([1], 0.3))
    pieces.round_graphs = None
    rounds = driver(StandInBackend([1], 0.3))
    graphs = rounds.round_graphs = RoundGraphs(StandInComposer(), limit=8)
    assert serve(rounds, prompt_len) == serve(pieces, prompt_len)
    assert graphs.composed == 2
    first, launches = rounds.backend, graphs.launches
    serve(rounds, prompt_len + 240, keys=first)
    # numbered counts this request's rounds
    assert graphs.composed == 2 and graphs.launches - launches == rounds.numbered > 0


@pytest.mark.usefixtures("cpu_rounds")
def test_a_stand_in_for_a_piece_keeps_rounds_piece_by_piece() -> None:
    """A Python function in place of the candidates or the targets runs each round: no graph is composed."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(3)
    prompt = [random.randrange(VOCAB) for _ in range(500)]
    rounds = driver(StandInBackend(prompt, 0.3))
    rounds.round_graphs = RoundGraphs(StandInComposer())
    targets, calls = rounds._targets, [0]

    def counted(out: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls[0] += 1
        return targets(out, positions)

    rounds._targets = counted  # type: ignore[method-assign]
    got, _ = generate(rounds, 30)
    assert got == plain(prompt, 30)
    assert calls[0] == rounds.numbered and rounds.round_graphs.composed == 0  # each round queued ran it


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("composed", [False, True])
@pytest.mark.parametrize("prompt_len", [300, 4082])
def test_rounds_that_change_their_row_count_every_round_commit_plain_decodings_tokens(
    prompt_len: int, composed: bool
) -> None:
    """Rounds at 16 and 8 rows in turn, queued ahead of each other and across a bucket edge, piece by piece or
    composed: plain decoding's tokens, every round's tree within its run (the state block's budget was
    rewritten in stream order before it), and the choice told of every round that was not cut short."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(prompt_len)
    prompt = [random.randrange(VOCAB) for _ in range(prompt_len)]
    backend = StandInBackend(prompt, 0.3)
    rounds = driver(backend)
    if composed:
        rounds.round_graphs = RoundGraphs(StandInComposer())
    backend.run_choice = choice = Alternate()  # type: ignore[assignment]
    got, faults = generate(rounds, 120)
    assert got == plain(prompt, 120) and not faults
    assert set(choice.queued) == {8, 16} and rounds.queued_ahead > 0
    assert all(rows <= run and 1 <= len(path) <= rows for run, rows, path in choice.seen)
    assert any(rows > 8 for run, rows, _ in choice.seen if run == 16)
    assert len(choice.seen) >= rounds.rounds - 1  # all but the last (it ends the request)
    assert {run for (_, run) in backend.graphs.keys} == {8, 16}


@pytest.mark.usefixtures("cpu_rounds")
def test_the_run_choice_takes_eight_rows_where_sixteen_cost_more_than_they_commit() -> None:
    """The served choice (`RunChoice`) over the driver. The stand-in draft's siblings are never right, so
    sixteen rows commit what eight do (the counterfactual sees it): at equal cost (below 4K) either may run,
    past 4K, where sixteen cost 3x, eight run, with a round of sixteen every fourth to keep measuring. Plain
    decoding's tokens throughout."""
    from elpis.spec.run_choice import RunChoice

    random.seed(31)
    prompt = [random.randrange(VOCAB) for _ in range(3000)]
    backend = StandInBackend(prompt, 0.2)
    rounds = driver(backend)
    choice = RunChoice((8, 16), lambda run, kvp: 1.0 if run == 8 or kvp < 4096 else 3.0,
                       min_rounds=4, explore_every=4)  # fmt: skip
    backend.run_choice = choice  # type: ignore[assignment]
    queued: list[tuple[int, int]] = []  # (the host's position when queued, run)
    chose = choice.chose
    choice.chose = lambda run, budget: (queued.append((rounds.settled, run)), chose(run, budget))[1]  # type: ignore[method-assign]
    got, faults = generate(rounds, 1600)
    assert got == plain(prompt, 1600) and not faults
    estimate = choice.estimate(RUN)
    assert estimate[16] >= estimate[8] > 1.0
    past = [run for at, run in queued if at >= 4096 + RUN]
    assert len(past) > 100 and past.count(16) == pytest.approx(len(past) / 4, abs=2)
    assert [run for at, run in queued[:4]] == [16] * 4  # the first rounds measure


# -- sampled requests: each row's target drawn on the device -------------------------------------------------
SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, seed=7)


def sampled_driver(prompt: list[int], wrong: float = 0.3, ties: bool = False) -> dr.DeviceRounds:
    rounds = driver(StandInBackend(prompt, wrong, sampled=True, ties=ties))
    rounds.sampled = True
    return rounds


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("composed", [False, True], ids=["pieces", "composed"])
@pytest.mark.parametrize("prompt_len", [100, 4082])
def test_sampled_rounds_commit_plain_decodings_draws(prompt_len: int, composed: bool) -> None:
    """Each row's target is the host's draw for its position (its position id plus one), through the weights
    under the inverse temperature in device memory and the draw kernel: the committed tokens are plain
    sampled decoding's, across a bucket edge (4096), queued ahead, piece by piece or composed; a second
    request of the same top_k, other parameters, reuses the composed graphs (the parameters are read from
    memory), one of another top_k composes its own."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(prompt_len)
    torch.manual_seed(prompt_len)
    prompt = [random.randrange(VOCAB) for _ in range(prompt_len)]
    rounds = sampled_driver(prompt)
    rounds.round_graphs = RoundGraphs(StandInComposer()) if composed else None
    want = plain_sampled(prompt, 40, SAMPLED)
    got, faults = generate(rounds, 40, sampling=SAMPLED)
    assert got == want and not faults
    assert want != plain(prompt, 40)  # the draws are not the argmax
    assert rounds.queued_ahead > 0
    if not composed:
        return
    count = rounds.round_graphs.composed
    for params in (SamplingParams(temperature=1.3, top_k=20, top_p=0.7, seed=8),
                   SamplingParams(temperature=0.6, top_k=5, min_p=0.1, seed=9)):  # fmt: skip
        again = list(prompt)
        backend = StandInBackend(again, 0.3, sampled=True)
        backend.graphs, backend.drafter = rounds.backend.graphs, rounds.backend.drafter  # the same keys
        rounds.backend, rounds.drafts = backend, backend.drafter.graphs
        got, _ = generate(rounds, 30, sampling=params)
        assert got == plain_sampled(again, 30, params)
        if params.top_k == SAMPLED.top_k:
            assert rounds.round_graphs.composed == count
    assert rounds.round_graphs.composed > count


@pytest.mark.usefixtures("cpu_rounds")
def test_a_row_the_draw_leaves_to_the_host_is_undrawn_and_nothing_moves() -> None:
    """A row whose top_k edge ties past the logits read (after TIED) is not drawn on the device: its round and
    the one in flight after it (the same position) commit nothing, `settle` reads that one without queuing
    more, and the host stays where the undrawn round was, for its own round to decide."""
    random.seed(31)
    prompt = [random.randrange(VOCAB) for _ in range(200)]
    prompt[-1] = TIED
    rounds = sampled_driver(prompt, ties=True)
    b = rounds.backend
    rounds.start(context=[*b.tokens, b.anchor], remaining=20, tree_budget=RUN, stops=[], top_k=4,
                 sampling=SAMPLED)  # fmt: skip
    before = b.position()
    done = rounds.round()
    assert done.fault == UNDRAWN and done.tokens == ()
    assert len(rounds.queued) == 1  # the round queued ahead of it
    assert rounds.settle() is None
    assert not rounds.queued and b.position() == rounds.settled == before and b.anchor == TIED
    # the same tail status in a greedy request is a corrupt row (its argmax was not finite): verified again
    refused = round_tail.RoundTail(round_tail.STATUS_NON_FINITE, 0, False, -1, before, (), (), 0, 0)
    result = dr.DeviceRoundResult(types.SimpleNamespace(rows=RUN), refused)
    assert rounds._outcome(result).fault == UNDRAWN
    rounds.sampling = None
    assert rounds._outcome(result).fault == "corrupt"


@pytest.mark.usefixtures("cpu_rounds")
def test_a_request_the_device_does_not_draw_is_refused_at_start() -> None:
    random.seed(32)
    prompt = [random.randrange(VOCAB) for _ in range(200)]
    rounds = sampled_driver(prompt)
    b = rounds.backend
    for params in (SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, top_k=300),
                   SamplingParams(temperature=0.8, top_k=20, presence_penalty=1.0)):  # fmt: skip
        assert not rounds.draws(params)
        with pytest.raises(ValueError, match="do not draw"):
            rounds.start(context=[*b.tokens, b.anchor], remaining=5, tree_budget=RUN, stops=[], top_k=4,
                         sampling=params)  # fmt: skip
    rounds.sampled = False
    assert not rounds.draws(SAMPLED)


# -- requests with penalties and logit_bias: each row adjusted on the device --------------------------------
FAVOURED = ((3, 6.0), (4, 6.0), (5, 6.0))  # the stand-in then repeats these, which the penalties see


def plain_adjusted(prompt: list[int], n: int, params: SamplingParams) -> list[int]:
    """The sampled stand-in's plain decoding under `params`' adjustments (History, one row at a time)."""
    history = History(params, prompt, VOCAB)
    out, t = [], prompt[-1]
    for i in range(n):
        row = history.adjusted(sampled_logits(t).float().unsqueeze(0), [()])
        t = greedy_tokens(row)[0] if params.greedy else sample_rows(row, params, [len(prompt) + i])[0]
        history.commit([t])
        out.append(t)
    return out


ADJUSTED = [
    SamplingParams(frequency_penalty=2.0, presence_penalty=1.5, logit_bias=FAVOURED),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, presence_penalty=1.5, logit_bias=FAVOURED),
    SamplingParams(temperature=1.0, top_k=8, seed=8, repetition_penalty=1.4, frequency_penalty=0.7,
                   logit_bias=FAVOURED),
]


@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("composed", [False, True], ids=["pieces", "composed"])
@pytest.mark.parametrize("params", ADJUSTED, ids=["greedy", "sampled-presence", "sampled-repetition"])
def test_adjusted_rounds_commit_plain_decodings_tokens(params: SamplingParams, composed: bool) -> None:
    """Each row adjusted by the history in device memory and its own path (read from the cells), the tokens
    each round commits counted into the history in stream order, the rounds queued ahead: plain decoding's
    tokens under the adjustments, which change them."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(41)
    torch.manual_seed(41)
    prompt = [random.randrange(6, VOCAB) for _ in range(300)]
    rounds = sampled_driver(prompt, wrong=0.2)
    rounds.adjusting = True
    rounds.round_graphs = RoundGraphs(StandInComposer()) if composed else None
    want = plain_adjusted(prompt, 40, params)
    unpenalised = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                 seed=params.seed, logit_bias=FAVOURED)  # fmt: skip
    assert want != plain_adjusted(prompt, 40, unpenalised), "the penalties changed nothing"
    got, faults = generate(rounds, 40, sampling=params)
    assert got == want and not faults
    assert rounds.queued_ahead > 0


@pytest.mark.usefixtures("cpu_rounds")
def test_adjusted_rounds_started_again_count_the_tokens_generated_before() -> None:
    """Rounds that ended at a stop (as a grammar's opening token ends them) start again with the tokens
    generated so far counted by the penalties (`generated`), not taken for the prompt's."""
    random.seed(43)
    torch.manual_seed(43)
    prompt = [random.randrange(6, VOCAB) for _ in range(300)]
    params = ADJUSTED[0]
    want = plain_adjusted(prompt, 40, params)
    pause = want[6]
    first = want.index(pause)
    rounds = sampled_driver(prompt, wrong=0.2)
    rounds.adjusting = True
    before, _ = generate(rounds, 40, stops=(pause,), sampling=params)
    assert before == want[: first + 1]
    b = rounds.backend
    context = [*b.tokens, before[-1]]
    rounds.start(context=context, remaining=40 - len(before), tree_budget=RUN, stops=[], top_k=4,
                 sampling=params, generated=len(before))  # fmt: skip
    after: list[int] = []
    while len(before) + len(after) < 40:
        done = rounds.round()
        assert done.fault is None
        after.extend(done.tokens)
    rounds.drain()
    assert before + after == want


# -- sampled requests without top_k: each row drawn over its whole vocabulary on the device ------------------
WHOLE_VOCAB = [
    SamplingParams(temperature=0.8, seed=7),  # every token kept: the pick
    SamplingParams(temperature=0.8, top_p=0.9, seed=7),  # the head
    SamplingParams(temperature=1.1, min_p=0.05, seed=8),
    SamplingParams(temperature=0.8, top_p=0.95, seed=9, presence_penalty=1.5, logit_bias=FAVOURED),  # float64
]


@pytest.fixture
def vocab_rounds(cpu_rounds: None, vocab_kernels: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-vocabulary draw's kernels emulated too, and the host's exp the emulation's (the CPU's)."""
    monkeypatch.setattr(vocab_draw, "_library", lambda: vocab_kernels)
    monkeypatch.setattr(sampling, "_row_exp", test_vocab_draw_emu._cpu_exp)


@pytest.fixture
def sharp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampled stand-in's rows four times as sharp: a real model's heads, whose top_p prefix and min_p
    cut lie well inside the 256 weights the head reads on every row of a tree, so the head decides them (the
    stand-in's own noise, 1.5 against a maximum of 4, runs top_p 0.9's prefix past them, for the nucleus:
    test_a_cut_past_the_weights_read_is_drawn_on_the_device)."""
    plain_rows = sampled_logits

    def sharper(t: int, ties: bool = False) -> torch.Tensor:
        return (plain_rows(t, ties).float() * 4).half()

    monkeypatch.setitem(globals(), "sampled_logits", sharper)


def whole_vocab_driver(prompt: list[int], wrong: float = 0.3, ties: bool = False,
                       nucleus: bool = True) -> dr.DeviceRounds:
    rounds = sampled_driver(prompt, wrong, ties)
    rounds.whole_vocab = rounds.vocab_heads = rounds.adjusting = True
    rounds.vocab_nucleus = nucleus
    return rounds


@pytest.mark.usefixtures("vocab_rounds", "sharp")
@pytest.mark.parametrize("composed", [False, True], ids=["pieces", "composed"])
@pytest.mark.parametrize("params", WHOLE_VOCAB, ids=["all", "top_p", "min_p", "top_p-presence"])
def test_sampled_rounds_without_top_k_commit_plain_decodings_draws(params: SamplingParams,
                                                                  composed: bool) -> None:
    """Each row's target is the host's whole-vocabulary draw for its position (the verify's fp16 rows read in
    place, or a penalised request's float64 rows): plain sampled decoding's tokens, queued ahead, piece by
    piece or composed."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(51)
    torch.manual_seed(51)
    prompt = [random.randrange(6, VOCAB) for _ in range(300)]
    rounds = whole_vocab_driver(prompt, wrong=0.2)
    assert rounds.draws(params)
    rounds.round_graphs = RoundGraphs(StandInComposer()) if composed else None
    want = (plain_adjusted if params.adjusts_logits else plain_sampled)(prompt, 30, params)
    assert want != plain(prompt, 30)  # the draws are not the argmax
    got, faults = generate(rounds, 30, sampling=params)
    assert got == want and not faults
    assert rounds.queued_ahead > 0


@pytest.mark.usefixtures("vocab_rounds", "sharp")
def test_composed_draws_without_top_k_are_keyed_by_their_launch() -> None:
    """A request of other parameters but the same launch (the head's, or the pick's) replays the composed
    graphs, its parameters read from memory; a request of the other launch composes its own."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(53)
    prompt = [random.randrange(VOCAB) for _ in range(200)]
    rounds = whole_vocab_driver(prompt)
    rounds.round_graphs = RoundGraphs(StandInComposer())
    composed = []
    for params in (SamplingParams(temperature=0.8, top_p=0.9, seed=1),
                   SamplingParams(temperature=1.2, seed=2),
                   SamplingParams(temperature=0.6, min_p=0.1, seed=3),
                   SamplingParams(temperature=0.5, seed=4)):  # fmt: skip
        backend = StandInBackend(list(prompt), 0.3, sampled=True)
        # the same keys
        backend.graphs, backend.drafter = rounds.backend.graphs, rounds.backend.drafter
        rounds.backend, rounds.drafts = backend, backend.drafter.graphs
        got, faults = generate(rounds, 20, sampling=params)
        assert got == plain_sampled(prompt, 20, params) and not faults
        composed.append(rounds.round_graphs.composed)
    assert composed[1] > composed[0]  # the pick's graphs are not the head's
    assert composed[3] == composed[2] == composed[1]  # min_p reads the head; another pick request replays


@pytest.mark.usefixtures("vocab_rounds")
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_p=0.9, seed=5),
                                    SamplingParams(temperature=0.8, min_p=1e-4, seed=6)],
                         ids=["top_p", "min_p"])
def test_a_cut_past_the_weights_read_is_drawn_on_the_device(params: SamplingParams) -> None:
    """The stand-in's own rows (noise 1.5 against a maximum of 4) and its flat row after TIED run top_p 0.9's
    prefix, and min_p 1e-4's cut, past the 256 weights the head reads: the nucleus decides those rows on the
    device, plain sampled decoding's tokens with no round undrawn."""
    random.seed(57)
    prompt = [random.randrange(VOCAB) for _ in range(200)]
    prompt[-1] = TIED
    rounds = whole_vocab_driver(prompt, ties=True)
    first = sampled_logits(TIED, ties=True).unsqueeze(0)
    assert test_vocab_draw_emu.declined(first, params)  # the head alone leaves the first row undecided
    got, faults = generate(rounds, 20, sampling=params)
    assert got == plain_sampled(prompt, 20, params, ties=True) and not faults


@pytest.mark.usefixtures("vocab_rounds")
def test_without_the_nucleus_a_prefix_past_the_weights_read_is_undrawn() -> None:
    """Without the nucleus (its switch off), the first row after TIED, flat but for one token, runs top_p
    0.9's prefix past the 256 weights the head reads: that round is undrawn, for the host to decide from the
    whole vocabulary."""
    random.seed(57)
    prompt = [random.randrange(VOCAB) for _ in range(200)]
    prompt[-1] = TIED
    rounds = whole_vocab_driver(prompt, ties=True, nucleus=False)
    b = rounds.backend
    rounds.start(context=[*b.tokens, b.anchor], remaining=20, tree_budget=RUN, stops=[], top_k=4,
                 sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=5))  # fmt: skip
    done = rounds.round()
    assert done.fault == UNDRAWN and done.tokens == ()
    assert rounds.settle() is None and b.anchor == TIED


@pytest.mark.usefixtures("vocab_rounds")
def test_requests_without_top_k_run_here_only_with_the_switch() -> None:
    rounds = whole_vocab_driver([1, 2, 3])
    params = SamplingParams(temperature=0.8, top_p=0.9)
    assert rounds.draws(params) and rounds.draws(SamplingParams(temperature=0.8, presence_penalty=1.0))
    rounds.adjusting = False
    assert not rounds.draws(SamplingParams(temperature=0.8, presence_penalty=1.0))
    rounds.vocab_heads = False  # top_p's rounds stay the host's; temperature alone's still run here
    assert not rounds.draws(params) and rounds.draws(SamplingParams(temperature=0.8))
    rounds.whole_vocab = False
    assert not rounds.draws(SamplingParams(temperature=0.8))
    assert rounds.draws(SamplingParams(temperature=0.8, top_k=5))


# -- logprobs requests ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("cpu_rounds")
@pytest.mark.parametrize("composed", [False, True], ids=["pieces", "composed"])
def test_logprobs_rounds_report_the_host_rounds_log_probabilities(composed: bool) -> None:
    """A logprobs request's rounds keep each verify's logits in their record slot (one copy in the round's
    graph) and report every committed token's log-probabilities from its row, widened to fp32 as a host
    round's verify hands it over: the host's values, rounds queued ahead, piece by piece or composed (the
    copy is part of the key: a greedy request's composed rounds are not a logprobs request's)."""
    from elpis.exl3.round_graph import RoundGraphs

    random.seed(41)
    torch.manual_seed(41)
    prompt = [random.randrange(VOCAB) for _ in range(300)]
    rounds = sampled_driver(prompt)  # the stand-in's rows are noisy: their log-probabilities differ
    rounds.round_graphs = RoundGraphs(StandInComposer()) if composed else None
    with pytest.raises(ValueError, match="report no logprobs"):
        rounds.start(context=prompt, remaining=8, tree_budget=RUN, stops=[], top_k=4, top_logprobs=2)
    rounds.reports_logprobs = True
    anchor = rounds.backend.anchor
    if composed:
        first, _ = generate(rounds, 20)  # a greedy request first: its composed rounds copy nothing
        anchor, before = first[-1], rounds.round_graphs.composed
    context = [*rounds.backend.tokens, anchor]
    rounds.start(context=context, remaining=40, tree_budget=RUN, stops=[], top_k=4, top_logprobs=3)
    tokens: list[int] = []
    reported: list = []
    while True:
        d = rounds.round()
        assert d.fault is None and d.logprobs is not None and len(d.logprobs) == len(d.tokens)
        tokens.extend(d.tokens)
        reported.extend(d.logprobs)
        if d.ends:
            break
    rounds.drain()
    previous = [context[-1], *tokens[:-1]]
    assert tokens == [greedy_tokens(sampled_logits(p).float().unsqueeze(0))[0] for p in previous]
    assert rounds.queued_ahead > 0
    pairs = zip(previous, tokens, strict=True)
    want = [sampling.top_logprobs(sampled_logits(p).float(), t, 3) for p, t in pairs]
    assert reported == want
    if composed:
        assert rounds.round_graphs.composed > before
