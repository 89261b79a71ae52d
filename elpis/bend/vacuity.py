"""Vacuity check: find values that satisfy every hypothesis of a law, and check them by running.

Kernel-proved laws are searched here, every list variable tried at small lengths. SMT-proved laws
(`smt.py`) hand over their satisfiable shapes' models of the hypotheses until one runs true
(`WitnessSearch.check_model`); when every one is refuted, those shapes are searched (`WitnessSearch.run`).
A hypothesis under binders (kernel laws only), `@x..: A.. -> {f(x..) == rhs : T}` with f a template
variable applied to exactly its binders and not mentioned in rhs, is satisfiable by definition (take f
to be rhs); it is used that way. The other hypotheses are handed to z3.

A z3 model is only a candidate: symbolic evaluation keeps a recursion on a Nat of unknown size abstract
(an uninterpreted function), and z3 may give that function values the real def never takes. So the model
is turned into interpreter values (template variables defined by a hypothesis become functions running
their rhs, other function variables run the model's interpretation) and every hypothesis is evaluated by
the interpreter (`interp.py`). A model that fails there is a bug when nothing was abstracted (raised); when
something was, the Nat leaves the abstracted calls depend on are pinned to small concrete values (smallest
first), so the recursions unfold fully, and the query is solved and checked again. The witness returned
is one the interpreter confirmed; none within the bounds is a failure.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import z3

from elpis.bend.check import Program
from elpis.bend.core import BOOL, NAT, CApply, Clause, Core, CVar, FunT, LawInfo, ListT, Prim, Ty, free_vars
from elpis.bend.errors import BendError
from elpis.bend.interp import Data, Interpreter
from elpis.bend.smt import QUERY_TIMEOUT_MS, symbolic_values
from elpis.bend.symexec import SData, SNat, SOpaque, Sorts, SymExec, is_false

SMALL = 2  # list lengths tried: 0..SMALL
NAT_SMALL = 8  # values tried for a Nat leaf that an abstracted recursion depends on: 0..NAT_SMALL
# symbolic evaluations (each with at most one z3 query) per law before pinning stops: with the 3^lists shapes,
# a law without a witness fails in bounded time
MAX_ATTEMPTS = 256
# z3 resource units per check (see elpis.bend.smt.QUERY_RLIMIT): about twice what the former 30 s limit
# allowed on an idle core, and the same on any machine
VACUITY_RLIMIT = 60_000_000
CHECKED = "interpreter"

Definitions = dict[str, tuple[list[str], Core]]


class NotAValue(Exception):
    """A model value that is no value of its type (a negative Nat inside an unconstrained datatype term)."""


@dataclass
class Witness:
    """Interpreter values (core name -> value) for the law's variables that satisfy every hypothesis."""

    values: dict[str, object]
    pinned: dict[str, int] = field(default_factory=dict)  # Nat leaves fixed so recursions unfold


@dataclass
class Attempt:
    """One z3 query for a shape (list lengths) and pinning."""

    result: str  # z3's answer: "sat", "unsat" or "unknown"
    abstracted: set[str] = field(default_factory=set)
    recursed_on: list[str] = field(default_factory=list)  # Nat leaves the abstracted calls depend on
    values: dict[str, object] | None = None  # the model as interpreter values
    refuted: str | None = None  # why the interpreter refutes the model (a hypothesis it finds false)

    @property
    def checked(self) -> bool:
        return self.values is not None and self.refuted is None


def vacuity_witness(prog: Program, law: LawInfo) -> dict:
    """The certificate's record: the witness (as JSON) and how it was checked."""
    search = WitnessSearch(prog, law)
    return search.record(search.run())


def find_witness(prog: Program, law: LawInfo) -> Witness:
    return WitnessSearch(prog, law).run()


class _Tracing(SymExec):
    """Symbolic execution that records which Nat leaves the arguments of abstracted calls depend on."""

    def __init__(self, prog: Program, sorts: Sorts, pins: dict[str, object]) -> None:
        super().__init__(prog, sorts, pins)
        self.nat_leaves: set[str] = set()
        self.recursed_on: dict[str, None] = {}  # insertion-ordered set: a deterministic pinning order

    def fresh(self, name: str, ty: Ty) -> object:
        v = super().fresh(name, ty)
        if isinstance(v, SNat):
            self.nat_leaves.add(v.e.decl().name())
        return v

    def _abstract(self, key: str, args: list[object]) -> object:
        for a in args:
            if isinstance(a, SNat):
                for leaf in _constants(a.e):
                    if leaf in self.nat_leaves:
                        self.recursed_on.setdefault(leaf)
        return super()._abstract(key, args)


