"""The sample draw kernel (patches/kernels/sample_draw.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: given the weights `sampling.top_weights` computes, its tokens are the host
sampler's on rows of every kind (ties across the head's edge, a grammar's mask, flat rows, fp16-valued rows)
under every filter (top_k 1-200, top_p from 1e-300 to 1, min_p); it declines exactly the calls the host
decides from the whole vocabulary, refuses non-finite rows as the host does, and refuses bad arguments. The
GPU's own run is tests/kernels/test_sample_draw.py."""

from __future__ import annotations

import ctypes
import math
from fractions import Fraction

import pytest
import torch

from elpis.exl3 import sample_draw, tensors
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams, sample_rows
from tests.kernels import cuda_emu
from tests.spec.sampling_rows import rows_of_every_kind


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("sample_draw")
    return sample_draw.bind(cuda_emu.build_emulated(sample_draw.SOURCE, out, launches=1))


@pytest.fixture
def on_cpu(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binding's own checks and call, on the emulated kernel."""
    monkeypatch.setattr(sample_draw, "_library", lambda: lib)
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")


def kernel_tokens(logits: torch.Tensor, params: SamplingParams, positions: list[int]) -> list[int] | None:
    width = min(params.top_k, logits.shape[1])
    return sample_draw.draw(sampling.top_weights(logits, params, width), params, positions)


FILTERS = [
    {"top_k": 1},
    {"top_k": 5, "top_p": 0.9},
    {"top_k": 20, "top_p": 0.8},
    {"top_k": 20, "top_p": 0.8, "min_p": 0.05},
    {"top_k": 50, "top_p": 0.5},
    {"top_k": 20, "top_p": 1e-300},  # the head's first token alone (the reach's shift past 128 bits)
    {"top_k": 20, "top_p": 1e-5},  # the shift between 64 and 128 bits
    {"top_k": 20, "top_p": math.nextafter(1.0, 0.0)},
    {"top_k": 200, "min_p": 0.2},
]


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "-".join(f"{k}={v:g}" for k, v in f.items()))
def test_the_kernels_tokens_are_the_hosts(seed: int, filters: dict) -> None:
    logits = rows_of_every_kind(9001, seed)
    positions = [seed * 1000 + 17 * r for r in range(logits.shape[0])]
    drawn = 0
    for temperature in (0.3, 0.7, 1.5):
        params = SamplingParams(temperature=temperature, seed=seed - 7, **filters)
        for r in range(logits.shape[0]):  # one row a call: a tied edge sends only its own call to the host
            row = logits[r : r + 1]
            host = sample_rows(row, params, positions[r : r + 1])
            got = kernel_tokens(row, params, positions[r : r + 1])
            declined = sampling._top_candidates(row, params, min(params.top_k, row.shape[1])) is None
            assert (got is None) == declined, (r, temperature)
            if got is not None:
                assert got == host, (r, temperature)
                drawn += 1
        some = [0, 2, 3, 4, 7, 8]
        together = kernel_tokens(logits[some], params, [positions[i] for i in some])
        if together is not None:  # rows drawn together are each drawn as alone
            assert together == sample_rows(logits[some], params, [positions[i] for i in some])
    assert drawn >= 3 * 8  # the random, peaked and fp16 rows at least


@pytest.mark.usefixtures("on_cpu")
def test_many_positions_draw_the_hosts_tokens() -> None:
    """Every position's uniform and every fixed-point sum: 64 positions of one row, spread over its head."""
    row = rows_of_every_kind(5000, 9)[3:4] * 400  # a head of a few comparable tokens
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, seed=123456789)
    positions = list(range(10_000, 10_064))
    rows = row.repeat(64, 1)
    got = kernel_tokens(rows, params, positions)
    assert got == sample_rows(rows, params, positions)
    assert len(set(got)) > 3


