"""The host-side pieces of elpis's graph captures (`elpis.exl3.capture`) that run without a GPU: the segment
boundary hook and the segment count rule. The captures themselves are GPU-tested in test_tree_graph.py."""

from __future__ import annotations

import pytest

from elpis.exl3.capture import Segments, before_module


class Block:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward(self, x: int) -> int:
        self.calls.append("forward")
        return x + 1


def test_the_boundary_runs_before_each_forward_and_is_removed_after():
    block = Block()
    with before_module(block, lambda: block.calls.append("boundary")):
        assert block.forward(1) == 2 and block.forward(5) == 6
    assert block.calls == ["boundary", "forward", "boundary", "forward"]
    assert "forward" not in vars(block)  # the class's method again
    block.forward(0)
    assert block.calls[-2:] == ["forward", "forward"]


def test_an_instance_level_forward_is_put_back():
    block = Block()
    wrapped = block.forward
    block.forward = lambda x: wrapped(x) * 10  # another wrapper, set on the instance
    own = block.forward
    with before_module(block, lambda: block.calls.append("boundary")):
        assert block.forward(1) == 20
    assert block.forward is own and block.calls == ["boundary", "forward"]


def test_the_hook_is_removed_when_the_body_fails():
    block = Block()
    with pytest.raises(KeyError), before_module(block, lambda: None):
        raise KeyError("capture failed")
    assert "forward" not in vars(block)


def test_a_capture_has_at_least_one_segment():
    with pytest.raises(ValueError, match="at least one segment"):
        Segments(0)
