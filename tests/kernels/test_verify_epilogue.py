"""GPU tests of the verify epilogue kernel (patches/kernels/verify_epilogue.cu): on the adversarial rows of
tests/kernels/verify_epilogue_cases.py at a small vocabulary and at the model's (248,320, rows read through
the verify's padded stride), its ids, flags and digests are exactly torch's greedy_ids, nonfinite_rows and
logits_digest on the same GPU tensors; and a timing line against that composition (16 rows of the model's
vocabulary). Results go to $ELPIS_KERNEL_LOG (JSON lines) when set.
"""

from __future__ import annotations

import pytest
import torch

from elpis.exl3 import verify_epilogue
from elpis.spec.integrity import logits_digest, nonfinite_rows
from elpis.spec.sampling import greedy_ids
from tests.kernels.timing import graph_us
from tests.kernels.tree_cases import log_kernel
from tests.kernels.verify_epilogue_cases import rows

pytestmark = pytest.mark.gpu

VOCAB = 248_320


def _outputs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = logits.shape[0]
    ids = torch.full((n,), -7, dtype=torch.long, device=logits.device)
    flags = torch.full((n,), -7, dtype=torch.int32, device=logits.device)
    digests = torch.full((n,), -7, dtype=torch.int32, device=logits.device)
    fp32 = logits.dtype == torch.float32
    verify_epilogue.row_results(logits, ids, flags, digests if fp32 else None)
    return ids, flags, digests


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("vocab", "pad"), [(1000, 8), (VOCAB, 128)])
def test_rows_match_torchs_compositions_on_the_gpu(vocab: int, pad: int, dtype: torch.dtype) -> None:
    """fp16 as the verify graph holds its logits (ExLlamaV3's head writes them); fp32 with the digest."""
    padded = torch.full((24, vocab + pad), float("nan"), dtype=dtype, device="cuda")  # past a row: never read
    padded[:, :vocab] = rows(vocab, seed=vocab).to(dtype).cuda()
    logits = padded[:, :vocab]
    ids, flags, digests = _outputs(logits)
    assert ids.tolist() == greedy_ids(logits).tolist()
    assert flags.tolist() == nonfinite_rows(logits).to(torch.int32).tolist()
    if dtype == torch.float32:
        assert digests.tolist() == logits_digest(logits.contiguous()).tolist()


def test_bad_logits_are_refused() -> None:
    ids = torch.zeros(2, dtype=torch.long, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    bf16 = torch.zeros((2, 8), device="cuda").bfloat16()
    for bad in (bf16, torch.zeros((2, 8)), torch.zeros((8, 2), device="cuda").t()):
        with pytest.raises(ValueError):
            verify_epilogue.row_results(bad, ids, flags)


def test_timing_line() -> None:
    """16 verify rows of the model's vocabulary (fp16, as the verify graph holds them): the kernel against
    torch's eight launches."""
    logits = torch.randn((16, VOCAB + 128), device="cuda").half()[:, :VOCAB]
    ids = torch.empty(16, dtype=torch.long, device="cuda")
    flags = torch.empty(16, dtype=torch.int32, device="cuda")

    def torch_composition() -> None:
        greedy_ids(logits)
        nonfinite_rows(logits).to(torch.int32)

    record = {
        "check": "timing",
        "unit": "us per verify (16 rows x 248,320)",
        "elpis": round(graph_us(lambda: verify_epilogue.row_results(logits, ids, flags), 20, 15), 2),
        "torch": round(graph_us(torch_composition, 20, 15), 2),
        "device": torch.cuda.get_device_name(),
    }
    log_kernel("verify_epilogue", record)
    assert record["elpis"] > 0
