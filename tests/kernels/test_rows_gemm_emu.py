"""elpis's EXL3 GEMM for 1-16 rows (patches/kernels/exl3_gemm_rows.cu) on the CPU, through the CUDA
emulation of tests/kernels/cuda_emu.py. Its decode of 4- and 6-bit trellises is bit for bit the format's
(elpis.exl3.trellis_ref); its
GEMM agrees with the float64 EXL3 linear within the fp16 rounding of the activations and the output; a row's
result does not depend on the other rows or on how many there are. The mma is emulated in fp32 per warp; the
tensor cores' own bits are checked on the GPU (tests/kernels/test_rows_gemm.py).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from elpis.exl3 import rows_gemm as rg
from elpis.exl3 import trellis_ref as ref


@pytest.fixture(scope="module")
def lib(rows_gemm_emu: ctypes.CDLL) -> ctypes.CDLL:
    return rows_gemm_emu


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


class Linear:
    """A random mul1 EXL3 linear k -> n of `bits` per weight: unit-scale suh signs, svh ~ 1/sqrt(k)."""

    def __init__(self, k: int, n: int, seed: int, bits: int = 4) -> None:
        rng = np.random.default_rng(seed)
        self.k, self.n, self.bits = k, n, bits
        self.trellis = rng.integers(0, 1 << 16, size=(k // 16, n // 16, 16 * bits)).astype(np.uint16)
        self.suh = rng.choice([-1.0, 1.0], size=k).astype(np.float16)
        self.svh = (rng.uniform(0.5, 1.0, size=n) * rng.choice([-1, 1], size=n) / np.sqrt(k)).astype(
            np.float16
        )

    def run(self, lib: ctypes.CDLL, x: np.ndarray, out_f32: bool = False) -> np.ndarray:
        return run_group(lib, x, [self], [out_f32])[0]

    def exact(self, x: np.ndarray) -> np.ndarray:
        return ref.linear(x.astype(np.float64), self.trellis, self.suh, self.svh, self.bits)


def _launch_modes(
    lib: ctypes.CDLL, x: np.ndarray, layers: list[Linear], modes: int, outs: list[np.ndarray]
) -> tuple[int, np.ndarray]:
    """One call of the kernel with raw output modes (see rg.BF16_SHIFT) into `outs`: its return code and
    the counters."""
    x = np.ascontiguousarray(x, dtype=np.float16)
    return _launch(lib, lib.elpis_rows_gemm, (_ptr(x),), x.shape, layers, modes, outs)


def _launch(
    lib: ctypes.CDLL,
    entry,
    lead: tuple,
    shape: tuple[int, int],
    layers: list[Linear],
    modes: int,
    outs: list[np.ndarray],
    frag: np.ndarray | None = None,
) -> tuple[int, np.ndarray]:
    """One call of `entry` (after its input arguments `lead`) for an input of `shape`, over the fragments
    `frag` (default: new ones): its return code and the counters."""
    m, k = shape
    n_total, bits = sum(lay.n for lay in layers), layers[0].bits
    if frag is None:
        frag = np.zeros(int(lib.elpis_rows_gemm_frag_halves(m, k)) * len(layers), dtype=np.float16)
    floats = int(lib.elpis_rows_gemm_workspace_floats(m, k, n_total, bits))
    work = np.zeros(max(floats, 1), dtype=np.float32)
    counters = np.zeros(rg.MAX_COUNTERS, dtype=np.uint32)
    err = entry(
        *lead, m, k, len(layers), rg.void_ptrs(*(_ptr(lay.suh) for lay in layers)),
        rg.void_ptrs(*(_ptr(lay.trellis) for lay in layers)),
        rg.void_ptrs(*(_ptr(lay.svh) for lay in layers)),
        rg.void_ptrs(*(_ptr(y) for y in outs)), (ctypes.c_uint32 * len(layers))(*(lay.n for lay in layers)),
        modes, bits, _ptr(frag), frag.size, _ptr(work), floats, _ptr(counters), counters.size, None,
    )  # fmt: skip
    return err, counters


def launch_group(
    lib: ctypes.CDLL, x: np.ndarray, layers: list[Linear], out_f32: list[bool]
) -> tuple[int, list[np.ndarray], np.ndarray]:
    """One call of the kernel for linears sharing x (their k): its return code, the outputs (NaN where
    nothing was written) and the counters."""
    outs = [
        np.full((x.shape[0], lay.n), np.nan, dtype=np.float32 if f32 else np.float16)
        for lay, f32 in zip(layers, out_f32, strict=True)
    ]
    modes = sum(1 << i for i, f in enumerate(out_f32) if f)
    err, counters = _launch_modes(lib, x, layers, modes, outs)
    return err, outs, counters


def run_group(lib: ctypes.CDLL, x: np.ndarray, layers: list[Linear], out_f32: list[bool]) -> list[np.ndarray]:
    """One call of the kernel for linears sharing x (their k); every output checked to be written."""
    err, outs, counters = launch_group(lib, x, layers, out_f32)
    assert err == 0
    assert not counters.any(), "the last block of each n-block must leave its counter zero"
    assert all(not np.isnan(y).any() for y in outs), "every output column is written"
    return outs


@pytest.mark.parametrize("bits", [4, 6])
def test_decode_is_the_formats_bit_for_bit(lib: ctypes.CDLL, bits: int) -> None:
    rng = np.random.default_rng(bits)
    trellis = rng.integers(0, 1 << 16, size=(3, 5, 16 * bits)).astype(np.uint16)
    d = np.zeros((48, 80), dtype=np.float16)
    assert lib.elpis_rows_gemm_decode(_ptr(trellis), _ptr(d), 48, 80, bits, None) == 0
    want = ref.decoded(trellis, bits)
    assert np.array_equal(d.view(np.uint16), want.view(np.uint16))
    assert lib.elpis_rows_gemm_decode(_ptr(trellis), _ptr(d), 48, 80, 5, None) != 0  # no 5-bit decode


def test_reference_decodes_to_unit_gaussian_values() -> None:
    # mul1 of uniformly random states is close to N(0, 1): the reference's codebook is the format's
    values = ref.decode_mul1(np.arange(1 << 16)).astype(np.float64)
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1.0) < 0.03


def _tolerance(y: np.ndarray) -> float:
    # fp16 activations (2^-11 relative) carried through both unit-norm transforms, plus fp16 output rounding
    return 4e-3 * float(np.abs(y).max()) + 1e-3


@pytest.mark.parametrize(
    ("rows", "k", "n", "out_f32", "bits"),
    [(1, 256, 128, False, 4), (8, 512, 128, True, 4), (13, 256, 256, False, 4), (11, 256, 256, True, 6)],
)
def test_gemm_agrees_with_the_float64_linear(
    lib: ctypes.CDLL, rows: int, k: int, n: int, out_f32: bool, bits: int
) -> None:
    layer = Linear(k, n, seed=rows, bits=bits)
    x = np.random.default_rng(rows + 100).standard_normal((rows, k)).astype(np.float16)
    got = layer.run(lib, x, out_f32).astype(np.float64)
    want = layer.exact(x)
    err = np.abs(got - want).max()
    assert err <= _tolerance(want), f"max error {err} against max |y| {np.abs(want).max()}"
    # a wrong tile order, transform or fragment would be off by O(|y|), not by rounding
    assert np.abs(want).max() > 0.1


@pytest.mark.parametrize(
    ("k", "n", "blocks"),
    [
        (512, 128, 4),  # one n-block shared by four blocks: partials summed by the last to arrive
        (384, 512, 8),  # 12 units on 8 blocks: blocks that span two n-blocks
        (128, 1280, 8),  # 10 units on 8 blocks: blocks that hold whole n-blocks and finish them alone
        (2048, 128, 8),  # 16 units on 8 blocks: eight partials of one n-block, summed over rounds of loads
    ],
)
def test_stream_k_covers_every_unit_once(lib: ctypes.CDLL, k: int, n: int, blocks: int) -> None:
    assert int(lib.elpis_rows_gemm_resident_blocks(4)) == 8
    assert int(lib.elpis_rows_gemm_blocks(k, n, 4)) == blocks
    layer = Linear(k, n, seed=k + n)
    x = np.zeros((2, k), dtype=np.float16)
    x[0, 3] = 1.0  # one input: y = e3 * W, every unit but one contributes exact zeros
    x[1] = np.random.default_rng(8).standard_normal(k)
    got = layer.run(lib, x).astype(np.float64)
    want = layer.exact(x)
    assert np.abs(got - want).max() <= _tolerance(want)


@pytest.mark.parametrize("bits", [4, 6])
def test_a_row_does_not_depend_on_the_other_rows(lib: ctypes.CDLL, bits: int) -> None:
    layer = Linear(256, 128, seed=3, bits=bits)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 256)).astype(np.float16)
    batch16 = layer.run(lib, x)
    batch8 = layer.run(lib, x[:8])
    alone = np.stack([layer.run(lib, x[i : i + 1])[0] for i in (0, 5, 9, 15)])
    assert np.array_equal(batch16[:8].view(np.uint16), batch8.view(np.uint16))
    assert np.array_equal(batch16[[0, 5, 9, 15]].view(np.uint16), alone.view(np.uint16))
    other = x.copy()
    other[1:] = rng.standard_normal((15, 256))
    assert np.array_equal(layer.run(lib, other)[0].view(np.uint16), batch16[0].view(np.uint16))


@pytest.mark.parametrize("rows", [3, 12])
def test_a_group_of_linears_sharing_the_input_is_each_linear(lib: ctypes.CDLL, rows: int) -> None:
    # 2 + 1 + 3 n-blocks of k = 384: 18 units on 8 blocks, so blocks span members (a wide and a narrow
    # member's n-blocks in one block) and members' n-blocks are shared between blocks
    layers = [Linear(384, 256, seed=20), Linear(384, 128, seed=21), Linear(384, 384, seed=22)]
    assert int(lib.elpis_rows_gemm_blocks(384, 768, 4)) == 8
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float16)
    outs = run_group(lib, x, layers, [False, True, False])
    assert [y.dtype for y in outs] == [np.float16, np.float32, np.float16]
    for layer, y in zip(layers, outs, strict=True):
        want = layer.exact(x)
        assert np.abs(y.astype(np.float64) - want).max() <= _tolerance(want)
    # row invariance holds inside a group too
    alone = run_group(lib, x[1:2], layers, [False, True, False])
    for y, y1 in zip(outs, alone, strict=True):
        assert np.array_equal(y[1:2], y1)


def test_sizes_and_refusals(lib: ctypes.CDLL) -> None:
    assert lib.elpis_rows_gemm_supported(16, 5120, 17408) == 1
    assert lib.elpis_rows_gemm_supported(17, 5120, 17408) == 0
    assert lib.elpis_rows_gemm_supported(8, 5120 + 16, 128) == 0
    assert lib.elpis_rows_gemm_supported(8, 5120, 100) == 0
    assert lib.elpis_rows_gemm_frag_halves(8, 256) == 256 * 16
    assert lib.elpis_rows_gemm_frag_halves(9, 256) == 256 * 32
    assert lib.elpis_rows_gemm_max_members() == rg.MAX_MEMBERS
    assert [lib.elpis_rows_gemm_bits_supported(b) for b in range(1, 9)] == [b in rg.BITS for b in range(1, 9)]
    assert (
        lib.elpis_rows_gemm_blocks(256, 128, 5) == 0
        and lib.elpis_rows_gemm_workspace_floats(1, 256, 128, 3) == 0
    )
    assert lib.elpis_rows_gemm_max_nblocks() == rg.MAX_COUNTERS
    counters = np.zeros(1, dtype=np.uint32)
    x = np.zeros((1, 256), dtype=np.float16)
    nulls = rg.void_ptrs(None)
    one = (ctypes.c_uint32 * 1)(128)

    def call(count: int, frag_halves: int, bits: int = 4) -> int:
        return lib.elpis_rows_gemm(
            _ptr(x), 1, 256, count, nulls, nulls, nulls, nulls, one, 0, bits, _ptr(x), frag_halves, None, 0,
            _ptr(counters), 1, None,
        )  # fmt: skip

    # a scratch smaller than the sizes say, no member or too many, or another width: refused before any launch
    assert call(1, 0) != 0
    assert call(0, 1 << 20) != 0
    assert call(rg.MAX_MEMBERS + 1, 1 << 20) != 0
    assert call(1, 1 << 20, bits=5) != 0


def test_output_scales_off_their_8_byte_boundary_are_refused(lib: ctypes.CDLL) -> None:
    # the kernel reads a lane's four scales in one 8-byte load: a misaligned svh is refused, not read torn
    layer = Linear(256, 128, seed=9)
    x = np.random.default_rng(9).standard_normal((2, 256)).astype(np.float16)
    want = layer.run(lib, x)
    shifted = np.zeros(layer.n + 4, dtype=np.float16)
    shifted[1 : layer.n + 1] = layer.svh  # starts 2 bytes past an aligned address
    assert shifted.ctypes.data % 8 == 0
    layer.svh = shifted[1 : layer.n + 1]
    assert layer.svh.ctypes.data % 8 == 2
    err, outs, _ = launch_group(lib, x, [layer], [False])
    assert err != 0 and np.isnan(outs[0]).all()  # refused before any launch: nothing written
    layer.svh = layer.svh.copy()  # the same scales in a fresh (aligned) array: the same result as before
    assert layer.svh.ctypes.data % 8 == 0
    assert np.array_equal(layer.run(lib, x).view(np.uint16), want.view(np.uint16))


def _bf16_bits(y: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns of float32 values, rounded to nearest even (finite values)."""
    u = np.ascontiguousarray(y, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("rows", [3, 16])
def test_channel_major_output_is_the_fp16_output_cast_to_bf16(lib: ctypes.CDLL, rows: int) -> None:
    """Member 0 (the GDN qkv's place) asked for bf16 channel-major, member 1 for fp32 (z's), in one call:
    member 0's [n, rows] buffer holds exactly the bits of its fp16 output cast to bf16 (what ExLlamaV3's
    `.to(torch.bfloat16)` makes of it), transposed; member 1 is unchanged by its neighbour's mode."""
    qkv, z = Linear(256, 384, seed=7), Linear(256, 256, seed=8)
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float16)
    plain = run_group(lib, x, [qkv, z], [False, True])
    cm = np.full((qkv.n, rows), 0xFFFF, dtype=np.uint16)
    z_out = np.full((rows, z.n), np.nan, dtype=np.float32)
    assert _launch_modes(lib, x, [qkv, z], (1 << rg.BF16_SHIFT) | 0b10, [cm, z_out])[0] == 0
    assert np.array_equal(cm, _bf16_bits(plain[0].astype(np.float32)).T)
    assert np.array_equal(z_out, plain[1])


