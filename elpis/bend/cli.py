"""`elpis prove`: parse and check every Bend module, discharge every law, print ALL PROOFS CHECK."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from elpis.bend.prove import load_program, prove_all
from elpis.bend.smt import solver_version
from elpis.paths import REPO_ROOT

PASS_LINE = "ALL PROOFS CHECK"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", type=Path, default=REPO_ROOT, help="repository root holding bend/ and proofs/"
    )
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: min(2, CPUs))")
    parser.add_argument("--law", action="append", default=None, help="prove only this law (repeatable)")
    parser.add_argument("--certificates", type=Path, default=None, help="write the proof certificates (JSON)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict and failures")


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    root = args.root.resolve()
    try:
        total = len(load_program(root).laws) if not args.law else len(args.law)
    except Exception:  # the report below names the problem
        total = None
    lines: list[str] = []

    with Progress(
        TextColumn("[bold]proving"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
        disable=args.quiet or not err.is_terminal,
    ) as bar:
        task = bar.add_task("", total=total)

        def on_result(r: dict) -> None:
            mark = "ok  " if r["ok"] else "FAIL"
            lines.append(f"{mark} {r['name']:<36} {r['seconds']:7.2f}s  {r['message'][:120]}")
            bar.update(task, advance=1, description=r["name"])

        report = prove_all(root, jobs=args.jobs, only=set(args.law) if args.law else None, progress=on_result)

    if not args.quiet:
        for line in lines:
            print(line)
        print(f"{len(report.certificates)} law(s) proved in {report.seconds:.1f}s ({solver_version()})")
    if args.certificates is not None:
        args.certificates.parent.mkdir(parents=True, exist_ok=True)
        args.certificates.write_text(json.dumps(report.certificates, indent=1, sort_keys=True) + "\n")
    if report.ok:
        print(PASS_LINE)
        return 0
    for f in report.failures:
        print(f"FAILED: {f}", file=sys.stderr)
    print(f"{len(report.failures)} failure(s): the proofs do not check", file=sys.stderr)
    return 1
