"""The draft candidates kernels (patches/kernels/draft_candidates.cu) on the CPU, through the CUDA emulation
of tests/kernels/cuda_emu.py: on edge rows (tests/kernels/draft_candidates_cases.py) and random ones, fp16
and fp32, read through a row stride, cut into many spans, into a few long ones (the cap on spans) and into
one, the ids are the exact order and the log-probabilities within LP_TOLERANCE of fp64's; they agree with
torch's composition (`drafter.block_candidates`) where torch's order is defined; bad arguments are refused.
The GPU's own run is tests/kernels/test_draft_candidates.py."""

from __future__ import annotations

import ctypes
import json

import pytest
import torch

from elpis.exl3 import draft_candidates, tensors
from elpis.exl3.drafter import block_candidates, choose_candidates
from tests.kernels import cuda_emu
from tests.kernels.draft_candidates_cases import LP_TOLERANCE, check_packed, one_threads_row, rows


def build(factory: pytest.TempPathFactory, threads: int, **spans: int) -> ctypes.CDLL:
    binding, prefix = draft_candidates, "ELPIS_DRAFT_CANDIDATES"
    return cuda_emu.build_span_kernels(factory, binding, prefix, launches=4, threads=threads, **spans)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """Blocks of 64 threads (two warps, so the blocks' merges of warps run; the served 256 is 8 of them)
    and spans of 16 vectors, so a row of a few hundred logits is cut into several (a span of the model's
    row is 1,024 vectors, 31 spans)."""
    return build(tmp_path_factory, 64, span_vectors=16)


