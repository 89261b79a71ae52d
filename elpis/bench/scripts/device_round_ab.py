"""A/B (GPU machine, after `elpis build` and the full-size synth in /tmp/full): greedy tree rounds decided on
the host against rounds decided on the GPU (`elpis.exl3.device_round`, registry switch exl3-device-rounds),
in one process on one backend (`elpis.bench.rounds_ab`).

Loads the served configuration with the embedding gather and device rounds switched on (both needed by the
device rounds; the host rounds run with the gather too, so the arms differ only in who decides), then for each
context: `--pairs` pairs of requests of `--tokens` greedy tokens after a warm-up, the arms alternating (host
rounds: the backend's `device_rounds` detached, so the generator runs its host loop). Random weights: every
draft is rejected and a round commits one token, so a round's time is a step's. Per arm: the median round time
and its MAD pooled over the pairs, and the noise rule of `elpis.bench.report` (NOISE_MADS x the larger MAD).
The two arms' tokens must be identical (both are plain decoding's). Then one more request with rounds on
the GPU measures the host's own time per round (`rounds_ab.host_time`: wall less the waits on the GPU).
Prints one line "DEVROUNDAB {json}" per context and writes every line's document to `--out`.
With `--profile-rounds N`, one more request per arm and context runs under the CUDA profiler for N rounds
after the warm-up: its GPU milliseconds per round (span, busy as the union of kernel intervals, idle, kernels
launched) and every kernel's time per round by name, then the names whose time differs most between the arms
(device minus host), one line "DEVROUNDPROF {json}" per context, written beside the A/B in `--out`. It answers
where a device round's time goes against a host round's: idle gaps the host left, or kernels it added.
Usage (repo root):
  python3 elpis/bench/scripts/device_round_ab.py MODEL DRAFT --out FILE.json [--contexts 1024,8192]
      [--tokens 40] [--pairs 3] [--budget 16] [--profile-rounds 16]
"""

from __future__ import annotations

import json

from elpis.bench import rounds_ab as ab


def main() -> None:
    parser = ab.arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    from elpis.bench.workload import prompt as make_prompt

    backend, decoder = ab.load_ab(args.model, args.draft)
    device = backend.device_rounds

    def attach(arm: str) -> None:  # host rounds: the device rounds detached, so the generator runs its loop
        backend.device_rounds = device if arm == "device" else None

    on = ab.arm_runner(backend, decoder, attach, lambda: attach("device"))
    arms = ("host", "device")
    docs = []
    for context in (int(c) for c in args.contexts.split(",")):
        base = make_prompt(context + 1, seed=context, vocab=backend.info.vocab_size)
        rounds_before = device.rounds
        doc = {"context": context} | ab.compare_arms(on, arms, base, args, f"context {context}")
        doc["device_rounds_run"] = device.rounds - rounds_before
        # one more request on the GPU's rounds: the host's own time per round (issue 9: <= 0.2 ms)
        doc["device_host_time"] = ab.device_host_time(backend, decoder, base, args.tokens, args.budget)
        docs.append(doc)
        print("DEVROUNDAB " + json.dumps(doc), flush=True)
        if args.profile_rounds:
            prof = {"context": context} | ab.profile_arms(on, arms, base, args)
            docs.append(prof)
            print("DEVROUNDPROF " + json.dumps(prof), flush=True)
    args.out.write_text(json.dumps(docs, indent=1) + "\n")


if __name__ == "__main__":
    main()
