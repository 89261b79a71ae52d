"""The Gated DeltaNet tree plan: compile `bend/gdn_plan.bend` to a C header and check it.

`render(root)` writes the text of `gdn_plan.h`: every def reachable from the plan's entries, compiled
one-to-one by the acceptors' generator (`codegen.FnEmitter`), plus the entry `elpis_gdn_plan` of the
jinja2 template `codegen/gdn_plan.h.j2` (patches/kernels/gdn_tree.cu includes the header).
`check_header(header, root)` builds a harness around the header with the host C compiler and compares
its plan with the Bend interpreter's on every table tree (`table_trees()`), through the shared harness
of `elpis.bend.headers`; the interpreter's plan is also replayed by `walk_errors` (each row visited
once, after its parent, from its parent's state, no slot overwritten while needed, within the kernel's
slots, taps on the row's own path). Any difference or violation is a PlanMismatch (fail closed).
`build(out_dir, root)` writes the header only once it passes.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from elpis.bend.check import Program, load
from elpis.bend.codegen import Generator, template_env
from elpis.bend.errors import BendError
from elpis.bend.headers import harness_lines, install_checked, require_same_table, source_digest
from elpis.bend.interp import Interpreter
from elpis.paths import BUILD_DIR, REPO_ROOT

MODULE = "bend/gdn_plan.bend"
MASKS = "bend/masks.bend"
TEMPLATE = "gdn_plan.h.j2"
HEADER = "gdn_plan.h"
KERNELS_BUILD_DIR = BUILD_DIR / "kernels"
MAX_ROWS = 16
WINDOW = 16  # a tap code >= WINDOW is a committed conv-window column (code - WINDOW)

# template name -> (Bend def, parameter types, result type)
ENTRIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "ancestors": (f"{MASKS}::ancestors", ("List<Nat>",), "List<U32>"),
    "sizes": (f"{MODULE}::sizes", ("List<U32>",), "List<Nat>"),
    "pos": (f"{MODULE}::pos", ("List<Nat>", "List<Nat>", "Nat"), "Nat"),
    "load_code": (f"{MODULE}::load_code", ("List<Nat>", "List<Nat>", "Nat"), "Nat"),
    "store_code": (f"{MODULE}::store_code", ("List<Nat>", "List<Nat>", "Nat"), "Nat"),
    "tap": (f"{MODULE}::tap", ("List<Nat>", "Nat", "Nat"), "Nat"),
}
CONSTANTS = {"slots": f"{MODULE}::stack_slots", "taps": f"{MODULE}::conv_taps"}


class PlanMismatch(BendError):
    """The compiled plan disagrees with the Bend interpreter, or a plan breaks the walk's rules."""


@dataclass(frozen=True)
class Plan:
    """A tree's plan: per visit the row, its load slot and store slot (-1: registers / none), per row
    the 4 tap codes (a row, or WINDOW + committed column), and the number of stack slots used."""

    order: tuple[int, ...]
    load: tuple[int, ...]
    store: tuple[int, ...]
    taps: tuple[tuple[int, ...], ...]
    slots: int

    def line(self) -> str:
        taps = " ".join(",".join(map(str, t)) for t in self.taps)
        return f"{self.slots} | {' '.join(map(str, self.order))} | {' '.join(map(str, self.load))} | " + (
            f"{' '.join(map(str, self.store))} | {taps}"
        )


def load_plan(root: Path = REPO_ROOT) -> Program:
    root = Path(root).resolve()
    return load(root, [root / MODULE])


def _rename(code: str) -> str:
    """Give the header its own names, so it can sit next to the acceptors' C in one unit, and the qualifier
    that makes every function host C, or under nvcc host and device code (the round's plan kernel,
    patches/kernels/round_plan.cu, packs a tree's plan on the GPU)."""
    if not code.startswith("static "):
        raise BendError("codegen: expected a static function")
    code = "ELPIS_GDNP_FN " + code[len("static ") :]
    code = re.sub(r"\bbend_", "elpis_gdnp_", code)
    return re.sub(r"\belpis_(nat_sub|nat_min|nat_max|u32_shl|u32_shr)\(", r"elpis_gdnp_\1(", code)


