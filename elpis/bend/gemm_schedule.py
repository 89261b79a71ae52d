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

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elpis.bend.check import Program, load
from elpis.bend.codegen import Generator, template_env
from elpis.bend.errors import BendError
from elpis.bend.headers import harness_lines, install_checked, require_same_table, source_digest
from elpis.bend.interp import Interpreter
from elpis.paths import BUILD_DIR, REPO_ROOT

MODULE = "bend/gemm_schedule.bend"
TEMPLATE = "gemm_schedule.h.j2"
HEADER = "gemm_schedule.h"
KERNELS_BUILD_DIR = BUILD_DIR / "kernels"
# Every generated name's prefix (verify_schedule.h uses bend_verify_schedule_*, gdn_plan.h elpis_gdnp_*).
PREFIX = "elpis_gemms_"

# exported C name -> (Bend def, parameter types, one line for the header)
ENTRIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "elpis_gemm_split_begin": ("split_begin", ("U32", "U32", "U32"), "first item of part s"),
    "elpis_gemm_split_end": ("split_end", ("U32", "U32", "U32"), "one past the last item of part s"),
    "elpis_gemm_owner": ("owner", ("U32", "U32", "U32"), "the part holding item g"),
    "elpis_gemm_ktile": ("ktile", ("U32", "U32"), "the k-tile warp `warp` handles in group `group`"),
    "elpis_gemm_blocks": (
        "blocks",
        ("U32", "U32"),
        "blocks of a stream-K grid over `units` units: min(units, max(1, capacity))",
    ),
}
# The header's macros (ELPIS_GEMM_<NAME>) -> the Bend defs whose values they carry.
CONSTANTS = {"warps": "warps", "group_k": "group_k"}
# Query kinds of the table (what the harness evaluates): kind -> entry.
KINDS = (
    "elpis_gemm_split_begin",
    "elpis_gemm_split_end",
    "elpis_gemm_owner",
    "elpis_gemm_ktile",
    "elpis_gemm_blocks",
)

# The law domain: 1 <= splits <= groups < 2^20 with splits < 2^12. The closed forms are compared wherever
# the quotient is exact (`exact_partition`).
GROUPS_LIMIT = 1 << 20
MODEL_GROUPS = (40, 48, 136)  # k = 5120, 6144, 17408 in groups of 128
# n / 128 of the model's projections and of its groups of projections sharing an input (Q/K/V 112, GDN
# qkv/z 128, MLP gate/up 272, DFlash K/V 16)
MODEL_NBLOCKS = (8, 16, 40, 48, 80, 96, 112, 128, 136, 272, 1940)
# part counts of the model's groups beside the stream-K grids (the kernel's first, k-split design)
MODEL_SPLITS = (1, 2, 7, 8, 33)


class ScheduleMismatch(BendError):
    """The compiled header disagrees with the Bend interpreter (or does not compile), or the interpreter
    with the closed forms."""


@dataclass(frozen=True)
class Query:
    """One call of an exported function: `kind` indexes KINDS; unused arguments are 0."""

    kind: int
    a: int
    b: int
    c: int = 0

    def args(self) -> tuple[int, ...]:
        return (self.a, self.b) if len(ENTRIES[KINDS[self.kind]][1]) == 2 else (self.a, self.b, self.c)


def load_schedule(root: Path = REPO_ROOT) -> Program:
    root = Path(root).resolve()
    return load(root, [root / MODULE])


def _key(name: str) -> str:
    return f"{MODULE}::{name}"


def _rename(code: str) -> str:
    """Give the header its own names (the generator's defs and primitive helpers)."""
    code = re.sub(r"\bbend_", PREFIX, code)
    code = re.sub(r"\belpis_(nat_sub|nat_min|nat_max|u32_shl|u32_shr)\(", PREFIX + r"\1(", code)
    if not code.startswith("static "):
        raise BendError("codegen: expected a static function")
    return "ELPIS_GEMM_FN " + code[len("static ") :]


def _c_name(bend_name: str) -> str:
    return f"{PREFIX}{Path(MODULE).stem}_{bend_name}"


def constants(root: Path = REPO_ROOT) -> dict[str, int]:
    """warps() and group_k() by the interpreter."""
    interp = Interpreter(load_schedule(root))
    return {name: int(interp.function(_key(b))()) for name, b in CONSTANTS.items()}


def render(root: Path = REPO_ROOT) -> str:
    """The header text, compiled from the Bend program."""
    root = Path(root).resolve()
    prog = load_schedule(root)
    gen = Generator(prog)
    for cname, (bend_name, kinds, _) in ENTRIES.items():
        gen._check_entry(cname, _key(bend_name), kinds, "U32")
    protos, bodies = gen.emit_reachable(_key(b) for b, _, _ in ENTRIES.values())
    if gen.type_defs:
        raise BendError(f"{MODULE}: the schedule must use scalars only (found records)")
    entries = []
    for cname, (bend_name, _, doc) in ENTRIES.items():
        params = [p for p, _, _ in prog.funs[_key(bend_name)].params]
        entries.append(
            {
                "name": cname,
                "doc": doc,
                "params": ", ".join(f"uint32_t {p}" for p in params),
                "call": f"{_c_name(bend_name)}({', '.join(params)})",
            }
        )
    template = template_env(root).get_template(TEMPLATE)
    return template.render(
        source=MODULE,
        digest=source_digest(root, (MODULE, f"codegen/{TEMPLATE}")),
        prototypes=[_rename(protos[k]) + ";" for k in sorted(protos)],
        functions=[_rename(bodies[k]) for k in sorted(bodies)],
        entries=entries,
        **constants(root),
    )


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
    out = [Query(0, groups, splits, s) for s in ss]
    out += [Query(1, groups, splits, s) for s in ss if s < splits or not every]
    out += [Query(2, groups, splits, g) for g in gs]
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
                out.append(Query(4, units, capacity))
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
        out += [Query(3, group, warp) for warp in range(9)]
    for units in (0, 1, 2, 131, 132, 264, 265, 77600, 2**32 - 1):
        out += [Query(4, units, capacity) for capacity in (0, 1, 132, 264, 528, 2**32 - 1)]
    return list(dict.fromkeys(out))


