"""Turn the workers' results into one JSON document, a Markdown table and a PNG plot.

Derived figures (all from numbers measured in the same run):
- TTFT(c): prompts extend each other, so checkpoint c's first token came after prefilling only the tokens
  past what the prefix cache served. TTFT(c) = that job's time to first token + TTFT(cached), where
  `cached` must be an earlier checkpoint (or 0); otherwise the figure is marked as not cumulative.
- fraction of limit: minimum bytes a round must read / measured copy bandwidth, divided by the measured
  round time; prefill FLOPs / measured bf16 matmul rate, divided by the measured TTFT.
- ratio: stock time / elpis time (above 1: elpis is faster).
- token trees (issue 8), per context: ms per round of stock chain-8, elpis chain-8, elpis tree-8 and tree-16,
  each round's scratch (peak allocation during the rounds over what was allocated before the request), and
  the issue's targets, each PASS or MISS from these numbers: tree-8 no slower than stock chain-8 within
  noise (noise = NOISE_MADS median absolute deviations of the noisier of the two systems' round times),
  tree-16 at most TREE16_OVER_TREE8 x tree-8, scratch under SCRATCH_LIMIT_MB.
- disturbed: measurements whose round times spread more than DISTURBED_SPREAD of their median are listed in
  the document and the report, so a comparison is not read from a run the machine disturbed.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from elpis.bench.workload import TREE_BUDGETS, ModelArithmetic, label

TREE16_OVER_TREE8 = 1.15
SCRATCH_LIMIT_MB = 300.0
NOISE_MADS = 2.0
# A measurement whose round times spread more than this (MAD / median) is reported as disturbed: quiet runs
# on the H200 spread 0.5-3.5 %, disturbed ones 8-30 % (bench/results/tree/README.md, session 14)
DISTURBED_SPREAD = 0.05
# the tree comparison's columns: system -> key prefix
TREE_COLUMNS = {"stock": "stock", "elpis": "chain8", "elpis-tree8": "tree8", "elpis-tree16": "tree16"}


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


def mad_ms(seconds: list[float] | None) -> float | None:
    """Median absolute deviation of round times, in ms (None without at least two rounds)."""
    if not seconds or len(seconds) < 2:
        return None
    mid = statistics.median(seconds)
    return statistics.median(abs(s - mid) for s in seconds) * 1000


def noise_ms(*mads: float | None) -> float:
    """The noise two measurements are compared within: NOISE_MADS x the larger MAD (a missing MAD is 0)."""
    return NOISE_MADS * max((m or 0.0) for m in mads)


def pooled_ab(
    a_docs: list[dict[str, Any]],
    b_docs: list[dict[str, Any]],
    system: str,
    b_system: str | None = None,
    *,
    skip_disturbed: bool = False,
) -> list[dict[str, Any]]:
    """An A/B over alternating runs (A, B, A, B, ... on one machine): per context, the median and MAD of each
    arm's speculative rounds pooled over its runs, and whether A is faster than B beyond the noise
    (NOISE_MADS x the larger pooled MAD). Each doc is one run's result JSON (`elpis bench engine`). Arm A is
    `system` in a_docs, arm B `b_system` (default: the same system) in b_docs; for two systems measured in
    the same runs, pass the same docs to both arms. `skip_disturbed`: leave out a run's context where its
    measurement is disturbed (`disturbed`); in the same runs, where either system's is, so both arms keep the
    same runs. Each row says how many runs each arm pooled."""
    same_runs = a_docs is b_docs

    def skipped_contexts(doc: dict[str, Any], name: str) -> set[int]:
        if not skip_disturbed:
            return set()
        names = {system, b_system or system} if same_runs else {name}
        return {d["context"] for d in disturbed(doc) if d["kind"] == "spec" and d["system"] in names}

    def rounds(
        docs: list[dict[str, Any]], name: str
    ) -> tuple[dict[int, list[float]], dict[int, list[float | None]]]:
        """Pooled rounds per context, and each run's median (None where it was left out), in run order."""
        pooled: dict[int, list[float]] = {}
        medians: dict[int, list[float | None]] = {}
        for doc in docs:
            skipped = skipped_contexts(doc, name)
            for entry in doc["systems"][name]["checkpoints"]:
                context = entry["context"]
                pooled.setdefault(context, [])
                medians.setdefault(context, [])
                if context in skipped:
                    medians[context].append(None)
                    continue
                seconds = (entry.get("spec") or {})["round_seconds"]
                pooled[context].extend(seconds)
                medians[context].append(statistics.median(seconds) * 1000)
        return pooled, medians

    (a, a_medians), (b, b_medians) = rounds(a_docs, system), rounds(b_docs, b_system or system)
    if set(a) != set(b):
        raise ValueError(f"the arms measured different contexts: {sorted(a)} vs {sorted(b)}")
    out = []
    for context in sorted(a):
        if not a[context] or not b[context]:
            raise ValueError(f"{label(context)}: every run of an arm was disturbed; nothing to pool")
        a_ms, b_ms = statistics.median(a[context]) * 1000, statistics.median(b[context]) * 1000
        noise = noise_ms(mad_ms(a[context]), mad_ms(b[context]))
        out.append({
            "context": context, "label": label(context), "a_ms": a_ms, "b_ms": b_ms,
            "a_rounds": len(a[context]), "b_rounds": len(b[context]), "gain_ms": b_ms - a_ms,
            "a_runs": sum(m is not None for m in a_medians[context]),
            "b_runs": sum(m is not None for m in b_medians[context]),
            "noise_ms": noise, "verdict": _verdict(b_ms - a_ms > noise),
            **run_pairs(a_medians[context], b_medians[context]),
        })  # fmt: skip
    return out