@pytest.mark.usefixtures("on_cpu")
def test_the_kernel_declines_what_the_host_decides_and_refuses_garbage() -> None:
    tied = torch.zeros(1, 200)
    tied[0, 150:] = 1.0  # fifty equal maxima: the edge of top_k 5 ties past the 21 weights read
    assert kernel_tokens(tied, SamplingParams(temperature=1.0, top_k=5), [0]) is None
    wide = torch.randn(1, 600, generator=torch.Generator().manual_seed(1))
    assert kernel_tokens(wide, SamplingParams(temperature=1.0, top_k=300), [0]) is None  # past its 256
    bad = rows_of_every_kind(300, 1)[:2].clone()
    bad[1, 17] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        kernel_tokens(bad, SamplingParams(temperature=0.7, top_k=20), [0, 1])
    good = bad[:1]
    with pytest.raises(ValueError, match="position"):  # as the host refuses it
        kernel_tokens(good, SamplingParams(temperature=0.7, top_k=20), [-1])
    with pytest.raises(ValueError, match="position"):
        sample_rows(good, SamplingParams(temperature=0.7, top_k=20), [-1])


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    w = torch.ones(2, 4, dtype=torch.float64)
    ids = torch.arange(8, dtype=torch.int64).view(2, 4)
    best = torch.zeros(2, dtype=torch.float64)
    pos = torch.zeros(2, dtype=torch.int64)
    out = torch.empty(2, dtype=torch.int64)

    def call(rows: int = 2, count: int = 4, vocab: int = 4, width: int = 2, top_k: int = 2,
             top_p: float = 1.0, min_p: float = 0.0, offset: int = 0) -> int:
        params = SamplingParams(temperature=1.0, top_k=2)
        block = torch.tensor(sample_draw.param_words(params), dtype=torch.int64)
        # the parameters read from memory, written here as they are (out of range included)
        block[1:] = torch.tensor([top_p, min_p], dtype=torch.float64).view(torch.int64)
        return lib.elpis_sample_draw(w.data_ptr(), ids.data_ptr(), best.data_ptr(), rows, count, vocab,
                                     width, top_k, block.data_ptr(), pos.data_ptr(), offset, out.data_ptr(),
                                     None)  # fmt: skip

    assert call() == 0  # flat rows read whole, top_k 2: the two lower ids of each row, one of them drawn
    assert out[0].item() in (0, 1) and out[1].item() in (4, 5)
    # ties past the four read: the host decides
    assert call(vocab=10) == 0 and out.tolist() == [sample_draw.EDGE_UNCLEAR] * 2
    for bad in ({"rows": 0}, {"count": 0}, {"count": 257}, {"vocab": 3}, {"width": 0},
                {"width": 5}, {"width": 3, "top_k": 2}):  # fmt: skip
        assert call(**bad) == -1, bad
    # parameters out of range are only known when the kernel reads them: every row answers -4
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.1}, {"min_p": float("nan")}, {"offset": -1}):
        assert call(**bad) == 0 and out.tolist() == [sample_draw.PARAMS_REFUSED] * 2, bad


@pytest.mark.usefixtures("on_cpu")
def test_top_p_between_two_integers_rounds_its_reach_up() -> None:
    """top_p * mass just above the first token's fixed-point weight: an integer total reaches it only with
    the second token too (the ceiling), so both tokens are drawn; a reach rounded down would keep one."""
    row = torch.full((1, 300), float("-inf"))
    row[0, 7], row[0, 9] = 0.0, -0.7
    weights = sampling.top_weights(row, SamplingParams(temperature=1.0, top_k=2), 2)
    first = 1 << sampling.FIXED_BITS
    mass = first + math.floor(float(weights.w[0, 1]) * 2.0**sampling.FIXED_BITS)
    top_p = (first + 0.5) / mass
    exact = Fraction(top_p) * mass
    assert math.floor(exact) == first < exact  # the product lies strictly between two integers
    params = SamplingParams(temperature=1.0, top_k=2, top_p=top_p, seed=11)
    positions = list(range(64))
    got = kernel_tokens(row.repeat(64, 1), params, positions)
    assert got == sample_rows(row.repeat(64, 1), params, positions)
    assert set(got) == {7, 9}
