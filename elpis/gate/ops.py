"""Per-op error against fp64: the registry of patchable ops and the harness behind `elpis gate op`.

An op is the math of one patchable piece of the serving path (attention over the cache, a GDN step, a
GEMM, a norm). For each *cell* (context length x rows) the op yields operand sets drawn from real
activations (one per layer, say); the harness runs the stock implementation and every candidate on the
same operands, evaluates the same math in float64 on the same (dequantised) operands, and records the
relative error of each implementation (`elpis.gate.metrics.relative_errors`): mean, p99 and max per
cell. The bar a candidate must clear is "never less precise than stock": in every cell, its mean, p99
and max are each <= stock's, with no epsilon.

A backend contributes ops through its provider module's `gate_ops(model, options) -> list[GateOp]`
(`elpis.gate.providers`). Implementations must not modify their inputs; each returns a tensor shaped
like the fp64 output (on any device: errors are computed in float64 on the fp64 output's device).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from elpis.gate.metrics import ErrorStats, error_stats, relative_errors
from elpis.gate.providers import load_provider


@dataclass(frozen=True)
class OpInputs:
    """One operand set of a cell, exactly as the stock implementation receives it."""

    tensors: Mapping[str, torch.Tensor]
    params: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""  # where the operands came from, e.g. "layer 3"


Impl = Callable[[OpInputs], torch.Tensor]


@dataclass(frozen=True)
class GateOp:
    name: str  # e.g. "attention.verify", "gdn.prefill", "gemm", "rmsnorm"
    description: str
    stock: Impl
    exact: Impl  # the same math in float64 on the same dequantised operands
    inputs: Callable[[int, int], Iterable[OpInputs]]  # (context, rows) -> operand sets of that cell
    contexts: tuple[int, ...]  # default grid; 0 where context does not apply (GEMM, norms)
    rows: tuple[int, ...]
    candidates: Mapping[str, Impl] = field(default_factory=dict)


@dataclass(frozen=True)
class CellResult:
    op: str
    context: int
    rows: int
    samples: int
    stats: dict[str, ErrorStats]  # "stock" and each candidate


def load_ops(backend: str, model: Path | None, options: Mapping[str, str]) -> list[GateOp]:
    """The ops a backend's provider module contributes (fails with the reason if it cannot be loaded)."""
    ops = load_provider(backend).gate_ops(model, dict(options))
    names = [op.name for op in ops]
    if len(set(names)) != len(names):
        raise ValueError(f"the {backend} provider registers an op name twice: {names}")
    return ops


def measure_cell(op: GateOp, context: int, rows: int, candidates: Sequence[str]) -> CellResult:
    errors: dict[str, list[torch.Tensor]] = {name: [] for name in ("stock", *candidates)}
    samples = 0
    for operands in op.inputs(context, rows):
        exact = op.exact(operands)
        if exact.dtype != torch.float64:
            raise TypeError(f"{op.name}: the exact evaluation returned {exact.dtype}, not float64")
        impls = {"stock": op.stock, **{name: op.candidates[name] for name in candidates}}
        for name, impl in impls.items():
            errors[name].append(relative_errors(impl(operands), exact).cpu())
        samples += 1
    if samples == 0:
        raise ValueError(f"{op.name}: no operands for context {context}, rows {rows}")
    return CellResult(op.name, context, rows, samples, {name: error_stats(e) for name, e in errors.items()})


def measure(
    ops: Sequence[GateOp],
    *,
    contexts: Sequence[int] | None = None,
    rows: Sequence[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[CellResult]:
    """Every cell of every op (its own grid unless `contexts` / `rows` override it)."""
    results = []
    for op in ops:
        for context in contexts or op.contexts:
            for count in rows or op.rows:
                if progress:
                    progress(f"{op.name} context {context} rows {count}")
                results.append(measure_cell(op, context, count, sorted(op.candidates)))
    return results


def precision_bar(results: Sequence[CellResult]) -> dict[str, dict[str, Any]]:
    """For each candidate: passes iff no worse than stock in every cell of every op it is part of."""
    bars: dict[str, dict[str, Any]] = {}
    for cell in results:
        stock = cell.stats["stock"]
        for name, stats in cell.stats.items():
            if name == "stock":
                continue
            bar = bars.setdefault(name, {"pass": True, "cells": 0, "worse": []})
            bar["cells"] += 1
            if not stats.no_worse_than(stock):
                bar["pass"] = False
                bar["worse"].append(
                    {
                        "op": cell.op,
                        "context": cell.context,
                        "rows": cell.rows,
                        "candidate": stats.to_json(),
                        "stock": stock.to_json(),
                    }
                )
    return bars


def save(results: Sequence[CellResult], path: Path, header: Mapping[str, Any]) -> dict[str, Any]:
    record = {
        "format": "elpis-gate-op/1",
        **header,
        "error": "|y - y64| / rms(y64 row); p99 nearest-rank",
        "measured_at": time.time(),
        "cells": [
            {
                "op": c.op,
                "context": c.context,
                "rows": c.rows,
                "samples": c.samples,
                "impls": {name: s.to_json() for name, s in c.stats.items()},
            }
            for c in results
        ],
        "bar": precision_bar(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record
