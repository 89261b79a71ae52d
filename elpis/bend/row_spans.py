"""The spans of a logit row (the kernels that read a row with a block a span: `patches/kernels/row_scan.cuh`):
compile `bend/row_spans.bend` to `build/kernels/row_spans.h` and check it (through `elpis.bend.scalar_header`,
as the GEMM schedule).

The header (functions for host and device code through ELPIS_ROWSPANS_FN, every generated name prefixed
`elpis_rowspanss_`) is compared, built by the host C compiler, with the Bend interpreter on every query of
`table_queries()`: the model's vocabulary in fp16 and fp32, every vocabulary up to 2,100, row lengths around
every power of two up to the domain's end and beyond, every base and cap of the domain on them, the spans and
vectors of the model's rows, and U32 maxima. Inside the law domain the interpreter's answers are also
compared with the closed forms (`closed_form`: shifts, bit lengths, ceilings). Any difference is a
ScheduleMismatch (fail closed); `build` writes the header only once both pass.
"""

from __future__ import annotations

from elpis.bend.scalar_header import Entry, Query, ScalarHeader
from elpis.bend.scalar_header import ScheduleMismatch as ScheduleMismatch  # the build and tests name it here

SPEC = ScalarHeader(
    module="bend/row_spans.bend",
    template="row_spans.h.j2",
    header="row_spans.h",
    prefix="elpis_rowspanss_",
    stem="ELPIS_ROWSPANS",
    entries={
        "elpis_rowspans_vector_shift": Entry("vector_shift", 1, "log2 of the logits in a 16-byte vector"),
        "elpis_rowspans_vectors": Entry("vectors", 2, "the 16-byte vectors of a row of `vocab` logits"),
        "elpis_rowspans_span_shift": Entry("span_shift", 3, "log2 of a span's vectors for a row of `total`"),
        "elpis_rowspans_span_count": Entry("span_count", 2, "the spans of `total` vectors, 2^shift a span"),
        "elpis_rowspans_span_begin": Entry("span_begin", 2, "the first vector of span s"),
        "elpis_rowspans_span_end": Entry("span_end", 3, "one past the last vector of span s"),
        "elpis_rowspans_span_of": Entry("span_of", 2, "the span of vector v"),
    },
    constants={"max_total": "max_total", "max_base": "max_base", "max_cap": "max_cap"},
    table=lambda: table_queries(),
    closed_form=lambda q: closed_form(q),
)
MODULE, HEADER = SPEC.module, SPEC.header
# Query kinds, in the order of the entries.
VECTOR_SHIFT, VECTORS, SPAN_SHIFT, SPAN_COUNT, SPAN_BEGIN, SPAN_END, SPAN_OF = range(7)

MAX_TOTAL, MAX_BASE, MAX_CAP = 1 << 24, 16, 10  # the laws' domain, as the closed forms assume
MODEL_VOCAB = 248_320
U32_MAX = 2**32 - 1


def vectors_of(vocab: int, fp16: bool) -> int:
    """The 16-byte vectors of a row of `vocab` logits by the closed form: 8 fp16 or 4 fp32 a vector."""
    return vocab >> (3 if fp16 else 2)


def shift_of(total: int, base: int, cap: int) -> int:
    """The span shift by its closed form: base, or bit_length(total - 1) - cap where that is larger."""
    return base if total == 0 else max(base, (total - 1).bit_length() - cap)


def count_of(total: int, shift: int) -> int:
    """The span count by its closed form: ceil(total / 2^shift), 1 for no vectors."""
    return 1 if total == 0 else ((total - 1) >> shift) + 1


def table_queries() -> list[Query]:
    """Both vector widths of every vocabulary up to 2,100, the model's and U32 extremes; row lengths around
    every power of two (and the domain's end) with bases and caps across the domain and past it; the spans of
    the model's fp16 and fp32 rows at the served base and cap; shifts past 31, where shifts give zero."""
    out = [Query(VECTOR_SHIFT, (f,)) for f in (0, 1, 2, U32_MAX)]
    vocabs = {*range(2101), MODEL_VOCAB, MAX_TOTAL * 8, U32_MAX}
    out += [Query(VECTORS, (v, f)) for v in sorted(vocabs) for f in (0, 1)]
    totals = {0, 1, 2, 3, MODEL_VOCAB // 8, MODEL_VOCAB // 4, MAX_TOTAL - 1, MAX_TOTAL, U32_MAX}
    totals |= {(1 << e) + d for e in range(1, 26) for d in (-1, 0, 1)}
    for t in sorted(totals):
        out += [Query(SPAN_SHIFT, (t, b, c)) for b in (0, 3, 10, 16, 17) for c in (0, 1, 6, 10, 11)]
    shifts = (0, 1, 4, 10, 16, 24, 31, 32, U32_MAX)
    for t in sorted(totals):
        out += [Query(SPAN_COUNT, (t, s)) for s in shifts]
    for total, shift in ((MODEL_VOCAB // 8, 10), (MODEL_VOCAB // 4, 10), (125, 4), (125, 5)):
        spans = count_of(total, shift)
        out += [Query(SPAN_BEGIN, (s, shift)) for s in range(spans + 2)]
        out += [Query(SPAN_END, (total, s, shift)) for s in range(spans + 2)]
        out += [Query(SPAN_OF, (v, shift)) for v in range(0, total + 8, max(1, total // 500))]
    out += [Query(SPAN_BEGIN, (s, sh)) for s in (0, 1, U32_MAX) for sh in shifts]
    out += [Query(SPAN_END, (t, s, sh)) for t in (0, 5, U32_MAX) for s in (0, 1, U32_MAX) for sh in shifts]
    out += [Query(SPAN_OF, (v, sh)) for v in (0, 1, U32_MAX) for sh in shifts]
    return list(dict.fromkeys(out))


def closed_form(q: Query) -> int | None:
    """What a query must answer by the closed forms inside the law domain (None elsewhere)."""
    match q.kind, q.args:
        case (0, (f,)):
            return 3 if f else 2
        case (1, (v, f)):
            return vectors_of(v, bool(f))
        case (2, (t, b, c)) if t < MAX_TOTAL and b <= MAX_BASE and c <= MAX_CAP:
            return shift_of(t, b, c)
        case (3, (t, s)) if t < MAX_TOTAL and s < 32:
            return count_of(t, s)
        case (4, (s, sh)) if sh < 32:
            return (s << sh) & U32_MAX
        case (5, (t, s, sh)) if sh < 32 and s < U32_MAX:
            return min(((s + 1) << sh) & U32_MAX, t)
        case (6, (v, sh)) if sh < 32:
            return v >> sh
    return None


# the spec's driver, as this module's own (the build calls `build`; tests call all four)
render, check_header, build, constants_of = SPEC.render, SPEC.check_header, SPEC.build, SPEC.constants_of
