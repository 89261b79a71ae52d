"""The checker: token discipline, exhaustiveness, totality, Bend's match and quantity rules."""

from __future__ import annotations

import pytest

from elpis.bend.check import load
from elpis.bend.errors import BendError

HEADER = "import Base\n\ndef Tok() -> Data:\n  U32\n\n"


def check(tmp_path, body: str):
    path = tmp_path / "m.bend"
    path.write_text(HEADER + body)
    return load(tmp_path, [path])


def rejected(tmp_path, body: str, pattern: str) -> str:
    with pytest.raises(BendError, match=pattern) as err:
        check(tmp_path, body)
    assert str(err.value).startswith("m.bend:"), str(err.value)
    return str(err.value)


def test_accepts_equality_on_tokens(tmp_path):
    prog = check(tmp_path, "def same(a: Tok, b: Tok) -> Bool:\n  U32.is_eq(a, b)\n")
    assert "m.bend::same" in prog.funs


@pytest.mark.parametrize(
    "body",
    [
        "def lt(a: Tok, b: Tok) -> Bool:\n  (a < b : U32)\n",
        "def lt(a: Tok, b: Tok) -> Bool:\n  U32.is_lt(a, b)\n",
        "def ge(a: Tok, b: Tok) -> Bool:\n  (a >= b : Tok)\n",
        "def add(a: Tok) -> U32:\n  (a + 1 : U32)\n",
        "def leak(a: Tok) -> U32:\n  a\n",
        "def mask(a: Tok) -> U32:\n  U32.and(a, 255)\n",
        "def widen(a: Tok) -> Nat:\n  U32.to_nat(a)\n",
        "def f(a: Tok) -> Bool:\n  match a:\n    case 0:\n      True{}\n    case _:\n      False{}\n",
    ],
)
def test_token_ids_only_copy_and_compare(tmp_path, body):
    rejected(tmp_path, body, r"token ids")


def test_non_exhaustive_match_names_the_missing_case(tmp_path):
    msg = rejected(
        tmp_path,
        "def f(xs: List<Tok>) -> Nat:\n  match xs:\n    case Nil{}:\n      0n\n"
        "    case _ <> Nil{}:\n      1n\n",
        "non-exhaustive",
    )
    assert "<>" in msg


def test_unreachable_case(tmp_path):
    rejected(
        tmp_path,
        "def f(b: Bool) -> Nat:\n  match b:\n    case _:\n      0n\n    case True{}:\n      1n\n",
        "unreachable",
    )


def test_non_structural_recursion(tmp_path):
    rejected(tmp_path, "def f(n: Nat) -> Nat:\n  f(1n+n)\n", "not structural")


def test_recursion_must_shrink_left_to_right(tmp_path):
    rejected(
        tmp_path,
        "def f(a: Nat, b: Nat) -> Nat:\n  match b:\n    case 0n:\n      a\n"
        "    case 1n+p:\n      f(1n+a, p)\n",
        "not structural",
    )


def test_recursion_without_descent(tmp_path):
    rejected(
        tmp_path,
        "def f(+n: Nat) -> Nat:\n  match n:\n    case 0n:\n      0n\n    case 1n+_:\n      f(n)\n",
        "every argument unchanged",
    )


def test_mutual_recursion(tmp_path):
    body = (
        "def f(n: Nat) -> Nat:\n  match n:\n    case 0n:\n      0n\n    case 1n+p:\n      g(p)\n\n"
        "def g(n: Nat) -> Nat:\n  match n:\n    case 0n:\n      0n\n    case 1n+p:\n      f(p)\n"
    )
    rejected(tmp_path, body, "mutual recursion")


def test_match_on_a_let_bound_value(tmp_path):
    rejected(
        tmp_path, "def f(n: Nat) -> Nat:\n  m = 1n+n\n  match m:\n    case _:\n      0n\n", "computed value"
    )


def test_let_before_match_on_a_parameter(tmp_path):
    rejected(
        tmp_path, "def f(n: Nat) -> Nat:\n  m = 1n\n  match n:\n    case _:\n      m\n", "let may not precede"
    )


def test_affine_variables(tmp_path):
    rejected(tmp_path, "def f(n: Nat) -> Nat:\n  Nat.add(n, n)\n", r"mark it \+n")
    check(tmp_path, "def f(+n: Nat) -> Nat:\n  Nat.add(n, n)\n")


def test_unknown_name_and_wrong_arity(tmp_path):
    rejected(tmp_path, "def f(n: Nat) -> Nat:\n  g(n)\n", "unknown name g")
    rejected(tmp_path, "def f(n: Nat) -> Nat:\n  Nat.add(n)\n", "takes 2 argument")


def test_law_goal_must_be_an_equation(tmp_path):
    rejected(tmp_path, "law l:\n  for n: Nat\n  Nat\n", "must be an equation")


def test_every_module_imports_base(tmp_path):
    path = tmp_path / "m.bend"
    path.write_text("def f(n: Nat) -> Nat:\n  n\n")
    with pytest.raises(BendError, match="import Base"):
        load(tmp_path, [path])
