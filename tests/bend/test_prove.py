"""The prover: false laws and unsatisfiable hypotheses are named with their location; kernel proofs
are checked; every module must be reachable from PROOF.bend."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elpis.bend.prove import prove_all

FALSE_LAW = """
law too_optimistic:
  for draft: List<Ty.Tok>
  for target: List<Ty.Tok>
  for stops: List<Ty.Tok>
  for budget: Nat
  for draft_ok: {L.at_most(3n, draft) == True{} : Bool}
  for target_ok: {L.one_more(draft, target) == True{} : Bool}
  for stops_ok: {L.at_most(1n, stops) == True{} : Bool}
  for budget_ok: {Nat.is_ge(budget, 1n) == True{} : Bool}
  {Ty.count(Chain.accept(draft, target, stops, budget)) == L.length(target) : Nat}
"""

VACUOUS_LAW = """
law never_applies:
  for draft: List<Ty.Tok>
  for draft_ok: {L.at_most(2n, draft) == True{} : Bool}
  for nonsense: {L.at_most(0n, draft) == False{} : Bool}
  for empty: {L.length(draft) == 0n : Nat}
  {L.length(draft) == 5n : Nat}
"""


def _append(root, text):
    laws = root / "bend/LAWS.bend"
    laws.write_text(laws.read_text() + text)
    return laws.read_text().count("\n") - text.count("\n") + 2  # line of the `law` keyword


def test_false_law_is_named_with_location(repo_copy):
    line = _append(repo_copy, FALSE_LAW)
    report = prove_all(repo_copy, jobs=1, only={"too_optimistic"})
    assert not report.ok
    assert len(report.failures) == 1
    failure = report.failures[0]
    assert f"bend/LAWS.bend:{line}:1" in failure and "too_optimistic" in failure
    assert "counterexample" in failure


def test_cli_exits_1_and_names_the_law(repo_copy):
    _append(repo_copy, FALSE_LAW)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "elpis.cli",
            "prove",
            "--root",
            str(repo_copy),
            "--law",
            "too_optimistic",
            "--jobs",
            "1",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "too_optimistic" in proc.stderr and "ALL PROOFS CHECK" not in proc.stdout


def test_cli_passes_a_true_law(repo_copy):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "elpis.cli",
            "prove",
            "--root",
            str(repo_copy),
            "--law",
            "chain_within_budget",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ALL PROOFS CHECK")


def test_vacuous_hypotheses_are_caught(repo_copy):
    _append(repo_copy, VACUOUS_LAW)
    report = prove_all(repo_copy, jobs=1, only={"never_applies"})
    assert not report.ok
    assert "vacuous" in report.failures[0] and "never_applies" in report.failures[0]


def test_wrong_kernel_proof_is_rejected(repo_copy):
    proof = repo_copy / "proofs/lists_proof.bend"
    text = proof.read_text()
    broken = text.replace(
        "      %concat_one(t, y) : {h <> L.concat(t, [y]) == h <> _ : List<Ty.Tok>}\n", "", 1
    )
    assert broken != text
    proof.write_text(broken)
    report = prove_all(repo_copy, jobs=1, only={"concat_one"})
    assert not report.ok
    assert "concat_one" in report.failures[0] and "proofs/lists_proof.bend" in report.failures[0]


def test_kernel_proof_certificate(repo_copy):
    report = prove_all(repo_copy, jobs=1, only={"concat_one", "chain_round_is_plain"})
    assert report.ok, report.failures
    methods = {c["law"]: c["method"] for c in report.certificates}
    assert methods["concat_one"] == methods["chain_round_is_plain"] == "kernel"
    # the lemmas the proof cites are proved in the same run, by whichever layer fits them
    assert {"round_go", "round_cons", "concat_shift"} <= set(methods)
    assert methods["tok_eq_sound"] == "smt"
    assert all(c["vacuity_witness"]["checked"] == "interpreter" for c in report.certificates)


def test_smt_certificate_fields(repo_copy):
    report = prove_all(repo_copy, jobs=1, only={"chain_within_budget"})
    assert report.ok
    (cert,) = report.certificates
    assert cert["solver"].startswith("z3 ") and len(cert["smt2_sha256"]) == 64 and cert["result"] == "unsat"
    assert cert["bounds"] == {"draft": 15, "target": 16, "stops": 4}
    assert all(s["result"] == "unsat" and len(s["smt2_sha256"]) == 64 for s in cert["shapes"])
    assert cert["vacuity_witness"] == {
        "checked": "interpreter",
        "values": {"draft": [], "target": [0], "stops": [], "budget": 1},
    }


def test_smt_budgets_are_resource_units_and_recorded(repo_copy, monkeypatch):
    """A query's budget is z3's resource count, which does not depend on how loaded the machine is: the
    certificate records each shape's units, and a budget below them refuses the law (jobs=1: in-process)."""
    from elpis.bend import smt

    report = prove_all(repo_copy, jobs=1, only={"chain_within_budget"})
    (cert,) = report.certificates
    units = [s["resource_units"] for s in cert["shapes"]]
    assert report.ok and all(u > 0 for u in units) and max(units) < smt.QUERY_RLIMIT
    monkeypatch.setattr(smt, "QUERY_RLIMIT", max(units) // 4)
    report = prove_all(repo_copy, jobs=1, only={"chain_within_budget"})
    assert not report.ok
    assert "chain_within_budget" in report.failures[0] and "resource units" in report.failures[0]


def test_unimported_module_is_refused(repo_copy):
    (repo_copy / "bend/stray.bend").write_text("import Base\n\ndef f(n: Nat) -> Nat:\n  n\n")
    report = prove_all(repo_copy, jobs=1, only={"chain_within_budget"})
    assert not report.ok
    assert "bend/stray.bend" in report.failures[0] and "not imported" in report.failures[0]


def test_law_without_bound_or_proof_fails(repo_copy):
    _append(
        repo_copy,
        """
law unbounded_claim:
  for xs: List<Ty.Tok>
  for ys: List<Ty.Tok>
  {L.concat(xs, ys) == L.concat(ys, xs) : List<Ty.Tok>}
""",
    )
    report = prove_all(repo_copy, jobs=1, only={"unbounded_claim"})
    assert not report.ok and "unbounded_claim" in report.failures[0]


@pytest.mark.parametrize("marker", ["?TODO", "@unsafe def"])
def test_holes_and_unsafe_are_not_accepted(repo_copy, marker):
    laws = repo_copy / "bend/LAWS.bend"
    laws.write_text(laws.read_text() + f"\n{marker}\n")
    report = prove_all(repo_copy, jobs=1, only={"chain_within_budget"})
    assert not report.ok and "syntax error" in report.failures[0]


HIGHEST_CHILD = """
def sibling_later(ps: List<Nat>, ds: List<Ty.Tok>, +cur: Nat, +want: Ty.Tok) -> Bool:
  match ps ds:
    case p <> pt d <> dt:
      Bool.or(Bool.and(Nat.is_eq(p, cur), U32.is_eq(d, want)), sibling_later(pt, dt, cur, want))
    case _ _:
      False{}
"""


def test_wrong_tree_implementation_fails_through_its_lemmas(repo_copy):
    """The kernel proof of tree_matches_spec rests on lemmas; a filtered run checks them too."""
    tree = repo_copy / "bend/tree.bend"
    text = tree.read_text()
    for nxt in ("decide", "emit"):
        old = f"    case p <> pt d <> dt +t <> tt:\n      +h = hit(stopped, p, cur, d, want)\n      {nxt}("
        new = (
            "    case p <> +pt d <> +dt +t <> tt:\n"
            "      +h = Bool.and(hit(stopped, p, cur, d, want), Bool.not(sibling_later(pt, dt, cur, want)))\n"
            f"      {nxt}("
        )
        assert text.count(old) == 1
        text = text.replace(old, new)
    tree.write_text(text + HIGHEST_CHILD)
    report = prove_all(repo_copy, jobs=1, only={"tree_matches_spec"})
    assert not report.ok
    main = next(f for f in report.failures if "law tree_matches_spec:" in f)
    assert "false: counterexample" in main and "scan_decides" in main
    assert any("law scan_decides:" in f for f in report.failures)


CIRCULAR = """
law loop_a:
  for xs: List<Ty.Tok>
  {L.concat(xs, {Nil{} : List<Ty.Tok>}) == xs : List<Ty.Tok>}

def loop_a(xs):
  loop_b(xs)

law loop_b:
  for xs: List<Ty.Tok>
  {L.concat(xs, {Nil{} : List<Ty.Tok>}) == xs : List<Ty.Tok>}

def loop_b(xs):
  loop_a(xs)
"""


def test_circular_proofs_are_refused(repo_copy):
    lemmas = repo_copy / "proofs/lists_proof.bend"
    lemmas.write_text(lemmas.read_text() + CIRCULAR)
    report = prove_all(repo_copy, jobs=1, only={"loop_a"})
    assert not report.ok
    assert any("circular proof" in f and "loop_a" in f for f in report.failures)
