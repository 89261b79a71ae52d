"""GPU tests of the Gated DeltaNet gate projections kernel (patches/kernels/gdn_ba_rows.cu) at the real
geometry (hidden 5120, 48 value heads): error against float64 next to ExLlamaV3's own fp16 GEMM with fp32
output (`hgemm`, what its fp16 linears run), bitwise row invariance, refusals, and a timing line against
two `hgemm` calls (b and a, as the tree verify's torch path makes them). Results go to $ELPIS_KERNEL_LOG
(JSON lines) when set.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from elpis.exl3 import gdn_ba
from tests.kernels.timing import graph_us

pytestmark = pytest.mark.gpu

HIDDEN, HEADS = 5120, 48
LAYERS = 48  # calls per captured graph in the timing line: one per GDN layer


def _log(record: dict) -> None:
    line = json.dumps({"test": "gdn_ba", **record}, sort_keys=True)
    print(line)
    path = os.environ.get("ELPIS_KERNEL_LOG")
    if path:
        with Path(path).open("a") as fh:
            fh.write(line + "\n")


def _operands(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, HIDDEN), generator=gen).half().cuda()
    wb = (torch.randn((HIDDEN, HEADS), generator=gen) / HIDDEN**0.5).half().cuda()
    wa = (torch.randn((HIDDEN, HEADS), generator=gen) / HIDDEN**0.5).half().cuda()
    return x, wb, wa


def _hgemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ext = pytest.importorskip("exllamav3.ext").exllamav3_ext
    y = torch.empty((x.shape[0], w.shape[1]), dtype=torch.float32, device=x.device)
    ext.hgemm(x, w, y)
    return y


def test_error_against_float64_next_to_exllamav3() -> None:
    record: dict = {"check": "fp64", "unit": "mean |y - y64| / rms(y64)"}
    for rows in (1, 8, 16):
        x, wb, wa = _operands(rows, seed=rows)
        b, a = gdn_ba.gdn_ba(x, gdn_ba.transposed_weights(wb, wa))
        for name, got, w in (("b", b, wb), ("a", a, wa)):
            exact = x.double() @ w.double()
            rms = exact.pow(2).mean().sqrt()
            err = ((got.double() - exact).abs().mean() / rms).item()
            stock = ((_hgemm(x, w).double() - exact).abs().mean() / rms).item()
            record[f"{name}_rows{rows}"] = [err, stock]
            bound = ((x.double().abs() @ w.double().abs()) * 1e-5).clamp_min(1e-30)
            assert bool(((got.double() - exact).abs() <= bound).all()), f"{name}, {rows} rows"
    _log(record)


def test_a_row_does_not_depend_on_the_others() -> None:
    x, wb, wa = _operands(16, seed=7)
    wt = gdn_ba.transposed_weights(wb, wa)
    b16, a16 = gdn_ba.gdn_ba(x, wt)
    for r in range(16):
        b, a = gdn_ba.gdn_ba(x[r : r + 1].contiguous(), wt)
        assert torch.equal(b[0].view(torch.int32), b16[r].view(torch.int32)), f"row {r} of b"
        assert torch.equal(a[0].view(torch.int32), a16[r].view(torch.int32)), f"row {r} of a"
    other = x.clone()
    other[1:] = torch.randn_like(other[1:].float()).half()
    b, a = gdn_ba.gdn_ba(other, wt)
    assert torch.equal(b[0], b16[0]) and torch.equal(a[0], a16[0]), "rewriting the other rows changed row 0"


def test_bad_inputs_are_refused() -> None:
    x, wb, wa = _operands(4, seed=1)
    wt = gdn_ba.transposed_weights(wb, wa)
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        gdn_ba.gdn_ba(torch.zeros((17, HIDDEN), dtype=torch.half, device="cuda"), wt)
    with pytest.raises(ValueError, match="float16"):
        gdn_ba.gdn_ba(x.float(), wt)
    with pytest.raises(ValueError, match="shape"):
        gdn_ba.gdn_ba(x[:, :100].contiguous(), wt)
    with pytest.raises(ValueError, match="contiguous"):
        gdn_ba.gdn_ba(x.t(), wt)
    with pytest.raises(ValueError, match="multiple of 4"):
        gdn_ba.transposed_weights(wb[:, :3].contiguous(), wa[:, :3].contiguous())
    with pytest.raises(ValueError, match="multiple of 8"):
        gdn_ba.gdn_ba(x[:, :100].contiguous(), wt[:, :100].contiguous())
    with pytest.raises(ValueError, match="16-byte aligned"):
        gdn_ba.gdn_ba(torch.zeros(4 * HIDDEN + 1, dtype=torch.half, device="cuda")[1:].view(4, HIDDEN), wt)


def _each_layer(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One call of the next layer's, round robin (the graph's 48 calls read 48 layers' weights, ~47 MB, as a
    round does, not one layer's 1 MB from L2 48 times)."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def test_timing_line() -> None:
    record: dict = {"check": "timing", "unit": "us per layer (b and a), 48 layers' weights per graph"}
    layers = [_operands(1, seed=100 + i)[1:] for i in range(LAYERS)]
    transposed = [gdn_ba.transposed_weights(wb, wa) for wb, wa in layers]
    for rows in (1, 8, 16):
        x = _operands(rows, seed=rows)[0]
        ours = _each_layer([lambda x=x, wt=wt: gdn_ba.gdn_ba(x, wt) for wt in transposed])
        theirs = _each_layer([lambda x=x, wb=wb, wa=wa: (_hgemm(x, wb), _hgemm(x, wa)) for wb, wa in layers])
        record[f"elpis_rows{rows}"] = round(graph_us(ours, LAYERS, 21), 2)
        record[f"hgemm_x2_rows{rows}"] = round(graph_us(theirs, LAYERS, 21), 2)
    record["device"] = torch.cuda.get_device_name()
    _log(record)
    assert record["elpis_rows16"] > 0
