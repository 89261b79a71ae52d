"""One way to compile a proved Bend schedule of U32 scalars into a kernel header and check it: the EXL3 GEMM's
(`elpis.bend.gemm_schedule`) and the Gated DeltaNet gate projections' (`elpis.bend.gdn_ba_schedule`).

A `ScalarHeader` names the Bend module, its jinja2 template under codegen/, the header it becomes, the prefix
of every generated name (so headers can share a translation unit), the macro stem (`<STEM>_FN` qualifies the
functions for host and device code, `<STEM>_<NAME>` carries each constant), the exported entries and the
constants. `render` compiles the program one-to-one with the acceptors' generator (`codegen.Generator`);
`compiled_table` builds a C harness around a header and prints the constants and one line per `Query`;
`reference_table` is what the Bend interpreter answers for the same queries; `check_header` compares the two
through `elpis.bend.headers`, and `build` installs the header only once that passed (by default under
build/kernels/, from this repository). Each schedule module brings its own table of queries and whatever
closed forms it checks the interpreter against, and exports its spec's `render`, `check_header`, `build` and
`constants_of` as its own (the build calls `<module>.build`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elpis.bend.check import Program, load
from elpis.bend.codegen import Generator, template_env
from elpis.bend.errors import BendError
from elpis.bend.headers import harness_lines, install_checked, require_same_table, source_digest
from elpis.bend.interp import Interpreter
from elpis.paths import BUILD_DIR, REPO_ROOT

KERNELS_BUILD_DIR = BUILD_DIR / "kernels"


class ScheduleMismatch(BendError):
    """The compiled header disagrees with the Bend interpreter (or does not compile), or the interpreter
    with the closed forms."""


@dataclass(frozen=True)
class Entry:
    """An exported C function: the Bend def it calls, how many U32 parameters it takes, one line of doc."""

    bend: str
    arity: int
    doc: str


@dataclass(frozen=True)
class Query:
    """One call of an exported function: `kind` indexes the header's entries in order; `args` are U32."""

    kind: int
    args: tuple[int, ...]


