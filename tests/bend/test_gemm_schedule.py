"""The EXL3 GEMM kernel's work schedule (bend/gemm_schedule.bend): the generated header matches the Bend
interpreter (and a wrong header is refused), its laws are proved and a wrong schedule fails them, and the
schedule is the partition it claims to be on the model's shapes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from elpis.bend import gemm_schedule
from elpis.bend.prove import prove_all
from elpis.bend.scalar_header import Query
from elpis.paths import REPO_ROOT
from tests.bend.conftest import fails_closed_on_template_edit, fails_its_law, refuses_edited_header

# The statements of proofs/gemm_schedule_proof.bend (their proofs cite every other law there).
STATEMENTS = {
    "gemm_first_split_begins_at_0",
    "gemm_last_split_ends_at_groups",
    "gemm_splits_contiguous",
    "gemm_splits_nonempty",
    "gemm_owner_holds_group",
    "gemm_ktile_parts",
    "gemm_ktile_covers",
    "gemm_blocks_in_range",
}


@pytest.fixture(scope="module")
def sched() -> dict:
    return {
        name.removeprefix("elpis_gemm_"): f for name, f in gemm_schedule.SPEC.functions(REPO_ROOT).items()
    }


def test_header_is_written_only_when_it_matches(tmp_path: Path) -> None:
    path = gemm_schedule.build(tmp_path)
    assert path == tmp_path / gemm_schedule.HEADER
    assert [p.name for p in tmp_path.iterdir()] == [gemm_schedule.HEADER]
    assert gemm_schedule.constants_of(path) == {"warps": 8, "group_k": 128}
    assert gemm_schedule.check_header(path) > 4000
    assert gemm_schedule.render() == path.read_text(), "generation is deterministic"


def test_header_exports_the_kernel_interface() -> None:
    text = gemm_schedule.render()
    for signature in (
        "uint32_t elpis_gemm_split_begin(uint32_t groups, uint32_t splits, uint32_t s)",
        "uint32_t elpis_gemm_split_end(uint32_t groups, uint32_t splits, uint32_t s)",
        "uint32_t elpis_gemm_owner(uint32_t groups, uint32_t splits, uint32_t g)",
        "uint32_t elpis_gemm_ktile(uint32_t group, uint32_t warp)",
        "uint32_t elpis_gemm_blocks(uint32_t units, uint32_t capacity)",
    ):
        assert f"ELPIS_GEMM_FN {signature} {{" in text
    assert "#define ELPIS_GEMM_FN __host__ __device__ static inline" in text
    # Every generated name carries the header's own prefix (it shares units with the other kernel headers).
    names = set(re.findall(r"\b(?:bend|elpis)_[a-z0-9_]+(?=\()", text))
    assert names and all(n.startswith(("elpis_gemms_", "elpis_gemm_")) for n in names), names
    # No function takes the row count: a row's summation order cannot depend on it.
    params = set(re.findall(r"uint32_t ([a-z_]+)[,)]", text.split("exported entry points")[1]))
    assert params == {"groups", "splits", "s", "g", "group", "warp", "units", "capacity"}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    return v_a__i1;\n", "    return (v_a__i1 + 1u);\n"),  # a stream-K block more than units
        (
            "elpis_gemms_gemm_schedule_min_u32(v_x, v_b)",
            "elpis_gemms_gemm_schedule_max_u32(v_x, v_b)",
        ),  # wrong stairs
        ("<= v_t);", "< v_t);"),  # the search stops one split early
        ("(v_hi - v_lo)), UINT64_C(1))", "(v_hi - v_lo)), UINT64_C(2))"),  # quarter steps: runs out of fuel
        ("#define ELPIS_GEMM_WARPS 8u", "#define ELPIS_GEMM_WARPS 16u"),
    ],
)
def test_a_wrong_header_is_refused(tmp_path: Path, old: str, new: str) -> None:
    refuses_edited_header(gemm_schedule.SPEC, tmp_path, old, new)


def test_a_template_that_breaks_the_header_fails_closed(repo_copy: Path, tmp_path: Path) -> None:
    old, new = "return n < 32 ? a >> n : 0u;", "return n < 32 ? a >> (n + 1u) : 0u;"
    fails_closed_on_template_edit(gemm_schedule.SPEC, repo_copy, tmp_path, old, new)


def test_the_laws_are_proved() -> None:
    report = prove_all(REPO_ROOT, jobs=1, only=STATEMENTS)
    assert report.ok, report.failures
    proved = {c["law"] for c in report.certificates}
    assert proved > STATEMENTS and len(proved) > len(STATEMENTS)  # and the lemmas they cite
    assert all(c["vacuity_witness"]["checked"] == "interpreter" for c in report.certificates)


@pytest.mark.parametrize(
    ("old", "new", "law"),
    [
        (  # no clamp to the number of units
            "  min_u32(units, max_u32(1, capacity))",
            "  max_u32(1, capacity)",
            "gemm_blocks_in_range",
        ),
        (  # the remainder spread one split too far
            "  ((x * a : U32) + min_u32(x, b) : U32)",
            "  ((x * a : U32) + min_u32(x, (b + 1 : U32)) : U32)",
            "gemm_stairs_end_at_groups",
        ),
        (  # 19 halvings: too few to narrow 2^20 values down to one
            "    case _:\n      20n",
            "    case _:\n      19n",
            "gemm_quotient_start",
        ),
        (  # quarter steps: a halving no longer halves
            "  (lo + ((hi - lo : U32) >> 1n : U32) : U32)",
            "  (lo + ((hi - lo : U32) >> 2n : U32) : U32)",
            "gemm_search_keeps_hi",
        ),
        (
            "  ((group * warps() : U32) + warp : U32)",
            "  ((group * 7 : U32) + warp : U32)",
            "gemm_ktile_parts",
        ),
    ],
)
def test_a_wrong_schedule_fails_its_laws(repo_copy: Path, old: str, new: str, law: str) -> None:
    fails_its_law(repo_copy, gemm_schedule.MODULE, old, new, law)


def test_table_covers_the_model_shapes() -> None:
    queries = set(gemm_schedule.table_queries())
    for groups in gemm_schedule.MODEL_GROUPS:
        for splits in gemm_schedule.MODEL_SPLITS:
            ends = (Query(gemm_schedule.SPLIT_END, (groups, splits, s)) for s in range(splits))
            owners = (Query(gemm_schedule.OWNER, (groups, splits, g)) for g in range(groups))
            assert all(q in queries for q in ends) and all(q in queries for q in owners)
        for nblocks in gemm_schedule.MODEL_NBLOCKS:
            assert Query(gemm_schedule.BLOCKS, (groups * nblocks, 264)) in queries


def test_closed_forms_are_a_balanced_partition() -> None:
    """Independent of Bend: the formulas the interpreter is checked against partition the groups."""
    for groups in range(1, 65):
        for splits in range(1, groups + 1):
            bounds = [gemm_schedule.begin_of(groups, splits, s) for s in range(splits + 1)]
            assert bounds[0] == 0 and bounds[-1] == groups
            sizes = {b - a for a, b in itertools.pairwise(bounds)}
            assert sizes <= {groups // splits, -(-groups // splits)} and min(sizes) >= 1
            for g in range(groups):
                s = gemm_schedule.owner_of(groups, splits, g)
                assert bounds[s] <= g < bounds[s + 1]


def test_model_shapes(sched: dict) -> None:
    """Partitions of every projection's groups by the interpreter: every group in exactly one part,
    every k-tile of the matrix handled by exactly one (group, warp)."""
    for groups in gemm_schedule.MODEL_GROUPS:
        for splits in gemm_schedule.MODEL_SPLITS:
            held = [
                s
                for s in range(splits)
                for _ in range(sched["split_begin"](groups, splits, s), sched["split_end"](groups, splits, s))
            ]
            assert held == sorted(held) and len(held) == groups and set(held) == set(range(splits))
            assert [sched["owner"](groups, splits, g) for g in range(groups)] == held
        tiles = sorted(sched["ktile"](g, w) for g in range(groups) for w in range(8))
        assert tiles == list(range(8 * groups))


def test_model_shapes_as_stream_k_grids(sched: dict) -> None:
    """The same shapes as stream-K grids over units = groups x nblocks on 264 resident blocks (the LM head,
    40 x 1940 = 77,600 units, is beyond 2^16): the blocks split the units into ascending, non-empty runs
    of sizes that differ by at most one."""
    for groups in gemm_schedule.MODEL_GROUPS:
        for nblocks in gemm_schedule.MODEL_NBLOCKS:
            units = groups * nblocks
            blocks = sched["blocks"](units, 264)
            assert blocks == min(units, 264)
            bounds = [sched["split_begin"](units, blocks, b) for b in range(blocks + 1)]
            assert bounds[0] == 0 and bounds[-1] == units
            assert {b - a for a, b in itertools.pairwise(bounds)} <= {units // blocks, -(-units // blocks)}
            for b in (0, blocks // 2, blocks - 1):
                assert sched["owner"](units, blocks, bounds[b]) == b
                assert sched["owner"](units, blocks, bounds[b + 1] - 1) == b