@pytest.fixture(scope="module")
def lib32(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """One warp, and one span for any row of the tests: a single block sees the whole row."""
    return build(tmp_path_factory, 32)


@pytest.fixture(scope="module")
def lib_capped(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """At most 4 spans a row: longer rows get longer spans (a power of two) than the 16 vectors asked for."""
    return build(tmp_path_factory, 64, span_vectors=16, max_spans=4)


@pytest.fixture
def on_cpu(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binding's own checks and call, on the emulated kernel."""
    monkeypatch.setattr(draft_candidates, "_library", lambda: lib)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: type("S", (), {"cuda_stream": None})())
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")


def chain_of(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g, dtype=torch.long)


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("vocab", "pad", "k"),
    [(1000, 8, 4), (100, 4, 16), (517, 11, 1), (4096, 64, 7), (24, 0, 16), (520, 0, 16)],
)
def test_candidates_are_the_exact_order_with_fp64_log_probabilities(
    vocab: int, pad: int, k: int, dtype: torch.dtype
) -> None:
    """Rows read in place through a padded stride (what lies past a row is NaN and never read); fp16 is what
    ExLlamaV3's head writes. Spans of 16 vectors: 1 to 32 a row; a vocabulary not a multiple of the vector
    width runs the last span's tail; 520 fp16 logits leave a last span of 8, fewer than k; rows of -inf
    spans among finite ones (rows 6 and 10), a NaN or +inf in one span (rows 2-4)."""
    if dtype == torch.float16:
        pad += (-(vocab + pad)) % 8  # fp16 rows start 16-byte aligned
    else:
        pad += (-(vocab + pad)) % 4
    padded = torch.full((16, vocab + pad), float("nan"), dtype=dtype)
    padded[:, :vocab] = rows(vocab, seed=vocab + k).to(dtype)
    logits = padded[:, :vocab]
    chain = chain_of(16, vocab, vocab)
    chain[3], chain[5] = vocab, -1  # outside the vocabulary: NaN log-probabilities
    packed = draft_candidates.candidates(chain, logits, k)
    assert packed.shape == (16, 2 + 2 * k) and packed.dtype == torch.float32
    worst = check_packed(packed, logits, chain, k)
    assert worst <= LP_TOLERANCE, worst
    print(json.dumps({"draft_candidates_lp_error": worst, "vocab": vocab, "k": k, "dtype": str(dtype)}))


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_top_16_all_in_one_threads_list(
    dtype: torch.dtype, lib32: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread of a row's one span sees the row's 16 largest logits: its own list must keep all 16 (one
    of 8 or 12 entries, a mutant's, loses some)."""
    monkeypatch.setattr(draft_candidates, "_library", lambda: lib32)
    assert lib32.elpis_draft_candidates_spans(int(dtype == torch.float16), 4096) == 1
    per_vector = 8 if dtype == torch.float16 else 4
    logits = one_threads_row(4096, 32, per_vector, seed=per_vector).to(dtype)
    chain = torch.zeros(1, dtype=torch.long)
    assert check_packed(draft_candidates.candidates(chain, logits, 16), logits, chain, 16) <= LP_TOLERANCE


@pytest.mark.usefixtures("on_cpu")
def test_random_rows_match_torchs_composition() -> None:
    """Where torch's order is defined (distinct values, no NaN), its ids are the kernel's and its
    log-probabilities within the tolerance; past the vocabulary the k is torch's min(top_k, vocab)."""
    g = torch.Generator().manual_seed(5)
    for vocab, k in ((3000, 4), (8, 16), (256, 16)):
        # distinct multiples of 1/64 below 32 in magnitude: exact, so distinct, in fp16
        perms = [torch.randperm(vocab, generator=g) for _ in range(7)]
        logits = ((torch.stack(perms) - vocab // 2) / 64.0).half()
        chain = chain_of(7, vocab, vocab)
        got = draft_candidates.candidates(chain, logits, k)
        want = block_candidates(chain, logits, k)
        assert got.shape == want.shape
        kk = min(k, vocab)
        assert torch.equal(got[:, 2 : 2 + kk], want[:, 2 : 2 + kk])
        assert torch.equal(got[:, 0], want[:, 0])
        lp_got, lp_want = (
            torch.cat((got[:, 1:2], got[:, 2 + kk :]), 1),
            torch.cat((want[:, 1:2], want[:, 2 + kk :]), 1),
        )
        assert ((lp_got - lp_want).abs() / lp_want.abs().clamp(min=1.0)).max().item() <= LP_TOLERANCE


@pytest.mark.usefixtures("on_cpu")
def test_the_ids_do_not_depend_on_the_spans_or_the_block(
    lib: ctypes.CDLL, lib32: ctypes.CDLL, lib_capped: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only S's summation depends on how a row is cut and on the block: 8 spans of 64 threads, 4 long spans
    (the cap) and one span of 32 threads give the same ids and log-probabilities within 1e-5 of each
    other."""
    logits = rows(1000, seed=2).half()
    chain = chain_of(16, 1000, 2)
    assert [b.elpis_draft_candidates_spans(1, 1000) for b in (lib, lib_capped, lib32)] == [8, 4, 1]
    a = draft_candidates.candidates(chain, logits, 16)  # on_cpu's build
    for other in (lib_capped, lib32):
        monkeypatch.setattr(draft_candidates, "_library", lambda other=other: other)
        b = draft_candidates.candidates(chain, logits, 16)
        assert torch.equal(a[:, 2:18], b[:, 2:18]) and torch.equal(a[:, 0], b[:, 0])
        lp_a, lp_b = a[:, 18:], b[:, 18:]
        finite = torch.isfinite(lp_a)
        assert torch.equal(finite, torch.isfinite(lp_b))
        assert torch.equal(lp_a[~finite].nan_to_num(), lp_b[~finite].nan_to_num())  # NaN and -inf alike
        assert (lp_a[finite] - lp_b[finite]).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    ("fp16", "vocab", "spans"),
    [(1, 248_320, 31), (0, 248_320, 61), (1, 8192, 1), (1, 8200, 2), (1, 7, 1), (0, (1 << 24) - 1, 64)],
)
def test_the_spans_of_a_row(lib32: ctypes.CDLL, fp16: int, vocab: int, spans: int) -> None:
    """The served geometry (spans of 1,024 vectors, at most 64 a row): the model's row of fp16 logits is 31
    spans (7 block rows: 217 blocks), a row shorter than a vector one span, the widest row 64 longer spans."""
    assert lib32.elpis_draft_candidates_spans(fp16, vocab) == spans


@pytest.mark.usefixtures("on_cpu")
def test_bad_arguments_are_refused() -> None:
    logits = torch.zeros((4, 64), dtype=torch.float16)
    chain = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="at most 16 candidates"):
        draft_candidates.candidates(chain, logits, 17)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        draft_candidates.candidates(chain, logits, 0)
    with pytest.raises(ValueError, match="16-byte aligned"):
        draft_candidates.candidates(chain, torch.zeros((4, 70), dtype=torch.float16)[:, 1:65], 4)
    with pytest.raises(ValueError, match="16-byte aligned"):
        draft_candidates.candidates(
            chain, torch.zeros((4, 68), dtype=torch.float16)[:, :64], 4
        )  # stride 136 B
    with pytest.raises(ValueError, match="float16 or float32"):
        draft_candidates.candidates(chain, logits.double(), 4)
    with pytest.raises(ValueError, match="chain must have shape"):
        draft_candidates.candidates(chain[:3], logits, 4)
    with pytest.raises(ValueError, match=r"chain must be torch\.int64"):
        draft_candidates.candidates(chain.int(), logits, 4)
    with pytest.raises(ValueError, match="contiguous rows"):
        draft_candidates.candidates(chain, logits.t()[:4], 4)


def test_the_kernel_refuses_what_the_binding_would(lib: ctypes.CDLL) -> None:
    """The C entry's own checks, for a caller past the binding: each returns -1 and writes nothing."""
    logits = torch.zeros((2, 64), dtype=torch.float16)
    chain = torch.zeros(2, dtype=torch.long)
    out = torch.full((2, 34), 5.0)
    workspace = torch.zeros(1024, dtype=torch.int64)
    assert lib.elpis_draft_candidates_spans(1, 64) == 1  # so 2 rows x 1 span x (8 x 16 + 4) bytes are needed
    args = dict(fp16=1, stride=64, vocab=64, rows=2, k=16, ws=workspace.data_ptr(), ws_bytes=264)
    too_wide = {"vocab": 1 << 24, "stride": 1 << 24}  # ids past float32's exact integers; nothing is read

    def call(**bad: object) -> int:
        a = {**args, **bad}
        return lib.elpis_draft_candidates(logits.data_ptr() + a.get("misalign", 0), a["fp16"], a["stride"],
                                          a["vocab"], a["rows"], chain.data_ptr(), a["k"], a["ws"],
                                          a["ws_bytes"], out.data_ptr(), None)  # fmt: skip

    for bad in ({"k": 17}, {"k": 0}, {"vocab": 65}, {"stride": 60, "vocab": 60}, {"rows": 0}, {"rows": 65536},
                {"fp16": 2}, too_wide, {"ws_bytes": 263}, {"ws": workspace.data_ptr() + 4}, {"ws": None},
                {"misalign": 2}):  # fmt: skip
        assert call(**bad) == -1, bad
    assert torch.all(out == 5.0) and torch.all(workspace == 0)
    assert call() == 0  # the least workspace the geometry needs is enough


def test_the_drafter_takes_the_kernel_as_the_switch_says(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking the kernel builds it there and then (a build failure at load, not in the first request)."""
    loads = []
    monkeypatch.setattr(draft_candidates, "_library", lambda: loads.append(1) or lib)
    monkeypatch.setenv("ELPIS_PATCH_DRAFT_CANDIDATES", "1")
    assert choose_candidates() is draft_candidates.candidates and len(loads) == 1
    monkeypatch.setenv("ELPIS_PATCH_DRAFT_CANDIDATES", "0")
    assert choose_candidates() is block_candidates and len(loads) == 1
    assert choose_candidates(True) is draft_candidates.candidates and len(loads) == 2


def test_a_build_of_another_block_is_refused(lib32: ctypes.CDLL) -> None:
    with pytest.raises(RuntimeError, match="32 threads a block, expected 256"):
        draft_candidates.bind(lib32)
