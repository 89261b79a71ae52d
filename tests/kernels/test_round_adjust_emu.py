"""The rows' logit adjustments on the GPU (`patches/kernels/round_adjust.cu`, `elpis.exl3.round_adjust`) built
for the CPU (tests/kernels/cuda_emu.py): every row's float64 values are `History.adjusted`'s bit for bit, each
row counting its own path read from the acceptor's cells, under every mix of penalties and bias, with the
history written and advanced by `DeviceHistory`."""

from __future__ import annotations

import ctypes
import random

import pytest
import torch

from elpis.accept import abi
from elpis.exl3 import round_adjust, tensors
from elpis.spec.penalties import History, tree_paths
from elpis.spec.sampling import SamplingParams
from tests.kernels import cuda_emu

VOCAB, STRIDE = 3001, 3016


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("round_adjust")
    return round_adjust.bind(cuda_emu.build_emulated(round_adjust.SOURCE, out, launches=1))


@pytest.fixture
def on_cpu(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(round_adjust, "_library", lambda: lib)
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")


def random_tree(rng: random.Random, rows: int, anchor: int, pool: list[int]) -> tuple[list[int], list[int]]:
    """A tree of `rows` rows (parents[i] < i), its tokens drawn from `pool` (repeats on a path included)."""
    parents = [-1] + [rng.randrange(i) for i in range(1, rows)]
    tokens = [anchor] + [rng.choice(pool) for _ in range(1, rows)]
    return tokens, parents


def cells_of(tokens: list[int], parents: list[int]) -> torch.Tensor:
    cells = torch.zeros(abi.TREE_CELLS, dtype=torch.int64)
    cells[abi.TREE_ROWS] = len(tokens)
    cells[abi.TREE_PARENTS : abi.TREE_PARENTS + len(parents)] = torch.tensor(parents)
    cells[abi.TREE_DRAFT : abi.TREE_DRAFT + len(tokens)] = torch.tensor(tokens)
    return cells


SETTINGS = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.7},
    {"frequency_penalty": -0.4, "presence_penalty": 2.0},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.7},
    {"logit_bias": ((5, 100.0), (77, -3.25), (3000, 0.5))},
    {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 1.5, "logit_bias": ((9, 5.0),)},
]


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "+".join(s))
def test_every_row_is_the_hosts_adjustment(seed: int, settings: dict) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = SamplingParams(temperature=0.7, top_k=20, seed=1, **settings)
    pool = [rng.randrange(VOCAB) for _ in range(12)]  # paths repeat these, the history holds them
    prompt = [rng.choice(pool) for _ in range(20)] + [rng.randrange(VOCAB) for _ in range(30)]
    generated = [rng.choice(pool) for _ in range(9)]
    run, rows = 16, rng.choice([1, 5, 16])
    tokens, parents = random_tree(rng, rows, generated[-1], pool)
    logits = (torch.randn(run, STRIDE) * 4).half()
    logits[0, 100] = float("-inf")
    logits[1, pool[0]] = 0.0  # a zero, and negative values, under the repetition penalty
    view = logits[:, :VOCAB]
    history = History(params, prompt, VOCAB)
    history.commit(generated)
    paths = tree_paths(tokens, parents) + [()] * (run - rows)  # rows past the tree: no path
    want = history.adjusted(view.float(), paths)
    device = round_adjust.DeviceHistory(VOCAB, "cpu")
    device.start(params, prompt, generated[:4])
    device.count(torch.tensor([*generated[4:], -1, -1], dtype=torch.int64))  # a round's record: -1 past count
    out = torch.empty(run, VOCAB, dtype=torch.float64)
    round_adjust.queue(view, cells_of(tokens, parents), device, out)
    assert torch.equal(out.view(torch.int64), want.view(torch.int64))
    assert not torch.equal(want, view.double()), "the settings changed nothing"


@pytest.mark.usefixtures("on_cpu")
def test_a_rows_own_path_changes_its_penalty() -> None:
    """Row 2 holds token 7 on its path (row 1, then itself): presence penalises 7 there, not in row 0's."""
    params = SamplingParams(presence_penalty=1.5)
    device = round_adjust.DeviceHistory(VOCAB, "cpu")
    device.start(params, [1, 2, 3], [])
    logits = torch.zeros(3, VOCAB, dtype=torch.float16)
    out = torch.empty(3, VOCAB, dtype=torch.float64)
    round_adjust.queue(logits, cells_of([4, 7, 8], [-1, 0, 1]), device, out)
    assert out[0, 7] == 0.0 and out[1, 7] == -1.5 and out[2, 7] == -1.5 and out[2, 8] == -1.5
    assert out[1, 8] == 0.0 and out[0, 4] == 0.0  # the anchor is not on any path


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    logits = torch.zeros(2, 8, dtype=torch.float16)
    cells = cells_of([1, 2], [-1, 0])
    history = round_adjust.DeviceHistory(8, "cpu")
    out = torch.empty(2, 8, dtype=torch.float64)

    def call(run: int = 2, vocab: int = 8, stride: int = 8) -> int:
        return lib.elpis_round_adjust(logits.data_ptr(), stride, vocab, run, cells.data_ptr(),
                                      history.counts.data_ptr(), history.seen.data_ptr(),
                                      history.bias.data_ptr(), history.params.data_ptr(), out.data_ptr(),
                                      None)  # fmt: skip

    assert call() == 0
    for bad in ({"run": 0}, {"run": 17}, {"vocab": 0}, {"vocab": 9}):
        assert call(**bad) == -1, bad
    with pytest.raises(ValueError, match="outside the vocabulary"):
        history.start(SamplingParams(logit_bias=((8, 1.0),)), [], [])
