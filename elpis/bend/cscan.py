"""The token scan: token ids in the generated C may only be copied and compared with == / !=.

It reads C text (it does not trust the generator): every identifier declared with type
`elpis_tok` (a value) or `elpis_tok *` / `elpis_tok x[N]` (an array of them), every struct field
and every function returning `elpis_tok`, and checks each use:

- a token value may be an operand of `==` / `!=` against another token value, an argument in a
  token parameter's position of a known function, the initializer of / value assigned to a token
  variable or field, or the value returned by a token function;
- a token array may be indexed (giving a token value), offset with `+` to make a token array, or
  passed where a token array is expected.

Anything else (`<`, `>`, `<=`, `>=`, arithmetic, bit operations, casts, conversion into a
non-token variable or parameter) is an error naming the C line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOKEN_TYPE = "elpis_tok"
_LEX = re.compile(
    r"(?P<ws>\s+)|(?P<comment>/\*.*?\*/|//[^\n]*)|(?P<pp>^[ \t]*#[^\n]*)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>[0-9][A-Za-z0-9_.]*)"
    r"|(?P<op><<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^~!<>=?:;,.()\[\]{}])",
    re.S | re.M,
)


@dataclass
class Tok:
    text: str
    line: int


def lex(text: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    line = 1
    while pos < len(text):
        m = _LEX.match(text, pos)
        if m is None:
            raise ValueError(f"C scan: cannot read character {text[pos]!r} at line {line}")
        kind = m.lastgroup
        chunk = m.group()
        if kind in ("ident", "num", "op"):
            out.append(Tok(chunk, line))
        line += chunk.count("\n")
        pos = m.end()
    return out


@dataclass
class Symbols:
    values: set[str]
    arrays: set[str]
    fields: set[str]
    token_functions: set[str]
    params: dict[str, list[str]]  # function -> per-parameter kind: "tok", "arr" or "other"


@dataclass
class Function:
    name: str
    params: tuple[int, int]  # token index range of the parameter list (inside the parentheses)
    body: tuple[int, int]  # token index range of the body (inside the braces)


def _top_level(toks: list[Tok]) -> tuple[list[Function], list[tuple[int, int]], Symbols]:
    """Functions (definitions), struct bodies and global symbols (fields, signatures)."""
    sym = Symbols(set(), set(), set(), set(), {})
    functions: list[Function] = []
    structs: list[tuple[int, int]] = []
    depth = 0
    i = 0
    while i < len(toks):
        x = toks[i].text
        if (
            depth == 0
            and x == "("
            and i >= 2
            and re.match(r"[A-Za-z_]", toks[i - 1].text)
            and (re.match(r"[A-Za-z_]", toks[i - 2].text) or toks[i - 2].text == "*")
        ):
            name = toks[i - 1].text
            close = _close(toks, i)
            kinds = _param_kinds(toks, i + 1, close)
            sym.params.setdefault(name, kinds)
            j = i - 2
            while j >= 0 and toks[j].text == "*":
                j -= 1
            if toks[j].text == TOKEN_TYPE and toks[i - 2].text != "*":
                sym.token_functions.add(name)
            if close + 1 < len(toks) and toks[close + 1].text == "{":
                end = _close_brace(toks, close + 1)
                functions.append(Function(name, (i + 1, close), (close + 2, end)))
                i = end + 1
                continue
            i = close + 1
            continue
        if depth == 0 and x == "struct" and i + 1 < len(toks) and toks[i + 1].text == "{":
            end = _close_brace(toks, i + 1)
            structs.append((i + 2, end))
            for k in range(i + 2, end):
                if toks[k].text == TOKEN_TYPE and k + 1 < end:
                    sym.fields.add(toks[k + 1].text)
            i = end + 1
            continue
        if x == "{":
            depth += 1
        elif x == "}":
            depth -= 1
        i += 1
    return functions, structs, sym


def _close_brace(toks: list[Tok], i: int) -> int:
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text == "{":
            depth += 1
        elif toks[j].text == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def _param_kinds(toks: list[Tok], start: int, end: int) -> list[str]:
    kinds: list[str] = []
    current: list[str] = []
    depth = 0
    for k in range(start, end):
        x = toks[k].text
        if x in "([":
            depth += 1
        elif x in ")]":
            depth -= 1
        if x == "," and depth == 0:
            kinds.append(_param_kind(current))
            current = []
        else:
            current.append(x)
    if current and current != ["void"]:
        kinds.append(_param_kind(current))
    return kinds


def _param_kind(words: list[str]) -> str:
    if TOKEN_TYPE not in words:
        return "other"
    return "arr" if ("*" in words or "[" in words) else "tok"


def _locals(toks: list[Tok], start: int, end: int, sym: Symbols) -> Symbols:
    """The token-typed names declared in [start, end) (parameters and locals of one function)."""
    local = Symbols(set(), set(), sym.fields, sym.token_functions, sym.params)
    for i in range(start, end):
        if toks[i].text != TOKEN_TYPE:
            continue
        j = i + 1
        ptr = False
        while j < end and toks[j].text in ("*", "const"):
            ptr = ptr or toks[j].text == "*"
            j += 1
        if j >= end or not re.match(r"[A-Za-z_]", toks[j].text):
            continue
        name = toks[j].text
        if (j + 1 < len(toks) and toks[j + 1].text == "[") or ptr:
            local.arrays.add(name)
        else:
            local.values.add(name)
    return local


def scan(text: str, filename: str = "acceptors.c") -> list[str]:
    """Return every violation of the token discipline (empty when the C is clean)."""
    toks = lex(text)
    functions, _, sym = _top_level(toks)
    errors: list[str] = []
    for fn in functions:
        local = _locals(toks, fn.params[0], fn.body[1], sym)
        local.params = sym.params
        local.current = fn.name  # type: ignore[attr-defined]
        i = fn.body[0]
        while i < fn.body[1]:
            t = toks[i]
            kind = _unit_kind(toks, i, local)
            if kind is None or _is_declaration(toks, i):
                i += 1
                continue
            start, end, value = _unit(toks, i, local, kind)
            problem = _check_use(toks, start, end, value, local)
            if problem:
                errors.append(
                    f"{filename}:{t.line}: token scan in {fn.name}: {problem} (token-typed `{t.text}`)"
                )
            i = i + 1 if kind == "call" else end + 1
    return errors


def _unit_kind(toks: list[Tok], i: int, sym: Symbols) -> str | None:
    x = toks[i].text
    prev = toks[i - 1].text if i else ""
    if prev in (".", "->"):
        return "field" if x in sym.fields else None
    if x in sym.values:
        return "tok"
    if x in sym.arrays:
        return "arr"
    if x in sym.token_functions and i + 1 < len(toks) and toks[i + 1].text == "(":
        return "call"
    return None


def _is_declaration(toks: list[Tok], i: int) -> bool:
    j = i - 1
    while j >= 0 and toks[j].text in ("*", "const"):
        j -= 1
    return j >= 0 and toks[j].text == TOKEN_TYPE


def _close(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing the one at i."""
    pairs = {"(": ")", "[": "]"}
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text in pairs:
            depth += 1
        elif toks[j].text in pairs.values():
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def _unit(toks: list[Tok], i: int, sym: Symbols, kind: str) -> tuple[int, int, bool]:
    """(start, end, is_value) of the expression unit a token-typed name begins."""
    if kind == "call":
        return i, _close(toks, i + 1), True
    if kind == "field":
        start = i - 1
        while start > 0 and re.match(r"[A-Za-z_0-9]", toks[start - 1].text):
            start -= 1
            if start > 0 and toks[start - 1].text in (".", "->"):
                start -= 1
            else:
                break
        return start, i, True
    if kind == "arr" and i + 1 < len(toks) and toks[i + 1].text == "[":
        return i, _close(toks, i + 1), True
    return i, i, kind == "tok"


