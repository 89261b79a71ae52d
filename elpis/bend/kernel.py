"""The proof kernel: checks a Bend proof (a def filling a law) against the law.

Logic: quantifier-free equational reasoning about total functions over inductive data, with case
analysis and structural induction (Boyer-Moore style). Soundness rests on:

- conversion: both sides of an equation are normalised by evaluation. A call unfolds only when its
  body's case splits reduce on constructors (so normal forms have no binders and compare
  structurally); primitives compute on literals. Every def is total (checked), so its defining
  equations are true;
- `%e : P` (Bend's rewrite): if e proves a == b and the goal is P[_ := b] (up to conversion), the
  goal becomes P[_ := a];
- `match x` on a variable: one branch per constructor, x replaced by the constructor applied to
  fresh variables in the goal and in every hypothesis (exhaustive by construction);
- `match h:` with no cases on a hypothesis whose sides normalise to different constructors or
  literals: the branch cannot happen (constructors are disjoint);
- a call to a law instantiates it (its hypotheses must be proved by the arguments); a call to the
  law being proved is the induction hypothesis and must pass Bend's structural rule on the law's
  value arguments; laws may use each other only without cycles (checked in `prove.py`).

There are no other rules: no axioms, no holes (`?` is not in the grammar).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from elpis.bend import syntax as s
from elpis.bend.check import BASE, Checker, Elab, Program, check_structural
from elpis.bend.core import (
    BOOL,
    CU32,
    NAT,
    U32,
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
    Equation,
    Hyp,
    LawInfo,
    ListT,
    Opaque,
    Prim,
    Ty,
)
from elpis.bend.errors import BendError
from elpis.bend.matching import Leaf, Split, Var
from elpis.bend.prims import PRIMS

MAX_STEPS = 2_000_000


class Stuck(Exception):
    pass


# ====================================================================== normalisation


class Normaliser:
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise BendError("kernel: normalisation exceeded its step budget")

    def norm(self, t: Core) -> Core:
        self.tick()
        match t:
            case CVar() | CNat() | CU32() | CGlobal():
                return t
            case CSucc(k, a):
                return _succ(k, self.norm(a))
            case CCtor(ty, ctor, args):
                return CCtor(ty, ctor, tuple(self.norm(a) for a in args))
            case CApply(fn, args):
                return CApply(fn, tuple(self.norm(a) for a in args))
            case CPrim(op, args):
                return self.prim(op, tuple(self.norm(a) for a in args))
            case CCall(key, args):
                return self.call(key, tuple(self.norm(a) for a in args))
        raise BendError(f"kernel: cannot normalise {t!r}")

    def prim(self, op: str, args: tuple[Core, ...]) -> Core:
        lits = [_literal(a) for a in args]
        if all(v is not None for v in lits):
            out = PRIMS[op].fn(*lits)
            return _value(out, PRIMS[op].result)
        base_key = f"{BASE}::{op}"
        if base_key in self.prog.funs and self.prog.funs[base_key].body is not None:
            return self.call(base_key, args, folded=CPrim(op, args))
        return CPrim(op, args)

    def call(self, key: str, args: tuple[Core, ...], folded: Core | None = None) -> Core:
        fun = self.prog.funs[key]
        if folded is None and key.startswith(BASE + "::"):
            folded = CPrim(key.split("::", 1)[1], args)  # one normal form for Base calls
        env = {name: a for (name, _, _), a in zip(fun.params, args, strict=True)}
        try:
            return self.run(fun.body, env)
        except Stuck:
            return folded if folded is not None else CCall(key, args)

    def run(self, t: Core, env: dict[str, Core]) -> Core:
        """Evaluate a def body whose variables are bound to normal forms in env."""
        while True:
            self.tick()
            match t:
                case CLet(name, value, body, _):
                    env = dict(env)
                    env[name] = self.norm(_subst(value, env))
                    t = body
                    continue
                case CCase():
                    t, env = self.select(t, env)
                    continue
            return self.norm(_subst(t, env))

    def select(self, t: CCase, env: dict[str, Core]) -> tuple[Core, dict[str, Core]]:
        v = env.get(t.scrut, CVar(t.scrut))
        if t.lits:
            lit = _literal(v)
            if lit is None:
                raise Stuck
            for value, body in t.lits:
                if value == lit:
                    return body, env
            return t.default, env
        ctor, fields = destruct(v)
        if ctor is None:
            raise Stuck
        for br in t.branches:
            if br.ctor == ctor:
                inner = dict(env)
                inner.update(zip(br.binders, fields, strict=True))
                return br.body, inner
        raise BendError(f"kernel: no branch for {ctor}")


def destruct(v: Core) -> tuple[str | None, tuple[Core, ...]]:
    """The constructor a normal form is headed by, and its fields (None if not a constructor)."""
    match v:
        case CNat(0):
            return "Zero", ()
        case CNat(n):
            return "Succ", (CNat(n - 1),)
        case CSucc(k, a):
            return "Succ", (_succ(k - 1, a),)
        case CCtor(_, ctor, args):
            return ctor, args
    return None, ()


def _succ(k: int, a: Core) -> Core:
    if k == 0:
        return a
    match a:
        case CNat(n):
            return CNat(n + k)
        case CSucc(j, inner):
            return CSucc(k + j, inner)
    return CSucc(k, a)


def _literal(v: Core) -> object:
    match v:
        case CNat(n) | CU32(n):
            return n
        case CCtor(ty, ctor, ()) if ty == BOOL:
            return ctor == "True"
    return None


def _value(out: object, ty: Ty) -> Core:
    if ty == BOOL:
        return CCtor(BOOL, "True" if out else "False", ())
    if ty == NAT:
        return CNat(out)
    return CU32(out)


def _subst(t: Core, env: dict[str, Core]) -> Core:
    """Substitute variables in a binder-free term (leaf expressions of def bodies, goals)."""
    match t:
        case CVar(n):
            return env.get(n, t)
        case CNat() | CU32() | CGlobal():
            return t
        case CSucc(k, a):
            return CSucc(k, _subst(a, env))
        case CCtor(ty, ctor, args):
            return CCtor(ty, ctor, tuple(_subst(a, env) for a in args))
        case CApply(fn, args):
            new_args = tuple(_subst(a, env) for a in args)
            target = env.get(fn)
            if isinstance(target, CGlobal):
                return CCall(target.key, new_args)
            if isinstance(target, CVar):
                return CApply(target.name, new_args)
            return CApply(fn, new_args)
        case CPrim(op, args):
            return CPrim(op, tuple(_subst(a, env) for a in args))
        case CCall(key, args):
            return CCall(key, tuple(_subst(a, env) for a in args))
    raise BendError(f"kernel: unexpected binder in a term: {t!r}")


def show(t: Core) -> str:
    match t:
        case CVar(n):
            return n
        case CNat(n):
            return f"{n}n"
        case CU32(n):
            return str(n)
        case CSucc(k, a):
            return f"{k}n+{show(a)}"
        case CCtor(ty, ctor, args):
            if isinstance(ty, ListT):
                items, rest = [], t
                while isinstance(rest, CCtor) and rest.ctor == "Con":
                    items.append(show(rest.args[0]))
                    rest = rest.args[1]
                if isinstance(rest, CCtor):
                    return f"[{', '.join(items)}]"
                return " <> ".join([*items, show(rest)])
            return f"{ctor}{{{', '.join(show(a) for a in args)}}}"
        case CApply(fn, args):
            return f"{fn}({', '.join(show(a) for a in args)})"
        case CPrim(op, args):
            return f"{op}({', '.join(show(a) for a in args)})"
        case CCall(key, args):
            mod, name = key.split("::", 1)
            stem = mod.rsplit("/", 1)[-1].removesuffix(".bend")
            return f"{stem}.{name}({', '.join(show(a) for a in args)})"
        case CGlobal(key):
            return f"~{key.split('::', 1)[1]}"
    return repr(t)


# ====================================================================== proof checking


@dataclass
class Ctx:
    """What a proof step sees: value variables (as terms) and hypotheses (as equations)."""

    values: dict[str, tuple[Core, Ty, tuple[int, bool] | None]] = field(default_factory=dict)
    hyps: dict[str, Hyp] = field(default_factory=dict)
    solved: dict[str, Core] = field(default_factory=dict)  # variable -> the term a case split made it

    def copy(self) -> Ctx:
        return Ctx(dict(self.values), dict(self.hyps), dict(self.solved))

    def substitute(self, var: str, term: Core) -> Ctx:
        env = {var: term}
        values = {n: (_subst(t, env), ty, o) for n, (t, ty, o) in self.values.items()}
        hyps = {n: _subst_hyp(h, env) for n, h in self.hyps.items()}
        solved = {n: _subst(t, env) for n, t in self.solved.items()}
        solved[var] = term
        return Ctx(values, hyps, solved)

    def current(self, var: str) -> Core:
        return self.solved.get(var, CVar(var))


def _subst_hyp(h: Hyp, env: dict[str, Core]) -> Hyp:
    inner = {k: v for k, v in env.items() if k not in {b for b, _ in h.binders}}
    eq = h.eq
    return Hyp(h.binders, Equation(_subst(eq.lhs, inner), _subst(eq.rhs, inner), eq.ty))


class ProofChecker:
    def __init__(self, prog: Program, law_key: str) -> None:
        self.prog = prog
        self.law = prog.laws[law_key]
        self.proof = prog.proofs[law_key]
        self.checker = Checker(prog)
        self.module = prog.modules[self.proof.module]
        self.norm = Normaliser(prog)
        self.fresh_ids = itertools.count(1)
        self.uses: set[str] = set()
        self.steps = 0

    def fresh(self, base: str) -> str:
        return f"{base.split('#')[0]}#{next(self.fresh_ids)}"

    # ---------------------------------------------------------- entry
    def run(self) -> dict:
        law = self.law
        d = self.proof.ast
        ctx = Ctx()
        rename: dict[str, Core] = {}
        value_index = 0
        for clause, param in zip(law.clauses, d.params, strict=True):
            if clause.hyp is None:
                name = self.fresh(param.name)
                rename[clause.name] = CVar(name)
                ctx.values[param.name] = (CVar(name), clause.ty, (value_index, False))
                value_index += 1
            else:
                ctx.hyps[param.name] = _subst_hyp(clause.hyp, rename)
        self.arg_order = [c.name for c in law.clauses if c.hyp is None]
        goal = Equation(_subst(law.goal.lhs, rename), _subst(law.goal.rhs, rename), law.goal.ty)
        self.block(d.body, goal, ctx)
        return {
            "law": law.name,
            "module": law.module,
            "location": law.loc,
            "method": "kernel",
            "proof": f"{self.proof.module}:{d.loc.line if d.loc else 0}",
            "uses": sorted(self.uses),
            "steps": self.steps,
            "reductions": self.norm.steps,
        }

    def fail(self, loc, msg: str) -> BendError:
        return BendError(f"{loc or self.proof.module}: proof of {self.law.name}: {msg}")

    # ---------------------------------------------------------- blocks
    def block(self, b: s.Block, goal: Equation, ctx: Ctx) -> None:
        self.steps += 1
        for st in b.stmts:
            if isinstance(st, s.SLet):
                term, ty = self.term(st.expr, None, ctx)
                ctx = ctx.copy()
                ctx.values[st.name] = (term, ty, None)
                continue
            goal = self.rewrite(st, goal, ctx)
        if isinstance(b.tail, s.Match):
            self.match(b.tail, goal, ctx)
            return
        self.conclude(b.tail, goal, ctx)

    def rewrite(self, st: s.SRewrite, goal: Equation, ctx: Ctx) -> Equation:
        proved = self.infer(st.proof, ctx)
        if not isinstance(st.motive, s.TEq):
            raise self.fail(st.loc, "a rewrite motive must be an equation {.. == .. : T}")
        hole = self.fresh("hole")
        inner = ctx.copy()
        inner.values["__hole__"] = (CVar(hole), proved.ty, None)
        motive = self.equation(_fill_holes(st.motive), inner)
        if motive.ty != goal.ty:
            raise self.fail(st.loc, f"motive has type {motive.ty}, the goal {goal.ty}")
        at_b = Equation(
            _subst(motive.lhs, {hole: proved.rhs}), _subst(motive.rhs, {hole: proved.rhs}), goal.ty
        )
        self.convertible(at_b, goal, st.loc, "the motive with `_` := the rewritten side is not the goal")
        return Equation(
            _subst(motive.lhs, {hole: proved.lhs}), _subst(motive.rhs, {hole: proved.lhs}), goal.ty
        )

    def conclude(self, e: s.Expr, goal: Equation, ctx: Ctx) -> None:
        if isinstance(e, s.ERefl):
            lhs, rhs = self.norm.norm(goal.lhs), self.norm.norm(goal.rhs)
            if lhs != rhs:
                raise self.fail(
                    e.loc,
                    f"{{==}} does not hold: the sides compute to\n    {show(lhs)}\n  and\n    {show(rhs)}",
                )
            return
        proved = self.infer(e, ctx)
        if proved.ty != goal.ty:
            raise self.fail(e.loc, f"proves an equation of type {proved.ty}, the goal has type {goal.ty}")
        self.convertible(proved, goal, e.loc, "does not prove the goal")

    def convertible(self, a: Equation, b: Equation, loc, what: str) -> None:
        for x, y, side in ((a.lhs, b.lhs, "left"), (a.rhs, b.rhs, "right")):
            nx, ny = self.norm.norm(x), self.norm.norm(y)
            if nx != ny:
                raise self.fail(loc, f"{what}: {side} sides differ:\n    {show(nx)}\n  vs\n    {show(ny)}")

    # ---------------------------------------------------------- case analysis
    def match(self, m: s.Match, goal: Equation, ctx: Ctx) -> None:
        if len(m.scrutinees) == 1 and m.scrutinees[0] in ctx.hyps:
            self.clash(m, ctx.hyps[m.scrutinees[0]], m.scrutinees[0])
            return
        scruts: list[Var] = []
        for name in m.scrutinees:
            if name not in ctx.values:
                raise self.fail(m.loc, f"match on unknown variable {name}")
            term, ty, origin = ctx.values[name]
            if not isinstance(term, CVar):
                raise self.fail(m.loc, f"{name} is already known to be {show(term)}; match on a variable")
            scruts.append(Var(term.name, ty, "law", "", origin))
        el = Elab(self.checker, self.module, self.law.key)
        el.fresh = self.fresh  # type: ignore[method-assign]
        mc = el.matcher()
        cases = []
        for c in m.cases:
            if len(c.patterns) != len(scruts):
                raise self.fail(c.loc, "case has the wrong number of patterns")
            cases.append(([mc.normalise(p, v.ty) for p, v in zip(c.patterns, scruts, strict=True)], c.loc))
        tree = mc.compile(scruts, cases, m.loc)
        self.walk(tree, m, goal, ctx)

    def walk(self, tree, m: s.Match, goal: Equation, ctx: Ctx) -> None:
        if isinstance(tree, Leaf):
            inner = ctx.copy()
            for name, var in tree.binds.items():
                inner.values[name] = (ctx.current(var.core), var.ty, var.origin)
            self.block(m.cases[tree.index].body, goal, inner)
            return
        assert isinstance(tree, Split)
        var = tree.var
        if tree.lits:
            raise self.fail(m.loc, "case analysis on U32 literals is not a proof step")
        for ctor, fields, sub in tree.branches:
            term = self.ctor_term(var.ty, ctor, [CVar(f.core) for f in fields])
            env = {var.core: term}
            new_goal = Equation(_subst(goal.lhs, env), _subst(goal.rhs, env), goal.ty)
            inner = ctx.substitute(var.core, term)
            for f in fields:
                inner.values[f"#field:{f.core}"] = (CVar(f.core), f.ty, f.origin)
            self.walk(sub, m, new_goal, inner)

    def ctor_term(self, ty: Ty, ctor: str, fields: list[Core]) -> Core:
        if ty == NAT:
            return CNat(0) if ctor == "Zero" else CSucc(1, fields[0])
        return CCtor(ty, ctor, tuple(fields))

    def clash(self, m: s.Match, h: Hyp, name: str) -> None:
        if m.cases:
            raise self.fail(
                m.loc, f"{name} is a hypothesis: only `match {name}:` with no cases (a clash) applies"
            )
        if h.binders:
            raise self.fail(m.loc, f"{name} is quantified; instantiate it first")
        lhs, rhs = self.norm.norm(h.eq.lhs), self.norm.norm(h.eq.rhs)
        (c1, _), (c2, _) = destruct(lhs), destruct(rhs)
        l1, l2 = _literal(lhs), _literal(rhs)
        if c1 is not None and c2 is not None and c1 != c2:
            return
        if l1 is not None and l2 is not None and l1 != l2:
            return
        raise self.fail(m.loc, f"no clash: {name} equates {show(lhs)} and {show(rhs)}")

    # ---------------------------------------------------------- proof terms
    def infer(self, e: s.Expr, ctx: Ctx) -> Equation:
        """The equation a proof expression proves."""
        match e:
            case s.EVar(name):
                if name in ctx.hyps:
                    h = ctx.hyps[name]
                    if h.binders:
                        raise self.fail(e.loc, f"{name} is quantified; apply it to arguments")
                    return h.eq
                return self.instantiate(e, name, (), ctx)
            case s.ECall(fn, args):
                if fn in ctx.hyps:
                    return self.apply_hyp(e, fn, args, ctx)
                return self.instantiate(e, fn, args, ctx)
        raise self.fail(
            getattr(e, "loc", None), "not a proof: expected a hypothesis, a law applied to arguments, or {==}"
        )

    def check_proof(self, e: s.Expr, expected: Equation, ctx: Ctx) -> None:
        if isinstance(e, s.ERefl):
            self.convertible(
                Equation(expected.lhs, expected.lhs, expected.ty),
                expected,
                e.loc,
                "{==} does not prove this hypothesis",
            )
            return
        proved = self.infer(e, ctx)
        self.convertible(proved, expected, e.loc, "argument does not prove the required hypothesis")

    def apply_hyp(self, e: s.ECall, name: str, args: tuple, ctx: Ctx) -> Equation:
        h = ctx.hyps[name]
        if len(args) != len(h.binders):
            raise self.fail(e.loc, f"{name} takes {len(h.binders)} argument(s)")
        env = {}
        for a, (b, ty) in zip(args, h.binders, strict=True):
            env[b], _ = self.term(a, ty, ctx)
        return Equation(_subst(h.eq.lhs, env), _subst(h.eq.rhs, env), h.eq.ty)

    def instantiate(self, e: s.Expr, fn: str, args: tuple, ctx: Ctx) -> Equation:
        law = self.lookup_law(e, fn)
        if len(args) != len(law.clauses):
            raise self.fail(e.loc, f"law {law.name} takes {len(law.clauses)} argument(s), got {len(args)}")
        env: dict[str, Core] = {}
        value_args = []
        for a, clause in zip(args, law.clauses, strict=True):
            if clause.hyp is None:
                term, _ = self.term(a, clause.ty, ctx)
                env[clause.name] = term
                value_args.append(term)
                continue
            hyp = _subst_hyp(clause.hyp, env)
            if hyp.binders:
                self.check_quantified(a, hyp, ctx, law)
                continue
            self.check_proof(a, hyp.eq, ctx)
        if law.key == self.law.key:
            self.induction(e, value_args, ctx)
        else:
            self.uses.add(law.key)
        return Equation(_subst(law.goal.lhs, env), _subst(law.goal.rhs, env), law.goal.ty)

    def check_quantified(self, a: s.Expr, expected: Hyp, ctx: Ctx, law: LawInfo) -> None:
        if not (isinstance(a, s.EVar) and a.name in ctx.hyps):
            raise self.fail(a.loc, f"law {law.name} needs a quantified hypothesis here; pass one of yours")
        given = ctx.hyps[a.name]
        if len(given.binders) != len(expected.binders):
            raise self.fail(a.loc, f"{a.name} does not match the quantified hypothesis of {law.name}")
        ren = {}
        for (gb, gty), (eb, ety) in zip(given.binders, expected.binders, strict=True):
            if gty != ety:
                raise self.fail(a.loc, f"{a.name}: binder types differ ({gty} vs {ety})")
            ren[eb] = CVar(gb)
        exp_eq = Equation(_subst(expected.eq.lhs, ren), _subst(expected.eq.rhs, ren), expected.eq.ty)
        self.convertible(given.eq, exp_eq, a.loc, f"{a.name} is not the hypothesis {law.name} needs")

    def induction(self, e: s.Expr, value_args: list[Core], ctx: Ctx) -> None:
        by_term = {}
        for _, (term, ty, origin) in ctx.values.items():
            if isinstance(term, CVar) and origin is not None:
                by_term[term.name] = Var(term.name, ty, "law", "", origin)
        check_structural(
            e.loc, self.law.name, [by_term.get(a.name) if isinstance(a, CVar) else None for a in value_args]
        )

    def lookup_law(self, e: s.Expr, fn: str) -> LawInfo:
        try:
            kind, key = self.checker.lookup(self.module, fn, e.loc)
        except BendError:
            kind, key = "", ""
        if kind == "law":
            return self.prog.laws[key]
        if fn == self.proof.ast.name:
            return self.law
        raise self.fail(e.loc, f"{fn} is not a law or a hypothesis")

    # ---------------------------------------------------------- terms
    def term(self, e: s.Expr, expected: Ty | None, ctx: Ctx) -> tuple[Core, Ty]:
        """Elaborate a value expression in the proof context, as a term over the context."""
        if isinstance(e, s.ETemplate):
            if e.name in ctx.values and _is_fun(ctx.values[e.name][1]):
                term, ty, _ = ctx.values[e.name]
                if expected is not None and ty != expected:
                    raise self.fail(e.loc, f"~{e.name} has type {ty}, expected {expected}")
                return term, ty
            el = Elab(self.checker, self.module, self.law.key)
            return el.arg(e, expected, {}, True), expected
        el = Elab(self.checker, self.module, self.law.key)
        env: dict[str, Var] = {}
        subst: dict[str, Core] = {}
        for name, (term, ty, _) in ctx.values.items():
            if name.startswith("#field:"):
                continue
            placeholder = f"%{name}"
            env[name] = Var(placeholder, ty, "law", "~" if _is_fun(ty) else "")
            subst[placeholder] = term
        core, ty = el.expr(e, expected, env)
        return _subst_fun(core, subst), ty

    def equation(self, t: s.TEq, ctx: Ctx) -> Equation:
        ty = self.checker.type_of(self.module, t.ty, {})
        lhs, _ = self.term(t.lhs, ty, ctx)
        rhs, _ = self.term(t.rhs, ty, ctx)
        return Equation(lhs, rhs, ty)


def _is_fun(ty: Ty) -> bool:
    from elpis.bend.core import FunT

    return isinstance(ty, FunT)


def _subst_fun(t: Core, env: dict[str, Core]) -> Core:
    return _subst(t, env)


def _fill_holes(t: s.TEq) -> s.TEq:
    """Replace `_` in a motive by the variable `__hole__`."""

    def go(e: s.Expr) -> s.Expr:
        match e:
            case s.EHole():
                return s.EVar("__hole__", e.loc)
            case s.ECall(fn, args):
                return s.ECall(fn, tuple(go(a) for a in args), e.loc)
            case s.ECtor(name, args):
                return s.ECtor(name, tuple(go(a) for a in args), e.loc)
            case s.ESucc(k, a):
                return s.ESucc(k, go(a), e.loc)
            case s.EList(items):
                return s.EList(tuple(go(a) for a in items), e.loc)
            case s.ECons(h, tl):
                return s.ECons(go(h), go(tl), e.loc)
            case s.EOp(op, a, b, ty):
                return s.EOp(op, go(a), go(b), ty, e.loc)
            case s.EAnn(inner, ty):
                return s.EAnn(go(inner), ty, e.loc)
        return e

    return s.TEq(go(t.lhs), go(t.rhs), t.ty, t.loc)


def check_proof(prog: Program, law_key: str) -> dict:
    return ProofChecker(prog, law_key).run()


__all__ = ["U32", "CCase", "ListT", "Opaque", "Prim", "check_proof"]
