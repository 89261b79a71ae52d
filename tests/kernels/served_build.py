"""The served build of a row-scan kernel (verify epilogue, draft candidates) for the PTX tests: the block,
span length and cap its source defines by default (what `nvcc.load`, passing no defines, builds), and its PTX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from elpis import nvcc


@dataclass(frozen=True)
class ServedBuild:
    source: Path
    prefix: str  # of the source's build constants: ELPIS_VERIFY_EPILOGUE, ELPIS_DRAFT_CANDIDATES
    glue_threads: int  # the block the Python glue launches

    def default(self, name: str) -> int:
        """Build constant `prefix`_`name`'s default in the source."""
        m = re.search(rf"^#define {self.prefix}_{name} (\d+)$", self.source.read_text(), re.MULTILINE)
        assert m is not None, name
        return int(m.group(1))

    def geometry(self) -> tuple[int, int, int]:
        """(threads, span vectors, most spans a row), the threads checked against the glue's block."""
        threads = self.default("THREADS")
        assert threads == self.glue_threads
        return threads, self.default("SPAN_VECTORS"), self.default("MAX_SPANS")

    def ptx(self, arch: str) -> str:
        return _ptx(self.source, arch)


@cache
def _ptx(source: Path, arch: str) -> str:
    return nvcc.compile_to(source, "ptx", arch=arch).read_text()


def but_target(text: str) -> list[str]:
    """The PTX's lines but its .target line (the one nvcc makes differ between sm_86 and sm_90 here)."""
    return [line for line in text.splitlines() if not line.startswith(".target ")]


def assert_same_for_both_archs(build: ServedBuild) -> None:
    """sm_86's PTX is sm_90's but for the .target line, so a run of one stands for both; the comparison can
    fail (one instruction changed is another text)."""
    sm86, sm90 = build.ptx("sm_86"), build.ptx("sm_90")
    assert but_target(sm86) == but_target(sm90)
    assert but_target(sm86) != but_target(sm86.replace("bar.sync", "bar.sync ", 1))
