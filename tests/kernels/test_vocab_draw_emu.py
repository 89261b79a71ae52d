"""The vocab draw kernels (patches/kernels/vocab_draw.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: for sampled requests without top_k, their tokens are the host sampler's
(`sampling._kept_fixed`, `_fixed_draws`) on rows of every kind, fp16 and float64, under every filter (top_p
from 1e-300 to 1, min_p, both, neither). Without the nucleus they decline exactly where a top_p prefix or
min_p runs past the weights read; with it those rows are drawn too (ties across logit values of one weight
cut by id, a non-monotone exp's rows out of order left to the host). They refuse non-finite rows as the host
does, and bad arguments. The emulated exp is the CPU's, so the host's `_row_exp` is the same function here
(`math.exp` a value); on the GPU both are CUDA's exp (tests/kernels/test_vocab_draw.py)."""

from __future__ import annotations

import ctypes
import math
import struct

import pytest
import torch

from elpis.exl3 import sample_draw, tensors, vocab_draw
from elpis.spec import sampling
from elpis.spec.sampling import SamplingParams
from tests.kernels import cuda_emu
from tests.spec.sampling_rows import rows_of_every_kind

# short spans: several a row of a test's vocabulary
SMALL = {"THREADS": 32, "SPAN_VALUES": 256, "MAX_SPANS": 64}


def build(tmp_path_factory: pytest.TempPathFactory, threads: int, span_values: int,
          max_spans: int, exp: str = "exp") -> ctypes.CDLL:
    """An emulated build of the kernels (`exp`: the function its weights take, cuda_emu's emu_exp_bumped for a
    non-monotone one)."""
    out = tmp_path_factory.mktemp(f"vocab_draw_{threads}_{span_values}_{exp}")
    defines = {"ELPIS_VOCAB_DRAW_THREADS": threads, "ELPIS_VOCAB_DRAW_SPAN_VALUES": span_values,
               "ELPIS_VOCAB_DRAW_MAX_SPANS": max_spans, "ELPIS_VOCAB_DRAW_EXP": exp}  # fmt: skip
    needs = ("row_spans.h", "row_scan_schedule.h")
    built = cuda_emu.build_emulated(vocab_draw.SOURCE, out, launches=7, needs=needs, defines=defines)
    return vocab_draw.bind(built, threads=threads)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return build(tmp_path_factory, SMALL["THREADS"], SMALL["SPAN_VALUES"], SMALL["MAX_SPANS"])


def _cpu_exp(x: torch.Tensor) -> torch.Tensor:
    """The CPU's exp of every value, as the emulated kernels compute it."""
    return torch.tensor([math.exp(v) for v in x.flatten().tolist()], dtype=torch.float64).view(x.shape)


