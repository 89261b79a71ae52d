"""Parse Bend-subset source text into the AST of `syntax.py`.

Errors are `BendError`s whose message starts with `file:line:column`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.indenter import DedentError, Indenter

from elpis.bend import syntax as s
from elpis.bend.errors import BendError

GRAMMAR = Path(__file__).with_name("grammar.lark")
U32_MAX = 2**32 - 1


class _BendIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB", "LBRACE"]  # noqa: RUF012 (lark reads class attributes)
    CLOSE_PAREN_types = ["RPAR", "RSQB", "RBRACE"]  # noqa: RUF012
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8


@cache
def _lark() -> Lark:
    return Lark(
        GRAMMAR.read_text(),
        parser="lalr",
        lexer="contextual",
        postlex=_BendIndenter(),
        propagate_positions=True,
        maybe_placeholders=True,
    )


def _present(items: list) -> list:
    return [x for x in items if x is not None]


@v_args(meta=True, inline=True)
class _ToAst(Transformer):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def _loc(self, meta) -> s.Loc | None:
        if getattr(meta, "empty", True):
            return None
        return s.Loc(self.path, meta.line, meta.column)

    def _tok_loc(self, tok: Token) -> s.Loc:
        return s.Loc(self.path, tok.line, tok.column)

    def _fail(self, where: s.Loc | None, msg: str):
        raise BendError(f"{where or self.path}: {msg}")

    @staticmethod
    def _split_quant(parts: tuple) -> tuple[str, list]:
        rest = list(parts)
        quant = ""
        if rest and isinstance(rest[0], Token) and rest[0].type == "QUANT":
            quant = str(rest.pop(0))
        return quant, rest

    # -------------------------------------------------------------- top level
    def start(self, meta, *items):
        return s.Module(tuple(i for i in items if i is not None), self.path)

    def import_base(self, meta, _base):
        return s.Import(None, None, self._loc(meta))

    def import_path(self, meta, path, alias):
        return s.Import(str(path), str(alias), self._loc(meta))

    def typedef(self, meta, name, *ctors):
        return s.TypeDef(str(name), tuple(ctors), self._loc(meta))

    def ctor(self, meta, name, *fields):
        return s.CtorDef(str(name), tuple(_present(list(fields))), self._loc(meta))

    def field(self, meta, name, ty):
        return s.Field(str(name), ty, self._loc(meta))

    def def_(self, meta, name, *rest):
        *params, ret, body = rest
        return s.Def(str(name), tuple(_present(params)), ret, body, self._loc(meta))

    def param(self, meta, *parts):
        quant, rest = self._split_quant(parts)
        name, ty = rest
        return s.Param(str(name), ty, quant, self._loc(meta))

    def law(self, meta, name, *rest):
        *clauses, goal = rest
        return s.Law(str(name), tuple(clauses), goal, self._loc(meta))

    def clause(self, meta, *parts):
        quant, rest = self._split_quant(parts)
        name, ty = rest
        return s.Param(str(name), ty, quant, self._loc(meta))

    # -------------------------------------------------------------- types
    def tname(self, meta, name):
        return s.TName(str(name), (), self._loc(meta))

    def tapp(self, meta, name, *args):
        return s.TName(str(name), tuple(args), self._loc(meta))

    def tdata(self, meta):
        return s.TName("Data", (), self._loc(meta))

    def tquant(self, meta, q):
        return s.TQuant(str(q), self._loc(meta))

    def teq(self, meta, lhs, rhs, ty):
        return s.TEq(lhs, rhs, ty, self._loc(meta))

    def tarrow(self, meta, dom, cod):
        return s.TArrow(dom, cod, None, "", self._loc(meta))

    def tdep(self, meta, *parts):
        quant, rest = self._split_quant(parts)
        name, dom, cod = rest
        return s.TArrow(dom, cod, str(name), quant, self._loc(meta))

    # -------------------------------------------------------------- bodies
    def block(self, meta, *parts):
        *stmts, tail = parts
        return s.Block(tuple(stmts), tail, self._loc(meta))

    def let(self, meta, *parts):
        quant, rest = self._split_quant(parts)
        name, expr = rest
        if quant == "~":
            self._fail(self._loc(meta), "a let cannot be a template (~)")
        return s.SLet(str(name), expr, quant, self._loc(meta))

    def rewrite(self, meta, proof, motive):
        return s.SRewrite(proof, motive, self._loc(meta))

    def match_(self, meta, *parts):
        names = [str(p) for p in parts if isinstance(p, Token)]
        cases = [p for p in parts if isinstance(p, s.Case)]
        return s.Match(tuple(names), tuple(cases), self._loc(meta))

    def case_(self, meta, *parts):
        *pats, body = parts
        return s.Case(tuple(pats), body, self._loc(meta))

    # -------------------------------------------------------------- patterns
    def pcons(self, meta, head, _cons, tail):
        return s.PCons(head, tail, self._loc(meta))

    def pwild(self, meta):
        return s.PWild(self._loc(meta))

    def pvar(self, meta, *parts):
        quant, rest = self._split_quant(parts)
        if quant == "~":
            self._fail(self._loc(meta), "a pattern variable cannot be a template (~)")
        return s.PVar(str(rest[0]), quant, self._loc(meta))

    def pnat(self, meta, tok):
        return s.PNat(int(str(tok)[:-1]), self._loc(meta))

    def psucc(self, meta, tok, arg):
        return s.PSucc(int(str(tok)[:-2]), arg, self._loc(meta))

    def pu32(self, meta, tok):
        return s.PU32(self._u32(tok), self._loc(meta))

    def pctor(self, meta, name, *args):
        return s.PCtor(str(name), tuple(_present(list(args))), self._loc(meta))

    # -------------------------------------------------------------- expressions
    def _u32(self, tok: Token) -> int:
        text = str(tok)
        value = int(text, 16) if text.startswith("0x") else int(text)
        if value > U32_MAX:
            self._fail(self._tok_loc(tok), f"U32 literal {text} is out of range (max {U32_MAX})")
        return value

    def econs(self, meta, head, _cons, tail):
        return s.ECons(head, tail, self._loc(meta))

    def evar(self, meta, name):
        return s.EVar(str(name), self._loc(meta))

    def ecall(self, meta, name, *args):
        return s.ECall(str(name), tuple(_present(list(args))), self._loc(meta))

    def ector(self, meta, name, *args):
        return s.ECtor(str(name), tuple(_present(list(args))), self._loc(meta))

    def enat(self, meta, tok):
        return s.ENat(int(str(tok)[:-1]), self._loc(meta))

    def esucc(self, meta, tok, arg):
        return s.ESucc(int(str(tok)[:-2]), arg, self._loc(meta))

    def eu32(self, meta, tok):
        return s.EU32(self._u32(tok), self._loc(meta))

    def elist(self, meta, *items):
        return s.EList(tuple(_present(list(items))), self._loc(meta))

    def eop(self, meta, lhs, op, rhs, ty):
        return s.EOp(str(op), lhs, rhs, ty, self._loc(meta))

    def eann(self, meta, expr, ty):
        return s.EAnn(expr, ty, self._loc(meta))

    def erefl(self, meta, _tok):
        return s.ERefl(self._loc(meta))

    def ehole(self, meta):
        return s.EHole(self._loc(meta))

    def etemplate(self, meta, _tilde, name):
        return s.ETemplate(str(name), self._loc(meta))


def _describe(err: UnexpectedInput) -> str:
    if isinstance(err, UnexpectedToken):
        tok = err.token
        shown = "end of input" if tok.type == "$END" else f"{tok.type} {str(tok)!r}"
        expected = sorted(e for e in err.expected if not e.startswith("__"))
        hint = f"; expected one of: {', '.join(expected[:12])}" if expected else ""
        return f"unexpected {shown}{hint}"
    if isinstance(err, UnexpectedCharacters):
        return f"unexpected character {err.char!r} (not part of the Bend subset)"
    if isinstance(err, UnexpectedEOF):
        return "unexpected end of input"
    return str(err)


def parse_text(text: str, path: str = "<text>") -> s.Module:
    if not text.endswith("\n"):
        text += "\n"
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as err:
        line = getattr(err, "line", 0) or 0
        col = getattr(err, "column", 0) or 0
        if isinstance(err, UnexpectedToken) and err.token.type in ("_INDENT", "_DEDENT", "$END"):
            line = line if line > 0 else text.count("\n")
        raise BendError(f"{path}:{line}:{col}: syntax error: {_describe(err)}") from None
    except DedentError as err:
        raise BendError(f"{path}: syntax error: inconsistent indentation ({err})") from None
    try:
        return _ToAst(path).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, BendError):
            raise err.orig_exc from None
        raise


def parse_file(path: Path, display: str | None = None) -> s.Module:
    return parse_text(path.read_text(encoding="utf-8"), display or str(path))
