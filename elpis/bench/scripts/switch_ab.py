"""A/B (GPU machine, after `elpis build` and the full-size synth in /tmp/full): registry switches off against
on, two backends of the served tree-16 configuration side by side in one process (`elpis.bench.rounds_ab`).

Each `--switches` id is set to 0 for arm "off" and to 1 for arm "on" while that arm's backend loads (every
switch is read at load: the layers marked, the graphs captured, the drafter made); the other switches keep
the registry's defaults in both. The arms then serve the same greedy requests alternately, so what separates
them is the switches alone: same machine, same clocks, same process. Switches that keep every bit (the
same-bits patches, and the draft candidates, which shape only the tree) must give identical tokens, which is
checked. Prints one line "SWITCHAB {json}" per context (median round ms and MAD per arm, the gain of "on" and
the noise rule's verdict, and each arm's host time per round where its rounds run on the GPU), and with
`--profile-rounds N` one line "SWITCHPROF {json}" (GPU span, busy, idle and kernels per round of each arm, and
the kernels whose time differs most); every line's document goes to `--out`.
Usage (repo root):
  python3 elpis/bench/scripts/switch_ab.py MODEL DRAFT --switches ID[,ID...] --out FILE.json
      [--contexts 1024,8192] [--tokens 40] [--pairs 3] [--budget 16] [--profile-rounds 16]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from elpis.bench import rounds_ab as ab

ARMS = ("off", "on")


def switch_env(ids: list[str]) -> dict[str, str]:
    """The environment variable of each registry switch id (refusing an unknown id)."""
    from elpis.exl3.patches import load_registry

    by_id = {p.id: p.switch for p in load_registry()}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise SystemExit(f"not registry patches: {', '.join(unknown)}")
    return {i: by_id[i] for i in ids}


def load_arm(model: Path, draft: Path, env: dict[str, str], value: str) -> Any:
    """A tree-16 backend loaded with every listed switch set to `value` (the environment restored after)."""
    from elpis.exl3 import load_backend

    before = {var: os.environ.get(var) for var in env.values()}
    os.environ.update({var: value for var in env.values()})
    try:
        backend = load_backend(model, draft, max_context=262_144, model_id="bench", tree=True)
    finally:
        for var, old in before.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
    backend.prefix.enabled = False  # every request prefills: no pair reuses another's pages
    return backend


def main() -> None:
    parser = ab.arguments(__doc__.splitlines()[0])
    parser.add_argument("--switches", required=True)
    args = parser.parse_args()
    env = switch_env(args.switches.split(","))

    from elpis.bench.worker import BenchDecoder
    from elpis.bench.workload import prompt as make_prompt

    backends = {arm: load_arm(args.model, args.draft, env, str(i)) for i, arm in enumerate(ARMS)}
    decoder = BenchDecoder(args.model)
    docs = []
    for context in (int(c) for c in args.contexts.split(",")):
        base = make_prompt(context + 1, seed=context, vocab=backends["off"].info.vocab_size)
        seconds = ab.alternate(
            ARMS, args.pairs,
            lambda arm, base=base: ab.rounds_of(backends[arm], decoder, base, args.tokens, args.budget),
            f"context {context}",
        )  # fmt: skip
        doc = {"context": context, "switches": list(env)} | ab.compare(seconds, "off", "on")
        # each arm's host time per round where its rounds run on the GPU (None: host rounds)
        doc["host_time"] = {
            arm: ab.device_host_time(backends[arm], decoder, base, args.tokens, args.budget) for arm in ARMS
        }
        docs.append(doc)
        print("SWITCHAB " + json.dumps(doc), flush=True)
        if args.profile_rounds:
            rounds, budget = args.profile_rounds, args.budget
            profiles = {arm: ab.profiled_rounds(backends[arm], decoder, base, rounds, budget) for arm in ARMS}
            prof = {"context": context, "rounds": rounds} | ab.profile_difference(profiles, *ARMS)
            docs.append(prof)
            print("SWITCHPROF " + json.dumps(prof), flush=True)
    args.out.write_text(json.dumps(docs, indent=1) + "\n")


if __name__ == "__main__":
    main()
