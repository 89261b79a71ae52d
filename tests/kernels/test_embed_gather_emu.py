"""The embedding gather (patches/kernels/embed_gather.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: each output row is what ExLlamaV3's `Embedding.forward` returns for its id (torch's
lookup widened to fp32, bit for bit except NaN payloads, times the DFlash2 input scale as torch multiplies an
fp32 tensor by a Python float), for fp16 and bf16 tables and int32 and int64 ids; an id outside the table
writes NaN and raises the error word without reading past the table; arguments the kernel could misread are
refused. The GPU test is tests/exl3/test_embed_gather.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from elpis.exl3 import embed_gather
from tests.kernels import cuda_emu

HIDDEN = 5120  # Qwen3.8's, so a row is 640 16-byte words: more than one pass of the block's 256 threads


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("embed_gather_emu")
    return embed_gather.bind(cuda_emu.build_emulated(embed_gather.SOURCE, out, launches=1))


def random_table(vocab: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random 16-bit patterns, NaN and infinity included (a copy must carry any bits), plus exact zeros."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 1 << 16, (vocab, hidden), generator=g, dtype=torch.int32).to(torch.int16)
    table = bits.view(dtype).clone()
    table[0, :8] = 0
    return table


def gather(
    lib: ctypes.CDLL, table: torch.Tensor, ids: torch.Tensor, scale: float = 1.0
) -> tuple[torch.Tensor, int]:
    rows = ids.numel()
    out = torch.full((rows, table.shape[1]), 7.0, dtype=torch.float32)
    error = np.zeros(1, dtype=np.uint32)
    err = lib.elpis_embed_gather(
        table.data_ptr(), embed_gather.DTYPES[table.dtype], table.shape[0], table.shape[1], ids.data_ptr(),
        ids.element_size(), rows, scale, out.data_ptr(), error.ctypes.data, None,
    )  # fmt: skip
    assert err == 0
    return out, int(error[0])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit where `b` is a number (infinities included); NaN exactly where `b` is NaN (torch's own CPU
    conversion gives a NaN different bits depending on the tensor's length)."""
    nan = torch.isnan(b)
    return torch.equal(torch.isnan(a), nan) and torch.equal(
        a[~nan].view(torch.int32), b[~nan].view(torch.int32)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_rows_are_exllamav3s_embedding_output(lib, dtype, id_dtype):
    table = random_table(300, HIDDEN, dtype, seed=3)
    ids = torch.tensor([5, 299, 0, 5, 17, 128, 1, 250, 9, 33, 44, 2, 298, 77, 0, 160], dtype=id_dtype)
    out, error = gather(lib, table, ids)
    expected = torch.nn.Embedding.from_pretrained(table).forward(ids.long()).to(torch.float32)
    assert error == 0
    assert same_bits(out, expected)


@pytest.mark.parametrize("scale", [0.7310586, 3.0, 1.0 / 3.0])
def test_a_scaled_row_is_torchs_fp32_product(lib, scale):
    """The DFlash2 input layer's `x * input_embedding_scale` on the fp32 embedding output."""
    table = random_table(64, HIDDEN, torch.float16, seed=5)
    ids = torch.tensor([63, 0, 31], dtype=torch.int64)
    out, error = gather(lib, table, ids, scale)
    expected = table[ids].to(torch.float32) * scale
    assert error == 0
    assert same_bits(out, expected)
    unscaled, _ = gather(lib, table, ids, 1.0)
    assert not same_bits(out, unscaled), "the scale was ignored"


def test_an_id_outside_the_table_writes_nan_and_the_error_word(lib):
    table = random_table(16, 64, torch.float16, seed=7)
    ids = torch.tensor([3, 16, -1, 15], dtype=torch.int32)  # 16 and -1 are outside 16 rows
    out, error = gather(lib, table, ids)
    assert error == 1
    assert torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    assert same_bits(out[0], table[3].float()) and same_bits(out[3], table[15].float())


def test_arguments_the_kernel_could_misread_are_refused(lib):
    table = random_table(8, 64, torch.float16, seed=9)
    ids = torch.zeros(2, dtype=torch.int32)
    out = torch.zeros((2, 64), dtype=torch.float32)
    error = np.zeros(1, dtype=np.uint32)

    def call(**kw: int) -> int:
        args = {"table": table.data_ptr(), "dtype": 0, "vocab": 8, "hidden": 64, "ids": ids.data_ptr(),
                "id_bytes": 4, "rows": 2, "out": out.data_ptr(), "error": error.ctypes.data} | kw  # fmt: skip
        return lib.elpis_embed_gather(
            args["table"], args["dtype"], args["vocab"], args["hidden"], args["ids"], args["id_bytes"],
            args["rows"], 1.0, args["out"], args["error"], None,
        )  # fmt: skip

    assert call() == 0
    assert call(hidden=60) == -1  # not whole 16-byte words
    assert call(dtype=2) == -1
    assert call(id_bytes=2) == -1
    assert call(rows=0) == -1
    assert call(table=table.data_ptr() + 2) == -1  # misaligned rows
    assert call(ids=0) == -1 and call(error=0) == -1


def test_check_ids_names_the_bad_id():
    embed_gather.check_ids([0, 5, 9], 10)
    with pytest.raises(ValueError, match="token id 10 is outside the 10-row"):
        embed_gather.check_ids([0, 10, 3], 10)
    with pytest.raises(ValueError, match="token id -2"):
        embed_gather.check_ids([-2], 10)