def test_an_impossible_output_mode_is_refused(lib: ctypes.CDLL) -> None:
    layer = Linear(128, 128, seed=9)
    x = np.zeros((2, 128), dtype=np.float16)
    out = [np.zeros((2, 128), dtype=np.float32)]
    assert _launch_modes(lib, x, [layer], 1 | (1 << rg.BF16_SHIFT), out)[0] != 0  # fp32 and bf16 at once
    assert _launch_modes(lib, x, [layer], 1 << (rg.BF16_SHIFT + 1), out)[0] != 0  # a member not there


def _silu_mul(
    lib: ctypes.CDLL, g: np.ndarray, u: np.ndarray, layer: Linear
) -> tuple[int, np.ndarray, np.ndarray]:
    """One call of the SiLU-and-multiply entry: its return code, the activation it wrote and the output."""
    act = np.full(g.shape, np.nan, dtype=np.float16)
    y = np.full((g.shape[0], layer.n), np.nan, dtype=np.float16)
    lead = (_ptr(g), _ptr(u), _ptr(act))
    err, counters = _launch(lib, lib.elpis_rows_gemm_silu_mul, lead, g.shape, [layer], 0, [y])
    assert not counters.any()
    return err, act, y


@pytest.mark.parametrize("rows", [3, 16])
def test_silu_mul_input_is_the_gemm_of_its_own_activation(lib: ctypes.CDLL, rows: int) -> None:
    """The entry that takes an MLP's gate and up outputs writes act = silu(g) * u (here within a few fp16
    roundings of float64: exp and the reciprocal are the CPU's under the emulation; the GPU test compares it
    with ExLlamaV3's own kernel bit for bit), and its output is bit for bit the plain entry's on that act."""
    down = Linear(256, 128, seed=11)
    rng = np.random.default_rng(rows)
    g = (2 * rng.standard_normal((rows, 256))).astype(np.float16)
    u = rng.standard_normal((rows, 256)).astype(np.float16)
    err, act, y = _silu_mul(lib, g, u, down)
    assert err == 0
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    want = g64 / (1.0 + np.exp(-g64)) * u64
    assert np.allclose(act.astype(np.float64), want, rtol=4e-3, atol=1e-4)
    assert np.array_equal(y.view(np.uint16), run_group(lib, act, [down], [False])[0].view(np.uint16))