def _c_name(key: str) -> str:
    module, name = key.split("::")
    return f"elpis_gdnp_{Path(module).stem}_{name.replace('.', '_')}"


def render(root: Path = REPO_ROOT) -> str:
    """The header text, compiled from the Bend program."""
    root = Path(root).resolve()
    prog = load_plan(root)
    gen = Generator(prog)
    for name, (key, kinds, result) in ENTRIES.items():
        gen._check_entry(name, key, kinds, result)
    protos, bodies = gen.emit_reachable(key for key, _, _ in ENTRIES.values())
    if gen.type_defs:
        raise BendError(f"{MODULE}: the plan must use scalars and lists only (found records)")
    interp = Interpreter(prog)
    constants = {name: int(interp.function(key)()) for name, key in CONSTANTS.items()}
    template = template_env(root).get_template(TEMPLATE)
    return template.render(
        source=MODULE,
        digest=source_digest(root, (MODULE, MASKS, "bend/verify_schedule.bend", f"codegen/{TEMPLATE}")),
        max_rows=MAX_ROWS,
        prototypes=[_rename(protos[k]) + ";" for k in sorted(protos)],
        functions=[_rename(bodies[k]) for k in sorted(bodies)],
        **{name: _c_name(key) for name, (key, _, _) in ENTRIES.items()},
        **constants,
    )


# ====================================================================== the interpreter's plan


class Planner:
    """The plan of a tree by the Bend interpreter (the reference the header is checked against)."""

    def __init__(self, root: Path = REPO_ROOT) -> None:
        interp = Interpreter(load_plan(root))
        self.f: dict[str, Callable] = {name: interp.function(key) for name, (key, _, _) in ENTRIES.items()}
        self.slots_available = int(interp.function(CONSTANTS["slots"])())
        self.taps = int(interp.function(CONSTANTS["taps"])())

    def plan(self, parents: Sequence[int]) -> Plan:
        """`parents` as the acceptor takes them (parents[0] == -1)."""
        ps = tuple(0 if p < 0 else int(p) for p in parents)
        n = len(ps)
        sizes = self.f["sizes"](self.f["ancestors"](ps))
        order, load, store = [-1] * n, [0] * n, [0] * n
        for r in range(n):
            v = int(self.f["pos"](ps, sizes, r))
            if not 0 <= v < n or order[v] >= 0:
                raise PlanMismatch(f"tree {list(parents)}: visit index {v} of row {r} is not a free visit")
            order[v] = r
            load[v] = int(self.f["load_code"](ps, sizes, r)) - 1
            store[v] = int(self.f["store_code"](ps, sizes, r)) - 1
        taps = tuple(tuple(int(self.f["tap"](ps, r, j)) for j in range(self.taps)) for r in range(n))
        return Plan(tuple(order), tuple(load), tuple(store), taps, max(store) + 1)


