"""The schedule inside a span of a logit row (which thread reads what, and in which order a block combines it:
`patches/kernels/row_scan.cuh`, `verify_epilogue.cu`, `draft_candidates.cu`): compile
`bend/row_scan_schedule.bend` to `build/kernels/row_scan_schedule.h` and check it (through
`elpis.bend.scalar_header`, as the row spans).

The header (functions for host and device code through ELPIS_ROWSCAN_FN, every generated name prefixed
`elpis_rowscans_`) is compared, built by the host C compiler, with the Bend interpreter on every query of
`table_queries()`: every stride of up to 20 values from two starts for blocks of 1 to 16 threads, every
thread's strides over the first and last spans of the model's fp16 and fp32 rows and over the merges' span
results for the served blocks, the single values of every vocabulary up to 40 and the model's, every slot and
level of the halving tree for blocks of 1 to 1,024 threads, the butterfly's levels, warps and lanes, and the
edges of the domain and beyond. Inside the law domain the interpreter's answers are also compared with the
closed forms (`closed_form`). Any difference is a ScheduleMismatch (fail closed); `build` writes the header
only once both pass.
"""

from __future__ import annotations

from elpis.bend.row_spans import MAX_TOTAL, MODEL_VOCAB, count_of, shift_of, vectors_of
from elpis.bend.scalar_header import Entry, Query, ScalarHeader
from elpis.bend.scalar_header import ScheduleMismatch as ScheduleMismatch  # the build and tests name it here

SPEC = ScalarHeader(
    module="bend/row_scan_schedule.bend",
    template="row_scan_schedule.h.j2",
    header="row_scan_schedule.h",
    prefix="elpis_rowscans_",
    stem="ELPIS_ROWSCAN",
    entries={
        "elpis_rowscan_stride_at": Entry("stride_at", 4, "thread t's read at its step j from first"),
        "elpis_rowscan_stride_steps": Entry("stride_steps", 4, "the steps thread t takes over [first, end)"),
        "elpis_rowscan_span_singles": Entry("span_singles", 4, "the first single value span s reads"),
        "elpis_rowscan_tree_levels": Entry("tree_levels", 1, "the halving tree's levels for 2^shift threads"),
        "elpis_rowscan_tree_active": Entry("tree_active", 3, "1 where thread t combines at a level"),
        "elpis_rowscan_tree_partner": Entry("tree_partner", 3, "the slot thread t combines into its own"),
        "elpis_rowscan_butterfly_xor": Entry("butterfly_xor", 1, "the butterfly's xor distance at a level"),
        "elpis_rowscan_lane_of": Entry("lane_of", 1, "thread t's lane in its warp"),
        "elpis_rowscan_warp_of": Entry("warp_of", 1, "thread t's warp"),
        "elpis_rowscan_warps": Entry("warps", 1, "the warps of a block of 2^shift threads"),
    },
    constants={"max_thread_shift": "max_thread_shift", "max_end": "max_end", "warp_shift": "warp_shift"},
    table=lambda: table_queries(),
    closed_form=lambda q: closed_form(q),
)
MODULE, HEADER = SPEC.module, SPEC.header
# Query kinds, in the order of the entries.
STRIDE_AT, STRIDE_STEPS, SPAN_SINGLES, TREE_LEVELS, TREE_ACTIVE, TREE_PARTNER = range(6)
BUTTERFLY_XOR, LANE_OF, WARP_OF, WARPS = range(6, 10)

MAX_THREAD_SHIFT, MAX_END, WARP_SHIFT = 10, 1 << 31, 5  # the laws' domain, as the closed forms assume
SERVED_THREAD_SHIFT = 8  # both kernels' blocks of 256 threads
SERVED_SPAN_SHIFT, SERVED_SPAN_CAP, MOST_CANDIDATES = 10, 6, 16  # spans of 1,024 vectors, at most 64; k <= 16
U32_MAX = 2**32 - 1


def steps_of(first: int, end: int, t: int, shift: int) -> int:
    """A thread's steps over [first, end) by the closed form: ceil((end - first - t) / 2^shift), 0 past it."""
    length = end - first
    return -(-(length - t) >> shift) if t < length else 0


def singles_of(vocab: int, fp16: bool) -> int:
    """The first of a row's single values by the closed form: the logits past its last 16-byte vector."""
    return vectors_of(vocab, fp16) << (3 if fp16 else 2)


def _model_ranges() -> list[tuple[int, int]]:
    """The vector ranges of the first, second, next-to-last and last spans of the model's fp16 and fp32
    rows at the served spans, the merges' ranges of span results ([0, spans) and [0, spans k)), and the
    five single values of a row of the model's vocabulary plus 5."""
    out = []
    for fp16 in (True, False):
        total = vectors_of(MODEL_VOCAB, fp16)
        shift = shift_of(total, SERVED_SPAN_SHIFT, SERVED_SPAN_CAP)
        count = count_of(total, shift)
        for s in sorted({0, 1, count - 2, count - 1}):
            out.append((s << shift, min((s + 1) << shift, total)))
        out += [(0, count), (0, count * MOST_CANDIDATES)]
    out.append((singles_of(MODEL_VOCAB + 5, True), MODEL_VOCAB + 5))  # a row's single values
    return out


