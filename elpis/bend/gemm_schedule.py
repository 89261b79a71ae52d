"""The EXL3 GEMM kernel's work schedule: compile `bend/gemm_schedule.bend` to a C/CUDA header and check it.

`render(root)` writes the text of `gemm_schedule.h` (functions for host and device code through the
qualifier macro ELPIS_GEMM_FN), compiled one-to-one from the Bend program by the acceptors' generator
(`codegen.FnEmitter`) through the jinja2 template `codegen/gemm_schedule.h.j2`; every generated name is
prefixed `elpis_gemms_`, so the header can share a translation unit with `verify_schedule.h` and
`gdn_plan.h`. `check_header(header, root)` compiles a harness around the header with the host C compiler
and compares it with the Bend interpreter on every query of `table_queries()` (the model's shapes as
stream-K grids and as partitions of their groups, every partition of up to 12 items, the edges of the
domain and beyond it), through the
shared harness of `elpis.bend.headers`; wherever the program's quotient is exact (a superset of the law
domain) the interpreter's answers are also compared with the closed forms (`closed_form`). Any difference
is a ScheduleMismatch (fail closed).
`build(out_dir, root)` writes the header only once both checks pass.
"""

from __future__ import annotations

from elpis.bend.scalar_header import Entry, Query, ScalarHeader
from elpis.bend.scalar_header import ScheduleMismatch as ScheduleMismatch  # the build and tests name it here

SPEC = ScalarHeader(
    module="bend/gemm_schedule.bend",
    template="gemm_schedule.h.j2",
    header="gemm_schedule.h",
    # every generated name's prefix (verify_schedule.h uses bend_verify_schedule_*, gdn_plan.h elpis_gdnp_*)
    prefix="elpis_gemms_",
    stem="ELPIS_GEMM",
    entries={
        "elpis_gemm_split_begin": Entry("split_begin", 3, "first item of part s"),
        "elpis_gemm_split_end": Entry("split_end", 3, "one past the last item of part s"),
        "elpis_gemm_owner": Entry("owner", 3, "the part holding item g"),
        "elpis_gemm_ktile": Entry("ktile", 2, "the k-tile warp `warp` handles in group `group`"),
        "elpis_gemm_blocks": Entry(
            "blocks", 2, "blocks of a stream-K grid over `units` units: min(units, max(1, capacity))"
        ),
    },
    # the header's macros (ELPIS_GEMM_<NAME>) -> the Bend defs whose values they carry
    constants={"warps": "warps", "group_k": "group_k"},
    table=lambda: table_queries(),
    closed_form=lambda q: closed_form(q),
)
MODULE, HEADER = SPEC.module, SPEC.header
# Query kinds of the table, in order: split_begin, split_end, owner, ktile, blocks.
SPLIT_BEGIN, SPLIT_END, OWNER, KTILE, BLOCKS = range(5)

# The law domain: 1 <= splits <= groups < 2^20 with splits < 2^12. The closed forms are compared wherever
# the quotient is exact (`exact_partition`).
GROUPS_LIMIT = 1 << 20
MODEL_GROUPS = (40, 48, 136)  # k = 5120, 6144, 17408 in groups of 128
# n / 128 of the model's projections and of its groups of projections sharing an input (Q/K/V 112, GDN
# qkv/z 128, MLP gate/up 272, DFlash K/V 16)
MODEL_NBLOCKS = (8, 16, 40, 48, 80, 96, 112, 128, 136, 272, 1940)
# part counts of the model's groups beside the stream-K grids (the kernel's first, k-split design)
MODEL_SPLITS = (1, 2, 7, 8, 33)



# ====================================================================== the table


def begin_of(groups: int, splits: int, s: int) -> int:
    q, r = divmod(groups, splits)
    return s * q + min(s, r)


def owner_of(groups: int, splits: int, g: int) -> int:
    q, r = divmod(groups, splits)
    return g // (q + 1) if g < r * (q + 1) else r + (g - r * (q + 1)) // q


def exact_partition(groups: int, splits: int) -> bool:
    """Where the program's quotient groups / splits is exact (a superset of the law domain)."""
    return 1 <= splits <= groups < GROUPS_LIMIT and (groups + 1) * splits < 2**32


