"""Verdict logic: PASS / FAIL / UNRESOLVED boundaries, the paired bootstrap, and the written record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from elpis.gate.ledger import RuleAgeError, record_measurement
from elpis.gate.measurement import ArmResult, Document, Measurement
from elpis.gate.rules import load_rules
from elpis.gate.verdicts import combine, evaluate_checks, judge, latest, outcome, write

T0 = 1_800_000_000
REF, F16, F8 = "reference:dtype=fp64", "reference:dtype=fp32,rows=16", "reference:dtype=fp32,rows=8"

RULE = f"""\
id = "unit-r1"
purpose = "unit test"
reference = "{REF}"
floors = ["{F16}", "{F8}"]
scopes = ["all", "per_stratum"]

[bootstrap]
block = 8
replicates = 400
seed = 20261201
lower_quantile = 0.05

[[checks]]
metric = "mean_kl"
factor = 1.25
"""


def test_outcome_boundaries() -> None:
    assert outcome(0.0, 0.0) == "PASS"  # on the limit is inside it
    assert outcome(1e-9, 1e-9) == "PASS"
    assert outcome(0.0, -1e-15) == "UNRESOLVED"
    assert outcome(5.0, -1.0) == "UNRESOLVED"
    assert outcome(-1e-15, 3.0) == "FAIL"  # a negative point margin fails whatever the interval says
    assert combine(["PASS", "PASS"]) == "PASS"
    assert combine(["PASS", "UNRESOLVED"]) == "UNRESOLVED"
    assert combine(["UNRESOLVED", "FAIL", "PASS"]) == "FAIL"
    with pytest.raises(ValueError):
        combine([])


def _measurement(
    candidate_kl: np.ndarray, rng: np.random.Generator, measured_at: float = T0 + 100.0
) -> Measurement:
    docs = [Document(f"d{i}", "wiki" if i < 4 else "chat", 64) for i in range(8)]
    n = 8 * 64
    nll_ref = rng.uniform(1.0, 3.0, n)

    def arm(spec: str, kl: np.ndarray) -> ArmResult:
        return ArmResult(
            spec=spec,
            kl=kl,
            top1=rng.uniform(size=n) < 0.95,
            nll=nll_ref + rng.normal(0, 1e-3, n),
            first_divergence=[None],
        )

    return Measurement(
        label="unit",
        model="tiny",
        reference=REF,
        nll_ref=nll_ref,
        documents=docs,
        arms={
            "f16": arm(F16, rng.exponential(1e-3, n)),
            "f8": arm(F8, rng.exponential(1e-3, n)),
            "cand": arm("reference:dtype=bf16", candidate_kl),
        },
        greedy_tokens=8,
        measured_at=measured_at,
    )


@pytest.fixture
def rule_repo(git_repo):
    git_repo.commit("rules/unit.toml", RULE, when=T0)
    return load_rules(git_repo.root / "rules/unit.toml")


def _limit(m: Measurement) -> float:
    return 1.25 * max(m.arms["f16"].kl.mean(), m.arms["f8"].kl.mean())


def test_clear_pass_clear_fail_and_unresolved(rule_repo) -> None:
    rng = np.random.default_rng(0)
    base = _measurement(np.zeros(512), rng)
    floors = ["f16", "f8"]

    base.arms["cand"].kl = 0.5 * base.arms["f16"].kl
    assert {c.outcome for c in evaluate_checks(rule_repo, base, "cand", floors)} == {"PASS"}

    base.arms["cand"].kl = 3.0 * base.arms["f16"].kl
    assert {c.outcome for c in evaluate_checks(rule_repo, base, "cand", floors)} == {"FAIL"}

    # Heavy-tailed candidate whose mean sits 1 % under the limit: inside on the point estimate, but the
    # data cannot show it (its standard error is several percent): UNRESOLVED, which never ships.
    noisy = rng.pareto(3.0, 512)
    base.arms["cand"].kl = noisy * (0.99 * _limit(base) / noisy.mean())
    pooled = next(c for c in evaluate_checks(rule_repo, base, "cand", floors) if c.scope == "all")
    assert pooled.point_margin > 0 > pooled.lower_margin
    assert pooled.outcome == "UNRESOLVED"
    assert pooled.limit == pytest.approx(_limit(base))


def test_scopes_cover_pooled_and_each_stratum(rule_repo) -> None:
    rng = np.random.default_rng(1)
    m = _measurement(np.zeros(512), rng)
    m.arms["cand"].kl = 0.5 * m.arms["f8"].kl
    m.arms["cand"].kl[m.stratum_mask("chat")] *= 10.0  # fine overall, bad on chat alone
    results = {c.scope: c for c in evaluate_checks(rule_repo, m, "cand", ["f16", "f8"])}
    assert set(results) == {"all", "chat", "wiki"}
    assert results["wiki"].outcome == "PASS" and results["chat"].outcome == "FAIL"


def test_bootstrap_is_paired_and_seeded(rule_repo) -> None:
    rng = np.random.default_rng(2)
    m = _measurement(np.zeros(512), rng)
    m.arms["cand"].kl = m.arms["f16"].kl * 1.25  # exactly on the limit when f16 is the larger floor
    m.arms["f8"].kl = m.arms["f16"].kl * 0.5
    first = evaluate_checks(rule_repo, m, "cand", ["f16", "f8"])
    again = evaluate_checks(rule_repo, m, "cand", ["f16", "f8"])
    assert [c.lower_margin for c in first] == [c.lower_margin for c in again]
    # Paired: candidate and floor move together in every replicate, so the margin is 0 in all of them.
    pooled = next(c for c in first if c.scope == "all")
    assert pooled.point_margin == pytest.approx(0.0, abs=1e-15)
    assert pooled.lower_margin == pytest.approx(0.0, abs=1e-15)


def test_judge_writes_a_verdict_that_latest_returns(rule_repo, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    m = _measurement(np.zeros(512), rng)
    m.arms["cand"].kl = 0.5 * m.arms["f16"].kl
    path = m.save(tmp_path / "m", "unit")
    results = tmp_path / "results"
    assert latest("p3032", results) is None
    verdict = write(judge(rule_repo, path, "cand", "p3032", results_dir=results), results)
    assert verdict.verdict == "PASS" and verdict.ships
    record = json.loads(verdict.path.read_text())
    assert record["rule"]["sha256"] == rule_repo.sha256 and record["rule"]["committed_at"] == T0
    assert record["measurement"]["candidate_spec"] == "reference:dtype=bf16"
    assert {c["scope"] for c in record["checks"]} == {"all", "wiki", "chat"}
    found = latest("p3032", results)
    assert found is not None and found.path == verdict.path and found.verdict == "PASS"
    assert latest("other", results) is None


def test_rules_may_require_a_prefilled_start(git_repo, tmp_path: Path) -> None:
    """A rule with score_from judges only measurements that compared positions from there on."""
    git_repo.commit("rules/late.toml", RULE.replace('scopes = ["all", "per_stratum"]\n',
                    'scopes = ["all", "per_stratum"]\nscore_from = 4096\n'), when=T0)  # fmt: skip
    rules = load_rules(git_repo.root / "rules/late.toml")
    assert rules.spec.score_from == 4096
    rng = np.random.default_rng(6)
    m = _measurement(np.zeros(512), rng)
    m.arms["cand"].kl = 0.5 * m.arms["f16"].kl
    with pytest.raises(ValueError, match="require --score-from 4096 or more"):
        judge(rules, m.save(tmp_path / "m", "early"), "cand", "p1", results_dir=tmp_path / "r")
    m.score_from = 8192
    verdict = judge(rules, m.save(tmp_path / "m", "scored"), "cand", "p1", results_dir=tmp_path / "r")
    assert verdict.verdict == "PASS"


def test_judge_refuses_what_it_may_not_judge(rule_repo, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    early = _measurement(np.zeros(512), rng, measured_at=T0 - 1.0).save(tmp_path / "m", "early")
    with pytest.raises(RuleAgeError):
        judge(rule_repo, early, "cand", "p1", results_dir=tmp_path / "r")
    m = _measurement(np.zeros(512), rng)
    path = m.save(tmp_path / "m", "late")
    # Seen before the rules (the ledger says so): refused even though this file is later.
    record_measurement(tmp_path / "seen", {"cand": "reference:dtype=bf16"}, T0 - 5.0, "old.json")
    with pytest.raises(RuleAgeError):
        judge(rule_repo, path, "cand", "p1", results_dir=tmp_path / "seen")
    with pytest.raises(ValueError, match="floor configuration"):
        judge(rule_repo, path, "f8", "p1", results_dir=tmp_path / "r")
    with pytest.raises(ValueError, match="no arm"):
        judge(rule_repo, path, "nope", "p1", results_dir=tmp_path / "r")
    with pytest.raises(ValueError, match="patch id"):
        judge(rule_repo, path, "cand", "../x", results_dir=tmp_path / "r")


def test_tampered_arrays_are_refused(rule_repo, tmp_path: Path) -> None:
    m = _measurement(np.zeros(512), np.random.default_rng(5))
    path = m.save(tmp_path, "t")
    npz = tmp_path / "t.npz"
    npz.write_bytes(npz.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="SHA-256"):
        judge(rule_repo, path, "cand", "p1", results_dir=tmp_path / "r")


def test_measurement_round_trips(tmp_path: Path) -> None:
    m = _measurement(np.arange(512) / 1e4, np.random.default_rng(6))
    loaded = Measurement.load(m.save(tmp_path, "rt"))
    assert loaded.arms["cand"].kl.tolist() == m.arms["cand"].kl.tolist()
    assert loaded.documents == m.documents and loaded.measured_at == m.measured_at
    assert loaded.summary() == m.summary()
