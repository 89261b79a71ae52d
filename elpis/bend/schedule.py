"""The tree-verify attention schedule: compile `bend/verify_schedule.bend` to a C/CUDA header and check it.

`generate(out_dir, root)` writes `verify_schedule.h` (functions for host and device code through the
qualifier macro ELPIS_SCHED_FN), compiled one-to-one from the Bend program by the acceptors' generator
(`codegen.FnEmitter`), through the jinja2 template `codegen/verify_schedule.h.j2`.
`check_header(header, root)` compiles a harness around the header with the host C compiler and
compares it with the Bend interpreter on every case of `table_cases()` (chunk-boundary contexts, every
depth 0..15, masks of several trees), through the shared harness of `elpis.bend.headers`; any
difference is a ScheduleMismatch (fail closed).
`build(out_dir, root)` does both, writing the header only once it matches.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from elpis.bend.check import Program, load
from elpis.bend.codegen import Generator, template_env
from elpis.bend.errors import BendError
from elpis.bend.headers import harness_lines, install_checked, require_same_table, source_digest
from elpis.bend.interp import Interpreter
from elpis.paths import BUILD_DIR, REPO_ROOT

MODULE = "bend/verify_schedule.bend"
TEMPLATE = "verify_schedule.h.j2"
HEADER = "verify_schedule.h"
KERNELS_BUILD_DIR = BUILD_DIR / "kernels"
MAX_ROWS = 16

# exported C name -> (Bend def, parameter types, result type)
ENTRIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "split_size": ("split_size", (), "U32"),
    "split_min": ("split_min", (), "U32"),
    "span": ("span", ("U32", "U32"), "U32"),
    "splits": ("splits", ("U32",), "U32"),
    "split_begin": ("split_begin", ("U32",), "U32"),
    "split_end": ("split_end", ("U32", "U32"), "U32"),
    "owner": ("owner", ("U32",), "U32"),
    "slot": ("slot", ("U32", "U32", "U32"), "U32"),
    "anc_at": ("anc_at", ("U32", "Nat"), "U32"),
}
# The generator's primitive helpers, renamed so this header can sit next to the acceptors' C.
HELPERS = ("elpis_nat_sub", "elpis_nat_min", "elpis_nat_max", "elpis_u32_shl", "elpis_u32_shr")


class ScheduleMismatch(BendError):
    """The compiled header disagrees with the Bend interpreter (or does not compile)."""


@dataclass(frozen=True)
class Mask:
    """One tree row's inputs to the slot map: its depth and ancestor bitmask (from tree_masks)."""

    depth: int
    ancestors: int


def load_schedule(root: Path) -> Program:
    return load(root, [root / MODULE])


def _key(name: str) -> str:
    return f"{MODULE}::{name}"


def render(root: Path = REPO_ROOT) -> str:
    """The header text, compiled from the Bend program."""
    root = Path(root).resolve()
    prog = load_schedule(root)
    gen = Generator(prog)
    for cname, (bend_name, kinds, result) in ENTRIES.items():
        gen._check_entry(cname, _key(bend_name), kinds, result)
    protos, bodies = gen.emit_reachable(_key(b) for b, _, _ in ENTRIES.values())
    if gen.type_defs:
        raise BendError(f"{MODULE}: the schedule must use scalars only (found records)")
    interp = Interpreter(prog)
    split_size = interp.function(_key("split_size"))()
    split_min = interp.function(_key("split_min"))()
    entries = []
    for cname, (bend_name, _, _) in ENTRIES.items():
        fun = prog.funs[_key(bend_name)]
        params = [f"uint32_t {p}" for p, _, _ in fun.params]
        args = [p for p, _, _ in fun.params]
        entries.append(
            {
                "name": f"elpis_sched_{cname}",
                "params": ", ".join(params) or "void",
                "call": f"{_short(prog, bend_name)}({', '.join(args)})",
            }
        )
    template = template_env(root).get_template(TEMPLATE)
    return template.render(
        source=MODULE,
        digest=source_digest(root, (MODULE, f"codegen/{TEMPLATE}")),
        split_size=split_size,
        split_min=split_min,
        max_rows=MAX_ROWS,
        prototypes=[_qualify(protos[k]) + ";" for k in sorted(protos)],
        functions=[_qualify(bodies[k]) for k in sorted(bodies)],
        entries=entries,
    )


def _short(prog: Program, bend_name: str) -> str:
    return f"bend_{Path(MODULE).stem}_{bend_name.replace('.', '_')}"


