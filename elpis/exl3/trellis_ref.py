"""The EXL3 linear as the format defines it, in numpy: the reference for elpis's own EXL3 kernels.

Facts of the format (ExLlamaV3 1.6.5; `../shared/notes/exllamav3_internals.md` 1.3), written here in our own
code:
- `trellis [k/16, n/16, 16*K]` uint16: one 16x16 tile of D per (k-tile, n-tile), K bits per weight. The
  tile's words, read as little-endian uint32 (word i = u16[2i] | u16[2i+1] << 16), form a circular bit stream
  of 256*K bits, most significant bit of each word first. Position p (0..255) of the tile reads the 16 bits
  that start at stream bit p*K + K - 16 (mod 256*K): its trellis state.
- Position p = 8*L + j sits at row k = 2(L%4) + (j&1) + 8((j>>1)&1) and column n = L//4 + 8(j>>2) of the tile
  (the order in which lane L of a warp holds an mma fragment).
- mul1 codebook: fp16(1024 + bytesum(state * 0x83DCD12D mod 2^32)) * fp16(0x1eee) + fp16(0xc931), one rounding
  to fp16.
- The linear: y = ((x * suh) H) D H * svh, H the 128-point Sylvester Hadamard (entries (-1)^popcount(i & j))
  divided by sqrt(128), on each group of 128 along k and along n.
"""

from __future__ import annotations

import numpy as np

MUL1 = 0x83DCD12D
CB_SCALE = np.frombuffer(np.uint16(0x1EEE).tobytes(), dtype=np.float16)[0]
CB_BIAS = np.frombuffer(np.uint16(0xC931).tobytes(), dtype=np.float16)[0]
HADAMARD = 128


def tile_positions() -> tuple[np.ndarray, np.ndarray]:
    """(row k, column n) within its 16x16 tile of each of the 256 positions."""
    p = np.arange(256)
    lane, j = p // 8, p % 8
    k = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1)
    n = lane // 4 + 8 * (j >> 2)
    return k, n


def tile_states(tiles: np.ndarray, bits: int) -> np.ndarray:
    """Trellis states [..., 256] (int64) of tiles [..., 16 * bits] uint16."""
    tiles = np.asarray(tiles, dtype=np.uint16)
    if tiles.shape[-1] != 16 * bits:
        raise ValueError(f"a {bits}-bit tile has {16 * bits} words, got {tiles.shape[-1]}")
    words = tiles.reshape(*tiles.shape[:-1], 8 * bits, 2).astype(np.uint64)
    words = words[..., 0] | (words[..., 1] << np.uint64(16))
    # stream bit b (MSB first per word): bit 31 - b%32 of word b//32
    stream = (words[..., :, None] >> np.arange(31, -1, -1, dtype=np.uint64)) & np.uint64(1)
    stream = stream.reshape(*tiles.shape[:-1], 256 * bits)
    start = (np.arange(256) * bits + bits - 16) % (256 * bits)
    idx = (start[:, None] + np.arange(16)[None, :]) % (256 * bits)
    window = stream[..., idx]  # [..., 256, 16], most significant first
    weights = np.uint64(1) << np.arange(15, -1, -1, dtype=np.uint64)
    return (window * weights).sum(axis=-1).astype(np.int64)


def decode_mul1(states: np.ndarray) -> np.ndarray:
    """fp16 codebook values of mul1 states."""
    x = (np.asarray(states, dtype=np.uint64) * np.uint64(MUL1)) & np.uint64(0xFFFFFFFF)
    total = sum((x >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4))
    h = 1024.0 + total.astype(np.float64)  # exact in fp16: 1024 .. 2044
    # the fp64 product and sum are exact (11 + 11 bits, then one aligned add): one rounding, to fp16
    return (h * np.float64(CB_SCALE) + np.float64(CB_BIAS)).astype(np.float16)


def decoded(trellis: np.ndarray, bits: int) -> np.ndarray:
    """D [k, n] fp16 of a mul1 trellis [k/16, n/16, 16*bits]."""
    kt, nt, _ = trellis.shape
    values = decode_mul1(tile_states(trellis, bits))  # [kt, nt, 256]
    k, n = tile_positions()
    tile = np.zeros((kt, nt, 16, 16), dtype=np.float16)
    tile[:, :, k, n] = values
    return tile.transpose(0, 2, 1, 3).reshape(kt * 16, nt * 16)


def hadamard() -> np.ndarray:
    """The normalised 128-point Sylvester Hadamard, fp64."""
    i = np.arange(HADAMARD)
    parity = np.array([bin(v).count("1") & 1 for v in (i[:, None] & i[None, :]).ravel()]).reshape(
        HADAMARD, HADAMARD
    )
    return (1.0 - 2.0 * parity) / np.sqrt(HADAMARD)


def blockwise(v: np.ndarray) -> np.ndarray:
    """v [..., c] with H applied to each group of 128 along the last axis, fp64."""
    shape = v.shape
    return (v.astype(np.float64).reshape(*shape[:-1], shape[-1] // HADAMARD, HADAMARD) @ hadamard()).reshape(
        shape
    )


def linear(x: np.ndarray, trellis: np.ndarray, suh: np.ndarray, svh: np.ndarray, bits: int = 4) -> np.ndarray:
    """y [m, n] fp64 of the EXL3 linear (mul1 trellis) on x [m, k], exact up to fp64."""
    a = blockwise(np.asarray(x, dtype=np.float64) * np.asarray(suh, dtype=np.float64))
    c = a @ decoded(trellis, bits).astype(np.float64)
    return blockwise(c) * np.asarray(svh, dtype=np.float64)
