"""Vacuity witnesses of kernel-proved laws are checked by the interpreter: a z3 model that holds only for an
abstracted recursion (an uninterpreted function) is no witness."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.bend import vacuity
from elpis.bend.check import Program
from elpis.bend.errors import BendError
from elpis.bend.interp import Interpreter
from elpis.bend.prove import load_program, prove_all
from elpis.bend.vacuity import find_witness, vacuity_witness

DOUBLE = """import Base

def double(n: Nat) -> Nat:
  match n:
    case 0n:
      0n
    case 1n+m:
      Nat.add(double(m), 2n)
"""

LAW = """import Base
import ../bend/LAWS.bend as Laws

law {name}:
  for n: Nat
  for k: Nat
  for h: {{Laws.double(n) == {rhs} : Nat}}
  {{k == k : Nat}}

def {name}(n, k, h):
  {{==}}
"""


def _synthetic(root: Path, name: str, rhs: str) -> Path:
    """A program whose one kernel law has the hypothesis double(n) == rhs (double recursing on n)."""
    (root / "bend").mkdir()
    (root / "proofs").mkdir()
    (root / "bend/LAWS.bend").write_text(DOUBLE)
    (root / "proofs/PROOF.bend").write_text(LAW.format(name=name, rhs=rhs))
    return root


def _holds(prog: Program, law, values: dict) -> bool:
    """Every unquantified hypothesis, run by a fresh interpreter on the witness."""
    run = Interpreter(prog)
    plain = [h.hyp.eq for h in law.hyps if not h.hyp.binders]
    return all(run.eval(eq.lhs, values) == run.eval(eq.rhs, values) for eq in plain)


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


def test_satisfiable_recursion_gets_a_checked_witness(tmp_path):
    """double(n) == 6: z3 with double unknown picks some n; the witness recorded is n = 3, run and checked."""
    root = _synthetic(tmp_path, "double_is_six", "6n")
    report = prove_all(root, jobs=1)
    assert report.ok, report.failures
    (cert,) = report.certificates
    assert cert["method"] == "kernel"
    assert cert["vacuity_witness"]["checked"] == "interpreter"
    assert cert["vacuity_witness"]["values"]["n"] == 3
    prog = load_program(root)
    (law,) = prog.laws.values()
    witness = find_witness(prog, law)
    assert _holds(prog, law, witness.values) and list(witness.pinned.values()) == [3]


def test_a_refuted_model_without_abstraction_is_an_error(program, monkeypatch):
    """With no def taken as unknown, z3's model must run true: a disagreement is raised, not retried."""
    law = next(law for law in program.laws.values() if law.name == "child_prefix")
    monkeypatch.setattr(vacuity._Search, "_failing", lambda self, values: "hypothesis (forced) is false")
    with pytest.raises(BendError, match=r"internal error.*refuted by the interpreter"):
        find_witness(program, law)