def test_silu_mul_inputs_off_their_pairs_are_refused(lib: ctypes.CDLL) -> None:
    down = Linear(128, 128, seed=12)
    buffer = np.zeros((2 * 128 + 1,), dtype=np.float16)
    g = buffer[1:].reshape(2, 128)  # 2 bytes past a 4-byte boundary: the kernel reads fp16 pairs
    u = np.zeros((2, 128), dtype=np.float16)
    assert _ptr(g) % 4 == 2
    act, y = np.zeros((2, 128), dtype=np.float16), np.zeros((2, 128), dtype=np.float16)
    err, _ = _launch(
        lib, lib.elpis_rows_gemm_silu_mul, (_ptr(g), _ptr(u), _ptr(act)), (2, 128), [down], 0, [y]
    )
    assert err != 0


def _norm_input(
    lib: ctypes.CDLL, x: np.ndarray, weight: np.ndarray, layers: list[Linear], residual: np.ndarray | None
) -> tuple[int, np.ndarray, np.ndarray]:
    """One call of the norm entry (eps 1e-6, bias 1.0, scale 1.0): its return code, y and the fragments."""
    m, k = x.shape
    y = np.full((m, k), np.nan, dtype=np.float16)
    frag = np.full(int(lib.elpis_rows_gemm_frag_halves(m, k)) * len(layers), np.nan, dtype=np.float16)
    err = lib.elpis_rows_gemm_norm_input(
        _ptr(x), int(x.dtype == np.float32), None if residual is None else _ptr(residual), _ptr(weight), 0,
        _ptr(y), 1e-6, 1.0, 1.0, m, k, len(layers), rg.void_ptrs(*(_ptr(lay.suh) for lay in layers)),
        _ptr(frag), frag.size, None,
    )  # fmt: skip
    return err, y, frag


