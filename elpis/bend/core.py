"""Checked types and the core language every back end consumes.

The elaborator (`check.py`) turns surface syntax into core: names resolved to unique local
variables or global keys, nested multi-way `match`es compiled into single-variable case trees,
Base operations turned into primitives. The interpreter, the SMT encoder, the proof kernel and
the C generator all work on this one representation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class Prim:
    """Nat, U32 or Bool."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Opaque:
    """A nominal alias such as the token id `Tok`: same values as `base`, but only copy and ==."""

    key: str
    base: Prim

    def __str__(self) -> str:
        return self.key.rsplit("::", 1)[-1]


@dataclass(frozen=True)
class ListT:
    elem: Ty

    def __str__(self) -> str:
        return f"List<{self.elem}>"


@dataclass(frozen=True)
class MaybeT:
    elem: Ty

    def __str__(self) -> str:
        return f"Maybe<{self.elem}>"


@dataclass(frozen=True)
class DataT:
    key: str

    def __str__(self) -> str:
        return self.key.rsplit("::", 1)[-1]


@dataclass(frozen=True)
class FunT:
    params: tuple[Ty, ...]
    result: Ty

    def __str__(self) -> str:
        return " -> ".join(str(p) for p in (*self.params, self.result))


Ty = Prim | Opaque | ListT | MaybeT | DataT | FunT

NAT = Prim("Nat")
U32 = Prim("U32")
BOOL = Prim("Bool")


def is_token(ty: Ty) -> bool:
    return isinstance(ty, Opaque)


# ---------------------------------------------------------------- terms


@dataclass(frozen=True)
class CVar:
    name: str


@dataclass(frozen=True)
class CGlobal:
    """A top-level def used as a function value (passed to a template parameter)."""

    key: str


@dataclass(frozen=True)
class CCall:
    key: str
    args: tuple[Core, ...]


@dataclass(frozen=True)
class CPrim:
    """A Base primitive on Nat/U32/Bool, e.g. `Nat.is_ge`, `U32.is_eq`, `U32.shl`."""

    op: str
    args: tuple[Core, ...]


@dataclass(frozen=True)
class CApply:
    """Application of a function-valued variable (a template or law parameter)."""

    fn: str
    args: tuple[Core, ...]


@dataclass(frozen=True)
class CCtor:
    """A constructor application; `ty` is the full type built (Nat uses CNat/CSucc instead)."""

    ty: Ty
    ctor: str
    args: tuple[Core, ...]

    @property
    def tkey(self) -> str:
        return tkey_of(self.ty)


@dataclass(frozen=True)
class CNat:
    value: int


@dataclass(frozen=True)
class CSucc:
    k: int
    arg: Core


@dataclass(frozen=True)
class CU32:
    value: int


@dataclass(frozen=True)
class CLet:
    name: str
    value: Core
    body: Core
    ty: Ty | None = None


@dataclass(frozen=True)
class Branch:
    ctor: str  # "Zero"/"Succ" for Nat, "Nil"/"Con", "False"/"True", "None"/"Some", user ctors
    binders: tuple[str, ...]
    body: Core


@dataclass(frozen=True)
class CCase:
    """Case split on a variable. For U32 scrutinees `lits` holds (value, body) and `default` the rest."""

    scrut: str
    ty: Ty
    branches: tuple[Branch, ...]
    lits: tuple[tuple[int, Core], ...] = ()
    default: Core | None = None


Core = CVar | CGlobal | CCall | CPrim | CApply | CCtor | CNat | CSucc | CU32 | CLet | CCase


def tkey_of(ty: Ty) -> str:
    match ty:
        case Prim("Bool"):
            return "Bool"
        case ListT():
            return "List"
        case MaybeT():
            return "Maybe"
        case DataT(key):
            return key
    raise TypeError(f"{ty} has no constructors")


# ---------------------------------------------------------------- program entities


@dataclass(frozen=True)
class CtorInfo:
    tkey: str
    name: str
    fields: tuple[tuple[str, Ty], ...]


@dataclass
class TypeInfo:
    key: str
    ctors: list[CtorInfo]
    loc: str


@dataclass
class FunInfo:
    """A checked code def."""

    key: str
    module: str
    name: str
    params: list[tuple[str, Ty, str]]  # (core var name, type, quantity)
    result: Ty
    body: Core | None
    loc: str
    calls: set[str]
    descents: set[int] = field(default_factory=set)  # parameters a recursive call shrinks


@dataclass
class Clause:
    name: str  # core variable name
    source: str  # name as written
    quant: str
    ty: Ty | None  # value type; None for a hypothesis
    hyp: Hyp | None


@dataclass(frozen=True)
class Equation:
    lhs: Core
    rhs: Core
    ty: Ty


@dataclass(frozen=True)
class Hyp:
    """A hypothesis: an equation, possibly under binders (`@x: A -> {a == b : T}`)."""

    binders: tuple[tuple[str, Ty], ...]
    eq: Equation


@dataclass
class LawInfo:
    key: str
    module: str
    name: str
    clauses: list[Clause]
    goal: Equation
    loc: str

    @property
    def values(self) -> list[Clause]:
        return [c for c in self.clauses if c.hyp is None]

    @property
    def hyps(self) -> list[Clause]:
        return [c for c in self.clauses if c.hyp is not None]


def free_vars(t: Core) -> set[str]:
    out: set[str] = set()
    _free(t, set(), out)
    return out


def _free(t: Core, bound: set[str], out: set[str]) -> None:
    match t:
        case CVar(n):
            if n not in bound:
                out.add(n)
        case CApply(fn, args):
            if fn not in bound:
                out.add(fn)
            for a in args:
                _free(a, bound, out)
        case CCall(_, args) | CPrim(_, args) | CCtor(_, _, args):
            for a in args:
                _free(a, bound, out)
        case CSucc(_, a):
            _free(a, bound, out)
        case CLet(n, v, b, _):
            _free(v, bound, out)
            _free(b, bound | {n}, out)
        case CCase(sc, _, branches, lits, default):
            if sc not in bound:
                out.add(sc)
            for br in branches:
                _free(br.body, bound | set(br.binders), out)
            for _, body in lits:
                _free(body, bound, out)
            if default is not None:
                _free(default, bound, out)
