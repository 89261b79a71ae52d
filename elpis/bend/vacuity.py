"""Vacuity check for kernel-proved laws: find values that satisfy every hypothesis.

(SMT-proved laws get theirs inside `smt.py`, shape by shape.) A hypothesis under binders,
`@x..: A.. -> {f(x..) == rhs : T}` with f a template variable applied to exactly its binders and not
mentioned in rhs, is satisfiable by definition (take f to be rhs); it is used that way. The other
hypotheses are handed to z3 with every list variable tried at small lengths. A model found is
returned as the witness; none found is a failure.
"""

from __future__ import annotations

import itertools

import z3

from elpis.bend.check import Program
from elpis.bend.core import CApply, CVar, FunT, LawInfo, ListT, free_vars
from elpis.bend.errors import BendError
from elpis.bend.smt import QUERY_TIMEOUT_MS
from elpis.bend.symexec import Sorts, SymExec, is_false

SMALL = 2  # list lengths tried: 0..SMALL
# z3 resource units per check (see elpis.bend.smt.QUERY_RLIMIT): about twice what the former 30 s limit
# allowed on an idle core, and the same on any machine
VACUITY_RLIMIT = 60_000_000


def vacuity_witness(prog: Program, law: LawInfo) -> dict:
    definitions: dict[str, tuple[list[str], object]] = {}
    plain = []
    for c in law.hyps:
        hyp = c.hyp
        if not hyp.binders:
            plain.append(c)
            continue
        names = [b for b, _ in hyp.binders]
        defined = False
        for app, body in ((hyp.eq.lhs, hyp.eq.rhs), (hyp.eq.rhs, hyp.eq.lhs)):
            if (
                isinstance(app, CApply)
                and app.fn not in definitions
                and [a.name if isinstance(a, CVar) else None for a in app.args] == names
                and app.fn not in free_vars(body)
            ):
                definitions[app.fn] = (names, body)
                defined = True
                break
        if defined:
            continue
        raise BendError(
            f"{law.loc}: law {law.name}: cannot show hypothesis {c.source} satisfiable "
            "(a quantified hypothesis must define a template variable: f(x..) == rhs)"
        )
    sorts = Sorts(prog)
    lists = [c for c in law.values if isinstance(c.ty, ListT)]
    for lengths in itertools.product(range(SMALL + 1), repeat=len(lists)):
        ex = SymExec(prog, sorts)
        env: dict[str, object] = {}
        for c in law.values:
            if c.name in definitions:
                continue
            env[c.name] = ex.fresh(c.source, c.ty)
        for c, n in zip(lists, lengths, strict=True):
            env[c.name] = ex.list_of([ex.fresh(f"{c.source}{i}", c.ty.elem) for i in range(n)], c.ty)
        for name, (params, body) in definitions.items():
            env[name] = ex.lambda_(params, body, env)
        try:
            hyps = [
                ex.equal(ex.eval(h.hyp.eq.lhs, env), ex.eval(h.hyp.eq.rhs, env), h.hyp.eq.ty) for h in plain
            ]
        except BendError:
            continue
        if any(is_false(h) for h in hyps):
            continue
        solver = z3.Solver()
        solver.set("rlimit", VACUITY_RLIMIT)  # resource units, not seconds: the same verdict on any machine
        solver.set("timeout", QUERY_TIMEOUT_MS)
        solver.add(*ex.side)
        solver.add(*[z3.BoolVal(h) if isinstance(h, bool) else h for h in hyps])
        if solver.check() == z3.sat:
            model = solver.model()
            from elpis.bend.smt import _show

            return {
                c.source: "<defined by its quantified hypothesis>"
                if c.name in definitions
                else _show(model, env[c.name], c.ty)
                for c in law.values
                if not isinstance(c.ty, FunT) or c.name in definitions
            }
    raise BendError(
        f"{law.loc}: law {law.name}: vacuity check failed: no values with lists of length <= {SMALL} "
        "satisfy its hypotheses"
    )
