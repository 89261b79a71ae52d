"""Patch `exl3-trim-padded-out`: every ExLlamaV3 linear whose output is padded returns only its real columns.

ExLlamaV3 pads linear widths to multiples of 128 and trims the padding off the attention projections only,
so a model whose hidden size is not a multiple of 128 (SmolLM2-135M: 576) fails at the first residual add
after an MLP (576 + 640 columns), in its converter as in inference. Trimming every padded output makes such
models run; for Qwen3.8 every padded width is already a multiple of 128, so nothing changes there (the
patch touches no linear of it). Installed by `elpis.exl3.patches.apply_all()` (registry entry).
"""

from __future__ import annotations


def install() -> None:
    from exllamav3.modules import linear

    original = linear.Linear.__init__
    if getattr(original, "_elpis_trim_padded_out", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.out_features != self.out_features_unpadded:
            self.trim_padded_out = True

    __init__._elpis_trim_padded_out = True  # type: ignore[attr-defined]
    linear.Linear.__init__ = __init__
