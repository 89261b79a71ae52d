"""Layer-major prefill groups (patch exl3-prefill-groups): speed and bit-identity against chunk-by-chunk.

Loads the served backend once (tree mode, prefix cache off so every prefill is cold), then for `--reps`
repetitions prefills each prompt with each group size in turn (alternating, so drift hits both alike) and
runs one 8-row verify after it. Prints one JSON line per prefill (tokens per second, peak memory of the
prefill, whether the verify's logits are bitwise those of the first group size listed), then one summary line
per prompt (median tokens per second per group size). A group size written `16s` runs with the embedding
gathered for every chunk before the first block (`prefill_groups.OVERLAP_EMBEDDING` off, the order before
session 18). GPU only. Usage (repo root, with ELPIS_PATCH_PREFILL_GROUPS=1):
  python3 elpis/bench/scripts/prefill_group_probe.py MODEL DRAFT [--groups 1,4,16s] [--prompts 8229,32768]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("draft")
    p.add_argument("--groups", default="1,4")
    p.add_argument("--prompts", default="8229,32768")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    labels = args.groups.split(",")
    groups = {label: int(label.rstrip("s")) for label in labels}
    lengths = [int(n) for n in args.prompts.split(",")]
    from elpis.exl3 import load_backend, prefill_groups
    from elpis.exl3.prefill_groups import counts

    largest = max(groups.values())
    be = load_backend(args.model, args.draft, prefix_cache=False, tree=True, prefill_group=largest)
    vocab = be.info.vocab_size
    first: dict[int, torch.Tensor] = {}
    speeds: dict[tuple[str, int], list[float]] = {}
    for rep in range(args.reps):
        for n in lengths:
            for label, group in groups.items():
                be.prefill_group = group
                prefill_groups.OVERLAP_EMBEDDING = not label.endswith("s")
                rng = random.Random(n)
                prompt = [rng.randrange(vocab) for _ in range(n)]
                torch.cuda.reset_peak_memory_stats()
                reused = counts["reused"]
                be.begin(prompt)
                seconds = be.last_prefill_seconds
                peak = torch.cuda.max_memory_allocated() / 2**30
                rows = [prompt[-1]] + [rng.randrange(vocab) for _ in range(7)]
                logits = be.verify(rows, list(range(-1, 7))).cpu()
                be.finish()  # drops the uncommitted verify with the sequence
                record = {
                    "rep": rep, "group": label, "prompt": n, "prefill_s": round(seconds, 4),
                    "tok_per_s": round((n - 1) / seconds), "peak_gib": round(peak, 2),
                    "weights_reused": counts["reused"] - reused,
                }  # fmt: skip
                if n in first:
                    record["bitwise_same_as_first"] = bool(torch.equal(logits, first[n]))
                else:
                    first[n] = logits
                speeds.setdefault((label, n), []).append(record["tok_per_s"])
                print(json.dumps(record), flush=True)
    for n in lengths:
        medians = {g: statistics.median(speeds[(g, n)]) for g in groups}
        base = medians[labels[0]]
        print(json.dumps({
            "prompt": n, "median_tok_per_s": medians,
            "speedup_vs_first": {g: round(m / base, 3) for g, m in medians.items()},
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
