"""elpis's EXL3 GEMM for 1-16 rows on the GPU (patches/kernels/exl3_gemm_rows.cu). It compiles for sm_86 and
sm_90 with Ampere instructions only (tests/kernels/test_nvcc.py covers every kernel source, and
test_c_signatures.py its ctypes signatures). On the GPU its decode is ExLlamaV3's bit for bit, its error
against the float64 linear is no larger than ExLlamaV3's own GEMM's, and a row's bits do not depend on the
other rows.
"""

from __future__ import annotations

import pytest

from elpis.exl3 import rows_gemm as rg


def test_supported_shapes() -> None:
    assert rg.supported(1, 5120, 17408) and rg.supported(16, 17408, 5120)
    assert not rg.supported(17, 5120, 17408)
    assert rg.supported(8, 5120, 248320, bits=6) and not rg.supported(8, 5120, 17408, bits=5)
    assert not rg.supported(8, 5120 + 16, 1024)


@pytest.fixture(scope="module")
def layer():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("exllamav3")
    from elpis.bench.scripts.rows_gemm_check import random_linear

    g = torch.Generator(device="cuda").manual_seed(5)
    trellises, suh, svh = random_linear(5120, 6144, g, copies=1)
    return trellises[0], suh, svh, g


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


@pytest.mark.gpu
def test_a_group_call_gives_each_linear_with_row_invariance(layer) -> None:
    """Attention's Q/K/V shape: one call for three linears; each member's error against float64 is at the
    single call's level, its fp32 and fp16 outputs agree, and its rows do not depend on the other rows."""
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    from elpis.bench.scripts.rows_gemm_check import blockwise, hadamard, random_linear

    _, _, _, g = layer
    k, widths = 5120, (12288, 1024, 1024)
    linears = [random_linear(k, n, g, copies=1) for n in widths]
    dtypes = (torch.half, torch.float, torch.half)
    members = [rg.Member(t[0], suh, svh, dt) for (t, suh, svh), dt in zip(linears, dtypes, strict=True)]
    x = torch.randn((16, k), generator=g, device="cuda").half()
    ys = rg.rows_gemm_group(x, members)
    h = hadamard("cuda")
    for (t, suh, svh), y, dt in zip(linears, ys, dtypes, strict=True):
        assert y.dtype == dt and y.shape == (16, t[0].shape[1] * 16)
        d = torch.empty((k, y.shape[1]), dtype=torch.half, device="cuda")
        ext.reconstruct(d, t[0], 4, False, True)
        ref = blockwise(blockwise(x.double() * suh.double(), h) @ d.double(), h) * svh.double()
        rel = ((y.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
        assert rel < 1e-3, f"member of width {y.shape[1]}: rms error {rel:.2e}"
    for i in (0, 9):
        alone = rg.rows_gemm_group(x[i : i + 1].contiguous(), members)
        assert all(torch.equal(y[i : i + 1], a) for y, a in zip(ys, alone, strict=True))
    as_half = rg.rows_gemm_group(x, [m._replace(out_dtype=torch.half) for m in members])
    assert torch.equal(as_half[1].view(torch.int16), ys[1].half().view(torch.int16))


@pytest.mark.gpu
def test_the_6_bit_head_format(layer) -> None:
    """A 6-bit trellis (the output head's width): decode bit for bit ExLlamaV3's, error against float64 at
    most its GEMM's, rows independent of the other rows."""
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    from elpis.bench.scripts.rows_gemm_check import blockwise, hadamard, random_linear

    _, _, _, g = layer
    k, n = 5120, 2048
    trellises, suh, svh = random_linear(k, n, g, copies=1, bits=6)
    trellis = trellises[0]
    d = torch.empty((k, n), dtype=torch.half, device="cuda")
    ext.reconstruct(d, trellis, 6, False, True)
    assert torch.equal(rg.decode(trellis).view(torch.int16), d.view(torch.int16))
    x = torch.randn((16, k), generator=g, device="cuda").half()
    ref = blockwise(blockwise(x.double() * suh.double(), hadamard("cuda")) @ d.double(), hadamard("cuda"))
    ref = ref * svh.double()
    ours = rg.rows_gemm(x, trellis, suh, svh, out_dtype=torch.float)
    stock = torch.empty((16, n), dtype=torch.half, device="cuda")
    ext.exl3_gemm(x, trellis, stock, suh, torch.empty_like(x), svh, 0, False, True, 0)
    rms = lambda y: (y.double() - ref).pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(ours) <= rms(stock), f"elpis rms error {rms(ours):.3e} > ExLlamaV3's {rms(stock):.3e}"
    alone = torch.cat(
        [rg.rows_gemm(x[i : i + 1].contiguous(), trellis, suh, svh, torch.float) for i in (0, 15)]
    )
    assert torch.equal(alone, ours[[0, 15]])


@pytest.mark.gpu
def test_repeated_and_crowded_calls_give_the_same_bits_and_leave_the_sync_words_zero(layer) -> None:
    # the last-block counting and the counters' reset on the hardware: a call alone, then calls beside a
    # matmul on another stream (some blocks start late), back to back with no sync between
    import torch

    trellis, suh, svh, g = layer
    x = torch.randn((16, trellis.shape[0] * 16), generator=g, device="cuda").half()
    want = rg.rows_gemm(x, trellis, suh, svh)
    other = torch.cuda.Stream()
    a = torch.randn((4096, 4096), generator=g, device="cuda").half()
    other.wait_stream(torch.cuda.current_stream())
    got = []
    for i in range(40):
        if i % 2:
            with torch.cuda.stream(other):
                a = (a @ a).clamp_(-1.0, 1.0)
        got.append(rg.rows_gemm(x, trellis, suh, svh))
    torch.cuda.synchronize()
    assert all(torch.equal(y.view(torch.int16), want.view(torch.int16)) for y in got)
    assert not rg.sync_words(str(x.device)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [3, 16])
def test_channel_major_output_is_the_fp16_output_cast_to_bf16(layer, rows: int) -> None:
    """The output mode the switch exl3-gdn-qkv-channel-major uses: a member asked for bf16 gets the bits of
    its fp16 output cast to bf16, [n, rows] in memory (returned as the [rows, n] view); its fp32 neighbour in
    the same call is unchanged."""
    import torch

    trellis, suh, svh, g = layer
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    x = torch.randn((rows, k), generator=g, device="cuda").half()

    def call(first: torch.dtype) -> list[torch.Tensor]:
        members = [rg.Member(trellis, suh, svh, first), rg.Member(trellis, suh, svh, torch.float)]
        return rg.rows_gemm_group(x, members)

    plain, cm = call(torch.half), call(torch.bfloat16)
    assert cm[0].dtype == torch.bfloat16 and cm[0].shape == (rows, n) and cm[0].stride() == (1, rows)
    assert torch.equal(cm[0].view(torch.int16), plain[0].to(torch.bfloat16).view(torch.int16))
    assert torch.equal(cm[1], plain[1])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [3, 16])
def test_silu_mul_input_is_exllamav3s_activation_then_the_gemm(layer, rows: int) -> None:
    """The entry the switch exl3-mlp-act-input uses: the activation it writes is ExLlamaV3's `silu_mul` bit
    for bit, also in place over u as ExLlamaV3's MLP may call it, and its output is the plain GEMM's of that
    activation, bit for bit."""
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    trellis, suh, svh, g = layer
    k = trellis.shape[0] * 16
    gate = (3 * torch.randn((rows, k), generator=g, device="cuda")).half()
    up = torch.randn((rows, k), generator=g, device="cuda").half()
    stock = torch.empty_like(gate)
    ext.silu_mul(gate, up, stock, 0.0)
    member = rg.Member(trellis, suh, svh, torch.half)
    (y,), act = rg.rows_gemm_silu_mul(gate, up, [member])
    assert torch.equal(act.view(torch.int16), stock.view(torch.int16))
    assert torch.equal(y.view(torch.int16), rg.rows_gemm(stock, trellis, suh, svh).view(torch.int16))
    in_place = up.clone()
    (y2,), _ = rg.rows_gemm_silu_mul(gate, in_place, [member], act=in_place)
    assert torch.equal(in_place.view(torch.int16), stock.view(torch.int16))
    assert torch.equal(y2.view(torch.int16), y.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [3, 16])
@pytest.mark.parametrize("bf16_weight", [False, True])
def test_norm_input_is_exllamav3s_norm_then_the_gemm(layer, rows: int, bf16_weight: bool) -> None:
    """The entry the switch exl3-norm-input uses: y and the residual it writes back are ExLlamaV3's
    `rms_norm_res_in` bit for bit (x fp16, and x fp32 as a Qwen3.5 block's sublayers give it), y of an fp32
    input without a residual its `rms_norm`'s, and the GEMM over the fragments written with y is the plain
    GEMM's of y, bit for bit."""
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    trellis, suh, svh, g = layer
    k = trellis.shape[0] * 16
    weight = (0.1 * torch.randn(k, generator=g, device="cuda")).to(
        torch.bfloat16 if bf16_weight else torch.half
    )
    members = [rg.Member(trellis, suh, svh, torch.half), rg.Member(trellis, suh, svh, torch.float)]
    x = torch.randn((rows, k), generator=g, device="cuda").half()
    residual = 3 * torch.randn((rows, k), generator=g, device="cuda")
    stock_y, stock_residual = torch.empty_like(x), residual.clone()
    ext.rms_norm_res_in(x, weight, stock_y, stock_residual, 1e-6, 1.0, 1.0)
    y, frags = rg.norm_input(x, weight, 1e-6, 1.0, 1.0, [m.suh for m in members], residual=residual)
    assert torch.equal(y.view(torch.int16), stock_y.view(torch.int16))
    assert torch.equal(residual.view(torch.int32), stock_residual.view(torch.int32))
    for got, plain in zip(
        rg.rows_gemm_frags(frags, rows, k, members), rg.rows_gemm_group(y, members), strict=True
    ):
        assert torch.equal(got, plain)
    xf = torch.randn((rows, k), generator=g, device="cuda")
    residual = 3 * torch.randn((rows, k), generator=g, device="cuda")
    stock_y, stock_residual = torch.empty((rows, k), dtype=torch.half, device="cuda"), residual.clone()
    ext.rms_norm_res_in(xf, weight, stock_y, stock_residual, 1e-6, 1.0, 1.0)
    y, frags = rg.norm_input(xf, weight, 1e-6, 1.0, 1.0, [suh], residual=residual)
    assert torch.equal(y.view(torch.int16), stock_y.view(torch.int16))
    assert torch.equal(residual.view(torch.int32), stock_residual.view(torch.int32))
    assert torch.equal(rg.rows_gemm_frags(frags, rows, k, members[:1])[0], rg.rows_gemm(y, trellis, suh, svh))
    stock_y = torch.empty((rows, k), dtype=torch.half, device="cuda")
    ext.rms_norm(xf, weight, stock_y, 1e-6, 1.0, 1.0, False, False, 1)
    y, frags = rg.norm_input(xf, weight, 1e-6, 1.0, 1.0, [suh])
    assert torch.equal(y.view(torch.int16), stock_y.view(torch.int16))
    assert torch.equal(rg.rows_gemm_frags(frags, rows, k, members[:1])[0], rg.rows_gemm(y, trellis, suh, svh))


@pytest.mark.gpu
def test_the_served_build_passes_the_decode_check_load_backend_makes() -> None:
    """elpis.exl3.decode_check on the GPU, as load_backend runs it before loading a model with elpis's GEMM:
    the served build's decode of its seeded 4- and 6-bit trellises, bit for bit the format's."""
    import torch

    from elpis.exl3 import decode_check

    assert decode_check.check_decode(decode_check.gpu_decode(torch.device("cuda"))) > 0
