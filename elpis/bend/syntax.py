"""The abstract syntax of our Bend subset.

Nodes are frozen dataclasses; source locations are carried but ignored by equality, so that
`parse(print(x)) == x` compares structure only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Loc:
    path: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class EVar:
    name: str
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ETemplate:
    """`~f` passed as an argument to a template parameter."""

    name: str
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ECall:
    fn: str
    args: tuple[Expr, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ECtor:
    name: str
    args: tuple[Expr, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ENat:
    value: int
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ESucc:
    """`kn+e`: k successors of e."""

    k: int
    arg: Expr
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EU32:
    value: int
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EList:
    items: tuple[Expr, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ECons:
    head: Expr
    tail: Expr
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EOp:
    """The operator form `(a op b : T)`."""

    op: str
    lhs: Expr
    rhs: Expr
    ty: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EAnn:
    expr: Expr
    ty: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ERefl:
    """`{==}`: an equality proved by computation."""

    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EHole:
    """`_` inside a rewrite motive."""

    loc: Loc | None = field(default=None, compare=False, repr=False)


Expr = EVar | ETemplate | ECall | ECtor | ENat | ESucc | EU32 | EList | ECons | EOp | EAnn | ERefl | EHole

# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class TName:
    """A named type, possibly applied: `Nat`, `List<Ty.Tok>`, `List<&2, U32>`, `Data`."""

    name: str
    args: tuple[TArg, ...] = ()
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TQuant:
    """A quantity argument `&0`, `&1`, `&2` (parsed, kept, ignored by the checker)."""

    q: str
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TEq:
    lhs: Expr
    rhs: Expr
    ty: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TArrow:
    """`A -> B`, or the dependent `@x: A -> B` (binder set)."""

    dom: Type
    cod: Type
    binder: str | None = None
    quant: str = ""
    loc: Loc | None = field(default=None, compare=False, repr=False)


Type = TName | TEq | TArrow
TArg = TName | TEq | TArrow | TQuant

# ---------------------------------------------------------------- patterns


@dataclass(frozen=True)
class PWild:
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PVar:
    name: str
    quant: str = ""
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PNat:
    value: int
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PSucc:
    k: int
    arg: Pattern
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PU32:
    value: int
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PCtor:
    name: str
    args: tuple[Pattern, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PCons:
    head: Pattern
    tail: Pattern
    loc: Loc | None = field(default=None, compare=False, repr=False)


Pattern = PWild | PVar | PNat | PSucc | PU32 | PCtor | PCons

# ---------------------------------------------------------------- statements


@dataclass(frozen=True)
class SLet:
    name: str
    expr: Expr
    quant: str = ""
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SRewrite:
    """`%e : P` — rewrite the goal with the equality proved by e (P marks the spot with `_`)."""

    proof: Expr
    motive: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Case:
    patterns: tuple[Pattern, ...]
    body: Block
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Match:
    scrutinees: tuple[str, ...]
    cases: tuple[Case, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    stmts: tuple[SLet | SRewrite, ...]
    tail: Match | Expr
    loc: Loc | None = field(default=None, compare=False, repr=False)


# ---------------------------------------------------------------- top level


@dataclass(frozen=True)
class Import:
    """`import Base` (path None) or `import ./x.bend as M`."""

    path: str | None
    alias: str | None
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Field:
    name: str
    ty: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class CtorDef:
    name: str
    fields: tuple[Field, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TypeDef:
    name: str
    ctors: tuple[CtorDef, ...]
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Param:
    name: str
    ty: Type | None
    quant: str = ""
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple[Param, ...]
    ret: Type | None
    body: Block
    loc: Loc | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Law:
    name: str
    clauses: tuple[Param, ...]
    goal: Type
    loc: Loc | None = field(default=None, compare=False, repr=False)


Item = Import | TypeDef | Def | Law


@dataclass(frozen=True)
class Module:
    items: tuple[Item, ...]
    path: str = field(default="", compare=False)
