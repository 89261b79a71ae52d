"""elpis.accept: decisions on hand-picked cases (expected values worked out by hand from the rule in
CONTRACTS.md), every error path, thread safety, and the not-built refusal."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

import elpis.accept
from elpis import accept
from elpis.accept import abi

from .cases import BIG, CHAIN_CASES, MASK_CASES, TREE_CASES

# --- chain ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("draft", "target", "stops", "budget", "expected"), CHAIN_CASES)
def test_chain_cases(draft, target, stops, budget, expected) -> None:
    decision = accept.chain(draft, target, stops, budget)
    assert isinstance(decision, accept.ChainDecision)
    assert (decision.count, decision.ends) == expected
    assert type(decision.count) is int and type(decision.ends) is bool


def test_chain_accepts_tuples_ranges_and_numpy_ints() -> None:
    import numpy as np

    expected = accept.chain([1, 2], [1, 2, 3], [], 10)
    assert accept.chain((1, 2), (1, 2, 3), (), 10) == expected
    assert accept.chain(range(1, 3), range(1, 4), range(0), np.int64(10)) == expected
    assert (
        accept.chain(np.asarray([1, 2]), np.asarray([1, 2, 3]), np.asarray([], dtype=np.int64), 10)
        == expected
    )


# --- tree -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("parents", "draft", "target", "stops", "budget", "expected"), TREE_CASES)
def test_tree_cases(parents, draft, target, stops, budget, expected) -> None:
    decision = accept.tree(parents, draft, target, stops, budget)
    assert isinstance(decision, accept.TreeDecision)
    assert (decision.rows, decision.count, decision.ends) == expected
    assert len(decision.rows) == decision.count


def test_tree_ignores_the_anchor_draft() -> None:
    parents, target = [-1, 0, 1], [10, 20, 30]
    results = {accept.tree(parents, [anchor, 10, 20], target, [], BIG) for anchor in (0, 10, 20, 2**32 - 1)}
    assert results == {accept.TreeDecision((0, 1, 2), 3, False)}


def test_chain_shaped_tree_equals_chain() -> None:
    rng = random.Random(20261130)
    for _ in range(3000):
        k = rng.randrange(16)
        target = [rng.choice([1, 2, 3, 2**32 - 1]) for _ in range(k + 1)]
        draft = [t if rng.random() < 0.8 else rng.choice([1, 2, 3]) for t in target[:k]]
        stops = rng.sample([1, 2, 3, 7], rng.randrange(5))
        budget = rng.choice([1, 2, 3, 5, 8, 17, abi.BUDGET_MAX])
        c = accept.chain(draft, target, stops, budget)
        t = accept.tree([-1, *range(k)], [rng.randrange(2**32), *draft], target, stops, budget)
        assert (t.count, t.ends) == (c.count, c.ends)
        assert t.rows == tuple(range(c.count))


# --- masks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("parents", "expected"), MASK_CASES)
def test_tree_masks(parents, expected) -> None:
    masks = accept.tree_masks(parents)
    assert isinstance(masks, accept.TreeMasks)
    assert (masks.depth, masks.ancestors) == expected


# --- errors -----------------------------------------------------------------------------------------

SIZE, PARENT, STOPS, BUDGET, ID = "bad size", "bad parent", "bad stop count", "bad budget", "bad id"
OK_CHAIN = {"draft": [1, 2], "target": [1, 2, 3], "stops": [9], "budget": 5}
OK_TREE = {"parents": [-1, 0, 1], "draft": [0, 1, 2], "target": [1, 2, 3], "stops": [9], "budget": 5}


def _chain(**change: Any) -> None:
    accept.chain(**{**OK_CHAIN, **change})


def _tree(**change: Any) -> None:
    accept.tree(**{**OK_TREE, **change})


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda: _chain(draft=[1] * 16, target=[1] * 17), SIZE),
        (lambda: _chain(target=[1, 2]), SIZE),
        (lambda: _chain(target=[1, 2, 3, 4]), SIZE),
        (lambda: _chain(stops=[1, 2, 3, 4, 5]), STOPS),
        (lambda: _chain(budget=0), BUDGET),
        (lambda: _chain(budget=-1), BUDGET),
        (lambda: _chain(budget=2**48), BUDGET),
        (lambda: _chain(budget=2**63), BUDGET),
        (lambda: _chain(budget=2**80), BUDGET),
        (lambda: _chain(budget=2.0), BUDGET),
        (lambda: _chain(budget="5"), BUDGET),
        (lambda: _chain(budget=None), BUDGET),
        (lambda: _chain(stops=[-1]), ID),
        (lambda: _chain(stops=[2**32]), ID),
        (lambda: _chain(draft=[1, -1]), ID),
        (lambda: _chain(draft=[1, 2**64]), ID),
        (lambda: _chain(target=[1, 2, 2**32]), ID),
        (lambda: _chain(target=[1, 2, 3.0]), ID),
        (lambda: _chain(draft=["1", 2]), ID),
        (lambda: _chain(draft=[None, 2]), ID),
        # fixed checking order: size, stop count, budget, id
        (lambda: _chain(target=[1], stops=[1] * 5, budget=0), SIZE),
        (lambda: _chain(stops=[1] * 5, budget=0), STOPS),
        (lambda: _chain(budget=0, draft=[-1, 2]), BUDGET),
        (lambda: _tree(parents=[], draft=[], target=[]), SIZE),
        (lambda: _tree(parents=[-1] + [0] * 16, draft=[0] * 17, target=[0] * 17), SIZE),
        (lambda: _tree(draft=[0, 1]), SIZE),
        (lambda: _tree(target=[1, 2, 3, 4]), SIZE),
        (lambda: _tree(parents=[0, 0, 1]), PARENT),
        (lambda: _tree(parents=[-1, 1, 1]), PARENT),
        (lambda: _tree(parents=[-1, 0, 2]), PARENT),
        (lambda: _tree(parents=[-1, -1, 0]), PARENT),
        (lambda: _tree(parents=[-1, 0, 1.0]), PARENT),
        (lambda: _tree(parents=[-1, 0, 2**70]), PARENT),
        (lambda: _tree(stops=[1] * 5), STOPS),
        (lambda: _tree(budget=0), BUDGET),
        (lambda: _tree(budget=2**48), BUDGET),
        (lambda: _tree(draft=[-1, 1, 2]), ID),
        (lambda: _tree(target=[1, 2, 2**32]), ID),
        (lambda: _tree(stops=[2**32]), ID),
        # fixed checking order: size, parent, stop count, budget, id
        (lambda: _tree(parents=[0, 0, 1], draft=[0]), SIZE),
        (lambda: _tree(parents=[0, 0, 1], stops=[1] * 5), PARENT),
        (lambda: _tree(stops=[1] * 5, budget=0), STOPS),
        (lambda: _tree(budget=0, target=[1, 2, -3]), BUDGET),
        (lambda: accept.tree_masks([]), SIZE),
        (lambda: accept.tree_masks([-1] * 17), SIZE),
        (lambda: accept.tree_masks([-1, 0, 5]), PARENT),
        (lambda: accept.tree_masks([3]), PARENT),
        (lambda: accept.tree_masks([-1, "0"]), PARENT),
    ],
)
def test_invalid_input_raises_value_error_naming_it(call, reason) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(reason), str(info.value)


def test_every_error_code_has_a_reason_and_internal_faults_are_not_value_errors() -> None:
    assert set(abi.ERROR_REASONS) == {
        abi.ERR_SIZE,
        abi.ERR_PARENT,
        abi.ERR_STOPS,
        abi.ERR_BUDGET,
        abi.ERR_ID,
        abi.ERR_INTERNAL,
    }
    for code in (abi.ERR_SIZE, abi.ERR_PARENT, abi.ERR_STOPS, abi.ERR_BUDGET, abi.ERR_ID):
        with pytest.raises(ValueError, match=abi.ERROR_REASONS[code].split(":")[0]):
            elpis.accept._raise_for(code, 5, parents=[-1], stops=[], draft=[], target=[])
    with pytest.raises(RuntimeError, match="library fault"):
        elpis.accept._raise_for(abi.ERR_INTERNAL, 5)
    with pytest.raises(RuntimeError, match="unknown code"):
        elpis.accept._raise_for(-99, 5)


# --- threads and admission state --------------------------------------------------------------------


def test_concurrent_threads_do_not_share_cells() -> None:
    """The C call releases the GIL; each thread must pack into its own buffer."""
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(4000):
            k = rng.randrange(16)
            target = [rng.randrange(4) for _ in range(k + 1)]
            draft = list(target[:k])
            if k and rng.random() < 0.5:
                draft[rng.randrange(k)] = 99
            got = accept.chain(draft, target, [], BIG)
            first_miss = next((i for i in range(k) if draft[i] != target[i]), k)
            if got != (first_miss + 1, False):
                errors.append(f"{draft} {target} -> {got}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_missing_build_refuses_with_the_documented_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(elpis.accept, "_acceptor", None)
    monkeypatch.setattr(elpis.accept, "_failure", None)
    monkeypatch.setattr(elpis.accept, "ACCEPT_BUILD_DIR", tmp_path / "missing")
    outcome: list[BaseException] = []

    def fresh_thread() -> None:  # a new thread has no cached buffers, so it must admit
        try:
            accept.chain([], [1], [], 1)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert len(outcome) == 1
    assert type(outcome[0]) is RuntimeError
    assert str(outcome[0]) == "acceptor not built: run make build"


def test_failed_admission_is_remembered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from elpis.accept import loader

    broken = tmp_path / "accept"
    broken.mkdir()
    monkeypatch.setattr(elpis.accept, "_acceptor", None)
    monkeypatch.setattr(elpis.accept, "_failure", None)
    monkeypatch.setattr(elpis.accept, "ACCEPT_BUILD_DIR", broken)
    with pytest.raises(loader.AdmissionError, match="missing files"):
        elpis.accept.admitted()
    (broken / "anything").write_text("x")  # still refused: admission runs once per process, no retry
    with pytest.raises(loader.AdmissionError, match="missing files"):
        elpis.accept.admitted()
