"""GPU tests of rounds on the GPU as one composed graph launch a round key (`elpis.exl3.round_graph`, switch
exl3-round-graph) on the synthetic checkpoint of ELPIS_SMALL_DIR. (a)-(d) pass on the GPU (call 160).

What they establish:
(a) composed rounds give bit for bit the records of the same rounds queued piece by piece (the tree each
    round verified, what it committed, where), and plain decoding's tokens; a second request launches only
    composed graphs;
(b) a request crossing a page edge and a context-bucket edge (4096: new verify, draft-block and conditioning
    keys) composes the new keys and still gives plain decoding's tokens;
(c) records faulted on their way back are detected and read again from the device as with pieces;
(d) a test's Python stand-in in place of a piece runs the rounds piece by piece (a graph would replay what
    the stand-in did once);
(e) (session 42, staged after call 162) a request after the backend's row count changed composes again;
(f) (session 43) a request of another page count in the same bucket, crossing a page edge, composes nothing.
"""

from __future__ import annotations

import pytest

from tests.exl3.test_device_round import backend  # noqa: F401  (a fixture: rounds on the GPU, round graphs)
from tests.exl3.test_gpu import decoder, prompt  # noqa: F401  (decoder: a fixture)
from tests.exl3.test_tree_verify import plain, tree_generate

pytestmark = pytest.mark.gpu

TOKENS = 40


def generate(backend, decoder, ids):  # noqa: F811
    """A greedy request through the product path: its tokens, its stats and each round's records as read
    back (the request's epoch left out)."""
    from elpis.exl3.device_round import EPOCH_WORD
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

    rounds = backend.device_rounds
    records: list[list[int]] = []
    read = rounds._read

    def recording(q):
        result = read(q)
        words = list(rounds.last_words)
        words[EPOCH_WORD] = 0
        records.append(words)
        return result

    rounds._read = recording
    try:
        gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=backend.tree_run(),
                                   draft_top_k=4)  # fmt: skip
        request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=TOKENS, sampling=SamplingParams(),
                                    ignore_eos=True)  # fmt: skip
        steps = list(gen.generate(request))
    finally:
        del rounds._read
    return [t for step in steps for t in step.token_ids], steps[-1].stats, records


def truth_of(backend, ids) -> list[int]:  # noqa: F811
    out, _ = tree_generate(backend, ids, TOKENS, plain)
    return out


def in_pieces(backend, decoder, ids):  # noqa: F811
    """`generate`'s tokens and records with the rounds queued piece by piece (no round graphs)."""
    rounds = backend.device_rounds
    graphs = rounds.round_graphs
    rounds.round_graphs = None
    try:
        tokens, _, records = generate(backend, decoder, ids)
    finally:
        rounds.round_graphs = graphs
    return tokens, records


def test_the_switch_gives_rounds_their_graphs(backend):  # noqa: F811
    assert backend.device_rounds.round_graphs is not None


