"""One engine's measurement, run in its own process (`python -m elpis.bench.worker`): stock, or the elpis
systems (`elpis` chain-8, `elpis-tree8`, `elpis-tree16`) on one loaded backend.

Every system runs the same schedule on the same checkpoint and the same prompt:
  warm-up (untimed) -> for each context checkpoint c (1K, 8K, 32K, 128K, 262K): one prompt of c + 1 tokens
  that extends the previous one, so the prefill is cumulative (the prefix cache serves the previous
  checkpoint's tokens; TTFT(c) is the sum of the incremental prefill times, see report.py), then `rounds`
  speculative rounds (DFlash2 chain, 8 rows) and `rounds` plain decode steps, each after `warmup` untimed
  ones -> fresh TTFT at 8K and 32K (new prompts, nothing cached) while time remains.
Several elpis systems in one process take turns at each checkpoint: the first of them pays the prefill, the
others are served by the prefix cache (their TTFT is not a prefill figure); tree systems measure speculative
rounds only (their plain steps are tree verifies of 8 / 16 rows, not part of the comparison). `--spec-only`
skips plain steps and fresh TTFT for every system.

stock: ExLlamaV3's own Generator (DFlash2 draft, ArgmaxSampler, its own accept-while-match), plain steps by
switching its draft window to 0 inside the same job. elpis: `elpis.spec.SpeculativeGenerator` over
`Exl3Backend` with the proven acceptor (chain, draft_top_k=1); plain steps through the same generator without
a drafter and without row padding. elpis-tree8/16: the same backend loaded in tree mode
(`load_backend(tree=True)`: every verify runs as a tree of 8 rows for tree-8, 16 for tree-16, through elpis's
tree kernels), the speculation core building trees of 8 / 16 rows from the DFlash2 drafter's top-k
(`--tree-top-k`); `elpis` in the same process switches the backend to chain mode (8 fixed rows, stock kernels)
for its turns. With random weights every draft is rejected: one token per round.

Memory a round needs: before each measured request the allocation is read (model, cache and whatever stays
resident), the peak counter is reset after the first step (which includes the prefill), and the peak over the
following rounds minus that allocation is the round's scratch (`round_scratch_mb`).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elpis.bench import hardware, workload
from elpis.exl3 import DEFAULT_PREFILL_CHUNK, PREFILL_CHUNKS

GiB = 1 << 30
MB = 1e6
FRESH = ((8192, 2), (32768, 1))


class Results:
    """One system's result document; `save()` writes the whole file of its worker."""

    def __init__(self, file: ResultFile, system: str) -> None:
        self.file = file
        self.data: dict[str, Any] = {
            "system": system,
            "checkpoints": [],
            "fresh_ttft": [],
            "errors": [],
            "complete": False,
        }

    def save(self) -> None:
        self.file.save()


class ResultFile:
    """The worker's output: {system: result document}, rewritten after every step so a run cut short by its
    deadline still reports what it measured."""

    def __init__(self, path: Path, systems: list[str]) -> None:
        self.path = path
        self.results = {s: Results(self, s) for s in systems}

    def __getitem__(self, system: str) -> Results:
        return self.results[system]

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = {s: r.data for s, r in self.results.items()}
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(self.path)


def median_ms(seconds: list[float]) -> float | None:
    return statistics.median(seconds) * 1000 if seconds else None


class PeakCounter:
    """torch has one peak counter per process; the round windows reset it, so the process-wide peak is kept
    here across resets."""

    def __init__(self) -> None:
        self.allocated = 0
        self.reserved = 0

    def fold(self) -> None:
        self.allocated = max(self.allocated, torch.cuda.max_memory_allocated())
        self.reserved = max(self.reserved, torch.cuda.max_memory_reserved())

    def reset(self) -> None:
        self.fold()
        torch.cuda.reset_peak_memory_stats()


PEAK = PeakCounter()


class RoundMemory:
    """GPU memory the rounds of one request need over what was allocated before it (model, cache, resident
    buffers): the peak from the second step on (the first one includes the prefill). Off in the per-phase
    profile, whose idle-time figures a host sync between steps would change."""

    enabled = True

    def __init__(self) -> None:
        self.started = False
        if self.enabled:
            torch.cuda.synchronize()
            self.resident = torch.cuda.memory_allocated()

    def first_step_done(self) -> None:
        if self.enabled and not self.started:
            torch.cuda.synchronize()
            PEAK.reset()
            self.started = True

    def result(self) -> dict[str, float]:
        if not self.started:
            return {}
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        PEAK.fold()
        return {"resident_mb": self.resident / MB, "round_scratch_mb": (peak - self.resident) / MB}


