"""Verdicts: a candidate judged by a pre-registered rule file, with a paired block bootstrap.

Per check and scope: the point margin is computed on all positions; the bootstrap recomputes the floors'
and the candidate's statistics on the same resampled positions (paired) and takes the margin's
`lower_quantile` (e.g. the 5th percentile, the lower end of a 90 % interval).
  - FAIL        if the point margin < 0;
  - PASS        if the point margin >= 0 and the lower quantile >= 0;
  - UNRESOLVED  otherwise (the data cannot tell; UNRESOLVED never ships).
The verdict of the candidate is FAIL if any check fails, else UNRESOLVED if any is unresolved, else PASS.
If the rule asks for the op bar, a candidate that is less precise than stock in any op cell FAILS.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from elpis.gate.bootstrap import bootstrap, plan_blocks
from elpis.gate.identity import identity
from elpis.gate.ledger import RuleTime, check_rule_age
from elpis.gate.measurement import Measurement
from elpis.gate.metrics import nearest_rank, summarize
from elpis.gate.rules import Rules
from elpis.paths import BENCH_RESULTS

GATE_RESULTS = BENCH_RESULTS / "gate"
Outcome = Literal["PASS", "FAIL", "UNRESOLVED"]


def outcome(point_margin: float, lower_margin: float) -> Outcome:
    if point_margin < 0:
        return "FAIL"
    return "PASS" if lower_margin >= 0 else "UNRESOLVED"


def combine(outcomes: list[Outcome]) -> Outcome:
    if not outcomes:
        raise ValueError("no checks were evaluated")
    if "FAIL" in outcomes:
        return "FAIL"
    return "UNRESOLVED" if "UNRESOLVED" in outcomes else "PASS"


@dataclass(frozen=True)
class CheckResult:
    scope: str
    metric: str
    value: float  # the candidate's statistic on all positions of the scope
    floors: list[float]
    limit: float
    point_margin: float
    lower_margin: float
    outcome: Outcome


def _arm_by_spec(measurement: Measurement, spec: str, role: str) -> str:
    names = [name for name, arm in measurement.arms.items() if arm.spec == spec]
    if len(names) != 1:
        raise ValueError(
            f"the measurement has {len(names)} arms with the {role} configuration {spec!r}; need exactly 1"
        )
    return names[0]


def evaluate_checks(
    rules: Rules, measurement: Measurement, candidate: str, floor_arms: list[str]
) -> list[CheckResult]:
    """Every check of the rules in every scope, with its bootstrap (no rule-age test: see `judge`)."""
    spec = rules.spec
    arms = [*floor_arms, candidate]
    scopes: list[tuple[str, np.ndarray]] = []
    if "all" in spec.scopes:
        scopes.append(("all", np.ones(measurement.nll_ref.shape, dtype=bool)))
    if "per_stratum" in spec.scopes:
        scopes.extend((s, measurement.stratum_mask(s)) for s in measurement.strata())
    results: list[CheckResult] = []
    for scope, mask in scopes:
        docs = [d for d in measurement.documents if scope == "all" or d.stratum == scope]
        data = {
            name: (
                measurement.arms[name].kl[mask],
                measurement.arms[name].top1[mask],
                measurement.arms[name].nll[mask],
            )
            for name in arms
        }
        nll_ref = measurement.nll_ref[mask]

        def margins(idx: np.ndarray | None, data=data, nll_ref=nll_ref) -> np.ndarray:
            stats = {}
            for name, (kl, top1, nll) in data.items():
                if idx is None:
                    stats[name] = summarize(kl, top1, nll_ref, nll)
                else:
                    stats[name] = summarize(kl[idx], top1[idx], nll_ref[idx], nll[idx])
            out = []
            for check in spec.checks:
                floor_values = [stats[f][check.metric] for f in floor_arms]
                out.append(check.margin(stats[candidate][check.metric], check.limit(floor_values)))
            return np.asarray(out)

        plan = plan_blocks([d.positions for d in docs], [d.stratum for d in docs], spec.bootstrap.block)
        point = margins(None)
        samples = bootstrap(margins, plan, spec.bootstrap.replicates, spec.bootstrap.seed)
        full = {name: summarize(kl, top1, nll_ref, nll) for name, (kl, top1, nll) in data.items()}
        for j, check in enumerate(spec.checks):
            lower = nearest_rank(samples[:, j], spec.bootstrap.lower_quantile)
            floors = [full[f][check.metric] for f in floor_arms]
            results.append(
                CheckResult(
                    scope=scope,
                    metric=check.metric,
                    value=full[candidate][check.metric],
                    floors=floors,
                    limit=check.limit(floors),
                    point_margin=float(point[j]),
                    lower_margin=lower,
                    outcome=outcome(float(point[j]), lower),
                )
            )
    return results


@dataclass(frozen=True)
class Verdict:
    patch_id: str
    verdict: Outcome
    rule_id: str
    rule_sha256: str
    path: Path | None  # the verdict's JSON file once written
    created_at: float
    record: dict[str, Any]

    @property
    def ships(self) -> bool:
        return self.verdict == "PASS"


def _op_bar(ops_path: Path, op_candidate: str) -> dict[str, Any]:
    record = json.loads(ops_path.read_text(encoding="utf-8"))
    bars = record.get("bar", {})
    if op_candidate not in bars:
        raise ValueError(f"{ops_path} has no op results for candidate {op_candidate!r} (has {sorted(bars)})")
    return {"file": str(ops_path), "candidate": op_candidate, **bars[op_candidate]}


def judge(
    rules: Rules,
    measurement_path: Path,
    candidate: str,
    patch_id: str,
    *,
    results_dir: Path = GATE_RESULTS,
    ops_path: Path | None = None,
    op_candidate: str | None = None,
) -> Verdict:
    """Judge arm `candidate` of a measurement for `patch_id`. Raises `RuleAgeError` when not allowed."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", patch_id):
        raise ValueError(f"patch id {patch_id!r} must be letters, digits, '.', '_' or '-'")
    measurement = Measurement.load(measurement_path)
    spec = rules.spec
    if measurement.reference != spec.reference:
        raise ValueError(
            f"the measurement's reference is {measurement.reference!r}; the rules require {spec.reference!r}"
        )
    if measurement.score_from < spec.score_from:
        raise ValueError(
            f"the measurement compares positions from {measurement.score_from}; the rules require "
            f"--score-from {spec.score_from} or more"
        )
    if candidate not in measurement.arms:
        raise ValueError(f"the measurement has no arm {candidate!r} (arms: {sorted(measurement.arms)})")
    candidate_spec = measurement.arms[candidate].spec
    if candidate_spec in spec.floors:
        raise ValueError(f"arm {candidate!r} is a floor configuration of the rules, not a candidate")
    floor_arms = [_arm_by_spec(measurement, floor, "floor") for floor in spec.floors]
    stamp, first = check_rule_age(rules.path, results_dir, candidate_spec, measurement.measured_at)
    checks = evaluate_checks(rules, measurement, candidate, floor_arms)
    outcomes = [c.outcome for c in checks]
    op_bar = None
    if spec.op_bar:
        if ops_path is None or op_candidate is None:
            raise ValueError(
                "the rules require the op bar: pass the op results file and the op candidate name"
            )
        op_bar = _op_bar(ops_path, op_candidate)
        outcomes.append("PASS" if op_bar["pass"] else "FAIL")
    created = time.time()
    record = {
        "format": "elpis-gate-verdict/1",
        "patch_id": patch_id,
        "verdict": combine(outcomes),
        "created_at": created,
        "rule": {
            "id": spec.id,
            "path": _display(rules.path),
            "sha256": rules.sha256,
            "commit": stamp.commit,
            "committed_at": stamp.committed_at,
        },
        "measurement": {
            "path": _display(measurement_path),
            "sha256": hashlib.sha256(measurement_path.read_bytes()).hexdigest(),
            "label": measurement.label,
            "candidate_arm": candidate,
            "candidate_spec": candidate_spec,
            "first_measured_at": first,
        },
        "checks": [c.__dict__ for c in checks],
        "op_bar": op_bar,
        "identity": identity(),
    }
    return Verdict(patch_id, record["verdict"], spec.id, rules.sha256, None, created, record)