@pytest.fixture
def on_cpu(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binding's own checks and calls on the emulated kernels, and the host's exp the emulation's."""
    monkeypatch.setattr(vocab_draw, "_library", lambda: lib)
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(sampling, "_row_exp", _cpu_exp)


def host_tokens(logits: torch.Tensor, params: SamplingParams, positions: list[int]) -> list[int]:
    return sampling._fixed_draws(sampling._kept_fixed(logits, params), params, positions)


def kernel_tokens(logits: torch.Tensor, params: SamplingParams, positions: list[int],
                  nucleus: bool = True) -> list[int] | None:
    """The kernels' tokens through the binding's call, which the CPU rows reach here as a device's would (with
    the nucleus unless told otherwise)."""
    return vocab_draw.draw(logits, params, positions, nucleus=nucleus)


def padded(logits: torch.Tensor) -> torch.Tensor:
    """`logits` as a view of rows 16-byte aligned (a verify's output is read in place so), the values past
    the last whole vector of a row its last span's singles."""
    rows, vocab = logits.shape
    wide = torch.zeros(rows, -(-vocab // 8) * 8, dtype=logits.dtype, device=logits.device)
    wide[:, :vocab] = logits
    return wide[:, :vocab]


def declined(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether the host's own weights say the head cannot decide (the kernel's rule, restated from them): the
    top_p prefix ends on a weight not clear of the smallest read, or min_p is not clear above it."""
    w, _ = sampling._weights(logits, params)
    vocab = w.shape[1]
    count = min(vocab, vocab_draw.HEAD_WIDTH + sampling.TOP_PAD)
    if not vocab_draw.reads_head(params) or count == vocab:
        return False
    order = torch.sort(w[0], descending=True, stable=True)
    ranked, floor = order.values, float(order.values[count - 1])
    if params.top_p == 1.0:
        return not floor * (1.0 + sampling.EDGE_GAP) < params.min_p
    fixed = sampling._fixed_weights(ranked)
    mass = int(fixed.sum())
    reach = math.ceil(sampling.Fraction(params.top_p) * mass)
    n = int(torch.searchsorted(torch.cumsum(fixed, 0), torch.tensor([reach], device=fixed.device))[0]) + 1
    clear = floor == 0.0 or float(ranked[n - 1]) > floor * (1.0 + sampling.EDGE_GAP)
    return not (n <= count and clear)


# (filters, the fewest of a test's 24 calls whose rows the head alone leaves undecided, for the nucleus)
FILTERS = [
    ({}, 0),  # every token kept: the pick
    ({"top_p": 0.9}, 10),
    ({"top_p": 0.8, "min_p": 0.05}, 8),
    ({"top_p": 0.5}, 4),
    # the first token alone (the reach's shift past 128 bits); the coarse row's first token ties past the
    # weights' head at both temperatures (hundreds of tokens share each of its six values)
    ({"top_p": 1e-300}, 2),
    ({"top_p": 1e-5}, 2),
    # the whole mass but a sliver: past the weights read on most rows
    ({"top_p": math.nextafter(1.0, 0.0)}, 18),
    ({"min_p": 0.2}, 4),
    ({"min_p": 1e-9}, 14),  # below the smallest weight read on most rows
]


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("filters", "fewest"), FILTERS,
                         ids=[("-".join(f"{k}={v:g}" for k, v in f.items()) or "all") for f, _ in FILTERS])
def test_the_kernels_tokens_are_the_hosts(seed: int, filters: dict, fewest: int) -> None:
    """Every row drawn, each the host's token: by the head where its weights decide, else by the nucleus;
    without the nucleus, the calls the head cannot decide are left to the host (None), and only those."""
    logits = padded(rows_of_every_kind(3001, seed))
    positions = [seed * 1000 + 17 * r for r in range(logits.shape[0])]
    by_nucleus = 0
    for temperature in (0.3, 1.5):
        params = SamplingParams(temperature=temperature, seed=seed - 7, **filters)
        for r in range(logits.shape[0]):
            row = logits[r : r + 1]
            host = host_tokens(row, params, positions[r : r + 1])
            assert kernel_tokens(row, params, positions[r : r + 1]) == host, (r, temperature)
            alone = kernel_tokens(row, params, positions[r : r + 1], nucleus=False)
            assert alone == (None if declined(row, params) else host), (r, temperature)
            by_nucleus += declined(row, params)
        # rows drawn together are each drawn as alone, whichever of them the nucleus decides
        got = kernel_tokens(logits, params, positions)
        assert got == host_tokens(logits, params, positions), temperature
    assert by_nucleus >= fewest


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_a_weight_shared_by_several_logit_values_is_cut_by_id(dtype: torch.dtype) -> None:
    """+0 and -0 weigh the same, and so (wider than fp16) do values too small to move x - best: the host
    ranks such tokens by id alone, so where top_p's prefix ends among them the nucleus keeps the lowest ids
    across all those values, not within the one its select lands on."""
    vocab = 3001
    row = torch.full((vocab,), -5.0, dtype=torch.float64)
    row[:10] = 2.0
    same = [0.0, -0.0] if dtype == torch.float16 else [0.0, -0.0, 1e-30, -1e-30, 3e-30]
    row[10:2010] = torch.tensor([same[(i * 7) % len(same)] for i in range(2000)], dtype=torch.float64)
    rows = padded(row.to(dtype).repeat(40, 1))
    positions = list(range(300, 340))
    for top_p in (0.3, 0.5, 0.8):
        params = SamplingParams(temperature=1.0, top_p=top_p, seed=11)
        assert declined(rows[:1], params)  # past the head's weights: the nucleus decides
        got = kernel_tokens(rows, params, positions)
        assert got == host_tokens(rows, params, positions), top_p
        assert len({t for t in got if t >= 10}) > 10  # most draws land among the shared weight's tokens


def _bumped_exp(x: torch.Tensor) -> torch.Tensor:
    """cuda_emu's emu_exp_bumped on the host: the CPU's exp, times (1 + 2^-40) for about half the arguments,
    picked by a hash of their bits; not monotone where arguments closer than the bump straddle it."""
    out = []
    for d in x.flatten().tolist():
        e = math.exp(d)
        bits = struct.unpack("<Q", struct.pack("<d", d))[0]
        out.append(e * (1.0 + 2.0**-40) if ((bits * 0x9E3779B97F4A7C15) & sampling.MASK64) >> 63 else e)
    return torch.tensor(out, dtype=torch.float64).view(x.shape)


def test_the_nucleus_does_not_rest_on_exp_being_monotone(tmp_path_factory: pytest.TempPathFactory,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With an exp that is not monotone (host and kernels the same one), the nucleus's select by logit order
    is not the host's order by weight wherever the reversals reach its cut: the kept pass sees a weight out of
    its key's order and leaves the row to the host. Rows whose reversals stay clear of the cut are still
    drawn, the host's tokens."""
    built = build(tmp_path_factory, *SMALL.values(), exp="emu_exp_bumped")
    monkeypatch.setattr(vocab_draw, "_library", lambda: built)
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(sampling, "_row_exp", _bumped_exp)
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=3)
    # consecutive doubles: x - best an ulp apart, so the bump reverses weights all through the row
    vocab = 3001
    x = 0.25 + torch.arange(vocab, dtype=torch.float64) * 2.0**-54
    crowded = padded(x[torch.randperm(vocab, generator=torch.Generator().manual_seed(5))].unsqueeze(0))
    w, _ = sampling._weights(crowded, params)
    by_weight = torch.sort(w[0], descending=True, stable=True).indices
    by_logit = torch.sort(crowded[0], descending=True, stable=True).indices
    assert not torch.equal(by_weight, by_logit)  # the host's order is not the logits'
    assert declined(crowded, params) and kernel_tokens(crowded, params, [7]) is None
    # random rows: values far apart, the bump reverses nothing near a cut
    rows = padded(rows_of_every_kind(3001, 2).to(torch.float64)[[0, 3, 7]])
    positions = [11, 12, 13]
    got = kernel_tokens(rows, params, positions)
    assert got is not None and got == host_tokens(rows, params, positions)
    assert declined(rows[1:2], params)  # the nearly flat row drawn by the nucleus


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("filters", [{}, {"top_p": 0.95}], ids=["all", "top_p"])
def test_every_row_kind_and_many_positions(dtype: torch.dtype, filters: dict) -> None:
    """Each kind the kernels read (fp16 in 16-byte vectors, the last span's single values; float64 a value at
    a time), a row-strided view read in place, and 48 positions spread over the draw."""
    base = (rows_of_every_kind(1003, 5)[3:4] * 2000).to(dtype)  # a head of a few comparable tokens
    wide = torch.zeros(48, 1008, dtype=dtype)
    wide[:, :1003] = base
    rows = wide[:, :1003]  # rows 1008 apart: a verify's output read in place
    params = SamplingParams(temperature=1.0, seed=987654321, **filters)
    positions = list(range(5_000, 5_048))
    got = kernel_tokens(rows, params, positions)
    assert got == host_tokens(rows, params, positions)
    assert len(set(got)) > 3


@pytest.mark.usefixtures("on_cpu")
def test_the_pick_reaches_every_span() -> None:
    """A flat row: every token equally likely, so 200 positions land in every span of 256 values and at both
    ends of a row; the pick's span search and its walk within the span are the host's."""
    row = torch.zeros(200, 1500)
    params = SamplingParams(temperature=0.7, seed=3)
    positions = list(range(200))
    got = kernel_tokens(row, params, positions)
    assert got == host_tokens(row, params, positions)
    assert {t // 256 for t in got} == set(range(6))


@pytest.mark.usefixtures("on_cpu")
def test_the_kernels_refuse_garbage_as_the_host_does() -> None:
    bad = rows_of_every_kind(300, 1)[:2].clone()
    bad[1, 17] = float("nan")
    bad = padded(bad)
    for filters in ({}, {"top_p": 0.9}):
        params = SamplingParams(temperature=0.7, **filters)
        with pytest.raises(ValueError, match="non-finite"):
            kernel_tokens(bad, params, [0, 1])
        with pytest.raises(ValueError, match="non-finite"):
            host_tokens(bad, params, [0, 1])
        with pytest.raises(ValueError, match="position"):
            kernel_tokens(bad[:1], params, [-1])
    with pytest.raises(ValueError, match="without top_k"):
        kernel_tokens(bad[:1], SamplingParams(temperature=0.7, top_k=5), [0])


@pytest.mark.usefixtures("on_cpu")
def test_sample_rows_takes_the_installed_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed, the draw serves sample_rows' calls without top_k on the kernels' device, and not others."""
    calls: list[int] = []

    def counted(logits: torch.Tensor, params: SamplingParams, positions: list[int]) -> list[int] | None:
        calls.append(len(positions))
        return vocab_draw.draw(logits, params, positions)

    monkeypatch.setattr(sampling, "_vocab_draw", counted)
    # the CPU rows stand in for a GPU's
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    rows = padded(rows_of_every_kind(700, 2)[[0, 7, 8]])
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    assert sampling.sample_rows(rows, params, [1, 2, 3]) == host_tokens(rows, params, [1, 2, 3])
    sampling.sample_rows(rows, SamplingParams(temperature=0.8, top_k=4), [1, 2, 3])
    assert calls == [3]


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    rows = torch.zeros(2, 64, dtype=torch.float16)
    scale = torch.ones(1, dtype=torch.float64)
    best = torch.zeros(2, dtype=torch.float64)
    pos = torch.zeros(2, dtype=torch.int64)
    out = torch.empty(2, dtype=torch.int64)
    sums = torch.zeros(2 * lib.elpis_vocab_draw_spans(0, 64), dtype=torch.int64)
    w = torch.ones(2, 4, dtype=torch.float64)
    ids = torch.arange(8, dtype=torch.int64).view(2, 4)

    def words(top_p: float, min_p: float) -> torch.Tensor:
        block = torch.tensor(sample_draw.param_words(SamplingParams(temperature=1.0)), dtype=torch.int64)
        block[1:] = torch.tensor([top_p, min_p], dtype=torch.float64).view(torch.int64)
        return block

    def pick(*, kind: int = 0, stride: int = 64, vocab: int = 64, n: int = 2, sums_bytes: int | None = None,
             top_p: float = 1.0, min_p: float = 0.0, offset: int = 0) -> int:
        block = words(top_p, min_p)
        return lib.elpis_vocab_draw_pick(rows.data_ptr(), kind, stride, vocab, n, scale.data_ptr(),
                                         best.data_ptr(), block.data_ptr(), pos.data_ptr(), offset,
                                         sums.data_ptr(), 8 * sums.numel() if sums_bytes is None else
                                         sums_bytes, out.data_ptr(), None)  # fmt: skip

    work = torch.zeros(lib.elpis_vocab_draw_head_words(0, 64, 2), dtype=torch.int64)

    def head(*, count: int = 4, top_p: float = 0.5, min_p: float = 0.0, work_bytes: int | None = None,
             nucleus: int = 1) -> int:
        block = words(top_p, min_p)
        return lib.elpis_vocab_draw_head(rows.data_ptr(), 0, 64, 64, 2, scale.data_ptr(), w.data_ptr(),
                                         ids.data_ptr(), best.data_ptr(), count, nucleus, block.data_ptr(),
                                         pos.data_ptr(), 0, work.data_ptr(),
                                         8 * work.numel() if work_bytes is None else work_bytes,
                                         out.data_ptr(), None)  # fmt: skip

    assert pick() == 0 and all(0 <= t < 64 for t in out.tolist())
    for bad in ({"kind": 3}, {"stride": 60}, {"vocab": 65}, {"vocab": 0}, {"n": 0}, {"sums_bytes": 8}):
        assert pick(**bad) == -1, bad
    # parameters are only known when the kernels read them: the other launch's, or out of range, answer -4
    for bad in ({"top_p": 0.9}, {"min_p": 0.1}, {"top_p": 0.0}, {"offset": -1}):
        assert pick(**bad) == 0 and out.tolist() == [vocab_draw.PARAMS_REFUSED] * 2, bad
    assert head(top_p=1.0) == 0 and out.tolist() == [vocab_draw.PARAMS_REFUSED] * 2  # the pick's request
    # the head's workspace: the spans' sums, then the nucleus's bins (256 a span), kept weights and cuts
    spans = lib.elpis_vocab_draw_spans(0, 64)
    assert work.numel() == 2 * spans * (256 + 2) + 2 * 6
    for bad in ({"count": 0}, {"count": 257}, {"work_bytes": 8 * work.numel() - 8}, {"nucleus": 2}):
        assert head(**bad) == -1, bad
    assert head(nucleus=0, work_bytes=8 * 2 * spans) == 0  # without the nucleus, the spans' sums alone
    assert lib.elpis_vocab_draw_head_words(3, 64, 2) == 0 and lib.elpis_vocab_draw_head_words(0, 64, 0) == 0
    # a row longer than the pick's spans hold: no nucleus, the spans' sums alone
    long = 64 * 256 + 1
    assert lib.elpis_vocab_draw_head_words(2, long, 2) == 2 * lib.elpis_vocab_draw_spans(2, long)
    assert lib.elpis_vocab_draw_spans(3, 64) == -1 and lib.elpis_vocab_draw_spans(0, 0) == -1
    # the pick's spans must fit its shared memory: 64 spans of 256 values at most in this build
    assert lib.elpis_vocab_draw_picks(2, 64 * 256) == 1 and lib.elpis_vocab_draw_picks(2, 64 * 256 + 1) == 0


def test_the_served_build_draws_the_hosts_tokens(tmp_path_factory: pytest.TempPathFactory,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The served block and spans (256 threads, 4,096 values a span) on a row of several spans."""
    built = build(tmp_path_factory, vocab_draw.THREADS, 4096, 64)
    monkeypatch.setattr(vocab_draw, "_library", lambda: built)
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(sampling, "_row_exp", _cpu_exp)
    rows = rows_of_every_kind(9001, 4)[[0, 3, 8]] * torch.tensor([[4.0], [3000.0], [1.0]])  # peaked heads
    rows = padded(rows.half())
    for filters in ({}, {"top_p": 0.9, "min_p": 0.01}):
        params = SamplingParams(temperature=0.9, seed=77, **filters)
        got = kernel_tokens(rows, params, [10, 11, 12])
        assert got == host_tokens(rows, params, [10, 11, 12])
