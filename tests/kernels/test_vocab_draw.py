"""GPU tests of the vocab draw kernels (patches/kernels/vocab_draw.cu): on CUDA rows of every kind, fp32, fp16
and float64, at a small vocabulary and at the model's 248,320, their tokens are the host sampler's without
top_k (its whole-vocabulary weights, CUDA's exp on both sides), the rows the head cannot decide included
(the nucleus decides them), and `sample_rows` with the draw installed (registry switch exl3-vocab-draw) draws
the same tokens as without it. The CPU emulation's run is tests/kernels/test_vocab_draw_emu.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams, sample_rows
from tests.kernels.test_vocab_draw_emu import FILTERS, declined, host_tokens, padded
from tests.spec.sampling_rows import rows_of_every_kind

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def draw():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run with -m gpu on the device machine)")
    from elpis.exl3 import vocab_draw

    vocab_draw._library()
    return partial(vocab_draw.draw, nucleus=True)


@pytest.mark.parametrize("vocab", [9001, 248_320])
def test_the_kernels_tokens_are_the_hosts_on_the_gpu(draw, vocab: int) -> None:
    by_nucleus = 0
    for seed in range(2):
        logits = padded(rows_of_every_kind(vocab, seed).cuda())
        positions = [seed * 1000 + 17 * r for r in range(logits.shape[0])]
        for filters, _ in FILTERS:
            params = SamplingParams(temperature=0.7, seed=seed + 5, **filters)
            for r in range(logits.shape[0]):
                row = logits[r : r + 1]
                got = draw(row, params, positions[r : r + 1])
                assert got == host_tokens(row, params, positions[r : r + 1]), (filters, r)
                by_nucleus += declined(row, params)
            assert draw(logits, params, positions) == host_tokens(logits, params, positions), filters
    # one temperature here, the emulation's two there: the rows the nucleus decided, over every filter
    assert by_nucleus >= 20


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_flat_rows_and_a_weight_shared_by_several_values_at_the_models_vocabulary(draw, dtype) -> None:
    """16 flat rows (a random model's: top_p's prefix holds most of the vocabulary) and rows whose prefix ends
    among +0 and -0 (and, wider than fp16, values too small to move x - best), all decided on the GPU."""
    vocab = 248_320
    flat = torch.randn(16, vocab, generator=torch.Generator().manual_seed(11)).to(dtype).cuda()
    row = torch.full((vocab,), -5.0, dtype=torch.float64)
    row[:10] = 2.0
    same = [0.0, -0.0] if dtype == torch.float16 else [0.0, -0.0, 1e-30, -1e-30, 3e-30]
    row[10:200_010] = torch.tensor(same, dtype=torch.float64).repeat(200_000 // len(same) + 1)[:200_000]
    shared = row.to(dtype).repeat(16, 1).cuda()
    positions = list(range(700, 716))
    for rows in (flat, shared):
        for params in (SamplingParams(temperature=1.0, top_p=0.9, seed=8),
                       SamplingParams(temperature=0.7, top_p=0.5, min_p=1e-3, seed=9),
                       SamplingParams(temperature=1.0, min_p=1e-6, seed=10)):  # fmt: skip
            assert declined(rows[:1], params)
            got = draw(rows, params, positions)
            assert got is not None and got == host_tokens(rows, params, positions), (dtype, params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_each_row_kind_at_the_models_vocabulary(draw, dtype: torch.dtype) -> None:
    """The verify's fp16 logits and a penalised request's float64 rows, 16 rows drawn together."""
    logits = (torch.randn(16, 248_320, generator=torch.Generator().manual_seed(7)) * 6).to(dtype).cuda()
    positions = list(range(900, 916))
    for params in (SamplingParams(temperature=0.7, seed=3),
                   SamplingParams(temperature=0.6, top_p=0.95, seed=4),
                   SamplingParams(temperature=1.0, min_p=0.1, seed=5)):  # fmt: skip
        got = draw(logits, params, positions)
        assert got is not None and got == host_tokens(logits, params, positions), params


def test_sample_rows_with_the_draw_installed_draws_the_same_tokens(draw) -> None:
    logits = (torch.randn(16, 248_320, generator=torch.Generator().manual_seed(3)) * 4).cuda()
    logits[5] = logits[5].half().float()
    positions = list(range(500, 516))
    for params in (SamplingParams(temperature=0.7, top_p=0.8, seed=9),
                   SamplingParams(temperature=1.0, seed=-4),
                   SamplingParams(temperature=1.0, top_p=0.95, min_p=0.01, seed=-4)):  # fmt: skip
        host = sample_rows(logits, params, positions)
        sampling.use_vocab_draw(draw)
        try:
            assert sample_rows(logits, params, positions) == host
        finally:
            sampling.use_vocab_draw(None)
