"""GPU tests of the sample draw kernel (patches/kernels/sample_draw.cu): on CUDA rows of every kind, at a
small vocabulary and at the model's 248,320, the kernel's tokens are the host sampler's from the same
weights, it declines exactly the calls the host decides from the whole vocabulary, and `sample_rows` with
the device draw installed (registry switch exl3-sample-draw) draws the same tokens as without it. The CPU
emulation's run is tests/kernels/test_sample_draw_emu.py."""

from __future__ import annotations

import pytest
import torch

from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams, sample_rows
from tests.kernels.test_sample_draw_emu import FILTERS
from tests.spec.sampling_rows import rows_of_every_kind

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def draw():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run with -m gpu on the device machine)")
    from elpis.exl3 import sample_draw

    sample_draw._library()
    return sample_draw.draw


@pytest.mark.parametrize("vocab", [9001, 248_320])
def test_the_kernels_tokens_are_the_hosts_on_the_gpu(draw, vocab: int) -> None:
    drawn = 0
    for seed in range(2):
        logits = rows_of_every_kind(vocab, seed).cuda()
        positions = [seed * 1000 + 17 * r for r in range(logits.shape[0])]
        for filters in FILTERS:
            params = SamplingParams(temperature=0.7, seed=seed + 5, **filters)
            width = min(params.top_k, vocab)
            for r in range(logits.shape[0]):
                row = logits[r : r + 1]
                got = draw(sampling.top_weights(row, params, width), params, positions[r : r + 1])
                declined = sampling._top_candidates(row, params, width) is None
                assert (got is None) == declined, (filters, r)
                if got is not None:
                    assert got == sample_rows(row, params, positions[r : r + 1]), (filters, r)
                    drawn += 1
    assert drawn >= 2 * len(FILTERS) * 3


def test_sample_rows_with_the_device_draw_draws_the_same_tokens(draw) -> None:
    logits = (torch.randn(16, 248_320, generator=torch.Generator().manual_seed(3)) * 4).cuda()
    logits[5] = logits[5].half().float()
    positions = list(range(500, 516))
    for params in (SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=9),
                   SamplingParams(temperature=1.0, top_p=0.95, top_k=64, min_p=0.01, seed=-4)):  # fmt: skip
        host = sample_rows(logits, params, positions)
        sampling.use_device_draw(draw)
        try:
            assert sample_rows(logits, params, positions) == host
        finally:
            sampling.use_device_draw(None)