@dataclass(frozen=True)
class ScalarHeader:
    module: str  # bend/<name>.bend, relative to the repository root
    template: str  # codegen/<template>
    header: str  # the header's file name
    prefix: str  # every generated name's prefix
    stem: str  # macro stem: <stem>_FN qualifies the functions, <stem>_<CONSTANT> carries a constant
    entries: Mapping[str, Entry]  # exported C name -> entry, in the order query kinds index them
    constants: Mapping[str, str]  # constant name (lower case) -> the Bend def whose value it carries
    table: Callable[[], list[Query]]  # the queries the header is checked on
    closed_form: Callable[[Query], int | None]  # what a query must answer inside the law domain, or None
    error: type[BendError] = ScheduleMismatch
    _reference: dict[str, tuple[list[Query], list[str]]] = field(default_factory=dict, compare=False)

    # -------------------------------------------------------------------------------- the program
    def load(self, root: Path) -> Program:
        root = Path(root).resolve()
        return load(root, [root / self.module])

    def key(self, bend_name: str) -> str:
        return f"{self.module}::{bend_name}"

    def kinds(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def functions(self, root: Path) -> dict[str, Callable[..., int]]:
        """The interpreter's function for each exported C name."""
        return self._functions(Interpreter(self.load(root)))

    def _functions(self, interp: Interpreter) -> dict[str, Callable[..., int]]:
        return {c: interp.function(self.key(e.bend)) for c, e in self.entries.items()}

    def _constant_values(self, interp: Interpreter) -> dict[str, int]:
        return {name: int(interp.function(self.key(b))()) for name, b in self.constants.items()}

    # ---------------------------------------------------------------------------------- the header
    def _rename(self, code: str) -> str:
        """Give the header its own names (the generator's defs and primitive helpers) and its qualifier."""
        code = re.sub(r"\bbend_", self.prefix, code)
        code = re.sub(r"\belpis_(nat_sub|nat_min|nat_max|u32_shl|u32_shr)\(", self.prefix + r"\1(", code)
        if not code.startswith("static "):
            raise BendError("codegen: expected a static function")
        return f"{self.stem}_FN " + code[len("static ") :]

    def _c_name(self, bend_name: str) -> str:
        return f"{self.prefix}{Path(self.module).stem}_{bend_name}"

    def render(self, root: Path = REPO_ROOT) -> str:
        """The header text, compiled from the Bend program through the template."""
        root = Path(root).resolve()
        prog = self.load(root)
        gen = Generator(prog)
        for cname, e in self.entries.items():
            gen._check_entry(cname, self.key(e.bend), ("U32",) * e.arity, "U32")
        protos, bodies = gen.emit_reachable(self.key(e.bend) for e in self.entries.values())
        if gen.type_defs:
            raise BendError(f"{self.module}: the schedule must use scalars only (found records)")
        entries = []
        for cname, e in self.entries.items():
            params = [p for p, _, _ in prog.funs[self.key(e.bend)].params]
            entries.append(
                {
                    "name": cname,
                    "doc": e.doc,
                    "params": ", ".join(f"uint32_t {p}" for p in params),
                    "call": f"{self._c_name(e.bend)}({', '.join(params)})",
                }
            )
        template = template_env(root).get_template(self.template)
        return template.render(
            source=self.module,
            digest=source_digest(root, (self.module, f"codegen/{self.template}")),
            prototypes=[self._rename(protos[k]) + ";" for k in sorted(protos)],
            functions=[self._rename(bodies[k]) for k in sorted(bodies)],
            entries=entries,
            **self._constant_values(Interpreter(prog)),
        )

    # ----------------------------------------------------------------------------------- the table
    def _reference_lines(self, root: Path, queries: Sequence[Query]) -> list[str]:
        """The interpreter's table (the constants, then a line per query, as the harness prints them); where
        `closed_form` gives a value (inside the law domain) the interpreter's answer must be it."""
        interp = Interpreter(self.load(root))
        f, kinds, values = self._functions(interp), self.kinds(), self._constant_values(interp)
        lines = ["C " + " ".join(str(values[name]) for name in self.constants)]
        for q in queries:
            got = int(f[kinds[q.kind]](*q.args))
            want = self.closed_form(q)
            if want is not None and got != want:
                raise self.error(f"{self.module}: {kinds[q.kind]}{q.args} is {got}, the closed form {want}")
            lines.append(" ".join(str(v) for v in (q.kind, *q.args, got)))
        return lines

    def _harness(self, queries: Sequence[Query]) -> str:
        width = max(e.arity for e in self.entries.values())
        padded = ((q.kind, *q.args, *(0,) * (width - len(q.args))) for q in queries)
        rows = ", ".join("{" + ", ".join(f"{v}u" for v in row) + "}" for row in padded)
        fmt = " ".join(["%u"] * len(self.constants))
        macros = ", ".join(f"{self.stem}_{name.upper()}" for name in self.constants)
        cases = []
        for i, (cname, e) in enumerate(self.entries.items()):
            args = ", ".join(f"q[{1 + a}]" for a in range(e.arity))
            shown = " ".join(["%u"] * e.arity)
            call = f'printf("%u {shown} %u\\n", q[0], {args}, {cname}({args}))'
            cases.append(f"      case {i}: {call}; break;")
        return "\n".join(
            [
                "#include <stdio.h>",
                f'#include "{self.header}"',
                f"static const uint32_t QUERIES[][{1 + width}] = {{{rows}}};",
                "int main(void) {",
                f'  printf("C {fmt}\\n", {macros});',
                "  for (size_t i = 0; i < sizeof QUERIES / sizeof QUERIES[0]; i++) {",
                "    const uint32_t* q = QUERIES[i];",
                "    switch (q[0]) {",
                *cases,
                "      default: return 2;",
                "    }",
                "  }",
                "  return 0;",
                "}",
                "",
            ]
        )

    def compiled_table(self, header: Path, queries: Sequence[Query], cc: str | None = None) -> list[str]:
        """The table lines a host build of `header` prints (gcc, C11, warnings as errors)."""
        return harness_lines(header, self.header, self._harness(queries), self.error, cc=cc, timeout=60)

    def reference_table(self, root: Path) -> tuple[list[Query], list[str]]:
        """The table's queries and the interpreter's lines for them, every answer inside the law domain
        compared with `closed_form`. Cached per content of the Bend program, whichever root it is read from
        (builds of copies of the repository share it)."""
        root = Path(root).resolve()
        source = hashlib.sha256((root / self.module).read_bytes()).hexdigest()
        if source not in self._reference:
            queries = self.table()
            self._reference[source] = queries, self._reference_lines(root, queries)
        return self._reference[source]

    def check_header(self, header: Path, root: Path = REPO_ROOT, cc: str | None = None) -> int:
        """Compare the compiled header with the interpreter on every table query; return the line count."""
        queries, want = self.reference_table(root)
        got = self.compiled_table(header, queries, cc)
        kinds = self.kinds()

        def where(i: int) -> str:
            if i == 0:
                return f"{self.module} on the constants"
            q = queries[i - 1]
            return f"{self.module} at {kinds[q.kind]}{q.args}"

        return require_same_table(self.header, want, got, where, self.error)

    def build(self, out_dir: Path = KERNELS_BUILD_DIR, root: Path = REPO_ROOT, cc: str | None = None) -> Path:
        """Render the header, check it against the interpreter, then move it into `out_dir` atomically."""
        root = Path(root).resolve()
        return install_checked(
            self.render(root), out_dir, self.header, lambda tmp: self.check_header(tmp, root, cc)
        )

    def constants_of(self, header: Path) -> dict[str, int]:
        """The constants as written in a generated header."""
        text = Path(header).read_text()
        out = {}
        for name in self.constants:
            macro = f"{self.stem}_{name.upper()}"
            found = re.search(rf"#define {macro} (\d+)u", text)
            if not found:
                raise self.error(f"{header}: no {macro}")
            out[name] = int(found.group(1))
        return out
