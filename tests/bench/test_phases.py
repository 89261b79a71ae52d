"""The per-phase profile's trace arithmetic and report (the GPU run: tests/exl3/test_profile_gpu.py)."""

from __future__ import annotations

import pytest

from elpis.bench import phase_report, phases


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def _range(phase: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "gpu_user_annotation", "name": phases.PREFIX + phase, "ts": ts, "dur": dur}


def test_kernel_families_by_name():
    assert phases.family("exl3_gemm_kernel<4, 256>") == "exl3-gemm"
    # elpis's EXL3 GEMM and its input transform decode EXL3 weights too: not a dense (cuBLAS) GEMM
    assert phases.family("void (anonymous namespace)::rows_gemm_kernel<4u, 16u>(Args)") == "exl3-gemm"
    assert phases.family("rows_gemm_input") == "exl3-gemm"
    assert phases.family("_paged_attn_decode_split_kernel") == "attention"
    assert phases.family("fused_recurrent_gated_delta_rule_fwd_kernel") == "gdn-scan"
    assert phases.family("causal_conv1d_update_kernel") == "conv"
    assert phases.family("rms_norm_kernel") == "norm"
    assert phases.family("dequant_cache_paged_kernel") == "cache-quant"
    assert phases.family("some_unknown_thing") == "other"


def test_summary_attributes_kernels_to_ranges_and_measures_gaps():
    events = [
        _range("attention", 0, 100),
        _kernel("exl3_gemm_kernel", 0, 40),
        _kernel("_paged_attn_decode_split_kernel", 50, 40),
        _range("mlp", 100, 100),
        _kernel("exl3_gemm_kernel", 110, 30),
        _kernel("exl3_gemm_kernel", 130, 30),  # overlaps the previous one: busy counts the union
        _kernel("argmax_kernel", 300, 20),  # outside every range
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # host events are ignored
    ]
    out = phases.summarize(events, per=2, unit="round")
    assert out["kernels"] == 5
    assert out["span_ms"] == pytest.approx(320e-3 / 2)
    assert out["busy_ms"] == pytest.approx((40 + 40 + 50 + 20) * 1e-3 / 2)
    assert out["idle_ms"] == pytest.approx(out["span_ms"] - out["busy_ms"])
    assert out["phases"]["attention"]["families"] == pytest.approx({"attention": 0.02, "exl3-gemm": 0.02})
    assert out["phases"]["mlp"]["ms"] == pytest.approx(60e-3 / 2)
    assert out["phases"]["other"]["families"] == pytest.approx({"sampling": 0.01})
    # kernels by name per phase, most expensive first, with launches per round
    assert list(out["phases"]["attention"]["top_kernels"]) == [
        "exl3_gemm_kernel",
        "_paged_attn_decode_split_kernel",
    ]
    assert out["phases"]["mlp"]["top_kernels"]["exl3_gemm_kernel"] == pytest.approx([0.03, 1.0])


def test_summary_lists_every_kernel_name_when_asked():
    events = [_kernel(f"k{i}", 10 * i, 1 + i) for i in range(phases.TOP_KERNELS + 3)]
    some = phases.summarize(events, per=1, unit="round")["phases"]["other"]["top_kernels"]
    assert len(some) == phases.TOP_KERNELS
    every = phases.summarize(events, per=1, unit="round", top=None)["phases"]["other"]["top_kernels"]
    assert len(every) == phases.TOP_KERNELS + 3 and next(iter(every)) == f"k{phases.TOP_KERNELS + 2}"