def _qualify(code: str) -> str:
    if not code.startswith("static "):
        raise BendError("codegen: expected a static function")
    code = "ELPIS_SCHED_FN " + code[len("static ") :]
    for helper in HELPERS:
        code = code.replace(helper + "(", helper.replace("elpis_", "elpis_sched_") + "(")
    return code


# ====================================================================== reference table


# Split boundaries the table crosses: the first of each region of the layout (128-position splits
# below 4096, 256 below 16384, 512 below 65536, 2048 beyond), both sides of each region change, and long
# contexts.
TABLE_BOUNDARIES = (
    *(128, 256, 384, 512, 3968, 4096, 4352, 4608),
    *(16128, 16384, 16896, 17408, 32768, 65024, 65536, 67584, 69632, 131072, 262144),
)


def table_cases(seed: int = 8) -> tuple[list[tuple[int, int]], list[Mask]]:
    """(ctx, depth) pairs and row masks the header is checked on.

    Contexts: 0..40, around the split boundaries of `TABLE_BOUNDARIES` (boundary - 17 .. boundary + 2,
    so spans end on both sides of a boundary for every depth), and the top of the domain; depths 0..15.
    Masks: every row of chains, stars and random trees of 1..16 rows, through the same tree_masks Bend
    program the acceptor library uses.
    """
    ctxs = set(range(41))
    for b in TABLE_BOUNDARIES:
        ctxs.update(range(b - 17, b + 3))
    ctxs.update((0x7FFFFFF0 - 15, 0x7FFFFFF0 - 1, 0x7FFFFFF0 - 16))
    pairs = [(c, d) for c in sorted(ctxs) for d in range(16)]
    rng = random.Random(seed)
    trees: list[list[int]] = []
    for rows in range(1, MAX_ROWS + 1):
        trees.append([-1, *range(rows - 1)])  # chain
        trees.append([-1] + [0] * (rows - 1))  # star
        for _ in range(3):
            trees.append([-1] + [rng.randrange(r) for r in range(1, rows)])
    return pairs, masks_of_trees(trees)


def masks_of_trees(trees: Iterable[list[int]], root: Path = REPO_ROOT) -> list[Mask]:
    """Every row's (depth, ancestors) of each tree, by the compiled-masks Bend program (bend/masks.bend)."""
    prog = load(Path(root).resolve(), [Path(root).resolve() / "bend/masks.bend"])
    interp = Interpreter(prog)
    depths = interp.function("bend/masks.bend::depths")
    ancestors = interp.function("bend/masks.bend::ancestors")
    out: set[Mask] = set()
    for parents in trees:
        par = tuple(0 if p < 0 else p for p in parents)
        for d, a in zip(depths(par), ancestors(par), strict=True):
            out.add(Mask(int(d), int(a)))
    return sorted(out, key=lambda m: (m.depth, m.ancestors))


@functools.lru_cache(maxsize=4)
def interpreted(root: Path = REPO_ROOT) -> dict[str, Callable[..., int]]:
    """The entries of `ENTRIES`, run by the Bend interpreter on the program under `root`."""
    interp = Interpreter(load_schedule(Path(root).resolve()))
    return {name: interp.function(_key(b)) for name, (b, _, _) in ENTRIES.items()}


def split_bounds(total: int, root: Path = REPO_ROOT) -> list[tuple[int, int]]:
    """The splits of a span of `total` positions, (begin, end) in ascending order, by the Bend interpreter
    (the CPU references cut spans with it, so they follow the proved program, not a copy of it)."""
    f = interpreted(Path(root).resolve())
    return [(f["split_begin"](k), f["split_end"](total, k)) for k in range(f["splits"](total))]


def reference_table(root: Path, pairs: list[tuple[int, int]], masks: list[Mask]) -> list[str]:
    """The table lines, computed by the Bend interpreter (the same lines the harness prints)."""
    f = interpreted(Path(root).resolve())
    lines = [f"S {f['split_size']()} {f['split_min']()}"]
    for ctx, depth in pairs:
        total = f["span"](ctx, depth)
        n = f["splits"](total)
        ks = sorted({k for k in (0, 1, n - 2, n - 1) if 0 <= k < n})
        parts = " ".join(f"{k}:{f['split_begin'](k)}-{f['split_end'](total, k)}" for k in ks)
        lines.append(f"P {ctx} {depth} {total} {n} {f['owner'](total - 1)} {parts}")
    for m in masks:
        anc = " ".join(str(f["anc_at"](m.ancestors, e)) for e in range(MAX_ROWS + 1))
        for ctx in (0, 511, 0x7FFFFFF0 - 16):
            slots = " ".join(
                str(f["slot"](ctx, m.ancestors, p)) for p in range(max(0, ctx - 2), ctx + m.depth + 1)
            )
            lines.append(f"M {m.depth} {m.ancestors} {ctx} {anc} | {slots}")
    return lines


