"""Generate C from the implementation modules (never from a spec), through jinja2 templates.

Only `bend/types.bend`, `bend/chain.bend`, `bend/tree.bend` and `bend/masks.bend` are loaded, so a
spec cannot leak in. Every def reachable from the exported entries is compiled one-to-one:
Nat -> uint64_t, U32 -> uint32_t, token ids -> elpis_tok, Bool -> bool, records -> structs
returned by value, a `List<T>` parameter -> a (pointer, length) slice, a `List<T>` result ->
written to a caller's buffer with the length returned. Calls in tail position of a non-recursive
def are inlined (so a list built by `x <> f(..)` is written in place). A def whose self calls are
all in tail position is emitted as `for (;;) { body }` where each self tail call becomes a parallel
assignment of the new arguments to the parameters (through temporaries) and `continue`, so the C
has no recursion there (NVVM, unlike gcc, does not do this itself; see PROOF_BOUNDARY.md). There
is no heap and no loop that Bend did not have as tail recursion.

The output is deterministic and is checked by the token scan (`cscan.py`) before it is written.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from elpis.bend import cscan
from elpis.bend.check import Program, load
from elpis.bend.core import (
    BOOL,
    CU32,
    NAT,
    U32,
    Branch,
    CApply,
    CCall,
    CCase,
    CCtor,
    CGlobal,
    CLet,
    CNat,
    Core,
    CPrim,
    CSucc,
    CVar,
    DataT,
    FunInfo,
    ListT,
    MaybeT,
    Opaque,
    Prim,
    Ty,
    free_vars,
)
from elpis.bend.errors import BendError
from elpis.paths import REPO_ROOT

IMPL_MODULES = ("bend/types.bend", "bend/chain.bend", "bend/tree.bend", "bend/masks.bend")
TEMPLATES = ("acceptors.h.j2", "acceptors.c.j2")

# template name -> (Bend def, C parameter kinds it must have, result)
ENTRIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "chain_accept": (
        "bend/chain.bend::accept",
        ("List<Tok>", "List<Tok>", "List<Tok>", "Nat"),
        "ChainDecision",
    ),
    "tree_accept": (
        "bend/tree.bend::accept",
        ("List<Nat>", "List<Tok>", "List<Tok>", "List<Tok>", "Nat"),
        "TreeDecision",
    ),
    "tree_rows": (
        "bend/tree.bend::rows",
        ("List<Nat>", "List<Tok>", "List<Tok>", "List<Tok>", "Nat"),
        "List<Nat>",
    ),
    "mask_depths": ("bend/masks.bend::depths", ("List<Nat>",), "List<Nat>"),
    "mask_ancestors": ("bend/masks.bend::ancestors", ("List<Nat>",), "List<U32>"),
}

C_PRIMS = {
    "Bool.not": "(!{0})", "Bool.and": "({0} && {1})", "Bool.or": "({0} || {1})",
    "Nat.add": "({0} + {1})", "Nat.sub": "elpis_nat_sub({0}, {1})",
    "Nat.min": "elpis_nat_min({0}, {1})", "Nat.max": "elpis_nat_max({0}, {1})",
    "Nat.is_eq": "({0} == {1})", "Nat.is_ne": "({0} != {1})", "Nat.is_lt": "({0} < {1})",
    "Nat.is_le": "({0} <= {1})", "Nat.is_gt": "({0} > {1})", "Nat.is_ge": "({0} >= {1})",
    "U32.is_eq": "({0} == {1})", "U32.is_ne": "({0} != {1})", "U32.is_lt": "({0} < {1})",
    "U32.is_le": "({0} <= {1})", "U32.is_gt": "({0} > {1})", "U32.is_ge": "({0} >= {1})",
    "U32.add": "((uint32_t)({0} + {1}))", "U32.sub": "((uint32_t)({0} - {1}))",
    "U32.mul": "((uint32_t)({0} * {1}))", "U32.and": "({0} & {1})", "U32.or": "({0} | {1})",
    "U32.xor": "({0} ^ {1})", "U32.shl": "elpis_u32_shl({0}, {1})", "U32.shr": "elpis_u32_shr({0}, {1})",
    "U32.to_nat": "((uint64_t){0})", "U32.from_nat": "((uint32_t){0})",
}  # fmt: skip


def load_impl(root: Path) -> Program:
    return load(root, [root / m for m in IMPL_MODULES])


def generate(out_dir: Path, root: Path = REPO_ROOT) -> list[Path]:
    """Write acceptors.h and acceptors.c into out_dir; return their paths."""
    root = Path(root).resolve()
    header, source = render(root)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "acceptors.h", out_dir / "acceptors.c"]
    paths[0].write_text(header)
    paths[1].write_text(source)
    return paths


def template_env(root: Path) -> Environment:
    """The jinja2 environment every generated C text is rendered in (the templates of `root`/codegen/)."""
    return Environment(
        loader=FileSystemLoader(str(root / "codegen")),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(root: Path) -> tuple[str, str]:
    prog = load_impl(root)
    gen = Generator(prog)
    context = gen.build()
    sources = list(IMPL_MODULES)
    digest = hashlib.sha256()
    for m in sources:
        digest.update(m.encode() + b"\0" + (root / m).read_bytes())
    for name in TEMPLATES:
        digest.update(name.encode() + b"\0" + (root / "codegen" / name).read_bytes())
    env = template_env(root)
    context.update(sources=sources, digest=digest.hexdigest())
    header = env.get_template("acceptors.h.j2").render(**context)
    source = env.get_template("acceptors.c.j2").render(**context)
    problems = cscan.scan(source, "acceptors.c")
    if problems:
        raise BendError("codegen: the generated C breaks the token discipline:\n  " + "\n  ".join(problems))
    return header, source


def check_generated(path: Path) -> list[str]:
    """Token-scan a generated C file (the build re-runs this on what it compiles)."""
    return cscan.scan(Path(path).read_text(), Path(path).name)


# ====================================================================== generator


def _short(key: str) -> str:
    mod, name = key.split("::", 1)
    return f"bend_{Path(mod).stem}_{name.replace('.', '_')}"


@dataclass
class CVarInfo:
    cname: str
    ty: Ty


class Generator:
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.types: dict[Ty, str] = {}
        self.type_defs: list[tuple[str, str]] = []

    # ---------------------------------------------------------- types
    def ctype(self, ty: Ty) -> str:
        match ty:
            case Prim("Nat"):
                return "uint64_t"
            case Prim("U32"):
                return "uint32_t"
            case Prim("Bool"):
                return "bool"
            case Opaque(_, base):
                if base != U32:
                    raise BendError(f"codegen: opaque alias over {base} is not supported")
                return cscan.TOKEN_TYPE
            case DataT(key):
                return self._struct(ty, _short(key))
            case MaybeT(elem):
                return self._struct(ty, f"bend_maybe_{self.ctype(elem)}")
        raise BendError(f"codegen: no C type for {ty} here")

    def _struct(self, ty: Ty, name: str) -> str:
        if ty in self.types:
            return self.types[ty]
        self.types[ty] = name
        ctors = self.prog.ctors_of(ty)
        lines = ["typedef struct {"]
        if len(ctors) > 1:
            lines.append("  uint32_t tag;")
        for c in ctors:
            for fname, fty in c.fields:
                if isinstance(fty, ListT):
                    raise BendError(f"codegen: {ty} holds a list; records must hold scalars")
                lines.append(f"  {self.ctype(fty)} {self._field(ty, c.name, fname)};")
        if len(lines) == 1:
            lines.append("  uint32_t tag;")
        lines.append(f"}} {name};")
        self.type_defs.append((name, "\n".join(lines)))
        return name

    def _field(self, ty: Ty, ctor: str, field: str) -> str:
        return field if len(self.prog.ctors_of(ty)) == 1 else f"{ctor}_{field}"

    def _tag(self, ty: Ty, ctor: str) -> int:
        return [c.name for c in self.prog.ctors_of(ty)].index(ctor)

    # ---------------------------------------------------------- functions
    def build(self) -> dict:
        entries = {name: spec[0] for name, spec in ENTRIES.items()}
        for name, (key, kinds, result) in ENTRIES.items():
            self._check_entry(name, key, kinds, result)
        protos, emitted = self.emit_reachable(entries.values())
        ctx = {
            "types": [d for _, d in self.type_defs],
            "prototypes": [protos[k] + ";" for k in sorted(protos)],
            "functions": [emitted[k] for k in sorted(emitted)],
            "chain_decision": self.ctype(self.prog.funs[entries["chain_accept"]].result),
            "tree_decision": self.ctype(self.prog.funs[entries["tree_accept"]].result),
        }
        ctx.update({name: _short(key) for name, key in entries.items()})
        return ctx

    def emit_reachable(self, keys: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
        """The prototype and the definition, by key, of every def reachable from `keys`."""
        emitted: dict[str, str] = {}
        protos: dict[str, str] = {}
        todo = sorted(set(keys))
        while todo:
            key = todo.pop()
            if key in emitted:
                continue
            fn = FnEmitter(self, self.prog.funs[key])
            protos[key], emitted[key] = fn.emit()
            todo.extend(sorted(c for c in fn.called if c not in emitted))
        return protos, emitted

    def _check_entry(self, name: str, key: str, kinds: tuple[str, ...], result: str) -> None:
        fun = self.prog.funs.get(key)
        if fun is None:
            raise BendError(f"codegen: entry {name} needs def {key}")
        got = tuple(str(t) for _, t, _ in fun.params)
        if got != kinds or str(fun.result) != result:
            raise BendError(
                f"codegen: {key} has signature {got} -> {fun.result}; "
                f"the C template expects {kinds} -> {result}"
            )

    def recursive(self, key: str) -> bool:
        return key in self.prog.funs[key].calls


class FnEmitter:
    def __init__(self, gen: Generator, fun: FunInfo, loop: bool = False) -> None:
        self.gen = gen
        self.fun = fun
        self.loop = loop  # self tail calls become `continue` (see emit)
        self.self_call_left = False  # a self call the loop form could not take (not in tail position)
        self.params: list[tuple[str, Ty]] = []  # (C name, type) of each parameter, in order
        self.acc: str | None = None  # the operator folded into `acc` (loop form only)
        self.lines: list[str] = []
        self.vars: dict[str, CVarInfo] = {}
        self.called: set[str] = set()
        self.counter = itertools.count(1)
        self.used: set[str] = set()

    def emit(self) -> tuple[str, str]:
        """The prototype and definition; a def whose self calls are all tail calls becomes a loop."""
        if self.gen.recursive(self.fun.key):
            looped = FnEmitter(self.gen, self.fun, loop=True)
            proto, text = looped.emit_once()
            if not looped.self_call_left:
                self.called = looped.called
                return proto, text
        return self.emit_once()

    def emit_once(self) -> tuple[str, str]:
        fun = self.fun
        if fun.body is None:
            raise BendError(f"codegen: {fun.name} has no body")
        params = []
        for name, ty, quant in fun.params:
            if quant == "~":
                raise BendError(f"{fun.loc}: codegen: template parameters are not compiled")
            cname = self._bind(name, ty)
            self.params.append((cname, ty))
            params.extend(self._param_decl(cname, ty))
        result = fun.result
        if isinstance(result, ListT):
            params.append(f"{self.gen.ctype(result.elem)} *out")
            ret = "uint32_t"
            ctx = ("list", "out", "0")
        else:
            ret = self.gen.ctype(result)
            ctx = ("ret",)
        proto = f"static {ret} {_short(fun.key)}({', '.join(params) or 'void'})"
        if self.loop:
            # the parameters are the loop variables; a list result counts what earlier turns wrote,
            # and `a OP f(..)` for an associative OP with a unit folds `a` into an accumulator
            if ctx[0] == "list":
                self._line(1, "uint32_t written = 0;")
            self.acc = _accumulated(fun.body, fun.key)
            if self.acc is not None:
                self._line(1, f"{ret} acc = {ACCUMULATORS[self.acc]};")
            self._line(1, "for (;;) {")
            self.tail(fun.body, ctx, 2)
            self._line(1, "}")
        else:
            self.tail(fun.body, ctx, 1)
        body = "\n".join(self.lines)
        return proto, f"{proto} {{\n{body}\n}}\n"

    def _param_decl(self, cname: str, ty: Ty) -> list[str]:
        if isinstance(ty, ListT):
            return [f"const {self.gen.ctype(ty.elem)} *{cname}", f"uint32_t {cname}_len"]
        return [f"{self.gen.ctype(ty)} {cname}"]

    def _bind(self, name: str, ty: Ty) -> str:
        base = "v_" + "".join(ch if ch.isalnum() else "_" for ch in name)
        cname = base
        while cname in self.used:
            cname = f"{base}_{next(self.counter)}"
        self.used.add(cname)
        self.vars[name] = CVarInfo(cname, ty)
        return cname

    def _line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    # ---------------------------------------------------------- statements
    def tail(self, t: Core, ctx: tuple, depth: int) -> None:
        if isinstance(t, CLet):
            t = _sink(t)
        match t:
            case CLet(name, value, CVar(used), _) if used == name:  # `let x = e; x` is `e`
                self.tail(value, ctx, depth)
                return
            case CCall(key, args) if self.loop and key == self.fun.key:
                self._again(args, ctx, depth)
                return
            case CPrim("Bool.or" | "Bool.and" as op, (first, CCall(key, _) as second)) if (
                self.loop and key == self.fun.key and ctx[0] == "ret"
            ):
                # pure and total: `a || f(..)` is `a ? true : f(..)`, a self call in tail position
                test = self.expr(first) if op == "Bool.or" else f"!({self.expr(first)})"
                self._line(depth, f"if ({test}) {{")
                self._line(depth + 1, f"return {'true' if op == 'Bool.or' else 'false'};")
                self._line(depth, "}")
                self.tail(second, ctx, depth)
                return
            case CPrim(op, (first, CCall(key, _) as second)) if (
                self.loop and key == self.fun.key and op == self.acc and ctx[0] == "ret"
            ):
                self._line(depth, f"acc = {C_PRIMS[op].format('acc', self.expr(first))};")
                self.tail(second, ctx, depth)
                return
            case CLet(name, value, body, ty):
                if name in free_vars(body):  # an unused let is dropped (pure code)
                    self._let(name, value, ty, depth)
                self.tail(body, ctx, depth)
                return
            case CCase():
                self._case(t, ctx, depth)
                return
            case CCall(key, args) if not self.gen.recursive(key):
                self.tail(self._inline(key, args), ctx, depth)
                return
        if ctx[0] == "ret":
            value = self.expr(t)
            if self.acc is not None:
                value = C_PRIMS[self.acc].format("acc", value)
            self._line(depth, f"return {value};")
            return
        self._list_tail(t, ctx, depth)

    def _again(self, args: tuple[Core, ...], ctx: tuple, depth: int) -> None:
        """A self tail call in the loop form: the parameters take the arguments' values, all
        computed before any is assigned (a parallel assignment), then the next turn starts."""
        if len(args) != len(self.params):
            raise BendError(f"{self.fun.loc}: codegen: self call with {len(args)} arguments")
        moves: list[tuple[str, str]] = []
        for (cname, ty), arg in zip(self.params, args, strict=True):
            if isinstance(ty, ListT):
                if not isinstance(arg, CVar):
                    raise BendError(f"{self.fun.loc}: codegen: list argument must be a list variable")
                src = self.vars[arg.name].cname
                if src != cname:
                    elem = self.gen.ctype(ty.elem)
                    self._line(depth, f"const {elem} *next_{cname} = {src};")
                    self._line(depth, f"uint32_t next_{cname}_len = {src}_len;")
                    moves += [(cname, f"next_{cname}"), (f"{cname}_len", f"next_{cname}_len")]
                continue
            code = self.expr(arg)
            if code != cname:
                self._line(depth, f"{self.gen.ctype(ty)} next_{cname} = {code};")
                moves.append((cname, f"next_{cname}"))
        for target, source in moves:
            self._line(depth, f"{target} = {source};")
        if ctx[0] == "list" and ctx[2] != "0":
            self._line(depth, f"out += {ctx[2]};")
            self._line(depth, f"written += {ctx[2]};")
        self._line(depth, "continue;")

    def _list_tail(self, t: Core, ctx: tuple, depth: int) -> None:
        _, out, off = ctx
        match t:
            case CCtor(_, "Nil", ()):
                self._line(depth, f"return {self._written(off)};")
            case CCtor(_, "Con", (head, rest)):
                self._line(depth, f"{out}[{off}] = {self.expr(head)};")
                self.tail(rest, ("list", out, _plus(off, 1)), depth)
            case CCall(key, args):
                call = self._call(key, args, extra=f"{out} + {off}" if off != "0" else out)
                done = self._written(off)
                self._line(depth, f"return {call};" if done == "0" else f"return {done} + {call};")
            case CVar(name):
                v = self.vars[name]
                self._line(
                    depth, f"for (uint32_t i = 0; i < {v.cname}_len; i++) {out}[{off} + i] = {v.cname}[i];"
                )
                self._line(depth, f"return {self._written(off)} + {v.cname}_len;")
            case _:
                raise BendError(f"{self.fun.loc}: codegen: cannot build a list from {type(t).__name__} here")

    def _written(self, off: str) -> str:
        if not self.loop:
            return off
        return "written" if off == "0" else f"written + {off}"

    def _let(self, name: str, value: Core, ty: Ty | None, depth: int) -> None:
        if ty is None:
            raise BendError(f"{self.fun.loc}: codegen: let {name} has no recorded type")
        if isinstance(ty, ListT):
            if not isinstance(value, CVar):
                raise BendError(f"{self.fun.loc}: codegen: a let-bound list must be a slice of another list")
            src = self.vars[value.name]
            cname = self._bind(name, ty)
            self._line(depth, f"const {self.gen.ctype(ty.elem)} *{cname} = {src.cname};")
            self._line(depth, f"uint32_t {cname}_len = {src.cname}_len;")
            return
        code = self.expr(value)
        cname = self._bind(name, ty)
        self._line(depth, f"{self.gen.ctype(ty)} {cname} = {code};")

    def _case(self, t: CCase, ctx: tuple, depth: int) -> None:
        v = self.vars[t.scrut]
        if t.lits:
            first = True
            for lit, body in t.lits:
                self._line(depth, f"{'if' if first else '} else if'} ({v.cname} == UINT32_C({lit})) {{")
                self.tail(body, ctx, depth + 1)
                first = False
            self._line(depth, "} else {")
            self.tail(t.default, ctx, depth + 1)
            self._line(depth, "}")
            return
        branches = {b.ctor: b for b in t.branches}
        ty = t.ty
        if ty == NAT:
            self._line(depth, f"if ({v.cname} == 0) {{")
            self.tail(branches["Zero"].body, ctx, depth + 1)
            self._line(depth, "} else {")
            succ = branches["Succ"]
            if succ.binders[0] in free_vars(succ.body):
                pred = self._bind(succ.binders[0], NAT)
                self._line(depth + 1, f"uint64_t {pred} = {v.cname} - 1;")
            self.tail(succ.body, ctx, depth + 1)
            self._line(depth, "}")
        elif ty == BOOL:
            self._line(depth, f"if ({v.cname}) {{")
            self.tail(branches["True"].body, ctx, depth + 1)
            self._line(depth, "} else {")
            self.tail(branches["False"].body, ctx, depth + 1)
            self._line(depth, "}")
        elif isinstance(ty, ListT):
            self._line(depth, f"if ({v.cname}_len == 0) {{")
            self.tail(branches["Nil"].body, ctx, depth + 1)
            self._line(depth, "} else {")
            head, rest = branches["Con"].binders
            used = free_vars(branches["Con"].body)
            if head in used:
                h = self._bind(head, ty.elem)
                self._line(depth + 1, f"{self.gen.ctype(ty.elem)} {h} = {v.cname}[0];")
            if rest in used:
                r = self._bind(rest, ty)
                self._line(depth + 1, f"const {self.gen.ctype(ty.elem)} *{r} = {v.cname} + 1;")
                self._line(depth + 1, f"uint32_t {r}_len = {v.cname}_len - 1;")
            self.tail(branches["Con"].body, ctx, depth + 1)
            self._line(depth, "}")
        elif isinstance(ty, DataT | MaybeT):
            ctors = self.gen.prog.ctors_of(ty)
            single = len(ctors) == 1
            if not single:
                self._line(depth, f"switch ({v.cname}.tag) {{")
            for k, c in enumerate(ctors):
                br = branches[c.name]
                inner = depth if single else depth + 1
                if not single:
                    label = "default" if k == len(ctors) - 1 else f"case {k}"
                    self._line(depth, f"{label}: {{ /* {c.name} */")
                used = free_vars(br.body)
                for binder, (fname, fty) in zip(br.binders, c.fields, strict=True):
                    if binder not in used:
                        continue
                    b = self._bind(binder, fty)
                    self._line(
                        inner, f"{self.gen.ctype(fty)} {b} = {v.cname}.{self.gen._field(ty, c.name, fname)};"
                    )
                self.tail(br.body, ctx, inner)
                if not single:
                    self._line(depth, "}")
            if not single:
                self._line(depth, "}")
        else:
            raise BendError(f"{self.fun.loc}: codegen: cannot match on {ty}")

    def _inline(self, key: str, args: tuple[Core, ...]) -> Core:
        """The body of non-recursive def `key` with its parameters bound to `args`."""
        callee = self.gen.prog.funs[key]
        self.called.discard(key)
        ren: dict[str, str] = {}

        def fresh(name: str) -> str:
            new = f"{name}__i{next(self.counter)}"
            ren[name] = new
            return new

        subst: dict[str, Core] = {}
        lets: list[tuple[str, Core, Ty]] = []
        for (pname, pty, _), arg in zip(callee.params, args, strict=True):
            if isinstance(pty, ListT) and not isinstance(arg, CVar):
                subst[pname] = arg  # a list built by the caller: substituted, written in place
            else:
                lets.append((fresh(pname), arg, pty))
        body = _rename(callee.body, ren, subst, fresh)
        for name, arg, ty in reversed(lets):
            body = CLet(name, arg, body, ty)
        return body

    # ---------------------------------------------------------- expressions
    def expr(self, t: Core) -> str:
        match t:
            case CVar(name):
                v = self.vars[name]
                if isinstance(v.ty, ListT):
                    raise BendError(f"{self.fun.loc}: codegen: list {name} used as a value")
                return v.cname
            case CNat(value):
                return f"UINT64_C({value})"
            case CU32(value):
                return f"UINT32_C({value})"
            case CSucc(k, arg):
                return f"({self.expr(arg)} + {k}u)"
            case CPrim(op, args):
                return C_PRIMS[op].format(*[self.expr(a) for a in args])
            case CCall(key, args):
                if isinstance(self.gen.prog.funs[key].result, ListT):
                    raise BendError(f"{self.fun.loc}: codegen: a list-valued call must be in tail position")
                return self._call(key, args)
            case CCtor(ty, ctor, args):
                if ty == BOOL:
                    return "true" if ctor == "True" else "false"
                if isinstance(ty, ListT):
                    raise BendError(f"{self.fun.loc}: codegen: lists are built only in tail position")
                cname = self.gen.ctype(ty)
                ctors = self.gen.prog.ctors_of(ty)
                info = next(c for c in ctors if c.name == ctor)
                parts = [
                    f".{self.gen._field(ty, ctor, f)} = {self.expr(a)}"
                    for (f, _), a in zip(info.fields, args, strict=True)
                ]
                if len(ctors) > 1 or not parts:
                    parts.insert(0, f".tag = {self.gen._tag(ty, ctor)}")
                return f"(({cname}){{{', '.join(parts)}}})"
            case CApply() | CGlobal():
                raise BendError(f"{self.fun.loc}: codegen: templates are not compiled")
            case CLet() | CCase():
                raise BendError(f"{self.fun.loc}: codegen: a match or let in argument position")
        raise BendError(f"{self.fun.loc}: codegen: unsupported {t!r}")

    def _call(self, key: str, args: tuple[Core, ...], extra: str | None = None) -> str:
        callee = self.gen.prog.funs[key]
        self.called.add(key)
        if key == self.fun.key:
            self.self_call_left = True
        parts = []
        for (_, pty, _), a in zip(callee.params, args, strict=True):
            if isinstance(pty, ListT):
                if not isinstance(a, CVar):
                    raise BendError(
                        f"{self.fun.loc}: codegen: list argument must be a list variable (a slice)"
                    )
                v = self.vars[a.name]
                parts += [v.cname, f"{v.cname}_len"]
            else:
                parts.append(self.expr(a))
        if extra is not None:
            parts.append(extra)
        return f"{_short(key)}({', '.join(parts)})"


# Operators `a OP f(..)` may fold into an accumulator: associative (so acc OP (a OP r) =
# (acc OP a) OP r, also in C's wrapping uint64_t arithmetic) with the given unit as acc's start.
ACCUMULATORS = {"Nat.add": "UINT64_C(0)", "U32.or": "UINT32_C(0)"}


def _accumulated(body: Core, key: str) -> str | None:
    """The one accumulator operator applied as `a OP key(..)` in body, if there is exactly one."""
    ops: set[str] = set()

    def walk(t: Core) -> None:
        match t:
            case CPrim(op, (_, CCall(k, _))) if k == key and op in ACCUMULATORS:
                ops.add(op)
        for child in _children(t):
            walk(child)

    walk(body)
    return ops.pop() if len(ops) == 1 else None


def _children(t: Core) -> list[Core]:
    match t:
        case CSucc(_, a):
            return [a]
        case CPrim(_, args) | CCall(_, args) | CApply(_, args) | CCtor(_, _, args):
            return list(args)
        case CLet(_, v, b, _):
            return [v, b]
        case CCase(_, _, branches, lits, default):
            return [br.body for br in branches] + [b for _, b in lits] + ([default] if default else [])
    return []


def _sink(t: Core) -> Core:
    """Move each let into the only branch that uses it (pure code: evaluation order is free).

    This is what makes the compiled chain lazy: the later rows' decision is computed only on the
    branch that returns it.
    """
    if not isinstance(t, CLet):
        return t
    body = _sink(t.body)
    name = t.name
    if name not in free_vars(body):
        return body
    if isinstance(body, CLet) and name not in free_vars(body.value):
        return CLet(body.name, body.value, _sink(CLet(name, t.value, body.body, t.ty)), body.ty)
    if isinstance(body, CCase) and body.scrut != name:
        arms = [br.body for br in body.branches] + [b for _, b in body.lits]
        if body.default is not None:
            arms.append(body.default)
        users = [i for i, a in enumerate(arms) if name in free_vars(a)]
        if len(users) == 1:
            k = users[0]
            moved = _sink(CLet(name, t.value, arms[k], t.ty))
            nb = len(body.branches)
            if k < nb:
                br = body.branches[k]
                branches = list(body.branches)
                branches[k] = Branch(br.ctor, br.binders, moved)
                return CCase(body.scrut, body.ty, tuple(branches), body.lits, body.default)
            if k < nb + len(body.lits):
                lits = list(body.lits)
                lits[k - nb] = (lits[k - nb][0], moved)
                return CCase(body.scrut, body.ty, body.branches, tuple(lits), body.default)
            return CCase(body.scrut, body.ty, body.branches, body.lits, moved)
    return CLet(name, t.value, body, t.ty)


def _plus(off: str, k: int) -> str:
    return str(int(off) + k) if off.isdigit() else f"{off} + {k}"


def _rename(t: Core, ren: dict[str, str], subst: dict[str, Core], fresh) -> Core:
    """Copy a callee body with every binder renamed (no capture) and list parameters substituted."""
    match t:
        case CVar(n):
            if n in subst:
                return subst[n]
            return CVar(ren.get(n, n))
        case CNat() | CU32() | CGlobal():
            return t
        case CSucc(k, a):
            return CSucc(k, _rename(a, ren, subst, fresh))
        case CPrim(op, args):
            return CPrim(op, tuple(_rename(a, ren, subst, fresh) for a in args))
        case CCall(key, args):
            return CCall(key, tuple(_rename(a, ren, subst, fresh) for a in args))
        case CApply(fn, args):
            return CApply(ren.get(fn, fn), tuple(_rename(a, ren, subst, fresh) for a in args))
        case CCtor(ty, ctor, args):
            return CCtor(ty, ctor, tuple(_rename(a, ren, subst, fresh) for a in args))
        case CLet(n, v, b, ty):
            value = _rename(v, ren, subst, fresh)
            return CLet(fresh(n), value, _rename(b, ren, subst, fresh), ty)
        case CCase(sc, ty, branches, lits, default):
            if sc in subst:
                raise BendError("codegen: cannot inline a match on a list built by the caller")
            scrut = ren.get(sc, sc)
            new_branches = []
            for br in branches:
                binders = tuple(fresh(b) for b in br.binders)
                new_branches.append(Branch(br.ctor, binders, _rename(br.body, ren, subst, fresh)))
            new_lits = tuple((v, _rename(b, ren, subst, fresh)) for v, b in lits)
            new_default = None if default is None else _rename(default, ren, subst, fresh)
            return CCase(scrut, ty, tuple(new_branches), new_lits, new_default)
    raise BendError(f"codegen: cannot copy {t!r}")
