"""Reference of ExLlamaV3's quantized paged K/V cache (`CacheLayer_quant`, compand_a 0), written from our
reading of its format, producing the fp16 values its `dequant_cache_paged` produces, bit for bit.

Format (ExLlamaV3 1.6.5, `exllamav3_ext/cache/q_cache_kernels.cuh`, quant_block_x4 / dequant_block_x4):
* a token's feature vector (kv_heads * head_dim values) is cut into groups of 32; a group is stored as
  `bits` uint32 words and one fp16 scale (`q [pages, 256, groups * bits]` int32, `s [pages, 256, groups]`);
* the `bits`-bit code of value j is split into bit planes of power-of-two widths, widest first (3 bits: a
  2-bit plane then a 1-bit plane; code = (high << 1) | low); a plane of width w fills w words, value j's
  field at bit j*w of the plane (never straddling a word); the planes follow each other in that order;
* value = (code - (2^(bits-1) - 0.5)) * (scale * 1/sqrt(32) / 2^(bits-1)), then the group is rotated
  back by the unnormalised 32-point Hadamard transform, as butterflies over index bits 0, 1, 2, 3, 4 in
  that order (lo, hi) -> (lo + hi, lo - hi); every operation in fp32 with one rounding (their build does
  not fuse these products into the adds: the products and the sums sit in different basic blocks), then
  round-to-nearest-even to fp16.

`patches/kernels/tree_attention.cu` (ELPIS_TREE_ATTN_QCACHE) implements the same arithmetic in the same
order, so its K/V tiles hold these exact values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

GROUP = 32
PAGE = 256
MIN_BITS, MAX_BITS = 2, 8
RSQRT32 = np.float32(0.17677669529663688110)  # fp32(1/sqrt(32)), 0x3E3504F3 as in their kernel


def planes(bits: int) -> list[int]:
    """Plane widths of a `bits`-bit code, widest (most significant) first: 3 -> [2, 1], 7 -> [4, 2, 1]."""
    check_bits(bits)
    return [w for w in (8, 4, 2, 1) if bits & w]


def check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"quantized cache bits must be an int in {MIN_BITS}..{MAX_BITS}, got {bits!r}")


def _as_numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def unpack_codes(words: np.ndarray | torch.Tensor, bits: int) -> np.ndarray:
    """Codes [..., groups, 32] (uint32) of packed words [..., groups * bits] (int32 or uint32)."""
    plane_widths = planes(bits)
    w = _as_numpy(words).view(np.uint32)
    if w.shape[-1] % bits:
        raise ValueError(f"last dimension {w.shape[-1]} is not a multiple of bits={bits}")
    w = w.reshape(*w.shape[:-1], w.shape[-1] // bits, bits)
    j = np.arange(GROUP, dtype=np.uint32)
    codes = np.zeros((*w.shape[:-1], GROUP), dtype=np.uint32)
    base = 0
    for width in plane_widths:
        bit = j * np.uint32(width)
        word = np.take(w, base + (bit >> 5).astype(np.int64), axis=-1)
        field = (word >> (bit & np.uint32(31))) & np.uint32((1 << width) - 1)
        codes = (codes << np.uint32(width)) | field
        base += width
    return codes


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `unpack_codes`: codes [..., groups, 32] (< 2**bits) -> int32 words [..., groups * bits]."""
    plane_widths = planes(bits)
    codes = np.asarray(codes, dtype=np.uint32)
    if codes.shape[-1] != GROUP or (codes >> np.uint32(bits)).any():
        raise ValueError(f"codes must have a last dimension of {GROUP} and fit in {bits} bits")
    words = np.zeros((*codes.shape[:-1], bits), dtype=np.uint32)
    rem, base = bits, 0
    for width in plane_widths:
        rem -= width
        field = (codes >> np.uint32(rem)) & np.uint32((1 << width) - 1)
        for j in range(GROUP):
            bit = j * width
            words[..., base + bit // 32] |= field[..., j] << np.uint32(bit % 32)
        base += width
    return words.reshape(*codes.shape[:-2], codes.shape[-2] * bits).view(np.int32)


def hadamard32(v: np.ndarray) -> np.ndarray:
    """Unnormalised 32-point Hadamard along the last axis: butterflies over index bits 0..4 in order, in
    the dtype of `v` (fp32: one rounding per add/sub, as the kernels do)."""
    v = v.copy()
    for b in (1, 2, 4, 8, 16):
        idx = np.arange(GROUP)
        lo_idx = idx[(idx & b) == 0]
        lo, hi = v[..., lo_idx], v[..., lo_idx | b]
        v[..., lo_idx] = lo + hi
        v[..., lo_idx | b] = lo - hi
    return v


def dequant_groups(
    words: np.ndarray | torch.Tensor, scales: np.ndarray | torch.Tensor, bits: int
) -> np.ndarray:
    """fp16 values [..., groups * 32] of packed words [..., groups * bits] and fp16 scales [..., groups]."""
    codes = unpack_codes(words, bits)
    s = _as_numpy(scales)
    if s.dtype != np.float16:
        raise ValueError(f"scales must be fp16, got {s.dtype}")
    if s.shape != codes.shape[:-1]:
        raise ValueError(f"scales have shape {s.shape}, the words hold groups {codes.shape[:-1]}")
    half_levels = np.float32(1 << (bits - 1))
    step = (s.astype(np.float32) * RSQRT32) * (np.float32(1.0) / half_levels)
    centred = codes.astype(np.float32) - (half_levels - np.float32(0.5))  # exact
    v = centred * step[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        out = hadamard32(v).astype(np.float16)
    return out.reshape(*out.shape[:-2], out.shape[-2] * GROUP)


def dequant_pages(
    q: np.ndarray | torch.Tensor,
    s: np.ndarray | torch.Tensor,
    bits: int,
    kv_heads: int,
    head_dim: int,
) -> np.ndarray:
    """A whole quantized pool (q [pages, 256, groups * bits], s [pages, 256, groups]) as fp16 pages
    [pages, 256, kv_heads, head_dim], the layout `CacheLayer_quant.get_kv` writes (physical page order)."""
    out = dequant_groups(q, s, bits)
    if out.shape[-1] != kv_heads * head_dim:
        raise ValueError(f"tokens hold {out.shape[-1]} values, expected {kv_heads} x {head_dim}")
    return out.reshape(*out.shape[:-1], kv_heads, head_dim)
