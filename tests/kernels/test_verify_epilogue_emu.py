"""The verify epilogue kernels (patches/kernels/verify_epilogue.cu) on the CPU, through the CUDA emulation of
tests/kernels/cuda_emu.py: on adversarial rows (tests/kernels/verify_epilogue_cases.py) and random ones, their
ids, flags and digests are exactly torch's greedy_ids, nonfinite_rows and logits_digest, read through a row
stride, with rows cut into many spans, a few capped ones or one; bad arguments are refused. The GPU's own run
is tests/kernels/test_verify_epilogue.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

from elpis.exl3 import tensors, verify_epilogue
from elpis.spec.integrity import logits_digest, nonfinite_rows
from elpis.spec.sampling import greedy_ids
from tests.kernels import cuda_emu
from tests.kernels.verify_epilogue_cases import rows


def build(factory: pytest.TempPathFactory, threads: int, **spans: int) -> ctypes.CDLL:
    prefix = "ELPIS_VERIFY_EPILOGUE"
    return cuda_emu.build_span_kernels(factory, verify_epilogue, prefix, launches=3, threads=threads, **spans)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """Spans of 8 vectors: a row of a few hundred logits is cut into several (the model's into 31)."""
    return build(tmp_path_factory, 64, span_vectors=8)


@pytest.fixture(scope="module")
def lib32(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """Blocks of 32 threads, one span for any row of the tests: other reduction trees, no merge of spans."""
    return build(tmp_path_factory, 32)


@pytest.fixture(scope="module")
def lib_capped(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """At most 4 spans a row: longer spans (a power of two) than the 8 vectors asked for."""
    return build(tmp_path_factory, 64, span_vectors=8, max_spans=4)


def run(lib: ctypes.CDLL, logits: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """ids, flags and digests (fp32 logits; none of fp16 ones) from one emulated call."""
    n, vocab = logits.shape
    fp16 = logits.dtype == torch.float16
    ids = torch.full((n,), -7, dtype=torch.long)
    flags = torch.full((n,), -7, dtype=torch.int32)
    digests = torch.full((n,), -7, dtype=torch.int32)
    outputs = (ids.data_ptr(), flags.data_ptr(), None if fp16 else digests.data_ptr())
    words = 3 * n * lib.elpis_verify_epilogue_spans(int(fp16), vocab)
    workspace = torch.zeros(words, dtype=torch.int32)
    err = lib.elpis_verify_epilogue(logits.data_ptr(), int(fp16), logits.stride(0), vocab, n, *outputs,
                                    workspace.data_ptr(), 4 * words, None)  # fmt: skip
    assert err == 0
    return ids.tolist(), flags.tolist(), [] if fp16 else digests.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("vocab", "pad"), [(1000, 8), (100, 4), (513, 7), (4096, 64), (9, 7)])
def test_rows_match_torchs_compositions(lib: ctypes.CDLL, vocab: int, pad: int, dtype: torch.dtype) -> None:
    """fp16 is what the verify graph holds (ExLlamaV3's head writes it); fp32 what the host's checks take.
    Spans of 8 vectors: 1 to 128 a row, the tail past the last vector in the last span (9 logits: one or two
    vectors and one value)."""
    padded = torch.full((24, vocab + pad), float("nan"), dtype=dtype)  # what lies past a row is never read
    padded[:, :vocab] = rows(vocab, seed=vocab).to(dtype)
    logits = padded[:, :vocab]
    ids, flags, digests = run(lib, logits)
    assert ids == greedy_ids(logits).tolist()
    assert flags == nonfinite_rows(logits).to(torch.int32).tolist()
    if dtype == torch.float32:
        assert digests == logits_digest(logits.contiguous()).tolist()
    assert ids[1] == 3 and ids[2] == ids[3] == ids[4] == ids[5] == -1 and flags[5] == 0 and ids[7] == 2


def test_the_outputs_do_not_depend_on_the_spans_or_the_block(
    lib: ctypes.CDLL, lib32: ctypes.CDLL, lib_capped: ctypes.CDLL
) -> None:
    """Exact by construction: spans of 8 vectors, at most 4 capped spans and one span of 32 threads combine
    the row in other orders and agree."""
    for vocab, capped in ((100, 4), (1000, 4), (4100, 3)):
        logits = rows(vocab, seed=vocab + 1)
        assert lib_capped.elpis_verify_epilogue_spans(0, vocab) == capped
        assert run(lib, logits) == run(lib32, logits) == run(lib_capped, logits)


@pytest.mark.parametrize(
    ("fp16", "vocab", "spans"), [(1, 248_320, 31), (0, 248_320, 61), (1, 8, 1), (0, 3, 1)]
)
def test_the_spans_of_a_row(lib32: ctypes.CDLL, fp16: int, vocab: int, spans: int) -> None:
    """The served geometry: spans of 1,024 vectors; the model's fp16 row in 31 (16 verify rows: 496
    blocks)."""
    assert lib32.elpis_verify_epilogue_spans(fp16, vocab) == spans


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

    workspace = torch.zeros(64, dtype=torch.int32)

    def call(
        fp16: int, stride: int, vocab: int, n: int, at: int = 0, digest: object = None, ws_at: int = 0,
        ws_bytes: int = 24,
    ) -> int:  # fmt: skip
        d = None if digest is None else digest.data_ptr()  # type: ignore[attr-defined]
        ws = workspace.data_ptr() + ws_at
        row_args = (logits.data_ptr() + at, fp16, stride, vocab, n)
        return lib.elpis_verify_epilogue(*row_args, out.data_ptr(), flags.data_ptr(), d, ws, ws_bytes, None)

    assert lib.elpis_verify_epilogue_spans(0, 16) == 1  # 2 rows x 1 span x 12 bytes
    assert call(0, 16, 16, 2) == 0  # the control: each refusal below changes one thing
    assert call(0, 16, 16, 2, ws_bytes=23) == -1  # a workspace short of the spans' results
    assert call(0, 16, 16, 2, ws_at=2) == -1  # off 4 bytes
    refused = ((0, 16, 0, 2), (0, 12, 16, 2), (0, 16, 16, 0), (0, 16, 16, 65536), (2, 16, 16, 2))
    for fp16, stride, vocab, n in refused:
        assert call(fp16, stride, vocab, n) == -1, (fp16, stride, vocab, n)
    assert call(0, 10, 10, 2) == -1  # rows 40 bytes apart: not 16-byte aligned
    assert call(1, 12, 12, 2) == -1  # fp16 rows 24 bytes apart
    assert call(0, 16, 12, 2, at=4) == -1  # a row start off 16 bytes
    ws = workspace.data_ptr()
    outputs = (out.data_ptr(), flags.data_ptr(), None)
    assert lib.elpis_verify_epilogue(None, 0, 16, 16, 2, *outputs, ws, 24, None) == -1
    assert lib.elpis_verify_epilogue(logits.data_ptr(), 0, 16, 16, 2, *outputs, None, 24, None) == -1
    assert call(1, 16, 16, 2, digest=flags.clone()) == -1  # the digest of fp16 logits is not defined
    # rows past the proved spans' domain (2^24 vectors): refused before anything is read
    longest = 4 * ((1 << 24) - 1)
    assert lib.elpis_verify_epilogue_spans(0, longest) > 0
    assert lib.elpis_verify_epilogue_spans(0, longest + 4) == -1
    assert call(0, longest + 4, longest + 4, 1) == -1


def test_the_binding_refuses_rows_off_16_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads rows 16 bytes a load: the binding names a misaligned row start or stride."""
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "cpu")
    ids, flags = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.int32)
    half = torch.float16
    for bad in (torch.zeros((2, 100), dtype=half), torch.zeros((2, 72), dtype=half)[:, 1:65]):
        with pytest.raises(ValueError, match="16-byte aligned"):
            verify_epilogue.row_results(bad, ids, flags)


def test_the_binding_refuses_rows_past_the_proved_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 2^24 vectors or more are outside the proved row spans' domain: the binding names it before the
    launch (the C entry refuses them too). Meta tensors: the shape is checked, nothing is allocated."""
    monkeypatch.setattr(tensors, "KERNEL_DEVICE_TYPE", "meta")
    ids = torch.zeros(1, dtype=torch.long, device="meta")
    flags = torch.zeros(1, dtype=torch.int32, device="meta")
    for dtype, vocab in ((torch.float32, 4 << 24), (torch.float16, 8 << 24)):
        with pytest.raises(ValueError, match="past the proved row spans' domain"):
            verify_epilogue.row_results(torch.empty((1, vocab), dtype=dtype, device="meta"), ids, flags)

