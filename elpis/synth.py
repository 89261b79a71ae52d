"""`elpis synth`: write synthetic checkpoints.

--tiny  a random-weight Qwen3.8-architecture model on the CPU (real vocabulary, a few layers), for tests.
--full  the exact Qwen3.8-27B target shapes as EXL3 4.00 bpw with a 6 bpw head (GPU).
--draft the DFlash2 draft with the published shapes (GPU).
--small the same structure as --full, scaled down, for quick GPU tests.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--tiny", action="store_true", help="tiny random Qwen3.8-architecture model (CPU)")
    kind.add_argument("--full", action="store_true", help="exact Qwen3.8-27B target, EXL3 4.00/6 bpw (GPU)")
    kind.add_argument("--draft", action="store_true", help="DFlash2 draft with the published shapes (GPU)")
    kind.add_argument("--small", action="store_true", help="scaled-down EXL3 target + draft (GPU)")
    parser.add_argument("out", type=Path, help="output directory (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (output is deterministic per seed)")


def run(args: argparse.Namespace) -> int:
    if args.out.exists():
        raise SystemExit(f"elpis synth: {args.out} already exists; refusing to overwrite")
    if args.tiny:
        from elpis.reference.synth import write_tiny

        write_tiny(args.out, seed=args.seed)
    else:
        from elpis.exl3.synth import write_draft, write_full, write_small

        {"full": write_full, "draft": write_draft, "small": write_small}[
            "full" if args.full else "draft" if args.draft else "small"
        ](args.out, seed=args.seed)
    print(f"wrote {args.out}")
    return 0
