"""Load a module graph, resolve names, type-check, check totality, and elaborate into core.

Rules enforced here (each violation is a `BendError` naming file:line:column):
- names resolve (imports are `import Base` and `import ./path.bend as M`; `M.x` names x in M);
- types: Nat, U32, Bool, List<T>, Maybe<T>, records/enums, the opaque alias (`def Tok() -> Data: U32`),
  template (`~f`) parameters of function type;
- token ids (an opaque alias) may only be copied and compared with U32.is_eq / U32.is_ne;
- matches are exhaustive and have no unreachable case; a match inspects a parameter or a
  pattern-bound variable, never a let-bound or computed value, and no let precedes a match on a
  parameter (Bend's own rule);
- recursion is direct self-recursion only (no cycles in the call graph) and structural: reading the
  arguments left to right, each is passed unchanged until one is a strictly smaller part of its
  parameter (Bend's rule);
- quantities: a variable used more than once on some path must be marked `+` (affine by default).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from elpis.bend import syntax as s
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
    Clause,
    CLet,
    CNat,
    Core,
    CPrim,
    CSucc,
    CtorInfo,
    CVar,
    DataT,
    Equation,
    FunInfo,
    FunT,
    Hyp,
    LawInfo,
    ListT,
    MaybeT,
    Opaque,
    Prim,
    Ty,
    TypeInfo,
)
from elpis.bend.errors import BendError
from elpis.bend.matching import DTree, Leaf, MatchCompiler, Split, Var
from elpis.bend.parser import parse_file
from elpis.bend.prims import EQ_OPS, OPERATORS, PRIMS

BASE_FILE = Path(__file__).with_name("base.bend")
BASE = "Base"

BUILTIN_CTORS: dict[str, list[tuple[str, int]]] = {
    "Bool": [("False", 0), ("True", 0)],
    "List": [("Nil", 0), ("Con", 2)],
    "Maybe": [("None", 0), ("Some", 1)],
}
TOKEN_RULE = "token ids ({ty}) may only be copied and compared with U32.is_eq / U32.is_ne"


@dataclass
class ProofDef:
    """A def that proves a law (`def law(..)` in the law's module or `def M.law(..)` elsewhere)."""

    law: str
    module: str
    ast: s.Def


@dataclass
class ModuleState:
    key: str
    path: Path
    ast: s.Module
    aliases: dict[str, str] = field(default_factory=dict)
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (kind, key)
    imports_base: bool = False


@dataclass
class Program:
    root: Path
    modules: dict[str, ModuleState] = field(default_factory=dict)
    types: dict[str, TypeInfo] = field(default_factory=dict)
    aliases: dict[str, Opaque] = field(default_factory=dict)
    funs: dict[str, FunInfo] = field(default_factory=dict)
    laws: dict[str, LawInfo] = field(default_factory=dict)
    proofs: dict[str, ProofDef] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # module keys, dependencies first

    # ---------------------------------------------------------- lookups used by all back ends
    def ctors_of(self, ty: Ty) -> list[CtorInfo] | None:
        match ty:
            case Prim("Nat"):
                return [CtorInfo("Nat", "Zero", ()), CtorInfo("Nat", "Succ", (("pred", NAT),))]
            case Prim("Bool"):
                return [CtorInfo("Bool", "False", ()), CtorInfo("Bool", "True", ())]
            case ListT(elem):
                return [CtorInfo("List", "Nil", ()), CtorInfo("List", "Con", (("head", elem), ("tail", ty)))]
            case MaybeT(elem):
                return [CtorInfo("Maybe", "None", ()), CtorInfo("Maybe", "Some", (("value", elem),))]
            case DataT(key):
                return self.types[key].ctors
        return None

    def module_of(self, key: str) -> str:
        return key.split("::", 1)[0]


def display_name(key: str) -> str:
    mod, name = key.split("::", 1)
    stem = Path(mod).stem if mod != BASE else BASE
    return f"{stem}.{name}" if mod != BASE else name


# ====================================================================== loading


def load(root: Path, entries: list[Path]) -> Program:
    """Parse every module reachable from `entries`, then check and elaborate all of them."""
    root = root.resolve()
    prog = Program(root)
    _load_module(prog, BASE_FILE, BASE, [])
    for entry in entries:
        _load_module(prog, entry.resolve(), _rel(root, entry.resolve()), [])
    Checker(prog).run()
    return prog


def _rel(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        raise BendError(f"{path}: module outside the repository root {root}") from None


def _load_module(prog: Program, path: Path, key: str, stack: list[str]) -> None:
    if key in stack:
        raise BendError(f"{key}: import cycle: {' -> '.join([*stack, key])}")
    if key in prog.modules:
        return
    if not path.is_file():
        raise BendError(f"{stack[-1] if stack else key}: imported module {key} does not exist")
    ast = parse_file(path, key)
    st = ModuleState(key, path, ast)
    for it in ast.items:
        if isinstance(it, s.Import):
            if it.path is None:
                st.imports_base = True
                continue
            target = (path.parent / it.path).resolve()
            tkey = _rel(prog.root, target)
            if it.alias in st.aliases:
                raise BendError(f"{it.loc}: alias {it.alias} imported twice")
            _load_module(prog, target, tkey, [*stack, key])
            st.aliases[it.alias] = tkey
    if key != BASE and not st.imports_base:
        raise BendError(f"{key}:1:1: every module must start with `import Base`")
    prog.modules[key] = st
    prog.order.append(key)


# ====================================================================== checking


class Checker:
    def __init__(self, prog: Program) -> None:
        self.prog = prog

    def run(self) -> None:
        prog = self.prog
        for key in prog.order:
            self._declare(prog.modules[key])
        for key in prog.order:
            self._resolve_types(prog.modules[key])
        for key in prog.order:
            self._signatures(prog.modules[key])
        for key in prog.order:
            self._laws(prog.modules[key])
        for key in prog.order:
            self._bodies(prog.modules[key])
        self._call_graph()

    # ---------------------------------------------------------- pass 1: names
    def _declare(self, st: ModuleState) -> None:
        if st.key == BASE:  # U32 primitives have no Bend definition, only a name
            for name in PRIMS:
                st.names.setdefault(name, ("fun", f"{BASE}::{name}"))
        for it in st.ast.items:
            if isinstance(it, s.Import):
                continue
            name = it.name
            if isinstance(it, s.Def) and self._fills_law(st, it):
                continue
            if name in st.names and not (st.key == BASE and name in PRIMS):
                raise BendError(f"{it.loc}: {name} is defined twice in {st.key}")
            key = f"{st.key}::{name}"
            if isinstance(it, s.TypeDef):
                st.names[name] = ("type", key)
                for c in it.ctors:
                    if c.name in st.names and c.name != name:
                        raise BendError(f"{c.loc}: constructor {c.name} clashes with another name")
                    st.names.setdefault(f"#ctor:{c.name}", ("ctor", key))
            elif isinstance(it, s.Law):
                st.names[name] = ("law", key)
            elif _is_alias_def(it):
                st.names[name] = ("alias", key)
            else:
                st.names[name] = ("fun", key)

    def _fills_law(self, st: ModuleState, d: s.Def) -> bool:
        """A def whose name is a law (here or via `M.name`) is that law's proof."""
        head, _, rest = d.name.partition(".")
        if rest and head in st.aliases:
            target = self.prog.modules[st.aliases[head]]
            kind = _law_names(target.ast).get(rest)
            if kind:
                return True
            raise BendError(f"{d.loc}: {d.name}: module {head} has no law {rest}")
        return d.name in _law_names(st.ast)

    # ---------------------------------------------------------- pass 2: types
    def _resolve_types(self, st: ModuleState) -> None:
        for it in st.ast.items:
            if isinstance(it, s.Def) and _is_alias_def(it):
                key = f"{st.key}::{it.name}"
                base = self.type_of(st, s.TName(it.body.tail.name, (), it.body.tail.loc), {})
                if not isinstance(base, Prim) or base == BOOL:
                    raise BendError(f"{it.loc}: an opaque alias must stand for U32 or Nat")
                self.prog.aliases[key] = Opaque(key, base)
        for it in st.ast.items:
            if isinstance(it, s.TypeDef):
                key = f"{st.key}::{it.name}"
                self.prog.types[key] = TypeInfo(key, [], str(it.loc))
        for it in st.ast.items:
            if isinstance(it, s.TypeDef):
                key = f"{st.key}::{it.name}"
                info = self.prog.types[key]
                for c in it.ctors:
                    seen = set()
                    fields = []
                    for f in c.fields:
                        if f.name in seen:
                            raise BendError(f"{f.loc}: field {f.name} repeated")
                        seen.add(f.name)
                        fty = self.type_of(st, f.ty, {})
                        if isinstance(fty, FunT):
                            raise BendError(f"{f.loc}: a data field cannot hold a function")
                        fields.append((f.name, fty))
                    info.ctors.append(CtorInfo(key, c.name, tuple(fields)))
        self._check_type_recursion()

    def _check_type_recursion(self) -> None:
        # user types must not recurse (lists and Nat are the only recursive data here)
        def refs(ty: Ty) -> set[str]:
            match ty:
                case DataT(k):
                    return {k}
                case ListT(e) | MaybeT(e):
                    return refs(e)
            return set()

        for key, info in self.prog.types.items():
            todo, seen = [key], set()
            while todo:
                k = todo.pop()
                for c in self.prog.types[k].ctors:
                    for _, fty in c.fields:
                        for r in refs(fty):
                            if r == key:
                                raise BendError(f"{info.loc}: type {display_name(key)} is recursive")
                            if r not in seen:
                                seen.add(r)
                                todo.append(r)

    def type_of(self, st: ModuleState, t: s.TArg, tvars: dict) -> Ty:
        match t:
            case s.TName(name, args):
                targs = [a for a in args if not isinstance(a, s.TQuant)]
                if name in ("Nat", "U32", "Bool"):
                    self._need_base(st, t.loc)
                    if targs:
                        raise BendError(f"{t.loc}: {name} takes no type arguments")
                    return Prim(name)
                if name in ("List", "Maybe"):
                    self._need_base(st, t.loc)
                    if len(targs) != 1:
                        raise BendError(f"{t.loc}: {name} takes one type argument")
                    elem = self.type_of(st, targs[0], tvars)
                    if isinstance(elem, FunT):
                        raise BendError(f"{t.loc}: a {name} cannot hold functions")
                    return ListT(elem) if name == "List" else MaybeT(elem)
                kind, key = self.lookup(st, name, t.loc)
                if targs:
                    raise BendError(f"{t.loc}: {name} takes no type arguments")
                if kind == "type":
                    return DataT(key)
                if kind == "alias":
                    if key not in self.prog.aliases:
                        raise BendError(f"{t.loc}: alias {name} used before its definition is resolved")
                    return self.prog.aliases[key]
                raise BendError(f"{t.loc}: {name} is not a type")
            case s.TArrow(dom, cod, None, _):
                params = [self.type_of(st, dom, tvars)]
                res = self.type_of(st, cod, tvars)
                if isinstance(res, FunT):
                    return FunT((*params, *res.params), res.result)
                return FunT(tuple(params), res)
        raise BendError(f"{getattr(t, 'loc', st.key)}: not a value type here")

    def _need_base(self, st: ModuleState, loc) -> None:
        if st.key != BASE and not st.imports_base:
            raise BendError(f"{loc}: Base names need `import Base`")

    def lookup(self, st: ModuleState, name: str, loc) -> tuple[str, str]:
        """Resolve a (possibly `Alias.`-qualified) name to (kind, global key)."""
        head, _, rest = name.partition(".")
        if rest and head in st.aliases:
            target = self.prog.modules[st.aliases[head]]
            if rest in target.names:
                return target.names[rest]
            raise BendError(f"{loc}: module {head} ({target.key}) has no {rest}")
        if name in st.names:
            return st.names[name]
        base = self.prog.modules.get(BASE)
        if base is not None and st.key != BASE and name in base.names:
            self._need_base(st, loc)
            return base.names[name]
        raise BendError(f"{loc}: unknown name {name}")

    def lookup_ctor(self, st: ModuleState, name: str, ty: Ty | None, loc) -> tuple[str, CtorInfo]:
        """Resolve a constructor name; `ty` (if known) is the expected type."""
        head, _, rest = name.partition(".")
        if ty is not None:
            for c in self.prog.ctors_of(ty) or []:
                if c.name == (rest if rest and head in st.aliases else name):
                    if rest and head in st.aliases and not c.tkey.startswith(st.aliases[head] + "::"):
                        continue
                    return c.tkey, c
        if name in ("Nil", "Con", "None", "Some", "False", "True"):
            if name in ("False", "True"):
                return "Bool", self.prog.ctors_of(BOOL)[name == "True"]
            raise BendError(
                f"{loc}: cannot tell the type of {name}{{}}; annotate it, e.g. {{{name}{{}} : List<T>}}"
            )
        mod = st
        cname = name
        if rest and head in st.aliases:
            mod = self.prog.modules[st.aliases[head]]
            cname = rest
        found = [
            c
            for k, info in self.prog.types.items()
            if k.startswith(mod.key + "::")
            for c in info.ctors
            if c.name == cname
        ]
        if len(found) != 1:
            what = "unknown" if not found else "ambiguous"
            raise BendError(f"{loc}: {what} constructor {name}")
        return found[0].tkey, found[0]

    # ---------------------------------------------------------- pass 3: signatures
    def _signatures(self, st: ModuleState) -> None:
        for it in st.ast.items:
            if not isinstance(it, s.Def) or _is_alias_def(it) or self._fills_law(st, it):
                continue
            key = f"{st.key}::{it.name}"
            params = []
            seen_plain = False
            names = set()
            for p in it.params:
                if p.ty is None:
                    raise BendError(f"{p.loc}: parameter {p.name} of {it.name} needs a type")
                if p.name in names:
                    raise BendError(f"{p.loc}: parameter {p.name} repeated")
                names.add(p.name)
                ty = self.type_of(st, p.ty, {})
                if isinstance(ty, FunT) != (p.quant == "~"):
                    raise BendError(
                        f"{p.loc}: function parameters must be templates (~{p.name}) and templates functions"
                    )
                if p.quant == "~" and seen_plain:
                    raise BendError(f"{p.loc}: template parameters come first")
                seen_plain = seen_plain or p.quant != "~"
                if p.quant == "-":
                    raise BendError(f"{p.loc}: erased parameters are not part of the subset")
                params.append((p.name, ty, p.quant))
            if it.ret is None:
                raise BendError(f"{it.loc}: def {it.name} needs a return type")
            result = self.type_of(st, it.ret, {})
            if isinstance(result, FunT):
                raise BendError(f"{it.loc}: a def cannot return a function")
            if st.key == BASE and it.name not in PRIMS:
                raise BendError(f"{it.loc}: Base def {it.name} has no primitive")
            self.prog.funs[key] = FunInfo(key, st.key, it.name, params, result, None, str(it.loc), set())

    # ---------------------------------------------------------- pass 4: laws
    def _laws(self, st: ModuleState) -> None:
        for it in st.ast.items:
            if not isinstance(it, s.Law):
                continue
            key = f"{st.key}::{it.name}"
            el = Elab(self, st, key)
            env: dict[str, Var] = {}
            clauses = []
            for c in it.clauses:
                if c.name in env:
                    raise BendError(f"{c.loc}: law variable {c.name} repeated")
                core = el.fresh(c.name)
                if isinstance(c.ty, s.TEq) or (isinstance(c.ty, s.TArrow) and c.ty.binder is not None):
                    hyp = el.hyp(c.ty, env)
                    clauses.append(Clause(core, c.name, c.quant, None, hyp))
                    env[c.name] = Var(core, BOOL, "hyp", c.quant)
                    continue
                ty = self.type_of(st, c.ty, {})
                if isinstance(ty, FunT) != (c.quant == "~"):
                    raise BendError(f"{c.loc}: function-typed law variables are templates (~{c.name})")
                clauses.append(Clause(core, c.name, c.quant, ty, None))
                env[c.name] = Var(core, ty, "law", c.quant)
            if not isinstance(it.goal, s.TEq):
                raise BendError(f"{it.goal.loc}: a law's claim must be an equation {{a == b : T}}")
            goal = el.equation(it.goal, env)
            self.prog.laws[key] = LawInfo(key, st.key, it.name, clauses, goal, str(it.loc))

    # ---------------------------------------------------------- pass 5: bodies
    def _bodies(self, st: ModuleState) -> None:
        for it in st.ast.items:
            if not isinstance(it, s.Def) or _is_alias_def(it):
                continue
            if self._fills_law(st, it):
                law_key = self._law_key(st, it)
                if law_key in self.prog.proofs:
                    raise BendError(f"{it.loc}: law {it.name} is proved twice")
                law = self.prog.laws[law_key]
                if len(it.params) != len(law.clauses):
                    raise BendError(
                        f"{it.loc}: proof of {law.name} takes {len(law.clauses)} parameter(s), "
                        f"one per `for` clause; it has {len(it.params)}"
                    )
                self.prog.proofs[law_key] = ProofDef(law_key, st.key, it)
                continue
            key = f"{st.key}::{it.name}"
            fun = self.prog.funs[key]
            el = Elab(self, st, key)
            env = {}
            for i, (name, ty, quant) in enumerate(fun.params):
                core = el.fresh(name)
                env[name] = Var(core, ty, "param", quant, (i, False))
                el.quants[core] = quant
            fun.params = [(env[n].core, ty, q) for n, ty, q in fun.params]
            fun.body = el.block(it.body, fun.result, env, seen_let=False)
            fun.calls = el.calls
            fun.descents = el.descents
            check_quantities(fun, el.quants, it.loc)

    def _law_key(self, st: ModuleState, d: s.Def) -> str:
        head, _, rest = d.name.partition(".")
        if rest and head in st.aliases:
            return f"{st.aliases[head]}::{rest}"
        return f"{st.key}::{d.name}"

    def _call_graph(self) -> None:
        funs = self.prog.funs
        state: dict[str, int] = {}

        def visit(k: str, path: list[str]) -> None:
            state[k] = 1
            for c in sorted(funs[k].calls):
                if c == k or c not in funs:
                    continue
                if state.get(c) == 1:
                    cycle = [*path[path.index(c) :], c] if c in path else [k, c]
                    raise BendError(
                        f"{funs[k].loc}: mutual recursion is not allowed: "
                        + " -> ".join(display_name(x) for x in cycle)
                    )
                if c not in state:
                    visit(c, [*path, c])
            state[k] = 2

        for k in sorted(funs):
            if k not in state:
                visit(k, [k])


def _is_alias_def(d: s.Item) -> bool:
    return (
        isinstance(d, s.Def)
        and not d.params
        and isinstance(d.ret, s.TName)
        and d.ret.name == "Data"
        and not d.body.stmts
        and isinstance(d.body.tail, s.EVar)
    )


def _law_names(m: s.Module) -> dict[str, bool]:
    return {it.name: True for it in m.items if isinstance(it, s.Law)}


# ====================================================================== expressions


class Elab:
    """Elaborates one def (or law, or proof context) into core."""

    def __init__(self, checker: Checker, st: ModuleState, owner: str) -> None:
        self.ck = checker
        self.prog = checker.prog
        self.st = st
        self.owner = owner
        self.used: set[str] = set()
        self.calls: set[str] = set()
        self.quants: dict[str, str] = {}
        self.descents: set[int] = set()
        self.counter = itertools.count(1)

    def fresh(self, base: str) -> str:
        base = base.replace(".", "_")
        name = base
        while name in self.used:
            name = f"{base}_{next(self.counter)}"
        self.used.add(name)
        return name

    def matcher(self) -> MatchCompiler:
        def resolve(name: str, ty: Ty, loc) -> str:
            return self.ck.lookup_ctor(self.st, name, ty, loc)[1].name

        return MatchCompiler(self.prog.ctors_of, resolve, self.fresh, self.st.key)

    # ---------------------------------------------------------- laws
    def hyp(self, t: s.Type, env: dict[str, Var]) -> Hyp:
        binders = []
        env = dict(env)
        while isinstance(t, s.TArrow):
            if t.binder is None:
                raise BendError(f"{t.loc}: a hypothesis is an equation, possibly under @x: A -> binders")
            ty = self.ck.type_of(self.st, t.dom, {})
            core = self.fresh(t.binder)
            binders.append((core, ty))
            env[t.binder] = Var(core, ty, "law")
            t = t.cod
        if not isinstance(t, s.TEq):
            raise BendError(f"{getattr(t, 'loc', None)}: a hypothesis must end in an equation {{a == b : T}}")
        return Hyp(tuple(binders), self.equation(t, env))

    def equation(self, t: s.TEq, env: dict[str, Var]) -> Equation:
        ty = self.ck.type_of(self.st, t.ty, {})
        lhs, _ = self.expr(t.lhs, ty, env)
        rhs, _ = self.expr(t.rhs, ty, env)
        return Equation(lhs, rhs, ty)

    # ---------------------------------------------------------- blocks
    def block(self, b: s.Block, expected: Ty, env: dict[str, Var], seen_let: bool) -> Core:
        if not b.stmts:
            return self.tail(b.tail, expected, env, seen_let)
        st, rest = b.stmts[0], s.Block(b.stmts[1:], b.tail, b.loc)
        if isinstance(st, s.SRewrite):
            raise BendError(f"{st.loc}: a rewrite (%) only belongs in a proof")
        value, ty = self.expr(st.expr, None, env)
        core = self.fresh(st.name)
        inner = dict(env)
        inner[st.name] = Var(core, ty, "let", st.quant)
        self.quants[core] = st.quant
        return CLet(core, value, self.block(rest, expected, inner, True), ty)

    def tail(self, t: s.Match | s.Expr, expected: Ty, env: dict[str, Var], seen_let: bool) -> Core:
        if isinstance(t, s.Match):
            return self.match(t, expected, env, seen_let)
        core, _ = self.expr(t, expected, env)
        return core

    def scrutinees(self, m: s.Match, env: dict[str, Var], seen_let: bool) -> list[Var]:
        out = []
        for name in m.scrutinees:
            if name not in env:
                raise BendError(f"{m.loc}: match on unknown variable {name}")
            v = env[name]
            if v.kind == "let":
                raise BendError(
                    f"{m.loc}: match inspects a parameter or a pattern variable, never a computed value "
                    f"({name} is let-bound); pass it to a helper that matches on its parameter"
                )
            if v.kind == "param" and seen_let:
                raise BendError(f"{m.loc}: a let may not precede a match on a parameter ({name})")
            if isinstance(v.ty, FunT):
                raise BendError(f"{m.loc}: cannot match on a function")
            out.append(v)
        return out

    def match(self, m: s.Match, expected: Ty, env: dict[str, Var], seen_let: bool) -> Core:
        scruts = self.scrutinees(m, env, seen_let)
        mc = self.matcher()
        cases = []
        for c in m.cases:
            if len(c.patterns) != len(scruts):
                raise BendError(
                    f"{c.loc}: case has {len(c.patterns)} pattern(s) for {len(scruts)} scrutinee(s)"
                )
            cases.append(([mc.normalise(p, v.ty) for p, v in zip(c.patterns, scruts, strict=True)], c.loc))
        tree = mc.compile(scruts, cases, m.loc)
        return self.lower_tree(tree, m, expected, env, seen_let)

    def lower_tree(self, tree: DTree, m: s.Match, expected: Ty, env: dict[str, Var], seen_let: bool) -> Core:
        if isinstance(tree, Leaf):
            inner = dict(env)
            for name, var in tree.binds.items():
                inner[name] = var
                if var.quant == "+" or var.core not in self.quants:
                    self.quants[var.core] = var.quant
            return self.block(m.cases[tree.index].body, expected, inner, seen_let)
        assert isinstance(tree, Split)
        var = tree.var
        if tree.lits:
            lits = tuple((v, self.lower_tree(t, m, expected, env, seen_let)) for v, t in tree.lits)
            default = self.lower_tree(tree.default, m, expected, env, seen_let)
            return CCase(var.core, var.ty, (), lits, default)
        branches = []
        for ctor, fields, sub in tree.branches:
            branches.append(
                Branch(ctor, tuple(f.core for f in fields), self.lower_tree(sub, m, expected, env, seen_let))
            )
        return CCase(var.core, var.ty, tuple(branches))

    # ---------------------------------------------------------- expressions
    def expect(self, actual: Ty, expected: Ty | None, loc, what: str = "expression") -> Ty:
        if expected is None or actual == expected:
            return actual
        if isinstance(actual, Opaque) or isinstance(expected, Opaque):
            tok = actual if isinstance(actual, Opaque) else expected
            raise BendError(
                f"{loc}: {what} has type {actual}, expected {expected}: {TOKEN_RULE.format(ty=tok)}"
            )
        raise BendError(f"{loc}: {what} has type {actual}, expected {expected}")

    def expr(self, e: s.Expr, expected: Ty | None, env: dict[str, Var]) -> tuple[Core, Ty]:
        match e:
            case s.EVar(name):
                if name in env:
                    v = env[name]
                    if v.kind == "hyp":
                        raise BendError(f"{e.loc}: {name} is a proof, not a value")
                    if isinstance(v.ty, FunT):
                        raise BendError(f"{e.loc}: call {name}(..) or pass it on as ~{name}")
                    return CVar(v.core), self.expect(v.ty, expected, e.loc, name)
                kind, _ = self.ck.lookup(self.st, name, e.loc)
                if kind == "fun":
                    raise BendError(
                        f"{e.loc}: {name} is a function: call it, or pass it to a template as ~{name}"
                    )
                raise BendError(f"{e.loc}: {name} is not a value")
            case s.ETemplate(name):
                raise BendError(f"{e.loc}: ~{name} only passes a template argument")
            case s.ECall(fn, args):
                return self.call(e, fn, args, expected, env)
            case s.ECtor(name, args):
                return self.ctor(e, name, args, expected, env)
            case s.ENat(value):
                return CNat(value), self.expect(NAT, expected, e.loc)
            case s.ESucc(k, arg):
                inner, _ = self.expr(arg, NAT, env)
                return CSucc(k, inner), self.expect(NAT, expected, e.loc)
            case s.EU32(value):
                if isinstance(expected, Opaque) and expected.base == U32:
                    return CU32(value), expected
                return CU32(value), self.expect(U32, expected, e.loc)
            case s.EList(items):
                elem = expected.elem if isinstance(expected, ListT) else None
                cores = []
                for it in items:
                    c, t = self.expr(it, elem, env)
                    elem = elem or t
                    cores.append(c)
                if elem is None:
                    raise BendError(f"{e.loc}: cannot tell the type of []; annotate it {{[] : List<T>}}")
                ty = self.expect(ListT(elem), expected, e.loc)
                out: Core = CCtor(ty, "Nil", ())
                for c in reversed(cores):
                    out = CCtor(ty, "Con", (c, out))
                return out, ty
            case s.ECons(head, tail):
                elem = expected.elem if isinstance(expected, ListT) else None
                h, ht = self.expr(head, elem, env)
                t, tt = self.expr(tail, ListT(ht), env)
                return CCtor(tt, "Con", (h, t)), self.expect(tt, expected, e.loc)
            case s.EOp(op, lhs, rhs, ty_ast):
                return self.operator(e, op, lhs, rhs, ty_ast, expected, env)
            case s.EAnn(inner, ty_ast):
                ty = self.ck.type_of(self.st, ty_ast, {})
                c, _ = self.expr(inner, ty, env)
                return c, self.expect(ty, expected, e.loc)
            case s.ERefl():
                raise BendError(f"{e.loc}: {{==}} is a proof, not a value")
            case s.EHole():
                raise BendError(f"{e.loc}: `_` only marks the rewrite spot in a motive")
        raise BendError(f"{getattr(e, 'loc', None)}: unsupported expression")

    def operator(self, e, op, lhs, rhs, ty_ast, expected, env) -> tuple[Core, Ty]:
        ty = self.ck.type_of(self.st, ty_ast, {})
        if isinstance(ty, Opaque):
            raise BendError(f"{e.loc}: operator {op} on {ty}: {TOKEN_RULE.format(ty=ty)}")
        table = OPERATORS.get(str(ty))
        if table is None or op not in table:
            raise BendError(f"{e.loc}: operator {op} is not defined on {ty}")
        prim = table[op]
        sig = PRIMS[prim]
        a, _ = self.expr(lhs, sig.params[0], env)
        b, _ = self.expr(rhs, sig.params[1], env)
        return CPrim(prim, (a, b)), self.expect(sig.result, expected, e.loc)

    def ctor(self, e, name, args, expected, env) -> tuple[Core, Ty]:
        tkey, info = self.ck.lookup_ctor(self.st, name, expected, e.loc)
        if len(args) != len(info.fields):
            raise BendError(f"{e.loc}: {name} takes {len(info.fields)} field(s), got {len(args)}")
        if tkey == "Maybe" and not isinstance(expected, MaybeT):
            if name.endswith("None"):
                raise BendError(f"{e.loc}: cannot tell the type of None{{}}; annotate it")
            c, t = self.expr(args[0], None, env)
            return CCtor(MaybeT(t), "Some", (c,)), MaybeT(t)
        if tkey == "List" and not isinstance(expected, ListT):
            h, ht = self.expr(args[0], None, env)
            t, tt = self.expr(args[1], ListT(ht), env)
            return CCtor(tt, "Con", (h, t)), tt
        cores = [self.expr(a, fty, env)[0] for a, (_, fty) in zip(args, info.fields, strict=True)]
        ty = expected if tkey in ("List", "Maybe") else (BOOL if tkey == "Bool" else DataT(tkey))
        return CCtor(ty, info.name, tuple(cores)), self.expect(ty, expected, e.loc)

    def call(self, e, fn, args, expected, env) -> tuple[Core, Ty]:
        if fn in env:
            v = env[fn]
            if not isinstance(v.ty, FunT):
                raise BendError(f"{e.loc}: {fn} is not a function")
            if len(args) != len(v.ty.params):
                raise BendError(f"{e.loc}: {fn} takes {len(v.ty.params)} argument(s), got {len(args)}")
            cores = [self.arg(a, t, env, False) for a, t in zip(args, v.ty.params, strict=True)]
            return CApply(v.core, tuple(cores)), self.expect(v.ty.result, expected, e.loc)
        kind, key = self.ck.lookup(self.st, fn, e.loc)
        if kind == "law":
            raise BendError(f"{e.loc}: {fn} is a law; laws are used only inside proofs")
        if kind != "fun":
            raise BendError(f"{e.loc}: {fn} is not a function")
        name = key.split("::", 1)[1]
        if key.startswith(BASE + "::") and self.st.key != BASE:
            return self.prim(e, name, args, expected, env)
        fun = self.prog.funs[key]
        if len(args) != len(fun.params):
            raise BendError(f"{e.loc}: {fn} takes {len(fun.params)} argument(s), got {len(args)}")
        cores = [self.arg(a, t, env, q == "~") for a, (_, t, q) in zip(args, fun.params, strict=True)]
        self.calls.add(key)
        if key == self.owner:
            self.check_descent(e, fn, args, env)
        return CCall(key, tuple(cores)), self.expect(fun.result, expected, e.loc)

    def arg(self, a: s.Expr, ty: Ty, env: dict[str, Var], template: bool) -> Core:
        if template != isinstance(a, s.ETemplate):
            want = "a template argument ~f" if template else "a value, not a template"
            raise BendError(f"{a.loc}: expected {want}")
        if isinstance(a, s.ETemplate):
            if a.name in env:
                v = env[a.name]
                if v.ty != ty:
                    raise BendError(f"{a.loc}: ~{a.name} has type {v.ty}, expected {ty}")
                return CVar(v.core)
            kind, key = self.ck.lookup(self.st, a.name, a.loc)
            if kind != "fun" or key.startswith(BASE + "::"):
                raise BendError(f"{a.loc}: ~{a.name} must name a template parameter or a def")
            fun = self.prog.funs[key]
            fty = FunT(tuple(t for _, t, _ in fun.params), fun.result)
            if fty != ty or any(q == "~" for _, _, q in fun.params):
                raise BendError(f"{a.loc}: ~{a.name} has type {fty}, expected {ty}")
            self.calls.add(key)
            return CGlobal(key)
        return self.expr(a, ty, env)[0]

    def prim(self, e, name, args, expected, env) -> tuple[Core, Ty]:
        sig = PRIMS[name]
        if len(args) != len(sig.params):
            raise BendError(f"{e.loc}: {name} takes {len(sig.params)} argument(s), got {len(args)}")
        if name in EQ_OPS:
            a, at = self.expr(args[0], None, env)
            b, _ = self.expr(args[1], at if isinstance(at, Opaque) else U32, env)
            if not (at == U32 or (isinstance(at, Opaque) and at.base == U32)):
                raise BendError(f"{e.loc}: {name} compares U32 values or token ids, not {at}")
            return CPrim(name, (a, b)), self.expect(BOOL, expected, e.loc)
        cores = []
        for a, t in zip(args, sig.params, strict=True):
            c, at = self.expr(a, None, env)
            if isinstance(at, Opaque):
                raise BendError(f"{a.loc}: {name} applied to {at}: {TOKEN_RULE.format(ty=at)}")
            self.expect(at, t, a.loc, f"argument of {name}")
            cores.append(c)
        return CPrim(name, tuple(cores)), self.expect(sig.result, expected, e.loc)

    def check_descent(self, e, fn: str, args: tuple, env: dict[str, Var]) -> None:
        self.descents.add(check_structural(e.loc, fn, [_arg_var(a, env) for a in args]))


def _arg_var(a: s.Expr, env: dict[str, Var]) -> Var | None:
    if isinstance(a, s.EVar | s.ETemplate) and a.name in env:
        return env[a.name]
    return None


def check_structural(loc, fn: str, args: list[Var | None]) -> int:
    """Bend's termination rule for a recursive call (see module docstring); the shrinking index."""
    for i, v in enumerate(args):
        if v is not None and v.origin == (i, False):
            continue
        if v is not None and v.origin == (i, True):
            return i
        raise BendError(
            f"{loc}: recursive call {fn}(..) is not structural: argument {i + 1} must be passed "
            "unchanged or be a strictly smaller part (from a match) of the same parameter"
        )
    raise BendError(f"{loc}: recursive call {fn}(..) passes every argument unchanged (no descent)")


# ====================================================================== quantities


def check_quantities(fun: FunInfo, quants: dict[str, str], loc) -> None:
    """Affine by default: a variable used twice on one path must be declared `+x`."""
    for name, count in sorted(_uses(fun.body, quants).items()):
        if count > 1 and quants.get(name, "") not in ("+", "~"):
            raise BendError(
                f"{loc}: in {fun.name}, {name} is used {count} times on one path; "
                f"mark it +{name} to make it reusable"
            )


def _uses(t: Core, quants: dict[str, str]) -> dict[str, int]:
    def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + v
        return out

    def join(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        out = dict(a)
        for k, v in b.items():
            out[k] = max(out.get(k, 0), v)
        return out

    match t:
        case CVar(n):
            return {n: 1}
        case CGlobal() | CNat() | CU32():
            return {}
        case CApply(fn, args):
            out = {fn: 1}
            for a in args:
                out = add(out, _uses(a, quants))
            return out
        case CCall(_, args) | CPrim(_, args) | CCtor(_, _, args):
            out: dict[str, int] = {}
            for a in args:
                out = add(out, _uses(a, quants))
            return out
        case CSucc(_, a):
            return _uses(a, quants)
        case CLet(_, v, b, _):
            return add(_uses(v, quants), _uses(b, quants))
        case CCase(sc, _, branches, lits, default):
            inner: dict[str, int] = {}
            bodies = [br.body for br in branches] + [b for _, b in lits] + ([default] if default else [])
            for b in bodies:
                inner = join(inner, _uses(b, quants))
            return add({sc: 1}, inner)
    raise TypeError(t)
