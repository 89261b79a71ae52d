"""The Gated DeltaNet gate projections kernel's work schedule: compile `bend/gdn_ba_schedule.bend` to
`build/kernels/gdn_ba_schedule.h` and check it (through `elpis.bend.scalar_header`, as the GEMM schedule).

The header (functions for host and device code through ELPIS_GDNBA_FN, every generated name prefixed
`elpis_gdnbas_`) is compared, built by the host C compiler, with the Bend interpreter on every query of
`table_queries()`: the model's k (5120) and every k up to 4096 in steps of 8 and around each span edge up to
the domain's end, the chunks and values of the model's spans, the butterfly's steps, the model's 96 gate
columns and the edges of the domain and beyond. Inside the law domain the interpreter's answers are also
compared with the closed forms (`closed_form`: ceil(k / 1024), 1024 s + 8 t, j's bits, 16 >> i, c / 4 and
c % 4). Any difference is a ScheduleMismatch (fail closed); `build` writes the header only once both pass.
"""

from __future__ import annotations

from elpis.bend.scalar_header import Entry, Query, ScalarHeader
from elpis.bend.scalar_header import ScheduleMismatch as ScheduleMismatch  # the build and tests name it here

SPEC = ScalarHeader(
    module="bend/gdn_ba_schedule.bend",
    template="gdn_ba_schedule.h.j2",
    header="gdn_ba_schedule.h",
    prefix="elpis_gdnbas_",
    stem="ELPIS_GDNBA",
    entries={
        "elpis_gdnba_spans": Entry("spans", 1, "spans of k values: ceil(k / ELPIS_GDNBA_SPAN_K)"),
        "elpis_gdnba_chunk_begin": Entry("chunk_begin", 2, "the first value thread t of span s sums"),
        "elpis_gdnba_span_of": Entry("span_of", 1, "the span of value j"),
        "elpis_gdnba_thread_of": Entry("thread_of", 1, "the thread whose chunk holds value j"),
        "elpis_gdnba_chunk_place": Entry("chunk_place", 1, "value j's place in its thread's chunk"),
        "elpis_gdnba_butterfly": Entry("butterfly", 1, "the xor distance of butterfly step `step`"),
        "elpis_gdnba_column_block": Entry("column_block", 1, "launch 1's block of column c"),
        "elpis_gdnba_column_slot": Entry("column_slot", 1, "column c's slot in its block"),
        "elpis_gdnba_column_at": Entry("column_at", 2, "the column of slot `slot` of block `block`"),
    },
    constants={
        "chunk": "chunk",
        "threads": "threads",
        "span_k": "span_k",
        "columns": "columns",
        "butterfly_steps": "butterfly_steps",
    },
    table=lambda: table_queries(),
    closed_form=lambda q: closed_form(q),
)
MODULE, HEADER = SPEC.module, SPEC.header
# Query kinds, in the order of the entries.
SPANS, CHUNK_BEGIN, SPAN_OF, THREAD_OF, CHUNK_PLACE, BUTTERFLY = range(6)
COLUMN_BLOCK, COLUMN_SLOT, COLUMN_AT = range(6, 9)

K_LIMIT = 1 << 31  # the laws' domain: k < 2^31
MODEL_K = 5120  # a GDN layer's input (the hidden size)
MODEL_COLUMNS = 96  # b's and a's 48 columns each
SPAN_K, CHUNK, THREADS, COLUMNS, STEPS = 1024, 8, 128, 4, 5  # what the closed forms assume
U32_MAX = 2**32 - 1


def table_queries() -> list[Query]:
    """The model's k and every k up to 4096 in steps of 8, k around every span edge up to 2^20 and at the
    domain's end; every chunk of the model's five spans and the threads past the last; every value of the
    model's k (its span, thread and place); the butterfly's steps and past them; the model's columns and
    blocks; and U32 maxima outside the domain, where only the header and the interpreter are compared."""
    ks = {*range(0, 4097, 8), MODEL_K, K_LIMIT - 8, K_LIMIT - 1, K_LIMIT, U32_MAX - 1023, U32_MAX}
    ks |= {e + d for e in range(SPAN_K, 1 << 20, SPAN_K * 37) for d in (-8, -1, 0, 1, 8)}
    out = [Query(SPANS, (k,)) for k in sorted(ks)]
    out += [Query(CHUNK_BEGIN, (s, t)) for s in range(7) for t in (*range(THREADS), THREADS, U32_MAX)]
    out += [Query(CHUNK_BEGIN, (s, t)) for s in (0x3FFFFF, 0x400000, U32_MAX) for t in (0, 1, 127)]
    values = {*range(MODEL_K + 16), K_LIMIT - 1, K_LIMIT, U32_MAX}
    for kind in (SPAN_OF, THREAD_OF, CHUNK_PLACE):
        out += [Query(kind, (j,)) for j in sorted(values)]
    out += [Query(BUTTERFLY, (i,)) for i in (*range(40), U32_MAX)]
    columns = {*range(MODEL_COLUMNS + 8), 0x3FFFFFFF, U32_MAX}
    for kind in (COLUMN_BLOCK, COLUMN_SLOT):
        out += [Query(kind, (c,)) for c in sorted(columns)]
    blocks = (*range(MODEL_COLUMNS // COLUMNS + 2), 0x3FFFFFFF)
    out += [Query(COLUMN_AT, (b, s)) for b in blocks for s in range(6)]
    return list(dict.fromkeys(out))


def closed_form(q: Query) -> int | None:
    """What a query must answer by the closed forms inside the law domain (None elsewhere)."""
    match q.kind, q.args:
        case (0, (k,)) if k < K_LIMIT:
            return -(-k // SPAN_K)
        case (1, (s, t)) if s < 0x400000 and t < THREADS:
            return SPAN_K * s + CHUNK * t
        case (2, (j,)):
            return j // SPAN_K
        case (3, (j,)):
            return (j // CHUNK) % THREADS
        case (4, (j,)):
            return j % CHUNK
        case (5, (i,)):
            return 16 >> i if i < STEPS else 0
        case (6, (c,)):
            return c // COLUMNS
        case (7, (c,)):
            return c % COLUMNS
        case (8, (b, s)) if b < 0x40000000 and s < COLUMNS:
            return COLUMNS * b + s
    return None


# the spec's driver, as this module's own (the build calls `build`; tests call all four)
render, check_header, build, constants_of = SPEC.render, SPEC.check_header, SPEC.build, SPEC.constants_of
