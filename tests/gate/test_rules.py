"""Rule files: validation, and the rule-age refusal defined in `elpis.gate.ledger`."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.gate.ledger import RuleAgeError, check_rule_age, first_measured, record_measurement, rule_time
from elpis.gate.rules import RULES_DIR, RuleError, load_rules

RULE = """\
id = "test-r1"
purpose = "unit test"
reference = "reference:dtype=fp64"
floors = ["reference:dtype=fp32,rows=16", "reference:dtype=fp32,rows=8"]
scopes = ["all"]

[bootstrap]
block = 4
replicates = 200
seed = 5
lower_quantile = 0.05

[[checks]]
metric = "mean_kl"
factor = 1.25
"""

T0 = 1_800_000_000  # a commit time the tests choose


def test_rule_file_loads_and_limits_are_multiples_of_the_floor(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(RULE + '\n[[checks]]\nmetric = "top1"\nfactor = 1.0\nslack = 0.005\n')
    rules = load_rules(path)
    kl, top1 = rules.spec.checks
    assert kl.limit([0.010, 0.020]) == pytest.approx(0.025)  # 1.25 x the larger floor
    assert kl.margin(0.02, 0.025) == pytest.approx(0.005)
    assert top1.limit([0.95, 0.94]) == pytest.approx(0.935)  # the smaller floor - slack
    assert top1.margin(0.93, 0.935) == pytest.approx(-0.005)
    assert len(rules.sha256) == 64


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace('metric = "mean_kl"', 'metric = "median_kl"'), "checks.0.metric"),
        (lambda s: s.replace("replicates = 200", "replicates = 10"), "bootstrap.replicates"),
        (lambda s: s + "surprise = 1\n", "surprise"),
        (lambda s: s.replace('"reference:dtype=fp32,rows=8"', '"reference:dtype=fp64"'), "reference cannot"),
        (lambda s: s.replace("factor = 1.25", "factor = 1.25\nabsolute_min = -1"), "absolute_min"),
        (lambda s: s.replace("id = ", "id = = "), "not valid TOML"),
    ],
)
def test_invalid_rule_files_are_refused_with_the_reason(tmp_path: Path, edit, message: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(edit(RULE))
    with pytest.raises(RuleError, match=message):
        load_rules(path)


def test_committed_rule_files_in_the_repository_are_valid() -> None:
    files = sorted(RULES_DIR.glob("*.toml"))
    assert files, "the repository ships at least one pre-registered rule file"
    for path in files:
        assert load_rules(path).spec.id


def test_rule_time_is_the_commit_of_the_current_content(git_repo) -> None:
    commit = git_repo.commit("rules/r.toml", RULE, when=T0)
    stamp = rule_time(git_repo.root / "rules/r.toml")
    assert (stamp.commit, stamp.committed_at) == (commit, T0)
    # An unrelated later commit does not move the rule time.
    git_repo.commit("other.txt", "x", when=T0 + 50)
    assert rule_time(git_repo.root / "rules/r.toml").committed_at == T0


def test_rule_older_than_first_measurement_may_judge(git_repo, tmp_path: Path) -> None:
    git_repo.commit("r.toml", RULE, when=T0)
    stamp, first = check_rule_age(git_repo.root / "r.toml", tmp_path / "results", "exl3:cand", T0 + 1.0)
    assert stamp.committed_at == T0 and first == T0 + 1.0  # the commit's whole second is before


@pytest.mark.parametrize("measured_at", [T0 - 10.0, float(T0), T0 + 0.999])
def test_rule_not_older_than_the_measurement_is_refused(git_repo, tmp_path: Path, measured_at: float) -> None:
    # Same second counts as not older: git keeps whole seconds (T0 + 0.999 is in the commit's second).
    git_repo.commit("r.toml", RULE, when=T0)
    with pytest.raises(RuleAgeError, match="not older than the first measurement"):
        check_rule_age(git_repo.root / "r.toml", tmp_path, "exl3:cand", measured_at)


def test_uncommitted_or_modified_rules_cannot_judge(git_repo, tmp_path: Path) -> None:
    (git_repo.root / "r.toml").write_text(RULE)
    with pytest.raises(RuleAgeError, match="not committed"):
        check_rule_age(git_repo.root / "r.toml", tmp_path, "s", T0 + 100)
    git_repo.commit("r.toml", RULE, when=T0)
    (git_repo.root / "r.toml").write_text(RULE.replace("1.25", "2.5"))
    with pytest.raises(RuleAgeError, match="uncommitted changes"):
        check_rule_age(git_repo.root / "r.toml", tmp_path, "s", T0 + 100)
    git_repo.git("add", "r.toml")  # staged but not committed is still uncommitted
    with pytest.raises(RuleAgeError, match="uncommitted changes"):
        check_rule_age(git_repo.root / "r.toml", tmp_path, "s", T0 + 100)


def test_loosening_a_rule_after_seeing_data_is_refused(git_repo, tmp_path: Path) -> None:
    git_repo.commit("r.toml", RULE, when=T0)
    measured = T0 + 100.0
    git_repo.commit("r.toml", RULE.replace("1.25", "3.0"), when=T0 + 200)  # edited after the data
    with pytest.raises(RuleAgeError):
        check_rule_age(git_repo.root / "r.toml", tmp_path, "s", measured)
    # Restoring the original bytes restores the original rule time: that content was committed first.
    git_repo.commit("r.toml", RULE, when=T0 + 300)
    assert check_rule_age(git_repo.root / "r.toml", tmp_path, "s", measured)[0].committed_at == T0


def test_first_measurement_comes_from_the_ledger(git_repo, tmp_path: Path) -> None:
    results = tmp_path / "results"
    record_measurement(results, {"cand": "exl3:cand", "ref": "reference:dtype=fp64"}, T0 - 50.0, "m1.json")
    record_measurement(results, {"cand": "exl3:cand"}, T0 + 500.0, "m2.json")
    assert first_measured(results, "exl3:cand") == T0 - 50.0
    assert first_measured(results, "exl3:other") is None
    git_repo.commit("r.toml", RULE, when=T0)
    # A fresh measurement after the rule does not reset the clock: the candidate was seen before.
    with pytest.raises(RuleAgeError, match=str(T0 - 50)):
        check_rule_age(git_repo.root / "r.toml", results, "exl3:cand", T0 + 500.0)
    # Another candidate, first measured after the rule, may be judged.
    assert check_rule_age(git_repo.root / "r.toml", results, "exl3:other", T0 + 500.0)[1] == T0 + 500.0


def test_corrupt_ledger_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ledger.jsonl").write_text('{"spec": "a"}\n')
    with pytest.raises(RuleAgeError, match=r"ledger\.jsonl:1"):
        first_measured(tmp_path, "a")
