"""Teeth: each planted bug makes `build()` fail, and the failure names the layer that caught it.

Every test copies the parts of the repository the build reads from a root (bend/, proofs/, codegen/,
ext/) into a temporary root, plants one bug by a textual edit that must match exactly where expected,
and builds that root into a temporary output. The Python that generates, builds and admits (elpis/) is
the running package, as in a real build.

Cost. The repository build (make build, admitted here against the current sources) already proved
exactly the pristine prover inputs, so the pristine copy and every mutation outside bend/ and proofs/
reuse its proof certificates (each such test asserts bend/ and proofs/ are byte-identical to the
pristine copy: the prover reads nothing else). These builds also render the kernel headers (verify
schedule, GDN plan, GEMM schedule; no later layer reads them) but skip their check against the
interpreter: each rendered header must be byte-identical to the one the repository build checked and
installed in build/kernels/, and the check reads only the header, bend/ and the compiler. A Bend
mutation gets a real proof run of the mutated root by the real prover, restricted to the
implementation-equals-spec law of the mutated module (a full build checks it among all the others);
the build stops at that first failing layer.
"""

from __future__ import annotations

import filecmp
import importlib
import json
import re
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from elpis.accept import build as build_module
from elpis.accept import identity, loader, table
from elpis.accept.build import BuildError, build
from elpis.bend import codegen
from elpis.paths import BUILD_DIR, REPO_ROOT

pytestmark = pytest.mark.slow

PROVER_INPUTS = ("bend", "proofs")
def _repository_checked_header(
    name: str, mismatch: str, label: str, root: Path, kernels_dir: Path, cc: str
) -> None:
    """Stands in for the build's kernel-header step (`build._kernel_header`: render, then the slow interpreter
    check): the header rendered from `root` must be the one the repository build checked against the
    interpreter (the same text and bend/ give the same verdict); it is installed where the step would install
    it."""
    module = importlib.import_module(f"elpis.bend.{name}")
    text = module.render(root)
    checked = BUILD_DIR / "kernels" / module.HEADER
    assert text == checked.read_text(), f"{module.HEADER} differs from {checked}: this build needs its check"
    kernels_dir.mkdir(parents=True, exist_ok=True)
    (kernels_dir / module.HEADER).write_text(text)


def _reuse_checked_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_module, "_kernel_header", _repository_checked_header)


def _copy_root(target: Path) -> Path:
    for rel in identity.ROOT_SOURCE_DIRS:
        shutil.copytree(REPO_ROOT / rel, target / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, build_dir: Path) -> dict[str, Any]:
    """The unmutated copy, built once: a mutation that fails is then failing because of the mutation,
    not because the copy is incomplete."""
    loader.admit(build_dir, REPO_ROOT)  # its certificates belong to exactly the current sources
    certificates = json.loads((build_dir / identity.CERTIFICATES).read_bytes())
    base = tmp_path_factory.mktemp("pristine")
    root = _copy_root(base / "root")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build_module, "_prove", lambda root, advance=None: certificates)
        _reuse_checked_headers(mp)
        result = build(root, base / "out" / "accept")
    return {"root": root, "result": result, "certificates": certificates}


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])

    def clean(c: filecmp.dircmp) -> bool:
        shallow_equal = not (c.left_only or c.right_only or c.diff_files or c.funny_files)
        content_equal = all(
            filecmp.cmp(Path(c.left) / f, Path(c.right) / f, shallow=False) for f in c.same_files
        )
        return shallow_equal and content_equal and all(clean(sub) for sub in c.subdirs.values())

    return clean(cmp)


def _mutated(tmp_path: Path, pristine: dict[str, Any], path: str, old: str, new: str, count: int = 1) -> Path:
    root = tmp_path / "root"
    shutil.copytree(pristine["root"], root, ignore=shutil.ignore_patterns("__pycache__"))
    file = root / path
    text = file.read_text()
    assert text.count(old) == count, (
        f"{path}: the mutation's pattern occurs {text.count(old)} times, not {count}"
    )
    file.write_text(text.replace(old, new))
    return root


def _reuse_pristine_proofs(monkeypatch: pytest.MonkeyPatch, pristine: dict[str, Any], root: Path) -> None:
    """The prove step gives the pristine build's certificates (its inputs are asserted identical) and the
    header steps skip their check (see the module docstring): the build's time goes to the layers the
    mutations target."""
    for rel in PROVER_INPUTS:
        assert _same_tree(pristine["root"] / rel, root / rel), (
            f"{rel}/ differs: this mutation needs a proof run"
        )
    certificates = pristine["certificates"]
    monkeypatch.setattr(build_module, "_prove", lambda root, advance=None: certificates)
    _reuse_checked_headers(monkeypatch)


