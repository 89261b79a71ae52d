"""The shared check of generated kernel headers (elpis.bend.headers): a C harness built against the header
and run, its table compared line by line with the interpreter's, the header installed only after."""

from __future__ import annotations

from pathlib import Path

import pytest

from elpis.bend import gdn_plan, schedule
from elpis.bend.errors import BendError
from elpis.bend.headers import harness_lines, install_checked, require_same_table


class Mismatch(BendError):
    pass


HEADER = "#include <stdint.h>\nstatic inline uint32_t twice(uint32_t x) { return 2u * x; }\n"
HARNESS = '#include <stdio.h>\n#include "probe.h"\nint main(void) { %BODY% }\n'


def harness(body: str) -> str:
    return HARNESS.replace("%BODY%", body)


def header(tmp_path: Path, text: str = HEADER) -> Path:
    path = tmp_path / ".probe.h.tmp"  # a temporary name: the harness sees it under the header's own name
    path.write_text(text)
    return path


def test_the_harness_runs_against_the_header_under_its_name(tmp_path: Path) -> None:
    body = 'for (uint32_t i = 0; i < 3u; i++) printf("%u %u\\n", i, twice(i)); return 0;'
    assert harness_lines(header(tmp_path), "probe.h", harness(body), Mismatch) == ["0 0", "1 2", "2 4"]


def test_a_header_that_does_not_compile_is_refused_with_the_compilers_message(tmp_path: Path) -> None:
    broken = header(tmp_path, HEADER + "static int unused_but_warned(void) { return 0; }\n")
    with pytest.raises(Mismatch, match=r"probe.h does not compile as C11:\n(.|\n)*unused_but_warned"):
        harness_lines(broken, "probe.h", harness("return 0;"), Mismatch)


def test_a_failing_or_hanging_harness_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Mismatch, match=r"probe.h: the harness failed \(exit 3\)"):
        harness_lines(header(tmp_path), "probe.h", harness("return 3;"), Mismatch)
    with pytest.raises(Mismatch, match=r"probe.h: the harness did not finish in 0.5 s"):
        harness_lines(header(tmp_path), "probe.h", harness("for (;;) {}"), Mismatch, timeout=0.5)


def test_the_first_differing_line_is_named_with_its_case() -> None:
    want = ["a", "b", "c", "d"]
    assert require_same_table("probe.h", want, list(want), str, Mismatch) == 4
    with pytest.raises(Mismatch) as caught:
        require_same_table("probe.h", want, ["a", "B", "C", "d"], lambda i: f"x.bend at case {i}", Mismatch)
    assert str(caught.value) == "probe.h disagrees with x.bend at case 1:\n  interpreter: b\n  compiled:    B"
    with pytest.raises(Mismatch, match=r"^probe.h: table has 3 lines, the interpreter 4$"):
        require_same_table("probe.h", want, want[:3], str, Mismatch)


def test_a_header_failing_its_check_is_never_installed(tmp_path: Path) -> None:
    def refuse(path: Path) -> None:
        assert path.read_text() == HEADER
        raise Mismatch("no")

    with pytest.raises(Mismatch):
        install_checked(HEADER, tmp_path, "probe.h", refuse)
    assert list(tmp_path.iterdir()) == []
    assert install_checked(HEADER, tmp_path, "probe.h", lambda path: None).read_text() == HEADER
    assert [p.name for p in tmp_path.iterdir()] == ["probe.h"]


def test_both_kernel_headers_report_their_first_mismatch_by_case(tmp_path: Path) -> None:
    bad = tmp_path / schedule.HEADER
    bad.write_text(schedule.render().replace("(v_e == UINT64_C(0))", "(v_e == UINT64_C(1))"))
    with pytest.raises(
        schedule.ScheduleMismatch, match=r"disagrees with bend/verify_schedule.bend at table line \d+:"
    ):
        schedule.check_header(bad)
    bad = tmp_path / gdn_plan.HEADER
    bad.write_text(gdn_plan.render().replace("load[v] = (int32_t)from - 1;", "load[v] = (int32_t)from;"))
    with pytest.raises(
        gdn_plan.PlanMismatch, match=r"disagrees with bend/gdn_plan.bend on tree \[-1(, \d+)*\]:"
    ):
        gdn_plan.check_header(bad)
