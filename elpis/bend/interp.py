"""Run checked core: strict, total, compiled once into Python closures.

Values: Nat/U32/token ids are ints, Bool is bool, lists are tuples, Maybe and user data are
`Data(ctor, fields)`, functions (template arguments) are Python callables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

from elpis.bend.check import Program
from elpis.bend.core import (
    CU32,
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
    Prim,
)
from elpis.bend.prims import PRIMS


class Data(NamedTuple):
    ctor: str
    fields: tuple


Env = dict
Code = Callable[[Env], object]


class Interpreter:
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self._fns: dict[str, Callable[..., object]] = {}
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))

    def function(self, key: str) -> Callable[..., object]:
        """The def `key` (e.g. "bend/chain.bend::accept") as a Python function."""
        if key not in self._fns:
            fun = self.prog.funs[key]
            names = [n for n, _, _ in fun.params]
            cell: list[Code] = []

            def run(*args: object, _names=names, _cell=cell) -> object:
                return _cell[0](dict(zip(_names, args, strict=True)))

            self._fns[key] = run
            cell.append(self._compile(fun.body))
        return self._fns[key]

    def call(self, key: str, *args: object) -> object:
        return self.function(key)(*args)

    def eval(self, t: Core, env: Env) -> object:
        return self._compile(t)(env)

    # ------------------------------------------------------------------ compilation
    def _compile(self, t: Core) -> Code:
        match t:
            case CVar(n):
                return lambda env: env[n]
            case CNat(v) | CU32(v):
                return lambda env: v
            case CSucc(k, a):
                ca = self._compile(a)
                return lambda env: ca(env) + k
            case CGlobal(key):
                return lambda env: self.function(key)
            case CCall(key, args):
                cargs = [self._compile(a) for a in args]
                fns = self._fns

                def call(env: Env) -> object:
                    fn = fns.get(key) or self.function(key)
                    return fn(*[c(env) for c in cargs])

                return call
            case CApply(fn, args):
                cargs = [self._compile(a) for a in args]
                return lambda env: env[fn](*[c(env) for c in cargs])
            case CPrim(op, args):
                impl = PRIMS[op].fn
                cargs = [self._compile(a) for a in args]
                if len(cargs) == 2:
                    c0, c1 = cargs
                    return lambda env: impl(c0(env), c1(env))
                (c0,) = cargs
                return lambda env: impl(c0(env))
            case CCtor(_, ctor, args):
                return self._compile_ctor(t.tkey, ctor, args)
            case CLet(n, v, b, _):
                cv, cb = self._compile(v), self._compile(b)

                def let(env: Env) -> object:
                    inner = dict(env)
                    inner[n] = cv(env)
                    return cb(inner)

                return let
            case CCase():
                return self._compile_case(t)
        raise TypeError(f"cannot run {t!r}")

    def _compile_ctor(self, tkey: str, ctor: str, args: tuple[Core, ...]) -> Code:
        cargs = [self._compile(a) for a in args]
        if tkey == "Bool":
            value = ctor == "True"
            return lambda env: value
        if tkey == "List":
            if ctor == "Nil":
                return lambda env: ()
            ch, ct = cargs
            return lambda env: (ch(env), *ct(env))
        return lambda env: Data(ctor, tuple(c(env) for c in cargs))

    def _compile_case(self, t: CCase) -> Code:
        sc = t.scrut
        if t.lits:
            table = {v: self._compile(b) for v, b in t.lits}
            default = self._compile(t.default)
            return lambda env: table.get(env[sc], default)(env)
        branches = {br.ctor: (br.binders, self._compile(br.body)) for br in t.branches}
        if isinstance(t.ty, Prim) and t.ty.name == "Nat":
            (_, zero), (sb, succ) = branches["Zero"], branches["Succ"]
            pred = sb[0]

            def nat_case(env: Env) -> object:
                n = env[sc]
                if n == 0:
                    return zero(env)
                inner = dict(env)
                inner[pred] = n - 1
                return succ(inner)

            return nat_case
        if isinstance(t.ty, Prim) and t.ty.name == "Bool":
            _, on_false = branches["False"]
            _, on_true = branches["True"]
            return lambda env: on_true(env) if env[sc] else on_false(env)
        if "Nil" in branches:
            _, nil = branches["Nil"]
            (hb, tb), cons = branches["Con"]

            def list_case(env: Env) -> object:
                xs = env[sc]
                if not xs:
                    return nil(env)
                inner = dict(env)
                inner[hb] = xs[0]
                inner[tb] = xs[1:]
                return cons(inner)

            return list_case

        def data_case(env: Env) -> object:
            v = env[sc]
            binders, body = branches[v.ctor]
            inner = dict(env)
            for b, f in zip(binders, v.fields, strict=True):
                inner[b] = f
            return body(inner)

        return data_case