def walk_errors(parents: Sequence[int], plan: Plan, slots: int, taps: int = 4) -> list[str]:
    """Replay `plan` on the tree with row ids for states: what breaks the kernel's rules (empty: none)."""
    n = len(parents)
    errors: list[str] = []
    committed = -1
    regs = committed
    stack: dict[int, int] = {}
    seen: set[int] = set()
    if sorted(plan.order) != list(range(n)):
        return [f"visits {plan.order} are not the rows 0..{n - 1} once each"]
    for visit, r in enumerate(plan.order):
        p = parents[r] if r > 0 else committed
        if r > 0 and p not in seen:
            errors.append(f"row {r} visited before its parent {p}")
        if plan.load[visit] >= slots or plan.store[visit] >= slots:
            errors.append(f"visit {visit} uses a slot beyond the {slots} the kernel has")
        start = regs if plan.load[visit] < 0 else stack.get(plan.load[visit], "empty")
        if start != p:
            errors.append(f"row {r} starts from {start}, not from its parent {p}")
        seen.add(r)
        regs = r
        if plan.store[visit] >= 0:
            held = stack.get(plan.store[visit])
            if held is not None and any(parents[c] == held and c not in seen for c in range(1, n)):
                errors.append(f"row {r} overwrites slot {plan.store[visit]} while row {held} is still needed")
            stack[plan.store[visit]] = r
    for r in range(n):
        path = [r]
        while path[-1] > 0:
            path.append(parents[path[-1]])
        path.reverse()
        d = len(path) - 1
        e0 = d - (taps - 1)  # depth read by tap 0; below the root: committed column taps + e
        want = tuple(path[e0 + j] if e0 + j >= 0 else WINDOW + taps + e0 + j for j in range(taps))
        if plan.taps[r] != want:
            errors.append(f"row {r} taps {plan.taps[r]}, its path gives {want}")
    return errors


# ====================================================================== table trees


def every_tree(rows: int) -> list[list[int]]:
    """Every legal parent list of `rows` rows (parents[r] < r)."""
    return [[-1, *c] for c in itertools.product(*[range(r) for r in range(1, rows)])]


def shapes(rows: int) -> list[list[int]]:
    """One parent list per rooted tree shape of `rows` rows (rows numbered in depth-first preorder,
    children in the order of their canonical codes)."""

    def grow(n: int) -> set[str]:
        # canonical codes "(" + sorted child codes + ")" of every shape with n rows
        if n == 1:
            return {"()"}
        out = set()
        for kids in _partitions(n - 1):
            for combo in itertools.product(*[sorted(grow(k)) for k in kids]):
                out.add("(" + "".join(sorted(combo)) + ")")
        return out

    return [_parents_of(code) for code in sorted(grow(rows))]


def _partitions(n: int, largest: int | None = None) -> list[list[int]]:
    largest = n if largest is None else largest
    if n == 0:
        return [[]]
    return [[k, *rest] for k in range(min(n, largest), 0, -1) for rest in _partitions(n - k, k)]


def _parents_of(code: str) -> list[int]:
    parents: list[int] = []
    open_rows: list[int] = []
    for ch in code:
        if ch == "(":
            parents.append(open_rows[-1] if open_rows else -1)
            open_rows.append(len(parents) - 1)
        else:
            open_rows.pop()
    return parents