def _display(path: Path) -> str:
    from elpis.paths import REPO_ROOT

    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def write(verdict: Verdict, results_dir: Path = GATE_RESULTS) -> Verdict:
    """Write the verdict JSON under `<results>/verdicts/` and return it with its path."""
    directory = results_dir / "verdicts"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(verdict.created_at))
    path = directory / f"{verdict.patch_id}-{stamp}-{verdict.rule_sha256[:8]}.json"
    path.write_text(json.dumps(verdict.record, indent=1) + "\n", encoding="utf-8")
    return Verdict(
        verdict.patch_id,
        verdict.verdict,
        verdict.rule_id,
        verdict.rule_sha256,
        path,
        verdict.created_at,
        verdict.record,
    )


def latest(patch_id: str, results_dir: Path = GATE_RESULTS) -> Verdict | None:
    """The newest verdict written for `patch_id`, or None if it was never judged."""
    directory = results_dir / "verdicts"
    if not directory.is_dir():
        return None
    found: Verdict | None = None
    for path in sorted(directory.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != "elpis-gate-verdict/1" or record.get("patch_id") != patch_id:
            continue
        verdict = Verdict(
            patch_id,
            record["verdict"],
            record["rule"]["id"],
            record["rule"]["sha256"],
            path,
            float(record["created_at"]),
            record,
        )
        if found is None or verdict.created_at > found.created_at:
            found = verdict
    return found


__all__ = ["CheckResult", "RuleTime", "Verdict", "combine", "judge", "latest", "outcome", "write"]
