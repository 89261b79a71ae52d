"""GPU tests of the draft candidates kernel (patches/kernels/draft_candidates.cu): on the edge rows of
tests/kernels/draft_candidates_cases.py at a small vocabulary and at the model's (248,320, rows read through
the head's padded stride), its ids are the exact order and its log-probabilities within LP_TOLERANCE of fp64
(the GPU's expf and logf, not the CPU's); on distinct values its ids are torch's composition's on the same GPU
tensors; and a timing line against that composition (7 block rows of the model's vocabulary, top-4 and
top-16). Results go to $ELPIS_KERNEL_LOG (JSON lines) when set."""

from __future__ import annotations

import pytest
import torch

from elpis.exl3 import draft_candidates
from elpis.exl3.drafter import block_candidates
from tests.kernels.draft_candidates_cases import LP_TOLERANCE, check_packed, one_threads_row, rows
from tests.kernels.timing import graph_us
from tests.kernels.tree_cases import log_kernel

pytestmark = pytest.mark.gpu

VOCAB = 248_320


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("vocab", "pad", "k"), [(1000, 8, 4), (VOCAB, 128, 16), (VOCAB, 128, 1), (520, 0, 7)]
)
def test_candidates_on_the_gpu(vocab: int, pad: int, k: int, dtype: torch.dtype) -> None:
    padded = torch.full((16, vocab + pad), float("nan"), dtype=dtype, device="cuda")  # past a row: never read
    padded[:, :vocab] = rows(vocab, seed=vocab + k).to(dtype).cuda()
    logits = padded[:, :vocab]
    chain = torch.randint(0, vocab, (16,), device="cuda")
    chain[3] = -1  # outside the vocabulary: a NaN log-probability
    packed = draft_candidates.candidates(chain, logits, k)
    worst = check_packed(packed.cpu(), logits.cpu(), chain.cpu(), k)
    log_kernel(
        "draft_candidates", {"check": "fp64", "vocab": vocab, "k": k, "dtype": str(dtype), "lp_error": worst}
    )
    assert worst <= LP_TOLERANCE, worst


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_top_16_all_in_one_threads_list_on_the_gpu(dtype: torch.dtype) -> None:
    per_vector = 8 if dtype == torch.float16 else 4
    logits = one_threads_row(VOCAB, draft_candidates.THREADS, per_vector, seed=per_vector).to(dtype)
    chain = torch.zeros(1, dtype=torch.long)
    packed = draft_candidates.candidates(chain.cuda(), logits.cuda(), 16).cpu()
    assert check_packed(packed, logits, chain, 16) <= LP_TOLERANCE


def test_distinct_rows_match_torchs_composition_on_the_gpu() -> None:
    g = torch.Generator().manual_seed(11)
    values = torch.stack([torch.randperm(4000, generator=g) for _ in range(7)])
    logits = ((values - 2000) / 64.0).half().cuda()  # distinct and exact in fp16: torch's order is defined
    chain = torch.randint(0, 4000, (7,), device="cuda")
    got, want = draft_candidates.candidates(chain, logits, 16), block_candidates(chain, logits, 16)
    assert torch.equal(got[:, :1], want[:, :1]) and torch.equal(got[:, 2:18], want[:, 2:18])
    lp_got, lp_want = torch.cat((got[:, 1:2], got[:, 18:]), 1), torch.cat((want[:, 1:2], want[:, 18:]), 1)
    assert ((lp_got - lp_want).abs() / lp_want.abs().clamp(min=1.0)).max().item() <= LP_TOLERANCE


def test_timing_line() -> None:
    """A draft block's 7 rows of the model's vocabulary (fp16, as the head writes them): the kernel against
    torch's composition, top-4 (the server's) and top-16."""
    logits = torch.randn((7, VOCAB + 128), device="cuda").half()[:, :VOCAB]
    chain = torch.randint(0, VOCAB, (7,), device="cuda")
    for k in (4, 16):
        record = {
            "check": "timing",
            "unit": f"us per draft block (7 rows x 248,320, top-{k})",
            "elpis": round(graph_us(lambda k=k: draft_candidates.candidates(chain, logits, k), 20, 15), 2),
            "torch": round(graph_us(lambda k=k: block_candidates(chain, logits, k), 20, 15), 2),
            "device": torch.cuda.get_device_name(),
        }
        log_kernel("draft_candidates", record)
        assert record["elpis"] > 0
