"""Compile nested, multi-scrutinee `match`es into single-variable decision trees.

Also the exhaustiveness and redundancy check: a value no case covers is an error naming the
missing pattern, and a case no value reaches is an error naming the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from elpis.bend import syntax as s
from elpis.bend.core import U32, CtorInfo, Opaque, Ty
from elpis.bend.errors import BendError


@dataclass
class Var:
    core: str
    ty: Ty
    kind: str  # "param", "pattern", "let", "law"
    quant: str = ""
    origin: tuple[int, bool] | None = None  # (parameter index, strictly smaller) for recursion checks


# Internal pattern form: ("wild", name|None, quant, loc) | ("ctor", name, [sub], loc) | ("lit", value, loc)
IPat = tuple


@dataclass
class Row:
    pats: list[IPat]
    binds: dict[str, Var]
    index: int


@dataclass
class Leaf:
    index: int
    binds: dict[str, Var]


@dataclass
class Split:
    var: Var
    branches: list[tuple[str, list[Var], DTree]] = field(default_factory=list)
    lits: list[tuple[int, DTree]] = field(default_factory=list)
    default: DTree | None = None


DTree = Leaf | Split


class MatchCompiler:
    """`ctors_of(ty)` lists a type's constructors; `fresh(base)` makes a unique core name."""

    def __init__(
        self,
        ctors_of: Callable[[Ty], list[CtorInfo] | None],
        resolve_ctor: Callable[[str, Ty, s.Loc | None], str],
        fresh: Callable[[str], str],
        where: str,
    ) -> None:
        self.ctors_of = ctors_of
        self.resolve_ctor = resolve_ctor
        self.fresh = fresh
        self.where = where

    # ------------------------------------------------------------ pattern normalisation
    def normalise(self, p: s.Pattern, ty: Ty) -> IPat:
        match p:
            case s.PWild():
                return ("wild", None, "", p.loc)
            case s.PVar(name, quant):
                return ("wild", name, quant, p.loc)
            case s.PU32(value):
                if isinstance(ty, Opaque):
                    raise BendError(
                        f"{p.loc}: token ids ({ty}) may only be compared with U32.is_eq / U32.is_ne, "
                        "not matched against literals"
                    )
                if ty != U32:
                    raise BendError(f"{p.loc}: U32 literal pattern on a value of type {ty}")
                return ("lit", value, p.loc)
            case s.PNat(value) | s.PSucc(value, _):
                if str(ty) != "Nat":
                    raise BendError(f"{p.loc}: Nat pattern on a value of type {ty}")
                inner = ("ctor", "Zero", [], p.loc) if isinstance(p, s.PNat) else self.normalise(p.arg, ty)
                for _ in range(value):
                    inner = ("ctor", "Succ", [inner], p.loc)
                return inner
            case s.PCons(head, tail):
                return self.normalise(s.PCtor("Con", (head, tail), p.loc), ty)
            case s.PCtor(name, args):
                ctor_name = self.resolve_ctor(name, ty, p.loc)
                info = self._ctor(ty, ctor_name)
                if len(args) != len(info.fields):
                    raise BendError(
                        f"{p.loc}: constructor {name} has {len(info.fields)} field(s), "
                        f"the pattern gives {len(args)}"
                    )
                subs = [self.normalise(a, fty) for a, (_, fty) in zip(args, info.fields, strict=True)]
                return ("ctor", ctor_name, subs, p.loc)
        raise BendError(f"{getattr(p, 'loc', None)}: unsupported pattern")

    def _ctor(self, ty: Ty, name: str) -> CtorInfo:
        for c in self.ctors_of(ty) or []:
            if c.name == name:
                return c
        raise BendError(f"{self.where}: {ty} has no constructor {name}")

    # ------------------------------------------------------------ compilation
    def compile(self, scrutinees: list[Var], cases: list[tuple[list[IPat], s.Loc | None]], loc) -> DTree:
        rows = [Row(list(pats), {}, i) for i, (pats, _) in enumerate(cases)]
        self._reached: set[int] = set()
        self._desc: dict[str, tuple[str, list[str]]] = {}
        self._roots = [v.core for v in scrutinees]
        tree = self._build(list(scrutinees), rows, loc)
        for i, (_, case_loc) in enumerate(cases):
            if i not in self._reached:
                raise BendError(f"{case_loc or loc}: this case is unreachable (earlier cases cover it)")
        return tree

    def _build(self, cols: list[Var], rows: list[Row], loc) -> DTree:
        if not rows:
            missing = " ".join(self._render(r) for r in self._roots)
            raise BendError(f"{loc}: non-exhaustive match: no case for `{missing}`")
        first = rows[0]
        col_i = next((i for i, p in enumerate(first.pats) if p[0] != "wild"), None)
        if col_i is None:
            binds = dict(first.binds)
            for var, pat in zip(cols, first.pats, strict=True):
                if pat[1] is not None:
                    binds[pat[1]] = self._bind(var, pat)
            self._reached.add(first.index)
            return Leaf(first.index, binds)
        col = cols[col_i]
        rest_cols = cols[:col_i] + cols[col_i + 1 :]
        if first.pats[col_i][0] == "lit":
            return self._build_lits(col, col_i, rest_cols, rows, loc)
        ctors = self.ctors_of(col.ty)
        if ctors is None:
            raise BendError(f"{loc}: cannot match on a value of type {col.ty}")
        split = Split(col)
        for c in ctors:
            fields = [self._field_var(col, c, k, rows, col_i) for k in range(len(c.fields))]
            sub_rows = []
            for r in rows:
                p = r.pats[col_i]
                if p[0] == "ctor" and p[1] == c.name:
                    sub_rows.append(Row(r.pats[:col_i] + p[2] + r.pats[col_i + 1 :], r.binds, r.index))
                elif p[0] == "wild":
                    binds = dict(r.binds)
                    if p[1] is not None:
                        binds[p[1]] = self._bind(col, p)
                    wilds = [("wild", None, "", p[3])] * len(c.fields)
                    sub_rows.append(Row(r.pats[:col_i] + wilds + r.pats[col_i + 1 :], binds, r.index))
            self._desc[col.core] = (c.name, [f.core for f in fields])
            subtree = self._build(cols[:col_i] + fields + cols[col_i + 1 :], sub_rows, loc)
            split.branches.append((c.name, fields, subtree))
        self._desc.pop(col.core, None)
        return split

    def _build_lits(self, col: Var, col_i: int, rest_cols: list[Var], rows: list[Row], loc) -> DTree:
        split = Split(col)
        values: list[int] = []
        for r in rows:
            p = r.pats[col_i]
            if p[0] == "lit" and p[1] not in values:
                values.append(p[1])
        for v in values:
            sub = []
            for r in rows:
                p = r.pats[col_i]
                if p[0] == "lit" and p[1] == v:
                    sub.append(Row(r.pats[:col_i] + r.pats[col_i + 1 :], r.binds, r.index))
                elif p[0] == "wild":
                    binds = dict(r.binds)
                    if p[1] is not None:
                        binds[p[1]] = self._bind(col, p)
                    sub.append(Row(r.pats[:col_i] + r.pats[col_i + 1 :], binds, r.index))
            self._desc[col.core] = (str(v), [])
            split.lits.append((v, self._build(rest_cols, sub, loc)))
        self._desc[col.core] = ("_", [])
        default_rows = []
        for r in rows:
            p = r.pats[col_i]
            if p[0] == "wild":
                binds = dict(r.binds)
                if p[1] is not None:
                    binds[p[1]] = self._bind(col, p)
                default_rows.append(Row(r.pats[:col_i] + r.pats[col_i + 1 :], binds, r.index))
        split.default = self._build(rest_cols, default_rows, loc)
        self._desc.pop(col.core, None)
        return split

    def _bind(self, var: Var, pat: IPat) -> Var:
        quant = pat[2] or var.quant
        return Var(var.core, var.ty, var.kind if var.kind != "let" else "let", quant, var.origin)

    def _field_var(self, col: Var, c: CtorInfo, k: int, rows: list[Row], col_i: int) -> Var:
        base = c.fields[k][0]
        for r in rows:
            p = r.pats[col_i]
            if p[0] == "ctor" and p[1] == c.name and p[2][k][0] == "wild" and p[2][k][1]:
                base = p[2][k][1]
                break
        origin = (col.origin[0], True) if col.origin is not None else None
        quant = "+" if col.quant == "+" else ""
        return Var(self.fresh(base), c.fields[k][1], "pattern", quant, origin)

    def _render(self, name: str) -> str:
        if name not in self._desc:
            return "_"
        ctor, fields = self._desc[name]
        if ctor == "Zero":
            return "0n"
        if ctor == "Succ":
            return f"1n+{self._render(fields[0])}"
        if ctor == "Con":
            return f"({self._render(fields[0])} <> {self._render(fields[1])})"
        if not fields and not ctor[0].isalpha():
            return ctor
        return f"{ctor}{{{', '.join(self._render(f) for f in fields)}}}"
