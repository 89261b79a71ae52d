"""The build's C scan: token ids may only be copied and compared with == / !=, however the C hides it.

Each case is a small C file with the three exported functions (their token parameters seed the taint)
and one planted use; the scan must name it. Clean code, including the real generated C, must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.accept import cscan

HEADER = """\
#include <stdbool.h>
#include <stdint.h>
void elpis_chain_accept(uint32_t k, const uint32_t draft[15], const uint32_t target[16],
                        uint32_t nstops, const uint32_t stops[4], uint64_t budget,
                        uint32_t *count, bool *ends);
void elpis_tree_accept(uint32_t rows, const int32_t parents[16], const uint32_t draft[16],
                       const uint32_t target[16], uint32_t nstops, const uint32_t stops[4],
                       uint64_t budget, uint32_t path[16], uint32_t *count, bool *ends);
void elpis_tree_masks(uint32_t rows, const int32_t parents[16], uint32_t depth[16],
                      uint32_t ancestors[16]);
"""

TEMPLATE = """\
#include "acceptors.h"
{top}
void elpis_chain_accept(uint32_t k, const uint32_t draft[15], const uint32_t target[16],
                        uint32_t nstops, const uint32_t stops[4], uint64_t budget,
                        uint32_t *count, bool *ends) {{
  uint32_t n = 1;
  bool e = false;
  {chain}
  *count = n;
  *ends = e;
}}
void elpis_tree_accept(uint32_t rows, const int32_t parents[16], const uint32_t draft[16],
                       const uint32_t target[16], uint32_t nstops, const uint32_t stops[4],
                       uint64_t budget, uint32_t path[16], uint32_t *count, bool *ends) {{
  path[0] = 0;
  *count = 1;
  *ends = draft[1] == target[0] && rows > 1;
  {tree}
}}
void elpis_tree_masks(uint32_t rows, const int32_t parents[16], uint32_t depth[16],
                      uint32_t ancestors[16]) {{
  for (uint32_t r = 0; r < rows; r++) {{ depth[r] = r; ancestors[r] = 1u << r; }}
}}
"""


def scan(tmp_path: Path, *, top: str = "", chain: str = "", tree: str = "") -> list[str]:
    (tmp_path / "acceptors.h").write_text(HEADER)
    (tmp_path / "acceptors.c").write_text(TEMPLATE.format(top=top, chain=chain, tree=tree))
    return cscan.scan(tmp_path / "acceptors.c", tmp_path / "acceptors.h")


CLEAN = [
    pytest.param("", "", "", id="template"),
    pytest.param(
        "",
        "for (uint32_t i = 0; i < k; i++) { if (draft[i] != target[i]) { n = i + 1; break; } n = i + 2; }",
        "",
        id="equality, counters, loops",
    ),
    pytest.param(
        "static bool same(uint32_t a, uint32_t b) { return a == b; }\n"
        "struct pair { uint32_t tok; uint64_t n; };\n"
        "static struct pair mk(uint32_t t, uint64_t n) { return (struct pair){t, n}; }",
        "struct pair p = mk(target[0], budget);"
        " if (same(p.tok, stops[0]) && p.n > 3) e = true; n = (uint32_t)p.n;",
        "",
        id="helpers, structs, counts next to tokens",
    ),
    pytest.param(
        "static bool has(const uint32_t *xs, uint32_t len, uint32_t t) {"
        " return len != 0 && (xs[0] == t || has(xs + 1, len - 1, t)); }",
        "e = has(stops, nstops, target[0]);",
        "",
        id="recursion over a token array with pointer offsets",
    ),
    pytest.param(
        "", "uint32_t t = target[k]; uint64_t wide = (uint64_t)t; e = wide == draft[0];", "", id="widening"
    ),
]


@pytest.mark.parametrize(("top", "chain", "tree"), CLEAN)
def test_clean_code_passes(tmp_path: Path, top: str, chain: str, tree: str) -> None:
    assert scan(tmp_path, top=top, chain=chain, tree=tree) == []


VIOLATIONS = [
    pytest.param("", "if (draft[0] < target[0]) n = 2;", "ordering comparison '<'", id="<"),
    pytest.param("", "e = target[1] >= stops[0];", "ordering comparison '>='", id=">="),
    pytest.param("", "n = target[0] + 1;", "operator '+'", id="arithmetic"),
    pytest.param(
        "", "uint32_t t = target[0]; if (t > 5) n = 2;", "ordering comparison '>'", id="through a local"
    ),
    pytest.param(
        "static bool less(uint32_t a, uint32_t b) { return a < b; }",
        "e = less(draft[0], target[0]);",
        "less: line",
        id="through a helper parameter",
    ),
    pytest.param(
        "static uint32_t first(const uint32_t *xs) { return xs[0]; }",
        "e = first(target) >= 3;",
        "ordering comparison '>='",
        id="through a return value",
    ),
    pytest.param(
        "struct p { uint32_t tok; uint32_t n; };",
        "struct p v = {target[0], 1}; if (v.tok < 3) n = 2;",
        "ordering comparison '<'",
        id="through a struct field",
    ),
    pytest.param(
        "static void get(const uint32_t *xs, uint32_t *out) { *out = xs[0]; }",
        "uint32_t v; get(target, &v); if (v & 1u) n = 2;",
        "operator '&'",
        id="through an out-parameter",
    ),
    pytest.param("", "uint32_t tally[4] = {0}; n = tally[target[0]];", "array index", id="as an index"),
    pytest.param("", "if (target[0]) n = 2;", "truth value", id="as a truth value"),
    pytest.param("", "e = stops[0] && n;", "truth value", id="in &&"),
    pytest.param("", "switch (target[0]) { case 1: n = 2; break; default: break; }", "switch", id="switch"),
    pytest.param("", "uint8_t c = (uint8_t)target[0]; n = c;", "cast to 'uint8_t'", id="narrowing cast"),
    pytest.param("", "uint32_t t = target[0]; t += 1; e = t == 0;", "compound assignment", id="+="),
    pytest.param("", "uint32_t t = ~draft[0]; e = t == 0;", "unary operator '~'", id="~"),
    pytest.param("", "uint32_t t = target[0]; t++; e = t == 0;", "unary operator 'p++'", id="++"),
    pytest.param(
        "#define LT(a, b) ((a) < (b))", "e = LT(draft[0], target[0]);", "ordering", id="hidden in a macro"
    ),
]


@pytest.mark.parametrize(("top", "chain", "expected"), VIOLATIONS)
def test_token_misuse_is_named(tmp_path: Path, top: str, chain: str, expected: str) -> None:
    problems = scan(tmp_path, top=top, chain=chain)
    assert any(expected in p for p in problems), problems


def test_tree_parameters_are_tokens_too(tmp_path: Path) -> None:
    problems = scan(tmp_path, tree="if (target[2] > draft[2]) *count = 2;")
    assert any("elpis_tree_accept" in p and "ordering" in p for p in problems), problems


@pytest.mark.parametrize(
    ("top", "chain", "expected"),
    [
        pytest.param("#include <string.h>", "", "includes <string.h>", id="include"),
        pytest.param("static uint32_t seen;", "seen = k;", "mutable file-scope variable 'seen'", id="global"),
        pytest.param("uint32_t helper(uint32_t x) { return x; }", "", "exports helper", id="extra export"),
        pytest.param("", "abort();", "call to abort", id="external call"),
        pytest.param("", '__asm__("nop");', "inline assembly", id="asm"),
    ],
)
def test_structure_rules(tmp_path: Path, top: str, chain: str, expected: str) -> None:
    problems = scan(tmp_path, top=top, chain=chain)
    assert any(expected in p for p in problems), problems


def test_missing_export_is_named(tmp_path: Path) -> None:
    (tmp_path / "acceptors.h").write_text(HEADER)
    (tmp_path / "acceptors.c").write_text('#include "acceptors.h"\n')
    problems = cscan.scan(tmp_path / "acceptors.c", tmp_path / "acceptors.h")
    assert {p.split("function ")[-1] for p in problems if "does not define" in p} == set(cscan.EXPORTS)


def test_unparsable_c_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "acceptors.h").write_text(HEADER)
    (tmp_path / "acceptors.c").write_text('#include "acceptors.h"\nvoid broken( {\n')
    with pytest.raises(cscan.ScanError):
        cscan.scan(tmp_path / "acceptors.c", tmp_path / "acceptors.h")


def test_the_generated_c_passes(tmp_path: Path) -> None:
    from elpis.bend.codegen import generate

    paths = {p.name: p for p in generate(tmp_path)}
    assert cscan.scan(paths["acceptors.c"], paths["acceptors.h"]) == []