def peak_memory() -> dict[str, float]:
    PEAK.fold()
    out = {
        "max_allocated_gib": PEAK.allocated / GiB,
        "max_reserved_gib": PEAK.reserved / GiB,
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
@dataclass(frozen=True)
class Variant:
    """How the speculation core drives the backend for one elpis system."""

    name: str
    tree: bool  # backend in tree mode (every verify a tree of tree_run(budget) rows) instead of chain mode
    budget: int  # rows per round, anchor included
    top_k: int  # drafter candidates per depth (1: chains)


def variant(name: str, tree_top_k: int) -> Variant:
    if name in workload.TREE_BUDGETS:
        return Variant(name, True, workload.TREE_BUDGETS[name], tree_top_k)
    if name == "elpis":
        return Variant(name, False, workload.CHAIN_ROWS, 1)
    raise ValueError(f"not an elpis system: {name!r}")


class ElpisSystem:
    def __init__(self, args: argparse.Namespace, variants: list[Variant]) -> None:
        from elpis.exl3 import load_backend
        from elpis.exl3.tree_verify import TREE_ROWS, tree_run

        self.tree_loaded = any(v.tree for v in variants)
        runs = {tree_run(v.budget) for v in variants if v.tree}
        if len(runs) > 1:  # `worker_groups` gives each tree system a process of its own
            raise ValueError(f"one load serves one tree row count (its captured graphs), got {sorted(runs)}")
        self.tree_rows = runs.pop() if runs else TREE_ROWS  # the loaded row count in tree mode
        given = getattr(args, "host_threads", None)
        threads = {} if given is None else {"host_threads": given}  # else load_backend's default
        self.backend = load_backend(
            args.model,
            args.draft,
            max_context=262_144,
            model_id="bench",
            fixed_rows=workload.CHAIN_ROWS,
            host_cache_gib=8.0,
            tree=self.tree_loaded,
            tree_rows=self.tree_rows,
            tree_graphs=not getattr(args, "tree_eager", False),
            draft_graphs=not getattr(args, "draft_eager", False),
            prefill_chunk=getattr(args, "prefill_chunk", DEFAULT_PREFILL_CHUNK),
            # each tree system measures its own row count: with random weights every tree commits one token,
            # so a run choice (exl3-run-choice) would run every system at 8 rows
            run_choice=False,
            **threads,
        )
        self.decoder = BenchDecoder(args.model)
        self.vocab = self.backend.info.vocab_size
        self.loop = args.elpis_loop
        self.variant = variants[0]

    def _mode(self, draft: bool) -> None:
        """Put the backend in the current variant's mode (between sequences only)."""
        if self.variant.tree:  # the load's row count: one a load (`__init__`)
            self.backend.tree, self.backend.fixed_rows = True, self.tree_rows
        else:  # plain steps of the chain system run unpadded, as in a chain-mode load
            self.backend.tree = False
            self.backend.fixed_rows = workload.CHAIN_ROWS if draft else None

    def _restore(self) -> None:
        self.backend.tree = self.tree_loaded
        self.backend.fixed_rows = self.tree_rows if self.tree_loaded else workload.CHAIN_ROWS  # as loaded

    def captures(self) -> int:
        """CUDA graphs captured so far (verify forwards, draft blocks and conditionings): a capture inside a
        timed round adds its cost to that round, so the results count them."""
        graphs = [self.backend.graphs, getattr(self.backend.drafter, "graphs", None)]
        return sum(g.captures + getattr(g, "condition_captures", 0) for g in graphs if g is not None)

    def generate_direct(self, prompt: list[int], tokens: int, draft: bool) -> dict[str, Any]:
        """Rounds straight on the backend without the speculation core: commit the anchor row only (valid
        whatever the draft holds, so no acceptance decision is made), next anchor = argmax of row 0. Only
        for machines where the acceptor is not built; the results say which loop ran."""
        backend = self.backend
        if self.variant.tree or self.tree_loaded:
            raise RuntimeError("the direct loop drives chain-mode backends only")
        self._mode(draft)
        stamps, counts, draft_seconds, captures = [], [], [], []
        memory = RoundMemory()
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
                captures.append(self.captures())
                memory.first_step_done()
        finally:
            backend.finish()
            self._restore()
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": cached,
            **prefill_timing(backend),
            "draft_seconds": draft_seconds,
            "captures": captures,
            "memory": memory.result(),
        }

    def generate(self, prompt: list[int], tokens: int, draft: bool) -> dict[str, Any]:
        if self.loop == "direct":
            return self.generate_direct(prompt, tokens, draft)
        from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator

        backend, v = self.backend, self.variant
        drafter = TimedDrafter(backend.drafter) if draft else None
        self._mode(draft)
        gen = SpeculativeGenerator(
            backend, self.decoder, drafter=drafter, tree_budget=v.budget if draft else 1, draft_top_k=v.top_k
        )
        request = GenerationRequest(
            prompt_ids=tuple(prompt), max_tokens=tokens, sampling=SamplingParams(), ignore_eos=True
        )
        stamps, counts, captures = [], [], []
        memory = RoundMemory()
        start = time.perf_counter()
        stats = None
        try:
            for step in gen.generate(request):
                stamps.append(time.perf_counter())
                counts.append(len(step.token_ids))
                captures.append(self.captures())
                if step.finish_reason is not None:
                    stats = step.stats
                memory.first_step_done()
        finally:
            self._restore()
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": stats.cached_tokens if stats else None,
            **prefill_timing(backend),
            "draft_seconds": drafter.seconds if drafter else [],
            "captures": captures,
            "memory": memory.result(),
        }