def _partition(groups: int, splits: int, every: bool, owners: tuple[int, ...] = ()) -> list[Query]:
    """Begin and end of splits, and owners of groups: all of them, or those around the boundaries of
    the first, middle and last splits (and the owners of `owners`)."""
    if every:
        ss, gs = list(range(splits + 1)), list(range(groups))
    else:
        ss = sorted({s for s in (0, 1, 2, splits // 2, splits - 2, splits - 1, splits) if 0 <= s <= splits})
        edges = {begin_of(groups, splits, s) for s in ss} if exact_partition(groups, splits) else set()
        near = {g for e in edges | {0, groups // 2, groups} for g in (e - 1, e, e + 1) if 0 <= g < groups}
        gs = sorted(near | {g for g in owners if 0 <= g < groups})
    out = [Query(SPLIT_BEGIN, (groups, splits, s)) for s in ss]
    out += [Query(SPLIT_END, (groups, splits, s)) for s in ss if s < splits or not every]
    out += [Query(OWNER, (groups, splits, g)) for g in gs]
    return out


def table_queries() -> list[Query]:
    """The model's shapes as stream-K grids (units = groups x nblocks over 264 blocks, and 132 and 528 for
    k = 5120: around part boundaries, and the owners of the first and last group of the first and last
    n-blocks) and as partitions of their groups into a few parts (every part, the owner of every group);
    every partition of 1..12 items; large and edge partitions (sampled around part boundaries); stream-K
    block counts; k-tiles; and inputs outside the law domain (zero parts, more parts than items, 2^20
    items and more, U32 maxima), where only the header and the interpreter are compared."""
    out: list[Query] = []
    for groups in MODEL_GROUPS:
        for splits in MODEL_SPLITS:
            out += _partition(groups, splits, every=True)
        for nb in MODEL_NBLOCKS:
            units = groups * nb
            firsts = [j * groups for j in (*range(min(nb, 2)), *range(max(2, nb - 2), nb))]
            owners = tuple(g for f in firsts for g in (f, f + groups - 1))
            for capacity in (132, 264, 528) if groups == MODEL_GROUPS[0] else (264,):
                blocks = min(units, capacity)
                out.append(Query(BLOCKS, (units, capacity)))
                out += _partition(units, blocks, every=False, owners=owners)
    for groups in range(1, 13):
        for splits in range(1, groups + 1):
            out += _partition(groups, splits, every=True)
    edges = [(17, 16), (100, 7), (264, 264), (265, 264), (4095, 264), (4096, 1), (4096, 2), (4096, 33)]
    edges += [(4096, 4095), (65535, 1), (65535, 264), (65535, 4095), (65535, 65534), (65535, 65535)]
    edges += [(GROUPS_LIMIT - 1, 1), (GROUPS_LIMIT - 1, 264), (GROUPS_LIMIT - 1, 4095), (77600, 264)]
    edges += [(0, 0), (5, 0), (5, 9), (GROUPS_LIMIT, 3), (GROUPS_LIMIT - 1, 70000), (2**32 - 1, 2**32 - 1)]
    for groups, splits in edges:
        out += _partition(groups, splits, every=False)
    for group in (0, 1, 7, 40, 135, 2**29 - 1, 2**32 - 1):
        out += [Query(KTILE, (group, warp)) for warp in range(9)]
    for units in (0, 1, 2, 131, 132, 264, 265, 77600, 2**32 - 1):
        out += [Query(BLOCKS, (units, capacity)) for capacity in (0, 1, 132, 264, 528, 2**32 - 1)]
    return list(dict.fromkeys(out))


def closed_form(q: Query) -> int | None:
    """What a query must answer by the closed forms, where the program is exact (None elsewhere)."""
    match q.kind, q.args:
        case (0, (a, b, c)) if exact_partition(a, b) and c <= b:
            return begin_of(a, b, c)
        case (1, (a, b, c)) if exact_partition(a, b) and c < b:
            return begin_of(a, b, c + 1)
        case (2, (a, b, c)) if exact_partition(a, b) and c < a:
            return owner_of(a, b, c)
        case (3, (a, b)) if a < 2**29 and b < 8:
            return 8 * a + b
        case (4, (a, b)):
            return min(a, max(1, b))
    return None


# the spec's driver, as this module's own (the build calls `build`; tests call all four)
render, check_header, build, constants_of = SPEC.render, SPEC.check_header, SPEC.build, SPEC.constants_of
