"""The load-time check of elpis's EXL3 decode (elpis.exl3.decode_check), on the CPU: the kernel's decode entry
under CPU emulation passes it bit for bit, a decode one weight off fails it naming the weight, and the checked
trellises reach the codebook's corners."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from elpis.exl3 import decode_check, trellis_ref


def emulated_decode(lib: ctypes.CDLL) -> decode_check.Decode:
    def decode(trellis: np.ndarray, bits: int) -> np.ndarray:
        trellis = np.ascontiguousarray(trellis)
        kt, nt, _ = trellis.shape
        d = np.zeros((kt * 16, nt * 16), dtype=np.float16)
        err = lib.elpis_rows_gemm_decode(trellis.ctypes.data, d.ctypes.data, kt * 16, nt * 16, bits, None)
        assert err == 0
        return d

    return decode


def test_the_emulated_decode_passes_over_both_widths(rows_gemm_emu) -> None:
    widths = []
    decode = emulated_decode(rows_gemm_emu)

    def watched(trellis: np.ndarray, bits: int) -> np.ndarray:
        widths.append(bits)
        return decode(trellis, bits)

    assert decode_check.check_decode(watched) == 2 * decode_check.TILES[0] * decode_check.TILES[1] * 256
    assert widths == [4, 6]


@pytest.mark.parametrize("bits", [4, 6])
def test_a_decode_one_weight_off_fails_naming_it(rows_gemm_emu, bits: int) -> None:
    decode = emulated_decode(rows_gemm_emu)

    def wrong(trellis: np.ndarray, got_bits: int) -> np.ndarray:
        d = decode(trellis, got_bits)
        if got_bits == bits:
            d.view(np.uint16)[37, 21] ^= 1  # one weight, its last mantissa bit
        return d

    with pytest.raises(decode_check.DecodeMismatch, match=rf"{bits}-bit decode.* 1 of .* \(k 37, n 21\)"):
        decode_check.check_decode(wrong)


def test_the_checked_trellises_reach_the_codebooks_ends() -> None:
    for bits, trellis in decode_check.trellises():
        states = trellis_ref.tile_states(trellis, bits)
        assert (states == 0).any() and (states == 0xFFFF).any(), bits
        assert len(np.unique(states)) > 10_000, bits  # and a spread of the rest
