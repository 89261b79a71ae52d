"""Parsing: round trip on every source, and the excluded constructs are rejected with a position."""

from __future__ import annotations

import re

import pytest

from elpis.bend.check import BASE_FILE
from elpis.bend.errors import BendError
from elpis.bend.parser import parse_file, parse_text
from elpis.bend.printer import module as print_module

from .conftest import SOURCES


@pytest.mark.parametrize("path", [*SOURCES, BASE_FILE], ids=lambda p: p.name)
def test_round_trip(path):
    ast = parse_file(path)
    text = print_module(ast)
    again = parse_text(text, str(path))
    assert again == ast
    assert print_module(again) == text  # printing is a fixed point


def test_sources_exist():
    names = {p.name for p in SOURCES}
    assert {"LAWS.bend", "PROOF.bend", "chain.bend", "chain_spec.bend", "tree.bend", "masks.bend"} <= names


EXCLUDED = {
    "lambda": "def f(x: Nat) -> Nat:\n  y => y\n",
    "open hole": "def f(x: Nat) -> Nat:\n  ?TODO\n",
    "string": 'def f(x: Nat) -> Nat:\n  "s"\n',
    "parallel let": "def f(x: Nat) -> Nat:\n  a b = g(x) g(x)\n  a\n",
    "do block": "def f(x: Nat) -> Nat:\n  do IO<Unit>:\n    x\n",
    "array": "def f(x: Nat) -> Nat:\n  [0 : U32*8n]\n",
    "unsafe": "@unsafe def f(x: Nat) -> Nat:\n  x\n",
    "witness": "law f:\n  exs y: Nat\n  {y == y : Nat}\n",
    "equality operator": "def f(a: U32, b: U32) -> Bool:\n  (a == b : U32)\n",
    "foreign import": 'def f(x: Nat) -> Nat:\n  import "./f.c"\n',
}


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_excluded_constructs_are_rejected_with_position(name):
    text = "import Base\n\n" + EXCLUDED[name]
    with pytest.raises(BendError) as err:
        parse_text(text, "bad.bend")
    assert re.match(r"bad\.bend:\d+:\d+: syntax error", str(err.value)), str(err.value)
    line = int(str(err.value).split(":")[1])
    assert line >= 3  # the position points into the offending def, not the header


def test_error_position_is_exact():
    with pytest.raises(BendError, match=r"^x\.bend:4:5: "):
        parse_text("import Base\n\ndef f(x: Nat) -> Nat:\n  x y\n", "x.bend")


def test_u32_literal_range():
    with pytest.raises(BendError, match="out of range"):
        parse_text("import Base\n\ndef f() -> U32:\n  4294967296\n", "r.bend")
