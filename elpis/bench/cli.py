"""`elpis bench`: engine speed on a GPU (`engine`), re-rendering a result (`report`), and the served GSM8K
workload against any OpenAI-compatible server (`gsm8k`, implemented in `elpis.bench.gsm8k`).

`elpis bench engine --model DIR --draft DIR` measures stock ExLlamaV3 and elpis in the same run, each in its
own process (stock first, then elpis under `--cap-gib`, default 24), after measuring the card's copy
bandwidth and bf16 matmul rate, and writes `bench/results/<stem>.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from elpis.paths import BENCH_RESULTS


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="target model directory (EXL3)")
    p.add_argument("--draft", type=Path, required=True, help="DFlash2 draft directory")
    p.add_argument("--out-dir", type=Path, default=BENCH_RESULTS)
    p.add_argument("--stem", default=None, help="output file name stem (default: engine-<date>-<gpu>)")
    p.add_argument("--systems", default="stock,elpis", help="comma-separated, run in this order")
    p.add_argument(
        "--time-limit",
        type=float,
        default=540.0,
        help="seconds for the whole run; workers stop starting measurements in time to report",
    )
    p.add_argument(
        "--checkpoints", default=None, help="context checkpoints, comma-separated (default 1K..262K)"
    )
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--cap-gib", type=float, default=24.0, help="GPU memory cap for elpis (0: none)")
    p.add_argument(
        "--elpis-loop",
        choices=("spec", "direct"),
        default="spec",
        help="spec (default): speculation core + proven acceptor; direct: backend rounds only",
    )
    p.add_argument("--title", default=None)
    p.add_argument(
        "--model-note",
        default="synthetic exact-shape Qwen3.8-27B, EXL3 4.00 bpw, 6 bpw head, "
        "DFlash2 draft; 270,336-token 3-bit K/V cache",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    _add_engine(
        sub.add_parser("engine", help="stock vs elpis engine speed on this GPU (in process, no HTTP)")
    )
    prof = sub.add_parser("profile", help="stock vs elpis: GPU time per phase of rounds and prefill chunks")
    _add_engine(prof)
    prof.add_argument(
        "--profile-prefill",
        default="32768,262144",
        help="contexts whose last prefill chunks are profiled (comma-separated)",
    )
    prof.set_defaults(rounds=8, warmup=3, checkpoints="1024,32768,262144")
    rep = sub.add_parser("report", help="re-render a result JSON into Markdown and PNG")
    rep.add_argument("result", type=Path)
    g = sub.add_parser("gsm8k", help="served GSM8K speed workload against an OpenAI-compatible server")
    try:
        from elpis.bench import gsm8k
    except ImportError as exc:
        g.set_defaults(gsm8k_missing=str(exc))
    else:
        gsm8k.add_arguments(g)


def run(args: argparse.Namespace) -> int:
    if args.mode == "gsm8k":
        if getattr(args, "gsm8k_missing", None):
            print(f"elpis bench gsm8k is not available: {args.gsm8k_missing}", file=sys.stderr)
            return 2
        from elpis.bench import gsm8k

        return int(gsm8k.run(args) or 0)
    if args.mode == "report":
        return run_report(args.result)
    if args.mode == "profile":
        return run_profile(args)
    return run_engine(args)


def _arith(doc: dict):
    from elpis.bench.workload import ModelArithmetic

    return ModelArithmetic(**doc["arithmetic"])


def run_report(path: Path) -> int:
    from elpis.bench import report

    doc = json.loads(path.read_text())
    for p in report.write(doc, _arith(doc), path.parent, path.stem):
        print(f"wrote {p}")
    return 0


def run_engine(args: argparse.Namespace) -> int:
    import torch

    from elpis.bench import hardware, report, workload
    from elpis.exl3 import geometry

    if not torch.cuda.is_available():
        print("elpis bench engine needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    end = start + args.time_limit
    systems = _systems(args.systems)
    if systems is None:
        return 2
    facts = hardware.gpu_facts()
    stem = args.stem or f"engine-{time.strftime('%Y-%m-%d')}-{facts.get('gpu', 'gpu').replace(' ', '_')}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    arith = workload.arithmetic(geometry.read_config(args.model), geometry.read_config(args.draft))
    doc: dict = {
        "title": args.title or f"stock ExLlamaV3 vs elpis, {facts.get('gpu')}",
        "model_note": args.model_note,
        "facts": facts,
        "ceilings": {"copy": hardware.measure_copy_bandwidth(), "matmul": hardware.measure_bf16_matmul()},
        "arithmetic": dataclasses.asdict(arith),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "systems": {},
    }
    torch.cuda.empty_cache()
    print(f"ceilings: {doc['ceilings']}", flush=True)
    run_workers(args, systems, doc, end, stem, lambda: report.write(doc, arith, args.out_dir, stem))
    for p in report.write(doc, arith, args.out_dir, stem):
        print(f"wrote {p}")
    print(report.markdown(doc))
    return 0


def run_workers(
    args: argparse.Namespace,
    systems: list[str],
    doc: dict,
    end: float,
    stem: str,
    save: Callable[[], object],
    extra: Sequence[str] = (),
) -> None:
    """Each system in its own worker process (`python -m elpis.bench.worker`), in order, sharing the time
    left; `doc["systems"][name]` gets each worker's result and `save()` runs after each."""
    for i, system in enumerate(systems):
        now = time.time()
        budget = (end - now) / (len(systems) - i)
        if budget < 60:
            doc["systems"][system] = {"errors": [f"not run: {budget:.0f} s left"], "checkpoints": []}
            continue
        raw = args.out_dir / f"{stem}-{system}.raw.json"
        cmd = [
            sys.executable,
            "-m",
            "elpis.bench.worker",
            "--system",
            system,
            "--model",
            str(args.model),
            "--draft",
            str(args.draft),
            "--out",
            str(raw),
            "--deadline",
            str(now + budget - 25),
            "--rounds",
            str(args.rounds),
            "--warmup",
            str(args.warmup),
            *extra,
        ]
        if args.checkpoints:
            cmd += ["--checkpoints", args.checkpoints]
        if system == "elpis":
            cmd += ["--elpis-loop", args.elpis_loop]
            if args.cap_gib:
                cmd += ["--cap-gib", str(args.cap_gib)]
        print(f"== {system}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            proc.wait(timeout=max(10.0, min(end, now + budget + 15) - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"== {system}: killed at its time limit", flush=True)
        data = (
            json.loads(raw.read_text()) if raw.exists() else {"errors": ["no result file"], "checkpoints": []}
        )
        data["returncode"] = proc.returncode
        doc["systems"][system] = data
        raw.unlink(missing_ok=True)
        save()  # after each system: partial results survive


def _systems(text: str) -> list[str] | None:
    systems = [s for s in text.split(",") if s]
    if not systems or any(s not in ("stock", "elpis") for s in systems):
        print(f"unknown system in {text!r} (stock, elpis)", file=sys.stderr)
        return None
    return systems


def run_profile(args: argparse.Namespace) -> int:
    """`elpis bench profile`: both systems' per-phase GPU time in one run (bench/results/profile-*)."""
    import torch

    from elpis.bench import hardware, phase_report

    if not torch.cuda.is_available():
        print("elpis bench profile needs a CUDA GPU", file=sys.stderr)
        return 2
    systems = _systems(args.systems)
    if systems is None:
        return 2
    end = time.time() + args.time_limit
    facts = hardware.gpu_facts()
    stem = args.stem or f"profile-{time.strftime('%Y-%m-%d')}-{facts.get('gpu', 'gpu').replace(' ', '_')}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {
        "title": args.title or f"Per-phase GPU time, stock ExLlamaV3 vs elpis, {facts.get('gpu')}",
        "model_note": args.model_note,
        "facts": facts,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "systems": {},
    }
    extra = ["--profile", "--profile-prefill", args.profile_prefill]
    run_workers(args, systems, doc, end, stem, lambda: phase_report.write(doc, args.out_dir, stem), extra)
    for path in phase_report.write(doc, args.out_dir, stem):
        print(f"wrote {path}")
    print(phase_report.markdown(doc))
    return 0
