"""Vacuity witnesses of kernel-proved and z3-proved laws are checked by the interpreter: a z3 model that holds
only for an abstracted recursion (an uninterpreted function) is no witness."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.bend.check import Program
from elpis.bend.core import FunT
from elpis.bend.errors import BendError
from elpis.bend.interp import Data, Interpreter
from elpis.bend.prove import load_program, prove_all
from elpis.bend.smt import LawSmt
from elpis.bend.vacuity import WitnessSearch, find_witness, vacuity_witness
from elpis.paths import REPO_ROOT

DOUBLE = """import Base

def double(n: Nat) -> Nat:
  match n:
    case 0n:
      0n
    case 1n+m:
      Nat.add(double(m), 2n)
"""

LAW = """
law {name}:
  for n: Nat
  for k: Nat
  for h: {{{prefix}double(n) == {rhs} : Nat}}
  {{k == k : Nat}}
"""

PROOF = """
def {name}(n, k, h):
  {{==}}
"""

PROOF_GATE = "import Base\nimport ../bend/LAWS.bend as Laws\n"


def _synthetic(root: Path, name: str, rhs: str, *, kernel: bool = True) -> Path:
    """A program whose one law has the hypothesis double(n) == rhs (double recursing on n): with a proof (a
    kernel law, in PROOF.bend) or without (a z3 law, in LAWS.bend)."""
    (root / "bend").mkdir()
    (root / "proofs").mkdir()
    law = LAW.format(name=name, rhs=rhs, prefix="Laws." if kernel else "")
    (root / "bend/LAWS.bend").write_text(DOUBLE + ("" if kernel else law))
    (root / "proofs/PROOF.bend").write_text(PROOF_GATE + (law + PROOF.format(name=name) if kernel else ""))
    return root


def _holds(prog: Program, law, values: dict) -> bool:
    """Every unquantified hypothesis, run by a fresh interpreter on the witness."""
    run = Interpreter(prog)
    plain = [h.hyp.eq for h in law.hyps if not h.hyp.binders]
    return all(run.eval(eq.lhs, values) == run.eval(eq.rhs, values) for eq in plain)


def _refute_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WitnessSearch, "_failing", lambda self, values: "hypothesis (forced) is false")


def test_every_kernel_law_has_a_witness_the_interpreter_confirms(program):
    assert program.proofs
    for key in program.proofs:
        law = program.laws[key]
        witness = find_witness(program, law)
        assert _holds(program, law, witness.values), law.name


def test_inductions_get_real_witnesses(program):
    """z3 alone gave level_of(0) == 5 (level_of unknown); the real level_of needs five levels."""
    law = next(law for law in program.laws.values() if law.name == "rowscan_butterfly_counts_every_lane")
    record = vacuity_witness(program, law)
    assert record["checked"] == "interpreter"
    assert record["values"]["done"] == 5


def test_unsatisfiable_for_the_real_recursion_fails(tmp_path):
    """double(n) == 1 has a model with double unknown, none with the real double: the law must fail."""
    root = _synthetic(tmp_path, "odd_double", "1n")
    prog = load_program(root)
    (law,) = prog.laws.values()
    with pytest.raises(BendError, match=r"vacuity check failed.*double") as err:
        find_witness(prog, law)
    assert "odd_double" in str(err.value) and "1 model(s)" in str(err.value)
    report = prove_all(root, jobs=1)
    assert not report.ok and "vacuity check failed" in report.failures[0]


@pytest.mark.parametrize(("kernel", "method"), [(True, "kernel"), (False, "smt")])
def test_satisfiable_recursion_gets_a_checked_witness(tmp_path, kernel, method):
    """double(n) == 6, with a kernel proof or by z3: z3's model, with double unknown, is refuted; pinning n
    finds n = 3, the witness recorded, run and checked."""
    root = _synthetic(tmp_path, f"double_is_six_{method}", "6n", kernel=kernel)
    report = prove_all(root, jobs=1)
    assert report.ok, report.failures
    (cert,) = report.certificates
    assert cert["method"] == method
    assert cert["vacuity_witness"]["checked"] == "interpreter"
    assert cert["vacuity_witness"]["values"]["n"] == 3
    prog = load_program(root)
    (law,) = prog.laws.values()
    witness = find_witness(prog, law)
    assert _holds(prog, law, witness.values) and list(witness.pinned.values()) == [3]


def test_a_refuted_model_without_abstraction_is_an_error(program, monkeypatch):
    """With no def taken as unknown, z3's model must run true: a disagreement is raised, not retried."""
    law = next(law for law in program.laws.values() if law.name == "child_prefix")
    _refute_every_model(monkeypatch)
    with pytest.raises(BendError, match=r"internal error.*refuted by the interpreter"):
        find_witness(program, law)


