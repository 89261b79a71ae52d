"""The CPU side of tree verify on the exl3 engine (`elpis.exl3.tree_verify`): parent and path checks, the
padded 16-row layout and its masks, the K/V compaction plan, and the tree-mode switch's refusals."""

from __future__ import annotations

import random

import pytest

from elpis.exl3 import tree_verify as tv
from elpis.exl3.backend import check_tree_mode
from tests.kernels.tree_cases import random_parents, random_path


def masks_by_walk(parents: list[int]) -> tuple[list[int], list[int]]:
    """Depth and ancestor bitmasks computed here by walking parent links (independent of the acceptor)."""
    depth, ancestors = [], []
    for r in range(len(parents)):
        d, mask, j = 0, 0, r
        while j >= 0:
            mask |= 1 << j
            j = parents[j]
            d += 1
        depth.append(d - 1)
        ancestors.append(mask)
    return depth, ancestors


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 12, 16])
def test_layout_pads_with_root_leaves_and_takes_proven_masks(rows):
    rng = random.Random(rows)
    parents = random_parents(rows, rng)
    layout = tv.layout_tree(parents)
    assert (layout.rows, layout.run) == (rows, tv.TREE_ROWS)
    assert layout.parents == tuple(parents) + (0,) * (tv.TREE_ROWS - rows)
    depth, ancestors = masks_by_walk(list(layout.parents))
    assert layout.depth == tuple(depth) and layout.ancestors == tuple(ancestors)
    # no real row has a padding row among its ancestors: padding cannot reach real rows
    for r in range(rows):
        assert layout.ancestors[r] >> rows == 0
    assert layout.position_ids(1000) == [1000 + d for d in depth]


def test_layout_of_a_chain_is_sequential_positions():
    layout = tv.layout_tree(list(range(-1, 7)))
    assert layout.position_ids(50)[:8] == list(range(50, 58))
    assert layout.position_ids(50)[8:] == [51] * 8


def test_layout_refuses_a_run_shorter_than_the_tree():
    with pytest.raises(ValueError, match="cannot run as 3 rows"):
        tv.layout_tree([-1, 0, 1, 2], run=3)


@pytest.mark.parametrize(
    ("parents", "rows", "message"),
    [
        ([0, 0], 2, "not a tree"),
        ([-1, 1], 2, "row 1 has parent 1"),
        ([-1, 0, 3], 3, "row 2 has parent 3"),
        ([-1], 2, "2 tokens but 1 parents"),
        ([], 0, "1..16"),
        (list(range(-1, 16)), 17, "1..16"),
        ([-1, True], 2, "not an int"),
        ([-1, 0.0], 2, "not an int"),
    ],
)
def test_bad_parents_are_refused(parents, rows, message):
    with pytest.raises(ValueError, match=message):
        tv.check_parents(parents, rows)


def test_every_root_first_path_is_a_valid_commit():
    rng = random.Random(7)
    for _ in range(200):
        rows = rng.randint(1, 16)
        parents = random_parents(rows, rng)
        path = random_path(parents, rng)
        for n in range(1, len(path) + 1):
            assert tv.check_path(path[:n], parents, rows) == path[:n]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ([], "at least row 0"),
        ([1], "start at row 0"),
        ([0, 2], "not a root-first path: row 2's parent is 1"),
        ([0, 1, 3], "row 3's parent is 0"),
        ([0, 4], "not one of the 4 verified rows"),  # a padding row is never committed
        ([0, -1], "not one of the 4 verified rows"),
        ([0, True], "not one of the 4 verified rows"),
    ],
)
def test_bad_commit_paths_are_refused(path, message):
    parents = [-1, 0, 1, 0] + [0] * 12  # the padded layout of [-1, 0, 1, 0]
    with pytest.raises(ValueError, match=message):
        tv.check_path(path, parents, 4)


def test_numpy_ints_are_row_numbers():
    import numpy as np

    assert tv.check_parents([np.int64(-1), np.int32(0)], 2) == [-1, 0]
    assert tv.check_path([np.int64(0), np.int64(1)], [-1, 0], 2) == [0, 1]


