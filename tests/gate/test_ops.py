"""The per-op harness: registry, cells, the "never less precise than stock" bar, and the reference ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elpis.gate.ops import GateOp, OpInputs, load_ops, measure, precision_bar, save
from elpis.gate.patching import recorded, replaced


def _sum_op(candidates: dict) -> GateOp:
    """y = x @ w over random operands: stock fp32, exact fp64."""

    def inputs(context: int, rows: int):
        gen = torch.Generator().manual_seed(rows)
        for layer in range(3):
            x = torch.randn(rows, 256, generator=gen)
            w = torch.randn(64, 256, generator=gen)
            yield OpInputs({"x": x, "w": w}, label=f"layer {layer}")

    return GateOp(
        name="toy.gemm",
        description="toy",
        stock=lambda o: o.tensors["x"] @ o.tensors["w"].T,
        exact=lambda o: o.tensors["x"].double() @ o.tensors["w"].double().T,
        inputs=inputs,
        contexts=(0,),
        rows=(1, 16),
        candidates=candidates,
    )


def test_bar_passes_a_more_precise_candidate_and_fails_a_worse_one(tmp_path: Path) -> None:
    op = _sum_op(
        {
            "fp64-accumulate": lambda o: (o.tensors["x"].double() @ o.tensors["w"].double().T).float(),
            "bf16": lambda o: (o.tensors["x"].bfloat16() @ o.tensors["w"].bfloat16().T).float(),
            "nan": lambda o: torch.full((o.tensors["x"].shape[0], 64), float("nan")),
        }
    )
    results = measure([op])
    assert [(c.context, c.rows, c.samples) for c in results] == [(0, 1, 3), (0, 16, 3)]
    for cell in results:
        assert 0 < cell.stats["stock"].mean < 1e-6
        assert cell.stats["stock"].count == cell.rows * 64 * 3
    bars = precision_bar(results)
    assert bars["fp64-accumulate"]["pass"] and bars["fp64-accumulate"]["cells"] == 2
    assert not bars["bf16"]["pass"] and len(bars["bf16"]["worse"]) == 2
    assert not bars["nan"]["pass"]  # NaN is an infinite error, never "as precise"
    record = save(results, tmp_path / "ops.json", {"backend": "toy"})
    again = json.loads((tmp_path / "ops.json").read_text())
    assert again["bar"] == json.loads(json.dumps(record["bar"]))
    assert {c["op"] for c in again["cells"]} == {"toy.gemm"}


def test_exact_must_be_float64() -> None:
    op = _sum_op({})
    bad = GateOp(op.name, op.description, op.stock, op.stock, op.inputs, op.contexts, op.rows)
    with pytest.raises(TypeError, match="float64"):
        measure([bad])


def test_unknown_backend_and_unloadable_provider_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        load_ops("tpu", None, {})


def test_replaced_and_recorded_restore_the_originals() -> None:
    from elpis.reference import layers
    from elpis.reference import model as model_module

    original = layers.rms_norm
    with pytest.raises(RuntimeError, match="boom"), replaced("elpis.reference", {original: lambda *a: 1 / 0}):
        assert model_module.rms_norm is not original  # reached through the model's own import
        raise RuntimeError("boom")
    assert layers.rms_norm is original and model_module.rms_norm is original
    with recorded("elpis.reference", {"rms_norm": original}) as calls:
        model_module.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6)
    assert len(calls["rms_norm"]) == 1 and model_module.rms_norm is original
    with pytest.raises(RuntimeError, match="nothing to replace"), replaced("elpis.reference", {len: len}):
        pass


@pytest.mark.slow
def test_reference_ops_on_real_activations(tiny_model: Path) -> None:
    ops = {op.name: op for op in load_ops("reference", tiny_model, {"tokens": "40", "layers": "2"})}
    assert set(ops) == {"attention", "attention.cq3", "gdn.prefill", "gdn.verify", "rmsnorm", "gemm"}
    results = measure(list(ops.values()), contexts=[16], rows=[1, 8])
    by = {(c.op, c.rows): c for c in results}
    for cell in results:
        assert cell.samples == 2  # one operand set per captured layer
        assert cell.stats["stock"].max < 1e-3  # fp32 against fp64 on the same operands
    # The cq3 cache is coarse, but the error is measured against fp64 on the *same* dequantised operands.
    assert by[("attention.cq3", 8)].stats["stock"].mean < 1e-5
    bars = precision_bar(results)
    assert bars["fp64-accumulate"]["pass"]
    assert not bars["qk-int8"]["pass"] and not bars["qk-bf16"]["pass"]
    assert by[("attention", 8)].stats["qk-int8"].mean > 100 * by[("attention", 8)].stats["stock"].mean
    with pytest.raises(ValueError, match="captured tokens"):
        measure([ops["attention"]], contexts=[39], rows=[8])
    with pytest.raises(ValueError, match="unknown reference op option"):
        load_ops("reference", tiny_model, {"bogus": "1"})
