"""Symbolic evaluation of core into z3 terms.

Values: Nat is a Python int or `SNat` (z3 Int with a known interval), U32 and token ids are z3
32-bit vectors, Bool is a Python bool or a z3 Bool, data (lists, Maybe, records, enums) is `SData`
(one guarded alternative per constructor, fields merged with if-then-else), and a value whose shape
is unknown (an unbounded list) is `SOpaque`: a z3 term of the type's datatype sort.

Matching on an `SOpaque` value raises `Stuck`; the innermost enclosing call is then replaced by an
uninterpreted function of its (injectively encoded) arguments. That is sound: every total function
is one interpretation of the uninterpreted symbol, so what z3 proves for all interpretations holds
for the real one. Function-typed law variables are uninterpreted functions too.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from elpis.bend.check import Program
from elpis.bend.core import (
    BOOL,
    CU32,
    NAT,
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
    FunT,
    ListT,
    MaybeT,
    Opaque,
    Prim,
    Ty,
)
from elpis.bend.errors import BendError
from elpis.bend.prims import PRIMS

MAX_DEPTH = 600


class Stuck(Exception):
    """A match on a value of unknown shape."""


@dataclass(frozen=True)
class SNat:
    e: z3.ArithRef
    lo: int
    hi: int | None


@dataclass(frozen=True)
class SData:
    alts: tuple[tuple[object, str, tuple], ...]  # (guard: True | z3 Bool, ctor, fields)
    ty: Ty


@dataclass(frozen=True)
class SOpaque:
    term: z3.ExprRef
    ty: Ty


@dataclass(frozen=True)
class SFun:
    decl: z3.FuncDeclRef
    ty: FunT


@dataclass(frozen=True)
class SDef:
    key: str


@dataclass(frozen=True)
class SLambda:
    """A template variable defined by a hypothesis (vacuity witnesses only)."""

    params: tuple[str, ...]
    body: object
    env: dict


def is_true(g: object) -> bool:
    # Constants are kept as Python bools (see `_decided`), so a z3 term here is never constant.
    return g is True


def is_false(g: object) -> bool:
    return g is False


def to_bool(b: object) -> z3.BoolRef:
    return z3.BoolVal(b) if isinstance(b, bool) else b


def nat_term(v: object) -> z3.ArithRef:
    return z3.IntVal(v) if isinstance(v, int) else v.e


def bounds(v: object) -> tuple[int, int | None]:
    return (v, v) if isinstance(v, int) else (v.lo, v.hi)


class Sorts:
    """z3 sorts for our types; data types become z3 datatypes (created once per type)."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self._cache: dict[Ty, z3.SortRef] = {}

    def sort(self, ty: Ty) -> z3.SortRef:
        match ty:
            case Prim("Nat"):
                return z3.IntSort()
            case Prim("U32"):
                return z3.BitVecSort(32)
            case Prim("Bool"):
                return z3.BoolSort()
            case Opaque(_, base):
                return self.sort(base)
        if ty not in self._cache:
            self._declare(ty)
        return self._cache[ty]

    def _declare(self, ty: Ty) -> None:
        name = "D_" + "".join(ch if ch.isalnum() else "_" for ch in str(ty))
        dt = z3.Datatype(name)
        ctors = self.prog.ctors_of(ty)
        if ctors is None:
            raise BendError(f"no SMT sort for {ty}")
        for c in ctors:
            fields = []
            for fname, fty in c.fields:
                fields.append((f"{name}_{c.name}_{fname}", dt if fty == ty else self.sort(fty)))
            dt.declare(f"{name}_{c.name}", *fields)
        self._cache[ty] = dt.create()

    def ctor(self, ty: Ty, name: str) -> z3.FuncDeclRef:
        srt = self.sort(ty)
        for i in range(srt.num_constructors()):
            if srt.constructor(i).name().endswith("_" + name):
                return srt.constructor(i)
        raise BendError(f"{ty} has no constructor {name}")


