"""elpis's EXL3 trellis decode, as this machine's CUDA compiler built it, checked bit for bit against the
format's reference (`elpis.exl3.trellis_ref`) before a model loads with elpis's GEMM (fail closed).

Every EXL3 linear of a tree verify and a draft block decodes its weights in
`patches/kernels/exl3_gemm_rows.cu` (registry patch exl3-rows-gemm), and the text is lossless only if each
decoded weight is the format's value. The kernels are built by the user's own CUDA toolkit, and a toolkit has
miscompiled our code before: nvcc 13.0 and NVRTC 12.8 built the round's decision kernel into one that refused
every round (bench/results/tree/README.md, sessions 36-37). `check_decode(decode)` decodes seeded 4- and 6-bit
trellises (words of all zeros and all ones among them) with one build's decode entry, the same per-lane code
as the GEMM's main loop (though not inlined into it), and compares every fp16 bit pattern with the
reference's; `load_backend` runs it on the GPU before loading a model with elpis's GEMM and refuses the load
with the first differing weight.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from elpis.exl3 import rows_gemm, trellis_ref

TILES = (6, 10)  # k-tiles and n-tiles of each checked trellis: 15,360 weights per width
SEED = 37

Decode = Callable[[np.ndarray, int], np.ndarray]  # trellis [k/16, n/16, 16 * bits] uint16 -> D [k, n] fp16


class DecodeMismatch(RuntimeError):
    """The decode as built here differs from the format's reference."""


def trellises() -> list[tuple[int, np.ndarray]]:
    """(bits, trellis) of every checked width: seeded words, with runs of 0x0000 and 0xFFFF."""
    rng = np.random.default_rng(SEED)
    out = []
    for bits in rows_gemm.BITS:
        trellis = rng.integers(0, 1 << 16, size=(*TILES, 16 * bits), dtype=np.uint16)
        trellis[0, 0, :] = 0  # states of all zeros and all ones: the codebook's ends
        trellis[0, 1, :] = 0xFFFF
        trellis[1, 0, ::2] = 0xFFFF  # alternating words: every window straddles them
        out.append((bits, trellis))
    return out


def check_decode(decode: Decode) -> int:
    """Decode every checked trellis with `decode` and compare bit for bit with the reference. Returns the
    number of weights checked; raises DecodeMismatch naming the first differing weight."""
    checked = 0
    for bits, trellis in trellises():
        want = trellis_ref.decoded(trellis, bits).view(np.uint16)
        got = np.asarray(decode(trellis, bits)).view(np.uint16)
        if got.shape != want.shape:
            raise DecodeMismatch(f"the {bits}-bit decode gave D of shape {got.shape}, expected {want.shape}")
        wrong = np.argwhere(got != want)
        if len(wrong):
            k, n = (int(v) for v in wrong[0])
            raise DecodeMismatch(
                f"elpis's EXL3 {bits}-bit decode, as built here, differs from the format in {len(wrong)} of "
                f"{want.size} weights; the first at (k {k}, n {n}): fp16 bits {int(got[k, n]):#06x}, the "
                f"format's {int(want[k, n]):#06x}. The CUDA compiler may have miscompiled "
                "patches/kernels/exl3_gemm_rows.cu; ELPIS_PATCH_ROWS_GEMM=0 serves ExLlamaV3's GEMMs instead"
            )
        checked += want.size
    return checked


def gpu_decode(device: object) -> Decode:
    """The served build's decode entry on `device` (a torch device)."""
    import torch

    def decode(trellis: np.ndarray, bits: int) -> np.ndarray:
        words = torch.from_numpy(trellis.view(np.int16).copy()).to(device)
        return rows_gemm.decode(words).cpu().numpy()

    return decode