def table_queries() -> list[Query]:
    """Strides: every range of up to 20 values from two starts for blocks of 1 to 16, every thread of the
    served block (and past it) over the model's ranges, larger blocks on a few threads, and ranges at the
    domain's end and past it. Single values: every vocabulary up to 40 and the model's, in both widths, for
    every span of 1 to 3 and past them. The halving tree: every slot (and one past) at every level (and one
    past) of every block of 1 to 1,024 threads but 2^9 and 2^10 (their first and last 40 slots), and blocks
    past the domain. The butterfly, warps and lanes: every level, thread and shift up to 40 and U32 maxima."""
    out = []
    for first in (0, 3):
        for length in range(21):
            for shift in range(5):
                for t in range((1 << shift) + 1):
                    out.append(Query(STRIDE_STEPS, (first, first + length, t, shift)))
                    steps = steps_of(first, first + length, t, shift) if t < 1 << shift else 0
                    out += [Query(STRIDE_AT, (first, t, j, shift)) for j in range(steps + 1)]
    for first, end in _model_ranges():
        for shift in (5, SERVED_THREAD_SHIFT, MAX_THREAD_SHIFT):
            threads = 1 << shift
            for t in sorted({*range(min(threads, 257)), threads - 1, threads}):
                out.append(Query(STRIDE_STEPS, (first, end, t, shift)))
                steps = steps_of(first, end, t, shift)
                out += [Query(STRIDE_AT, (first, t, j, shift)) for j in range(steps + 1)]
    edges = (0, 1, MAX_END - 2, MAX_END - 1, MAX_END, U32_MAX - 1, U32_MAX)
    for first in edges:
        for end in edges:
            for shift in (0, 8, MAX_THREAD_SHIFT, 11, 31, 32, U32_MAX):
                out += [Query(STRIDE_STEPS, (first, end, t, shift)) for t in (0, 1, 255, 1023, 1024, U32_MAX)]
                ats = ((t, j) for t in (0, 255, U32_MAX) for j in (0, 1, U32_MAX))
                out += [Query(STRIDE_AT, (first, t, j, shift)) for t, j in ats]
    vocabs = (*range(41), MODEL_VOCAB, MODEL_VOCAB + 5, MAX_TOTAL * 8 - 1, U32_MAX)
    for vocab in vocabs:
        for fp16 in (0, 1, 2):
            spans = [(s, c) for c in range(4) for s in range(c + 2)] + [(U32_MAX, 0), (0, U32_MAX)]
            out += [Query(SPAN_SINGLES, (vocab, fp16, s, c)) for s, c in spans]
    out += [Query(TREE_LEVELS, (shift,)) for shift in (*range(41), U32_MAX)]
    for shift in (*range(MAX_THREAD_SHIFT + 1), 11, 31, 32, U32_MAX):
        if shift < 9:
            slots: tuple[int, ...] = tuple(range((1 << shift) + 1))
        elif shift < 32:
            slots = (*range(40), *range((1 << shift) - 40, (1 << shift) + 1))
        else:  # 2^shift is 0 in U32
            slots = (0, 1, 255, U32_MAX)
        for level in (*range(min(shift, 33) + 2), U32_MAX):
            out += [Query(kind, (t, shift, level)) for kind in (TREE_ACTIVE, TREE_PARTNER) for t in slots]
    out += [Query(BUTTERFLY_XOR, (level,)) for level in (*range(41), U32_MAX)]
    for kind in (LANE_OF, WARP_OF):
        out += [Query(kind, (t,)) for t in (*range(1100), U32_MAX - 1, U32_MAX)]
    out += [Query(WARPS, (shift,)) for shift in (*range(41), U32_MAX)]
    return list(dict.fromkeys(out))


def closed_form(q: Query) -> int | None:
    """What a query must answer by the closed forms inside the law domain (None elsewhere)."""
    match q.kind, q.args:
        case (0, (first, t, j, shift)) if shift < 32:
            return (first + t + ((j << shift) & U32_MAX)) & U32_MAX
        case (1, (first, end, t, shift)) if first <= end < MAX_END and shift <= MAX_THREAD_SHIFT:
            return steps_of(first, end, t, shift)
        case (2, (vocab, fp16, s, spans)):
            return singles_of(vocab, bool(fp16)) if (s + 1) & U32_MAX == spans else vocab
        case (3, (shift,)):
            return shift
        case (4, (t, shift, level)) if shift <= MAX_THREAD_SHIFT and level < 31:
            return int(t < (1 << shift) >> (level + 1))
        case (5, (t, shift, level)) if shift <= MAX_THREAD_SHIFT and level < 31:
            return (t + ((1 << shift) >> (level + 1))) & U32_MAX
        case (6, (level,)) if level < 31:
            return 16 >> level
        case (7, (t,)):
            return t & 31
        case (8, (t,)):
            return t >> 5
        case (9, (shift,)) if shift < 32:
            return ((1 << shift) & U32_MAX) >> 5
    return None


# the spec's driver, as this module's own (the build calls `build`; tests call all four)
render, check_header, build, constants_of = SPEC.render, SPEC.check_header, SPEC.build, SPEC.constants_of
