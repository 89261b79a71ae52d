"""Discharge a law with z3, one query per shape, with a vacuity check and a certificate.

Shapes. A list variable is either bounded or unbounded. It is bounded by L when the law's own
hypotheses rule out every longer list: with the variable set to L+1 fresh elements followed by a
tail of unknown shape (and the other variables unknown, or enumerated over their bounded shapes),
some hypothesis evaluates to false without ever looking at that tail — so it is false for every
longer list. Bounded variables are then enumerated over every length 0..L; unbounded ones stay
symbolic (`SOpaque`). The shapes together cover every input, so "unsat in every shape" proves the
law outright.

Per shape: assert the hypotheses, check they are satisfiable (a law whose hypotheses hold in no shape
at all is vacuous and fails), then assert the negated claim and require unsat.

Vacuity. A shape can keep a recursion abstract (an uninterpreted function), so "satisfiable" may hold
only for values the real def never takes. A proved law therefore also needs a witness the interpreter
confirms (`vacuity.py`): z3's model of the hypotheses is run, shape by shape until one runs true; when
every one is refuted, the pinning search of `vacuity.py` runs over the satisfiable shapes. None is a failure.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import z3

from elpis.bend.check import Program
from elpis.bend.core import NAT, U32, FunT, LawInfo, ListT, Opaque, free_vars
from elpis.bend.errors import BendError
from elpis.bend.symexec import SData, SNat, SOpaque, Sorts, SymExec, is_false

if TYPE_CHECKING:
    from elpis.bend.vacuity import Witness

MAX_BOUND = 32
MAX_SHAPES = 500_000
# A query's budget is z3's resource count, not seconds, so a verdict does not depend on how busy the machine
# is: z3 counts units of work (a limit set on a solver is relative to the count it starts from). The count
# varies with the search z3 takes, up to ~2x between runs in one process, never with the load. The heaviest
# query of the committed laws (gdn_plan_walk_is_sound, its longest shape) used 3.0e7-4.1e7 units, 22-38 s
# on the 2-core CI machine unloaded and 84 s loaded, where the former 120 s limit left a margin of 1.4.
# Each certificate records its queries' units.
QUERY_RLIMIT = 600_000_000
QUERY_TIMEOUT_MS = 3_600_000  # a backstop against a hung solver only; the resource limit decides


@dataclass
class SmtOutcome:
    ok: bool
    message: str
    certificate: dict
    witness: dict | None = None  # the confirmed vacuity witness (as certified) or a counterexample
    shapes: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def solver_version() -> str:
    return f"z3 {z3.get_version_string()}"


class LawSmt:
    def __init__(self, prog: Program, law: LawInfo) -> None:
        self.prog = prog
        self.law = law
        self.sorts = Sorts(prog)
        for c in law.hyps:
            if c.hyp.binders:
                raise BendError(
                    f"{law.loc}: law {law.name}: hypothesis {c.source} quantifies over values; "
                    "such laws need a kernel proof (a def proving it), not the SMT layer"
                )

    # ------------------------------------------------------------ shapes
    def bounds(self) -> dict[str, int]:
        """Bound of every list (its length) and Nat (its value) variable the hypotheses bound."""
        found: dict[str, int] = {}
        compared = set().union(
            *[_compared_nats(h.hyp.eq.lhs) | _compared_nats(h.hyp.eq.rhs) for h in self.law.hyps]
        )
        for c in self.law.values:
            if not isinstance(c.ty, ListT) and not (c.ty == NAT and c.name in compared):
                continue
            relevant = [h for h in self.law.hyps if c.name in _hyp_vars(h)]
            if not relevant:
                continue
            for limit in range(MAX_BOUND + 1):
                if self._refuted_beyond(c.name, limit, relevant, found):
                    found[c.name] = limit
                    break
        return found

    def _refuted_beyond(self, name: str, limit: int, hyps: list, found: dict[str, int]) -> bool:
        others = sorted({v for h in hyps for v in _hyp_vars(h)} & set(found))
        for values in itertools.product(*[range(found[o] + 1) for o in others]):
            ex = SymExec(self.prog, self.sorts)
            env = symbolic_values(ex, self.law, dict(zip(others, values, strict=True)))
            ty = self._var_ty(name)
            if ty == NAT:
                e = z3.Int(f"{name}_beyond")
                ex.side.append(e > limit)
                env[name] = SNat(e, limit + 1, None)
            else:
                items = [ex.fresh(f"{name}{i}", ty.elem) for i in range(limit + 1)]
                env[name] = ex.list_of(items, ty, ex.fresh(f"{name}_tail", ty))
            if not any(is_false(self._hyp_value(ex, h, env)) for h in hyps):
                return False
        return True

    def _var_ty(self, name: str):
        return next(c.ty for c in self.law.values if c.name == name)

    def _hyp_value(self, ex: SymExec, clause, env: dict[str, object]) -> object:
        eq = clause.hyp.eq
        return ex.equal(ex.eval(eq.lhs, env), ex.eval(eq.rhs, env), eq.ty)

    # ------------------------------------------------------------ discharge
    def run(self, deadline: float | None = None) -> SmtOutcome:
        """Prove the law; with a deadline (perf_counter seconds), give up there with "unknown"."""
        from elpis.bend.vacuity import WitnessSearch  # not at the top: vacuity uses this module

        start = time.perf_counter()
        self._witnesses = WitnessSearch(self.prog, self.law, self.sorts)
        self._witness: Witness | None = None  # the first model of the hypotheses the interpreter confirms
        bounded = self.bounds()
        names = sorted(bounded)
        total = 1
        for n in names:
            total *= bounded[n] + 1
        if total > MAX_SHAPES:
            raise BendError(
                f"{self.law.loc}: law {self.law.name}: {total} shapes is too many for the SMT layer"
            )
        shape_certs = []
        satisfiable: list[dict[str, int]] = []
        self._pruned: dict[tuple, bool] = {}
        for lengths in itertools.product(*[range(bounded[n] + 1) for n in names]):
            shape = dict(zip(names, lengths, strict=True))
            if self._ruled_out(shape):
                continue
            if deadline is not None and time.perf_counter() > deadline:
                return self._outcome(False, "timeout", shape_certs, start, None, bounded)
            result = self._query(shape)
            if result is None:
                continue  # the hypotheses are false for this shape by evaluation alone
            cert, verdict, model_values = result
            shape_certs.append(cert)
            if cert["hypotheses"] == "sat":
                satisfiable.append(shape)
            if verdict != "unsat":
                return self._outcome(False, verdict, shape_certs, start, model_values, bounded)
        if not satisfiable:
            return self._outcome(False, "vacuous", shape_certs, start, None, bounded)
        return self._witnessed(satisfiable, shape_certs, start, bounded)

    def _witnessed(
        self, satisfiable: list[dict[str, int]], certs: list[dict], start: float, bounded: dict[str, int]
    ) -> SmtOutcome:
        """The proved law's outcome: it passes only with values its hypotheses hold for when run.

        Every satisfiable shape's model was refuted (each kept a recursion abstract) when none is confirmed
        yet: search those shapes with the recursions' Nats pinned small, as for kernel laws.
        """
        try:
            witness = self._witness or self._witnesses.run(satisfiable)
        except BendError as err:
            return self._outcome(False, "unwitnessed", certs, start, str(err), bounded)
        return self._outcome(True, "unsat", certs, start, self._witnesses.record(witness), bounded)

    def _ruled_out(self, shape: dict[str, int]) -> bool:
        """Is some hypothesis false by evaluation alone for this shape? (memoised per hypothesis)"""
        for i, h in enumerate(self.law.hyps):
            mentioned = tuple(sorted(n for n in _hyp_vars(h) if n in shape))
            key = (i, tuple(shape[n] for n in mentioned))
            if key not in self._pruned:
                ex = SymExec(self.prog, self.sorts)
                env = symbolic_values(ex, self.law, {n: shape[n] for n in mentioned})
                self._pruned[key] = is_false(self._hyp_value(ex, h, env))
            if self._pruned[key]:
                return True
        return False

    def _query(self, shape: dict[str, int]):
        ex = SymExec(self.prog, self.sorts)
        env = symbolic_values(ex, self.law, shape)
        hyps = [self._hyp_value(ex, h, env) for h in self.law.hyps]
        if any(is_false(h) for h in hyps):
            return None
        pins = self._pins(ex, env)
        if pins:  # evaluate again with the forced leaves made concrete (same fresh names, same order)
            ex = SymExec(self.prog, self.sorts, pins)
            env = symbolic_values(ex, self.law, shape)
            hyps = [self._hyp_value(ex, h, env) for h in self.law.hyps]
            if any(is_false(h) for h in hyps):
                return None
        hyp_abstracted = set(ex.abstracted)  # before the goal adds its own
        goal = ex.equal(ex.eval(self.law.goal.lhs, env), ex.eval(self.law.goal.rhs, env), self.law.goal.ty)
        t0 = time.perf_counter()
        solver = z3.Solver()
        solver.set("rlimit", QUERY_RLIMIT)
        solver.set("timeout", QUERY_TIMEOUT_MS)
        units_before = resource_count(solver)
        solver.add(*ex.side)
        solver.add(*[h if not isinstance(h, bool) else z3.BoolVal(h) for h in hyps])
        hyp_result = solver.check()
        hyp_model = solver.model() if hyp_result == z3.sat and self._witness is None else None
        model_values = None
        solver.add(z3.Not(goal) if not isinstance(goal, bool) else z3.BoolVal(not goal))
        smt2 = solver.to_smt2()
        result = solver.check()
        verdict = str(result)
        if result == z3.unknown:
            verdict = f"unknown ({solver.reason_unknown()}; budget {QUERY_RLIMIT:,} resource units)"
        if result == z3.sat:
            model_values = self._decode(solver.model(), env)
            if ex.abstracted:  # the model may exist only for the uninterpreted stand-ins
                verdict = "unknown"
                model_values = {"abstracted": sorted(ex.abstracted), "model": model_values}
        cert = {
            "shape": {self._source(n): v for n, v in shape.items()},
            "hypotheses": str(hyp_result),
            "result": str(result),
            "smt2_sha256": hashlib.sha256(smt2.encode()).hexdigest(),
            "seconds": round(time.perf_counter() - t0, 4),
            "resource_units": resource_count(solver) - units_before,
        }
        if hyp_model is not None:  # after the timing: the shape's seconds are z3's
            self._witness = self._witnesses.check_model(hyp_model, env, hyp_abstracted)
        return cert, verdict, model_values

    def _pins(self, ex: SymExec, env: dict[str, object]) -> dict[str, object]:
        """Leaves a hypothesis `{e == c}` forces to a concrete value (e evaluates to a fresh leaf).

        Substituting them is sound: it keeps exactly the models the hypothesis allows.
        """
        pins: dict[str, object] = {}
        for h in self.law.hyps:
            eq = h.hyp.eq
            if eq.ty not in (NAT, U32) and not isinstance(eq.ty, Opaque):
                continue
            lhs, rhs = ex.eval(eq.lhs, env), ex.eval(eq.rhs, env)
            for leaf, value in ((lhs, rhs), (rhs, lhs)):
                name = _leaf_name(leaf)
                concrete = _concrete(value)
                if name is not None and concrete is not None:
                    pins[name] = concrete
        return pins

    def _source(self, core_name: str) -> str:
        return next(c.source for c in self.law.clauses if c.name == core_name)

    def _decode(self, model: z3.ModelRef, env: dict[str, object]) -> dict:
        out = {}
        for c in self.law.values:
            out[c.source] = _show(model, env[c.name], c.ty)
        return out

    def _outcome(self, ok, verdict, certs, start, values, bounded) -> SmtOutcome:
        seconds = time.perf_counter() - start
        joined = "".join(c["smt2_sha256"] for c in certs)
        cert = {
            "law": self.law.name,
            "module": self.law.module,
            "location": self.law.loc,
            "method": "smt",
            "solver": solver_version(),
            "bounds": {self._source(n): v for n, v in sorted(bounded.items())},
            "unbounded": [
                c.source for c in self.law.values if isinstance(c.ty, ListT) and c.name not in bounded
            ],
            "shapes": certs,
            "smt2_sha256": hashlib.sha256(joined.encode()).hexdigest(),
            "result": verdict,
            "seconds": round(seconds, 3),
        }
        if ok:
            cert["vacuity_witness"] = values
            msg = f"proved by z3 over {len(certs)} shape(s)"
        elif verdict == "vacuous":
            msg = "its hypotheses are unsatisfiable (vacuous law)"
        elif verdict == "unwitnessed":
            msg, values = values, None  # the witness search's failure (not a witness)
        elif verdict == "sat":
            msg = f"false: counterexample {values}"
        elif isinstance(values, dict) and "abstracted" in values:
            msg = (
                f"no proof: z3 found a model, but this shape evaluates {', '.join(values['abstracted'])} "
                f"as uninterpreted functions, so it may be spurious: {values['model']}"
            )
        else:
            msg = f"z3 answered {verdict} (no proof)"
        return SmtOutcome(ok, msg, cert, values, len(certs), seconds)


def symbolic_values(
    ex: SymExec, law: LawInfo, shape: dict[str, int], skip: Collection[str] = ()
) -> dict[str, object]:
    """Fresh values for the law's variables but `skip`; one in `shape` is a list that long or that Nat."""
    env: dict[str, object] = {}
    for c in law.values:
        if c.name in skip:
            continue
        if c.name in shape and c.ty == NAT:
            env[c.name] = shape[c.name]
        elif c.name in shape:
            items = [ex.fresh(f"{c.source}{i}", c.ty.elem) for i in range(shape[c.name])]
            env[c.name] = ex.list_of(items, c.ty)
        else:
            env[c.name] = ex.fresh(c.source, c.ty)
    return env


