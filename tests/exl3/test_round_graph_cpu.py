"""CPU tests of the composed rounds' bookkeeping (`elpis.exl3.round_graph.RoundGraphs`: the LRU, graphs
retired while a round may still run them) and of what `elpis.exl3.graph_compose` refuses before it reaches the
driver. Composing real graphs is the GPU's: tests/exl3/test_round_graph.py."""

from __future__ import annotations

import ctypes

import pytest

from elpis.exl3 import graph_compose
from elpis.exl3.round_graph import RoundGraphs
from tests.exl3.test_device_round_driver_cpu import StandInComposer


class Graph:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def replay(self) -> None:
        self.log.append(self.name)


def test_a_composed_graph_runs_its_pieces_in_order() -> None:
    log: list[str] = []
    graphs = RoundGraphs(StandInComposer())
    steps = (lambda: log.append("a"), Graph(log, "B"), lambda: log.append("c"))
    g = graphs.compose("k", steps, keys=(None, None, None), number=0)
    graphs.launch(g)
    graphs.launch(graphs.get("k"))
    assert log == ["a", "B", "c", "a", "B", "c"] and graphs.launches == 2 and graphs.composed == 1


def test_evicted_graphs_live_until_no_round_in_flight_may_run_them() -> None:
    graphs = RoundGraphs(StandInComposer(), limit=2)
    for number, key in enumerate("abc"):
        graphs.compose(key, (), keys=(None, None, None), number=number)
    assert list(graphs.graphs) == ["b", "c"] and graphs.get("a") is None
    assert [n for n, _ in graphs.retired] == [2]  # evicted while round 2 was being queued
    graphs.release(1)
    assert graphs.retired, "dropped before the round that may launch it was read back"
    graphs.release(2)
    assert not graphs.retired
    graphs.get("b")  # used: "c" is now the least recent
    graphs.compose("d", (), keys=(None, None, None), number=3)
    assert list(graphs.graphs) == ["b", "d"]


def test_round_graphs_keep_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RoundGraphs(StandInComposer(), limit=0)


@pytest.mark.parametrize("children", [[], [0], [1, None]])
def test_a_composed_graph_refuses_children_that_are_not_graph_handles(children: list) -> None:
    with pytest.raises(ValueError):
        graph_compose.ComposedGraph(children, 0)


def test_without_the_driver_composing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    graph_compose.driver.cache_clear()
    monkeypatch.setattr(graph_compose.ctypes, "CDLL", missing)
    try:
        with pytest.raises(graph_compose.GraphComposeError, match=r"libcuda\.so\.1"):
            graph_compose.driver()
    finally:
        graph_compose.driver.cache_clear()


def test_every_driver_entry_has_a_signature() -> None:
    """The entries the module calls are the ones it types (a call through an untyped entry would pass Python
    ints as C ints and truncate handles)."""
    import inspect

    source = inspect.getsource(graph_compose)
    called = {name for name in graph_compose.ENTRY_ARGS if f".{name}(" in source}
    assert called == set(graph_compose.ENTRY_ARGS)
