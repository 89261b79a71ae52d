"""The tree-verify attention schedule: its laws catch a wrong schedule, the generated header matches the
Bend interpreter (and a wrong header is refused), and the slot map picks each row's ancestor."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from elpis.bend import schedule
from elpis.bend.check import load
from elpis.bend.interp import Interpreter
from elpis.bend.prove import prove_all
from elpis.paths import REPO_ROOT


@pytest.fixture(scope="module")
def sched() -> dict:
    interp = Interpreter(schedule.load_schedule(REPO_ROOT))
    return {name: interp.function(f"{schedule.MODULE}::{b}") for name, (b, _, _) in schedule.ENTRIES.items()}


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = schedule.build(tmp_path)
    assert path == tmp_path / schedule.HEADER
    assert schedule.split_size_of(path) == 2048
    assert schedule.check_header(path) > 1000
    assert [p.name for p in tmp_path.iterdir()] == [schedule.HEADER]
    assert schedule.render() == path.read_text(), "generation is deterministic"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("(v_pos < v_ctx)", "(v_pos + 1u < v_ctx)"),  # the last committed position read from the tree
        ("return UINT32_C(80);", "return UINT32_C(81);"),  # the 512-position splits numbered wrongly
        ("(v_e == UINT64_C(0))", "(v_e == UINT64_C(1))"),  # the wrong ancestor
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    text = schedule.render()
    assert text.count(old) == 1
    bad = tmp_path / schedule.HEADER
    bad.write_text(text.replace(old, new))
    with pytest.raises(schedule.ScheduleMismatch):
        schedule.check_header(bad)


def test_a_template_that_breaks_the_header_fails_closed(repo_copy: Path, tmp_path: Path) -> None:
    template = repo_copy / "codegen" / schedule.TEMPLATE
    text = template.read_text()
    assert text.count("return n < 32 ? a >> n : 0u;") == 1
    template.write_text(text.replace("return n < 32 ? a >> n : 0u;", "return n < 32 ? a >> (n + 1u) : 0u;"))
    out = tmp_path / "kernels"
    with pytest.raises(schedule.ScheduleMismatch):
        schedule.build(out, repo_copy)
    assert not (out / schedule.HEADER).exists()


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        (  # the last split reaches one past the span
            "  min_u32(split_begin((k + 1 : U32)), total)",
            "  min_u32(split_begin((k + 1 : U32)), (total + 1 : U32))",
            "splits_inside_span",
        ),
        ("(pos >> 7n : U32)", "(pos >> 8n : U32)", "split_holds_exactly_owner"),  # wrong owner below 4096
        ("def middle_end() -> U32:\n  16384", "def middle_end() -> U32:\n  16000", "split_boundaries_fixed"),
        ("def long_end() -> U32:\n  65536", "def long_end() -> U32:\n  65000", "split_boundaries_fixed"),
        ("def split_size() -> U32:\n  2048", "def split_size() -> U32:\n  1024", "splits_fit_the_kernels"),
    ],
)
def test_a_wrong_schedule_fails_its_laws(repo_copy: Path, old: str, new: str, law: str) -> None:
    path = repo_copy / "bend" / "verify_schedule.bend"
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    report = prove_all(repo_copy, jobs=1, only={law})
    assert not report.ok
    assert len(report.failures) == 1 and law in report.failures[0]


def test_table_crosses_every_listed_boundary() -> None:
    pairs, masks = schedule.table_cases()
    spans = {c + d + 1 for c, d in pairs}
    for b in schedule.TABLE_BOUNDARIES:
        assert {b - 1, b, b + 1} <= spans
    assert {m.depth for m in masks} == set(range(16))


def test_schedule_of_a_row_is_plain_decodings(sched: dict) -> None:
    for ctx in (0, 1, 120, 127, 128, 1023, 4090, 16380, 32760, 65530, 69630, 262140):
        for depth in range(16):
            total, plain = sched["span"](ctx, depth), sched["span"](ctx + depth, 0)
            assert total == plain
            n = sched["splits"](total)
            bounds = [(sched["split_begin"](k), sched["split_end"](total, k)) for k in range(n)]
            assert bounds == schedule.split_bounds(total)
            assert bounds[0][0] == 0 and bounds[-1][1] == total
            assert all(b[1] == nxt[0] for b, nxt in itertools.pairwise(bounds))
            # the layout, stated directly: 128 positions a split below 4096, 256 below 16384, 512 below 65536,
            # 2048 beyond
            assert all(b % _layout_split(b) == 0 for b, _ in bounds)
            assert all(e - b == _layout_split(b) for b, e in bounds[:-1])


def _layout_split(begin: int) -> int:
    return 128 if begin < 4096 else 256 if begin < 16384 else 512 if begin < 65536 else 2048


def _climb(parents: list[int], r: int, hops: int) -> int:
    for _ in range(hops):
        r = parents[r]
    return r


def test_slots_are_the_ancestors_at_each_depth(sched: dict) -> None:
    """Independent of the laws: climb the parent links in Python and compare every position's slot."""
    prog = load(REPO_ROOT, [REPO_ROOT / "bend/masks.bend"])
    interp = Interpreter(prog)
    depths = interp.function("bend/masks.bend::depths")
    ancestors = interp.function("bend/masks.bend::ancestors")
    rng = random.Random(8)
    for _ in range(40):
        rows = rng.randint(1, 16)
        parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
        par = tuple(max(p, 0) for p in parents)
        for r, (d, a) in enumerate(zip(depths(par), ancestors(par), strict=True)):
            ctx = rng.choice((0, 7, 511, 512, 40000))
            for e in range(d + 1):
                want = _climb(parents, r, d - e)
                assert sched["anc_at"](a, e) == want
                assert sched["slot"](ctx, a, ctx + e) == ctx + want
            if ctx:
                assert sched["slot"](ctx, a, ctx - 1) == ctx - 1