def closed_form(q: Query) -> int | None:
    """What a query must answer by the closed forms, where the program is exact (None elsewhere)."""
    a, b, c = q.a, q.b, q.c
    match q.kind:
        case 0 if exact_partition(a, b) and c <= b:
            return begin_of(a, b, c)
        case 1 if exact_partition(a, b) and c < b:
            return begin_of(a, b, c + 1)
        case 2 if exact_partition(a, b) and c < a:
            return owner_of(a, b, c)
        case 3 if a < 2**29 and b < 8:
            return 8 * a + b
        case 4:
            return min(a, max(1, b))
    return None


def reference_table(root: Path = REPO_ROOT) -> tuple[list[Query], list[str]]:
    """The table queries and the interpreter's line for each (first the constants), every answer inside
    the law domain compared with `closed_form` (ScheduleMismatch on a difference). Cached per content of
    the Bend program, whichever root it is read from (builds of copies of the repository share it)."""
    root = Path(root).resolve()
    source = hashlib.sha256((root / MODULE).read_bytes()).hexdigest()
    if source not in _REFERENCE:
        _REFERENCE[source] = _reference_table(root)
    return _REFERENCE[source]


_REFERENCE: dict[str, tuple[list[Query], list[str]]] = {}


def _reference_table(root: Path) -> tuple[list[Query], list[str]]:
    interp = Interpreter(load_schedule(root))
    f: dict[str, Callable[..., int]] = {c: interp.function(_key(b)) for c, (b, _, _) in ENTRIES.items()}
    consts = constants(root)
    queries = table_queries()
    lines = [f"C {consts['warps']} {consts['group_k']}"]
    for q in queries:
        got = int(f[KINDS[q.kind]](*q.args()))
        want = closed_form(q)
        if want is not None and got != want:
            raise ScheduleMismatch(f"{MODULE}: {KINDS[q.kind]}{q.args()} is {got}, the closed form {want}")
        lines.append(_line(q, got))
    return queries, lines


def _line(q: Query, value: int) -> str:
    return f"{q.kind} {q.a} {q.b} {q.c} {value}"


HARNESS = r"""
#include <stdio.h>
#include "gemm_schedule.h"

static const uint32_t QUERIES[][4] = {%QUERIES%};

int main(void) {
  printf("C %u %u\n", ELPIS_GEMM_WARPS, ELPIS_GEMM_GROUP_K);
  for (size_t i = 0; i < sizeof QUERIES / sizeof QUERIES[0]; i++) {
    const uint32_t kind = QUERIES[i][0], a = QUERIES[i][1], b = QUERIES[i][2], c = QUERIES[i][3];
    uint32_t v;
    switch (kind) {
      case 0: v = elpis_gemm_split_begin(a, b, c); break;
      case 1: v = elpis_gemm_split_end(a, b, c); break;
      case 2: v = elpis_gemm_owner(a, b, c); break;
      case 3: v = elpis_gemm_ktile(a, b); break;
      case 4: v = elpis_gemm_blocks(a, b); break;
      default: return 2;
    }
    printf("%u %u %u %u %u\n", kind, a, b, c, v);
  }
  return 0;
}
"""


def compiled_table(header: Path, queries: list[Query], cc: str | None = None) -> list[str]:
    """The table lines printed by a host build of `header` (gcc, C11, warnings as errors)."""
    rows = ", ".join(f"{{{q.kind}u, {q.a}u, {q.b}u, {q.c}u}}" for q in queries)
    return harness_lines(
        header, HEADER, HARNESS.replace("%QUERIES%", rows), ScheduleMismatch, cc=cc, timeout=60
    )


def check_header(header: Path, root: Path = REPO_ROOT, cc: str | None = None) -> int:
    """Compare the compiled header with the interpreter on every table query; return the line count."""
    queries, want = reference_table(root)
    got = compiled_table(header, queries, cc)

    def where(i: int) -> str:
        if i == 0:
            return f"{MODULE} on the constants"
        q = queries[i - 1]
        return f"{MODULE} at {KINDS[q.kind]}{q.args()}"

    return require_same_table(HEADER, want, got, where, ScheduleMismatch)


def build(out_dir: Path = KERNELS_BUILD_DIR, root: Path = REPO_ROOT, cc: str | None = None) -> Path:
    """Render the header, check it against the interpreter, then move it into `out_dir` atomically."""
    root = Path(root).resolve()
    return install_checked(render(root), out_dir, HEADER, lambda tmp: check_header(tmp, root, cc))


def constants_of(header: Path) -> dict[str, int]:
    """ELPIS_GEMM_WARPS and ELPIS_GEMM_GROUP_K as written in a generated header."""
    text = Path(header).read_text()
    out = {}
    for name in CONSTANTS:
        found = re.search(rf"#define ELPIS_GEMM_{name.upper()} (\d+)u", text)
        if not found:
            raise ScheduleMismatch(f"{header}: no ELPIS_GEMM_{name.upper()}")
        out[name] = int(found.group(1))
    return out
