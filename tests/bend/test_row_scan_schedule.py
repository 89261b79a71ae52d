"""The schedule inside a logit row's span (bend/row_scan_schedule.bend): the generated header matches the Bend
interpreter (and a wrong header is refused), its laws are proved and a wrong schedule fails them, the two span
kernels take their strides and reductions from it, and over the whole domain of block sizes the halving tree
and the butterfly (replayed by the interpreter's functions) combine every partial exactly once. The induction
over the levels is the kernel's (section 6 of the proof module); a wrong model of the levels or a wrong
schedule fails it, and the models it is about are checked against the sets by the interpreter."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from elpis.bend import row_scan_schedule as rss
from elpis.bend import row_spans as rs
from elpis.bend.prove import prove_all
from elpis.bend.scalar_header import Query
from elpis.paths import REPO_ROOT
from tests.bend.conftest import (
    exported_parameters,
    fails_closed_on_template_edit,
    fails_its_law,
    refuses_edited_header,
)

LAWS = {
    "rowscan_stride_inside",
    "rowscan_stride_covers",
    "rowscan_stride_parts",
    "rowscan_stride_ascends",
    "rowscan_stride_stops_at_end",
    "rowscan_span_is_a_range",
    "rowscan_singles_are_a_range",
    "rowscan_logit_in_a_vector_or_single",
    "rowscan_singles_in_the_last_span",
    "rowscan_tree_starts_alone",
    "rowscan_tree_level_combines",
    "rowscan_tree_live_slots_combine",
    "rowscan_tree_partner_retires",
    "rowscan_tree_ends_in_slot_0",
    "rowscan_butterfly_starts_alone",
    "rowscan_butterfly_level_combines",
    "rowscan_butterfly_sets_are_classes",
    "rowscan_butterfly_same_operands",
    "rowscan_butterfly_ends_everywhere",
    "rowscan_thread_is_a_warps_lane",
    "rowscan_warps_fit_one_warp",
    "rowscan_tree_holder_is_a_slot",
    "rowscan_tree_live_before",
    "rowscan_tree_level_disjoint",
    "rowscan_tree_has_slot_0",
    "rowscan_tree_ends_with_the_block",
    "rowscan_butterfly_partner_is_a_lane",
    "rowscan_butterfly_level_disjoint",
    "rowscan_counts_add",
    "rowscan_eq_of_is_eq",
    "rowscan_butterfly_same_start",
    "rowscan_commuting_same_operands",
}
# proved by the kernel: the inductions on the levels run (the proof module's sections 6 and 7) and their steps
INDUCTION = {
    "rowscan_tree_live_is_active",
    "rowscan_tree_counts_its_set",
    "rowscan_tree_slot_0_counts_the_block",
    "rowscan_tree_slot_0_live_at_end",
    "rowscan_butterfly_counts_its_set",
    "rowscan_butterfly_counts_every_lane",
    "rowscan_butterfly_shared_set_same_bits",
    "rowscan_butterfly_same_bits_step",
    "rowscan_butterfly_ends_with_the_same_bits",
}
LAWS |= INDUCTION
CITED = {"and_left", "and_right", "u32_flip"}  # the kernel proofs' equational glue from other proof modules
# ~10-25 s each of z3 time: proved by every `make build`
SLOW = {"rowscan_stride_inside", "rowscan_stride_covers", "rowscan_stride_stops_at_end"}
KERNELS = REPO_ROOT / "patches" / "kernels"


@pytest.fixture(scope="module")
def sched() -> dict:
    return {name.removeprefix("elpis_rowscan_"): f for name, f in rss.SPEC.functions(REPO_ROOT).items()}


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = rss.build(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [rss.HEADER]
    assert rss.constants_of(path) == {"max_thread_shift": 10, "max_end": 1 << 31, "warp_shift": 5}
    assert rss.check_header(path) > 50_000
    assert rss.render() == path.read_text(), "generation is deterministic"


def test_the_laws_are_the_proof_modules() -> None:
    text = (REPO_ROOT / "proofs" / "row_scan_schedule_proof.bend").read_text()
    assert set(re.findall(r"^law (\w+):", text, re.M)) == LAWS
    assert "import ./row_scan_schedule_proof.bend" in (REPO_ROOT / "proofs" / "PROOF.bend").read_text()


def test_header_exports_the_kernels_interface_and_no_row_count() -> None:
    # No function takes the row count, a row's index or the data: every row is read and combined alike.
    want = {"first", "end", "t", "j", "shift", "vocab", "fp16", "s", "spans", "level"}
    assert exported_parameters(rss.SPEC) == want


def test_the_kernels_take_their_schedule_from_the_header() -> None:
    scan = (KERNELS / "row_scan.cuh").read_text()
    assert '#include "row_scan_schedule.h"' in scan
    for used in ("stride_at", "stride_steps", "span_singles", "tree_levels", "tree_active", "tree_partner"):
        assert f"elpis_rowscan_{used}(" in scan, used
    assert "elpis_rowscan_butterfly_xor(level)" in scan and "ELPIS_ROWSCAN_WARP_SHIFT" in scan
    assert "ELPIS_ROWSCAN_MAX_THREAD_SHIFT" in scan
    assert "+= 2 * kThreads" not in scan and "+= kThreads" not in scan, "strides come from the schedule"
    epilogue = (KERNELS / "verify_epilogue.cu").read_text()
    assert "row_scan::halving_tree<kThreads>(" in epilogue
    assert "row_scan::each_of_stride<kThreads>(" in epilogue
    assert "half >>= 1" not in epilogue and "+= kThreads" not in epilogue
    assert "row_scan::kBlockShift<kThreads>" in epilogue
    draft = (KERNELS / "draft_candidates.cu").read_text()
    assert draft.count("row_scan::each_butterfly_xor(") == 2 and "m >>= 1" not in draft
    assert draft.count("elpis_rowscan_lane_of(threadIdx.x), warp = elpis_rowscan_warp_of(threadIdx.x)") == 2
    assert draft.count("row_scan::each_of_stride<kThreads>(") == 2 and "+= kThreads" not in draft
    assert "static_assert(kThreadShift >= ELPIS_ROWSCAN_WARP_SHIFT" in draft


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("((uint32_t)(v_first + v_t)) +", "((uint32_t)(v_first + v_t + UINT32_C(1))) +"),  # a stride one late
        ("(v_t < v_length);", "(v_t <= v_length);"),  # a thread one step past the range's end
        (  # the tree's first level folds slots past the block
            "threads(v_shift), ((uint64_t)((uint32_t)(v_level + UINT32_C(1)))))",
            "threads(v_shift), ((uint64_t)v_level))",
        ),
        ("#define ELPIS_ROWSCAN_WARP_SHIFT 5u", "#define ELPIS_ROWSCAN_WARP_SHIFT 4u"),
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    refuses_edited_header(rss.SPEC, tmp_path, old, new)


def test_a_template_that_breaks_the_header_fails_closed(repo_copy: Path, tmp_path: Path) -> None:
    old, new = "return n < 32 ? (uint32_t)(a << n) : 0u;", "return n < 32 ? (uint32_t)(a << n) : 1u;"
    fails_closed_on_template_edit(rss.SPEC, repo_copy, tmp_path, old, new)


def test_the_fast_laws_are_proved() -> None:
    report = prove_all(REPO_ROOT, jobs=1, only=LAWS - SLOW)
    assert report.ok, report.failures
    # the slow three: every `make build`; with them the glue the kernel proofs cite
    assert {c["law"] for c in report.certificates} == (LAWS - SLOW) | CITED
    by_law = {c["law"]: c for c in report.certificates}
    assert {law for law, c in by_law.items() if c["method"] == "kernel"} == INDUCTION | CITED

    def cites(law: str) -> set[str]:
        return {key.split("::")[1] for key in by_law[law]["uses"]}

    # the inductions chain the one-level laws
    tree = {"rowscan_tree_starts_alone", "rowscan_tree_level_combines", "rowscan_tree_partner_retires"}
    assert tree <= cites("rowscan_tree_counts_its_set")
    lanes = {"rowscan_butterfly_starts_alone", "rowscan_butterfly_level_combines"}
    assert lanes <= cites("rowscan_butterfly_counts_its_set")
    assert "rowscan_butterfly_same_operands" in cites("rowscan_butterfly_same_bits_step")


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        (  # a stride of twice the block: step j's read is not step j's
            "  ((first + t : U32) + (j << U32.to_nat(shift) : U32) : U32)",
            "  ((first + t : U32) + (j << U32.to_nat((shift + 1 : U32)) : U32) : U32)",
            "rowscan_stride_parts",
        ),
        (  # every span reads the single values, not just the last
            "  pick(U32.is_eq((s + 1 : U32), spans), singles_begin(vocab, fp16), vocab)",
            "  pick(U32.is_lt(s, spans), singles_begin(vocab, fp16), vocab)",
            "rowscan_singles_in_the_last_span",
        ),
        (  # the first level folds slots past the block into each slot
            "  (threads(shift) >> U32.to_nat((level + 1 : U32)) : U32)",
            "  (threads(shift) >> U32.to_nat(level) : U32)",
            "rowscan_tree_partner_retires",
        ),
        (  # the butterfly starts at distance 8: lane i never sees lane i ^ 16
            "  ((1 << U32.to_nat(warp_shift()) : U32) >> U32.to_nat((level + 1 : U32)) : U32)",
            "  ((1 << U32.to_nat(warp_shift()) : U32) >> U32.to_nat((level + 2 : U32)) : U32)",
            "rowscan_butterfly_level_combines",
        ),
        (  # lanes of 16: thread t is not 32 warp + lane
            "  (t .&. ((1 << U32.to_nat(warp_shift()) : U32) - 1 : U32) : U32)",
            "  (t .&. 15 : U32)",
            "rowscan_thread_is_a_warps_lane",
        ),
    ],
)
def test_a_wrong_schedule_fails_its_laws(repo_copy: Path, old: str, new: str, law: str) -> None:
    fails_its_law(repo_copy, rss.MODULE, old, new, law)


SPEC_MODULE = "bend/row_scan_schedule_spec.bend"


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        (  # the model of the tree reads the slot past the partner
            "tree_count(d, u, S.tree_partner(t, shift, level), shift) : U32)",
            "tree_count(d, u, (S.tree_partner(t, shift, level) + 1 : U32), shift) : U32)",
            "rowscan_tree_counts_its_set",
        ),
        (  # a level of the tree that double-counts: a combining slot adds its own count twice
            "(tree_count(d, u, t, shift) + tree_count(d, u, S.tree_partner",
            "((tree_count(d, u, t, shift) + tree_count(d, u, t, shift) : U32) + "
            "tree_count(d, u, S.tree_partner",
            "rowscan_tree_counts_its_set",
        ),
        (  # the model of the butterfly combines with the next level's partner
            "lane_count(d, (i .^. S.butterfly_xor(level_of(d)) : U32), j)",
            "lane_count(d, (i .^. S.butterfly_xor((level_of(d) + 1 : U32)) : U32), j)",
            "rowscan_butterfly_counts_its_set",
        ),
        (  # a combine that is not commutative: lanes that share a set may hold other bits
            "  g(Nat.min(a, b), Nat.max(a, b))",
            "  g(a, b)",
            "rowscan_butterfly_shared_set_same_bits",
        ),
    ],
)
def test_a_wrong_model_of_the_levels_fails_its_law(repo_copy: Path, old: str, new: str, law: str) -> None:
    path = repo_copy / SPEC_MODULE
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    report = prove_all(repo_copy, jobs=1, only={law})
    assert not report.ok and any(f"law {law}:" in f for f in report.failures), report.failures


@pytest.mark.parametrize(
    ("old", "new", "law", "false"),
    [
        (  # the tree's partner one slot late: a level folds a slot that is not its partner's
            "  (t + tree_half(shift, level) : U32)",
            "  ((t + tree_half(shift, level) : U32) + 1 : U32)",
            "rowscan_tree_counts_its_set",
            "rowscan_tree_level_combines",
        ),
        (  # the butterfly's distances 16, 16, 4, 4, 1: a level that double-counts
            "  ((1 << U32.to_nat(warp_shift()) : U32) >> U32.to_nat((level + 1 : U32)) : U32)",
            "  ((1 << U32.to_nat(warp_shift()) : U32) >> U32.to_nat((level .|. 1 : U32)) : U32)",
            "rowscan_butterfly_counts_its_set",
            "rowscan_butterfly_level_disjoint",
        ),
    ],
)
def test_a_wrong_schedule_fails_the_induction(repo_copy: Path, old: str, new: str, law: str, false: str):
    """The same models over a wrong program: a one-level law the induction cites is false (z3 finds the
    counterexample), and the induction that rests on it fails with it."""
    path = repo_copy / rss.MODULE
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    report = prove_all(repo_copy, jobs=1, only={law})
    assert any(f"law {law}: its proof cites" in f and false in f for f in report.failures), report.failures
    assert any(f"law {false}: false: counterexample" in f for f in report.failures), report.failures


def test_the_models_of_the_levels_count_their_sets(interp) -> None:
    """The induction's hypotheses hold where the kernels run, so its laws are not vacuous (the prover's own
    check takes level_of and levels_within of a symbolic level count as unknown functions); and by the
    interpreter the models agree with the sets: every slot and partial of blocks of 1 to 16 threads after
    every level, slot 0 of blocks up to 64 after the last, every pair of lanes after every butterfly level."""
    names = ("level_of", "levels_within", "tree_count", "tree_holds", "lane_count", "lane_holds")
    spec = {name: interp.function(f"{SPEC_MODULE}::{name}") for name in (*names, "lane_value")}
    for shift in range(rss.MAX_THREAD_SHIFT + 1):
        assert spec["levels_within"](shift, shift) and spec["level_of"](shift) == shift
        assert not spec["levels_within"](shift + 1, shift)
        assert spec["tree_holds"](0, 0, shift, shift)  # slot 0 is live after the last level
    for shift in range(5):
        threads = 1 << shift
        for done in range(shift + 1):
            for t in range(threads):
                live = spec["tree_holds"](t, t, shift, done)
                assert live == (t < threads >> done)
                if live:
                    counts = [spec["tree_count"](done, u, t, shift) for u in range(threads + 2)]
                    assert counts == [int(spec["tree_holds"](u, t, shift, done)) for u in range(threads + 2)]
    for shift in range(7):
        counts = [spec["tree_count"](shift, u, 0, shift) for u in range((1 << shift) + 2)]
        assert counts == [1] * (1 << shift) + [0, 0]
    for done in range(rss.WARP_SHIFT + 1):
        assert spec["levels_within"](done, rss.WARP_SHIFT)
        for i in range(32):
            assert [spec["lane_count"](done, i, j) for j in range(32)] == [
                int(spec["lane_holds"](i, j, done)) for j in range(32)
            ]

    # a commutative combine (g's arguments ordered): every lane ends with the same bits, for any g
    def g(a: int, b: int) -> int:
        return (3 * a + b) % 2**64

    ends = [spec["lane_value"](g, lambda i: i * i + 7, rss.WARP_SHIFT, i) for i in range(32)]
    assert len(set(ends)) == 1


def test_the_tree_folds_every_partial_once_for_every_block(sched: dict) -> None:
    """The induction over levels the laws leave to the argument, replayed for every block of 1 to 1,024
    threads: slot 0 ends with each thread's partial exactly once, a slot is read only by one thread at its
    level and never after, and no thread reads a slot another writes at the same level."""
    for shift in range(rss.MAX_THREAD_SHIFT + 1):
        threads = 1 << shift
        slots = [Counter([t]) for t in range(threads)]
        retired: set[int] = set()
        for level in range(sched["tree_levels"](shift)):
            active = [t for t in range(threads) if sched["tree_active"](t, shift, level)]
            partners = [sched["tree_partner"](t, shift, level) for t in active]
            assert len(set(partners)) == len(partners) and not set(partners) & set(active)
            assert all(p < threads and p not in retired for p in partners)
            for t, p in zip(active, partners, strict=True):
                slots[t] = slots[t] + slots[p]
            retired |= set(partners)
        assert slots[0] == Counter(range(threads)), shift
        assert retired == set(range(1, threads))


def test_the_butterfly_leaves_every_lane_the_same_combination(sched: dict) -> None:
    """The butterfly replayed on symbolic values, a combine of two terms written in a canonical order (the
    combine is commutative): after the last level every lane holds the same term, every lane's value once."""
    lanes = 1 << rss.WARP_SHIFT
    Term = int | tuple  # a lane's value, or the combine of two terms

    def combine(a: Term, b: Term) -> Term:
        return tuple(sorted((a, b), key=repr))

    def leaves(term: Term) -> Counter:
        return Counter([term]) if isinstance(term, int) else leaves(term[0]) + leaves(term[1])

    values: list[Term] = list(range(lanes))
    for level in range(rss.WARP_SHIFT):
        d = sched["butterfly_xor"](level)
        values = [combine(values[i], values[i ^ d]) for i in range(lanes)]
    assert len(set(values)) == 1 and leaves(values[0]) == Counter(range(lanes))


