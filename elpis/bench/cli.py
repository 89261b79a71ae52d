"""`elpis bench`: engine speed on a GPU (`engine`), re-rendering a result (`report`), and the served GSM8K
workload against any OpenAI-compatible server (`gsm8k`, implemented in `elpis.bench.gsm8k`).

`elpis bench engine --model DIR --draft DIR` measures stock ExLlamaV3 and elpis in the same run, each in its
own process (stock first, then elpis under `--cap-gib`, default 24), after measuring the card's copy
bandwidth and bf16 matmul rate, and writes `bench/results/<stem>.{json,md,png}`.
`--systems stock,elpis,elpis-tree8,elpis-tree16` adds issue 8's tree comparison (checkpoints 1K..128K unless
given): each tree system runs in a worker process of its own, on a backend loaded in tree mode with its row
count (chain `elpis` shares the first of them, taking turns at each checkpoint).
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

from elpis.bench.workload import ELPIS_SYSTEMS, PROFILE_SYSTEMS, SYSTEMS, TREE_BUDGETS, TREE_CHECKPOINTS
from elpis.exl3 import DEFAULT_PREFILL_CHUNK, PREFILL_CHUNKS
from elpis.paths import BENCH_RESULTS


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="target model directory (EXL3)")
    p.add_argument("--draft", type=Path, required=True, help="DFlash2 draft directory")
    p.add_argument("--out-dir", type=Path, default=BENCH_RESULTS)
    p.add_argument("--stem", default=None, help="output file name stem (default: engine-<date>-<gpu>)")
    p.add_argument(
        "--systems",
        default="stock,elpis",
        help=f"comma-separated, run in this order ({', '.join(SYSTEMS)}); elpis systems share a process",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=540.0,
        help="seconds for the whole run; workers stop starting measurements in time to report",
    )
    p.add_argument(
        "--checkpoints",
        default=None,
        help="context checkpoints, comma-separated (default 1K..262K; with a tree system 1K..128K)",
    )
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument(
        "--final-tokens",
        type=int,
        default=None,
        help="tokens decoded at the last checkpoint (default: the worker's, 128; at least rounds + warm-up)",
    )
    p.add_argument("--cap-gib", type=float, default=24.0, help="GPU memory cap for elpis (0: none)")
    p.add_argument(
        "--elpis-loop",
        choices=("spec", "direct"),
        default="spec",
        help="spec (default): speculation core + proven acceptor; direct: backend rounds only",
    )
    p.add_argument(
        "--tree-top-k",
        type=int,
        default=None,
        help="tree systems: drafter candidates per depth (default: the speculation core's)",
    )
    p.add_argument(
        "--spec-only", action="store_true", help="speculative rounds only (no plain steps, no fresh TTFT)"
    )
    p.add_argument(
        "--tree-eager",
        action="store_true",
        help="tree systems: run tree verifies eagerly instead of replaying captured CUDA graphs",
    )
    p.add_argument(
        "--draft-eager",
        action="store_true",
        help="elpis systems: run the DFlash2 draft block eagerly instead of replaying captured CUDA graphs",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        choices=PREFILL_CHUNKS,
        default=DEFAULT_PREFILL_CHUNK,
        help="elpis systems: tokens per prefill chunk (2048, the default: ExLlamaV3's own and its "
        "arithmetic, in layer-major groups of up to sixteen; 8192: other arithmetic, gated, opt-in)",
    )
    p.add_argument(
        "--host-threads",
        type=int,
        default=None,
        help="elpis systems: torch CPU threads between prefills (default: load_backend's, 1)",
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
    prof.add_argument(
        "--prefill-window",
        type=int,
        default=4096,
        help="tokens before each profiled context where its prefill window starts (0: the whole prompt; a "
        "prefill in layer-major groups starts it at the group holding that position)",
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

    systems = _systems(args.systems)
    if systems is None or not check_engine_args(args, systems):
        return 2
    if not torch.cuda.is_available():
        print("elpis bench engine needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    end = start + args.time_limit
    facts = hardware.machine_facts()
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


# Seconds kept for each later worker group: a load of a warm model (11-32 s on an H100), its warm-ups and two
# checkpoints took about 85 s for two groups together in call 173.
LATER_GROUP_RESERVE = 90.0


def group_budget(time_left: float, later_groups: int) -> float:
    """A worker group's seconds: all but a reserve for each later group, and never less than an even share.
    The first process pays one-time costs (call 173: stock's first load 99.6 s; 42 s on a warm machine, call
    164), and a group that finishes early leaves its time to the next, so an even split starved the first."""
    even = time_left / (later_groups + 1)
    return max(even, time_left - LATER_GROUP_RESERVE * later_groups)


def run_workers(
    args: argparse.Namespace,
    systems: list[str],
    doc: dict,
    end: float,
    stem: str,
    save: Callable[[], object],
    extra: Sequence[str] = (),
) -> None:
    """Each worker group (`worker_groups`) in its own process (`python -m elpis.bench.worker`), in order,
    sharing the time left; `doc["systems"][name]` gets each system's result and `save()` runs after each
    group."""
    groups = worker_groups(systems)
    for i, group in enumerate(groups):
        now = time.time()
        budget = group_budget(end - now, len(groups) - i - 1)
        if budget < 60:
            for system in group:
                doc["systems"][system] = {"errors": [f"not run: {budget:.0f} s left"], "checkpoints": []}
            continue
        name = "-".join(group)
        raw = args.out_dir / f"{stem}-{name}.raw.json"
        cmd = worker_command(args, group, raw, now + budget - 25, extra)
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            proc.wait(timeout=max(10.0, min(end, now + budget + 15) - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"== {name}: killed at its time limit", flush=True)
        data = json.loads(raw.read_text()) if raw.exists() else {}
        for system in group:
            result = data.get(system) or {"errors": ["no result file"], "checkpoints": []}
            result["returncode"] = proc.returncode
            doc["systems"][system] = result
        raw.unlink(missing_ok=True)
        save()  # after each group: partial results survive


def worker_groups(systems: list[str]) -> list[list[str]]:
    """stock alone; each elpis tree system in a process of its own, loaded with its row count (the graphs
    captured at load, which rounds on the GPU replay, are one row count's, and the caches hold one row count's
    keys: a tree-8 system beside tree-16 on one load evicted tree-16's, device call 172); chain `elpis` with
    the first of them (one backend, `elpis` first so its TTFT is the prefill's), or alone. Each group runs at
    the place of the first of its systems."""
    by_system = {s: [s] for s in ELPIS_SYSTEMS if s != "elpis" and s in systems}  # the tree systems
    if "elpis" in systems:
        with_chain = next(iter(by_system.values()), [])
        with_chain.insert(0, "elpis")
        by_system["elpis"] = with_chain
    groups: list[list[str]] = []
    for system in systems:
        group = ["stock"] if system == "stock" else by_system[system]
        if group not in groups:
            groups.append(group)
    return groups


def profile_worker_args(args: argparse.Namespace) -> list[str]:
    """What `bench profile` adds to each worker's command line."""
    return [
        "--profile",
        "--profile-prefill",
        args.profile_prefill,
        "--prefill-window",
        str(args.prefill_window),
    ]


def worker_command(
    args: argparse.Namespace, group: list[str], raw: Path, deadline: float, extra: Sequence[str] = ()
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "elpis.bench.worker",
        "--system",
        ",".join(group),
        "--model",
        str(args.model),
        "--draft",
        str(args.draft),
        "--out",
        str(raw),
        "--deadline",
        str(deadline),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        *extra,
    ]
    if args.checkpoints:
        cmd += ["--checkpoints", args.checkpoints]
    if getattr(args, "final_tokens", None) is not None:
        cmd += ["--final-tokens", str(args.final_tokens)]
    if getattr(args, "spec_only", False):
        cmd.append("--spec-only")
    if group != ["stock"]:
        cmd += ["--elpis-loop", args.elpis_loop]
        if args.cap_gib:
            cmd += ["--cap-gib", str(args.cap_gib)]
        if getattr(args, "tree_top_k", None) is not None and any(s in TREE_BUDGETS for s in group):
            cmd += ["--tree-top-k", str(args.tree_top_k)]
        if getattr(args, "tree_eager", False) and any(s in TREE_BUDGETS for s in group):
            cmd.append("--tree-eager")
        if getattr(args, "draft_eager", False):
            cmd.append("--draft-eager")
        cmd += ["--prefill-chunk", str(getattr(args, "prefill_chunk", DEFAULT_PREFILL_CHUNK))]
        if getattr(args, "host_threads", None) is not None:
            cmd += ["--host-threads", str(args.host_threads)]
    return cmd


def _systems(text: str, allowed: Sequence[str] = SYSTEMS) -> list[str] | None:
    systems = [s for s in text.split(",") if s]
    if not systems or any(s not in allowed for s in systems):
        print(f"unknown system in {text!r} ({', '.join(allowed)})", file=sys.stderr)
        return None
    if len(set(systems)) != len(systems):
        print(f"a system is named twice in {text!r}", file=sys.stderr)
        return None
    return systems


def check_engine_args(args: argparse.Namespace, systems: list[str]) -> bool:
    """Refuse engine settings the tree systems cannot honour; default the checkpoints of a tree comparison
    to 1K..128K. False (after saying why) to refuse."""
    trees = [s for s in systems if s in TREE_BUDGETS]
    if args.tree_top_k is not None and args.tree_top_k < 1:
        print(f"--tree-top-k must be >= 1, got {args.tree_top_k}", file=sys.stderr)
        return False
    if trees and args.elpis_loop == "direct":
        print(
            f"{', '.join(trees)} need the speculation core (--elpis-loop spec): the direct loop runs chains",
            file=sys.stderr,
        )
        return False
    if args.final_tokens is not None and args.final_tokens < 0:
        print(f"--final-tokens must be >= 0, got {args.final_tokens}", file=sys.stderr)
        return False
    if args.rounds < 1 or args.warmup < 0:
        print(f"--rounds must be >= 1 and --warmup >= 0, got {args.rounds}, {args.warmup}", file=sys.stderr)
        return False
    if args.checkpoints is not None:
        try:
            points = [int(x) for x in args.checkpoints.split(",") if x]
        except ValueError:
            points = []
        if not points or any(not 1 <= c <= 262_000 for c in points) or points != sorted(set(points)):
            print(
                f"--checkpoints {args.checkpoints!r}: give increasing token counts in 1..262000",
                file=sys.stderr,
            )
            return False
    elif trees:
        args.checkpoints = ",".join(str(c) for c in TREE_CHECKPOINTS)
    return True


def run_profile(args: argparse.Namespace) -> int:
    """`elpis bench profile`: both systems' per-phase GPU time in one run (bench/results/profile-*)."""
    import torch

    from elpis.bench import hardware, phase_report

    systems = _systems(args.systems, PROFILE_SYSTEMS)
    if systems is None:
        return 2
    if len([s for s in systems if s != "stock"]) > 1:
        print("profile one elpis system per run (one mode per backend)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("elpis bench profile needs a CUDA GPU", file=sys.stderr)
        return 2
    end = time.time() + args.time_limit
    facts = hardware.machine_facts()
    stem = args.stem or f"profile-{time.strftime('%Y-%m-%d')}-{facts.get('gpu', 'gpu').replace(' ', '_')}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {
        "title": args.title or f"Per-phase GPU time, stock ExLlamaV3 vs elpis, {facts.get('gpu')}",
        "model_note": args.model_note,
        "facts": facts,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "systems": {},
    }
    extra = profile_worker_args(args)
    run_workers(args, systems, doc, end, stem, lambda: phase_report.write(doc, args.out_dir, stem), extra)
    for path in phase_report.write(doc, args.out_dir, stem):
        print(f"wrote {path}")
    print(phase_report.markdown(doc))
    return 0
