"""Defence-in-depth scan of the generated C: token ids are only copied and compared with == / !=.

The Bend front end already enforces this on the source; this scan checks the C the compiler will
actually see. The file is preprocessed by the C compiler against stand-in <stdint.h>/<stdbool.h>
headers (so macros cannot hide anything) and parsed with pycparser. A flow-insensitive taint analysis
starts from the exported functions' token parameters (draft, target, stops) and follows copies through
variables, array elements, struct fields, helper-function parameters and return values to a fixpoint.
Any tainted value used in ordering (<, >, <=, >=), arithmetic or bitwise operators, as a truth value,
as an array index, in a switch, or in a narrowing cast is a violation. The scan also requires that the
file includes only <stdint.h>/<stdbool.h> (and its own header), exports exactly the three ABI functions,
calls no function it does not define, and keeps no mutable file-scope state (the glue calls it with the
GIL released).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pycparser import c_ast, c_parser

# Exported function -> positions of its token-array parameters (CONTRACTS.md, "Generated C").
EXPORTS: dict[str, tuple[int, ...]] = {
    "elpis_chain_accept": (1, 2, 4),
    "elpis_tree_accept": (2, 3, 5),
    "elpis_tree_masks": (),
}
ALLOWED_SYSTEM_HEADERS = {"stdint.h", "stdbool.h"}
ALLOWED_LOCAL_HEADERS = {"acceptors.h"}
# Casts a token may go through without changing its value.
VALUE_PRESERVING_CASTS = {"uint32_t", "uint64_t", "int64_t", "unsigned long long", "unsigned long"}

_STAND_IN_STDINT = """\
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t; typedef unsigned long size_t;
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT32_MIN (-2147483647 - 1)
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 4294967295U
#define UINT64_MAX 18446744073709551615ULL
#define UINT32_C(x) x##U
#define UINT64_C(x) x##ULL
#define INT32_C(x) x
#define INT64_C(x) x##LL
"""
_STAND_IN_STDBOOL = "#define bool _Bool\n#define true 1\n#define false 0\n"

_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
_FORBIDDEN_TEXT = (
    (re.compile(r"\b(asm|__asm__|__asm)\b"), "inline assembly"),
    (re.compile(r"^\s*#\s*pragma\b", re.MULTILINE), "#pragma"),
)
_ORDERING = {"<", ">", "<=", ">="}
_EQUALITY = {"==", "!="}


class ScanError(Exception):
    """The C could not be preprocessed or parsed."""


@dataclass
class _State:
    tainted_vars: set[tuple[str | None, str]] = field(default_factory=set)  # (function or None, name)
    tainted_fields: set[str] = field(default_factory=set)
    tainted_returns: set[str] = field(default_factory=set)
    tainted_params: set[tuple[str, int]] = field(default_factory=set)
    functions: dict[str, c_ast.FuncDef] = field(default_factory=dict)
    params: dict[str, list[str]] = field(default_factory=dict)
    locals: dict[str, set[str]] = field(default_factory=dict)
    structs: dict[str, list[str]] = field(default_factory=dict)
    var_struct: dict[tuple[str | None, str], str] = field(default_factory=dict)
    containers: set[tuple[str | None, str]] = field(default_factory=set)  # pointers and arrays
    changed: bool = False


def scan(c_file: Path, h_file: Path, cc: str = "gcc") -> list[str]:
    """Return every violation found in the generated C (empty list: clean)."""
    problems: list[str] = []
    for path, allowed_local in ((c_file, ALLOWED_LOCAL_HEADERS), (h_file, set())):
        text = Path(path).read_text()
        for kind, name in _INCLUDE.findall(text):
            ok = name in ALLOWED_SYSTEM_HEADERS if kind == "<" else name in allowed_local
            if not ok:
                closing = ">" if kind == "<" else '"'
                problems.append(
                    f"{path.name}: includes {kind}{name}{closing}: only <stdint.h>/<stdbool.h> allowed"
                )
        for pattern, what in _FORBIDDEN_TEXT:
            if pattern.search(text):
                problems.append(f"{path.name}: contains {what}")
    if problems:  # a foreign header would not even preprocess against the stand-ins
        return problems
    ast = _parse(c_file, h_file.parent, cc)
    problems += _check_ast(ast, c_file.name)
    return problems


def _parse(c_file: Path, include_dir: Path, cc: str) -> c_ast.FileAST:
    with tempfile.TemporaryDirectory(prefix="elpis-cscan-") as tmp:
        stand_in = Path(tmp)
        (stand_in / "stdint.h").write_text(_STAND_IN_STDINT)
        (stand_in / "stdbool.h").write_text(_STAND_IN_STDBOOL)
        result = subprocess.run(
            [cc, "-E", "-nostdinc", "-std=c11", f"-I{stand_in}", f"-I{include_dir}", str(c_file)],
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise ScanError(f"preprocessing {c_file.name} failed: {result.stderr.strip()}")
    try:
        return c_parser.CParser().parse(result.stdout, filename=c_file.name)
    except Exception as exc:  # pycparser raises its own ParseError; any failure is fail-closed
        raise ScanError(f"parsing {c_file.name} failed: {exc}") from exc


def _check_ast(ast: c_ast.FileAST, name: str) -> list[str]:
    state = _State()
    problems: list[str] = []
    exported: set[str] = set()
    for node in ast.ext:
        if isinstance(node, c_ast.FuncDef):
            fname = node.decl.name
            state.functions[fname] = node
            state.params[fname] = _param_names(node.decl)
            state.locals[fname] = set()
            if "static" not in (node.decl.storage or []):
                exported.add(fname)
        elif isinstance(node, c_ast.Decl):
            _record_struct(node.type, state)
            if isinstance(node.type, c_ast.FuncDecl) or node.name is None:
                continue
            if "typedef" in (node.storage or []):
                continue
            if "const" not in _qualifiers(node.type):
                problems.append(f"{name}: mutable file-scope variable {node.name!r}")
            if isinstance(node.type, (c_ast.ArrayDecl, c_ast.PtrDecl)):
                state.containers.add((None, node.name))
        elif isinstance(node, c_ast.Typedef):
            _record_struct(node.type, state)
    for missing in sorted(set(EXPORTS) - exported):
        problems.append(f"{name}: does not define the exported function {missing}")
    for extra in sorted(exported - set(EXPORTS)):
        problems.append(f"{name}: exports {extra}, which is not part of the ABI (make it static)")
    for fname, positions in EXPORTS.items():
        params = state.params.get(fname, [])
        for i in positions:
            if i < len(params):
                state.tainted_params.add((fname, i))
                state.tainted_vars.add((fname, params[i]))
            else:
                problems.append(f"{name}: {fname} lacks parameter {i}")
    for fname, fn in state.functions.items():
        for node in _walk(fn.body):
            if isinstance(node, c_ast.Decl) and node.name:
                state.locals[fname].add(node.name)
                struct = _struct_name(node.type)
                if struct:
                    state.var_struct[fname, node.name] = struct
                if isinstance(node.type, (c_ast.ArrayDecl, c_ast.PtrDecl)):
                    state.containers.add((fname, node.name))
        for pname, ptype in zip(state.params[fname], _param_types(fn.decl), strict=True):
            struct = _struct_name(ptype)
            if struct:
                state.var_struct[fname, pname] = struct
            if isinstance(ptype, (c_ast.ArrayDecl, c_ast.PtrDecl)):
                state.containers.add((fname, pname))

    state.changed = True
    while state.changed:
        state.changed = False
        for fname, fn in state.functions.items():
            _propagate(fname, fn, state)
    for fname, fn in state.functions.items():
        problems += [f"{name}: {fname}: {p}" for p in _violations(fname, fn, state)]
    return problems


# --- AST helpers ------------------------------------------------------------------------------------


def _walk(node: c_ast.Node | None):
    if node is None:
        return
    yield node
    for _, child in node.children():
        yield from _walk(child)


def _param_decls(decl: c_ast.Decl) -> list[c_ast.Node]:
    args = getattr(decl.type, "args", None)
    if args is None:
        return []
    return [p for p in args.params if not (isinstance(p, c_ast.Typename) and _is_void(p))]


def _is_void(node: c_ast.Typename) -> bool:
    t = node.type
    return (
        isinstance(t, c_ast.TypeDecl)
        and isinstance(t.type, c_ast.IdentifierType)
        and t.type.names == ["void"]
    )


def _param_names(decl: c_ast.Decl) -> list[str]:
    return [getattr(p, "name", None) or f"#{i}" for i, p in enumerate(_param_decls(decl))]


def _param_types(decl: c_ast.Decl) -> list[c_ast.Node]:
    return [p.type for p in _param_decls(decl)]


def _qualifiers(node: c_ast.Node) -> list[str]:
    quals: list[str] = []
    while node is not None:
        quals += getattr(node, "quals", []) or []
        node = getattr(node, "type", None)
    return quals


def _struct_name(node: c_ast.Node) -> str | None:
    while node is not None:
        if isinstance(node, c_ast.Struct):
            return node.name
        if isinstance(node, c_ast.IdentifierType):
            return "typedef:" + " ".join(node.names)
        node = getattr(node, "type", None)
    return None


def _record_struct(node: c_ast.Node, state: _State, alias: str | None = None) -> None:
    while node is not None:
        if isinstance(node, c_ast.Struct) and node.decls is not None:
            fields = [d.name for d in node.decls]
            if node.name:
                state.structs[node.name] = fields
            if alias:
                state.structs["typedef:" + alias] = fields
            return
        if isinstance(node, c_ast.TypeDecl) and node.declname and alias is None:
            alias = node.declname
        node = getattr(node, "type", None)


# --- taint ------------------------------------------------------------------------------------------


def _var_key(fname: str, var: str, state: _State) -> tuple[str | None, str]:
    if var in state.locals.get(fname, set()) or var in state.params.get(fname, []):
        return fname, var
    return None, var


def _base_var(expr: c_ast.Node) -> str | None:
    """The variable an lvalue-ish expression stores into (x, x[i], *x, &x)."""
    while True:
        if isinstance(expr, c_ast.ID):
            return expr.name
        if isinstance(expr, c_ast.ArrayRef):
            expr = expr.name
        elif (isinstance(expr, c_ast.UnaryOp) and expr.op in ("*", "&")) or isinstance(expr, c_ast.Cast):
            expr = expr.expr
        else:
            return None


def _tainted(expr: c_ast.Node | None, fname: str, state: _State) -> bool:
    if expr is None:
        return False
    if isinstance(expr, c_ast.ID):
        return _var_key(fname, expr.name, state) in state.tainted_vars
    if isinstance(expr, c_ast.ArrayRef):
        return _tainted(expr.name, fname, state)
    if isinstance(expr, c_ast.StructRef):
        return expr.field.name in state.tainted_fields
    if isinstance(expr, c_ast.UnaryOp):
        return expr.op in ("*", "&") and _tainted(expr.expr, fname, state)
    if isinstance(expr, c_ast.Cast):
        return _tainted(expr.expr, fname, state)
    if isinstance(expr, c_ast.TernaryOp):
        return _tainted(expr.iftrue, fname, state) or _tainted(expr.iffalse, fname, state)
    if isinstance(expr, c_ast.FuncCall):
        return isinstance(expr.name, c_ast.ID) and expr.name.name in state.tainted_returns
    if isinstance(expr, c_ast.Assignment):
        return _tainted(expr.rvalue, fname, state)
    if isinstance(expr, c_ast.ExprList):
        return bool(expr.exprs) and _tainted(expr.exprs[-1], fname, state)
    if isinstance(expr, (c_ast.InitList, c_ast.CompoundLiteral)):
        return any(_tainted(e, fname, state) for e in _init_exprs(expr))
    if isinstance(expr, c_ast.BinaryOp):
        if expr.op in _EQUALITY or expr.op in _ORDERING or expr.op in ("&&", "||"):
            return False  # a truth value, not a token
        return _tainted(expr.left, fname, state) or _tainted(expr.right, fname, state)
    return False


def _init_exprs(expr: c_ast.Node) -> list[c_ast.Node]:
    if isinstance(expr, c_ast.CompoundLiteral):
        expr = expr.init
    if isinstance(expr, c_ast.InitList):
        return [e.expr if isinstance(e, c_ast.NamedInitializer) else e for e in expr.exprs]
    return [expr]


def _container(expr: c_ast.Node | None, fname: str, state: _State) -> bool:
    """Whether an expression is a pointer or array (of tokens, when tainted), not a token value."""
    if isinstance(expr, c_ast.ID):
        return _var_key(fname, expr.name, state) in state.containers
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-"):
        return _container(expr.left, fname, state) != _container(expr.right, fname, state)
    if isinstance(expr, c_ast.UnaryOp) and expr.op == "&":
        return True
    if isinstance(expr, c_ast.Cast):
        return _cast_names(expr.to_type) == "pointer"
    return False


def _mark_var(key: tuple[str | None, str], state: _State) -> None:
    if key not in state.tainted_vars:
        state.tainted_vars.add(key)
        state.changed = True


def _mark_field(name: str, state: _State) -> None:
    if name not in state.tainted_fields:
        state.tainted_fields.add(name)
        state.changed = True


def _taint_struct_init(struct: str | None, init: c_ast.Node, fname: str, state: _State) -> None:
    """Positional / designated struct initialisers taint the fields they fill."""
    if isinstance(init, c_ast.CompoundLiteral):
        struct = _struct_name(init.type) or struct
        init = init.init
    if not isinstance(init, c_ast.InitList):
        return
    fields = state.structs.get(struct or "", [])
    for i, item in enumerate(init.exprs):
        if isinstance(item, c_ast.NamedInitializer):
            value, names = item.expr, [n.name for n in item.name if isinstance(n, c_ast.ID)]
        else:
            value, names = item, ([fields[i]] if i < len(fields) else [])
        if _tainted(value, fname, state):
            if not names:  # unknown layout: every field of every struct may hold it (conservative)
                names = [f for fs in state.structs.values() for f in fs]
            for n in names:
                _mark_field(n, state)


def _store(target: c_ast.Node, value: c_ast.Node, fname: str, state: _State) -> None:
    if isinstance(target, c_ast.StructRef):
        if _tainted(value, fname, state):
            _mark_field(target.field.name, state)
        return
    var = _base_var(target)
    if var is None:
        return
    key = _var_key(fname, var, state)
    if isinstance(value, (c_ast.InitList, c_ast.CompoundLiteral)):
        _taint_struct_init(state.var_struct.get(key), value, fname, state)
    if _tainted(value, fname, state):
        _mark_var(key, state)


def _propagate(fname: str, fn: c_ast.FuncDef, state: _State) -> None:
    for node in _walk(fn.body):
        if isinstance(node, c_ast.Decl) and node.init is not None and node.name:
            _store(c_ast.ID(node.name), node.init, fname, state)
        elif isinstance(node, c_ast.Assignment) and node.op == "=":
            _store(node.lvalue, node.rvalue, fname, state)
        elif isinstance(node, c_ast.Return) and node.expr is not None:
            if isinstance(node.expr, (c_ast.InitList, c_ast.CompoundLiteral)):
                _taint_struct_init(_struct_name(fn.decl.type.type), node.expr, fname, state)
            if _tainted(node.expr, fname, state) and fname not in state.tainted_returns:
                state.tainted_returns.add(fname)
                state.changed = True
        elif isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID):
            callee = node.name.name
            if callee not in state.functions or node.args is None:
                continue
            for i, arg in enumerate(node.args.exprs):
                if i >= len(state.params[callee]):
                    break
                pkey = (callee, state.params[callee][i])
                if _tainted(arg, fname, state) and pkey not in state.tainted_vars:
                    state.tainted_vars.add(pkey)
                    state.changed = True
                # An out-parameter that receives tokens taints what the caller passed for it.
                var = _base_var(arg) if pkey in state.tainted_vars else None
                if var is not None and (
                    isinstance(arg, c_ast.UnaryOp)
                    or (isinstance(arg, c_ast.ID) and _is_array_or_pointer(fname, var, state))
                ):
                    _mark_var(_var_key(fname, var, state), state)


def _is_array_or_pointer(fname: str, var: str, state: _State) -> bool:
    fn = state.functions[fname]
    for p, ptype in zip(state.params[fname], _param_types(fn.decl), strict=True):
        if p == var:
            return isinstance(ptype, (c_ast.ArrayDecl, c_ast.PtrDecl))
    for node in _walk(fn.body):
        if isinstance(node, c_ast.Decl) and node.name == var:
            return isinstance(node.type, (c_ast.ArrayDecl, c_ast.PtrDecl))
    return False


def _where(node: c_ast.Node) -> str:
    coord = getattr(node, "coord", None)
    return f"line {coord.line}" if coord is not None and coord.line else "?"


def _violations(fname: str, fn: c_ast.FuncDef, state: _State) -> list[str]:
    out: list[str] = []

    def tainted(e: c_ast.Node | None) -> bool:
        return _tainted(e, fname, state)

    def truth(e: c_ast.Node | None, what: str, at: c_ast.Node) -> None:
        if e is not None and tainted(e):
            out.append(f"{_where(at)}: token value used as a truth value ({what})")

    for node in _walk(fn.body):
        if isinstance(node, c_ast.BinaryOp):
            if node.op in ("&&", "||"):
                truth(node.left, node.op, node)
                truth(node.right, node.op, node)
            elif _offset_of_token_array(node, fname, state):
                continue  # p + n on a token array is a shorter token array, not arithmetic on ids
            elif node.op not in _EQUALITY and (tainted(node.left) or tainted(node.right)):
                kind = "ordering comparison" if node.op in _ORDERING else "operator"
                out.append(f"{_where(node)}: token value in {kind} '{node.op}'")
        elif isinstance(node, c_ast.UnaryOp):
            if node.op not in ("*", "&", "sizeof") and tainted(node.expr):
                out.append(f"{_where(node)}: token value in unary operator '{node.op}'")
        elif isinstance(node, c_ast.Assignment) and node.op != "=":
            if tainted(node.lvalue) or tainted(node.rvalue):
                out.append(f"{_where(node)}: token value in compound assignment '{node.op}'")
        elif isinstance(node, c_ast.ArrayRef):
            if tainted(node.subscript):
                out.append(f"{_where(node)}: token value used as an array index")
        elif isinstance(node, (c_ast.If, c_ast.While, c_ast.DoWhile, c_ast.For, c_ast.TernaryOp)):
            truth(node.cond, type(node).__name__.lower(), node)
        elif isinstance(node, c_ast.Switch):
            if tainted(node.cond):
                out.append(f"{_where(node)}: token value in a switch")
        elif isinstance(node, c_ast.Cast):
            if tainted(node.expr):
                names = _cast_names(node.to_type)
                if names not in VALUE_PRESERVING_CASTS:
                    out.append(f"{_where(node)}: token value cast to '{names}'")
        elif isinstance(node, c_ast.FuncCall):
            callee = node.name.name if isinstance(node.name, c_ast.ID) else None
            if callee not in state.functions:
                out.append(
                    f"{_where(node)}: call to {callee or 'a function pointer'}, not defined in this file"
                )
    return out


def _offset_of_token_array(node: c_ast.BinaryOp, fname: str, state: _State) -> bool:
    if node.op not in ("+", "-"):
        return False
    left, right = node.left, node.right
    if node.op == "-":  # only array - integer, never integer - array or array - array
        return (
            _container(left, fname, state)
            and not _tainted(right, fname, state)
            and not _container(right, fname, state)
        )
    for array, offset in ((left, right), (right, left)):
        if (
            _container(array, fname, state)
            and not _tainted(offset, fname, state)
            and not _container(offset, fname, state)
        ):
            return True
    return False


def _cast_names(typename: c_ast.Node) -> str:
    node = typename
    while node is not None:
        if isinstance(node, c_ast.IdentifierType):
            return " ".join(node.names)
        if isinstance(node, c_ast.PtrDecl):
            return "pointer"
        node = getattr(node, "type", None)
    return "?"