def _check_use(toks: list[Tok], start: int, end: int, value: bool, sym: Symbols) -> str | None:
    prev = toks[start - 1].text if start else ""
    nxt = toks[end + 1].text if end + 1 < len(toks) else ""
    if prev == ")" and _is_cast(toks, start - 1):
        return "cast of a token id"
    if prev in (";", "{", "}") and nxt == "=" and start == end:
        # `x = y;` (a loop's parameter update): only another token name of the same kind may flow in
        source = toks[end + 2].text if end + 3 < len(toks) and toks[end + 3].text == ";" else ""
        same = sym.values if value else sym.arrays
        return None if source in same else "token variable assigned something other than a token variable"
    if not value:
        if nxt == "[":
            return None
        if nxt == "+" and _assigned_to(toks, start, sym) in ("arr", None):
            return (
                None
                if _assigned_to(toks, start, sym) == "arr"
                else "offset of a token array outside a token-array initializer"
            )
        if prev in ("(", ",") and nxt in (")", ",", "+"):
            return (
                None
                if _arg_kind(toks, start, sym) == "arr"
                else "token array passed where no token array is expected"
            )
        if prev == "=" and nxt == ";":
            return (
                None
                if _assigned_to(toks, start, sym) == "arr"
                else "token array stored in a non-token variable"
            )
        return f"`{prev} {nxt}` around a token array"
    if nxt in ("==", "!=") and _is_token_unit_at(toks, end + 2, sym):
        return None
    if prev in ("==", "!=") and _unit_ends_token(toks, start - 2, sym):
        return None
    if prev in ("(", ",") and nxt in (")", ","):
        kind = _arg_kind(toks, start, sym)
        if kind == "tok":
            return None
        return (
            "token id passed where a non-token value is expected"
            if kind == "other"
            else ("token id inside parentheses that are not a call")
        )
    if prev == "=" and nxt in (";", ",", "}"):
        if _assigned_to(toks, start, sym) == "tok":
            return None
        return "token id stored in a non-token variable"
    if prev == "return" and nxt == ";":
        return None if _returns_token(toks, start, sym) else "token id returned from a non-token function"
    for op in (prev, nxt):
        if op in (
            "<",
            ">",
            "<=",
            ">=",
            "+",
            "-",
            "*",
            "/",
            "%",
            "&",
            "|",
            "^",
            "~",
            "<<",
            ">>",
            "!",
            "?",
            ":",
        ):
            return f"operator {op} applied to a token id"
    if prev == ")":
        return "cast of a token id"
    return f"token id used in `{prev} … {nxt}`"


