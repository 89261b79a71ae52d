"""The logit rows' spans (bend/row_spans.bend): the generated header matches the Bend interpreter (and a
wrong header is refused), its laws are proved and a wrong partition fails them, the two span kernels take
their spans from it, and on the model's rows every vector is in exactly one span."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    "rowspans_count_within_cap",
    "rowspans_base_kept",
    "rowspans_shift_bounded",
    "rowspans_cover",
    "rowspans_parts",
    "rowspans_nonempty",
    "rowspans_no_vectors_one_span",
    "rowspans_tail_short",
    "rowspans_vector_widths",
}
SLOW = {"rowspans_count_within_cap", "rowspans_base_kept"}  # ~15 s each: proved by every `make build`
SERVED_BASE, SERVED_CAP = 10, 6  # the kernels' spans of 1,024 vectors, at most 64 a row


@pytest.fixture(scope="module")
def spans() -> dict:
    return {name.removeprefix("elpis_rowspans_"): f for name, f in rs.SPEC.functions(REPO_ROOT).items()}


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = rs.build(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [rs.HEADER]
    assert rs.constants_of(path) == {"max_total": 1 << 24, "max_base": 16, "max_cap": 10}
    assert rs.check_header(path) > 5_000
    assert rs.render() == path.read_text(), "generation is deterministic"


def test_header_exports_the_kernels_interface_and_no_row_count() -> None:
    # No function takes the row count or a row's index: every row of a launch has the same spans.
    assert exported_parameters(rs.SPEC) == {"fp16", "vocab", "total", "base", "cap", "shift", "s", "v"}


def test_the_kernels_take_their_spans_from_the_header() -> None:
    kernels = REPO_ROOT / "patches" / "kernels"
    scan = (kernels / "row_scan.cuh").read_text()
    assert '#include "row_spans.h"' in scan
    for used in ("vectors", "span_shift", "span_count", "span_begin", "span_end"):
        assert f"elpis_rowspans_{used}(" in scan, used
    assert "s * spans.vectors" not in scan, "a span's vectors come from the schedule"
    assert "ELPIS_ROWSPANS_MAX_TOTAL" in scan
    for name in ("verify_epilogue.cu", "draft_candidates.cu"):
        source = (kernels / name).read_text()
        assert "row_scan::spans_of(vocab, fp16, kSpanShift, kSpanCap)" in source, name
        assert "ELPIS_ROWSPANS_MAX_BASE" in source and "ELPIS_ROWSPANS_MAX_CAP" in source, name
        assert "row_scan::rows_fit(vocab, fp16)" in source, name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("return UINT32_C(3);", "return UINT32_C(4);"),  # fp16 vectors of 16 logits
        ("(v_power <= v_x)", "(v_power < v_x)"),  # a bit length one short at powers of two
        ("#define ELPIS_ROWSPANS_MAX_CAP 10u", "#define ELPIS_ROWSPANS_MAX_CAP 11u"),
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    refuses_edited_header(rs.SPEC, tmp_path, old, new)


def test_a_template_that_breaks_the_header_fails_closed(repo_copy: Path, tmp_path: Path) -> None:
    old = "return n < 32 ? a >> n : 0u;"
    fails_closed_on_template_edit(rs.SPEC, repo_copy, tmp_path, old, "return n < 32 ? a >> n : 1u;")


def test_the_laws_are_proved() -> None:
    report = prove_all(REPO_ROOT, jobs=1, only=LAWS - {"rowspans_count_within_cap", "rowspans_base_kept"})
    assert report.ok, report.failures
    # the two slow ones (~15 s each) are proved by every `make build`; here the fast six
    assert {c["law"] for c in report.certificates} == LAWS - {
        "rowspans_count_within_cap",
        "rowspans_base_kept",
    }


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        (  # spans rounded down: the vectors of a short last span are in no span
            "      (((total - 1 : U32) >> U32.to_nat(shift) : U32) + 1 : U32)",
            "      (total >> U32.to_nat(shift) : U32)",
            "rowspans_cover",
        ),
        (  # one span too many: the last is empty
            "      (((total - 1 : U32) >> U32.to_nat(shift) : U32) + 1 : U32)",
            "      ((total >> U32.to_nat(shift) : U32) + 1 : U32)",
            "rowspans_nonempty",
        ),
        (  # a span ending one vector early: its last vector in no span
            "  min_u32(span_begin((s + 1 : U32), shift), total)",
            "  min_u32((span_begin((s + 1 : U32), shift) - 1 : U32), total)",
            "rowspans_parts",
        ),
        (  # vectors counted as twice as wide: the single values past them a whole vector or more
            "  (vocab >> U32.to_nat(vector_shift(fp16)) : U32)",
            "  (vocab >> U32.to_nat((vector_shift(fp16) + 1 : U32)) : U32)",
            "rowspans_tail_short",
        ),
        ("    case 0:\n      2\n", "    case 0:\n      3\n", "rowspans_vector_widths"),  # fp32 as 8 a vector
    ],
)
def test_a_wrong_partition_fails_its_laws(repo_copy: Path, old: str, new: str, law: str) -> None:
    fails_its_law(repo_copy, rs.MODULE, old, new, law)


@pytest.mark.parametrize(("fp16", "want"), [(1, 31), (0, 61)])
def test_the_model_rows(spans: dict, fp16: int, want: int) -> None:
    """By the interpreter, on the model's vocabulary at the served base and cap: spans of 1,024 vectors, every
    vector in exactly one span, none empty, and no single values past the vectors (248,320 = 8 x 31,040)."""
    vocab = rs.MODEL_VOCAB
    total = spans["vectors"](vocab, fp16)
    shift = spans["span_shift"](total, SERVED_BASE, SERVED_CAP)
    count = spans["span_count"](total, shift)
    assert (shift, count) == (SERVED_BASE, want)
    owner = [spans["span_of"](v, shift) for v in range(total)]
    for s in range(count):
        begin, end = spans["span_begin"](s, shift), spans["span_end"](total, s, shift)
        assert begin < end and all(owner[v] == s for v in range(begin, end))
    assert (
        sum(spans["span_end"](total, s, shift) - spans["span_begin"](s, shift) for s in range(count)) == total
    )
    assert vocab - (total << spans["vector_shift"](fp16)) == 0


def test_capped_rows_get_the_least_longer_spans(spans: dict) -> None:
    """A row of more than 2^cap spans of 2^base vectors: the shortest power-of-two spans that make at most
    2^cap of them."""
    for total in (65_537, 100_000, 1 << 20, (1 << 24) - 1):
        shift = spans["span_shift"](total, SERVED_BASE, SERVED_CAP)
        assert spans["span_count"](total, shift) <= 64 < spans["span_count"](total, shift - 1)


def test_table_covers_the_model_and_the_domains_edges() -> None:
    queries = set(rs.table_queries())
    assert (
        Query(rs.VECTORS, (rs.MODEL_VOCAB, 1)) in queries
        and Query(rs.VECTORS, (rs.MODEL_VOCAB, 0)) in queries
    )
    assert Query(rs.SPAN_SHIFT, (rs.MAX_TOTAL - 1, 10, 6)) in queries
    assert Query(rs.SPAN_COUNT, (rs.MODEL_VOCAB // 8, 10)) in queries
    assert all(Query(rs.SPAN_END, (rs.MODEL_VOCAB // 8, s, 10)) in queries for s in range(31))
