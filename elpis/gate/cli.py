"""`elpis gate`: per-op error against fp64, teacher-forced model comparison, verdicts.

elpis gate op      --backend reference --model DIR [--ops attention,gemm] [--contexts 128] [--rows 1,8]
elpis gate model   --model DIR --reference SPEC --arm NAME=SPEC [--arm ...] [corpus sizes]
elpis gate verdict --rules FILE --measurement FILE.json --candidate ARM --patch ID
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from elpis.gate.ledger import RuleAgeError
from elpis.gate.rules import RuleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gate_command", metavar="{op,model,verdict}", required=True)

    op = sub.add_parser("op", help="per-op relative error of stock and candidates against fp64")
    op.add_argument("--backend", default="reference", help="whose ops: reference (CPU) or exl3 (GPU)")
    op.add_argument("--model", help="model directory or GGUF file the activations come from")
    op.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="provider option")
    op.add_argument("--ops", help="comma-separated op names (default: all the backend registers)")
    op.add_argument("--contexts", help="comma-separated context lengths (default: each op's grid)")
    op.add_argument("--rows", help="comma-separated row counts (default: each op's grid)")
    op.add_argument(
        "--out", type=Path, help="JSON output (default: bench/results/gate/op-<backend>-<UTC>.json)"
    )

    model = sub.add_parser("model", help="teacher-forced comparison of configurations against a reference")
    model.add_argument(
        "--model", required=True, help="model directory or GGUF file (tokenizer, chat template)"
    )
    model.add_argument(
        "--reference", required=True, help="reference configuration spec, e.g. reference:dtype=fp64"
    )
    model.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="NAME=SPEC",
        help="a configuration compared to the reference",
    )
    model.add_argument("--label", default="model", help="short name for the output files")
    model.add_argument("--wikitext-chunks", type=int, default=4)
    model.add_argument("--wikitext-tokens", type=int, default=256)
    model.add_argument(
        "--gsm8k", type=int, default=4, help="chat-formatted GSM8K question + solution documents"
    )
    model.add_argument("--aime", type=int, default=2, help="chat-formatted AIME prompt documents")
    model.add_argument("--greedy-prompts", type=int, default=2, help="GSM8K prompts decoded greedily per arm")
    model.add_argument(
        "--greedy-tokens", type=int, default=512, help="greedy continuation length per prompt and arm"
    )
    model.add_argument(
        "--score-from",
        type=int,
        default=0,
        metavar="N",
        help="every configuration prefills each document's first N tokens its own way; only the positions "
        "after them are compared (prefill changes, e.g. the exl3 patch prefill-chunk-8192, need N > 2048)",
    )
    model.add_argument("--results", type=Path, help="results directory (default bench/results/gate)")
    model.add_argument(
        "--random-ids",
        type=int,
        metavar="VOCAB",
        help="documents of pseudo-random ids below VOCAB instead of text (synthetic checkpoints, whose "
        "tokenizer does not fit their logits: measures numerical drift, not intelligence)",
    )

    verdict = sub.add_parser("verdict", help="judge a candidate arm by a committed rule file")
    verdict.add_argument(
        "--rules", type=Path, required=True, help="rule file (TOML, committed before measuring)"
    )
    verdict.add_argument("--measurement", type=Path, required=True, help="JSON written by elpis gate model")
    verdict.add_argument("--candidate", required=True, help="arm name of the candidate in the measurement")
    verdict.add_argument("--patch", required=True, help="patch id the verdict is filed under")
    verdict.add_argument(
        "--ops", type=Path, help="op results (JSON from elpis gate op) when the rules ask for the op bar"
    )
    verdict.add_argument("--op-candidate", help="candidate name in the op results")
    verdict.add_argument("--results", type=Path, help="results directory (default bench/results/gate)")


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"--{what} needs non-negative integers")
    return values


def _options(items: list[str]) -> dict[str, str]:
    options = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--option {item!r} is not KEY=VALUE")
        options[key] = value
    return options


def _results_dir(path: Path | None) -> Path:
    from elpis.gate.verdicts import GATE_RESULTS

    return path if path is not None else GATE_RESULTS


def run(args: argparse.Namespace) -> int:
    try:
        return {"op": _op, "model": _model, "verdict": _verdict}[args.gate_command](args)
    except RuleAgeError as exc:
        print(f"elpis gate: refused: {exc}", file=sys.stderr)
        return 2
    except (RuleError, ValueError, FileNotFoundError) as exc:
        print(f"elpis gate {args.gate_command}: {exc}", file=sys.stderr)
        return 2


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _op(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from elpis.gate import ops as gate_ops
    from elpis.gate.identity import identity, model_fingerprint

    console = Console(stderr=True)
    contexts, rows = _ints(args.contexts, "contexts"), _ints(args.rows, "rows")  # fail before loading
    found = gate_ops.load_ops(args.backend, Path(args.model) if args.model else None, _options(args.option))
    if args.ops:
        wanted = [n.strip() for n in args.ops.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {op.name for op in found})
        if unknown:
            raise ValueError(
                f"unknown op(s) {unknown}: the {args.backend} backend has {[op.name for op in found]}"
            )
        found = [op for op in found if op.name in wanted]
    with console.status("measuring") as status:
        results = gate_ops.measure(
            found,
            contexts=contexts,
            rows=rows,
            progress=lambda text: status.update(text),
        )
    out = args.out or _results_dir(None) / f"op-{args.backend}-{_stamp()}.json"
    header = {
        "backend": args.backend,
        "model": args.model,
        "options": _options(args.option),
        "identity": identity(),
    }
    if args.model:
        from elpis.gate.compare import resolve_model

        header["identity"]["model"] = model_fingerprint(resolve_model(Path(args.model)))
    record = gate_ops.save(results, out, header)
    table = Table(title="relative error against fp64")
    for column in ("op", "context", "rows", "impl", "mean", "p99", "max"):
        table.add_column(column, no_wrap=True)
    for cell in results:
        for name, s in cell.stats.items():
            table.add_row(
                cell.op,
                str(cell.context),
                str(cell.rows),
                name,
                f"{s.mean:.3e}",
                f"{s.p99:.3e}",
                f"{s.max:.3e}",
            )
    Console().print(table)
    for name, bar in record["bar"].items():
        worse = len(bar["worse"])
        print(
            f"{name}: {'never less precise than stock' if bar['pass'] else f'worse than stock in {worse}'}"
            f" ({bar['cells']} cells)"
        )
    print(f"saved {out}")
    return 0


def _model(args: argparse.Namespace) -> int:
    from rich.console import Console

    from elpis.gate.compare import (
        CorpusPlan,
        build_corpus,
        compare_models,
        model_text,
        random_corpus,
        resolve_model,
    )
    from elpis.gate.configs import canonical, make_configuration
    from elpis.gate.identity import identity, model_fingerprint
    from elpis.gate.ledger import record_measurement

    arms: dict[str, str] = {}
    for item in args.arm:
        name, eq, spec = item.partition("=")
        if not eq or not name or not spec or name in arms:
            raise ValueError(f"--arm {item!r} must be NAME=SPEC with a unique name")
        arms[name] = canonical(spec)
    model_path = Path(args.model)
    plan = CorpusPlan(
        args.wikitext_chunks,
        args.wikitext_tokens,
        args.gsm8k,
        args.aime,
        args.greedy_prompts,
        args.greedy_tokens,
    )
    if args.random_ids is not None:
        docs, prompts = random_corpus(plan, args.random_ids)
    else:
        encode, render = model_text(model_path)
        docs, prompts = build_corpus(encode, render, plan)
    console = Console(stderr=True)
    with console.status("loading configurations") as status:
        reference = make_configuration(canonical(args.reference), model_path)
        built = {name: make_configuration(spec, model_path) for name, spec in arms.items()}
        measurement = compare_models(
            args.label,
            str(args.model),
            reference,
            built,
            docs,
            prompts,
            plan.greedy_tokens,
            score_from=args.score_from,
            progress=lambda text: status.update(text),
        )
    measurement.identity = {**identity(), "model": model_fingerprint(resolve_model(model_path))}
    results = _results_dir(args.results)
    stem = f"model-{args.label}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(measurement.measured_at))}"
    path = measurement.save(results, stem)
    record_measurement(
        results, {name: arm.spec for name, arm in built.items()}, measurement.measured_at, path.name
    )
    _print_measurement(measurement)
    print(f"saved {path}")
    return 0


def _print_measurement(measurement) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=measurement.label)
    for column in ("arm", "scope", "positions", "mean KL", "p99 KL", "top-1", "ΔNLL"):
        table.add_column(column, no_wrap=True)
    for name, scopes in measurement.summary().items():
        for scope, s in scopes.items():
            if scope == "greedy":
                continue
            table.add_row(
                name,
                scope,
                str(s["positions"]),
                f"{s['mean_kl']:.3e}",
                f"{s['p99_kl']:.3e}",
                f"{s['top1']:.4f}",
                f"{s['dnll']:+.2e}",
            )
    Console().print(table)
    for name, arm in measurement.arms.items():
        print(
            f"{name}: greedy first divergence per prompt {arm.first_divergence} "
            f"(of {measurement.greedy_tokens} tokens)"
        )


def _verdict(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from elpis.gate.rules import load_rules
    from elpis.gate.verdicts import judge, write

    results = _results_dir(args.results)
    verdict = judge(
        load_rules(args.rules),
        args.measurement,
        args.candidate,
        args.patch,
        results_dir=results,
        ops_path=args.ops,
        op_candidate=args.op_candidate,
    )
    verdict = write(verdict, results)
    table = Table(title=args.patch)
    for column in ("scope", "check", "value", "limit", "margin", "lower margin", "outcome"):
        table.add_column(column, no_wrap=True)
    for c in verdict.record["checks"]:
        table.add_row(
            c["scope"],
            c["metric"],
            f"{c['value']:.4g}",
            f"{c['limit']:.4g}",
            f"{c['point_margin']:+.3g}",
            f"{c['lower_margin']:+.3g}",
            c["outcome"],
        )
    Console().print(table)
    print(
        f"{args.patch}: {verdict.verdict} (rule {verdict.rule_id}, sha256 {verdict.rule_sha256[:12]}) "
        f"-> {verdict.path}"
    )
    return 0 if verdict.ships else 1
