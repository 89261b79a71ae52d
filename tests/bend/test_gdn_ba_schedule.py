"""The Gated DeltaNet gate projections' schedule (bend/gdn_ba_schedule.bend): the generated header matches the
Bend interpreter (and a wrong header is refused), its laws are proved and a wrong schedule fails them, and on
the model's k every value is summed by exactly one (span, thread, place)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elpis.bend import gdn_ba_schedule as gbs
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
    "gdnba_span_is_a_chunk_per_thread",
    "gdnba_chunk_covers",
    "gdnba_chunk_parts",
    "gdnba_spans_cover",
    "gdnba_last_span_nonempty",
    "gdnba_chunks_whole",
    "gdnba_butterfly_is_a_basis",
    "gdnba_butterfly_bits",
    "gdnba_butterfly_distinct",
    "gdnba_column_covers",
    "gdnba_column_parts",
}


@pytest.fixture(scope="module")
def sched() -> dict:
    return {name.removeprefix("elpis_gdnba_"): f for name, f in gbs.SPEC.functions(REPO_ROOT).items()}


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = gbs.build(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [gbs.HEADER]
    want = {"chunk": 8, "threads": 128, "span_k": 1024, "columns": 4, "butterfly_steps": 5}
    assert gbs.constants_of(path) == want
    assert gbs.check_header(path) > 10_000
    assert gbs.render() == path.read_text(), "generation is deterministic"


def test_header_exports_the_kernel_interface_and_no_row_count() -> None:
    # No function takes the row count: a row's summation order cannot depend on it.
    assert exported_parameters(gbs.SPEC) == {"k", "s", "t", "j", "step", "c", "block", "slot"}


def test_the_kernel_takes_its_schedule_from_the_header() -> None:
    source = (REPO_ROOT / "patches" / "kernels" / "gdn_ba_rows.cu").read_text()
    assert '#include "gdn_ba_schedule.h"' in source
    for used in ("chunk_begin", "butterfly", "column_at", "column_block", "spans"):
        assert f"elpis_gdnba_{used}(" in source, used
    for constant in ("THREADS", "CHUNK", "SPAN_K", "COLUMNS", "BUTTERFLY_STEPS"):
        assert re.search(rf"constexpr \w+ k\w+ = ELPIS_GDNBA_{constant};", source), constant
    assert "m >>= 1" not in source, "the butterfly's distances come from the schedule, not a literal loop"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("UINT64_C(10);", "UINT64_C(9);"),  # spans of 512 values
        ("(v_c & UINT32_C(3));", "(v_c & UINT32_C(7));"),  # a column's slot past the block
        (
            "UINT32_C(1))))), elpis_gdnbas_gdn_ba_schedule_span_shift())",
            "UINT32_C(0))))), elpis_gdnbas_gdn_ba_schedule_span_shift())",
        ),  # floor instead of ceiling: the last span dropped
        ("#define ELPIS_GDNBA_COLUMNS 4u", "#define ELPIS_GDNBA_COLUMNS 8u"),
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    refuses_edited_header(gbs.SPEC, tmp_path, old, new)


def test_a_template_that_breaks_the_header_fails_closed(repo_copy: Path, tmp_path: Path) -> None:
    old = "return n < 32 ? a >> n : 0u;"
    fails_closed_on_template_edit(gbs.SPEC, repo_copy, tmp_path, old, "return n < 32 ? a >> n : 1u;")


def test_the_laws_are_proved() -> None:
    report = prove_all(REPO_ROOT, jobs=1, only=LAWS)
    assert report.ok, report.failures
    assert {c["law"] for c in report.certificates} == LAWS


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        ("def span_shift() -> Nat:\n  10n", "def span_shift() -> Nat:\n  9n", "gdnba_chunk_covers"),
        (  # spans rounded down: the values of a short last span are in no span
            "  ((k + (span_k() - 1 : U32) : U32) >> span_shift() : U32)",
            "  (k >> span_shift() : U32)",
            "gdnba_spans_cover",
        ),
        (  # one span too many: the last is empty
            "  ((k + (span_k() - 1 : U32) : U32) >> span_shift() : U32)",
            "  ((k + span_k() : U32) >> span_shift() : U32)",
            "gdnba_last_span_nonempty",
        ),
        (  # a thread's index read one bit too wide: two threads would share values
            "  ((j >> chunk_shift() : U32) .&. (threads() - 1 : U32) : U32)",
            "  ((j >> chunk_shift() : U32) .&. ((threads() * 2 : U32) - 1 : U32) : U32)",
            "gdnba_chunk_covers",
        ),
        (  # the butterfly starts at distance 32: lanes past the warp, and one lane bit never folded
            "  ((warp_lanes() >> 1n : U32) >> U32.to_nat(step) : U32)",
            "  (warp_lanes() >> U32.to_nat(step) : U32)",
            "gdnba_butterfly_is_a_basis",
        ),
        ("  (c .&. 3 : U32)", "  (c .&. 7 : U32)", "gdnba_column_covers"),
    ],
)
def test_a_wrong_schedule_fails_its_laws(repo_copy: Path, old: str, new: str, law: str) -> None:
    fails_its_law(repo_copy, gbs.MODULE, old, new, law)


def test_the_model_shape(sched: dict) -> None:
    """By the interpreter, on a GDN layer's k = 5120 and its 96 gate columns: every value in exactly one
    (span, thread, place) whose chunk lies inside k, the spans all non-empty, every column in one (block,
    slot), and the butterfly's distances 16, 8, 4, 2, 1."""
    k = gbs.MODEL_K
    spans = sched["spans"](k)
    assert spans == 5
    owners = [(sched["span_of"](j), sched["thread_of"](j), sched["chunk_place"](j)) for j in range(k)]
    assert len(set(owners)) == k and all(s < spans for s, _, _ in owners)
    assert all(sched["chunk_begin"](s, t) + e == j for j, (s, t, e) in enumerate(owners))
    assert {s for s, _, _ in owners} == set(range(spans))
    assert [sched["butterfly"](i) for i in range(6)] == [16, 8, 4, 2, 1, 0]
    cells = [(sched["column_block"](c), sched["column_slot"](c)) for c in range(gbs.MODEL_COLUMNS)]
    assert len(set(cells)) == gbs.MODEL_COLUMNS and max(b for b, _ in cells) == gbs.MODEL_COLUMNS // 4 - 1
    assert all(sched["column_at"](b, s) == c for c, (b, s) in enumerate(cells))


def test_table_covers_the_model_and_the_domains_edges() -> None:
    queries = set(gbs.table_queries())
    assert Query(gbs.SPANS, (gbs.MODEL_K,)) in queries
    assert all(Query(gbs.SPAN_OF, (j,)) in queries for j in range(gbs.MODEL_K))
    assert Query(gbs.SPANS, (gbs.K_LIMIT - 1,)) in queries and Query(gbs.SPANS, (2**32 - 1,)) in queries
    assert all(Query(gbs.CHUNK_BEGIN, (s, t)) in queries for s in range(5) for t in range(128))