def _leaf_name(v: object) -> str | None:
    term = v.e if isinstance(v, SNat) else v
    if isinstance(term, z3.ExprRef) and z3.is_const(term) and term.decl().kind() == z3.Z3_OP_UNINTERPRETED:
        return term.decl().name()
    return None


def _concrete(v: object) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, z3.BitVecRef) and z3.is_bv_value(v):
        return v.as_long()
    return None


NAT_COMPARISONS = ("Nat.is_lt", "Nat.is_le", "Nat.is_gt", "Nat.is_ge")


def _compared_nats(t) -> set[str]:
    """Nat variables that a hypothesis compares directly (candidates for a bound)."""
    from elpis.bend.core import CCall, CCtor, CPrim, CSucc, CVar

    out: set[str] = set()
    if isinstance(t, CPrim):
        if t.op in NAT_COMPARISONS:
            out |= {a.name for a in t.args if isinstance(a, CVar)}
        for a in t.args:
            out |= _compared_nats(a)
    elif isinstance(t, CCall | CCtor):
        for a in t.args:
            out |= _compared_nats(a)
    elif isinstance(t, CSucc):
        out |= _compared_nats(t.arg)
    return out


def _hyp_vars(clause) -> set[str]:
    eq = clause.hyp.eq
    return free_vars(eq.lhs) | free_vars(eq.rhs)


