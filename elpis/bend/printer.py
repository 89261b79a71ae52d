"""Print the AST back as canonical Bend-subset text (2-space indentation).

The round trip `parse(print(m)) == m` holds for every module (tested on every source file).
"""

from __future__ import annotations

from elpis.bend import syntax as s

INDENT = "  "


def expr(e: s.Expr) -> str:
    match e:
        case s.EVar(name):
            return name
        case s.ETemplate(name):
            return f"~{name}"
        case s.ECall(fn, args):
            return f"{fn}({', '.join(expr(a) for a in args)})"
        case s.ECtor(name, args):
            return f"{name}{{{', '.join(expr(a) for a in args)}}}"
        case s.ENat(value):
            return f"{value}n"
        case s.ESucc(k, arg):
            return f"{k}n+{_atom(arg)}"
        case s.EU32(value):
            return str(value)
        case s.EList(items):
            return f"[{', '.join(expr(a) for a in items)}]"
        case s.ECons(head, tail):
            return f"{_atom(head)} <> {expr(tail)}"
        case s.EOp(op, lhs, rhs, ty):
            return f"({expr(lhs)} {op} {expr(rhs)} : {type_(ty)})"
        case s.EAnn(inner, ty):
            return f"{{{expr(inner)} : {type_(ty)}}}"
        case s.ERefl():
            return "{==}"
        case s.EHole():
            return "_"
    raise TypeError(f"not an expression: {e!r}")


def _atom(e: s.Expr) -> str:
    text = expr(e)
    return f"({text})" if isinstance(e, s.ECons) else text


def type_(t: s.TArg) -> str:
    match t:
        case s.TName(name, args):
            return f"{name}<{', '.join(type_(a) for a in args)}>" if args else name
        case s.TQuant(q):
            return q
        case s.TEq(lhs, rhs, ty):
            return f"{{{expr(lhs)} == {expr(rhs)} : {type_(ty)}}}"
        case s.TArrow(dom, cod, binder, quant):
            left = _type_atom(dom)
            if binder is None:
                return f"{left} -> {type_(cod)}"
            return f"@{quant}{binder}: {left} -> {type_(cod)}"
    raise TypeError(f"not a type: {t!r}")


def _type_atom(t: s.Type) -> str:
    text = type_(t)
    return f"({text})" if isinstance(t, s.TArrow) else text


def pattern(p: s.Pattern) -> str:
    match p:
        case s.PWild():
            return "_"
        case s.PVar(name, quant):
            return f"{quant}{name}"
        case s.PNat(value):
            return f"{value}n"
        case s.PSucc(k, arg):
            return f"{k}n+{_pat_atom(arg)}"
        case s.PU32(value):
            return str(value)
        case s.PCtor(name, args):
            return f"{name}{{{', '.join(pattern(a) for a in args)}}}"
        case s.PCons(head, tail):
            return f"{_pat_atom(head)} <> {pattern(tail)}"
    raise TypeError(f"not a pattern: {p!r}")


def _pat_atom(p: s.Pattern) -> str:
    text = pattern(p)
    return f"({text})" if isinstance(p, s.PCons) else text


def _param(p: s.Param) -> str:
    return f"{p.quant}{p.name}" + (f": {type_(p.ty)}" if p.ty is not None else "")


def block(b: s.Block, depth: int) -> list[str]:
    pad = INDENT * depth
    lines: list[str] = []
    for st in b.stmts:
        if isinstance(st, s.SLet):
            lines.append(f"{pad}{st.quant}{st.name} = {expr(st.expr)}")
        else:
            lines.append(f"{pad}%{expr(st.proof)} : {type_(st.motive)}")
    if isinstance(b.tail, s.Match):
        lines.append(f"{pad}match {' '.join(b.tail.scrutinees)}:")
        for case in b.tail.cases:
            lines.append(f"{pad}{INDENT}case {' '.join(pattern(p) for p in case.patterns)}:")
            lines.extend(block(case.body, depth + 2))
    else:
        lines.append(f"{pad}{expr(b.tail)}")
    return lines


def item(it: s.Item) -> list[str]:
    match it:
        case s.Import(None, _):
            return ["import Base"]
        case s.Import(path, alias):
            return [f"import {path} as {alias}"]
        case s.TypeDef(name, ctors):
            lines = [f"type {name} is Data:"]
            for c in ctors:
                fields = ", ".join(f"{f.name}: {type_(f.ty)}" for f in c.fields)
                lines.append(f"{INDENT}{c.name}{{{fields}}}")
            return lines
        case s.Def(name, params, ret, body):
            head = f"def {name}({', '.join(_param(p) for p in params)})"
            if ret is not None:
                head += f" -> {type_(ret)}"
            return [head + ":", *block(body, 1)]
        case s.Law(name, clauses, goal):
            lines = [f"law {name}:"]
            lines.extend(f"{INDENT}for {_param(c)}" for c in clauses)
            lines.append(f"{INDENT}{type_(goal)}")
            return lines
    raise TypeError(f"not a top-level item: {it!r}")


def module(m: s.Module) -> str:
    out: list[str] = []
    for i, it in enumerate(m.items):
        if i and not (isinstance(it, s.Import) and isinstance(m.items[i - 1], s.Import)):
            out.append("")
        out.extend(item(it))
    return "\n".join(out) + "\n"
