"""One system's engine measurement, run in its own process (`python -m elpis.bench.worker`).

Both systems run the same schedule on the same checkpoint and the same prompt:
  warm-up (untimed) -> for each context checkpoint c (1K, 8K, 32K, 128K, 262K): one prompt of c + 1 tokens
  that extends the previous one, so the prefill is cumulative (the prefix cache serves the previous
  checkpoint's tokens; TTFT(c) is the sum of the incremental prefill times, see report.py), then `rounds`
  speculative rounds (DFlash2 chain, 8 rows) and `rounds` plain decode steps, each after `warmup` untimed
  ones -> fresh TTFT at 8K and 32K (new prompts, nothing cached) while time remains.

stock: ExLlamaV3's own Generator (DFlash2 draft, ArgmaxSampler, its own accept-while-match), plain steps by
switching its draft window to 0 inside the same job. elpis: `elpis.spec.SpeculativeGenerator` over
`Exl3Backend` with the proven acceptor (chain, draft_top_k=1); plain steps through the same generator without
a drafter and without row padding. With random weights every draft is rejected: one token per round.

Results are written to `--out` after every step, so a run cut short by its deadline still reports what it
measured; `complete` says whether everything ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from elpis.bench import hardware, workload

GiB = 1 << 30
FRESH = ((8192, 2), (32768, 1))


class Results:
    def __init__(self, path: Path, system: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "system": system,
            "checkpoints": [],
            "fresh_ttft": [],
            "errors": [],
            "complete": False,
        }

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def median_ms(seconds: list[float]) -> float | None:
    return statistics.median(seconds) * 1000 if seconds else None


def peak_memory() -> dict[str, float]:
    out = {
        "max_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
        "max_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
    }
    try:
        free, total = torch.cuda.mem_get_info()
        out["device_used_gib_now"] = (total - free) / GiB
    except RuntimeError:
        pass
    return out


class BenchDecoder:
    """The model's tokenizer for the speculation loop's text path; ids past the real vocabulary (padding
    rows a random-weight head can pick) decode to nothing."""

    def __init__(self, model_dir: Path) -> None:
        from elpis.text import load_tokenizer

        self.inner = load_tokenizer(model_dir)
        self.limit = self.inner.vocab_size

    def decode(self, ids, *, skip_special: bool = False) -> str:
        return self.inner.decode([i for i in ids if i < self.limit], skip_special=skip_special)


class TimedDrafter:
    def __init__(self, inner) -> None:
        self.inner, self.seconds = inner, []

    def propose(self, context, depth, top_k):
        t = time.perf_counter()
        block = self.inner.propose(context, depth, top_k)
        self.seconds.append(time.perf_counter() - t)
        return block

    def reset(self) -> None:
        self.inner.reset()


# -- elpis ------------------------------------------------------------------------------------------------
class ElpisSystem:
    def __init__(self, args: argparse.Namespace, res: Results) -> None:
        from elpis.exl3 import load_backend

        t0 = time.perf_counter()
        self.backend = load_backend(
            args.model, args.draft, max_context=262_144, model_id="bench", fixed_rows=8, host_cache_gib=8.0
        )
        res.data["load_seconds"] = time.perf_counter() - t0
        self.decoder = BenchDecoder(args.model)
        self.vocab = self.backend.info.vocab_size
        self.loop = args.elpis_loop

    def generate_direct(self, prompt: list[int], tokens: int, draft: bool) -> dict[str, Any]:
        """Rounds straight on the backend without the speculation core: commit the anchor row only (valid
        whatever the draft holds, so no acceptance decision is made), next anchor = argmax of row 0. Only
        for machines where the acceptor is not built; the results say which loop ran."""
        backend = self.backend
        backend.fixed_rows = 8 if draft else None
        stamps, counts, draft_seconds = [], [], []
        start = time.perf_counter()
        cached = backend.begin(prompt)
        try:
            context, anchor = list(prompt), prompt[-1]
            for _ in range(tokens):
                rows = [anchor]
                if draft:
                    t = time.perf_counter()
                    block = backend.drafter.propose(context, 7, 1)
                    draft_seconds.append(time.perf_counter() - t)
                    rows += [c[0][0] for c in block.candidates]
                logits = backend.verify(rows, list(range(-1, len(rows) - 1)))
                anchor = int(logits[0].argmax())
                backend.commit([0])
                context.append(anchor)
                stamps.append(time.perf_counter())
                counts.append(1)
        finally:
            backend.finish()
            backend.fixed_rows = 8
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": cached,
            "draft_seconds": draft_seconds,
        }

    def generate(self, prompt: list[int], tokens: int, draft: bool) -> dict[str, Any]:
        if self.loop == "direct":
            return self.generate_direct(prompt, tokens, draft)
        from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

        backend = self.backend
        drafter = TimedDrafter(backend.drafter) if draft else None
        backend.fixed_rows = 8 if draft else None
        gen = SpeculativeGenerator(
            backend, self.decoder, drafter=drafter, tree_budget=8 if draft else 1, draft_top_k=1
        )
        request = GenerationRequest(
            prompt_ids=tuple(prompt), max_tokens=tokens, sampling=SamplingParams(), ignore_eos=True
        )
        stamps, counts = [], []
        start = time.perf_counter()
        stats = None
        try:
            for step in gen.generate(request):
                stamps.append(time.perf_counter())
                counts.append(len(step.token_ids))
                if step.finish_reason is not None:
                    stats = step.stats
        finally:
            backend.fixed_rows = 8
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": stats.cached_tokens if stats else None,
            "draft_seconds": drafter.seconds if drafter else [],
        }


# -- stock ------------------------------------------------------------------------------------------------
class StockSystem:
    def __init__(self, args: argparse.Namespace, res: Results) -> None:
        from exllamav3 import Cache, Config, Generator, Model, Tokenizer
        from exllamav3.cache import CacheLayer_quant

        t0 = time.perf_counter()
        config = Config.from_directory(str(args.model))
        self.model = Model.from_config(config)
        self.cache = Cache(
            self.model,
            max_num_tokens=270_336,
            layer_type=CacheLayer_quant,
            k_bits=3,
            v_bits=3,
            max_batch_size=1,
            max_history=7,
        )
        dconfig = Config.from_directory(str(args.draft))
        self.draft = Model.from_config(dconfig)
        self.draft_cache = Cache(
            self.draft,
            max_num_tokens=270_336,
            layer_type=CacheLayer_quant,
            k_bits=3,
            v_bits=3,
            max_batch_size=1,
            max_history=7,
        )
        self.draft.load(device="cuda:0")
        self.model.load(device="cuda:0")
        self.model.warmup(cache=self.cache, max_chunk_size=2048)
        self.tokenizer = Tokenizer.from_config(config)
        self.gen = Generator(
            self.model,
            self.cache,
            self.tokenizer,
            draft_model=self.draft,
            draft_cache=self.draft_cache,
            num_draft_tokens=7,
            max_chunk_size=2048,
            max_batch_size=1,
        )
        res.data["load_seconds"] = time.perf_counter() - t0
        self.vocab = int(config.vocab_size)
        self.window = self.gen.num_draft_tokens

    def generate(self, prompt: list[int], tokens: int, draft: bool) -> dict[str, Any]:
        from exllamav3 import Job
        from exllamav3.generator.sampler import ArgmaxSampler

        gen = self.gen
        gen.num_draft_tokens = self.window if draft else 0
        job = Job(
            input_ids=torch.tensor([prompt], dtype=torch.long),
            max_new_tokens=tokens,
            sampler=ArgmaxSampler(),
            stop_conditions=[],
        )
        stamps, counts = [], []
        start = time.perf_counter()
        try:
            gen.enqueue(job)
            while gen.num_remaining_jobs():
                results = gen.iterate()
                now = time.perf_counter()
                n = 0
                for r in results:
                    if r.get("stage") == "error":
                        raise RuntimeError(f"stock generator error: {r}")
                    ids = r.get("token_ids")
                    if r.get("stage") == "streaming" and ids is not None:
                        n += int(ids.numel())
                if n:
                    stamps.append(now)
                    counts.append(n)
        finally:
            gen.num_draft_tokens = self.window
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": int(getattr(job, "cached_tokens", 0)) + 256 * int(getattr(job, "cached_pages", 0)),
            "draft_seconds": [],
        }


# -- schedule ---------------------------------------------------------------------------------------------
def summarize(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    stamps, counts = run["stamps"], run["counts"]
    if not stamps:
        return {"ttft_seconds": None, "round_seconds": [], "tokens_per_round": []}
    rounds = [b - a for a, b in itertools.pairwise(stamps)][warmup:]
    return {
        "ttft_seconds": stamps[0] - run["start"],
        "round_seconds": rounds,
        "round_median_ms": median_ms(rounds),
        "tokens_per_round": counts[1 + warmup :],
        "tokens": sum(counts),
        "cached": run["cached"],
        "draft_median_ms": median_ms(run["draft_seconds"][1 + warmup :]),
    }


def measure(
    system,
    sampler: hardware.PowerSampler,
    prompt: list[int],
    tokens: int,
    draft: bool,
    warmup: int,
    label: str,
) -> dict[str, Any]:
    with sampler.measure(label) as trace:
        run = system.generate(prompt, tokens, draft)
    out = summarize(run, warmup)
    power = trace.summary()
    produced = sum(out.get("tokens_per_round", []))
    decode_seconds = sum(out.get("round_seconds", []))
    if power["mean_w"] is not None and decode_seconds > 0:
        out["decode_tokens_per_joule"] = produced / (power["mean_w"] * decode_seconds)
    out["power"] = power
    return out


def load_system(args: argparse.Namespace, res: Results):
    if args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GiB / total))
    res.data["facts"] = hardware.gpu_facts()
    system = ElpisSystem(args, res) if args.system == "elpis" else StockSystem(args, res)
    if args.system == "elpis":
        from elpis.exl3 import patches

        res.data["patches"] = patches.applied()
        res.data["loop"] = args.elpis_loop
        layers = system.backend.engine.cache.get_all_recurrent_layers().values()
        res.data["gdn_state_dtype"] = str(next(iter(layers)).recurrent_state.dtype)
    res.data["peak_after_load"] = peak_memory()
    res.save()
    return system


def run_profile(args: argparse.Namespace) -> int:
    """Per-phase GPU time (`elpis.bench.phases`): at each context, the last prefill chunks (contexts in
    --profile-prefill) and `rounds` speculative rounds, then plain decode steps, after `warmup` rounds."""
    from elpis.bench.phases import PhaseProfiler

    res = Results(args.out, args.system)
    res.data["profiles"] = []
    try:
        system = load_system(args, res)
        if args.system == "elpis":
            model, draft = system.backend.engine.model, system.backend.engine.draft
        else:
            model, draft = system.model, system.draft
        vocab = system.vocab
        system.generate(workload.prompt(1025, seed=99, vocab=vocab), 8, True)  # warm-up, unprofiled
        system.generate(workload.prompt(1025, seed=98, vocab=vocab), 8, False)
        profiler = PhaseProfiler(model, draft)
        base = workload.prompt(max(args.checkpoints) + 1, seed=1, vocab=vocab)
        tokens = args.warmup + args.rounds + 2
        for c in args.checkpoints:
            if time.time() > args.deadline:
                res.data["errors"].append(f"skipped context {c}: deadline")
                break
            if c in args.profile_prefill:
                profiler.prefill(c)
            profiler.rounds(c, args.warmup, args.rounds, "spec")
            system.generate(base[: c + 1], tokens, True)
            profiler.rounds(c, args.warmup, args.rounds, "plain")
            system.generate(base[: c + 1], tokens, False)
            if profiler.pending:
                res.data["errors"].append(f"context {c}: {profiler.pending} profile window(s) not reached")
                profiler.clear()
            res.data["profiles"] = profiler.windows
            res.data["peak"] = peak_memory()
            res.save()
        profiler.close()
        res.data["complete"] = time.time() <= args.deadline
    except Exception as exc:
        res.data["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        res.save()
        return 1
    res.save()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.profile:
        return run_profile(args)
    res = Results(args.out, args.system)
    deadline = args.deadline
    res.data["cap_gib"] = args.cap_gib
    try:
        system = load_system(args, res)
        sampler = hardware.PowerSampler()
        vocab = system.vocab
        base = workload.prompt(max(args.checkpoints) + 1, seed=1, vocab=vocab)
        t0 = time.perf_counter()
        system.generate(workload.prompt(1025, seed=99, vocab=vocab), 24, True)
        system.generate(workload.prompt(1025, seed=98, vocab=vocab), 24, False)
        res.data["warmup_seconds"] = time.perf_counter() - t0
        res.save()
        rate, previous = None, 0
        for c in args.checkpoints:
            needed = (c - previous) / rate if rate else 0.0
            if time.time() + needed > deadline:
                res.data["errors"].append(
                    f"skipped checkpoint {c}: {needed:.0f} s of prefill would pass the deadline"
                )
                break
            tokens = args.rounds + args.warmup + 1
            if c == max(args.checkpoints):
                tokens = max(tokens, args.final_tokens // 2)
            entry: dict[str, Any] = {"context": c, "label": workload.label(c)}
            entry["spec"] = spec = measure(
                system, sampler, base[: c + 1], tokens, True, args.warmup, f"spec {c}"
            )
            res.data["checkpoints"].append(entry)
            res.save()
            cached = spec.get("cached") or 0
            if spec.get("ttft_seconds"):
                rate, previous = (c - cached) / spec["ttft_seconds"], c
            # A plain run re-serves the same prompt from the prefix cache; a miss would prefill it again
            if time.time() + (spec.get("ttft_seconds") or 0) + 10 > deadline:
                res.data["errors"].append(f"skipped plain decode at {c}: not enough time left")
                res.data["peak"] = peak_memory()
                res.save()
                continue
            entry["plain"] = measure(system, sampler, base[: c + 1], tokens, False, args.warmup, f"plain {c}")
            res.data["peak"] = peak_memory()
            res.save()
        for c, reps in FRESH:
            seconds = []
            for r in range(reps):
                if time.time() > deadline:
                    break
                out = measure(
                    system,
                    sampler,
                    workload.prompt(c + 1, seed=1000 + 10 * c + r, vocab=vocab),
                    1,
                    True,
                    0,
                    f"fresh {c}",
                )
                seconds.append(out["ttft_seconds"])
            if seconds:
                res.data["fresh_ttft"].append({"context": c, "seconds": seconds})
                res.save()
        res.data["peak"] = peak_memory()
        res.data["complete"] = time.time() <= deadline
    except Exception as exc:  # keep what was measured; the report shows the error
        res.data["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        res.save()
        return 1
    res.save()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elpis.bench.worker")
    parser.add_argument("--system", choices=("stock", "elpis"), required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--deadline", type=float, required=True, help="epoch seconds; stop measuring after it"
    )
    parser.add_argument(
        "--checkpoints", type=lambda s: [int(x) for x in s.split(",")], default=list(workload.CHECKPOINTS)
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--final-tokens", type=int, default=128, help="tokens decoded at the last checkpoint")
    parser.add_argument("--cap-gib", type=float, default=None)
    parser.add_argument(
        "--elpis-loop",
        choices=("spec", "direct"),
        default="spec",
        help="spec: the speculation core with the proven acceptor (the product path); "
        "direct: "
        "backend rounds committing the anchor row only (for machines without the acceptor)",
    )
    parser.add_argument("--profile", action="store_true", help="per-phase profile instead of timings")
    parser.add_argument(
        "--profile-prefill",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="contexts whose last prefill chunks are profiled (with --profile)",
    )
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
