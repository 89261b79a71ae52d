"""The verify epilogue kernel (patches/kernels/verify_epilogue.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: on adversarial rows (tests/kernels/verify_epilogue_cases.py) and random ones, its
ids, flags and digests are exactly torch's greedy_ids, nonfinite_rows and logits_digest, read through a row
stride; bad arguments are refused. The GPU's own run is tests/kernels/test_verify_epilogue.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

from elpis.exl3 import tensors, verify_epilogue
from elpis.spec.integrity import logits_digest, nonfinite_rows
from elpis.spec.sampling import greedy_ids
from tests.kernels import cuda_emu
from tests.kernels.verify_epilogue_cases import rows


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("verify_epilogue")
    built = cuda_emu.build_emulated(verify_epilogue.SOURCE, out, launches=2)
    return verify_epilogue.bind(built)


@pytest.fixture(scope="module")
def lib32(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """A build with blocks of 32 threads: another reduction tree."""
    out = tmp_path_factory.mktemp("verify_epilogue_32")
    defines = {"ELPIS_VERIFY_EPILOGUE_THREADS": 32}
    built = cuda_emu.build_emulated(verify_epilogue.SOURCE, out, launches=2, defines=defines)
    return verify_epilogue.bind(built, threads=32)


def run(lib: ctypes.CDLL, logits: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """ids, flags and digests (fp32 logits; none of fp16 ones) from one emulated launch."""
    n, vocab = logits.shape
    fp16 = logits.dtype == torch.float16
    ids = torch.full((n,), -7, dtype=torch.long)
    flags = torch.full((n,), -7, dtype=torch.int32)
    digests = torch.full((n,), -7, dtype=torch.int32)
    outputs = (ids.data_ptr(), flags.data_ptr(), None if fp16 else digests.data_ptr())
    err = lib.elpis_verify_epilogue(logits.data_ptr(), int(fp16), logits.stride(0), vocab, n, *outputs, None)
    assert err == 0
    return ids.tolist(), flags.tolist(), [] if fp16 else digests.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("vocab", "pad"), [(1000, 8), (100, 4), (513, 7), (4096, 64)])
def test_rows_match_torchs_compositions(lib: ctypes.CDLL, vocab: int, pad: int, dtype: torch.dtype) -> None:
    """fp16 is what the verify graph holds (ExLlamaV3's head writes it); fp32 what the host's checks take."""
    padded = torch.full((24, vocab + pad), float("nan"), dtype=dtype)  # what lies past a row is never read
    padded[:, :vocab] = rows(vocab, seed=vocab).to(dtype)
    logits = padded[:, :vocab]
    ids, flags, digests = run(lib, logits)
    assert ids == greedy_ids(logits).tolist()
    assert flags == nonfinite_rows(logits).to(torch.int32).tolist()
    if dtype == torch.float32:
        assert digests == logits_digest(logits.contiguous()).tolist()
    assert ids[1] == 3 and ids[2] == ids[3] == ids[4] == ids[5] == -1 and flags[5] == 0 and ids[7] == 2


def test_the_outputs_do_not_depend_on_the_block(lib: ctypes.CDLL, lib32: ctypes.CDLL) -> None:
    """Exact by construction: 512 and 32 threads combine the row in other orders and agree."""
    for vocab in (100, 1000, 4100):
        logits = rows(vocab, seed=vocab + 1)
        assert run(lib, logits) == run(lib32, logits)


def test_a_changed_value_changes_the_digest_and_a_moved_maximum_the_id(lib: ctypes.CDLL) -> None:
    logits = rows(700, seed=3)
    ids, _, digests = run(lib, logits)
    other = logits.clone()
    other[0, 17] = torch.nextafter(other[0, 17], torch.tensor(float("inf")))
    other[8, 0], other[8, 650] = 0.0, 99.0
    ids2, _, digests2 = run(lib, other)
    changed = [r for r in range(len(digests)) if digests2[r] != digests[r]]
    assert changed == [0, 8], changed
    assert ids2[8] == 650 and ids[8] == 0


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    logits = torch.zeros((2, 16))
    out = torch.zeros(2, dtype=torch.long)
    flags = torch.zeros(2, dtype=torch.int32)

    def call(fp16: int, stride: int, vocab: int, n: int, at: int = 0, digest: object = None) -> int:
        d = None if digest is None else digest.data_ptr()  # type: ignore[attr-defined]
        args = (logits.data_ptr() + at, fp16, stride, vocab, n, out.data_ptr(), flags.data_ptr(), d, None)
        return lib.elpis_verify_epilogue(*args)

    assert call(0, 16, 16, 2) == 0  # the control: each refusal below changes one thing
    refused = ((0, 16, 0, 2), (0, 12, 16, 2), (0, 16, 16, 0), (0, 16, 16, 65536), (2, 16, 16, 2))
    for fp16, stride, vocab, n in refused:
        assert call(fp16, stride, vocab, n) == -1, (fp16, stride, vocab, n)
    assert call(0, 10, 10, 2) == -1  # rows 40 bytes apart: not 16-byte aligned
    assert call(1, 12, 12, 2) == -1  # fp16 rows 24 bytes apart
    assert call(0, 16, 12, 2, at=4) == -1  # a row start off 16 bytes
    assert lib.elpis_verify_epilogue(None, 0, 16, 16, 2, out.data_ptr(), flags.data_ptr(), None, None) == -1
    assert call(1, 16, 16, 2, digest=flags.clone()) == -1  # the digest of fp16 logits is not defined


def test_the_binding_refuses_rows_off_16_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads rows 16 bytes a load: the binding names a misaligned row start or stride."""
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")
    ids, flags = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.int32)
    half = torch.float16
    for bad in (torch.zeros((2, 100), dtype=half), torch.zeros((2, 72), dtype=half)[:, 1:65]):
        with pytest.raises(ValueError, match="16-byte aligned"):
            verify_epilogue.row_results(bad, ids, flags)