def test_kv_moves_skip_rows_already_in_place():
    assert tv.kv_moves(100, [0, 1, 2]) == []
    assert tv.kv_moves(100, [0, 3]) == [(103, 101)]
    assert tv.kv_moves(7, [0, 1, 5, 9]) == [(12, 9), (16, 10)]


def test_kv_moves_are_safe_in_place_for_every_path():
    """Applying the moves in order on a toy slot array gives what a gather-then-scatter gives: no source is
    overwritten before it is read."""
    rng = random.Random(3)
    for _ in range(300):
        rows = rng.randint(1, 16)
        parents = random_parents(rows, rng)
        path = random_path(parents, rng)
        kvp = rng.randrange(1000)
        slots = list(range(kvp + 16))
        for src, dst in tv.kv_moves(kvp, path):
            assert src > dst
            slots[dst] = slots[src]
        assert slots[kvp : kvp + len(path)] == [kvp + r for r in path]
        assert slots[:kvp] == list(range(kvp))


def test_slot_pages_maps_through_the_page_list():
    assert tv.slot_pages([0, 255, 256, 511, 300], [7, 9]) == ([7, 7, 9, 9, 9], [0, 255, 0, 255, 44])
    with pytest.raises(ValueError, match="outside the sequence's 2 pages"):
        tv.slot_pages([512], [7, 9])


def test_tree_mode_refuses_fp16_gdn_state_and_other_row_counts():
    import torch

    for run in tv.TREE_RUNS:
        check_tree_mode({torch.float32}, run)
    with pytest.raises(ValueError, match="fp32"):
        check_tree_mode({torch.float16}, 16)
    with pytest.raises(ValueError, match="fp32"):
        check_tree_mode(set(), 16)  # a model without GDN layers is not what the kernels are for
    for rows in (None, 1, 7, 9, 12, 17):
        with pytest.raises(ValueError, match=r"one of \(8, 16\) rows"):
            check_tree_mode({torch.float32}, rows)


def test_tree_run_is_the_smallest_shape_holding_the_budget():
    assert [tv.tree_run(b) for b in range(1, 17)] == [8] * 8 + [16] * 8
    with pytest.raises(ValueError, match="over the kernels' 16 rows"):
        tv.tree_run(17)
    layout = tv.layout_tree([-1, 0, 0, 1], run=tv.tree_run(4))
    assert layout.run == 8 and layout.parents == (-1, 0, 0, 1, 0, 0, 0, 0)


def test_load_backend_tree_needs_fp32_state(monkeypatch):
    import torch

    from elpis.exl3 import load_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="gdn_state_fp32"):
        load_backend("/nonexistent", None, tree=True, gdn_state_fp32=False)


def test_tree_mode_refused_when_its_patch_is_off(monkeypatch):
    import torch

    from elpis.exl3 import load_backend, patches

    assert patches.enabled(tv.TREE_PATCH)  # on by default
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ELPIS_PATCH_TREE_VERIFY", "0")
    assert not patches.enabled(tv.TREE_PATCH)
    with pytest.raises(RuntimeError, match="ELPIS_PATCH_TREE_VERIFY=0"):
        load_backend("/nonexistent", None, tree=True)
    with pytest.raises(KeyError, match="no patch 'nope'"):
        patches.enabled("nope")


def test_patches_are_not_installed_by_import():
    """Importing the module changes nothing in ExLlamaV3: install() runs on the first tree verify."""
    assert not tv.installed()


def test_context_buckets_are_powers_of_two_from_4096_capped_by_the_cache():
    from elpis.exl3.tree_graph import MIN_BUCKET, context_bucket

    assert MIN_BUCKET == 4096
    assert [context_bucket(n, 270_336) for n in (1, 4096, 4097, 8192, 131_088, 262_160)] == [
        4096, 4096, 8192, 8192, 262_144, 270_336,
    ]  # fmt: skip
    for bad in (0, 270_337):
        with pytest.raises(ValueError, match="outside the 270336-token cache"):
            context_bucket(bad, 270_336)


