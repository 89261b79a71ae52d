"""Turn the workers' results into one JSON document, a Markdown table and a PNG plot.

Derived figures (all from numbers measured in the same run):
- TTFT(c): prompts extend each other, so checkpoint c's first token came after prefilling only the tokens
  past what the prefix cache served. TTFT(c) = that job's time to first token + TTFT(cached), where
  `cached` must be an earlier checkpoint (or 0); otherwise the figure is marked as not cumulative.
- fraction of limit: minimum bytes a round must read / measured copy bandwidth, divided by the measured
  round time; prefill FLOPs / measured bf16 matmul rate, divided by the measured TTFT.
- ratio: stock time / elpis time (above 1: elpis is faster).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from elpis.bench.workload import ModelArithmetic, label


def cumulative_ttft(checkpoints: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for entry in checkpoints:
        spec = entry.get("spec") or {}
        c, t, cached = entry["context"], spec.get("ttft_seconds"), spec.get("cached") or 0
        if t is None:
            continue
        if cached == 0:
            out[c] = {"seconds": t, "cumulative": True}
        elif cached in out:
            out[c] = {"seconds": t + out[cached]["seconds"], "cumulative": out[cached]["cumulative"]}
        else:
            out[c] = {
                "seconds": t,
                "cumulative": False,
                "note": f"{cached} cached tokens matched no checkpoint",
            }
    return out


def system_rows(
    data: dict[str, Any], arith: ModelArithmetic, ceilings: dict[str, Any]
) -> list[dict[str, Any]]:
    bw = ceilings.get("copy", {}).get("bytes_per_s")
    flops = ceilings.get("matmul", {}).get("flop_per_s")
    ttft = cumulative_ttft(data.get("checkpoints", []))
    rows = []
    for entry in data.get("checkpoints", []):
        c = entry["context"]
        spec, plain = entry.get("spec") or {}, entry.get("plain") or {}
        row: dict[str, Any] = {"context": c, "label": label(c)}
        if c in ttft:
            t = ttft[c]["seconds"]
            row.update(ttft_s=t, ttft_cumulative=ttft[c]["cumulative"], prefill_tok_s=c / t)
            if flops:
                row["prefill_frac_limit"] = arith.prefill_flops(0, c) / flops / t
        for kind, src, draft in (("round", spec, True), ("plain", plain, False)):
            ms = src.get("round_median_ms")
            if ms is None:
                continue
            row[f"{kind}_ms"] = ms
            if bw:
                row[f"{kind}_frac_limit"] = arith.round_bytes(c, draft) / bw / (ms / 1000)
            tpr = src.get("tokens_per_round") or []
            if tpr:
                row[f"{kind}_tokens_per_round"] = statistics.mean(tpr)
            if src.get("decode_tokens_per_joule") is not None:
                row[f"{kind}_tok_per_j"] = src["decode_tokens_per_joule"]
            if src.get("power", {}).get("mean_w") is not None:
                row[f"{kind}_w"] = src["power"]["mean_w"]
        if spec.get("draft_median_ms") is not None:
            row["draft_ms"] = spec["draft_median_ms"]
        rows.append(row)
    return rows


def build(doc: dict[str, Any], arith: ModelArithmetic) -> dict[str, Any]:
    ceilings = doc.get("ceilings", {})
    table: dict[str, list[dict[str, Any]]] = {}
    for system in ("stock", "elpis"):
        if system in doc.get("systems", {}):
            table[system] = system_rows(doc["systems"][system], arith, ceilings)
    ratios = []
    if "stock" in table and "elpis" in table:
        by_c = {r["context"]: r for r in table["elpis"]}
        for s in table["stock"]:
            e = by_c.get(s["context"])
            if e is None:
                continue
            ratio = {"context": s["context"], "label": s["label"]}
            for key in ("ttft_s", "round_ms", "plain_ms"):
                if key in s and key in e and e[key]:
                    ratio[key] = s[key] / e[key]
            ratios.append(ratio)
    doc["table"] = table
    doc["ratios"] = ratios
    return doc


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown(doc: dict[str, Any]) -> str:
    facts = doc.get("facts", {})
    ceil = doc.get("ceilings", {})
    lines = [
        f"# Engine benchmark: {doc.get('title', '')}",
        "",
        f"GPU {facts.get('gpu')} (driver {facts.get('driver')}, "
        f"SM clock max {facts.get('clock_sm_max_mhz')} MHz, "
        f"memory clock max {facts.get('clock_mem_max_mhz')} MHz), torch {facts.get('torch')}, CUDA "
        f"{facts.get('cuda')}, exllamav3 {facts.get('exllamav3')}, git {facts.get('git_revision')}.",
        f"Model: {doc.get('model_note', '')}",
        f"Measured ceilings: copy {_fmt(ceil.get('copy', {}).get('bytes_per_s', 0) / 1e12, '.2f')} TB/s "
        "(read+write), "
        f"bf16 matmul {_fmt(ceil.get('matmul', {}).get('flop_per_s', 0) / 1e12, '.0f')} TFLOP/s.",
        "Random weights: every draft is rejected, so a speculative round commits one token; the figures are "
        "engine speed (ms per round), not tokens per round of the real model.",
        "",
        "| system | context | TTFT s | prefill tok/s | prefill % limit | round ms (8 rows) | round % limit | "
        "plain ms | plain % limit | draft ms | round tok/J | plain tok/J |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, rows in doc.get("table", {}).items():
        for r in rows:
            ttft = _fmt(r.get("ttft_s"), ".2f") + ("" if r.get("ttft_cumulative", True) else "*")
            lines.append(
                f"| {system} | {r['label']} | {ttft} | {_fmt(r.get('prefill_tok_s'), '.0f')} | "
                f"{_fmt(100 * r['prefill_frac_limit'] if 'prefill_frac_limit' in r else None)} | "
                f"{_fmt(r.get('round_ms'), '.2f')} | "
                f"{_fmt(100 * r['round_frac_limit'] if 'round_frac_limit' in r else None)} | "
                f"{_fmt(r.get('plain_ms'), '.2f')} | "
                f"{_fmt(100 * r['plain_frac_limit'] if 'plain_frac_limit' in r else None)} | "
                f"{_fmt(r.get('draft_ms'), '.2f')} | {_fmt(r.get('round_tok_per_j'), '.2f')} | "
                f"{_fmt(r.get('plain_tok_per_j'), '.2f')} |"
            )
    if doc.get("ratios"):
        lines += [
            "",
            "Stock time / elpis time (above 1: elpis faster):",
            "",
            "| context | TTFT | round | plain |",
            "|---|---|---|---|",
        ]
        for r in doc["ratios"]:
            lines.append(
                f"| {r['label']} | {_fmt(r.get('ttft_s'), '.3f')} | {_fmt(r.get('round_ms'), '.3f')} | "
                f"{_fmt(r.get('plain_ms'), '.3f')} |"
            )
    lines += ["", "Fresh TTFT (nothing cached):", ""]
    for system, data in doc.get("systems", {}).items():
        for f in data.get("fresh_ttft", []):
            lines.append(
                f"- {system} {label(f['context'])}: " + ", ".join(f"{s:.2f} s" for s in f["seconds"])
            )
    lines += ["", "Peak GPU memory:", ""]
    for system, data in doc.get("systems", {}).items():
        peak = data.get("peak") or {}
        cap = data.get("cap_gib")
        lines.append(
            f"- {system}: {_fmt(peak.get('max_allocated_gib'), '.2f')} GiB allocated, "
            f"{_fmt(peak.get('max_reserved_gib'), '.2f')} GiB reserved"
            + (f" (under a {cap} GiB cap)" if cap else "")
            + f"; complete: {data.get('complete')}"
        )
        if data.get("loop") == "direct":
            lines.append(f"  - {system} ran the direct backend loop (anchor row committed, no acceptor call)")
        for err in data.get("errors", []):
            lines.append(f"  - note: {err.splitlines()[0]}")
    lines.append("")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system, rows in doc.get("table", {}).items():
        xs = [r["context"] for r in rows if "round_ms" in r]
        a.plot(
            xs, [r["round_ms"] for r in rows if "round_ms" in r], marker="o", label=f"{system} round (8 rows)"
        )
        xs = [r["context"] for r in rows if "plain_ms" in r]
        a.plot(
            xs,
            [r["plain_ms"] for r in rows if "plain_ms" in r],
            marker="s",
            ls="--",
            label=f"{system} plain step",
        )
        xs = [r["context"] for r in rows if "ttft_s" in r]
        b.plot(xs, [r["ttft_s"] for r in rows if "ttft_s" in r], marker="o", label=system)
    for ax, title, unit in ((a, "decode", "ms"), (b, "time to first token", "s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context tokens")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(doc.get("title", "elpis engine benchmark"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(doc: dict[str, Any], arith: ModelArithmetic, out_dir: Path, stem: str) -> list[Path]:
    doc = build(doc, arith)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths[1].write_text(markdown(doc))
    plot(doc, paths[2])
    return paths
