"""Code generation: deterministic, compiles with -Werror, agrees with the interpreter, token scan."""

from __future__ import annotations

import ctypes
import random
import re
import shutil
import subprocess

import pytest

from elpis.bend import cscan
from elpis.bend.codegen import _accumulated, generate, render
from elpis.bend.core import CCall, CPrim, CVar
from elpis.bend.errors import BendError
from elpis.paths import REPO_ROOT

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="gcc is needed to compile the generated C")
FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    out = tmp_path_factory.mktemp("acceptors")
    _, source = generate(out)
    lib = out / "libacceptors.so"
    subprocess.run([GCC, *FLAGS, "-shared", "-fPIC", str(source), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def test_output_is_deterministic(tmp_path):
    a = generate(tmp_path / "a")
    b = generate(tmp_path / "b")
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes()


def test_exports_exactly_the_contract(tmp_path):
    _, source = generate(tmp_path)
    text = source.read_text()
    exported = {
        line.split("(")[0].split()[-1] for line in text.splitlines() if line.startswith("void elpis_")
    }
    assert exported == {"elpis_chain_accept", "elpis_tree_accept", "elpis_tree_masks"}
    assert "static" in text and "#include <stdlib.h>" not in text and "malloc" not in text
    for name in ("chain_spec", "tree_spec", "masks_spec"):
        assert name not in text  # never generated from a spec


def _function_bodies(text: str) -> dict[str, str]:
    """name -> body text of every generated `bend_*` definition."""
    heads = list(re.finditer(r"^ELPIS_FN static \w+ (bend_\w+)\(.*\{$", text, re.M))
    return {h.group(1): text[h.end() : text.index("\n}\n", h.end())] for h in heads}


def test_the_generated_c_has_no_recursion(tmp_path):
    """Every recursive Bend def here recurses only in tail position (or as `a || f`, `a OP f` with an
    associative OP), so each is emitted as a loop: NVVM, unlike gcc, would otherwise keep one frame per
    row on the GPU. No function calls itself, nor any other function that leads back to it."""
    _, source = generate(tmp_path)
    bodies = _function_bodies(source.read_text())
    calls = {name: set(re.findall(r"\b(bend_\w+)\(", body)) & set(bodies) for name, body in bodies.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(g == goal or (g not in seen and reaches(g, goal, seen | {g})) for g in calls[start])

    assert [name for name in bodies if reaches(name, name, set())] == []
    loops = {name for name, body in bodies.items() if "for (;;) {" in body}
    assert {"bend_chain_run", "bend_chain_is_stop", "bend_tree_decide", "bend_tree_walk"} <= loops
    assert {"bend_masks_depth_scan", "bend_masks_mask_scan", "bend_masks_parent"} <= loops


def test_only_a_trailing_self_call_under_an_accumulator_operator_is_folded():
    """`a + f(..)` folds into an accumulator; `f(..) + a` is not recognised (so it would stay a call)."""
    body = CPrim("Nat.add", (CCall("m::f", (CVar("x"),)), CVar("y")))
    assert _accumulated(body, "m::f") is None
    assert _accumulated(CPrim("Nat.add", (CVar("y"), CCall("m::f", (CVar("x"),)))), "m::f") == "Nat.add"


U32 = ctypes.c_uint32


def _array(values, n, ctype=U32, rng=None):
    rng = rng or random.Random(0)
    arr = (ctype * n)(*[rng.getrandbits(30) for _ in range(n)])  # garbage in unused slots
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def test_c_agrees_with_interpreter(library, interp):
    chain = interp.function("bend/chain.bend::accept")
    tree = interp.function("bend/tree.bend::accept")
    rows = interp.function("bend/tree.bend::rows")
    depths = interp.function("bend/masks.bend::depths")
    ancestors = interp.function("bend/masks.bend::ancestors")
    rng = random.Random(21)
    count, ends = U32(), ctypes.c_bool()
    for _ in range(1500):
        alphabet = [rng.getrandbits(32) for _ in range(3)]
        k = rng.randint(0, 15)
        draft = [rng.choice(alphabet) for _ in range(k)]
        target = [rng.choice(alphabet) for _ in range(k + 1)]
        stops = rng.sample([*alphabet, 7], rng.randint(0, 4))
        budget = rng.choice([1, 2, 5, 17, 2**48 - 1])
        library.elpis_chain_accept(
            U32(k),
            _array(draft, 15, rng=rng),
            _array(target, 16, rng=rng),
            U32(len(stops)),
            _array(stops, 4, rng=rng),
            ctypes.c_uint64(budget),
            ctypes.byref(count),
            ctypes.byref(ends),
        )
        want = chain(tuple(draft), tuple(target), tuple(stops), budget)
        assert (count.value, ends.value) == want.fields

        r = rng.randint(1, 16)
        parents = [-1] + [rng.randrange(i) for i in range(1, r)]
        tdraft = [rng.choice(alphabet) for _ in range(r)]
        ttarget = [rng.choice(alphabet) for _ in range(r)]
        path = (U32 * 16)()
        library.elpis_tree_accept(
            U32(r),
            _array(parents, 16, ctypes.c_int32, rng),
            _array(tdraft, 16, rng=rng),
            _array(ttarget, 16, rng=rng),
            U32(len(stops)),
            _array(stops, 4, rng=rng),
            ctypes.c_uint64(budget),
            path,
            ctypes.byref(count),
            ctypes.byref(ends),
        )
        nat_parents = tuple([0, *parents[1:]])
        args = (nat_parents, tuple(tdraft), tuple(ttarget), tuple(stops), budget)
        assert (count.value, ends.value) == tree(*args).fields
        assert tuple(path[: count.value]) == rows(*args)

        dep, anc = (U32 * 16)(), (U32 * 16)()
        library.elpis_tree_masks(U32(r), _array(parents, 16, ctypes.c_int32, rng), dep, anc)
        assert tuple(dep[:r]) == depths(nat_parents)
        assert tuple(anc[:r]) == ancestors(nat_parents)


def test_token_scan_accepts_the_generated_code():
    _, source = render(REPO_ROOT)
    assert cscan.scan(source) == []


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("(v_d != v_t)", "(v_d < v_t)", "operator <"),
        ("(v_d != v_t)", "(v_d >= v_t)", "operator >="),
        ("if ((v_s == v_t)) {", "if (((v_s + 1) == v_t)) {", "operator +"),
        ("if ((v_s == v_t)) {", "if (((uint32_t)v_s == v_t)) {", "cast"),
        ("v_want = next_v_want;", "v_want = 7u;", "a made-up token assigned to a loop parameter"),
        ("v_want = next_v_want;", "v_n = next_v_want;", "a token assigned to a non-token parameter"),
        ("elpis_tok v_d = v_draft[0];", "uint32_t v_d = v_draft[0];", "non-token variable"),
    ],
)
def test_token_scan_catches_planted_operations(old, new, why):
    _, source = render(REPO_ROOT)
    assert old in source
    problems = cscan.scan(source.replace(old, new, 1))
    assert problems, why
    assert all("token scan" in p and "acceptors.c:" in p for p in problems)


def test_codegen_refuses_token_arithmetic_in_bend(repo_copy):
    chain = repo_copy / "bend/chain.bend"
    text = chain.read_text().replace("U32.is_ne(d, t)", "U32.is_lt(d, t)")
    chain.write_text(text)
    with pytest.raises(BendError, match="token ids"):
        render(repo_copy)
