"""Rendering an `elpis bench profile` result: one JSON (everything) and one Markdown table per window kind.

Rows: (window kind, context, system). Columns: the window length per round or per token (first kernel
start to last kernel end), GPU busy time (union of kernel intervals), idle gaps, and each phase's kernel
time. A second table splits every phase into kernel families (names matched in `elpis.bench.phases`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from elpis.bench.workload import label

PHASE_ORDER = ("draft", "embed", "norm", "attention", "gdn", "mlp", "head", "other")
UNITS = {"round": "ms per round", "token": "µs per token"}


def _windows(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for system, data in doc.get("systems", {}).items():
        for window in data.get("profiles", []):
            out.append((system, window))
    out.sort(key=lambda sw: (sw[1]["kind"], sw[1]["context"], sw[0]))
    return out


def _value(window: dict[str, Any], ms: float) -> str:
    return f"{ms * 1000:.1f}" if window["unit"] == "token" else f"{ms:.3f}"


def markdown(doc: dict[str, Any]) -> str:
    facts = doc.get("facts", {})
    lines = [
        f"# {doc.get('title', 'Per-phase GPU time')}",
        "",
        f"GPU {facts.get('gpu')} (driver {facts.get('driver')}), torch {facts.get('torch')}, "
        f"CUDA {facts.get('cuda')}, exllamav3 {facts.get('exllamav3')}, git {facts.get('git_revision')}.",
        f"Model: {doc.get('model_note')}.",
        "Kernel times from the CUDA profiler (CUPTI) inside labelled ranges; window = first kernel start to"
        " last kernel end; idle = window minus the union of kernel intervals (launch gaps, host work, syncs;"
        " the profiler's own host overhead inflates it). Prefill rows are per token over the prefill calls"
        " from the one reaching the window's first position to the first decode round (`over`: the tokens"
        " they held; a prefill in layer-major groups counts from its group's start); round rows per round"
        " (spec: 8-row verify + draft; plain: 1 row).",
        "",
    ]
    windows = _windows(doc)
    phases = [p for p in PHASE_ORDER if any(p in w["phases"] for _, w in windows)]
    phases += sorted({p for _, w in windows for p in w["phases"]} - set(phases))
    head = ["window", "context", "system", "unit", "over", "span", "busy", "idle", *phases]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, w in windows:
        cells = [
            w["kind"],
            label(w["context"]),
            system,
            UNITS[w["unit"]],
            f"{w.get('count', '-')}",
            _value(w, w["span_ms"]),
            _value(w, w["busy_ms"]),
            _value(w, w["idle_ms"]),
            *(_value(w, w["phases"][p]["ms"]) if p in w["phases"] else "-" for p in phases),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Kernel families inside each phase (same units):", ""]
    for system, w in windows:
        parts = []
        for p in phases:
            if p in w["phases"]:
                fams = ", ".join(f"{f} {_value(w, ms)}" for f, ms in w["phases"][p]["families"].items())
                parts.append(f"{p}: {fams}")
        lines.append(f"- {w['kind']} {label(w['context'])} {system}: " + "; ".join(parts))
    lines += ["", "Most expensive kernels by name inside each phase (time, launches per unit):", ""]
    for system, w in windows:
        parts = []
        for p in phases:
            top = w["phases"].get(p, {}).get("top_kernels", {})
            if top:
                named = ", ".join(f"{n} {_value(w, ms)} x{count:g}" for n, (ms, count) in top.items())
                parts.append(f"{p}: {named}")
        if parts:
            lines.append(f"- {w['kind']} {label(w['context'])} {system}: " + "; ".join(parts))
    errors = [(s, e) for s, d in doc.get("systems", {}).items() for e in d.get("errors", [])]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {s}: {e.splitlines()[0]}" for s, e in errors]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    js.write_text(json.dumps(doc, indent=2, default=str))
    md.write_text(markdown(doc))
    return [js, md]