# ---------------------------------------------------------------------------------------------- z3 laws
# Cheap z3 laws of the real program (each well under a second) with lists, Nats past 2^31, U32 values near
# 2^32 and function-typed variables (`g`, `next`, `leaf`: run as z3's interpretation). The full prover (`make
# build`) covers every z3 law: it fails closed on one without a confirmed witness.
Z3_LAWS = {
    "tok_eq_sound",
    "masks_root",
    "drop_small",
    "root_prefix",
    "root_target",
    "splits_start_and_end_the_span",
    "gemm_search_last",
    "gemm_blocks_in_range",
    "rowscan_counts_add",
    "rowscan_commuting_same_operands",
    "rowscan_butterfly_same_start",
}


def _from_json(v: object) -> object:
    """A certificate's value (`vacuity._json`) as an interpreter value; functions cannot be rebuilt."""
    if isinstance(v, list):
        return tuple(_from_json(x) for x in v)
    if isinstance(v, dict):
        ((ctor, fields),) = v.items()
        return Data(ctor, tuple(_from_json(f) for f in fields))
    assert not isinstance(v, str), f"not a value: {v}"
    return v


def test_z3_laws_record_witnesses_the_interpreter_confirms(program):
    """Each z3 law's certificate names its witness, and the recorded values (where no function is among
    them) run every hypothesis true in a fresh interpreter."""
    report = prove_all(REPO_ROOT, jobs=1, only=Z3_LAWS)
    assert report.ok, report.failures
    certs = {c["law"]: c for c in report.certificates}
    assert set(certs) == Z3_LAWS and all(c["method"] == "smt" for c in certs.values())
    laws = {law.name: law for law in program.laws.values()}
    for name, cert in certs.items():
        record = cert["vacuity_witness"]
        assert record["checked"] == "interpreter", name
        law = laws[name]
        assert set(record["values"]) == {c.source for c in law.values}, name
        if any(isinstance(c.ty, FunT) for c in law.values):
            continue  # a function is recorded as z3's interpretation, run by the prover only
        values = {c.name: _from_json(record["values"][c.source]) for c in law.values}
        assert _holds(program, law, values), name


def test_z3_law_unsatisfiable_for_the_real_recursion_fails(tmp_path):
    """double(n) == 1 (no proof): z3 proves the conclusion and finds the hypothesis satisfiable with double
    unknown, but no n runs it true. It passed before z3 laws' witnesses were run; now it fails, and not as
    "vacuous" (z3's unsat hypotheses)."""
    root = _synthetic(tmp_path, "odd_double_z3", "1n", kernel=False)
    report = prove_all(root, jobs=1)
    assert not report.ok
    (failure,) = report.failures
    assert "odd_double_z3" in failure and "vacuous" not in failure
    assert "vacuity check failed: z3 finds its hypotheses satisfiable in 1 shape(s)" in failure
    assert "when run by the interpreter" in failure and "double recurse on" in failure


def test_z3_law_model_is_checked_before_the_search(program, monkeypatch):
    """A z3 law whose hypotheses keep nothing abstract takes z3's own model, run, without any search."""
    law = next(law for law in program.laws.values() if law.name == "masks_root")
    monkeypatch.setattr(WitnessSearch, "run", lambda self, shapes=None: pytest.fail("searched"))
    out = LawSmt(program, law).run()
    assert out.ok and out.certificate["vacuity_witness"] == out.witness
    assert out.witness["values"] == {"parents": [0]}


def test_z3_law_model_refuted_without_abstraction_is_an_error(program, monkeypatch):
    """As for kernel laws: a z3 model with no def taken as unknown must run true."""
    law = next(law for law in program.laws.values() if law.name == "tok_eq_sound")
    _refute_every_model(monkeypatch)
    with pytest.raises(BendError, match=r"internal error.*refuted by the interpreter"):
        LawSmt(program, law).run()
