"""A model-level measurement on disk: a JSON summary plus an `.npz` of per-position arrays.

The JSON names the `.npz` and records its SHA-256; loading refuses a mismatch, so a verdict is always
computed from exactly the arrays that were measured.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elpis.gate.metrics import summarize

FORMAT = "elpis-gate-model/1"


@dataclass(frozen=True)
class Document:
    id: str
    stratum: str  # "wikitext", "gsm8k", "aime": the bootstrap resamples within each
    positions: int  # teacher-forced positions compared (tokens - 1 - the measurement's score_from)


@dataclass
class ArmResult:
    spec: str
    kl: np.ndarray
    top1: np.ndarray
    nll: np.ndarray
    # per document: index of the first generated token where the arm's greedy continuation differs
    # from the reference's (None: identical over `greedy_tokens`)
    first_divergence: list[int | None] = field(default_factory=list)


@dataclass
class Measurement:
    label: str
    model: str
    reference: str
    nll_ref: np.ndarray
    documents: list[Document]
    arms: dict[str, ArmResult]
    greedy_tokens: int
    measured_at: float = field(default_factory=time.time)
    identity: dict[str, Any] = field(default_factory=dict)
    # positions before this one were prefilled, not compared (`elpis gate model --score-from`)
    score_from: int = 0

    def __post_init__(self) -> None:
        total = sum(doc.positions for doc in self.documents)
        if self.nll_ref.shape != (total,):
            raise ValueError(f"reference NLL has {self.nll_ref.shape} entries for {total} positions")
        for name, arm in self.arms.items():
            for array in (arm.kl, arm.top1, arm.nll):
                if array.shape != (total,):
                    raise ValueError(f"arm {name}: an array has {array.shape} entries for {total} positions")

    def stratum_mask(self, stratum: str) -> np.ndarray:
        return np.concatenate(
            [np.full(doc.positions, doc.stratum == stratum, dtype=bool) for doc in self.documents]
        )

    def strata(self) -> list[str]:
        return sorted({doc.stratum for doc in self.documents})

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, arm in self.arms.items():
            scopes = {"all": np.ones(arm.kl.shape, dtype=bool)}
            scopes.update({s: self.stratum_mask(s) for s in self.strata()})
            out[name] = {
                scope: summarize(arm.kl[mask], arm.top1[mask], self.nll_ref[mask], arm.nll[mask])
                for scope, mask in scopes.items()
            }
            diverged = [d for d in arm.first_divergence if d is not None]
            out[name]["greedy"] = {
                "prompts": len(arm.first_divergence),
                "identical": len(arm.first_divergence) - len(diverged),
                "first_divergence": arm.first_divergence,
            }
        return out

    def save(self, directory: Path, stem: str) -> Path:
        """Write `<stem>.json` and `<stem>.npz` into `directory`; return the JSON path."""
        directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {"nll_ref": self.nll_ref}
        for name, arm in self.arms.items():
            arrays[f"{name}.kl"], arrays[f"{name}.top1"], arrays[f"{name}.nll"] = arm.kl, arm.top1, arm.nll
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        blob = buffer.getvalue()
        npz_path = directory / f"{stem}.npz"
        npz_path.write_bytes(blob)
        record = {
            "format": FORMAT,
            "label": self.label,
            "model": self.model,
            "measured_at": self.measured_at,
            "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.measured_at)),
            "reference": self.reference,
            "arms": {name: arm.spec for name, arm in self.arms.items()},
            "greedy_tokens": self.greedy_tokens,
            "score_from": self.score_from,
            "documents": [doc.__dict__ for doc in self.documents],
            "first_divergence": {name: arm.first_divergence for name, arm in self.arms.items()},
            "summary": self.summary(),
            "arrays": {"file": npz_path.name, "sha256": hashlib.sha256(blob).hexdigest()},
            "identity": self.identity,
        }
        json_path = directory / f"{stem}.json"
        json_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        return json_path

    @classmethod
    def load(cls, path: Path) -> Measurement:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read measurement {path}: {exc}") from exc
        if record.get("format") != FORMAT:
            raise ValueError(
                f"{path} is not an elpis gate model measurement (format {record.get('format')!r})"
            )
        npz_path = path.parent / record["arrays"]["file"]
        blob = npz_path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != record["arrays"]["sha256"]:
            raise ValueError(f"{npz_path} does not match the SHA-256 recorded in {path}: refusing to judge")
        with np.load(io.BytesIO(blob)) as data:
            arrays = {key: data[key] for key in data.files}
        arms = {
            name: ArmResult(
                spec=spec,
                kl=arrays[f"{name}.kl"],
                top1=arrays[f"{name}.top1"],
                nll=arrays[f"{name}.nll"],
                first_divergence=list(record["first_divergence"][name]),
            )
            for name, spec in record["arms"].items()
        }
        return cls(
            label=record["label"],
            model=record["model"],
            reference=record["reference"],
            nll_ref=arrays["nll_ref"],
            documents=[Document(**doc) for doc in record["documents"]],
            arms=arms,
            greedy_tokens=int(record["greedy_tokens"]),
            measured_at=float(record["measured_at"]),
            identity=record.get("identity", {}),
            score_from=int(record.get("score_from", 0)),  # measurements before the option compared all
        )