def test_short_kernel_names_drop_templates_and_arguments():
    assert phases.short_name("void exl3_gemm_kernel<4, 256>(half const*, int)") == "exl3_gemm_kernel"
    assert (
        phases.short_name(
            "void (anonymous namespace)::gdn_tree_kernel_dev((anonymous namespace)::Args, P const*)"
        )
        == "gdn_tree_kernel_dev"
    )
    assert phases.short_name("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD"


def test_summary_refuses_empty_windows():
    with pytest.raises(ValueError, match="no GPU kernels"):
        phases.summarize([_range("mlp", 0, 10)], per=1, unit="round")
    with pytest.raises(ValueError, match="at least one round"):
        phases.summarize([_kernel("k", 0, 1)], per=0, unit="round")


def test_report_table_has_every_phase_and_unit():
    window = phases.summarize(
        [_range("gdn", 0, 100), _kernel("chunk_gated_delta_rule_fwd", 0, 50)], per=100, unit="token"
    )
    window.update(kind="prefill", context=32768)
    doc = {"facts": {"gpu": "X"}, "systems": {"stock": {"profiles": [window], "errors": ["boom\ntrace"]}}}
    text = phase_report.markdown(doc)
    assert "| prefill | 32K | stock | µs per token | 100 |" in text
    assert "gdn" in text and "gdn-scan" in text and "- stock: boom" in text
    assert "- prefill 32K stock: gdn: chunk_gated_delta_rule_fwd 0.5 x0.01" in text


class _Model:
    """The two calls a profile window watches; no modules to label."""

    def __init__(self) -> None:
        self.modules: list = []

    def forward(self, input_ids, params=None):
        return "forward"

    def prefill(self, input_ids, params=None):
        return "prefill"


class _Graphs:
    def verify(self, state, pages, ids, layout, kvp):
        return ("replay", kvp)


def _record_windows(monkeypatch) -> list:
    """Profile windows opening and closing, recorded instead of run (no profiler): the list they go to."""
    events: list = []

    def start(self):
        events.append("start")
        self._profiler = object()

    def finish(self, per, unit):
        events.append(("finish", per, unit))
        self._plans.pop(0)
        self._profiler = None

    monkeypatch.setattr(phases.PhaseProfiler, "_start", start)
    monkeypatch.setattr(phases.PhaseProfiler, "_finish", finish)
    return events


def test_graph_replays_count_as_rounds(monkeypatch):
    """A tree verify replayed from a CUDA graph calls no model forward; the replay opens and closes round
    windows exactly as a forward would, and closing the profiler removes the wrapper."""
    events = _record_windows(monkeypatch)
    graphs = _Graphs()
    profiler = phases.PhaseProfiler(_Model(), None, graphs)
    profiler.rounds(1024, warm=1, count=2)
    assert graphs.verify(None, [], [1] * 8, None, 1000) == ("replay", 1000)  # before the context
    assert events == []
    for kvp in (1024, 1025, 1026):
        graphs.verify(None, [], [1] * 8, None, kvp)
    assert events == ["start"] and profiler.pending == 1  # skipped one, profiling two
    graphs.verify(None, [], [1] * 8, None, 1027)
    assert events == ["start", ("finish", 2, "round")] and profiler.pending == 0
    profiler.close()
    assert "verify" not in vars(graphs)


class _DraftGraphs:
    def block(self, anchor, pages, kvp, width):
        return ("draft", anchor)


def test_replayed_draft_blocks_are_labelled_draft(monkeypatch):
    """A draft block replayed from a CUDA graph calls no method of the draft model: its call runs inside the
    draft range, and closing the profiler removes the wrapper."""
    ranges: list[str] = []

    class Range:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            ranges.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(phases.torch.profiler, "record_function", Range)
    draft_graphs = _DraftGraphs()
    profiler = phases.PhaseProfiler(_Model(), _Model(), None, draft_graphs)
    assert draft_graphs.block(5, [], 10, 16) == ("draft", 5)
    assert ranges == [phases.PREFIX + "draft"]
    profiler.close()
    assert "block" not in vars(draft_graphs)


def test_grouped_prefills_open_prefill_windows(monkeypatch):
    """A prefill in layer-major groups calls no `model.prefill`; for the profiled model it counts as one
    prefill of all its chunks' rows, another model's groups are not counted, and closing the profiler puts
    the original function back."""
    import torch

    from elpis.exl3 import prefill_groups

    events = _record_windows(monkeypatch)
    calls: list = []
    monkeypatch.setattr(prefill_groups, "prefill_layer_major", lambda m, passes: calls.append(len(passes)))
    wrapped_from = prefill_groups.prefill_layer_major
    model = _Model()
    profiler = phases.PhaseProfiler(model, None)

    def passes(start: int, sizes: list[int]) -> list:
        out = []
        for n in sizes:
            out.append((torch.zeros(1, n), {"cache_seqlens": torch.tensor([start], dtype=torch.int32)}))
            start += n
        return out

    profiler.prefill(16384, tail=8192)
    prefill_groups.prefill_layer_major(model, passes(0, [2048] * 4))  # before the window
    assert events == [] and calls == [4]
    prefill_groups.prefill_layer_major(_Model(), passes(8192, [2048] * 4))  # another model
    assert events == []
    prefill_groups.prefill_layer_major(model, passes(8192, [2048] * 4))
    prefill_groups.prefill_layer_major(model, passes(16384, [2048, 1000]))
    assert events == ["start"]
    model.forward(torch.zeros(1, 8), {"cache_seqlens": torch.tensor([19431], dtype=torch.int32)})
    assert events == ["start", ("finish", 8192 + 3048, "token")]
    # a group that starts before the window but reaches into it opens it, and all its rows count
    events.clear()
    profiler.prefill(32768, tail=4096)
    prefill_groups.prefill_layer_major(model, passes(0, [2048] * 14))  # ends at 28672: not in the window
    assert events == []
    prefill_groups.prefill_layer_major(model, passes(28672, [2048, 1792]))
    model.prefill(torch.zeros(1, 255), {"cache_seqlens": torch.tensor([32512], dtype=torch.int32)})
    model.forward(torch.zeros(1, 8), {"cache_seqlens": torch.tensor([32767], dtype=torch.int32)})
    assert events == ["start", ("finish", 2048 + 1792 + 255, "token")]
    events.clear()
    profiler.prefill(32768, tail=4096)
    prefill_groups.prefill_layer_major(model, passes(0, [2048] * 15 + [1792]))  # one group of sixteen
    model.prefill(torch.zeros(1, 255), {"cache_seqlens": torch.tensor([32512], dtype=torch.int32)})
    model.forward(torch.zeros(1, 8), {"cache_seqlens": torch.tensor([32767], dtype=torch.int32)})
    assert events == ["start", ("finish", 32767, "token")]
    profiler.close()
    assert prefill_groups.prefill_layer_major is wrapped_from