class SymExec:
    def __init__(self, prog: Program, sorts: Sorts, pins: dict[str, object] | None = None) -> None:
        self.prog = prog
        self.sorts = sorts
        self.pins = pins or {}  # fresh leaf name -> the concrete value a hypothesis forces on it
        self.side: list[z3.BoolRef] = []  # true facts about fresh terms (Nat results are >= 0)
        self._ufs: dict[tuple, z3.FuncDeclRef] = {}
        self._memo: dict[tuple, tuple[object, list[object]]] = {}
        self.abstracted: set[str] = set()  # defs replaced by uninterpreted functions in this query
        self._depth = 0
        self.fresh_count = 0

    # ------------------------------------------------------------ fresh symbolic values
    def fresh(self, name: str, ty: Ty) -> object:
        self.fresh_count += 1
        tag = f"{name}!{self.fresh_count}"
        if tag in self.pins:
            value = self.pins[tag]
            return (
                z3.BitVecVal(value, 32)
                if isinstance(ty, Prim | Opaque) and ty != NAT and ty != BOOL
                else value
            )
        match ty:
            case Prim("Nat"):
                e = z3.Int(tag)
                self.side.append(e >= 0)
                return SNat(e, 0, None)
            case Prim("U32") | Opaque():
                return z3.BitVec(tag, 32)
            case Prim("Bool"):
                return z3.Bool(tag)
            case FunT(params, result):
                decl = z3.Function(tag, *[self.sorts.sort(p) for p in params], self.sorts.sort(result))
                return SFun(decl, ty)
            case ListT():
                return SOpaque(z3.Const(tag, self.sorts.sort(ty)), ty)
            case MaybeT() | DataT():
                alts = []
                ctors = self.prog.ctors_of(ty)
                selector = z3.Int(tag + "#ctor") if len(ctors) > 1 else None
                if selector is not None:
                    self.side.append(z3.And(selector >= 0, selector < len(ctors)))
                for i, c in enumerate(ctors):
                    guard = True if selector is None else (selector == i)
                    fields = tuple(self.fresh(f"{name}.{f}", fty) for f, fty in c.fields)
                    alts.append((guard, c.name, fields))
                return SData(tuple(alts), ty)
        raise BendError(f"cannot make a symbolic {ty}")

    def list_of(self, items: list[object], ty: ListT, tail: object | None = None) -> object:
        out = tail if tail is not None else SData(((True, "Nil", ()),), ty)
        for x in reversed(items):
            out = SData(((True, "Con", (x, out)),), ty)
        return out

    def lambda_(self, params: list[str], body: Core, env: dict[str, object]) -> SLambda:
        return SLambda(tuple(params), body, env)

    # ------------------------------------------------------------ encoding to z3 terms
    def encode(self, v: object, ty: Ty) -> z3.ExprRef:
        match ty:
            case Prim("Nat"):
                return nat_term(v)
            case Prim("Bool"):
                return to_bool(v)
            case Prim("U32") | Opaque():
                return v
        if isinstance(v, SOpaque):
            return v.term
        if isinstance(v, SData):
            ctors = {c.name: c for c in self.prog.ctors_of(ty)}
            out = None
            for guard, cname, fields in reversed(v.alts):
                c = ctors[cname]
                term = self.sorts.ctor(ty, cname)(
                    *[self.encode(f, fty) for f, (_, fty) in zip(fields, c.fields, strict=True)]
                )
                out = term if out is None else z3.If(to_bool(guard), term, out)
            return out
        raise BendError(f"cannot encode {v!r} as {ty}")

    # ------------------------------------------------------------ equality and merging
    def equal(self, a: object, b: object, ty: Ty) -> object:
        match ty:
            case Prim("Nat"):
                if isinstance(a, int) and isinstance(b, int):
                    return a == b
                return nat_term(a) == nat_term(b)
            case Prim("Bool"):
                if isinstance(a, bool) and isinstance(b, bool):
                    return a == b
                return to_bool(a) == to_bool(b)
            case Prim("U32") | Opaque():
                if z3.is_bv_value(a) and z3.is_bv_value(b):
                    return a.as_long() == b.as_long()
                return True if a.eq(b) else a == b
            case FunT():
                raise BendError("cannot compare functions")
        if isinstance(a, SData) and isinstance(b, SData):
            ctors = {c.name: c for c in self.prog.ctors_of(ty)}
            disj: list[object] = []
            for ga, ca, fa in a.alts:
                for gb, cb, fb in b.alts:
                    if ca != cb:
                        continue
                    parts = [ga, gb] + [
                        self.equal(x, y, fty) for x, y, (_, fty) in zip(fa, fb, ctors[ca].fields, strict=True)
                    ]
                    disj.append(_and(parts))
            return _or(disj)
        return self.encode(a, ty) == self.encode(b, ty)

    def merge(self, c: object, a: object, b: object) -> object:
        """if c then a else b."""
        if is_true(c):
            return a
        if is_false(c):
            return b
        if a is b:
            return a
        if isinstance(a, bool) and isinstance(b, bool):
            return a if a == b else (c if a else z3.Not(c))
        if isinstance(a, z3.BoolRef | bool) and isinstance(b, z3.BoolRef | bool):
            return z3.If(c, to_bool(a), to_bool(b))
        if isinstance(a, int | SNat) and isinstance(b, int | SNat):
            if isinstance(a, int) and isinstance(b, int) and a == b:
                return a
            (la, ha), (lb, hb) = bounds(a), bounds(b)
            hi = None if ha is None or hb is None else max(ha, hb)
            return SNat(z3.If(c, nat_term(a), nat_term(b)), min(la, lb), hi)
        if isinstance(a, z3.BitVecRef) and isinstance(b, z3.BitVecRef):
            return a if a.eq(b) else z3.If(c, a, b)
        if isinstance(a, SData) and isinstance(b, SData):
            return self._merge_data(c, a, b)
        if isinstance(a, SData | SOpaque) and isinstance(b, SData | SOpaque):
            ty = a.ty
            return SOpaque(z3.If(c, self.encode(a, ty), self.encode(b, ty)), ty)
        raise BendError(f"cannot merge {a!r} and {b!r}")

    def _merge_data(self, c: object, a: SData, b: SData) -> SData:
        out = []
        b_alts = {cname: (g, f) for g, cname, f in b.alts}
        seen = set()
        for ga, cname, fa in a.alts:
            seen.add(cname)
            if cname in b_alts:
                gb, fb = b_alts[cname]
                guard = _or([_and([c, ga]), _and([_not(c), gb])])
                fields = tuple(self.merge(c, x, y) for x, y in zip(fa, fb, strict=True))
                out.append((guard, cname, fields))
            else:
                out.append((_and([c, ga]), cname, fa))
        for gb, cname, fb in b.alts:
            if cname not in seen:
                out.append((_and([_not(c), gb]), cname, fb))
        return SData(tuple(x for x in out if not is_false(x[0])), a.ty)

    # ------------------------------------------------------------ evaluation
    def call(self, key: str, args: list[object]) -> object:
        # Same def, same argument objects: same value (pure code). Keyed by identity; the
        # arguments are kept alive in the memo so identities stay unique.
        memo_key = (key, *map(id, args))
        hit = self._memo.get(memo_key)
        if hit is not None:
            return hit[0]
        result = self._call(key, args)
        self._memo[memo_key] = (result, args)
        return result

    def _call(self, key: str, args: list[object]) -> object:
        fun = self.prog.funs[key]
        self._depth += 1
        if self._depth > MAX_DEPTH:
            self._depth = 0
            raise BendError(
                f"symbolic evaluation of {fun.name} does not terminate: recursion on a value of unknown size"
            )
        try:
            if any(isinstance(args[i], SNat) and args[i].hi is None for i in fun.descents):
                raise Stuck  # structural recursion on a Nat of unknown size: keep the call abstract
            env = {name: a for (name, _, _), a in zip(fun.params, args, strict=True)}
            return self.eval(fun.body, env)
        except Stuck:
            return self._abstract(key, args)
        finally:
            self._depth -= 1

    def _abstract(self, key: str, args: list[object]) -> object:
        """The call as an uninterpreted function of its value arguments.

        Template arguments are part of the function's identity (one symbol per template value):
        for a fixed template, the def is a total function of the remaining arguments.
        """
        fun = self.prog.funs[key]
        self.abstracted.add(fun.name)
        templates = []
        values = []
        for a, (_, t, _) in zip(args, fun.params, strict=True):
            if isinstance(t, FunT):
                if isinstance(a, SFun):
                    templates.append(a.decl.name())
                elif isinstance(a, SDef):
                    templates.append(a.key)
                else:
                    raise BendError(
                        f"cannot abstract {fun.name}: its template argument is not a named function"
                    )
            else:
                values.append((a, t))
        uf_key = (key, *templates)
        if uf_key not in self._ufs:
            raw = "uf_" + "_".join(uf_key)
            name = "".join(ch if ch.isalnum() else "_" for ch in raw)
            sorts = [self.sorts.sort(t) for _, t in values]
            self._ufs[uf_key] = z3.Function(name, *sorts, self.sorts.sort(fun.result))
        term = self._ufs[uf_key](*[self.encode(a, t) for a, t in values])
        return self.from_term(term, fun.result)

    def from_term(self, term: z3.ExprRef, ty: Ty) -> object:
        match ty:
            case Prim("Nat"):
                self.side.append(term >= 0)
                return SNat(term, 0, None)
            case Prim("Bool") | Prim("U32") | Opaque():
                return term
        return SOpaque(term, ty)

    def eval(self, t: Core, env: dict[str, object]) -> object:
        match t:
            case CVar(n):
                return env[n]
            case CNat(v):
                return v
            case CU32(v):
                return z3.BitVecVal(v, 32)
            case CSucc(k, a):
                v = self.eval(a, env)
                if isinstance(v, int):
                    return v + k
                return SNat(v.e + k, v.lo + k, None if v.hi is None else v.hi + k)
            case CGlobal(key):
                return SDef(key)
            case CCall(key, args):
                return self.call(key, [self.eval(a, env) for a in args])
            case CApply(fn, args):
                f = env[fn]
                vals = [self.eval(a, env) for a in args]
                if isinstance(f, SDef):
                    return self.call(f.key, vals)
                if isinstance(f, SLambda):
                    inner = dict(f.env)
                    inner.update(zip(f.params, vals, strict=True))
                    return self.eval(f.body, inner)
                term = f.decl(*[self.encode(v, p) for v, p in zip(vals, f.ty.params, strict=True)])
                return self.from_term(term, f.ty.result)
            case CPrim(op, args):
                return self.prim(op, [self.eval(a, env) for a in args])
            case CCtor(ty, ctor, args):
                if ty == BOOL:
                    return ctor == "True"
                return SData(((True, ctor, tuple(self.eval(a, env) for a in args)),), ty)
            case CLet(n, v, b, _):
                inner = dict(env)
                inner[n] = self.eval(v, env)
                return self.eval(b, inner)
            case CCase():
                return self.case(t, env)
        raise BendError(f"cannot evaluate {t!r} symbolically")

    def case(self, t: CCase, env: dict[str, object]) -> object:
        v = env[t.scrut]
        if t.lits:
            if z3.is_bv_value(v):
                for lit, body in t.lits:
                    if v.as_long() == lit:
                        return self.eval(body, env)
                return self.eval(t.default, env)
            out = self.eval(t.default, env)
            for lit, body in reversed(t.lits):
                out = self.merge(v == lit, self.eval(body, env), out)
            return out
        branches = {br.ctor: br for br in t.branches}
        if t.ty == NAT:
            return self._nat_case(v, branches, env)
        if t.ty == BOOL:
            if isinstance(v, bool):
                return self.eval(branches["True" if v else "False"].body, env)
            return self.merge(
                v, self.eval(branches["True"].body, env), self.eval(branches["False"].body, env)
            )
        if isinstance(v, SOpaque):
            raise Stuck
        out = None
        for guard, cname, fields in reversed(v.alts):
            br = branches[cname]
            inner = dict(env)
            inner.update(zip(br.binders, fields, strict=True))
            res = self.eval(br.body, inner)
            out = res if out is None else self.merge(guard, res, out)
        return out

    def _nat_case(self, v: object, branches: dict, env: dict[str, object]) -> object:
        zero, succ = branches["Zero"], branches["Succ"]
        if isinstance(v, int):
            if v == 0:
                return self.eval(zero.body, env)
            inner = dict(env)
            inner[succ.binders[0]] = v - 1
            return self.eval(succ.body, inner)
        lo, hi = v.lo, v.hi
        pred = SNat(v.e - 1, max(lo, 1) - 1, None if hi is None else hi - 1)
        if pred.hi == 0 and lo >= 1:
            pred = 0
        inner = dict(env)
        inner[succ.binders[0]] = pred
        if lo >= 1:
            return self.eval(succ.body, inner)
        if hi == 0:
            return self.eval(zero.body, env)
        return self.merge(v.e == 0, self.eval(zero.body, env), self.eval(succ.body, inner))

    # ------------------------------------------------------------ primitives
    def prim(self, op: str, vals: list[object]) -> object:
        kind = op.split(".", 1)[0]
        if kind == "Bool":
            if all(isinstance(v, bool) for v in vals):
                return PRIMS[op].fn(*vals)
            if op == "Bool.not":
                return _not(vals[0])
            return _and(vals) if op == "Bool.and" else _or(vals)
        if kind == "Nat":
            return self._nat_prim(op, vals)
        return self._u32_prim(op, vals)

    def _nat_prim(self, op: str, vals: list[object]) -> object:
        a, b = vals
        if isinstance(a, int) and isinstance(b, int):
            return PRIMS[op].fn(a, b)
        x, y = nat_term(a), nat_term(b)
        (la, ha), (lb, hb) = bounds(a), bounds(b)
        match op:
            case "Nat.add":
                if isinstance(a, int) and a == 0:
                    return b
                if isinstance(b, int) and b == 0:
                    return a
                return SNat(x + y, la + lb, None if ha is None or hb is None else ha + hb)
            case "Nat.sub":
                return SNat(z3.If(x > y, x - y, 0), max(0, la - (hb if hb is not None else la)), ha)
            case "Nat.min":
                return SNat(
                    z3.If(x < y, x, y), min(la, lb), None if ha is None else ha if hb is None else min(ha, hb)
                )
            case "Nat.max":
                return SNat(
                    z3.If(x > y, x, y), max(la, lb), None if ha is None or hb is None else max(ha, hb)
                )
            case "Nat.is_eq" | "Nat.is_ne":
                eq = _nat_lt(ha, lb) or _nat_lt(hb, la)
                decided = False if eq else None
                out = x == y if decided is None else decided
                return out if op == "Nat.is_eq" else _not(out)
            case "Nat.is_lt":
                return _decided(_nat_lt(ha, lb), _nat_le(hb, la), x < y)
            case "Nat.is_le":
                return _decided(_nat_le(ha, lb), _nat_lt(hb, la), x <= y)
            case "Nat.is_gt":
                return _decided(_nat_lt(hb, la), _nat_le(ha, lb), x > y)
            case "Nat.is_ge":
                return _decided(_nat_le(hb, la), _nat_lt(ha, lb), x >= y)
        raise BendError(f"no symbolic semantics for {op}")

    def _u32_prim(self, op: str, vals: list[object]) -> object:
        concrete = [v.as_long() if z3.is_bv_value(v) else v for v in vals]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in concrete):
            out = PRIMS[op].fn(*concrete)
            if isinstance(out, bool):
                return out
            return out if PRIMS[op].result == NAT else z3.BitVecVal(out, 32)
        if op == "U32.to_nat":
            return SNat(z3.BV2Int(vals[0], is_signed=False), 0, 2**32 - 1)
        if op == "U32.from_nat":
            return z3.Int2BV(nat_term(vals[0]), 32)
        a = vals[0]
        b = vals[1]
        if op.startswith("U32.is_") and z3.is_bv_value(a) and z3.is_bv_value(b):
            return bool(PRIMS[op].fn(a.as_long(), b.as_long()))
        if op in ("U32.or", "U32.xor", "U32.add"):  # x op 0 == x: keeps shared subterms shared
            if z3.is_bv_value(a) and a.as_long() == 0:
                return b
            if z3.is_bv_value(b) and b.as_long() == 0:
                return a
        match op:
            case "U32.is_eq":
                return True if a.eq(b) else a == b
            case "U32.is_ne":
                return False if a.eq(b) else a != b
            case "U32.is_lt":
                return z3.ULT(a, b)
            case "U32.is_le":
                return z3.ULE(a, b)
            case "U32.is_gt":
                return z3.UGT(a, b)
            case "U32.is_ge":
                return z3.UGE(a, b)
            case "U32.add":
                return a + b
            case "U32.sub":
                return a - b
            case "U32.mul":
                return a * b
            case "U32.and":
                return a & b
            case "U32.or":
                return a | b
            case "U32.xor":
                return a ^ b
            case "U32.shl" | "U32.shr":
                n = nat_term(b)
                amount = z3.Int2BV(z3.If(n >= 32, 0, n), 32)
                shifted = a << amount if op == "U32.shl" else z3.LShR(a, amount)
                return z3.simplify(z3.If(n >= 32, z3.BitVecVal(0, 32), shifted))
        raise BendError(f"no symbolic semantics for {op}")


def _nat_lt(hi_a: int | None, lo_b: int) -> bool:
    """Is a < b certain from a's upper and b's lower bound?"""
    return hi_a is not None and hi_a < lo_b


def _nat_le(hi_a: int | None, lo_b: int) -> bool:
    return hi_a is not None and hi_a <= lo_b


def _decided(yes: bool, no: bool, term: z3.BoolRef) -> object:
    return True if yes else False if no else term


def _simp(e: object) -> object:
    if isinstance(e, z3.BoolRef):
        s = z3.simplify(e)
        if z3.is_true(s):
            return True
        if z3.is_false(s):
            return False
        return e
    return e


def _not(a: object) -> object:
    if isinstance(a, bool):
        return not a
    return z3.Not(a)


def _and(parts: list[object]) -> object:
    rest = []
    for p in parts:
        if is_false(p):
            return False
        if not is_true(p):
            rest.append(p)
    if not rest:
        return True
    return rest[0] if len(rest) == 1 else z3.And(*rest)


def _or(parts: list[object]) -> object:
    rest = []
    for p in parts:
        if is_true(p):
            return True
        if not is_false(p):
            rest.append(p)
    if not rest:
        return False
    return rest[0] if len(rest) == 1 else z3.Or(*rest)