def _is_cast(toks: list[Tok], close: int) -> bool:
    """Does the `)` at `close` end a cast `(type)`?"""
    depth = 0
    for j in range(close, -1, -1):
        x = toks[j].text
        if x == ")":
            depth += 1
        elif x == "(":
            depth -= 1
            if depth == 0:
                inner = [tok.text for tok in toks[j + 1 : close]]
                before = toks[j - 1].text if j else ""
                typeish = inner and all(re.match(r"[A-Za-z_]", w) or w == "*" for w in inner)
                return bool(typeish) and not re.match(r"[A-Za-z_0-9]", before)
    return False


def _is_token_unit_at(toks: list[Tok], i: int, sym: Symbols) -> bool:
    if i >= len(toks):
        return False
    kind = _unit_kind(toks, i, sym)
    if kind in ("tok", "call", "field"):
        return True
    if kind == "arr":
        return i + 1 < len(toks) and toks[i + 1].text == "["
    return False


def _unit_ends_token(toks: list[Tok], i: int, sym: Symbols) -> bool:
    if i < 0:
        return False
    x = toks[i].text
    if x in ("]", ")"):
        depth = 0
        for j in range(i, -1, -1):
            if toks[j].text in ("]", ")"):
                depth += 1
            elif toks[j].text in ("[", "("):
                depth -= 1
                if depth == 0:
                    return j > 0 and (
                        (toks[j].text == "[" and toks[j - 1].text in sym.arrays)
                        or (toks[j].text == "(" and toks[j - 1].text in sym.token_functions)
                    )
        return False
    kind = _unit_kind(toks, i, sym)
    return kind in ("tok", "field")


def _arg_kind(toks: list[Tok], i: int, sym: Symbols) -> str | None:
    """Kind of the parameter that the argument starting at i fills (None: not a call)."""
    depth = 0
    index = 0
    for j in range(i - 1, -1, -1):
        x = toks[j].text
        if x in (")", "]"):
            depth += 1
        elif x in ("(", "["):
            if depth == 0:
                if x != "(" or j == 0:
                    return None
                fn = toks[j - 1].text
                kinds = sym.params.get(fn)
                if kinds is None or index >= len(kinds):
                    return None
                return kinds[index]
            depth -= 1
        elif x == "," and depth == 0:
            index += 1
    return None


def _assigned_to(toks: list[Tok], start: int, sym: Symbols) -> str | None:
    """Kind of the variable or field the value at `start` is assigned to (after `=`)."""
    j = start - 1
    while j >= 0 and toks[j].text != "=":
        if toks[j].text in (";", "{", "}"):
            return None
        j -= 1
    if j <= 0:
        return None
    target = toks[j - 1].text
    before = toks[j - 2].text if j >= 2 else ""
    if before in (".", "->"):
        return "tok" if target in sym.fields else None
    if target in sym.values:
        return "tok"
    if target in sym.arrays:
        return "arr"
    if target == "]":
        return None
    return None


def _returns_token(toks: list[Tok], i: int, sym: Symbols) -> bool:
    return getattr(sym, "current", None) in sym.token_functions
