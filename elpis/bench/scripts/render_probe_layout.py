"""Render a probe split layout for the tree attention (timing only, not proved; for attention_splits.py).

The probe is the served layout of bend/verify_schedule.bend up to END positions, then a split every SIZE
positions (a power of two, at least 512, END a multiple of 512 past 16384). It renders from a copy of bend/
and codegen/, checks that the probe's splits tile a few spans, and writes OUT_DIR/verify_schedule.h.
Usage (repo root): python3 elpis/bench/scripts/render_probe_layout.py OUT_DIR END SIZE
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
from pathlib import Path

from elpis.bend import schedule
from elpis.paths import REPO_ROOT

SERVED_TAIL_OWNER = "(middle_splits() + ((pos - middle_end() : U32) >> 9n : U32) : U32)))"
SERVED_TAIL_BEGIN = "(middle_end() + ((k - middle_splits() : U32) << 9n : U32) : U32)))"


def probe_source(text: str, end: int, size: int) -> str:
    """verify_schedule.bend with its last region (512-position splits) ending at `end`, `size` ones after."""
    if size < 512 or size & (size - 1) or end <= 16384 or end % 512:
        raise SystemExit(f"want SIZE a power of two >= 512, END a multiple of 512 past 16384: {end} {size}")
    if text.count(SERVED_TAIL_OWNER) != 1 or text.count(SERVED_TAIL_BEGIN) != 1:
        raise SystemExit("bend/verify_schedule.bend: not the served three-region layout this probe extends")
    first = 80 + (end - 16384) // 512  # the first split of the new region
    shift = size.bit_length() - 1
    owner = (f"pick_u32(U32.is_lt(pos, {end}), {SERVED_TAIL_OWNER[:-2]}, "
             f"({first} + ((pos - {end} : U32) >> {shift}n : U32) : U32))))")  # fmt: skip
    begin = (f"pick_u32(U32.is_lt(k, {first}), {SERVED_TAIL_BEGIN[:-2]}, "
             f"({end} + ((k - {first} : U32) << {shift}n : U32) : U32))))")  # fmt: skip
    text = text.replace(SERVED_TAIL_OWNER, owner).replace(SERVED_TAIL_BEGIN, begin)
    return text.replace("def split_size() -> U32:\n  512", f"def split_size() -> U32:\n  {size}")


def main(out_dir: Path, end: int, size: int) -> int:
    root = Path(tempfile.mkdtemp(prefix="elpis-layout-"))
    for part in ("bend", "codegen"):
        shutil.copytree(REPO_ROOT / part, root / part)
    source = root / "bend" / "verify_schedule.bend"
    source.write_text(probe_source(source.read_text(), end, size))
    f = schedule.interpreted(root)
    for total in (1000, end - 1, end + size + 7, 262160):
        bounds = [(f["split_begin"](k), f["split_end"](total, k)) for k in range(f["splits"](total))]
        tiled = all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        if bounds[0][0] != 0 or bounds[-1][1] != total or not tiled:
            raise SystemExit(f"the probe's splits do not tile a span of {total}: {bounds[-3:]}")
        if total > end + size and bounds[-2][1] - bounds[-2][0] != size:
            raise SystemExit(f"the probe's splits past {end} are not {size} long: {bounds[-3:]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / schedule.HEADER).write_text(schedule.render(root))
    shutil.rmtree(root)
    print(f"{out_dir / schedule.HEADER}: {f['splits'](262160)} splits at 262,160 positions")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
