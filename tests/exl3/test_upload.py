"""The host-side helpers that fill captured graphs' static inputs (`elpis.exl3.upload`), on the CPU."""

from __future__ import annotations

import pytest
import torch

from elpis.exl3.upload import padded_table, static_input


def test_padded_table_pads_with_zeros_and_refuses_pages_past_the_width():
    assert padded_table([5, 9, 2], 6, "x") == [5, 9, 2, 0, 0, 0]
    assert padded_table([5, 9, 0, 0], 2, "x") == [5, 9]  # unused pages past the width are dropped
    with pytest.raises(RuntimeError, match="x: 3 pages do not fit the key's 2"):
        padded_table([5, 9, 2], 2, "x")


def test_static_input_is_allocated_once_and_keeps_its_shape_and_dtype():
    x = torch.ones((1, 8, 4), dtype=torch.half)
    buffer = static_input(None, x, "cpu", "draft graphs")
    assert buffer.shape == x.shape and buffer.dtype == x.dtype
    assert static_input(buffer, torch.zeros_like(x), "cpu", "draft graphs") is buffer
    with pytest.raises(RuntimeError, match=r"draft graphs: the input is torch.float32 \[1, 8, 4\]"):
        static_input(buffer, x.float(), "cpu", "draft graphs")
    with pytest.raises(RuntimeError, match=r"the key holds torch.float16 \[1, 8, 4\]"):
        static_input(buffer, torch.ones((1, 7, 4), dtype=torch.half), "cpu", "draft graphs")


@pytest.mark.gpu
def test_staged_uploads_reuse_their_twins_and_never_overwrite_a_pending_copy():
    """Each put lands in its buffer in stream order, even when the GPU is still busy with earlier work as the
    host writes the next values (the event guard), and wrong shapes are refused."""
    import numpy as np

    from elpis.exl3.upload import Staged

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ints = torch.zeros(300, dtype=torch.int32, device="cuda")
    plan = torch.zeros(64, dtype=torch.uint8, device="cuda")
    x = torch.zeros((1, 4, 8), dtype=torch.float32, device="cuda")
    staged = Staged(x, ints, plan)
    twins = [t.data_ptr() for t in staged.twins]
    seen = []
    busy = torch.randn((4096, 4096), device="cuda")
    for k in range(6):
        busy = busy @ busy.T / 4096  # queued work ahead of each copy: the copies wait behind it
        staged.put(torch.full((1, 4, 8), float(k)), [k * 1000 + i for i in range(300)],
                   np.full(64, k, dtype=np.uint8))  # fmt: skip
        seen.append((x.clone(), ints.clone(), plan.clone()))  # stream-ordered after the copy
    torch.cuda.synchronize()
    for k, (xs, i, p) in enumerate(seen):
        assert torch.equal(xs.cpu(), torch.full((1, 4, 8), float(k)))
        assert i.cpu().tolist() == [k * 1000 + j for j in range(300)]
        assert p.cpu().tolist() == [k] * 64
    assert [t.data_ptr() for t in staged.twins] == twins, "the twins were reallocated"
    staged.put(None, list(range(300)), None)  # None leaves a buffer alone
    torch.cuda.synchronize()
    assert plan.cpu().tolist() == [5] * 64
    with pytest.raises(ValueError, match="299 values for a staged buffer of 300"):
        staged.put(None, list(range(299)), None)
    with pytest.raises(ValueError, match=r"a torch.float16 \[1, 4, 8\] value"):
        staged.put(torch.zeros((1, 4, 8), dtype=torch.half), None, None)
    with pytest.raises(ValueError, match="2 values for 3 staged buffers"):
        staged.put(None, None)


def test_a_table_upload_skips_the_pages_its_table_holds_until_told_to_forget(monkeypatch) -> None:
    """`TableUpload` (the block tables rounds on the GPU put before each launch): a put of the pages it last
    uploaded copies nothing, other pages are uploaded padded to the table's width, and after `forget` (another
    upload wrote the table) the same pages are uploaded again. Pages past the width are refused."""
    import torch

    from elpis.exl3 import upload

    puts: list[tuple[int, ...]] = []

    class Recorded:
        def __init__(self, table: torch.Tensor) -> None:
            self.table = table

        def put(self, values) -> None:
            puts.append(tuple(values))

    monkeypatch.setattr(upload, "Staged", Recorded)
    t = upload.TableUpload(torch.zeros((1, 4), dtype=torch.int32), "test")
    t.put([3, 5])
    t.put([3, 5])
    t.put([3, 5, 7])
    t.forget()
    t.put([3, 5, 7])
    assert puts == [(3, 5, 0, 0), (3, 5, 7, 0), (3, 5, 7, 0)]
    with pytest.raises(RuntimeError, match="do not fit"):
        t.put([1, 2, 3, 4, 5])


def test_a_table_upload_with_a_count_uploads_the_pages_count_beside_them(monkeypatch) -> None:
    """With a count buffer (the round tail reads the sequence's page count from device memory), each put
    uploads the padded table and the count, at most the table's width, in one staged put; the same pages skip
    both, and a count buffer that is not int32 [1] is refused."""
    import torch

    from elpis.exl3 import upload

    puts: list[tuple[tuple[int, ...], ...]] = []

    class Recorded:
        def __init__(self, *buffers: torch.Tensor) -> None:
            self.buffers = buffers

        def put(self, *values) -> None:
            assert len(values) == len(self.buffers) == 2
            puts.append(tuple(tuple(v) for v in values))

    monkeypatch.setattr(upload, "Staged", Recorded)
    count = torch.zeros((1,), dtype=torch.int32)
    t = upload.TableUpload(torch.zeros((1, 4), dtype=torch.int32), "test", count)
    t.put([3, 5])
    t.put([3, 5])
    t.put([3, 5, 7])
    t.put([3, 5, 7, 0, 0])  # unused pages past the width: the count stops at the width
    assert puts == [((3, 5, 0, 0), (2,)), ((3, 5, 7, 0), (3,)), ((3, 5, 7, 0), (4,))]
    for bad in (torch.zeros((2,), dtype=torch.int32), torch.zeros((1,), dtype=torch.int64)):
        with pytest.raises(ValueError, match="a table's page count is int32"):
            upload.TableUpload(torch.zeros((1, 4), dtype=torch.int32), "test", bad)