def _show(model: z3.ModelRef, v: object, ty) -> object:
    if isinstance(ty, FunT):
        return "<function>"
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, SNat):
        return model.eval(v.e, model_completion=True).as_long()
    if isinstance(v, z3.BitVecRef):
        return model.eval(v, model_completion=True).as_long()
    if isinstance(v, z3.BoolRef):
        return z3.is_true(model.eval(v, model_completion=True))
    if isinstance(v, SData):
        for guard, ctor, fields in v.alts:
            g = guard if isinstance(guard, bool) else z3.is_true(model.eval(guard, model_completion=True))
            if not g:
                continue
            if ctor == "Nil":
                return []
            if ctor == "Con":
                elem_ty = ty.elem if isinstance(ty, ListT) else None
                return [_show(model, fields[0], elem_ty), *_show(model, fields[1], ty)]
            return {ctor: [_show(model, f, None) for f in fields]}
    if isinstance(v, SOpaque):
        return str(model.eval(v.term, model_completion=True))
    return str(v)


def resource_count(solver: z3.Solver) -> int:
    """z3's resource counter (the units `QUERY_RLIMIT` bounds), as the solver's statistics report it."""
    stats = solver.statistics()  # not a mapping: `in` would walk its (key, value) rows
    return int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0  # noqa: SIM118