def test_composed_rounds_give_the_pieces_records_bit_for_bit(backend, decoder):  # noqa: F811
    ids = prompt(1500, 61, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    graphs = backend.device_rounds.round_graphs
    pieces, pieces_records = in_pieces(backend, decoder, ids)
    composed_before = graphs.composed
    first, _, first_records = generate(backend, decoder, ids)
    assert graphs.composed > composed_before, "no round key was composed"
    launches = graphs.launches
    second, stats, second_records = generate(backend, decoder, ids)
    assert pieces == truth and first == truth and second == truth
    assert first_records == pieces_records, "a composed round's records differ from the pieces'"
    assert second_records == pieces_records
    # every round queued (those past the request's end too) was a launch
    assert graphs.launches - launches == backend.device_rounds.numbered >= stats.rounds, "rounds in pieces"


def test_composed_rounds_across_a_page_and_a_bucket_edge(backend, decoder):  # noqa: F811
    ids = prompt(4080, 62, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    graphs = backend.device_rounds.round_graphs
    composed, launches = graphs.composed, graphs.launches
    got, stats, _ = generate(backend, decoder, ids)
    assert got == truth
    assert graphs.composed - composed >= 4, "the keys on both sides of the edge were not composed"
    assert graphs.launches > launches
    assert stats.rounds >= TOKENS // 2


def test_a_page_edge_inside_a_bucket_composes_nothing_new(backend, decoder):  # noqa: F811
    """(f) (session 43) The round tail reads the sequence's page count from device memory, uploaded with the
    verify's block table: a request of another page count inside the same context bucket (4096) launches the
    keys an earlier request composed, crossing a page edge (1792), and its records are the pieces' bit for
    bit (the tail refuses nothing the pieces accept)."""
    generate(backend, decoder, prompt(1500, 67, backend.info.vocab_size))  # composes the 4096 bucket's keys
    ids = prompt(1770, 68, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    graphs = rounds.round_graphs
    pieces, pieces_records = in_pieces(backend, decoder, ids)
    composed, launches = graphs.composed, graphs.launches
    got, _, records = generate(backend, decoder, ids)
    assert pieces == truth and got == truth
    assert records == pieces_records, "a composed round's records differ from the pieces'"
    assert graphs.composed == composed, "a new page count composed a new graph"
    assert graphs.launches - launches == rounds.numbered


def test_records_faulted_on_their_way_back_are_read_again_with_composed_rounds(backend, decoder):  # noqa: F811
    from collections import Counter

    from elpis.exl3.device_round import RecordFaults

    ids = prompt(1300, 63, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    generate(backend, decoder, prompt(900, 64, backend.info.vocab_size))  # stale replays this one
    generate(backend, decoder, ids)  # composes this prompt's keys
    launches = rounds.round_graphs.launches
    schedule = {1: "dropped", 2: "repeated", 3: "stale", 5: "dropped", 6: "repeated"}
    rounds.record_faults = RecordFaults(schedule)
    try:
        got, stats, _ = generate(backend, decoder, ids)
        injected = rounds.record_faults.injected
    finally:
        rounds.record_faults = None
    assert got == truth
    assert injected == Counter(schedule.values())
    assert stats.faults_detected == dict(injected) and stats.rounds_recovered == len(schedule)
    assert rounds.round_graphs.launches - launches == rounds.numbered >= stats.rounds


def test_a_stand_in_for_a_piece_runs_the_rounds_piece_by_piece(backend, decoder):  # noqa: F811
    ids = prompt(1200, 65, backend.info.vocab_size)
    truth = truth_of(backend, ids)
    rounds = backend.device_rounds
    generate(backend, decoder, ids)  # composes this prompt's keys
    launches = rounds.round_graphs.launches
    targets = rounds._targets
    calls = {"n": 0}

    def counted(out):
        calls["n"] += 1
        return targets(out)

    rounds._targets = counted
    try:
        got, stats, _ = generate(backend, decoder, ids)
    finally:
        del rounds._targets
    assert got == truth
    assert calls["n"] >= stats.rounds and rounds.round_graphs.launches == launches


def test_composed_rounds_after_the_row_count_changed(backend, decoder):  # noqa: F811
    """(e) A request after the backend's row count changed (the bench and tests switch `fixed_rows`; a run
    choice switches it round by round) composes that count's rounds beside the other count's: each count's
    buffers are made once and kept (session 50; before, every composed graph was dropped and a new pool
    taken, call 162). Back at a count composed before, its graphs are launched again and nothing is
    composed. Every count's rounds are plain decoding's."""
    ids = prompt(1100, 66, backend.info.vocab_size)
    rounds = backend.device_rounds
    graphs = rounds.round_graphs
    rows = backend.fixed_rows
    try:
        for i, run in enumerate((8, 16, 8)):
            backend.fixed_rows = run
            truth = truth_of(backend, ids)
            composed, launches = graphs.composed, graphs.launches
            got, _, _ = generate(backend, decoder, ids)
            assert got == truth, f"{run} rows"
            if i == 0:
                assert graphs.composed > composed, "8 rows: nothing composed after the change"
            if i == 2:
                assert graphs.composed == composed, "8 rows again: composed again, not launched"
                assert graphs.launches > launches
    finally:
        backend.fixed_rows = rows