# -- stock ------------------------------------------------------------------------------------------------
class StockSystem:
    def __init__(self, args: argparse.Namespace) -> None:
        from exllamav3 import Cache, Config, Generator, Model, Tokenizer
        from exllamav3.cache import CacheLayer_quant

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
        memory = RoundMemory()
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
                    memory.first_step_done()
        finally:
            gen.num_draft_tokens = self.window
        return {
            "start": start,
            "stamps": stamps,
            "counts": counts,
            "cached": int(getattr(job, "cached_tokens", 0)) + 256 * int(getattr(job, "cached_pages", 0)),
            "draft_seconds": [],
            "memory": memory.result(),
        }


def prefill_timing(backend: Any) -> dict[str, Any]:
    """The engine's own `begin()` time of the last request (prefill, snapshots, page naming) and its parts;
    TTFT adds the first round to it."""
    return {
        "prefill_seconds": backend.last_prefill_seconds,
        "prefill_parts": dict(backend.last_prefill_parts),
    }


# -- schedule ---------------------------------------------------------------------------------------------
def summarize(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    stamps, counts = run["stamps"], run["counts"]
    if not stamps:
        return {"ttft_seconds": None, "round_seconds": [], "tokens_per_round": []}
    rounds = [b - a for a, b in itertools.pairwise(stamps)][warmup:]
    captures = run.get("captures") or []  # graphs captured so far, at each stamp (elpis systems)
    timed_captures: dict[str, int] = {}
    if captures and rounds:
        timed_captures["captures_in_timed_rounds"] = captures[-1] - captures[warmup]
    return {
        "ttft_seconds": stamps[0] - run["start"],
        "round_seconds": rounds,
        "round_median_ms": median_ms(rounds),
        "tokens_per_round": counts[1 + warmup :],
        "tokens": sum(counts),
        "cached": run["cached"],
        **{k: run[k] for k in ("prefill_seconds", "prefill_parts") if k in run},
        "draft_median_ms": median_ms(run["draft_seconds"][1 + warmup :]),
        **timed_captures,
        **run.get("memory", {}),
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


def load_system(args: argparse.Namespace, out: ResultFile):
    """Load the worker's engine (stock, or one elpis backend for all its elpis systems) and note what was
    loaded in every system's result."""
    if args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GiB / total))
    facts = hardware.machine_facts()
    t0 = time.perf_counter()
    if args.system == ["stock"]:
        system = StockSystem(args)
    else:
        system = ElpisSystem(args, [variant(n, args.tree_top_k) for n in args.system])
    notes: dict[str, Any] = {"facts": facts, "load_seconds": time.perf_counter() - t0}
    if isinstance(system, ElpisSystem):
        from elpis.exl3 import patches

        layers = system.backend.engine.cache.get_all_recurrent_layers().values()
        notes.update(
            patches=patches.applied(),
            loop=args.elpis_loop,
            gdn_state_dtype=str(next(iter(layers)).recurrent_state.dtype),
            backend_tree_mode=system.tree_loaded,
            backend_tree_graphs=system.backend.graphs is not None,
            backend_draft_graphs=getattr(system.backend.drafter, "graphs", None) is not None,
        )
    notes["peak_after_load"] = peak_memory()
    for name in args.system:
        out[name].data.update(notes)
        if isinstance(system, ElpisSystem):
            out[name].data["variant"] = vars(variant(name, args.tree_top_k))
    out.save()
    return system


