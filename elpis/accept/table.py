"""The reference table: which decisions it holds, how it is stored, and how a library is run over it.

The table's inputs are stored compactly as section descriptors (what each section enumerates, and the
seed of the random ones); `SECTIONS` turns them back into packed int64 cells block by block, so neither
the build nor admission ever holds more than one block (<= 8,192 decisions) in memory. The expected
outputs are stored in full. The build fills them from the oracle (`elpis.accept.oracle`) and requires
the compiled library to reproduce them byte for byte; admission re-runs the stored table through the
loaded library. The file's SHA-256 is pinned in `elpis.accept.loader.TABLE_SHA256`.

Sections (all inside the proved domain):
  chain_patterns   every chain pattern for k = 0..7: at each position the target is a stop or not and
                   the draft matches or not (2^(2k+1) patterns), every budget class (1..k+2 and the
                   maximum), one stop in slot 0 of one.
  chain_stop_slots every pattern for k = 0..4 and every budget class, with every stop-slot class: no
                   stops, or 1..4 stops with the hit in each slot.
  chain_random     seeded random decisions, k = 0..15, 32-bit ids, random stops and budgets.
  tree8            every 8-row parent array (all 5,040) with every match mask (128) at an unbounded
                   budget, the budget classes 1..8 on two masks, and a stop on each row (1 or 4 slots).
  tree_random      seeded random trees with 1..16 rows.
  masks8, masks_random  tree_masks over every 8-row parent array and seeded random trees.
Unused cells of the random sections hold random int64 garbage, so a glue that read them would fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import product
from typing import Any

import numpy as np

from elpis.accept import abi

TABLE_SCHEMA = "elpis-accept-table/1"
MAGIC = b"ELPIS-ACCEPT-TABLE\n"
BLOCK = 8192  # small enough that a block of cells stays in cache

# --- fixed ids for the exhaustive sections (edges included: 0 and 2^32 - 1) ---------------------------
STOP_ID = abi.ID_MAX
# Target at chain position i when it is not a stop; the draft when it mismatches; unused stop slots.
CHAIN_PLAIN = tuple([0] + [(0x9E3779B9 * i) & 0xFFFFFFFE for i in range(1, abi.MAX_ROWS)])
CHAIN_OTHER = tuple((v ^ 0x5BD1E995) | 1 for v in CHAIN_PLAIN)
STOP_FILLER = (0x7FFFFFF0, 0x7FFFFFF1, 0x7FFFFFF2, 0x7FFFFFF3)
# Target of tree row r (distinct); a non-matching draft of row r is its own target (a tempting mistake).
TREE_TARGET = (abi.ID_MAX, 0, 7, 100_003, 2**31, 65_536, 12_345, abi.ID_MAX - 1)
assert len({*CHAIN_PLAIN, *CHAIN_OTHER, *STOP_FILLER, STOP_ID}) == 2 * abi.MAX_ROWS + 5
assert len(set(TREE_TARGET) | set(STOP_FILLER)) == 12

# (stop count, slot holding the stop id or None)
STOP_CLASSES = ((0, None), *((ns, j) for ns in range(1, abi.MAX_STOPS + 1) for j in range(ns)))

CHAIN_SEED, TREE_SEED, MASKS_SEED = 0xE1715_0001, 0xE1715_0002, 0xE1715_0003
CHAIN_RANDOM, TREE_RANDOM, MASKS_RANDOM = 65_536, 65_536, 16_384


# One block: how many decisions it holds, and how to make its cells on demand.
Block = tuple[int, Callable[[], np.ndarray]]


@dataclass(frozen=True)
class Section:
    name: str
    kind: str  # "chain" | "tree" | "masks"
    rows: int
    params: dict[str, Any]
    parts: Callable[[], list[Block]]  # the section's blocks, in order, each made independently

    def blocks(self) -> Iterator[np.ndarray]:
        for _, make in self.parts():
            yield make()


def _cells(n: int, width: int) -> np.ndarray:
    return np.zeros((n, width), dtype=np.int64)


# --- chain ------------------------------------------------------------------------------------------


def _chain_budgets(k: int) -> list[int]:
    return [*range(1, k + 3), abi.BUDGET_MAX]


def _chain_pattern_block(k: int, stop_class: tuple[int, int | None], lo: int, hi: int) -> np.ndarray:
    """Decisions lo..hi of the (budget class, pattern) enumeration for one k and one stop class."""
    n_patterns = 2 ** (2 * k + 1)
    index = np.arange(lo, hi, dtype=np.int64)
    budget = np.asarray(_chain_budgets(k), dtype=np.int64)[index // n_patterns]
    x = index % n_patterns
    cells = _cells(len(x), abi.CHAIN_CELLS)
    ns, hit = stop_class
    cells[:, abi.CHAIN_K] = k
    cells[:, abi.CHAIN_BUDGET] = budget
    cells[:, abi.CHAIN_NSTOPS] = ns
    for j in range(ns):
        cells[:, abi.CHAIN_STOPS + j] = STOP_ID if j == hit else STOP_FILLER[j]
    for i in range(k + 1):
        is_stop = (x >> (2 * i)) & 1 == 1
        target = np.where(is_stop, STOP_ID, CHAIN_PLAIN[i])
        cells[:, abi.CHAIN_TARGET + i] = target
        if i < k:
            mismatch = (x >> (2 * i + 1)) & 1 == 1
            cells[:, abi.CHAIN_DRAFT + i] = np.where(mismatch, CHAIN_OTHER[i], target)
    return cells


def _chain_pattern_blocks(ks: range, classes: tuple) -> Callable[[], list[Block]]:
    def parts() -> list[Block]:
        out = []
        for k in ks:
            total = 2 ** (2 * k + 1) * len(_chain_budgets(k))
            for stop_class in classes:
                for lo in range(0, total, BLOCK):
                    hi = min(total, lo + BLOCK)
                    out.append((hi - lo, partial(_chain_pattern_block, k, stop_class, lo, hi)))
        return out

    return parts


def _chain_pattern_rows(ks: range, classes: tuple) -> int:
    return sum(2 ** (2 * k + 1) * len(_chain_budgets(k)) * len(classes) for k in ks)


class _Bits:
    """Seeded random 64-bit words for rows first..first+n of a random section.

    Raw PCG64 output (numpy keeps bit-generator streams stable across releases; the numpy version is
    pinned and recorded in the identity anyway), turned into ids, floats and choices by integer
    arithmetic, so no Generator method's sampling algorithm is involved.
    """

    def __init__(self, seed: int, first: int, n: int) -> None:
        self.generator = np.random.PCG64(np.random.SeedSequence([seed, first]))
        self.n = n

    def draw(self, width: int) -> np.ndarray:
        return self.generator.random_raw(self.n * width).reshape(self.n, width)

    def garbage(self, width: int) -> np.ndarray:
        return self.draw(width).view(np.int64)

    def ids(self, width: int) -> np.ndarray:
        """32-bit ids; one in 32 is an edge value (0, 1, 2^31, 2^32 - 1)."""
        z = self.draw(width)
        ids = (z >> np.uint64(32)).view(np.int64)
        edge = (z & np.uint64(31)) == 0
        return np.where(edge, _EDGE_IDS[(z >> np.uint64(5)) & np.uint64(3)], ids)

    def choose(self, weights: list[float | np.ndarray], width: int) -> np.ndarray:
        """Index of the option drawn per cell, option j with probability weights[j] (the weights, which
        may be per-decision columns, sum to 1; the last option takes the rest)."""
        roll = self.draw(width) >> np.uint64(11)  # 53 random bits
        index = np.zeros(roll.shape, dtype=np.int64)
        edge = np.zeros((self.n, 1), dtype=np.float64)
        for weight in weights[:-1]:
            edge = edge + np.asarray(weight, dtype=np.float64).reshape(-1, 1)
            index += roll >= (edge * 2.0**53).astype(np.uint64)
        return index

    def below(self, limit: np.ndarray | int, width: int = 1) -> np.ndarray:
        """Uniform integers in [0, limit) for limit < 2^32 (limit broadcast against (n, width))."""
        high = self.draw(width) >> np.uint64(32)
        return ((high * np.asarray(limit).astype(np.uint64)) >> np.uint64(32)).view(np.int64)

    def pick(self, choices: list[float]) -> np.ndarray:
        return np.asarray(choices)[self.below(len(choices))[:, 0]]


_EDGE_IDS = np.asarray([0, 1, 2**31, abi.ID_MAX], dtype=np.int64)


def _budgets(bits: _Bits, small_limit: np.ndarray) -> np.ndarray:
    """Half small (where caps bite), a quarter anywhere in the domain, a quarter at the top edge."""
    kind = bits.below(4)[:, 0]
    small = 1 + bits.below(small_limit[:, None])[:, 0]
    anywhere = np.minimum(1 + (bits.draw(1)[:, 0] >> np.uint64(16)).view(np.int64), abi.BUDGET_MAX)
    top = abi.BUDGET_MAX - bits.below(3)[:, 0]
    return np.choose(kind, [small, small, anywhere, top])


def random_chain_block(seed: int, first: int, n: int) -> np.ndarray:
    bits = _Bits(seed, first, n)
    cells = bits.garbage(abi.CHAIN_CELLS)
    pos = np.arange(abi.MAX_ROWS)[None, :]
    k = bits.below(abi.MAX_DRAFT + 1)[:, 0]
    target = bits.ids(abi.MAX_ROWS)
    # Drafts match with a per-decision probability; misses are either the next target (an off-by-one
    # temptation) or fresh ids.
    p_match = bits.pick([0.5, 0.8, 0.95, 1.0])
    how = bits.choose([p_match, (1 - p_match) / 3, 2 * (1 - p_match) / 3], abi.MAX_DRAFT)
    draft = np.choose(how, [target[:, : abi.MAX_DRAFT], target[:, 1:], bits.ids(abi.MAX_DRAFT)])
    nstops = bits.below(abi.MAX_STOPS + 1)[:, 0]
    copy_from = bits.below(k[:, None] + 1, abi.MAX_STOPS)
    from_target = np.take_along_axis(target, copy_from, axis=1)
    from_draft = np.take_along_axis(draft, np.minimum(copy_from, abi.MAX_DRAFT - 1), axis=1)
    how = bits.choose([0.4, 0.1, 0.5], abi.MAX_STOPS)
    stops = np.choose(how, [from_target, from_draft, bits.ids(abi.MAX_STOPS)])
    budget = _budgets(bits, k + 3)

    cells[:, abi.CHAIN_K] = k
    cells[:, abi.CHAIN_BUDGET] = budget
    cells[:, abi.CHAIN_NSTOPS] = nstops
    _keep(cells, abi.CHAIN_STOPS, stops, np.arange(abi.MAX_STOPS)[None, :] < nstops[:, None])
    _keep(cells, abi.CHAIN_DRAFT, draft, pos[:, : abi.MAX_DRAFT] < k[:, None])
    _keep(cells, abi.CHAIN_TARGET, target, pos <= k[:, None])
    return cells


def _keep(cells: np.ndarray, start: int, values: np.ndarray, used: np.ndarray) -> None:
    """Write values into the used slots, leave the garbage in the others."""
    width = values.shape[1]
    region = cells[:, start : start + width]
    np.copyto(region, values, where=used)


# --- trees ------------------------------------------------------------------------------------------


def shapes8() -> np.ndarray:
    """All 5,040 legal 8-row parent arrays, lexicographic in (parents[1], ..., parents[7])."""
    rows = np.asarray(list(product(*(range(r) for r in range(1, 8)))), dtype=np.int64)
    return np.concatenate([np.full((len(rows), 1), -1, dtype=np.int64), rows], axis=1)


# Per 8-row shape: (match mask, budget, stop count, stop slots), in this order.
def _tree8_variants() -> list[tuple[int, int, int, tuple[int, ...]]]:
    variants = [(mask, abi.BUDGET_MAX, 0, ()) for mask in range(128)]
    variants += [(-1, budget, 0, ()) for budget in range(1, 9)]  # -1: the shape's alternative mask
    variants += [(127, budget, 0, ()) for budget in range(1, 9)]
    for row in range(8):
        variants.append((127, abi.BUDGET_MAX, 1, (TREE_TARGET[row],)))
        variants.append((127, abi.BUDGET_MAX, 4, (*STOP_FILLER[:3], TREE_TARGET[row])))
    return variants


TREE8_VARIANTS = _tree8_variants()
TREE8_SHAPES_PER_BLOCK = 48


def _tree8_block(first: int, shapes: np.ndarray) -> np.ndarray:
    variants = TREE8_VARIANTS
    n_shapes, n_var = len(shapes), len(variants)
    n = n_shapes * n_var
    cells = _cells(n, abi.TREE_CELLS)
    shape_index = np.repeat(np.arange(first, first + n_shapes), n_var)
    parents = np.repeat(shapes, n_var, axis=0)
    mask = np.tile(np.asarray([v[0] for v in variants], dtype=np.int64), n_shapes)
    alternative = (shape_index * 37 + 11) % 128
    mask = np.where(mask < 0, alternative, mask)
    cells[:, abi.TREE_ROWS] = 8
    cells[:, abi.TREE_BUDGET] = np.tile([v[1] for v in variants], n_shapes)
    cells[:, abi.TREE_NSTOPS] = np.tile([v[2] for v in variants], n_shapes)
    stop_slots = np.zeros((n_var, abi.MAX_STOPS), dtype=np.int64)
    for i, v in enumerate(variants):
        stop_slots[i, : len(v[3])] = v[3]
    cells[:, abi.TREE_STOPS : abi.TREE_STOPS + abi.MAX_STOPS] = np.tile(stop_slots, (n_shapes, 1))
    targets = np.asarray(TREE_TARGET, dtype=np.int64)
    cells[:, abi.TREE_PARENTS : abi.TREE_PARENTS + 8] = parents
    cells[:, abi.TREE_TARGET : abi.TREE_TARGET + 8] = targets
    cells[:, abi.TREE_DRAFT] = targets[0]
    for r in range(1, 8):
        matches = (mask >> (r - 1)) & 1 == 1
        cells[:, abi.TREE_DRAFT + r] = np.where(matches, targets[parents[:, r]], targets[r])
    return cells


def _tree8_blocks() -> list[Block]:
    shapes = shapes8()
    blocks = []
    for first in range(0, len(shapes), TREE8_SHAPES_PER_BLOCK):
        chunk = shapes[first : first + TREE8_SHAPES_PER_BLOCK]
        blocks.append((len(chunk) * len(TREE8_VARIANTS), partial(_tree8_block, first, chunk)))
    return blocks


def _random_parents(bits: _Bits) -> np.ndarray:
    """Random legal parents for 16 rows; per decision a chance of chain-like links (deep paths)."""
    n = bits.n
    pos = np.arange(abi.MAX_ROWS)
    chainy = bits.pick([0.0, 0.5, 0.9])
    anywhere = bits.below(pos[None, :], abi.MAX_ROWS)
    parents = np.where(bits.choose([chainy, 1 - chainy], abi.MAX_ROWS) == 0, pos[None, :] - 1, anywhere)
    parents[:, 0] = -1
    assert parents.shape == (n, abi.MAX_ROWS)
    return parents


def random_tree_block(seed: int, first: int, n: int) -> np.ndarray:
    bits = _Bits(seed, first, n)
    cells = bits.garbage(abi.TREE_CELLS)
    pos = np.arange(abi.MAX_ROWS)[None, :]
    rows = 1 + bits.below(abi.MAX_ROWS)[:, 0]
    parents = _random_parents(bits)
    target = bits.ids(abi.MAX_ROWS)
    # Sometimes a row repeats an earlier row's target, so equal ids show up off the parent link too.
    earlier = np.take_along_axis(target, bits.below(pos, abi.MAX_ROWS), axis=1)
    target = np.where(bits.choose([0.15, 0.85], abi.MAX_ROWS) == 0, earlier, target)
    parent_target = np.take_along_axis(target, np.maximum(parents, 0), axis=1)
    other = np.take_along_axis(target, bits.below(rows[:, None], abi.MAX_ROWS), axis=1)
    # A row's draft matches its parent's target with a per-decision probability; misses are its own
    # target (a tempting mistake), another row's target, or a fresh id.
    p_match = bits.pick([0.3, 0.7, 0.95])
    miss = (1 - p_match) / 3
    how = bits.choose([p_match, miss, miss, miss], abi.MAX_ROWS)
    draft = np.choose(how, [parent_target, target, other, bits.ids(abi.MAX_ROWS)])
    nstops = bits.below(abi.MAX_STOPS + 1)[:, 0]
    from_target = np.take_along_axis(target, bits.below(rows[:, None], abi.MAX_STOPS), axis=1)
    stops = np.where(bits.choose([0.5, 0.5], abi.MAX_STOPS) == 0, from_target, bits.ids(abi.MAX_STOPS))
    budget = _budgets(bits, rows + 2)

    used = pos < rows[:, None]
    cells[:, abi.TREE_ROWS] = rows
    cells[:, abi.TREE_BUDGET] = budget
    cells[:, abi.TREE_NSTOPS] = nstops
    _keep(cells, abi.TREE_STOPS, stops, np.arange(abi.MAX_STOPS)[None, :] < nstops[:, None])
    _keep(cells, abi.TREE_PARENTS, parents, used)
    _keep(cells, abi.TREE_DRAFT, draft, used)
    _keep(cells, abi.TREE_TARGET, target, used)
    return cells


def _masks8_block() -> np.ndarray:
    shapes = shapes8()
    cells = _cells(len(shapes), abi.MASKS_CELLS)
    cells[:, abi.MASKS_ROWS] = 8
    cells[:, abi.MASKS_PARENTS : abi.MASKS_PARENTS + 8] = shapes
    return cells


def _masks8_blocks() -> list[Block]:
    return [(5040, _masks8_block)]


def random_masks_block(seed: int, first: int, n: int) -> np.ndarray:
    bits = _Bits(seed, first, n)
    cells = bits.garbage(abi.MASKS_CELLS)
    rows = 1 + bits.below(abi.MAX_ROWS)[:, 0]
    cells[:, abi.MASKS_ROWS] = rows
    _keep(cells, abi.MASKS_PARENTS, _random_parents(bits), np.arange(abi.MAX_ROWS)[None, :] < rows[:, None])
    return cells


def _seeded(make: Callable[[int, int, int], np.ndarray], seed: int, total: int) -> Callable[[], list[Block]]:
    def parts() -> list[Block]:
        sizes = [(first, min(BLOCK, total - first)) for first in range(0, total, BLOCK)]
        return [(n, partial(make, seed, first, n)) for first, n in sizes]

    return parts


SECTIONS: tuple[Section, ...] = (
    Section(
        "chain_patterns",
        "chain",
        _chain_pattern_rows(range(8), ((1, 0),)),
        {"k": [0, 7], "stop_classes": [[1, 0]], "budgets": "1..k+2 and max"},
        _chain_pattern_blocks(range(8), ((1, 0),)),
    ),
    Section(
        "chain_stop_slots",
        "chain",
        _chain_pattern_rows(range(5), STOP_CLASSES),
        {"k": [0, 4], "stop_classes": [list(c) for c in STOP_CLASSES], "budgets": "1..k+2 and max"},
        _chain_pattern_blocks(range(5), STOP_CLASSES),
    ),
    Section(
        "chain_random",
        "chain",
        CHAIN_RANDOM,
        {"seed": CHAIN_SEED},
        _seeded(random_chain_block, CHAIN_SEED, CHAIN_RANDOM),
    ),
    Section(
        "tree8",
        "tree",
        5040 * len(TREE8_VARIANTS),
        {"variants_per_shape": len(TREE8_VARIANTS)},
        _tree8_blocks,
    ),
    Section(
        "tree_random",
        "tree",
        TREE_RANDOM,
        {"seed": TREE_SEED},
        _seeded(random_tree_block, TREE_SEED, TREE_RANDOM),
    ),
    Section("masks8", "masks", 5040, {}, _masks8_blocks),
    Section(
        "masks_random",
        "masks",
        MASKS_RANDOM,
        {"seed": MASKS_SEED},
        _seeded(random_masks_block, MASKS_SEED, MASKS_RANDOM),
    ),
)
