"""The Python reference of ExLlamaV3's quantized K/V cache (elpis/exl3/qcache_ref.py) against a float64
re-derivation from the format (bit positions read from one big integer per group, the Hadamard as a
matrix), on random packed data for every bit width; plus hand-made layouts that pin the plane order."""

from __future__ import annotations

import numpy as np
import pytest

from elpis.exl3 import qcache_ref as qr


def _codes_f64(words: np.ndarray, bits: int) -> np.ndarray:
    """Codes [groups, 32] read with Python integers: the group's words as one little-endian integer,
    planes of widths 8, 4, 2, 1 (those set in `bits`) one after another."""
    groups = words.shape[0] // bits
    out = np.zeros((groups, 32), dtype=np.int64)
    for g in range(groups):
        big = 0
        for i, w in enumerate(words[g * bits : (g + 1) * bits].view(np.uint32)):
            big |= int(w) << (32 * i)
        for j in range(32):
            code, start = 0, 0
            for width in (8, 4, 2, 1):
                if bits & width:
                    code = (code << width) | ((big >> (start + j * width)) & ((1 << width) - 1))
                    start += 32 * width
            out[g, j] = code
    return out


def _sylvester(n: int) -> np.ndarray:
    i = np.arange(n)
    return np.array([[(-1) ** bin(a & b).count("1") for b in i] for a in i], dtype=np.float64)


@pytest.mark.parametrize("bits", range(2, 9))
def test_dequant_matches_float64_rederivation(bits: int) -> None:
    rng = np.random.default_rng(bits)
    groups = 24
    words = rng.integers(0, 2**32, size=groups * bits, dtype=np.uint64).astype(np.uint32).view(np.int32)
    scales = rng.uniform(0.01, 8.0, size=groups).astype(np.float16)
    scales[0] = np.float16(6e-8)  # an fp16 subnormal scale
    out = qr.dequant_groups(words, scales, bits).reshape(groups, 32).astype(np.float64)

    codes = _codes_f64(words, bits)
    assert np.array_equal(qr.unpack_codes(words, bits).astype(np.int64).reshape(groups, 32), codes)
    half = 2.0 ** (bits - 1)
    values = (codes - (half - 0.5)) * (scales.astype(np.float64)[:, None] / np.sqrt(32.0) / half)
    want = values @ _sylvester(32).T
    # fp32: 1 rounding of the step, 1 of each product, 5 butterfly levels; then fp16 rounding.
    fp32_err = 8 * 2.0**-24 * np.abs(values).sum(axis=1, keepdims=True)
    fp16_half_ulp = np.maximum(2.0 ** (np.floor(np.log2(np.abs(want) + 1e-300)) - 11), 2.0**-25)
    assert np.all(np.abs(out - want) <= fp32_err + fp16_half_ulp)


@pytest.mark.parametrize("bits", range(2, 9))
def test_pack_is_the_inverse_of_unpack(bits: int) -> None:
    rng = np.random.default_rng(10 + bits)
    codes = rng.integers(0, 2**bits, size=(3, 5, 32), dtype=np.uint32)
    words = qr.pack_codes(codes, bits)
    assert words.shape == (3, 5 * bits) and words.dtype == np.int32
    assert np.array_equal(qr.unpack_codes(words, bits), codes)


def test_three_bit_layout_is_two_bit_plane_then_one_bit_plane() -> None:
    high = qr.pack_codes(np.full((1, 32), 0b110, dtype=np.uint32), 3).view(np.uint32)
    assert high.tolist() == [0xFFFFFFFF, 0xFFFFFFFF, 0]
    low = qr.pack_codes(np.full((1, 32), 0b001, dtype=np.uint32), 3).view(np.uint32)
    assert low.tolist() == [0, 0, 0xFFFFFFFF]
    one = np.zeros((1, 32), dtype=np.uint32)
    one[0, 17] = 0b111  # value 17: 2-bit field at plane bit 34 (word 1, bit 2), 1-bit field at bit 17
    assert qr.pack_codes(one, 3).view(np.uint32).tolist() == [0, 0b11 << 2, 1 << 17]


def test_zero_scale_keeps_the_sign_of_zero() -> None:
    """A group of zeros is stored with scale fp16(1e-10) = 0: every value decodes to a zero whose sign
    follows the fp32 arithmetic (the kernels must reproduce it bit for bit)."""
    codes = np.arange(32, dtype=np.uint32)[None] % 8
    out = qr.dequant_groups(qr.pack_codes(codes, 3), np.zeros(1, dtype=np.float16), 3)
    assert np.all(out == 0)
    assert np.signbit(out).any() and not np.signbit(out).all()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"bits must be an int in 2\.\.8"):
        qr.planes(9)
    with pytest.raises(ValueError, match="not a multiple of bits=3"):
        qr.unpack_codes(np.zeros(4, dtype=np.int32), 3)
    with pytest.raises(ValueError, match="scales must be fp16"):
        qr.dequant_groups(np.zeros(3, dtype=np.int32), np.zeros(1, dtype=np.float32), 3)
    with pytest.raises(ValueError, match="scales have shape"):
        qr.dequant_groups(np.zeros(6, dtype=np.int32), np.zeros(1, dtype=np.float16), 3)
    with pytest.raises(ValueError, match="fit in 3 bits"):
        qr.pack_codes(np.full((1, 32), 8, dtype=np.uint32), 3)
    with pytest.raises(ValueError, match="expected 4 x 256"):
        qr.dequant_pages(np.zeros((1, 256, 3), dtype=np.int32), np.zeros((1, 256, 1), np.float16), 3, 4, 256)
