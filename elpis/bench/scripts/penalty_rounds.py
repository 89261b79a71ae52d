"""What penalties cost a round (GPU machine, after `elpis build` and the full-size synth in /tmp/full): the
served tree-16 configuration serves the same prompt with and without `presence_penalty` 1.5, greedy and
sampled (Qwen's recommended non-thinking settings), alternating the arms in one process
(`elpis.bench.rounds_ab`).

A greedy request without adjustments runs its rounds on the GPU; with a penalty it runs host rounds (the
GPU's rounds take the raw argmax), and every row is adjusted on the host's schedule (`elpis.spec.penalties`).
A sampled request runs host rounds either way, so its two arms differ by the adjustment alone. The arms'
tokens differ by design; each arm's repeated requests must give identical tokens (checked). Prints one line
"PENALTYAB {json}" per context (median round ms and MAD per arm after the warm-up rounds, and what the penalty
adds to each kind of request); the documents go to `--out`.
With --grammar, two more arms hold the greedy and the sampled request to a JSON schema (`elpis.spec.grammar`:
every row masked on the host, rounds on the host), and a third holds the greedy one to a schema that opens
only at `<tool_call>` (as tool_choice auto's grammar does), which a random model never writes: its rounds
stay on the GPU (`elpis.spec.generate`).
With --device-draw, one more arm is the sampled request with registry patch exl3-sample-draw's draw installed
for its requests (`elpis.exl3.sample_draw`): its tokens must be the sampled arm's, and "device_draw_saves_ms"
is what it saves a round.
With --gpu-sampled, one more arm is the sampled request with its rounds on the GPU (`DeviceRounds.draws`: its
rows drawn there by the same kernel, session 56), checked to run there: its tokens must be the sampled
arm's, and "gpu_rounds_save_ms" is what it saves a round against the sampled request's host rounds.
With --gpu-adjusted, two more arms are the penalised requests (greedy and sampled, `presence_penalty` 1.5)
with their rows adjusted on the GPU and their rounds there (registry patch exl3-round-adjust): their tokens
must be the host-round arms', and "gpu_adjusted_saves_ms" is what they save a round.
With --gpu-vocab, eight more arms are sampled requests without top_k, as OpenAI clients send them (temperature
alone, temperature with top_p 0.8, warm and cold, and min_p 0.05), on host rounds and with their rounds on the
GPU (registry patches exl3-vocab-draw, -heads and -nucleus, sessions 57 and 59): the GPU arms' tokens must be
the host arms', and "gpu_vocab_saves_ms" is what they save a round. A random model's rows are flat, so top_p's
prefix and min_p's cut run past the 256 weights the head reads: the nucleus decides those rows (session 59),
and every round of a GPU arm must run on the GPU (the JSON still counts each arm's undrawn rounds).
With --gpu-logprobs, four more arms ask for logprobs (top_logprobs 5), greedy and sampled: on host rounds,
and with their rounds on the GPU (registry patch exl3-round-logprobs, session 58); each GPU arm's tokens and
log-probabilities must be its host twin's, and "gpu_logprobs_saves_ms" is what its rounds save.
Usage (repo root):
  python3 elpis/bench/scripts/penalty_rounds.py MODEL DRAFT --out FILE.json [--contexts 1024,8192]
      [--tokens 40] [--pairs 3] [--budget 16] [--grammar] [--device-draw] [--gpu-sampled] [--gpu-adjusted]
      [--gpu-vocab] [--gpu-logprobs]
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from typing import Any

from elpis.bench import rounds_ab as ab

RECOMMENDED = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": 3}
VOCAB_ARMS: dict[str, dict[str, Any]] = {  # with --gpu-vocab: what OpenAI clients send, no top_k
    "temperature": {"temperature": 0.8, "seed": 4},
    "top_p": {"temperature": 0.7, "top_p": 0.8, "seed": 5},
    # a random model's rows are flat, so top_p's prefix runs past the head's 256 weights (for the nucleus);
    # cold, they are peaked as a real model's, and the head decides
    "top_p-cold": {"temperature": 0.1, "top_p": 0.8, "seed": 6},
    "min_p": {"temperature": 1.0, "min_p": 0.05, "seed": 7},  # flat rows: min_p's cut past the head too
}
LOGPROBS_ARMS: dict[str, dict[str, Any]] = {  # with --gpu-logprobs: five alternatives a token, as UIs ask
    "greedy+logprobs": {"top_logprobs": 5},
    "sampled+logprobs": {**RECOMMENDED, "top_logprobs": 5, "gpu_sampled": True},
}
# A JSON schema whose one string the random model fills for the whole request: rows masked inside a string.
TEXT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
ARMS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "greedy+presence": {"presence_penalty": 1.5},
    "sampled": RECOMMENDED,
    "sampled+presence": {**RECOMMENDED, "presence_penalty": 1.5},
}
GRAMMAR_ARMS: dict[str, dict[str, Any]] = {  # with --grammar: the same two requests held to TEXT_SCHEMA
    "greedy+json": {"grammar": TEXT_SCHEMA},
    "sampled+json": {**RECOMMENDED, "grammar": TEXT_SCHEMA},
    # as tool_choice auto's grammar: it opens at <tool_call> (its id set in main), which a random model never
    # writes, so its rounds run on the GPU, each ending at that token if it came
    "greedy+closed": {"grammar": TEXT_SCHEMA, "opens_after": ()},
}


def rounds_of(backend: Any, decoder: Any, prompt: list[int], tokens: int, budget: int,
              arm: dict[str, Any], vocabulary: Any = None) -> tuple[list[int], list[float], int]:
    """One request through the speculation core with the draft's trees: its tokens, each round's seconds
    after the warm-up rounds (the first step holds the prefill) and its undrawn rounds. An arm's "grammar" is
    a JSON schema over `vocabulary` (a grammar ends the request when complete, so it keeps the model's end of
    sequence)."""
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
    from elpis.spec import sampling as sampler
    from elpis.spec.grammar import Grammar

    switches = ("grammar", "opens_after", "device_draw", "gpu_sampled", "gpu_adjusted", "gpu_vocab",
                "gpu_logprobs", "top_logprobs")
    sampling = {k: v for k, v in arm.items() if k not in switches}
    grammar = None
    if "grammar" in arm:
        opens = tuple(arm["opens_after"]) if "opens_after" in arm else ()
        grammar = Grammar.json_schema(vocabulary, arm["grammar"], opens)
    gen = SpeculativeGenerator(backend, decoder, drafter=backend.drafter, tree_budget=budget, draft_top_k=4)
    request = GenerationRequest(prompt_ids=tuple(prompt), max_tokens=tokens,
                                sampling=SamplingParams(**sampling), ignore_eos=grammar is None,
                                grammar=grammar, top_logprobs=arm.get("top_logprobs"))  # fmt: skip
    out: list[Any] = []  # the tokens; with logprobs, (token, its log-probabilities) pairs
    undrawn = 0
    rounds = backend.device_rounds
    on_gpu = bool(arm.get("gpu_sampled") or arm.get("gpu_adjusted") or arm.get("gpu_vocab"))
    if "top_logprobs" in arm:  # its rounds run on the GPU only where they report logprobs
        on_gpu = bool(arm.get("gpu_logprobs"))
    kept = ((rounds.sampled, rounds.adjusting, rounds.whole_vocab, rounds.vocab_heads, rounds.vocab_nucleus,
             rounds.reports_logprobs) if rounds is not None else (False,) * 6)
    read_before = rounds.rounds if rounds is not None else 0
    if on_gpu and rounds is None:
        raise SystemExit("--gpu-sampled and --gpu-adjusted need rounds on the GPU (exl3-device-rounds)")
    if arm.get("device_draw") or arm.get("gpu_sampled"):
        from elpis.exl3 import sample_draw

        sample_draw.load()
    if arm.get("gpu_adjusted"):
        from elpis.exl3 import round_adjust

        round_adjust.load()
    if arm.get("gpu_vocab"):
        from elpis.exl3 import vocab_draw

        vocab_draw.load()
    if arm.get("device_draw"):
        sampler.use_device_draw(sample_draw.draw)
    if rounds is not None:  # sampled and adjusted rounds on the GPU in their own arms only, switches aside
        rounds.sampled, rounds.adjusting = bool(arm.get("gpu_sampled")), bool(arm.get("gpu_adjusted"))
        rounds.whole_vocab = rounds.vocab_heads = rounds.vocab_nucleus = bool(arm.get("gpu_vocab"))
        rounds.reports_logprobs = bool(arm.get("gpu_logprobs"))
    try:
        stamps = [time.perf_counter()]
        for step in gen.generate(request):
            stamps.append(time.perf_counter())
            out += step.token_ids if step.logprobs is None else list(zip(step.token_ids, step.logprobs,
                                                                          strict=True))
            if step.stats is not None:
                undrawn = step.stats.faults_detected.get("undrawn", 0)
    finally:
        sampler.use_device_draw(None)
        if rounds is not None:
            (rounds.sampled, rounds.adjusting, rounds.whole_vocab, rounds.vocab_heads, rounds.vocab_nucleus,
             rounds.reports_logprobs) = kept
    if on_gpu and rounds.rounds - read_before < len(stamps) - 2:
        raise SystemExit(f"the GPU ran {rounds.rounds - read_before} of the request's {len(stamps) - 2} "
                         "rounds")  # fmt: skip
    seconds = [b - a for a, b in itertools.pairwise(stamps[1:])]
    return out, seconds[ab.WARMUP_ROUNDS:], undrawn


def main() -> None:
    from elpis.bench.report import mad_ms
    from elpis.bench.workload import prompt as make_prompt

    parser = ab.arguments(__doc__.splitlines()[0])
    parser.add_argument("--grammar", action="store_true", help="also time requests held to a JSON schema")
    parser.add_argument("--device-draw", action="store_true",
                        help="also time the sampled request drawn by exl3-sample-draw's kernel")
    parser.add_argument("--gpu-sampled", action="store_true",
                        help="also time the sampled request with its rounds on the GPU")
    parser.add_argument("--gpu-adjusted", action="store_true",
                        help="also time the penalised requests with their rows adjusted on the GPU")
    parser.add_argument("--gpu-vocab", action="store_true",
                        help="also time sampled requests without top_k, on host rounds and on the GPU")
    parser.add_argument("--gpu-logprobs", action="store_true",
                        help="also time requests with logprobs, on host rounds and on the GPU")
    args = parser.parse_args()
    backend, decoder = ab.load_ab(args.model, args.draft)
    arms = {**ARMS, **(GRAMMAR_ARMS if args.grammar else {})}
    if args.device_draw:
        arms["sampled+device-draw"] = {**RECOMMENDED, "device_draw": True}
    if args.gpu_sampled:
        arms["sampled-gpu-rounds"] = {**RECOMMENDED, "gpu_sampled": True}
    if args.gpu_adjusted:
        arms["greedy+presence-gpu-rounds"] = {**ARMS["greedy+presence"], "gpu_adjusted": True}
        arms["sampled+presence-gpu-rounds"] = {**ARMS["sampled+presence"], "gpu_sampled": True,
                                               "gpu_adjusted": True}  # fmt: skip
    if args.gpu_vocab:
        for name, arm in VOCAB_ARMS.items():
            arms[name] = arm
            arms[f"{name}-gpu-rounds"] = {**arm, "gpu_vocab": True}
    if args.gpu_logprobs:
        for name, arm in LOGPROBS_ARMS.items():
            arms[name] = arm
            arms[f"{name}-gpu-rounds"] = {**arm, "gpu_logprobs": True}
    same_as = {"sampled+device-draw": "sampled", "sampled-gpu-rounds": "sampled",
               **{f"{name}-gpu-rounds": name for name in LOGPROBS_ARMS},
               **{f"{name}-gpu-rounds": name for name in VOCAB_ARMS},
               "greedy+presence-gpu-rounds": "greedy+presence",
               "sampled+presence-gpu-rounds": "sampled+presence"}  # arms whose tokens must be another's
    vocabulary = None
    if args.grammar:
        from elpis.spec.grammar import GrammarTokenizer
        from elpis.text import load_tokenizer

        tokenizer = load_tokenizer(args.model)
        vocabulary = GrammarTokenizer(tokenizer.backend.to_str(), backend.info.vocab_size,
                                      backend.info.stop_token_ids)
        tool_call = tokenizer.encode("<tool_call>", special=True)
        if len(tool_call) != 1:
            raise SystemExit(f"<tool_call> is not one token in this vocabulary: {tool_call}")
        arms["greedy+closed"] = {**arms["greedy+closed"], "opens_after": tuple(tool_call)}
    names = list(arms)
    documents = []
    for ctx in (int(c) for c in args.contexts.split(",")):
        prompt = make_prompt(ctx, 31, backend.info.vocab_size)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        tokens: dict[str, list[int]] = {}
        undrawn: dict[str, int] = dict.fromkeys(names, 0)
        for pair in range(args.pairs + 1):  # the first pass warms every arm up and is not timed
            for name in names if pair % 2 else names[::-1]:
                out, times, missed = rounds_of(backend, decoder, prompt, args.tokens, args.budget, arms[name],
                                               vocabulary)  # fmt: skip
                undrawn[name] += missed
                if tokens.setdefault(name, out) != out:
                    raise SystemExit(f"context {ctx}, arm {name}: two requests gave different tokens")
                twin = same_as.get(name)
                if twin is not None and tokens.get(twin, out) != out:
                    raise SystemExit(f"context {ctx}: arm {name}'s tokens are not arm {twin}'s")
                if pair:
                    seconds[name] += times
        median = {n: statistics.median(s) * 1000 for n, s in seconds.items()}
        doc = {
            "context": ctx, "tokens": args.tokens, "pairs": args.pairs, "budget": args.budget,
            "rounds_per_arm": {n: len(s) for n, s in seconds.items()},
            "round_median_ms": median, "round_mad_ms": {n: mad_ms(s) for n, s in seconds.items()},
            "presence_adds_ms": {"greedy": median["greedy+presence"] - median["greedy"],
                                 "sampled": median["sampled+presence"] - median["sampled"]},
            **({"grammar_adds_ms": {"greedy": median["greedy+json"] - median["greedy"],
                                    "sampled": median["sampled+json"] - median["sampled"],
                                    "greedy_closed": median["greedy+closed"] - median["greedy"]}}
               if args.grammar else {}),
            **({"device_draw_saves_ms": median["sampled"] - median["sampled+device-draw"]}
               if args.device_draw else {}),
            **({"gpu_rounds_save_ms": median["sampled"] - median["sampled-gpu-rounds"],
                "gpu_sampled_over_greedy_ms": median["sampled-gpu-rounds"] - median["greedy"]}
               if args.gpu_sampled else {}),
            **({"gpu_adjusted_saves_ms": {
                "greedy": median["greedy+presence"] - median["greedy+presence-gpu-rounds"],
                "sampled": median["sampled+presence"] - median["sampled+presence-gpu-rounds"]}}
               if args.gpu_adjusted else {}),
            **({"gpu_vocab_saves_ms": {name: median[name] - median[f"{name}-gpu-rounds"] for name in
            VOCAB_ARMS},
                "gpu_vocab_over_greedy_ms": {name: median[f"{name}-gpu-rounds"] - median["greedy"]
                                             for name in VOCAB_ARMS},
                "undrawn_rounds": undrawn} if args.gpu_vocab else {}),
            **({"gpu_logprobs_saves_ms": {name: median[name] - median[f"{name}-gpu-rounds"]
                                          for name in LOGPROBS_ARMS}} if args.gpu_logprobs else {}),
            "rounds_on_the_gpu": backend.device_rounds is not None,
        }  # fmt: skip
        print("PENALTYAB " + json.dumps(doc), flush=True)
        documents.append(doc)
    from elpis.bench.hardware import machine_facts

    # the GPU, the software versions and the revision beside the figures
    report = {"machine": machine_facts(), "arms": arms, "contexts": documents}
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
