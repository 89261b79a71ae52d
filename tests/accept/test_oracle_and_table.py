"""The oracle against hand-worked cases, the table's coverage claims, and the table file format.

None of this needs the compiled library: it checks the yardstick the library is measured with."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from elpis.accept import abi, oracle, table, tablefile

from .cases import CHAIN_CASES, MASK_CASES, TREE_CASES


def chain_cells(draft, target, stops, budget) -> np.ndarray:
    cells = np.full((1, abi.CHAIN_CELLS), -12345, dtype=np.int64)  # garbage in every unused slot
    cells[0, [abi.CHAIN_K, abi.CHAIN_BUDGET, abi.CHAIN_NSTOPS]] = len(draft), budget, len(stops)
    cells[0, abi.CHAIN_STOPS : abi.CHAIN_STOPS + len(stops)] = stops
    cells[0, abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + len(draft)] = draft
    cells[0, abi.CHAIN_TARGET : abi.CHAIN_TARGET + len(target)] = target
    return cells


def tree_cells(parents, draft, target, stops, budget) -> np.ndarray:
    cells = np.full((1, abi.TREE_CELLS), 2**40, dtype=np.int64)
    rows = len(parents)
    cells[0, [abi.TREE_ROWS, abi.TREE_BUDGET, abi.TREE_NSTOPS]] = rows, budget, len(stops)
    cells[0, abi.TREE_STOPS : abi.TREE_STOPS + len(stops)] = stops
    cells[0, abi.TREE_PARENTS : abi.TREE_PARENTS + rows] = parents
    cells[0, abi.TREE_DRAFT : abi.TREE_DRAFT + rows] = draft
    cells[0, abi.TREE_TARGET : abi.TREE_TARGET + rows] = target
    return cells


@pytest.mark.parametrize(("draft", "target", "stops", "budget", "expected"), CHAIN_CASES)
def test_oracle_chain_hand_cases(draft, target, stops, budget, expected) -> None:
    code = int(oracle.chain(chain_cells(draft, target, stops, budget))[0])
    assert (code >> 1, bool(code & 1)) == expected


@pytest.mark.parametrize(("parents", "draft", "target", "stops", "budget", "expected"), TREE_CASES)
def test_oracle_tree_hand_cases(parents, draft, target, stops, budget, expected) -> None:
    codes, paths = oracle.tree(tree_cells(parents, draft, target, stops, budget))
    rows, count, ends = expected
    assert (int(codes[0]) >> 1, bool(codes[0] & 1)) == (count, ends)
    assert int(paths[0]) == sum(r << (4 * i) for i, r in enumerate(rows))


@pytest.mark.parametrize(("parents", "expected"), MASK_CASES)
def test_oracle_masks_hand_cases(parents, expected) -> None:
    cells = np.full((1, abi.MASKS_CELLS), 7, dtype=np.int64)
    cells[0, 0] = len(parents)
    cells[0, 1 : 1 + len(parents)] = parents
    depth, ancestors = oracle.masks(cells)
    n = len(parents)
    assert (tuple(depth[0, :n].tolist()), tuple(ancestors[0, :n].tolist())) == expected
    assert not depth[0, n:].any() and not ancestors[0, n:].any()


def test_oracle_refuses_inputs_outside_the_domain() -> None:
    bad_budget = chain_cells([1], [1, 2], [], 1)
    bad_budget[0, abi.CHAIN_BUDGET] = 0
    with pytest.raises(ValueError, match="budget"):
        oracle.chain(bad_budget)
    bad_parent = tree_cells([-1, 1], [0, 1], [1, 2], [], 5)
    with pytest.raises(ValueError, match="parent"):
        oracle.tree(bad_parent)


# --- the table's coverage ---------------------------------------------------------------------------


def _all_cells(name: str) -> np.ndarray:
    section = next(s for s in table.SECTIONS if s.name == name)
    cells = np.concatenate(list(section.blocks()))
    assert len(cells) == section.rows
    return cells


def test_chain_patterns_cover_every_pattern_and_budget_class_for_k_up_to_7() -> None:
    cells = _all_cells("chain_patterns")
    k = cells[:, abi.CHAIN_K]
    for kk in range(8):
        rows = cells[k == kk]
        target = rows[:, abi.CHAIN_TARGET : abi.CHAIN_TARGET + kk + 1]
        draft = rows[:, abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + kk]
        stops = rows[:, abi.CHAIN_STOPS : abi.CHAIN_STOPS + 1]
        is_stop = target == stops
        matches = draft == target[:, :kk]
        signature = (is_stop.astype(np.int64) << (2 * np.arange(kk + 1))).sum(axis=1)
        signature += (matches.astype(np.int64) << (2 * np.arange(kk) + 1)).sum(axis=1)
        budget = rows[:, abi.CHAIN_BUDGET]
        classes = np.minimum(budget, kk + 2)  # budgets >= k + 2 never cap
        combos = set(zip(signature.tolist(), classes.tolist(), strict=True))
        assert len(combos) == 2 ** (2 * kk + 1) * (kk + 2)
        assert abi.BUDGET_MAX in set(budget.tolist())


def test_chain_stop_slots_cover_every_slot_class() -> None:
    cells = _all_cells("chain_stop_slots")
    ns = cells[:, abi.CHAIN_NSTOPS]
    slots = cells[:, abi.CHAIN_STOPS : abi.CHAIN_STOPS + abi.MAX_STOPS]
    hit = (slots == table.STOP_ID) & (np.arange(abi.MAX_STOPS)[None, :] < ns[:, None])
    where = [
        int(j) if any_hit else None for j, any_hit in zip(hit.argmax(axis=1), hit.any(axis=1), strict=True)
    ]
    assert set(zip(ns.tolist(), where, strict=True)) == set(table.STOP_CLASSES)
    for k in range(5):  # every stop class meets every pattern and budget class of every k <= 4
        assert (cells[:, abi.CHAIN_K] == k).sum() == 2 ** (2 * k + 1) * (k + 3) * len(table.STOP_CLASSES)


def test_tree8_covers_every_shape_and_every_match_mask() -> None:
    cells = _all_cells("tree8")
    parents = cells[:, abi.TREE_PARENTS : abi.TREE_PARENTS + 8]
    draft = cells[:, abi.TREE_DRAFT : abi.TREE_DRAFT + 8]
    target = cells[:, abi.TREE_TARGET : abi.TREE_TARGET + 8]
    shape_id = (parents[:, 1:] * (8 ** np.arange(7))).sum(axis=1)
    parent_target = np.take_along_axis(target, np.maximum(parents, 0), axis=1)
    mask = ((draft[:, 1:] == parent_target[:, 1:]).astype(np.int64) << np.arange(7)).sum(axis=1)
    unbounded = cells[:, abi.TREE_BUDGET] == abi.BUDGET_MAX
    assert len(set(shape_id.tolist())) == 5040
    pairs = set(zip(shape_id[unbounded].tolist(), mask[unbounded].tolist(), strict=True))
    assert len(pairs) == 5040 * 128
    assert set(cells[:, abi.TREE_BUDGET].tolist()) == {*range(1, 9), abi.BUDGET_MAX}
    # every row's target is a stop somewhere, with 1 and with 4 stop slots
    stop_rows = cells[cells[:, abi.TREE_NSTOPS] > 0]
    assert {int(n) for n in stop_rows[:, abi.TREE_NSTOPS]} == {1, 4}


def test_random_sections_span_the_domain_and_fill_unused_slots_with_garbage() -> None:
    chain = _all_cells("chain_random")
    assert set(chain[:, abi.CHAIN_K].tolist()) == set(range(16))
    assert set(chain[:, abi.CHAIN_NSTOPS].tolist()) == set(range(5))
    assert chain[:, abi.CHAIN_BUDGET].min() == 1 and chain[:, abi.CHAIN_BUDGET].max() == abi.BUDGET_MAX
    k = chain[:, abi.CHAIN_K]
    unused_draft = chain[:, abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + 15][np.arange(15)[None, :] >= k[:, None]]
    assert (unused_draft < 0).mean() > 0.4  # int64 garbage, not ids
    tree = _all_cells("tree_random")
    assert set(tree[:, abi.TREE_ROWS].tolist()) == set(range(1, 17))
    codes, _ = oracle.tree(tree)
    counts = codes.astype(np.int64) >> 1
    assert counts.max() >= 12  # deep accepted paths occur
    assert set(oracle.chain(chain).astype(np.int64) >> 1) == set(range(1, 17))


def test_tables_are_deterministic() -> None:
    for section in table.SECTIONS:
        first = next(iter(section.blocks()))
        again = next(iter(section.blocks()))
        assert np.array_equal(first, again), section.name


# --- the file ---------------------------------------------------------------------------------------


def _tiny_table(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table file written from the oracle alone (library stubbed to agree): format tests only."""
    monkeypatch.setattr(
        tablefile, "library_outputs", lambda ffi, lib, kind, cells: tablefile.oracle_outputs(kind, cells)
    )
    tablefile.write_checked(path, None, None)