def table_trees(seed: int = 9, sampled: int = 48) -> list[list[int]]:
    """Every legal tree of up to 6 rows, every rooted tree shape of 7 and 8 rows, both numberings of
    a shape's children (preorder and reversed), and `sampled` seeded random trees of 16 rows plus the
    16-row trees that need every slot."""
    trees = [t for rows in range(1, 7) for t in every_tree(rows)]
    for rows in (7, 8):
        for t in shapes(rows):
            trees.append(t)
            trees.append(_renumbered_reversed(t))
    rng = random.Random(seed)
    trees += [[-1] + [rng.randrange(r) for r in range(1, MAX_ROWS)] for _ in range(sampled)]
    deep = [[-1] + [rng.randrange(max(0, r - 3), r) for r in range(1, MAX_ROWS)] for _ in range(sampled // 4)]
    trees += deep
    trees.append([-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14])  # needs all 3 slots
    trees.append([-1] + [(r - 1) // 2 for r in range(1, 15)] + [7])
    trees.append([-1] + [0] * 15)
    trees.append([-1, *range(15)])
    return [list(t) for t in dict.fromkeys(tuple(t) for t in trees)]


def _renumbered_reversed(parents: list[int]) -> list[int]:
    """The same shape numbered in preorder with each row's children taken last to first."""
    n = len(parents)
    kids: dict[int, list[int]] = {r: [] for r in range(n)}
    for r in range(1, n):
        kids[parents[r]].append(r)
    order, todo = [], [0]
    while todo:
        r = todo.pop()
        order.append(r)
        todo.extend(kids[r])  # popped last-first: reversed child order
    index = {r: i for i, r in enumerate(order)}
    return [-1] + [index[parents[r]] for r in order[1:]]


# ====================================================================== the check


HARNESS = r"""
#include <stdio.h>
#include "gdn_plan.h"

static const int32_t TREES[][17] = {%TREES%};

int main(void) {
  for (size_t i = 0; i < sizeof TREES / sizeof TREES[0]; i++) {
    uint32_t rows = (uint32_t)TREES[i][0];
    uint64_t parents[16];
    for (uint32_t r = 0; r < 16; r++) parents[r] = 0xDEADu;  /* unused slots must not be read */
    for (uint32_t r = 0; r < rows; r++) parents[r] = TREES[i][1 + r] < 0 ? 0u : (uint64_t)TREES[i][1 + r];
    int32_t order[16], load[16], store[16];
    uint32_t taps[16][4];
    int used = elpis_gdn_plan(rows, parents, order, load, store, taps);
    if (used < 0) { printf("E %d\n", used); continue; }
    printf("%d |", used);
    for (uint32_t v = 0; v < rows; v++) printf(" %d", order[v]);
    printf(" |");
    for (uint32_t v = 0; v < rows; v++) printf(" %d", load[v]);
    printf(" |");
    for (uint32_t v = 0; v < rows; v++) printf(" %d", store[v]);
    printf(" |");
    for (uint32_t r = 0; r < rows; r++)
      printf(" %u,%u,%u,%u", taps[r][0], taps[r][1], taps[r][2], taps[r][3]);
    printf("\n");
  }
  return 0;
}
"""


def compiled_table(header: Path, trees: list[list[int]], cc: str | None = None) -> list[str]:
    """The plan lines printed by a host build of `header` (C11, warnings as errors)."""
    rows = ", ".join("{" + ", ".join(map(str, [len(t), *t, *[0] * (MAX_ROWS - len(t))])) + "}" for t in trees)
    return harness_lines(header, HEADER, HARNESS.replace("%TREES%", rows), PlanMismatch, cc=cc, timeout=120)


def reference_table(root: Path = REPO_ROOT) -> tuple[list[list[int]], list[str]]:
    """The table trees and the interpreter's plan line for each, every plan replayed (PlanMismatch on a
    broken walk). Cached per content of the Bend sources it reads (the interpreter takes ~20 s)."""
    root = Path(root).resolve()
    key = hashlib.sha256()
    for rel in (MODULE, MASKS, "bend/verify_schedule.bend"):
        key.update((root / rel).read_bytes())
    return _reference_table(str(root), key.hexdigest())


@lru_cache(maxsize=4)
def _reference_table(root: str, _sources: str) -> tuple[list[list[int]], list[str]]:
    trees = table_trees()
    planner = Planner(Path(root))
    want = []
    for parents in trees:
        plan = planner.plan(parents)
        errors = walk_errors(parents, plan, planner.slots_available, planner.taps)
        if errors:
            raise PlanMismatch(f"{MODULE} breaks the walk on tree {parents}: {'; '.join(errors)}")
        want.append(plan.line())
    return trees, want


def check_header(header: Path, root: Path = REPO_ROOT, cc: str | None = None) -> int:
    """Compare the compiled header with the interpreter on every table tree, and replay every plan;
    return the number of trees."""
    trees, want = reference_table(root)
    got = compiled_table(header, trees, cc)
    return require_same_table(HEADER, want, got, lambda i: f"{MODULE} on tree {trees[i]}", PlanMismatch)


def build(out_dir: Path = KERNELS_BUILD_DIR, root: Path = REPO_ROOT, cc: str | None = None) -> Path:
    """Render the header, check it, then move it into `out_dir` atomically."""
    root = Path(root).resolve()
    return install_checked(render(root), out_dir, HEADER, lambda tmp: check_header(tmp, root, cc))
