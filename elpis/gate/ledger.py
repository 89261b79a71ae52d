"""When rules were written and when a candidate was first measured: the order that makes rules honest.

Definitions (what `elpis gate verdict` enforces):
  - The *rule time* of a rule file is the committer time of the oldest commit, among the commits
    reachable from HEAD that touch the file, whose version of the file is byte-identical to the file as
    it is now. The file must be tracked by git and have no uncommitted change (staged or not);
    otherwise there is no rule time and nothing can be judged.
  - The *first measurement* of a candidate is the earliest `measured_at` (Unix seconds, UTC) of any
    measurement of the candidate's configuration spec recorded in the ledger
    (`<results>/ledger.jsonl`, one JSON object per line, appended by `elpis gate model`), or of the
    measurement being judged if that is earlier.
  - A candidate may be judged only if the whole second of the rule time lies before the first
    measurement: rule time + 1 <= first measurement. Git keeps whole seconds, so a rule committed in
    the same second as the first measurement is refused (it may have been written after the data).
Editing a rule file after seeing data makes its content new, so its rule time becomes the commit of the
edit, which is later than the measurement: the harness refuses.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

LEDGER_NAME = "ledger.jsonl"


class RuleAgeError(RuntimeError):
    """The rule file may not judge this candidate (not committed, modified, or younger than the data)."""


@dataclass(frozen=True)
class RuleTime:
    commit: str
    committed_at: int  # Unix seconds, committer time


def _git(cwd: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise RuleAgeError("git is not installed: rule times come from git history") from exc
    if done.returncode != 0:
        raise RuleAgeError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def rule_time(path: Path) -> RuleTime:
    """The rule time of `path` as defined in the module docstring."""
    path = path.resolve()
    if not path.is_file():
        raise RuleAgeError(f"rule file {path} does not exist")
    root = Path(_git(path.parent, "rev-parse", "--show-toplevel").strip())
    rel = path.relative_to(root).as_posix()
    if not _git(root, "ls-files", "--", rel).strip():
        raise RuleAgeError(f"rule file {rel} is not committed: commit it before measuring any candidate")
    if _git(root, "status", "--porcelain", "--", rel).strip():
        raise RuleAgeError(f"rule file {rel} has uncommitted changes: only committed rules can judge")
    blob = _git(root, "hash-object", "--", rel).strip()
    history = _git(root, "log", "--full-history", "--reverse", "--format=%H %ct", "HEAD", "--", rel)
    for line in history.splitlines():
        commit, stamp = line.split()
        try:
            version = _git(root, "rev-parse", f"{commit}:{rel}").strip()
        except RuleAgeError:
            continue  # the commit deleted the file
        if version == blob:
            return RuleTime(commit=commit, committed_at=int(stamp))
    raise RuleAgeError(f"no commit reachable from HEAD holds the current content of {rel}")


def record_measurement(results_dir: Path, specs: dict[str, str], measured_at: float, file: str) -> None:
    """Append one line per measured arm to the ledger (never rewritten, only appended)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    with (results_dir / LEDGER_NAME).open("a", encoding="utf-8") as ledger:
        for arm, spec in sorted(specs.items()):
            ledger.write(
                json.dumps({"spec": spec, "arm": arm, "measured_at": measured_at, "file": file}) + "\n"
            )


def first_measured(results_dir: Path, spec: str) -> float | None:
    """Earliest recorded `measured_at` of a configuration spec, or None if the ledger has none."""
    ledger = results_dir / LEDGER_NAME
    if not ledger.exists():
        return None
    earliest: float | None = None
    for number, line in enumerate(ledger.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            entry_spec, stamp = entry["spec"], float(entry["measured_at"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RuleAgeError(f"{ledger}:{number} is not a ledger entry: {exc}") from exc
        if entry_spec == spec and (earliest is None or stamp < earliest):
            earliest = stamp
    return earliest


def check_rule_age(
    rule_path: Path, results_dir: Path, spec: str, measured_at: float
) -> tuple[RuleTime, float]:
    """Refuse unless the rule file was committed before the candidate's first measurement.

    Returns the rule time and the first-measurement time that were compared.
    """
    stamp = rule_time(rule_path)
    recorded = first_measured(results_dir, spec)
    first = measured_at if recorded is None else min(recorded, measured_at)
    if not stamp.committed_at + 1 <= first:
        raise RuleAgeError(
            f"rule file {rule_path.name} (committed {stamp.committed_at}, {stamp.commit[:12]}) is not older "
            f"than the first measurement of {spec!r} ({first:.3f}): rules committed after a candidate was "
            "first measured can never judge it"
        )
    return stamp, first