class WitnessSearch:
    """Witnesses of one law's hypotheses, each run by the interpreter before it counts."""

    def __init__(self, prog: Program, law: LawInfo, sorts: Sorts | None = None) -> None:
        self.prog = prog
        self.law = law
        self.definitions, self.plain = _definitions(law)
        self.sorts = sorts or Sorts(prog)  # those of the models handed in: constructors are compared
        self.interp = Interpreter(prog)
        self.attempts = 0  # symbolic evaluations, each with at most one z3 query
        self.abstracted: set[str] = set()  # defs some query took as unknown functions
        self.refuted = 0  # models the interpreter refuted

    def run(self, shapes: list[dict[str, int]] | None = None) -> Witness:
        """Search the given shapes (list lengths, Nat values; SMT laws), else every list at 0..SMALL."""
        for shape in self._small_shapes() if shapes is None else shapes:
            found = self._shape(shape)
            if found is not None:
                return found
        raise BendError(self._failure(shapes))

    def check_model(self, model: z3.ModelRef, env: dict[str, object], abstracted: set[str]) -> Witness | None:
        """A model of the hypotheses (for the symbolic values `env`) as a witness, if it runs true; a model
        refuted with nothing `abstracted` is raised (see `_run_model`)."""
        self.abstracted |= abstracted
        attempt = Attempt("sat", set(abstracted))
        self._run_model(attempt, model, env)
        return Witness(attempt.values) if attempt.checked else None

    def record(self, witness: Witness) -> dict:
        """The certificate's record: the witness (as JSON) and how it was checked."""
        shown = {
            c.source: "<defined by its quantified hypothesis>"
            if c.name in self.definitions
            else _json(witness.values[c.name])
            for c in self.law.values
        }
        return {"checked": CHECKED, "values": shown}

    def _small_shapes(self) -> Iterator[dict[str, int]]:
        lists = [c for c in self.law.values if isinstance(c.ty, ListT)]
        for lengths in itertools.product(range(SMALL + 1), repeat=len(lists)):
            yield {c.name: n for c, n in zip(lists, lengths, strict=True)}

    def _shape(self, shape: dict[str, int]) -> Witness | None:
        first = self._attempt(shape, {})
        if first is None or first.result == "unsat":
            return None  # unsat with the recursions unknown (on Nats <= NAT_SMALL): so with the real ones
        if first.checked:
            return Witness(first.values)
        if not first.abstracted:
            return None  # z3 gave up on this shape
        # The recursions unfold on concrete Nats: try the leaves they depend on at small values.
        leaves = first.recursed_on
        if not leaves:
            return None  # abstracted for another reason (a match on a list of unknown length): nothing to pin
        for values in _small_first(len(leaves)):
            if self.attempts >= MAX_ATTEMPTS:
                break
            pins = dict(zip(leaves, values, strict=True))
            attempt = self._attempt(shape, pins)
            if attempt is not None and attempt.checked:
                return Witness(attempt.values, pins)
        return None

    def _attempt(self, shape: dict[str, int], pins: dict[str, int]) -> Attempt | None:
        """Solve the hypotheses for one shape and pinning and run a model by the interpreter; None when a
        hypothesis is false by evaluation alone."""
        self.attempts += 1
        ex = _Tracing(self.prog, self.sorts, dict(pins))
        env = self._symbolic_env(ex, shape)
        try:
            hyps = [
                ex.equal(ex.eval(h.hyp.eq.lhs, env), ex.eval(h.hyp.eq.rhs, env), h.hyp.eq.ty)
                for h in self.plain
            ]
        except BendError:
            return None
        self.abstracted |= ex.abstracted
        if any(is_false(h) for h in hyps):
            return None
        recursed_on = list(ex.recursed_on)
        solver = z3.Solver()
        solver.set("rlimit", VACUITY_RLIMIT)  # resource units, not seconds: the same verdict on any machine
        solver.set("timeout", QUERY_TIMEOUT_MS)
        solver.add(*ex.side)
        solver.add(*[z3.BoolVal(h) if isinstance(h, bool) else h for h in hyps])
        # The interpreter runs the recursions on these Nats: keep them small (as the pinning does).
        solver.add(*[z3.Int(leaf) <= NAT_SMALL for leaf in recursed_on])
        result = solver.check()
        attempt = Attempt(str(result), set(ex.abstracted), recursed_on)
        if result == z3.sat:
            self._run_model(attempt, solver.model(), env)
        return attempt

    def _run_model(self, attempt: Attempt, model: z3.ModelRef, env: dict[str, object]) -> None:
        try:
            attempt.values = self._concrete(model, env)
            attempt.refuted = self._failing(attempt.values)
        except NotAValue as err:
            attempt.refuted = str(err)
        if attempt.refuted is None:
            return
        self.refuted += 1
        if not attempt.abstracted:  # symbolic and concrete evaluation disagree: a bug in one of them
            raise BendError(
                f"{self.law.loc}: law {self.law.name}: vacuity check: internal error: z3's model of the "
                f"hypotheses (no def taken as unknown) is refuted by the interpreter: {attempt.refuted}; "
                f"model {self._shown(attempt.values)}"
            )

    def _symbolic_env(self, ex: SymExec, shape: dict[str, int]) -> dict[str, object]:
        env = symbolic_values(ex, self.law, shape, skip=self.definitions)
        for name, (params, body) in self.definitions.items():
            env[name] = ex.lambda_(params, body, env)
        return env

    # ------------------------------------------------------------ the model as interpreter values
    def _concrete(self, model: z3.ModelRef, env: dict[str, object]) -> dict[str, object]:
        decode = _Decoder(self.prog, self.sorts, model)
        values: dict[str, object] = {}
        for c in self.law.values:
            if c.name not in self.definitions:
                values[c.name] = decode.value(env[c.name], c.ty)
        for name, (params, body) in self.definitions.items():
            values[name] = self._defined(params, body, values)
        return values

    def _defined(self, params: list[str], body: Core, values: dict[str, object]) -> Callable[..., object]:
        """A template variable its hypothesis defines, as the function running its rhs (`values` is read at
        call time: one definition may use another)."""

        def run(*args: object) -> object:
            return self.interp.eval(body, {**values, **dict(zip(params, args, strict=True))})

        return run

    def _failing(self, values: dict[str, object]) -> str | None:
        for h in self.plain:
            eq = h.hyp.eq
            try:
                holds = self.interp.eval(eq.lhs, values) == self.interp.eval(eq.rhs, values)
            except RecursionError:
                holds = False
            if not holds:
                return f"hypothesis {h.source} is false"
        return None

    # ------------------------------------------------------------ reporting
    def _shown(self, values: dict[str, object] | None) -> dict:
        if values is None:
            return {}
        return {c.source: _json(values[c.name]) for c in self.law.values if c.name in values}

    def _failure(self, shapes: list[dict[str, int]] | None) -> str:
        run = "when run by the interpreter"
        if shapes is None:
            found = f"no values with lists of length <= {SMALL} satisfy its hypotheses {run}"
        else:  # an SMT law: not vacuous for z3, whose models needed some def to be an unknown function
            found = (
                f"z3 finds its hypotheses satisfiable in {len(shapes)} shape(s), "
                f"but they hold for no values there {run}"
            )
        msg = f"{self.law.loc}: law {self.law.name}: vacuity check failed: {found}"
        if self.abstracted:
            msg += (
                f" (with the Nats that {', '.join(sorted(self.abstracted))} recurse on at 0..{NAT_SMALL}; "
                f"{self.refuted} model(s) z3 found with those defs taken as unknown functions were refuted"
            )
            msg += (
                f"; the budget of {MAX_ATTEMPTS} attempts is spent)" if self.attempts >= MAX_ATTEMPTS else ")"
            )
        return msg