HARNESS = r"""
#include <stdio.h>
#include "verify_schedule.h"

static const uint32_t PAIRS[][2] = {%PAIRS%};
static const uint32_t MASKS[][2] = {%MASKS%};
static const uint32_t CTXS[3] = {0u, 511u, 0x7FFFFFE0u};

int main(void) {
  printf("S %u %u\n", elpis_sched_split_size(), elpis_sched_split_min());
  if (elpis_sched_split_size() != ELPIS_SCHED_SPLIT_SIZE) return 3;
  if (elpis_sched_split_min() != ELPIS_SCHED_SPLIT_MIN) return 3;
  for (size_t i = 0; i < sizeof PAIRS / sizeof PAIRS[0]; i++) {
    uint32_t ctx = PAIRS[i][0], depth = PAIRS[i][1];
    uint32_t total = elpis_sched_span(ctx, depth), n = elpis_sched_splits(total);
    printf("P %u %u %u %u %u", ctx, depth, total, n, elpis_sched_owner(total - 1u));
    for (uint32_t k = 0; k < n; k++) {
      if (k == 0 || k == 1 || k + 2 == n || k + 1 == n)
        printf(" %u:%u-%u", k, elpis_sched_split_begin(k), elpis_sched_split_end(total, k));
    }
    printf("\n");
  }
  for (size_t i = 0; i < sizeof MASKS / sizeof MASKS[0]; i++) {
    uint32_t depth = MASKS[i][0], mask = MASKS[i][1];
    for (int c = 0; c < 3; c++) {
      uint32_t ctx = CTXS[c];
      printf("M %u %u %u", depth, mask, ctx);
      for (uint32_t e = 0; e <= %MAXROWS%u; e++) printf(" %u", elpis_sched_anc_at(mask, e));
      printf(" |");
      for (uint32_t p = ctx > 2u ? ctx - 2u : 0u; p <= ctx + depth; p++)
        printf(" %u", elpis_sched_slot(ctx, mask, p));
      printf("\n");
    }
  }
  return 0;
}
"""


def compiled_table(
    header: Path, pairs: list[tuple[int, int]], masks: list[Mask], cc: str | None = None
) -> list[str]:
    """The table lines printed by a host build of `header` (gcc, C11, warnings as errors)."""
    source = (
        HARNESS.replace("%PAIRS%", ", ".join(f"{{{c}u, {d}u}}" for c, d in pairs))
        .replace("%MASKS%", ", ".join(f"{{{m.depth}u, {m.ancestors}u}}" for m in masks))
        .replace("%MAXROWS%", str(MAX_ROWS))
    )
    return harness_lines(header, HEADER, source, ScheduleMismatch, cc=cc, timeout=60)


def check_header(header: Path, root: Path = REPO_ROOT, cc: str | None = None) -> int:
    """Compare the compiled header with the interpreter on every table case; return the line count."""
    pairs, masks = table_cases()
    want = reference_table(root, pairs, masks)
    got = compiled_table(header, pairs, masks, cc)
    return require_same_table(HEADER, want, got, lambda i: f"{MODULE} at table line {i}", ScheduleMismatch)


def build(out_dir: Path = KERNELS_BUILD_DIR, root: Path = REPO_ROOT, cc: str | None = None) -> Path:
    """Render the header, check it against the interpreter, then move it into `out_dir` atomically."""
    root = Path(root).resolve()
    return install_checked(render(root), out_dir, HEADER, lambda tmp: check_header(tmp, root, cc))


def split_size_of(header: Path) -> int:
    """ELPIS_SCHED_SPLIT_SIZE as written in a generated header."""
    found = re.search(r"#define ELPIS_SCHED_SPLIT_SIZE (\d+)u", Path(header).read_text())
    if not found:
        raise ScheduleMismatch(f"{header}: no ELPIS_SCHED_SPLIT_SIZE")
    return int(found.group(1))