def test_the_buckets_a_load_captures_are_every_bucket_a_verify_can_reach():
    from elpis.exl3.tree_graph import context_bucket, context_buckets

    full = [4096 << k for k in range(7)] + [270_336]
    assert context_buckets(262_160, 270_336) == full
    assert context_buckets(65_552, 270_336) == full[:6]  # 65,536 + 16 rows: the 131,072 bucket
    assert context_buckets(100, 270_336) == [4096]
    assert context_buckets(300, 2048) == [2048]  # a cache smaller than the smallest bucket
    for limit in (2048, 270_336):
        for end in (1, 1000, 2048, 5000, 70_000, 262_160):
            if end <= limit:
                reached = {context_bucket(e, limit) for e in [*range(1, end, 97), end]}
                assert reached <= set(context_buckets(end, limit))


def test_packed_plan_holds_the_kernel_plan():
    """The bytes the graph form of the GDN kernel reads: rows (int32), then order, load, store, in_row
    (int8 [16] each), src (int8 [16][4]), max_stack; the same plan `plan()` reports."""
    from elpis import accept
    from elpis.exl3 import gdn_tree

    rng = random.Random(11)
    for rows in (1, 2, 7, 16):
        parents = random_parents(rows, rng)
        masks = accept.tree_masks(parents)
        depth, ancestors = tuple(masks.depth), tuple(masks.ancestors)
        packed = gdn_tree.packed_plan(depth, ancestors)
        want = gdn_tree.plan(depth, ancestors)
        assert len(packed) <= gdn_tree.PLAN_CAPACITY
        signed = [b - 256 if b > 127 else b for b in packed]
        assert int.from_bytes(packed[:4], "little") == rows
        assert tuple(signed[4 : 4 + rows]) == want.order
        assert tuple(signed[20 : 20 + rows]) == want.load
        assert tuple(signed[36 : 36 + rows]) == want.store
        assert tuple(signed[52 : 52 + rows]) == tuple(range(rows))  # in_row: logical row r reads input r
        assert tuple(tuple(signed[68 + 4 * r : 72 + 4 * r]) for r in range(rows)) == want.src
        assert signed[132] == want.max_stack
    with pytest.raises(ValueError):
        gdn_tree.packed_plan((0, 2), (1, 3))


def test_graph_inputs_pack_into_one_int32_buffer():
    """A replay's integer inputs are one upload: the words of a packed GDN plan hold its exact bytes."""
    import torch

    from elpis.exl3 import gdn_tree
    from elpis.exl3.tree_graph import packed_sizes, packed_values, plan_words

    sizes = packed_sizes(16, 8, gdn_tree.PLAN_CAPACITY)
    assert [n for n, _ in sizes] == [16, 1, 8, 1, 16, gdn_tree.PLAN_CAPACITY // 4, 8]
    starts = [sum(p for _, p in sizes[:i]) for i in range(len(sizes))]
    assert all(start % 4 == 0 for start in starts), "every input starts 16-byte aligned (the kernels ask it)"
    with pytest.raises(ValueError, match="whole number of words"):
        packed_sizes(16, 8, 254)
    small = packed_sizes(3, 2, 16)
    assert packed_values(([1, 2, 3], [9], [9, 10], [9], [0, 1, 1, 3], [5, 6, 7, 8], [4, 2]), small) == [
        1, 2, 3, 0, 9, 0, 0, 0, 9, 10, 0, 0, 9, 0, 0, 0, 0, 1, 1, 3, 5, 6, 7, 8, 4, 2, 0, 0,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="an input of 1 words got 2"):
        packed_values(([1, 2, 3], [9, 9], [9, 10], [9], [0, 1, 1, 3], [5, 6, 7, 8], [4, 2]), small)
    with pytest.raises(ValueError, match="6 segments for 7 inputs"):
        packed_values(([1, 2, 3], [9], [9, 10], [9], [0, 1, 1, 3], [5, 6, 7, 8]), small)
    plan = bytes((37 * i + 200) % 256 for i in range(111))  # a packed plan's size; bytes past 127 too
    words = torch.tensor(plan_words(plan, 256), dtype=torch.int32)
    assert words.view(torch.uint8).tolist() == list(plan) + [0] * (256 - len(plan))
    with pytest.raises(ValueError, match="does not fit"):
        plan_words(bytes(300), 256)
