"""CPU checks of the tree-verify attention's algorithm and of the checks the GPU tests run on the kernel.

The float32 emulation (the kernel's splits, orders and combine formula) must agree with the float64
reference, and the bitwise invariance checks of `tree_cases` must pass on it, near split boundaries.
"""

from __future__ import annotations

import random

import pytest
import torch

from elpis.exl3 import tree_attention as ta
from elpis.exl3 import tree_attention_ref as ref
from tests.kernels import tree_cases as tc

FIRST = tc.FIRST_SPLIT


def emulated(q, k, v, table, ctx, depth, ancestors):
    return ref.emulate_fp32(q, k, v, table, ctx, ancestors, ta.DEFAULT_SCALE)


def test_split_sizes_match_the_bend_program() -> None:
    from elpis.bend import schedule

    text = schedule.render()
    assert text.count("#define ELPIS_SCHED_SPLIT_SIZE 2048u") == 1
    assert text.count(f"#define ELPIS_SCHED_SPLIT_MIN {FIRST}u") == 1
    assert schedule.split_bounds(FIRST + 1) == [(0, FIRST), (FIRST, FIRST + 1)]


def test_max_span_is_where_the_grid_ends() -> None:
    from elpis.bend import schedule

    f = schedule.interpreted()
    assert f["splits"](ta.MAX_SPAN) == 65535
    assert f["splits"](ta.MAX_SPAN + 1) == 65536


@pytest.mark.parametrize(
    ("ctx", "parents"),
    [(0, [-1]), (5, [-1, 0, 0, 1]), (FIRST - 3, [-1, 0, 1, 1, 2, 0]), (2 * FIRST + 1, [-1, 0, 1])],
)
def test_emulation_matches_float64(ctx: int, parents: list[int]) -> None:
    case = tc.make_case(ctx, parents, seed=ctx + len(parents))
    out, lse = case.run(emulated)
    want, want_lse = ref.reference_fp64(
        case.q, case.k, case.v, case.table, ctx, case.ancestors, ta.DEFAULT_SCALE
    )
    assert (out.double() - want).abs().max().item() < 2e-3
    assert (lse.double() - want_lse).abs().max().item() < 1e-5


def test_reference_reads_ancestors_in_depth_order() -> None:
    case = tc.make_case(3, [-1, 0, 1, 0, 3, 4], seed=1)
    assert ref.row_slots(3, case.ancestors[5]) == [0, 1, 2, 3, 3 + 3, 3 + 4, 3 + 5]
    assert ref.ancestor_rows(case.ancestors[2]) == [0, 1, 2]


# Spans that end just before, on and after the first split boundary, for every depth in the tree.
BOUNDARY_CTX = [FIRST - 6, FIRST - 1]


@pytest.mark.parametrize("ctx", BOUNDARY_CTX)
def test_invariance_checks_hold_for_the_algorithm(ctx: int) -> None:
    rng = random.Random(ctx)
    case = tc.make_case(ctx, [-1, 0, 1, 0, 2, 3], seed=ctx)
    tc.check_relabel_rows(emulated, case, rng)
    tc.check_siblings_do_not_matter(emulated, case, seed=ctx)
    tc.check_other_tree_same_path(emulated, case, rng, seed=ctx)
    tc.check_equals_plain_decoding(emulated, case)


def test_invariance_checks_can_fail() -> None:
    """A computation that mixes rows (every row's query shifted by the batch's mean) is caught."""

    def leaky(q, k, v, table, ctx, depth, ancestors):
        mixed = (q.float() + q.float().mean(dim=0, keepdim=True) * 0.5).half()
        return emulated(mixed, k, v, table, ctx, depth, ancestors)

    case = tc.make_case(4, [-1, 0, 0, 1], seed=3)
    with pytest.raises(AssertionError):
        tc.check_siblings_do_not_matter(leaky, case, seed=3)
    with pytest.raises(AssertionError):
        tc.check_equals_plain_decoding(leaky, case)


# ------------------------------------------------------------------------ binding validation (no GPU)


def test_masks_are_validated() -> None:
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        ta.check_masks((), ())
    with pytest.raises(ValueError, match=r"1\.\.16 rows"):
        ta.check_masks((0,) * 17, (1,) * 17)
    with pytest.raises(ValueError, match="row 0 must be the root"):
        ta.check_masks((1,), (1,))
    with pytest.raises(ValueError, match="only rows below it"):
        ta.check_masks((0, 1), (1, 0b101))
    with pytest.raises(ValueError, match="depth 2 but 2 rows"):
        ta.check_masks((0, 2), (1, 0b11))
    with pytest.raises(ValueError, match="ancestors has 1"):
        ta.check_masks((0, 1), (1,))
    ta.check_masks((0, 1, 1, 2), (1, 0b11, 0b101, 0b1011))


def test_tensors_must_be_on_the_gpu() -> None:
    q = torch.zeros((1, 24, 256), dtype=torch.half)
    k = torch.zeros((1, 256, 4, 256), dtype=torch.half)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ta.tree_attention(q, k, k, torch.zeros(1, dtype=torch.int32), 0, (0,), (1,))
