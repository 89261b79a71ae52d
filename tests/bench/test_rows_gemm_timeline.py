"""The arithmetic of `rows_gemm_timeline.py` (the rows GEMM's per-block clocks), on a hand-made timeline."""

from __future__ import annotations

import numpy as np
import pytest

from elpis.bench.scripts import rows_gemm_timeline as tl

# one row per block: start, loop ends (3), end, n-blocks, finished, SM, final count seen, partials summed (ns)
CLOCKS = np.array(
    [
        [0, 1000, 0, 0, 5000, 1, 1, 0, 3000, 4000],  # the last of an n-block's blocks: it folds and finishes
        [100, 1100, 0, 0, 2000, 1, 0, 0, 0, 0],  # leaves its partials for another block
        [50, 900, 0, 0, 1500, 1, 1, 1, 0, 0],  # holds a whole n-block and finishes it without partials
    ],
    dtype=np.int64,
)


def test_a_timeline_is_summarised_per_block_and_per_multiprocessor() -> None:
    got = tl.summarise(CLOCKS)
    assert got["span_us"] == pytest.approx(5.0) and got["start_spread_us"] == pytest.approx(0.1)
    assert got["blocks"] == 3 and got["finishing_blocks"] == 2
    assert got["block_us_max"] == pytest.approx(5.0)
    assert got["after_loops_us_max"] == pytest.approx(4.0)
    # SM 0's last block ends at 5 us, SM 1's at 1.5 us: 35 % of the span idle on average
    assert got["sm_idle_share"] == pytest.approx(0.35)
    assert got["late_blocks"][0]["block"] == 0


def test_the_fold_phases_come_from_the_blocks_that_summed_partials_last() -> None:
    got = tl.fold_phases(CLOCKS, CLOCKS[:, 1])
    assert got["folding_blocks"] == 1
    assert got["loop_to_count_us"] == {"median": 2.0, "max": 2.0}
    assert got["count_to_summed_us"] == {"median": 1.0, "max": 1.0}
    assert got["summed_to_end_us"] == {"median": 1.0, "max": 1.0}
    assert tl.fold_phases(CLOCKS[1:], CLOCKS[1:, 1]) == {"folding_blocks": 0}


def test_knobs_on_the_command_line_become_compile_time_defines() -> None:
    from elpis.bench.scripts.rows_gemm_check import parse_defines

    assert parse_defines("") == {}
    assert parse_defines("ELPIS_GEMM_FOLD_BATCH:2,ELPIS_GEMM_STAGES:4") == {
        "ELPIS_GEMM_FOLD_BATCH": 2,
        "ELPIS_GEMM_STAGES": 4,
    }
    with pytest.raises(ValueError):
        parse_defines("ELPIS_GEMM_STAGES")  # a knob without its value