def _fails(
    root: Path, tmp_path: Path, layer: str, *, before_admission: Callable[[Path], None] | None = None
) -> str:
    out = tmp_path / "out" / "accept"
    with pytest.raises(BuildError) as info:
        build(root, out, before_admission=before_admission)
    assert info.value.layer == layer, (
        f"caught by {info.value.layer}, not {layer}: {info.value.message[:2000]}"
    )
    assert not out.exists(), "a failed build must not leave an output"
    return info.value.message


def test_pristine_copy_builds_and_matches_the_repository_build(
    pristine: dict[str, Any], build_dir: Path
) -> None:
    built = pristine["result"].identity
    loader.admit(pristine["result"].out, pristine["root"])
    # Same sources, same compiler: the generated C, the library and the table are byte-identical.
    repo = loader.admit(build_dir, REPO_ROOT).identity
    for name in (
        identity.GENERATED_C,
        identity.GENERATED_H,
        identity.WRAPPER_C,
        loader.LIBRARY,
        identity.TABLE,
    ):
        assert built["artifacts"][name] == repo["artifacts"][name], name


# --- Bend implementation mutations: caught by the prover --------------------------------------------

# The highest-child mutation takes a matching child only if no later sibling matches; it needs this def.
SIBLING_LATER = """
def sibling_later(ps: List<Nat>, ds: List<Ty.Tok>, +cur: Nat, +want: Ty.Tok) -> Bool:
  match ps ds:
    case p <> pt d <> dt:
      Bool.or(Bool.and(Nat.is_eq(p, cur), U32.is_eq(d, want)), sibling_later(pt, dt, cur, want))
    case _ _:
      False{}
"""
_TREE_STEP = "    case p <> pt d <> dt +t <> tt:\n      +h = hit(stopped, p, cur, d, want)\n      {next}("
_HIGHEST_STEP = (
    "    case p <> +pt d <> +dt +t <> tt:\n"
    "      +h = Bool.and(hit(stopped, p, cur, d, want), Bool.not(sibling_later(pt, dt, cur, want)))\n"
    "      {next}("
)

# (file, edits: each (old, new) must occur exactly once, text appended, the law that must catch it)
BEND_MUTATIONS = [
    pytest.param(
        "bend/chain.bend",
        [
            (
                "  match ends miss:\n"
                "    case True{} _:\n"
                "      Ty.ChainDecision{n, True{}}\n"
                "    case False{} True{}:\n"
                "      Ty.ChainDecision{n, False{}}\n",
                "  match miss ends:\n"
                "    case True{} _:\n"
                "      Ty.ChainDecision{n, False{}}\n"
                "    case False{} True{}:\n"
                "      Ty.ChainDecision{n, True{}}\n",
            )
        ],
        "",
        "chain_matches_spec",
        id="rule order swapped: mismatch before stop",
    ),
    pytest.param(
        "bend/chain.bend",
        [("Nat.is_ge(n, budget)", "Nat.is_gt(n, budget)")],
        "",
        "chain_matches_spec",
        id="budget off by one",
    ),
    pytest.param(
        "bend/chain.bend",
        [("  Bool.or(is_stop(t, stops), Nat.is_ge(n, budget))\n", "  Nat.is_ge(n, budget)\n")],
        "",
        "chain_matches_spec",
        id="stop ignored",
    ),
    pytest.param(
        "bend/tree.bend",
        [
            (_TREE_STEP.format(next="decide"), _HIGHEST_STEP.format(next="decide")),
            (_TREE_STEP.format(next="emit"), _HIGHEST_STEP.format(next="emit")),
        ],
        SIBLING_LATER,
        "tree_matches_spec",
        id="highest child instead of lowest",
    ),
]


def _declared_laws(root: Path) -> set[str]:
    return set(re.findall(r"^law (\w+):", (root / "bend" / "LAWS.bend").read_text(), flags=re.MULTILINE))


