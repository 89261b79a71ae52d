"""Where the GPU time of a decode round or a prefill chunk goes, per phase (issues 9 and 10, item 1).

`PhaseProfiler(model, draft)` labels ExLlamaV3's modules at run time (no code of theirs is copied): every
top-level call of an `Attention`, `GatedDeltaNet`, MLP, `RMSNorm`, `Embedding` or the head `Linear` of the
target, and every call into the draft model (forward, prefill, conditioning update, selector walk), runs
inside a `torch.profiler.record_function("elpis.phase.<name>")` range. Nested calls keep the outer label
(a norm inside the draft counts as draft). The profiler's GPU trace then says which kernels ran inside
which range: Kineto projects each CPU range onto the GPU timeline as a `gpu_user_annotation`, CUDA graph
replays included.

Windows are chosen by the target model's own calls (wrapped on the instance, so another model is not
touched): `prefill(c)` profiles the prefill calls whose first position is at least `c - tail` up to the
first decode-sized forward at position >= c - 1; `rounds(c, warm, n)` skips `warm` decode forwards at
position >= c - 1 and then profiles exactly `n` rounds (from one verify forward to the verify forward `n`
later, so each round's draft is inside). A tree verify replayed from a CUDA graph makes no forward call;
given the backend's `TreeGraphs`, the profiler counts its replays as those forwards, and given the drafter's
`DraftGraphs`, its replayed draft blocks are labelled draft. `summarize` turns the
trace into per-round (or per-token) GPU milliseconds: per phase, per kernel family inside each phase, busy
time (union of kernel intervals) and idle gaps (window length minus busy).
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from elpis.exl3 import walk_modules

TARGET_PHASES = {
    "Attention": "attention",
    "GatedDeltaNet": "gdn",
    "GatedMLP": "mlp",
    "MLP": "mlp",
    "RMSNorm": "norm",
    "Embedding": "embed",
    "Linear": "head",  # only the top-level Linear (the head) is labelled; projections are nested
}
DRAFT_METHODS = ("forward", "prefill", "update_kv_from_target")
PREFIX = "elpis.phase."
DECODE_ROWS = 16  # a forward of at most this many rows is a decode round (verify), not a prefill chunk

# Kernel families by name (first match wins); the order puts specific names before generic ones.
FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("cache-quant", r"quant_cache|dequant_cache|cache_paged|q_cache"),
        ("gdn-scan", r"delta|gdn|recurrent|scan_replay|chunk_(fwd|bwd|scaled|local|gated)|solve_tril"),
        ("conv", r"conv"),
        ("attention", r"attn|attention|flash|softmax_combine|split_kv|paged"),
        # rows_gemm: elpis's EXL3 GEMM (and its input transform)
        ("exl3-gemm", r"exl3|gemv|mgemm|rows_gemm|reconstruct|had_r|hadamard"),
        ("dense-gemm", r"gemm|cublas|cutlass|xmma|sm80_|sm90_|ampere_|Kernel2"),
        ("norm", r"norm"),
        ("rope", r"rope|rotary"),
        ("sampling", r"argmax|topk|top_k|sample|sort|softmax|max_reduce"),
        ("copy", r"copy|memcpy|memset|fill|cat_|index|gather|scatter"),
        ("elementwise", r"elementwise|vectorized|unrolled|reduce|add|mul|sigmoid|silu|act"),
    )
)


TOP_KERNELS = 8  # kernels listed by name per phase


def short_name(kernel: str) -> str:
    """A kernel's name without its template and argument lists (the part that says what it is)."""
    closing = {"<": ">", "(": ")"}
    stack: list[str] = []
    out = []
    for ch in kernel:
        if ch in closing:
            stack.append(closing[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
        elif not stack:
            out.append(ch)
    name = "".join(out).strip().removeprefix("void ").lstrip(":").strip()
    return (name or kernel)[:120]


def family(kernel: str) -> str:
    for name, pattern in FAMILIES:
        if pattern.search(kernel):
            return name
    return "other"


class _Depth(threading.local):
    value = 0


class PhaseProfiler:
    """Labels the modules of `model` (and the whole of `draft`) and profiles windows of the target's calls."""

    def __init__(
        self, model: Any, draft: Any | None = None, graphs: Any | None = None, draft_graphs: Any | None = None
    ) -> None:
        self.depth = _Depth()
        self.phase_of: dict[int, str] = {}
        self._restore: list[Callable[[], None]] = []
        self.windows: list[dict[str, Any]] = []
        self._plans: list[dict[str, Any]] = []
        self._profiler: torch.profiler.profile | None = None
        for module in walk_modules(model):
            phase = TARGET_PHASES.get(type(module).__name__)
            if phase is not None:
                self.phase_of[id(module)] = phase
        self.top_level = {id(m) for m in getattr(model, "modules", [])}
        classes = {type(m) for m in walk_modules(model) if type(m).__name__ in TARGET_PHASES}
        for cls in classes:
            self._wrap_class(cls)
        if draft is not None:
            for name in DRAFT_METHODS:
                if hasattr(draft, name):
                    self._wrap_instance(draft, name, "draft")
            selector = getattr(draft, "selector", None)
            if selector is not None and hasattr(selector, "walk_block"):
                self._wrap_instance(selector, "walk_block", "draft")
            if draft_graphs is not None:
                # a replayed draft block (`elpis.exl3.draft_graph.DraftGraphs`) calls no method of the draft
                self._wrap_instance(draft_graphs, "block", "draft")
        self._wrap_window(model, "forward")
        self._wrap_window(model, "prefill")
        self._wrap_group_window(model)
        if graphs is not None:
            self._wrap_graph_window(graphs)

    # -- labelling ------------------------------------------------------------------------------------
    def _labelled(self, phase: str, call: Callable[[], Any]) -> Any:
        if self.depth.value:
            return call()
        self.depth.value += 1
        try:
            with torch.profiler.record_function(PREFIX + phase):
                return call()
        finally:
            self.depth.value -= 1

    def _wrap_class(self, cls: type) -> None:
        original = cls.forward
        profiler = self

        def forward(module, *args, **kwargs):
            phase = profiler.phase_of.get(id(module))
            if phase is None or (phase == "head" and id(module) not in profiler.top_level):
                return original(module, *args, **kwargs)
            return profiler._labelled(phase, lambda: original(module, *args, **kwargs))

        cls.forward = forward
        self._restore.append(lambda: setattr(cls, "forward", original))

    def _wrap_instance(self, obj: Any, name: str, phase: str) -> None:
        original = getattr(obj, name)

        def call(*args, **kwargs):
            return self._labelled(phase, lambda: original(*args, **kwargs))

        setattr(obj, name, call)
        self._restore.append(lambda: obj.__dict__.pop(name, None))

    def _wrap_window(self, model: Any, name: str) -> None:
        original = getattr(model, name)

        def call(input_ids, params=None, *args, **kwargs):
            self._before(name, int(input_ids.shape[-1]), _position(params or {}))
            return original(input_ids, params, *args, **kwargs)

        setattr(model, name, call)
        self._restore.append(lambda: model.__dict__.pop(name, None))

    def _wrap_group_window(self, model: Any) -> None:
        """A prefill in layer-major groups (`elpis.exl3.prefill_groups.prefill_layer_major`) runs several
        chunks without calling `model.prefill`: for this model it counts as one prefill call of all their
        rows at the first chunk's position."""
        from elpis.exl3 import prefill_groups

        original = prefill_groups.prefill_layer_major

        def grouped(target, passes, *args, **kwargs):
            if target is model and passes:
                rows = sum(int(ids.shape[-1]) for ids, _ in passes)
                self._before("prefill", rows, _position(passes[0][1]))
            return original(target, passes, *args, **kwargs)

        prefill_groups.prefill_layer_major = grouped
        self._restore.append(lambda: setattr(prefill_groups, "prefill_layer_major", original))

    def _wrap_graph_window(self, graphs: Any) -> None:
        """A tree verify replayed from a CUDA graph (`elpis.exl3.tree_graph.TreeGraphs.verify`) calls no
        forward of the model, so its rounds are counted here: `ids` rows at position `kvp`. Its kernels run
        in no module's range; the report files them under "other", by kernel family."""
        original = graphs.verify

        def verify(state, pages, ids, layout, kvp, *args, **kwargs):
            self._before("forward", len(ids), int(kvp))
            return original(state, pages, ids, layout, kvp, *args, **kwargs)

        graphs.verify = verify
        self._restore.append(lambda: graphs.__dict__.pop("verify", None))

    def close(self) -> None:
        self.clear()
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()

    # -- windows ---------------------------------------------------------------------------------------
    def prefill(self, context: int, tail: int = 4096) -> None:
        """Queue: profile the prefill calls from the one that reaches position context - tail up to the first
        decode round. A prefill in layer-major groups runs a group as one call, so its window starts at the
        first position of the group holding context - tail (a fresh 32K prompt in groups of sixteen chunks:
        the whole prompt); the report divides by the tokens the window held."""
        self._plans.append(
            {"kind": "prefill", "context": context, "from": max(0, context - tail), "tokens": 0}
        )

    def rounds(self, context: int, warm: int, count: int, label: str = "rounds") -> None:
        """Queue: skip `warm` decode rounds at the end of a `context`-token prompt, profile `count`."""
        if count < 1:
            raise ValueError("profile at least one round")
        self._plans.append({"kind": label, "context": context, "skip": warm, "count": count, "seen": 0})

    def _before(self, name: str, rows: int, position: int | None) -> None:
        while self._plans:
            plan = self._plans[0]
            decode = name == "forward" and rows <= DECODE_ROWS and position is not None
            decode = decode and position >= plan["context"] - 1
            if plan["kind"] == "prefill":
                if (
                    self._profiler is None
                    and not decode
                    and position is not None
                    and position + rows > plan["from"]
                ):
                    self._start()
                if self._profiler is None or not decode:
                    if self._profiler is not None:
                        plan["tokens"] += rows
                    return
                self._finish(per=plan["tokens"], unit="token")  # this decode call may open the next plan
                continue
            if not decode:
                return
            if plan["seen"] == plan["skip"]:
                self._start()
            elif plan["seen"] == plan["skip"] + plan["count"]:
                self._finish(per=plan["count"], unit="round")
                continue
            plan["seen"] += 1
            return

    @property
    def pending(self) -> int:
        """Plans not finished yet (a generation too short to reach them leaves them queued)."""
        return len(self._plans)

    def clear(self) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        self._plans.clear()

    def _start(self) -> None:
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()

    def _finish(self, per: int, unit: str) -> None:
        assert self._plans and self._profiler is not None
        plan = self._plans.pop(0)
        torch.cuda.synchronize()
        self._profiler.stop()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            self._profiler.export_chrome_trace(str(path))
            events = json.loads(path.read_text()).get("traceEvents", [])
        self._profiler = None
        window = summarize(events, per, unit)
        window.update(kind=plan["kind"], context=plan["context"])
        self.windows.append(window)


def _position(params: dict) -> int | None:
    seqlens = params.get("cache_seqlens")
    if isinstance(seqlens, torch.Tensor) and seqlens.numel():
        return int(seqlens.reshape(-1)[0])
    return None


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(
    events: list[dict[str, Any]], per: int, unit: str, top: int | None = TOP_KERNELS
) -> dict[str, Any]:
    """Per-`unit` GPU milliseconds from a Chrome trace: phases, kernel families, busy and idle time, and each
    phase's `top` most expensive kernels by name (None: all of them)."""
    if per < 1:
        raise ValueError(f"a profile window needs at least one {unit}, got {per}")
    kernels = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    ranges = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"][len(PREFIX) :])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "gpu_user_annotation"
        and e.get("name", "").startswith(PREFIX)
    )
    if not kernels:
        raise ValueError("the profile window holds no GPU kernels (was CUPTI available?)")
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_name: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for k in kernels:
        start, dur = float(k["ts"]), float(k.get("dur", 0))
        middle = start + dur / 2
        phase = next((name for a, b, name in ranges if a <= middle <= b), "other")
        phases[phase][family(k["name"])] += dur
        entry = by_name[phase][short_name(k["name"])]
        entry[0] += dur
        entry[1] += 1
    first = min(float(k["ts"]) for k in kernels)
    last = max(float(k["ts"]) + float(k.get("dur", 0)) for k in kernels)
    busy = _union([(float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0))) for k in kernels])
    scale = 1e-3 / per  # trace times are microseconds
    return {
        "unit": unit,
        "count": per,
        "kernels": len(kernels),
        "span_ms": (last - first) * scale,
        "busy_ms": busy * scale,
        "idle_ms": (last - first - busy) * scale,
        "phases": {
            phase: {
                "ms": sum(fam.values()) * scale,
                "families": {f: v * scale for f, v in sorted(fam.items())},
                # the phase's most expensive kernels by name: [ms, launches] per unit
                "top_kernels": {
                    name: [total * scale, count / per]
                    for name, (total, count) in sorted(by_name[phase].items(), key=lambda kv: -kv[1][0])[:top]
                },
            }
            for phase, fam in sorted(phases.items())
        },
    }
