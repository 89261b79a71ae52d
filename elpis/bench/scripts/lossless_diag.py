"""Diagnostic (run on the GPU machine, `python3 elpis/bench/scripts/lossless_diag.py CONFIG` after
`elpis synth --small /tmp/small`): where does chain speculation stop being bit-identical to plain decoding?

CONFIG names what to vary: `replay-*` proposes the known plain continuation (drafts accepted), `draft-*` runs
the DFlash2 draft (random weights: every draft rejected); `fp32` stores the Gated DeltaNet state in fp32;
`nopad` verifies as many rows as asked instead of a fixed 8. Acceptance is decided by the test oracle.
Prints one JSON line: the first diverging token of each prompt (null: identical for 96 tokens).
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

from elpis.exl3.backend import Exl3Backend
from elpis.exl3.engine import load_engine
from tests.exl3.test_gpu import ReplayDrafter, oracle_generate, prompt


def main(cfg: str) -> None:
    dtype = torch.float if "fp32" in cfg else torch.half
    engine = load_engine(
        "/tmp/small/target",
        "/tmp/small/draft",
        cache_tokens=65536,
        warmup=False,
        progress=False,
        recurrent_dtype=dtype,
    )
    backend = Exl3Backend(
        engine,
        model_id="diag",
        max_context=60000,
        fixed_rows=None if "nopad" in cfg else 8,
        prefix_cache=False,
    )
    out = {"config": cfg, "env": {k: v for k, v in os.environ.items() if k.startswith("EXL3_")}, "runs": []}
    for seed in (3, 13, 23):
        ids = prompt(1500, seed, backend.info.vocab_size)
        plain, _, _ = oracle_generate(backend, ids, 96)
        drafter = ReplayDrafter(len(ids), plain) if "replay" in cfg else backend.drafter
        other, _, rounds = oracle_generate(backend, ids, 96, drafter=drafter)
        first = next((i for i, (x, y) in enumerate(zip(plain, other, strict=True)) if x != y), None)
        out["runs"].append(
            {
                "seed": seed,
                "first_divergence": first,
                "rounds": len(rounds),
                "accepted_rounds": sum(r > 1 for r in rounds),
            }
        )
    print("DIAG " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