def test_warps_and_lanes_of_every_block(sched: dict) -> None:
    for shift in range(rss.WARP_SHIFT, rss.MAX_THREAD_SHIFT + 1):
        warps = sched["warps"](shift)
        owners = Counter((sched["warp_of"](t), sched["lane_of"](t)) for t in range(1 << shift))
        assert set(owners.values()) == {1}
        assert set(owners) == {(w, lane) for w in range(warps) for lane in range(32)}
        assert 1 <= warps <= 32


@pytest.mark.parametrize("fp16", [1, 0])
def test_the_model_rows_are_read_once_in_order(sched: dict, fp16: int) -> None:
    """By the interpreter, the model's rows at the served spans and block (256 threads): every vector of every
    span read by exactly one (thread, step), each thread's reads ascending, the two merges' ranges alike."""
    total = rs.vectors_of(rs.MODEL_VOCAB, bool(fp16))
    span_shift = rs.shift_of(total, rss.SERVED_SPAN_SHIFT, rss.SERVED_SPAN_CAP)
    spans = rs.count_of(total, span_shift)
    ranges = [(s << span_shift, min((s + 1) << span_shift, total)) for s in range(spans)]
    for first, end in [*ranges, (0, spans), (0, spans * rss.MOST_CANDIDATES)]:
        seen: Counter = Counter()
        for t in range(1 << rss.SERVED_THREAD_SHIFT):
            steps = sched["stride_steps"](first, end, t, rss.SERVED_THREAD_SHIFT)
            reads = [sched["stride_at"](first, t, j, rss.SERVED_THREAD_SHIFT) for j in range(steps)]
            assert reads == sorted(reads)
            seen.update(reads)
        assert seen == Counter(range(first, end))
    # a row of 5 logits more: only its last span reads the single values past its last vector
    vocab = rs.MODEL_VOCAB + 5
    spans = rs.count_of(rs.vectors_of(vocab, bool(fp16)), span_shift)
    singles = [sched["span_singles"](vocab, fp16, s, spans) for s in range(spans)]
    assert singles == [vocab] * (spans - 1) + [rs.MODEL_VOCAB if fp16 else rs.MODEL_VOCAB + 4]


def test_table_covers_the_served_geometry_and_the_domains_edges() -> None:
    queries = set(rss.table_queries())
    fp16_total = rs.vectors_of(rs.MODEL_VOCAB, True)
    last = (fp16_total - 1) >> rss.SERVED_SPAN_SHIFT << rss.SERVED_SPAN_SHIFT
    assert all(Query(rss.STRIDE_STEPS, (last, fp16_total, t, 8)) in queries for t in range(257))
    assert all(Query(rss.TREE_PARTNER, (t, 8, level)) in queries for t in range(257) for level in range(9))
    assert all(Query(rss.BUTTERFLY_XOR, (level,)) in queries for level in range(6))
    assert Query(rss.STRIDE_STEPS, (0, rss.MAX_END - 1, 0, 10)) in queries
