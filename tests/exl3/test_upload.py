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