@pytest.mark.parametrize(("path", "edits", "append", "law"), BEND_MUTATIONS)
def test_bend_mutation_is_caught_by_the_prover(
    pristine: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    edits: list[tuple[str, str]],
    append: str,
    law: str,
) -> None:
    from elpis.bend import prove

    root = _mutated(tmp_path, pristine, path, *edits[0])
    file = root / path
    for old, new in edits[1:]:
        text = file.read_text()
        assert text.count(old) == 1, f"{path}: the pattern occurs {text.count(old)} times, not once"
        file.write_text(text.replace(old, new))
    file.write_text(file.read_text() + append)
    assert law in _declared_laws(root), f"bend/LAWS.bend no longer declares {law}"
    monkeypatch.setattr(prove, "prove_all", partial(prove.prove_all, only={law}))
    message = _fails(root, tmp_path, "prove")
    # The law must fail on its merits (a counterexample), not because the mutated file does not load.
    assert re.search(rf"law {law}: false: counterexample", message), message


# --- code generation: caught by the C scan or the table ---------------------------------------------


def test_ordering_on_ids_in_the_codegen_template_is_caught_by_the_c_scan(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _mutated(
        tmp_path,
        pristine,
        "codegen/acceptors.c.j2",
        "  *ends = d.ends;\n}\n\nvoid elpis_tree_accept(",
        "  *ends = d.ends || (k > 0u && draft[0] < target[0]);\n}\n\nvoid elpis_tree_accept(",
    )
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    message = _fails(root, tmp_path, "c-scan")
    assert "<" in message and "elpis_chain_accept" in message


def test_ordering_on_ids_with_the_token_type_erased_is_caught_by_the_build_scan(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator's own scan follows the elpis_tok type; a template that declares the ids as plain
    uint32_t slips past it. The build's scan follows the values from the ABI's token parameters."""
    root = _mutated(
        tmp_path,
        pristine,
        "codegen/acceptors.c.j2",
        "void elpis_chain_accept(uint32_t k, const elpis_tok draft[15], const elpis_tok target[16],",
        "void elpis_chain_accept(uint32_t k, const uint32_t draft[15], const uint32_t target[16],",
    )
    template = root / "codegen" / "acceptors.c.j2"
    text = template.read_text()
    old = "  *ends = d.ends;\n}\n\nvoid elpis_tree_accept("
    assert text.count(old) == 1
    template.write_text(
        text.replace(
            old, "  *ends = d.ends || (k > 0u && draft[0] < target[0]);\n}\n\nvoid elpis_tree_accept("
        )
    )
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    message = _fails(root, tmp_path, "c-scan")
    assert "generated C violates the token rules" in message
    assert "elpis_chain_accept: line" in message and "ordering comparison '<'" in message


def test_wrong_count_in_the_codegen_template_is_caught_by_the_table(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug outside the proved Bend (in the C wrapper around it) that no scan can see."""
    root = _mutated(
        tmp_path,
        pristine,
        "codegen/acceptors.c.j2",
        "  *count = (uint32_t)d.count;\n  *ends = d.ends;\n}\n\nvoid elpis_tree_accept(",
        "  *count = (uint32_t)d.count - (d.count > 8u);\n  *ends = d.ends;\n}\n\nvoid elpis_tree_accept(",
    )
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    message = _fails(root, tmp_path, "table")
    assert "library disagrees with the oracle" in message and "chain_random" in message


def test_sequential_parameter_update_in_the_loop_form_is_caught_by_the_table(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator's loop form of a self tail call (trusted, not proved) updates the parameters in
    parallel through `next_` temporaries. Assigning the Nat parameters one after another instead (so
    `cur` reads the new `idx`) is a plausible generator bug that no scan can see: the table sees it."""
    original = codegen.FnEmitter._again

    def sequential(self: codegen.FnEmitter, args: Any, ctx: tuple, depth: int) -> None:
        start = len(self.lines)
        original(self, args, ctx, depth)
        if not self.fun.key.startswith("bend/tree.bend::"):
            return  # the acceptor's tree walk only (the schedule and plan headers use this generator too)
        lines = []
        for line in self.lines[start:]:
            if re.fullmatch(r"\s*(v_\w+) = next_\1;", line) and "uint64_t next_" + line.split()[0] in (
                "".join(self.lines[start:])
            ):
                continue  # the temporary is gone: the parameter was assigned in place below
            temp = re.fullmatch(r"(\s*)uint64_t next_(v_\w+) = (.*);", line)
            lines.append(f"{temp[1]}{temp[2]} = {temp[3]};" if temp else line)
        assert lines != self.lines[start:]
        self.lines[start:] = lines

    monkeypatch.setattr(codegen.FnEmitter, "_again", sequential)
    root = tmp_path / "root"
    shutil.copytree(pristine["root"], root, ignore=shutil.ignore_patterns("__pycache__"))
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    message = _fails(root, tmp_path, "table")
    assert "library disagrees with the oracle" in message and ("tree8" in message or "tree_random" in message)


# --- glue, table pin, build directory: caught by the table check or admission -----------------------


def test_checks_skipping_the_parent_check_are_caught_by_admission(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The checked entries the glue exports (and the device acceptor runs) live in ext/accept_checks.h.
    root = _mutated(
        tmp_path,
        pristine,
        "ext/accept_checks.h",
        "    if (!elpis_check_parents_ok(parent_cells, rows)) return ELPIS_ERR_PARENT;\n"
        "    const int64_t ns = cells[ELPIS_TREE_NSTOPS];",
        "    const int64_t ns = cells[ELPIS_TREE_NSTOPS];",
    )
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    message = _fails(root, tmp_path, "admission")
    assert "probe 'tree" in message


def test_stale_pinned_hash_is_caught_by_the_table_layer(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reuse_pristine_proofs(monkeypatch, pristine, pristine["root"])
    monkeypatch.setattr(loader, "TABLE_SHA256", "0" * 64)
    message = _fails(pristine["root"], tmp_path, "table")
    assert "is not the pinned" in message


def test_changed_table_definition_is_caught_by_the_table_layer(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that silently shrank (a section enumerating fewer decisions) no longer hashes to the pin."""
    _reuse_pristine_proofs(monkeypatch, pristine, pristine["root"])
    shrunk = tuple(
        s
        if s.name != "chain_random"
        else table.Section(
            s.name, s.kind, 8192, s.params, table._seeded(table.random_chain_block, table.CHAIN_SEED, 8192)
        )
        for s in table.SECTIONS
    )
    monkeypatch.setattr(table, "SECTIONS", shrunk)
    monkeypatch.setattr("elpis.accept.tablefile.SECTIONS", shrunk)
    message = _fails(pristine["root"], tmp_path, "table")
    assert "is not the pinned" in message


def test_tampered_library_byte_is_caught_by_admission(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reuse_pristine_proofs(monkeypatch, pristine, pristine["root"])

    def flip(staging: Path) -> None:
        lib = staging / loader.LIBRARY
        data = bytearray(lib.read_bytes())
        data[len(data) // 3] ^= 0x40
        # A new file renamed over the old one: the build process has the original mapped, and rewriting
        # a mapped library in place would corrupt that process's code, not test admission.
        tampered = lib.with_suffix(".tampered")
        tampered.write_bytes(bytes(data))
        tampered.replace(lib)

    message = _fails(pristine["root"], tmp_path, "admission", before_admission=flip)
    assert f"{loader.LIBRARY}: SHA-256" in message


def test_extra_file_in_the_build_is_caught_by_admission(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reuse_pristine_proofs(monkeypatch, pristine, pristine["root"])
    message = _fails(
        pristine["root"],
        tmp_path,
        "admission",
        before_admission=lambda s: (s / "stray.so").write_bytes(b"\x7fELF"),
    )
    assert "unexpected files ['stray.so']" in message


def test_a_failed_build_keeps_the_previous_output(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reuse_pristine_proofs(monkeypatch, pristine, pristine["root"])
    out = tmp_path / "out" / "accept"
    build(pristine["root"], out)
    before = identity.sha256_file(out / identity.IDENTITY)
    with pytest.raises(BuildError):
        build(pristine["root"], out, before_admission=lambda s: (s / "stray").write_text("x"))
    assert identity.sha256_file(out / identity.IDENTITY) == before
    assert sorted(p.name for p in out.parent.iterdir()) == [".accept.lock", "accept"], "staging left behind"


def test_a_source_edited_during_the_build_is_caught_before_the_identity_is_written(
    pristine: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    shutil.copytree(pristine["root"], root)
    _reuse_pristine_proofs(monkeypatch, pristine, root)
    real_compile = build_module._compile

    def compile_then_edit(*args: Any) -> None:
        real_compile(*args)
        glue = root / "ext" / "elpis_glue.c"
        glue.write_text(glue.read_text() + "/* edited mid-build */\n")

    monkeypatch.setattr(build_module, "_compile", compile_then_edit)
    message = _fails(root, tmp_path, "identity")
    assert "sources changed while building" in message and "ext/elpis_glue.c" in message
