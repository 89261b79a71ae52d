"""Hand-worked acceptor cases: each expected value was worked out by hand from the rule in CONTRACTS.md,
not computed by any code in the repository. Shared by the API tests and the oracle tests."""

from __future__ import annotations

import pytest

from elpis.accept import abi

BIG = 1_000

CHAIN_CASES = [
    pytest.param([1, 2, 3], [9, 8, 7, 6], [], BIG, (1, False), id="all rejected"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [], BIG, (4, False), id="all accepted + bonus"),
    pytest.param([], [5], [], BIG, (1, False), id="k=0 commits the bonus only"),
    pytest.param(
        [1, 2, 3], [1, 2, 7, 4], [], BIG, (3, False), id="mismatch mid-chain commits the correction"
    ),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [2], BIG, (2, True), id="stop mid-chain"),
    pytest.param([1, 9, 3], [1, 2, 3, 4], [2], BIG, (2, True), id="stop beats mismatch"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [4], BIG, (4, True), id="stop at bonus"),
    pytest.param([1, 2, 3], [7, 2, 3, 4], [7], BIG, (1, True), id="stop on the first token"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [100, 200, 300, 3], BIG, (3, True), id="stop in the last slot"),
    pytest.param([5], [6, 7], [5], BIG, (1, False), id="a draft equal to a stop is just a mismatch"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [], 2, (2, True), id="budget cap"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [], 4, (4, True), id="budget cap at the bonus"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [], 5, (4, False), id="budget one past the bonus"),
    pytest.param([9, 9, 9], [1, 2, 3, 4], [], 1, (1, True), id="budget 1"),
    pytest.param([1, 9], [1, 2, 3], [], 2, (2, True), id="budget cap on a correction"),
    pytest.param([1, 2], [1, 2, 3], [3], 3, (3, True), id="stop and cap together"),
    pytest.param([0, 2**32 - 1], [0, 2**32 - 1, 0], [], BIG, (3, False), id="edge ids"),
    pytest.param([0, 2**32 - 1], [0, 2**32 - 1, 0], [2**32 - 1], abi.BUDGET_MAX, (2, True), id="edge stop"),
    pytest.param(list(range(15)), list(range(16)), [], abi.BUDGET_MAX, (16, False), id="k=15, max budget"),
]

TREE_CASES = [
    pytest.param([-1], [0], [10], [], BIG, ((0,), 1, False), id="root only"),
    pytest.param([-1, 0, 0], [0, 10, 10], [10, 20, 30], [], BIG, ((0, 1), 2, False), id="lowest child wins"),
    pytest.param(
        [-1, 0, 0], [0, 99, 10], [10, 20, 30], [], BIG, ((0, 2), 2, False), id="only the later child"
    ),
    pytest.param([-1, 0, 0], [0, 98, 99], [10, 20, 30], [], BIG, ((0,), 1, False), id="all rejected"),
    pytest.param(
        [-1, 0, 1, 0, 3],
        [0, 99, 20, 10, 40],
        [10, 20, 30, 40, 50],
        [],
        BIG,
        ((0, 3, 4), 3, False),
        id="branch",
    ),
    pytest.param([-1, 0, 1], [0, 5, 10], [10, 20, 30], [], BIG, ((0,), 1, False), id="grandchild ignored"),
    pytest.param([-1, 0, 1, 2], [0, 10, 20, 30], [10, 20, 30, 40], [], 2, ((0, 1), 2, True), id="budget cap"),
    pytest.param(
        [-1, 0, 1, 2], [0, 10, 20, 30], [10, 20, 30, 40], [30], BIG, ((0, 1, 2), 3, True), id="stop"
    ),
    pytest.param(
        [-1, 0, 1, 2], [0, 10, 20, 30], [10, 20, 30, 40], [40], BIG, ((0, 1, 2, 3), 4, True), id="stop leaf"
    ),
    pytest.param(
        [-1, 0, 0, 1, 2],
        [0, 10, 10, 20, 10],
        [10, 20, 30, 40, 50],
        [],
        BIG,
        ((0, 1, 3), 3, False),
        id="lowest path",
    ),
    pytest.param(
        [-1, 0, 0, 2], [0, 10, 10, 30], [10, 99, 30, 40], [], BIG, ((0, 1), 2, False), id="no backtracking"
    ),
]

MASK_CASES = [
    pytest.param([-1], ((0,), (1,)), id="one row"),
    pytest.param([-1, 0, 0, 1, 3], ((0, 1, 1, 2, 3), (0b1, 0b11, 0b101, 0b1011, 0b11011)), id="small tree"),
    pytest.param(
        [-1, *range(15)], (tuple(range(16)), tuple(2 ** (r + 1) - 1 for r in range(16))), id="chain of 16"
    ),
    pytest.param(
        [-1] + [0] * 15, ((0,) + (1,) * 15, (1, *tuple(1 | 1 << r for r in range(1, 16)))), id="star"
    ),
]
