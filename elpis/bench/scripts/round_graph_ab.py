"""A/B (GPU machine, after `elpis build` and the full-size synth in /tmp/full): rounds on the GPU queued piece
by piece against the same rounds as one composed graph launch a round key (`elpis.exl3.round_graph`, registry
switch exl3-round-graph), in one process on one backend (`elpis.bench.rounds_ab`).

For each context: `--pairs` pairs of requests of `--tokens` greedy tokens after a warm-up pair (which composes
the keys' graphs), the arms alternating; per arm the median round time, its MAD and the noise rule's verdict;
both arms' tokens must be identical. Then one request per arm measures the host's own time per round
(`rounds_ab.host_time`: wall less the waits on the GPU; issue 9's target is 0.2 ms), and the graphs composed
and launched and the host's time composing. With `--profile-rounds N`, one more request per arm runs under the
CUDA profiler (GPU span, busy, idle and kernels per round, and the kernels whose time differs most).
Prints one line "ROUNDGRAPHAB {json}" per context (and "ROUNDGRAPHPROF {json}") and writes them to `--out`.
Usage (repo root):
  python3 elpis/bench/scripts/round_graph_ab.py MODEL DRAFT --out FILE.json [--contexts 1024,8192]
      [--tokens 40] [--pairs 3] [--budget 16] [--profile-rounds 16]
"""

from __future__ import annotations

import json

from elpis.bench import rounds_ab as ab


def main() -> None:
    parser = ab.arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    from elpis.bench.workload import prompt as make_prompt
    from elpis.exl3.round_graph import CudaComposer, RoundGraphs

    backend, decoder = ab.load_ab(args.model, args.draft)
    rounds = backend.device_rounds
    graphs = rounds.round_graphs or RoundGraphs(CudaComposer(backend.engine.device))

    def attach(arm: str) -> None:
        rounds.round_graphs = graphs if arm == "graph" else None

    on = ab.arm_runner(backend, decoder, attach, lambda: attach("graph"))
    arms = ("pieces", "graph")
    docs = []
    for context in (int(c) for c in args.contexts.split(",")):
        base = make_prompt(context + 1, seed=context, vocab=backend.info.vocab_size)
        launches = graphs.launches
        doc = {"context": context} | ab.compare_arms(on, arms, base, args, f"context {context}")
        doc["graph_launches"] = graphs.launches - launches
        doc["host_time"] = {arm: on(arm, ab.device_host_time, base, args.tokens, args.budget) for arm in arms}
        doc["composed"], doc["compose_ms_total"] = graphs.composed, graphs.compose_seconds * 1000
        docs.append(doc)
        print("ROUNDGRAPHAB " + json.dumps(doc), flush=True)
        if args.profile_rounds:
            prof = {"context": context} | ab.profile_arms(on, arms, base, args)
            docs.append(prof)
            print("ROUNDGRAPHPROF " + json.dumps(prof), flush=True)
    args.out.write_text(json.dumps(docs, indent=1) + "\n")


if __name__ == "__main__":
    main()