@pytest.mark.parametrize(
    ("with_residual", "x_dtype"), [(True, np.float16), (True, np.float32), (False, np.float32)]
)
def test_norm_input_is_the_norm_then_the_gemm_of_its_output(
    lib: ctypes.CDLL, with_residual: bool, x_dtype: type
) -> None:
    """The entry that normalises a group's input in its input launch: the residual becomes residual + x (one
    fp32 add; x fp16, or fp32 as a Qwen3.5 block's sublayers give it), y is the RMSNorm of it (here within
    fp16 rounding of float64: the GPU test compares with ExLlamaV3's kernel bit for bit), and the GEMM over
    its fragments is bit for bit the plain entry's on y."""
    k, m = 5120, 3
    rng = np.random.default_rng(int(with_residual) + 2 * int(x_dtype == np.float32))
    layers = [Linear(k, 128, seed=31), Linear(k, 256, seed=32)]
    weight = (0.1 * rng.standard_normal(k)).astype(np.float16)  # fp16 weight, bias 1.0 added to it
    x = rng.standard_normal((m, k)).astype(x_dtype)
    residual = (3 * rng.standard_normal((m, k))).astype(np.float32) if with_residual else None
    before = None if residual is None else residual.copy()
    err, y, frag = _norm_input(lib, x, weight, layers, residual)
    assert err == 0
    total = x.astype(np.float32) + before if with_residual else x.astype(np.float32)
    if with_residual:
        assert np.array_equal(residual, total), "the residual is residual + x"
    t = total.astype(np.float64)
    want = t / np.sqrt((t * t).mean(axis=1, keepdims=True) + 1e-6) * (weight.astype(np.float64) + 1.0)
    assert np.allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    outs = [np.full((m, lay.n), np.nan, dtype=np.float16) for lay in layers]
    err, counters = _launch(lib, lib.elpis_rows_gemm_frags, (), (m, k), layers, 0, outs, frag=frag)
    assert err == 0 and not counters.any()
    for got, plain in zip(outs, run_group(lib, y, layers, [False, False]), strict=True):
        assert np.array_equal(got.view(np.uint16), plain.view(np.uint16))


def test_norm_input_refuses_what_it_does_not_compute(lib: ctypes.CDLL) -> None:
    layer = Linear(5120, 128, seed=33)
    weight = np.zeros(5120, dtype=np.float16)
    assert _norm_input(lib, np.zeros((17, 5120), np.float32), weight, [layer], None)[0]  # 17 rows
    small = Linear(4096, 128, seed=34)  # ExLlamaV3 norms k <= 4096 in one pass, which this kernel does not
    assert _norm_input(lib, np.zeros((2, 4096), np.float16), np.zeros(4096, np.float16), [small], None)[0]
