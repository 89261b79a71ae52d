"""Paired, stratified block bootstrap over documents.

Positions of a document are cut into contiguous blocks of `block` positions (the last block of a
document may be shorter); a block never spans two documents, so the correlation between neighbouring
positions stays inside a block. A replicate draws, within each stratum (a group of documents such as
"wikitext" or "gsm8k"), as many blocks as the stratum has, uniformly with replacement. "Paired" means
the same drawn positions are used for every arm, so the arms are compared on identical text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from elpis.gate.metrics import nearest_rank


@dataclass(frozen=True)
class BlockPlan:
    """Blocks of position indices (into the concatenation of all documents) and their strata."""

    blocks: tuple[np.ndarray, ...]
    strata: tuple[str, ...]
    total: int  # positions over all documents

    def by_stratum(self) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(self.strata):
            groups.setdefault(name, []).append(i)
        return dict(sorted(groups.items()))


def plan_blocks(doc_lengths: Sequence[int], doc_strata: Sequence[str], block: int) -> BlockPlan:
    """Cut each document (given by its number of positions, in concatenation order) into blocks."""
    if block < 1:
        raise ValueError(f"block length must be at least 1, got {block}")
    if len(doc_lengths) != len(doc_strata):
        raise ValueError("one stratum per document is required")
    blocks: list[np.ndarray] = []
    strata: list[str] = []
    offset = 0
    for length, stratum in zip(doc_lengths, doc_strata, strict=True):
        if length < 0:
            raise ValueError(f"negative document length {length}")
        for start in range(0, length, block):
            blocks.append(np.arange(offset + start, offset + min(start + block, length), dtype=np.int64))
            strata.append(stratum)
        offset += length
    if not blocks:
        raise ValueError("no positions to resample")
    return BlockPlan(blocks=tuple(blocks), strata=tuple(strata), total=offset)


def replicate_indices(plan: BlockPlan, replicates: int, seed: int) -> Iterator[np.ndarray]:
    """Position indices of each replicate, deterministic for a seed."""
    if replicates < 1:
        raise ValueError(f"replicates must be at least 1, got {replicates}")
    rng = np.random.default_rng(seed)
    groups = [np.asarray(members) for members in plan.by_stratum().values()]
    for _ in range(replicates):
        chosen: list[np.ndarray] = []
        for members in groups:
            picks = members[rng.integers(0, members.size, size=members.size)]
            chosen.extend(plan.blocks[i] for i in picks)
        yield np.concatenate(chosen)


def bootstrap(
    statistic: Callable[[np.ndarray], np.ndarray | Sequence[float] | float],
    plan: BlockPlan,
    replicates: int,
    seed: int,
) -> np.ndarray:
    """Evaluate `statistic(position_indices)` on every replicate: float64 `[replicates, k]`."""
    rows = [
        np.atleast_1d(np.asarray(statistic(idx), dtype=np.float64))
        for idx in replicate_indices(plan, replicates, seed)
    ]
    return np.stack(rows)


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """Two-sided nearest-rank percentile interval of bootstrap samples (e.g. 0.90 -> 5th..95th)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} outside (0, 1)")
    tail = (1.0 - confidence) / 2.0
    return nearest_rank(samples, tail), nearest_rank(samples, 1.0 - tail)
