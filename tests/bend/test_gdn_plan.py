"""The Gated DeltaNet tree plan (bend/gdn_plan.bend): the generated header matches the Bend interpreter and a
wrong header is refused, a plan that breaks the kernel's walk is refused at build and fails its law, and
the plan, replayed independently in Python, obeys every rule of the walk on every tree of up to 7 rows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from elpis.bend import gdn_plan
from elpis.bend.check import load
from elpis.bend.interp import Interpreter
from elpis.bend.prove import prove_all
from elpis.paths import REPO_ROOT


@pytest.fixture(scope="module")
def planner() -> gdn_plan.Planner:
    return gdn_plan.Planner()


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = gdn_plan.build(tmp_path)
    assert path == tmp_path / gdn_plan.HEADER
    assert [p.name for p in tmp_path.iterdir()] == [gdn_plan.HEADER]
    assert gdn_plan.render() == path.read_text(), "generation is deterministic"
    text = path.read_text()
    assert "#define ELPIS_GDN_PLAN_SLOTS 3" in text and "#define ELPIS_GDN_PLAN_TAPS 4" in text


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "(UINT64_C(2) <= elpis_gdnp_gdn_plan_kids(",
            "(UINT64_C(3) <= elpis_gdnp_gdn_plan_kids(",
        ),  # late park
        ("visited_before(v_sx, v_x, v_s, v_c)", "visited_before(v_s, v_c, v_sx, v_x)"),  # wrong later sibs
        ("load[v] = (int32_t)from - 1;", "load[v] = (int32_t)from;"),  # the glue's slot off by one
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    text = gdn_plan.render()
    assert text.count(old) == 1, old
    bad = tmp_path / gdn_plan.HEADER
    bad.write_text(text.replace(old, new))
    with pytest.raises(gdn_plan.PlanMismatch):
        gdn_plan.check_header(bad)


def test_table_covers_small_trees_shapes_and_sixteen_rows() -> None:
    trees = gdn_plan.table_trees()
    keys = {tuple(t) for t in trees}
    for rows in range(1, 7):
        assert all(tuple(t) in keys for t in gdn_plan.every_tree(rows))
    for rows in (7, 8):
        assert all(tuple(t) in keys for t in gdn_plan.shapes(rows))
    assert [len(gdn_plan.shapes(n)) for n in range(1, 9)] == [1, 1, 2, 4, 9, 20, 48, 115]  # OEIS A000081
    assert sum(len(t) == 16 for t in trees) >= 48
    assert all(t[0] == -1 and all(0 <= p < r for r, p in enumerate(t) if r) for t in trees)


def _plan_by_hand(parents: list[int]) -> gdn_plan.Plan:
    """An independent plan: an explicit depth-first walk with a stack of parked rows (the kernel's rule)."""
    n = len(parents)
    kids = {r: [c for c in range(1, n) if parents[c] == r] for r in range(n)}
    size = [1] * n
    for r in range(n - 1, 0, -1):
        size[parents[r]] += size[r]
    order, load, store, parked = [], [], [], []
    todo, prev = [0], None
    while todo:
        r = todo.pop()
        p = parents[r] if r else None
        load.append(-1 if prev is None or p == prev else parked.index(p))
        if p is not None and all(c in order or c == r for c in kids[p]) and parked and parked[-1] == p:
            parked.pop()
        store.append(len(parked) if len(kids[r]) >= 2 else -1)
        if len(kids[r]) >= 2:
            parked.append(r)
        order.append(r)
        prev = r
        todo.extend(sorted(kids[r], key=lambda c: (size[c], c), reverse=True))
    taps = []
    for r in range(n):
        path = [r]
        while path[-1]:
            path.append(parents[path[-1]])
        path.reverse()
        d = len(path) - 1
        window = gdn_plan.WINDOW + d + 1  # + j: the committed column 4 + (d - 3 + j)
        taps.append(tuple(path[d - 3 + j] if d - 3 + j >= 0 else window + j for j in range(4)))
    return gdn_plan.Plan(tuple(order), tuple(load), tuple(store), tuple(taps), max(store) + 1)


def test_plan_is_the_depth_first_walk_on_every_tree_up_to_6_rows(planner: gdn_plan.Planner) -> None:
    for rows in range(1, 7):
        for parents in gdn_plan.every_tree(rows):
            plan = planner.plan(parents)
            assert plan == _plan_by_hand(parents), parents
            assert gdn_plan.walk_errors(parents, plan, 3) == []


def test_sixteen_row_plans_use_at_most_three_slots(planner: gdn_plan.Planner) -> None:
    needs_three = [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 10, 11, 12, 13, 14]
    plan = planner.plan(needs_three)
    assert plan.slots == 3 and plan == _plan_by_hand(needs_three)
    binary = [-1] + [(r - 1) // 2 for r in range(1, 16)]
    assert planner.plan(binary).slots <= 3


def test_replay_catches_each_broken_rule() -> None:
    parents = [-1, 0, 0, 1, 1]
    good = _plan_by_hand(parents)
    assert gdn_plan.walk_errors(parents, good, 3) == []
    wrong_start = (*good.load[:2], -1, *good.load[3:])  # a sibling starting from its brother's state
    assert any("starts from" in e for e in gdn_plan.walk_errors(parents, _with(good, load=wrong_start), 3))
    assert any("slot beyond" in e for e in gdn_plan.walk_errors(parents, good, 0))
    swapped = (good.order[1], good.order[0], *good.order[2:])
    assert any("before its parent" in e for e in gdn_plan.walk_errors(parents, _with(good, order=swapped), 3))
    chain = [-1, 0, 1, 2, 3]
    backwards = _with(_plan_by_hand(chain), taps=_plan_by_hand(chain).taps[::-1])
    assert any("taps" in e for e in gdn_plan.walk_errors(chain, backwards, 3))
    # parking the root's state over a row whose child is still to come
    tree = [-1, 0, 1, 1, 0, 4, 4, 4]  # row 1 (2 children) is walked while the root waits for row 4
    plan = _plan_by_hand(tree)
    clobber = tuple(0 if s >= 0 else -1 for s in plan.store)
    assert any("overwrites" in e for e in gdn_plan.walk_errors(tree, _with(plan, store=clobber), 3))


def _with(plan: gdn_plan.Plan, **changes) -> gdn_plan.Plan:
    fields = {f: getattr(plan, f) for f in ("order", "load", "store", "taps", "slots")}
    fields.update(changes)
    return gdn_plan.Plan(**fields)


LARGEST_FIRST = ("Bool.or(Nat.is_lt(sy, sx), Bool.and(Nat.is_eq(sy, sx), Nat.is_lt(y, x)))",
                 "Bool.or(Nat.is_lt(sx, sy), Bool.and(Nat.is_eq(sy, sx), Nat.is_lt(y, x)))")  # fmt: skip


def test_a_plan_that_breaks_the_walk_is_refused_at_build(repo_copy: Path, tmp_path: Path) -> None:
    path = repo_copy / gdn_plan.MODULE
    text = path.read_text()
    assert text.count(LARGEST_FIRST[0]) == 1
    path.write_text(text.replace(*LARGEST_FIRST))
    out = tmp_path / "kernels"
    with pytest.raises(gdn_plan.PlanMismatch, match="breaks the walk"):
        gdn_plan.build(out, repo_copy)
    assert not out.exists() or not (out / gdn_plan.HEADER).exists()


def test_a_wrong_plan_fails_its_law(repo_copy: Path) -> None:
    """The first child no longer keeps its parent's state in registers: every sibling loads a slot."""
    path = repo_copy / gdn_plan.MODULE
    text = path.read_text()
    old = "Nat.is_lt(0n, earlier_count(ps, sz, 0n, p, r, Masks.parent(sz, r)))"
    new = "Nat.is_le(0n, earlier_count(ps, sz, 0n, p, r, Masks.parent(sz, r)))"
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    report = prove_all(repo_copy, jobs=1, only={"gdn_plan_walk_is_sound"})
    assert not report.ok
    assert len(report.failures) == 1 and "gdn_plan_walk_is_sound" in report.failures[0]


def test_the_spec_replay_agrees_with_the_python_replay(planner: gdn_plan.Planner) -> None:
    """walk_ok (the law's reference, Bend) and walk_errors (the build's replay, Python) both accept the plan
    of every tree of up to 5 rows (that they reject broken plans: the law and replay tests above)."""
    spec = Interpreter(load(REPO_ROOT, [REPO_ROOT / "bend/gdn_plan_spec.bend"]))
    walk_ok = spec.function("bend/gdn_plan_spec.bend::walk_ok")
    for parents in itertools.chain.from_iterable(gdn_plan.every_tree(r) for r in range(1, 6)):
        ps = tuple(max(p, 0) for p in parents)
        assert walk_ok(ps) is True
        assert gdn_plan.walk_errors(parents, planner.plan(parents), 3) == []