def select(system, name: str, tree_top_k: int) -> None:
    """Make `name` the system the next generate() calls measure (a no-op for stock)."""
    if isinstance(system, ElpisSystem):
        system.variant = variant(name, tree_top_k)


def run_profile(args: argparse.Namespace) -> int:
    """Per-phase GPU time (`elpis.bench.phases`): at each context, the last prefill chunks (contexts in
    --profile-prefill) and `rounds` speculative rounds, then plain decode steps, after `warmup` rounds."""
    from elpis.bench.phases import PhaseProfiler

    if len(args.system) != 1 or args.system[0] not in workload.PROFILE_SYSTEMS:
        names = ", ".join(workload.PROFILE_SYSTEMS)
        raise SystemExit(f"--profile measures one of {names}, not {','.join(args.system)}")
    RoundMemory.enabled = False
    out = ResultFile(args.out, args.system)
    res = out[args.system[0]]
    res.data["profiles"] = []
    try:
        system = load_system(args, out)
        if isinstance(system, ElpisSystem):
            model, draft = system.backend.engine.model, system.backend.engine.draft
        else:
            model, draft = system.model, system.draft
        vocab = system.vocab
        system.generate(workload.prompt(1025, seed=99, vocab=vocab), 8, True)  # warm-up, unprofiled
        system.generate(workload.prompt(1025, seed=98, vocab=vocab), 8, False)
        graphs = draft_graphs = None
        if isinstance(system, ElpisSystem):
            graphs = system.backend.graphs
            draft_graphs = getattr(system.backend.drafter, "graphs", None)
        profiler = PhaseProfiler(model, draft, graphs, draft_graphs)
        base = workload.prompt(max(args.checkpoints) + 1, seed=1, vocab=vocab)
        tokens = args.warmup + args.rounds + 2
        for c in args.checkpoints:
            if time.time() > args.deadline:
                res.data["errors"].append(f"skipped context {c}: deadline")
                break
            if c in args.profile_prefill:
                profiler.prefill(c, tail=args.prefill_window or c)
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
    names: list[str] = args.system
    out = ResultFile(args.out, names)
    primary = names[0]  # pays each checkpoint's prefill; the others are served by the prefix cache
    deadline = args.deadline
    current = primary
    for name in names:
        out[name].data["cap_gib"] = args.cap_gib
        out[name].data["prefill_paid_by"] = primary
    try:
        system = load_system(args, out)
        sampler = hardware.PowerSampler()
        vocab = system.vocab
        base = workload.prompt(max(args.checkpoints) + 1, seed=1, vocab=vocab)
        for name in names:
            current = name
            select(system, name, args.tree_top_k)
            t0 = time.perf_counter()
            system.generate(workload.prompt(1025, seed=99, vocab=vocab), 24 if name == primary else 8, True)
            if plain_measured(args, name):
                system.generate(workload.prompt(1025, seed=98, vocab=vocab), 24, False)
            out[name].data["warmup_seconds"] = time.perf_counter() - t0
            out.save()
        rate, previous = None, 0
        round_seconds: dict[str, float] = {}
        for c in args.checkpoints:
            needed = (c - previous) / rate if rate else 0.0
            if time.time() + needed > deadline:
                for name in names:
                    out[name].data["errors"].append(
                        f"skipped checkpoint {c}: {needed:.0f} s of prefill would pass the deadline"
                    )
                break
            tokens = args.rounds + args.warmup + 1
            if c == max(args.checkpoints):
                tokens = max(tokens, args.final_tokens // 2)
            for name in names:
                current = name
                res = out[name]
                expected = tokens * round_seconds.get(name, 0.0) + (needed if name == primary else 0.0)
                if time.time() + expected > deadline:
                    res.data["errors"].append(f"skipped checkpoint {c}: not enough time left")
                    continue
                select(system, name, args.tree_top_k)
                entry: dict[str, Any] = {"context": c, "label": workload.label(c)}
                entry["spec"] = spec = measure(
                    system, sampler, base[: c + 1], tokens, True, args.warmup, f"{name} spec {c}"
                )
                res.data["checkpoints"].append(entry)
                res.save()
                if spec.get("round_median_ms"):
                    round_seconds[name] = spec["round_median_ms"] / 1000
                cached = spec.get("cached") or 0
                if name == primary and spec.get("ttft_seconds"):
                    rate, previous = (c - cached) / spec["ttft_seconds"], c
                if not plain_measured(args, name):
                    continue
                # A plain run re-serves the same prompt from the prefix cache; a miss would prefill it again
                if time.time() + (spec.get("ttft_seconds") or 0) + 10 > deadline:
                    res.data["errors"].append(f"skipped plain decode at {c}: not enough time left")
                    continue
                entry["plain"] = measure(
                    system, sampler, base[: c + 1], tokens, False, args.warmup, f"{name} plain {c}"
                )
                res.save()
            for name in names:
                out[name].data["peak"] = peak_memory()
            out.save()
        current = primary
        select(system, primary, args.tree_top_k)
        for c, reps in () if args.spec_only else FRESH:
            seconds = []
            for r in range(reps):
                if time.time() > deadline:
                    break
                fresh = measure(
                    system,
                    sampler,
                    workload.prompt(c + 1, seed=1000 + 10 * c + r, vocab=vocab),
                    1,
                    True,
                    0,
                    f"fresh {c}",
                )
                seconds.append(fresh["ttft_seconds"])
            if seconds:
                out[primary].data["fresh_ttft"].append({"context": c, "seconds": seconds})
                out.save()
        for name in names:
            out[name].data["peak"] = peak_memory()
            out[name].data["complete"] = time.time() <= deadline
    except Exception as exc:  # keep what was measured; the report shows the error
        for name in names:
            out[name].data["errors"].append(
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                if name == current
                else f"stopped by an error while {current} ran"
            )
        out.save()
        return 1
    out.save()
    return 0


def plain_measured(args: argparse.Namespace, name: str) -> bool:
    """Plain decode steps are measured for the chain systems unless --spec-only."""
    return not args.spec_only and name not in workload.TREE_BUDGETS


def parse_systems(text: str) -> list[str]:
    """`stock`, or elpis systems (measured on one backend, in this order; at most one tree row count)."""
    names = [s for s in text.split(",") if s]
    if names == ["stock"]:
        return names
    if not names or len(set(names)) != len(names) or any(n not in workload.ELPIS_SYSTEMS for n in names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give stock, or distinct elpis systems from {', '.join(workload.ELPIS_SYSTEMS)}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m elpis.bench.worker")
    parser.add_argument(
        "--system",
        type=parse_systems,
        required=True,
        help="stock, or elpis systems sharing one backend (elpis,elpis-tree16; one tree row count)",
    )
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
    parser.add_argument(
        "--tree-top-k",
        type=int,
        default=None,
        help="drafter candidates per depth for the tree systems (default: the speculation core's)",
    )
    parser.add_argument(
        "--spec-only", action="store_true", help="speculative rounds only: no plain steps, no fresh TTFT"
    )
    parser.add_argument(
        "--tree-eager",
        action="store_true",
        help="tree systems: eager tree verifies instead of replayed CUDA graphs",
    )
    parser.add_argument(
        "--draft-eager",
        action="store_true",
        help="elpis systems: eager DFlash2 draft blocks instead of replayed CUDA graphs",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        choices=PREFILL_CHUNKS,
        default=DEFAULT_PREFILL_CHUNK,
        help="elpis systems: tokens per prefill chunk",
    )
    parser.add_argument(
        "--host-threads", type=int, default=None, help="elpis systems: torch CPU threads between prefills"
    )
    parser.add_argument("--profile", action="store_true", help="per-phase profile instead of timings")
    parser.add_argument(
        "--profile-prefill",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="contexts whose last prefill chunks are profiled (with --profile)",
    )
    parser.add_argument(
        "--prefill-window",
        type=int,
        default=4096,
        help="tokens before a profiled context where its prefill window starts (0: the whole prompt)",
    )
    args = parser.parse_args(argv)
    if args.tree_top_k is None:
        from elpis.spec.generate import DEFAULT_DRAFT_TOP_K

        args.tree_top_k = DEFAULT_DRAFT_TOP_K
    if args.tree_top_k < 1:
        parser.error(f"--tree-top-k must be >= 1, got {args.tree_top_k}")
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