class _Decoder:
    """z3 model values as interpreter values."""

    def __init__(self, prog: Program, sorts: Sorts, model: z3.ModelRef) -> None:
        self.prog = prog
        self.sorts = sorts
        self.model = model

    def value(self, v: object, ty: Ty) -> object:
        if isinstance(ty, FunT):
            return self._function(v.decl, ty)
        if isinstance(v, bool | int):
            return v
        if isinstance(v, SNat):
            return self.term(self._eval(v.e), NAT)
        if isinstance(v, SData):
            return self._data(v, ty)
        if isinstance(v, SOpaque):
            return self.term(self._eval(v.term), ty)
        return self.term(self._eval(v), ty)

    def _eval(self, e: z3.ExprRef) -> z3.ExprRef:
        return self.model.eval(e, model_completion=True)

    def _data(self, v: SData, ty: Ty) -> object:
        for guard, cname, fields in v.alts:
            if not (guard if isinstance(guard, bool) else z3.is_true(self._eval(guard))):
                continue
            ctor = next(c for c in self.prog.ctors_of(ty) if c.name == cname)
            args = [self.value(f, fty) for f, (_, fty) in zip(fields, ctor.fields, strict=True)]
            return _build(ty, cname, args)
        raise NotAValue(f"no constructor of {ty} holds in the model")

    def term(self, t: z3.ExprRef, ty: Ty) -> object:
        """A z3 value (a numeral, a Boolean or a constructor term) as an interpreter value."""
        if ty == NAT:
            n = t.as_long()
            if n < 0:
                raise NotAValue(f"the model gives a Nat the value {n}")
            return n
        if ty == BOOL:
            return z3.is_true(t)
        if isinstance(ty, Prim) or not self.prog.ctors_of(ty):
            return t.as_long()  # U32 and token ids: 32-bit vectors
        srt = self.sorts.sort(ty)
        for i, ctor in enumerate(self.prog.ctors_of(ty)):
            if t.decl().eq(srt.constructor(i)):
                args = [self.term(t.arg(j), fty) for j, (_, fty) in enumerate(ctor.fields)]
                return _build(ty, ctor.name, args)
        raise NotAValue(f"{t} is no constructor term of {ty}")

    def _function(self, decl: z3.FuncDeclRef, ty: FunT) -> Callable[..., object]:
        """A function variable as the model's interpretation of its uninterpreted symbol."""

        def run(*args: object) -> object:
            terms = [self._encode(a, p) for a, p in zip(args, ty.params, strict=True)]
            return self.term(self._eval(decl(*terms)), ty.result)

        return run

    def _encode(self, v: object, ty: Ty) -> z3.ExprRef:
        if ty == NAT:
            return z3.IntVal(v)
        if ty == BOOL:
            return z3.BoolVal(v)
        if isinstance(ty, Prim) or not self.prog.ctors_of(ty):
            return z3.BitVecVal(v, 32)
        if isinstance(ty, ListT):
            cname, args = ("Con", [v[0], v[1:]]) if v else ("Nil", [])
        else:
            cname, args = v.ctor, list(v.fields)
        ctor = next(c for c in self.prog.ctors_of(ty) if c.name == cname)
        fields = [self._encode(a, fty) for a, (_, fty) in zip(args, ctor.fields, strict=True)]
        return self.sorts.ctor(ty, cname)(*fields)


