"""Prefill chunk size: speed and exactness against the 2048-token chunks elpis prefills with (issue 10).

Loads the backend once (warmed up for the largest chunk, prefix cache off so every prefill is cold), then for
each chunk size prefills the same random prompts and runs one verify of 8 rows after each: prints one JSON
line per (chunk, prompt) with the prefill's tokens per second and whether the verify's logits are bitwise
those of the first chunk size listed (else their largest difference). GPU only. Usage (repo root):
  python3 elpis/bench/scripts/prefill_chunk_probe.py MODEL DRAFT [--chunks 2048,8192] [--prompts 8229,32768]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("draft")
    p.add_argument("--chunks", default="2048,4096,8192")
    p.add_argument("--prompts", default="8229,32768,131072")
    args = p.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    lengths = [int(n) for n in args.prompts.split(",")]
    from elpis.exl3 import load_backend

    # loaded (and ExLlamaV3's scratch sized) for the largest chunk; each pass below prefills with its own
    be = load_backend(args.model, args.draft, prefix_cache=False, prefill_chunk=max(chunks))
    vocab = be.info.vocab_size
    first: dict[int, torch.Tensor] = {}
    for chunk in chunks:
        be.engine.prefill_chunk = chunk
        for n in lengths:
            rng = random.Random(n)
            prompt = [rng.randrange(vocab) for _ in range(n)]
            be.begin(prompt)
            seconds = be.last_prefill_seconds
            rows = [prompt[-1]] + [rng.randrange(vocab) for _ in range(7)]
            logits = be.verify(rows, list(range(-1, 7))).cpu()
            be.finish()  # drops the uncommitted verify with the sequence
            record = {
                "chunk": chunk, "prompt": n, "prefill_s": round(seconds, 3),
                "tok_per_s": round((n - 1) / seconds),
                "logits_sha": hashlib.sha256(logits.numpy()).hexdigest()[:16],
            }  # fmt: skip
            if n in first:
                diff = (logits - first[n]).abs()
                record["same_as_first_chunk"] = bool(torch.equal(logits, first[n]))
                record["max_abs_diff"] = float(diff.max())
                record["argmax_same"] = bool(torch.equal(logits.argmax(-1), first[n].argmax(-1)))
            else:
                first[n] = logits
            print(json.dumps(record), flush=True)
    print(json.dumps({"peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)


if __name__ == "__main__":
    main()
