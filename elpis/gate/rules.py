"""Pre-registered rule files: what a candidate must satisfy, written down before it is measured.

A rule file is TOML (kept under `elpis/gate/rules/`):

    id = "smollm2-exl3-r1"
    purpose = "why these limits"
    reference = "reference:dtype=fp64"           # every arm is compared against this configuration
    floors = ["reference:dtype=fp32,rows=16",    # exact-numerics variants of the served path:
              "reference:dtype=fp32,rows=8"]     #   the noise a change must stay within
    scopes = ["all", "per_stratum"]              # judge the pooled positions, and each stratum alone
    op_bar = false                               # also require "never less precise than stock" per op

    [bootstrap]
    block = 32            # positions per block
    replicates = 2000
    seed = 20261201
    lower_quantile = 0.05 # PASS needs this quantile of the bootstrap margin >= 0

    [[checks]]
    metric = "mean_kl"    # mean_kl | p99_kl | abs_dnll (upper limits) | top1 (lower limit)
    factor = 1.25
    slack = 0.0

Limits are multiples of the floor: for an upper-limited metric the limit is
`max(factor * worst_floor + slack, absolute_min)` where worst_floor is the largest floor value; for top-1
agreement the limit is `factor * worst_floor - slack` with the smallest floor value. The margin is
"limit - value" (upper) or "value - limit" (lower), so a margin >= 0 is inside the limit.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from elpis.gate.configs import canonical
from elpis.paths import PACKAGE_DIR

RULES_DIR = PACKAGE_DIR / "gate" / "rules"

UPPER_METRICS = ("mean_kl", "p99_kl", "abs_dnll")
LOWER_METRICS = ("top1",)


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Literal["mean_kl", "p99_kl", "abs_dnll", "top1"]
    factor: float = Field(gt=0)
    slack: float = Field(default=0.0, ge=0)
    absolute_min: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _absolute_min_only_for_upper(self) -> Check:
        if self.metric in LOWER_METRICS and self.absolute_min:
            raise ValueError("absolute_min applies only to upper-limited metrics")
        return self

    def limit(self, floor_values: list[float]) -> float:
        if self.metric in LOWER_METRICS:
            return self.factor * min(floor_values) - self.slack
        return max(self.factor * max(floor_values) + self.slack, self.absolute_min)

    def margin(self, value: float, limit: float) -> float:
        return value - limit if self.metric in LOWER_METRICS else limit - value


class BootstrapRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    block: int = Field(ge=1)
    replicates: int = Field(ge=100)
    seed: int
    lower_quantile: float = Field(gt=0.0, lt=0.5)


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    purpose: str = Field(min_length=1)
    reference: str = Field(min_length=1)
    floors: list[str] = Field(min_length=1)
    scopes: list[Literal["all", "per_stratum"]] = Field(default_factory=lambda: ["all"], min_length=1)
    op_bar: bool = False
    # the least `--score-from` a measurement may have: a prefill-only change is invisible before it
    score_from: int = Field(default=0, ge=0)
    bootstrap: BootstrapRule
    checks: list[Check] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_arms(self) -> RuleSpec:
        for spec in (self.reference, *self.floors):
            if canonical(spec) != spec:
                raise ValueError(f"write configuration {spec!r} in its canonical form {canonical(spec)!r}")
        if len(set(self.floors)) != len(self.floors):
            raise ValueError("floors must be distinct configurations")
        if self.reference in self.floors:
            raise ValueError("the reference cannot also be a floor")
        return self


@dataclass(frozen=True)
class Rules:
    spec: RuleSpec
    path: Path
    sha256: str  # of the file's bytes: the identity a verdict records


class RuleError(ValueError):
    """A rule file that cannot be used (unreadable, invalid, or not allowed to judge)."""


def load_rules(path: Path) -> Rules:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RuleError(f"cannot read rule file {path}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"rule file {path} is not valid TOML: {exc}") from exc
    try:
        spec = RuleSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(file)'}: {err['msg']}" for err in exc.errors()
        )
        raise RuleError(f"rule file {path} is invalid: {problems}") from exc
    return Rules(spec=spec, path=path, sha256=hashlib.sha256(raw).hexdigest())