def _build(ty: Ty, cname: str, args: list[object]) -> object:
    if isinstance(ty, ListT):
        return () if cname == "Nil" else (args[0], *args[1])
    return Data(cname, tuple(args))


def _definitions(law: LawInfo) -> tuple[Definitions, list[Clause]]:
    """Template variables defined by a quantified hypothesis, and the other (unquantified) hypotheses."""
    definitions: Definitions = {}
    plain = []
    for c in law.hyps:
        hyp = c.hyp
        if not hyp.binders:
            plain.append(c)
            continue
        names = [b for b, _ in hyp.binders]
        for app, body in ((hyp.eq.lhs, hyp.eq.rhs), (hyp.eq.rhs, hyp.eq.lhs)):
            if (
                isinstance(app, CApply)
                and app.fn not in definitions
                and [a.name if isinstance(a, CVar) else None for a in app.args] == names
                and app.fn not in free_vars(body)
            ):
                definitions[app.fn] = (names, body)
                break
        else:
            raise BendError(
                f"{law.loc}: law {law.name}: cannot show hypothesis {c.source} satisfiable "
                "(a quantified hypothesis must define a template variable: f(x..) == rhs)"
            )
    return definitions, plain


def _constants(e: z3.ExprRef) -> list[str]:
    """Names of the uninterpreted constants in a term (its DAG walked once)."""
    out: list[str] = []
    seen: set[int] = set()
    stack = [e]
    while stack:
        t = stack.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.append(t.decl().name())
        elif z3.is_app(t):
            stack.extend(t.children())
    return sorted(out)


def _small_first(k: int) -> Iterator[tuple[int, ...]]:
    """Every k-tuple of values in 0..NAT_SMALL, by increasing sum, then lexicographically; lazily."""
    for total in range(k * NAT_SMALL + 1):
        yield from _with_sum(k, total)


def _with_sum(k: int, total: int) -> Iterator[tuple[int, ...]]:
    if k == 0:
        if total == 0:
            yield ()
        return
    for first in range(min(total, NAT_SMALL) + 1):
        for rest in _with_sum(k - 1, total - first):
            yield (first, *rest)


def _json(v: object) -> object:
    if isinstance(v, bool | int):
        return v
    if isinstance(v, Data):  # before tuple: Data is a NamedTuple
        return {v.ctor: [_json(f) for f in v.fields]}
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    if callable(v):
        return "<function: the model's interpretation>"
    return str(v)