def run_pairs(a_medians: list[float | None], b_medians: list[float | None]) -> dict[str, Any]:
    """The i-th run of arm A against the i-th of arm B (alternating runs pair up in order): in how many pairs
    A's median round is the shorter, and the one-sided sign test's p-value of that count (the chance of at
    least as many with no difference). Information beside the verdict, which the noise rule alone decides.
    Empty when the arms have different numbers of runs; pairs with a run left out are not counted."""
    if len(a_medians) != len(b_medians):
        return {}
    pairs = [(x, y) for x, y in zip(a_medians, b_medians, strict=True) if x is not None and y is not None]
    faster = sum(x < y for x, y in pairs)
    n = len(pairs)
    p = sum(math.comb(n, k) for k in range(faster, n + 1)) / 2**n if n else 1.0
    return {"pairs": n, "pairs_a_faster": faster, "sign_p": p}


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def tree_checks(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 8's targets on one context's numbers: {check: {"verdict": PASS|MISS|n/a, ...figures}}."""
    checks: dict[str, dict[str, Any]] = {}
    stock, tree8, tree16 = row.get("stock_ms"), row.get("tree8_ms"), row.get("tree16_ms")
    if stock is not None and tree8 is not None:
        noise = noise_ms(row.get("stock_mad_ms"), row.get("tree8_mad_ms"))
        checks["tree8_vs_stock"] = {
            "verdict": _verdict(tree8 <= stock + noise),
            "ratio": tree8 / stock,
            "noise_ms": noise,
        }
    else:
        checks["tree8_vs_stock"] = {"verdict": "n/a"}
    if tree8 is not None and tree16 is not None:
        ratio = tree16 / tree8
        checks["tree16_vs_tree8"] = {"verdict": _verdict(ratio <= TREE16_OVER_TREE8), "ratio": ratio}
    else:
        checks["tree16_vs_tree8"] = {"verdict": "n/a"}
    scratch = [row[f"{k}_scratch_mb"] for k in ("tree8", "tree16") if row.get(f"{k}_scratch_mb") is not None]
    checks["scratch"] = (
        {"verdict": _verdict(max(scratch) < SCRATCH_LIMIT_MB), "max_mb": max(scratch)}
        if scratch
        else {"verdict": "n/a"}
    )
    verdicts = [c["verdict"] for c in checks.values()]
    row_verdict = "MISS" if "MISS" in verdicts else ("PASS" if set(verdicts) == {"PASS"} else "n/a")
    checks["row"] = {"verdict": row_verdict}
    return checks


def tree_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per context a tree system measured (empty without tree systems)."""
    systems = doc.get("systems", {})
    if not any(s in systems for s in TREE_BUDGETS):
        return []
    specs = {
        name: {e["context"]: e.get("spec") or {} for e in systems.get(name, {}).get("checkpoints", [])}
        for name in TREE_COLUMNS
    }
    contexts = sorted({c for name in TREE_BUDGETS for c in specs[name]})
    rows = []
    for c in contexts:
        row: dict[str, Any] = {"context": c, "label": label(c)}
        for name, key in TREE_COLUMNS.items():
            spec = specs[name].get(c, {})
            if spec.get("round_median_ms") is not None:
                row[f"{key}_ms"] = spec["round_median_ms"]
            if (noise := mad_ms(spec.get("round_seconds"))) is not None:
                row[f"{key}_mad_ms"] = noise
            if spec.get("tokens_per_round"):
                row[f"{key}_tokens_per_round"] = float(statistics.mean(spec["tokens_per_round"]))
            if spec.get("round_scratch_mb") is not None:
                row[f"{key}_scratch_mb"] = spec["round_scratch_mb"]
        row["checks"] = tree_checks(row)
        rows.append(row)
    return rows


def build(doc: dict[str, Any], arith: ModelArithmetic) -> dict[str, Any]:
    ceilings = doc.get("ceilings", {})
    table: dict[str, list[dict[str, Any]]] = {}
    systems = doc.get("systems", {})
    for system in ("stock", "elpis"):
        if system in systems:
            table[system] = system_rows(systems[system], arith, ceilings)
    # A tree system that paid its own prefill (the first of its process) has a prefill figure to show; its
    # rounds are in the tree table (this table's round columns are 8-row rounds)
    for system in TREE_BUDGETS:
        if system in systems and systems[system].get("prefill_paid_by", system) == system:
            rows = system_rows(systems[system], arith, ceilings)
            keep = ("context", "label", "ttft_s", "ttft_cumulative", "prefill_tok_s", "prefill_frac_limit")
            table[system] = [{k: r[k] for k in keep if k in r} for r in rows]
    ratios = []
    served = next((s for s in ("elpis", *TREE_BUDGETS) if s in table), None)
    if "stock" in table and served is not None:
        by_c = {r["context"]: r for r in table[served]}
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
    doc["ratios_system"] = served if ratios else None
    doc["tree"] = tree_rows(doc)
    doc["disturbed"] = disturbed(doc)
    return doc


def disturbed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (system, context, kind) whose round times spread more than DISTURBED_SPREAD (MAD / median): a
    comparison with it says more about the machine than about the systems."""
    found = []
    for system, data in doc.get("systems", {}).items():
        for entry in data.get("checkpoints", []):
            for kind in ("spec", "plain"):
                seconds = (entry.get(kind) or {}).get("round_seconds")
                spread = mad_ms(seconds)
                if spread is None:
                    continue
                median = statistics.median(seconds) * 1000
                if spread > DISTURBED_SPREAD * median:
                    found.append({"system": system, "context": entry["context"], "kind": kind,
                                  "median_ms": median, "mad_ms": spread})  # fmt: skip
    return found


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _host_line(facts: dict[str, Any]) -> str:
    """The host CPU's facts (`hardware.host_facts`), or a line saying the run predates them."""
    if "cpu" not in facts:
        return "Host CPU: not recorded (a run from before the bench recorded it)."
    f = {key: _fmt(facts.get(key)) for key in ("cpu", "cpu_usable", "cpu_count")}
    return (
        f"Host CPU {f['cpu']} ({f['cpu_usable']} of {f['cpu_count']} usable, "
        f"{_fmt(facts.get('cpu_mhz_mean_now'), '.0f')} MHz mean now, "
        f"load {_fmt(facts.get('load_avg_1m'), '.2f')}, "
        f"Python loop {_fmt(facts.get('python_loop_us'), '.0f')} µs)."
    )


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
        _host_line(facts),
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
    if any(system in TREE_BUDGETS for system in doc.get("table", {})):
        lines += [
            "",
            "A tree system's row here shows its prefill; its rounds are in the token-tree table below.",
        ]
    if doc.get("ratios"):
        lines += [
            "",
            f"Stock time / {doc.get('ratios_system') or 'elpis'} time (above 1: elpis faster):",
            "",
            "| context | TTFT | round | plain |",
            "|---|---|---|---|",
        ]
        for r in doc["ratios"]:
            lines.append(
                f"| {r['label']} | {_fmt(r.get('ttft_s'), '.3f')} | {_fmt(r.get('round_ms'), '.3f')} | "
                f"{_fmt(r.get('plain_ms'), '.3f')} |"
            )
    lines += ttft_parts_notes(doc)
    lines += tree_markdown(doc.get("tree") or [])
    lines += capture_notes(doc)
    lines += disturbed_notes(doc)
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


def disturbed_notes(doc: dict[str, Any]) -> list[str]:
    found = doc.get("disturbed") or []
    if not found:
        return []
    return [
        "",
        f"**Disturbed measurements** (round times spread over {100 * DISTURBED_SPREAD:.0f} % of the median; "
        "do not compare them, run again):",
        "",
        *(
            f"- {d['system']} at {label(d['context'])}, {d['kind']}: median {d['median_ms']:.2f} ms, "
            f"MAD {d['mad_ms']:.2f} ms"
            for d in found
        ),
    ]


def capture_notes(doc: dict[str, Any]) -> list[str]:
    """A warning for each measurement whose timed rounds include CUDA graph captures (their medians and MADs
    carry capture time: too few warm-up rounds for the keys the run reached)."""
    found = [
        (system, entry["context"], n)
        for system, data in doc.get("systems", {}).items()
        for entry in data.get("checkpoints", [])
        for kind in ("spec", "plain")
        if (n := (entry.get(kind) or {}).get("captures_in_timed_rounds"))
    ]
    if not found:
        return []
    return [
        "",
        "**Graph captures inside timed rounds** (their time is in those rounds: raise --warmup):",
        "",
        *(f"- {system} at {label(context)}: {n}" for system, context, n in found),
    ]


def ttft_parts_notes(doc: dict[str, Any]) -> list[str]:
    """Where each elpis TTFT went: the engine's `begin()` (prefill, with the snapshots' copies and the prefix
    restore inside it) and the first round after it (draft, verify, and any graph captures)."""
    lines = []
    for system, data in doc.get("systems", {}).items():
        for entry in data.get("checkpoints", []):
            spec = entry.get("spec") or {}
            ttft, begin = spec.get("ttft_seconds"), spec.get("prefill_seconds")
            if ttft is None or begin is None:
                continue
            parts = spec.get("prefill_parts") or {}
            lines.append(
                f"| {system} | {label(entry['context'])} | {ttft:.3f} | {begin:.3f} | "
                f"{_fmt(parts.get('snapshots'), '.3f')} | {_fmt(parts.get('restore'), '.3f')} | "
                f"{ttft - begin:.3f} |"
            )
    if not lines:
        return []
    return [
        "",
        "Where elpis's TTFT went (seconds; `begin()` holds the prefill, snapshot copies and restore):",
        "",
        "| system | context | TTFT | begin() | snapshots | restore | first round |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]


def tree_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    counts = [
        r[f"{k}_tokens_per_round"]
        for r in rows
        for k in TREE_COLUMNS.values()
        if f"{k}_tokens_per_round" in r
    ]
    lines = [
        "",
        "Token trees (issue 8): ms per round, stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16",
        "",
    ]
    if counts and all(n == 1 for n in counts):
        lines.append(
            "Every measured round committed exactly 1 token (random weights: every draft is rejected), so "
            "these compare the cost of a round, not the tokens a round commits on the real model."
        )
    else:
        lines.append("Tokens per round (stock / chain-8 / tree-8 / tree-16) are in the last column.")
    lines += [
        f"Targets: tree-8 <= stock chain-8 within noise ({NOISE_MADS:g} MADs of round time); tree-16 <= "
        f"{TREE16_OVER_TREE8:g} x tree-8; round scratch (peak over the allocation before the request) < "
        f"{SCRATCH_LIMIT_MB:g} MB.",
        "",
        "| context | stock chain-8 ms | elpis chain-8 ms | tree-8 ms | tree-16 ms | tree-8 / stock | "
        "tree-16 / tree-8 | scratch tree-8 MB | scratch tree-16 MB | tree-8 <= stock | "
        f"tree-16 <= {TREE16_OVER_TREE8:g} x tree-8 | scratch < {SCRATCH_LIMIT_MB:g} MB | row | "
        "tokens/round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ch = r["checks"]
        near = ch["tree8_vs_stock"]
        noise = f" (noise {near['noise_ms']:.2f} ms)" if "noise_ms" in near else ""
        tpr = " / ".join(_fmt(r.get(f"{k}_tokens_per_round"), ".2f") for k in TREE_COLUMNS.values())
        lines.append(
            f"| {r['label']} | {_fmt(r.get('stock_ms'), '.2f')} | {_fmt(r.get('chain8_ms'), '.2f')} | "
            f"{_fmt(r.get('tree8_ms'), '.2f')} | {_fmt(r.get('tree16_ms'), '.2f')} | "
            f"{_fmt(near.get('ratio'), '.3f')} | {_fmt(ch['tree16_vs_tree8'].get('ratio'), '.3f')} | "
            f"{_fmt(r.get('tree8_scratch_mb'), '.0f')} | {_fmt(r.get('tree16_scratch_mb'), '.0f')} | "
            f"{near['verdict']}{noise} | {ch['tree16_vs_tree8']['verdict']} | {ch['scratch']['verdict']} | "
            f"{ch['row']['verdict']} | {tpr} |"
        )
    verdicts = [r["checks"]["row"]["verdict"] for r in rows]
    lines += ["", f"Targets met at {verdicts.count('PASS')} of {len(rows)} contexts."]
    return lines


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
    tree = doc.get("tree") or []
    for key, name in (("tree8", "elpis tree-8"), ("tree16", "elpis tree-16")):
        xs = [r["context"] for r in tree if f"{key}_ms" in r]
        if xs:
            a.plot(xs, [r[f"{key}_ms"] for r in tree if f"{key}_ms" in r], marker="^", label=f"{name} round")
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
