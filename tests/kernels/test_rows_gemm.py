"""elpis's EXL3 GEMM for 1-16 rows on the GPU (patches/kernels/exl3_gemm_rows.cu). It compiles for sm_86 and
sm_90 with Ampere instructions only (tests/kernels/test_nvcc.py covers every kernel source, and
test_c_signatures.py its ctypes signatures). On the GPU its decode is ExLlamaV3's bit for bit, its error
against the float64 linear is no larger than ExLlamaV3's own GEMM's, and a row's bits do not depend on the
other rows.
"""

from __future__ import annotations

import math

import pytest

from elpis.exl3 import rows_gemm as rg


def test_supported_shapes() -> None:
    assert rg.supported(1, 5120, 17408) and rg.supported(16, 17408, 5120)
    assert not rg.supported(17, 5120, 17408)
    assert not rg.supported(8, 5120, 17408, bits=6)
    assert not rg.supported(8, 5120 + 16, 1024)


@pytest.fixture(scope="module")
def layer():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("exllamav3")
    g = torch.Generator(device="cuda").manual_seed(5)
    k, n = 5120, 6144
    trellis = torch.randint(
        -32768, 32768, (k // 16, n // 16, 64), dtype=torch.int16, device="cuda", generator=g
    )
    suh = (torch.randint(0, 2, (k,), device="cuda", generator=g) * 2 - 1).half()
    svh = ((torch.rand(n, device="cuda", generator=g) * 0.5 + 0.5) / math.sqrt(k)).half()
    return trellis, suh, svh, g


@pytest.mark.gpu
def test_decode_is_exllamav3s_bit_for_bit(layer) -> None:
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    trellis, _, _, _ = layer
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    stock = torch.empty((k, n), dtype=torch.half, device="cuda")
    ext.reconstruct(stock, trellis, 4, False, True)
    assert torch.equal(rg.decode(trellis).view(torch.int16), stock.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_error_against_float64_is_at_most_exllamav3s(layer, rows: int) -> None:
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    from elpis.bench.scripts.rows_gemm_check import blockwise, hadamard

    trellis, suh, svh, g = layer
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    d = torch.empty((k, n), dtype=torch.half, device="cuda")
    ext.reconstruct(d, trellis, 4, False, True)
    h = hadamard("cuda")
    x = torch.randn((rows, k), generator=g, device="cuda").half()
    ref = blockwise(blockwise(x.double() * suh.double(), h) @ d.double(), h) * svh.double()
    ours = rg.rows_gemm(x, trellis, suh, svh)
    stock = torch.empty((rows, n), dtype=torch.half, device="cuda")
    ext.exl3_gemm(x, trellis, stock, suh, torch.empty_like(x), svh, 0, False, True, 0)
    rms = lambda y: (y.double() - ref).pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(ours) <= rms(stock), f"elpis rms error {rms(ours):.3e} > ExLlamaV3's {rms(stock):.3e}"
    assert rms(ours) < 1e-3 * ref.pow(2).mean().sqrt().item()


@pytest.mark.gpu
def test_rows_do_not_depend_on_the_other_rows(layer) -> None:
    import torch

    trellis, suh, svh, g = layer
    x = torch.randn((16, trellis.shape[0] * 16), generator=g, device="cuda").half()
    y16 = rg.rows_gemm(x, trellis, suh, svh)
    y8 = rg.rows_gemm(x[:8].contiguous(), trellis, suh, svh)
    alone = torch.cat([rg.rows_gemm(x[i : i + 1].contiguous(), trellis, suh, svh) for i in range(16)])
    assert torch.equal(y16[:8].view(torch.int16), y8.view(torch.int16))
    assert torch.equal(y16.view(torch.int16), alone.view(torch.int16))
    y32 = rg.rows_gemm(x, trellis, suh, svh, out_dtype=torch.float)
    assert torch.equal(y32.half().view(torch.int16), y16.view(torch.int16))