@pytest.fixture(scope="module")
def table_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("table") / "table.bin"
    with pytest.MonkeyPatch.context() as mp:
        _tiny_table(path, mp)
    return path.read_bytes()


def test_table_file_round_trips_and_matches_the_pinned_hash(table_bytes: bytes, tmp_path: Path) -> None:
    import hashlib

    from elpis.accept import loader

    assert hashlib.sha256(table_bytes).hexdigest() == loader.TABLE_SHA256
    path = tmp_path / "t.bin"
    path.write_bytes(table_bytes)
    arrays = tablefile.read(path)
    assert sum(arrays[s.name, "codes"].shape[0] for s in table.SECTIONS) == tablefile.total_decisions()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"X" + b[1:], "bad magic"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b + b"\0", "trailing bytes"),
        (lambda b: b.replace(b'"chain_random"', b'"chain_randoM"', 1), "header"),
    ],
)
def test_table_file_damage_is_refused(table_bytes: bytes, tmp_path: Path, damage, message: str) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(damage(table_bytes))
    with pytest.raises(tablefile.TableMismatch, match=message):
        tablefile.read(path)


def test_header_length_field_is_checked(table_bytes: bytes, tmp_path: Path) -> None:
    at = len(table.MAGIC)
    (length,) = struct.unpack_from("<Q", table_bytes, at)
    damaged = table_bytes[:at] + struct.pack("<Q", length - 1) + table_bytes[at + 8 :]
    path = tmp_path / "t.bin"
    path.write_bytes(damaged)
    with pytest.raises(tablefile.TableMismatch):
        tablefile.read(path)
