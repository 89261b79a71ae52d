"""Render the tree attention's schedule header from another commit's split layout (for attention_splits.py).

Copies `bend/` and `codegen/` as they are at REV (`git archive`), renders `verify_schedule.h` from them
through the Bend front end, checks that the splits tile a few spans, and writes OUT_DIR/verify_schedule.h.
Session 24 rendered session 23's layout this way (`.device/schedule-r2` from `c728a8b`). To probe a layout
that no commit has, commit it on a branch first; session 23's `render_probe_layout.py` (in git history)
edited the tail region of the three-region program instead.
Usage (repo root): python3 elpis/bench/scripts/render_layout.py OUT_DIR REV
"""

from __future__ import annotations

import io
import itertools
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from elpis.bend import schedule
from elpis.paths import REPO_ROOT


def checkout_sources(rev: str, root: Path) -> None:
    """bend/ and codegen/ of commit `rev` under `root`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev, "bend", "codegen"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")


def main(out_dir: Path, rev: str) -> int:
    root = Path(tempfile.mkdtemp(prefix="elpis-layout-"))
    try:
        checkout_sources(rev, root)
        f = schedule.interpreted(root)
        for total in (1000, 4097, 16385, 65537, 262160):
            bounds = [(f["split_begin"](k), f["split_end"](total, k)) for k in range(f["splits"](total))]
            tiled = all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            if bounds[0][0] != 0 or bounds[-1][1] != total or not tiled:
                raise SystemExit(f"{rev}: its splits do not tile a span of {total}: {bounds[-3:]}")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / schedule.HEADER).write_text(schedule.render(root))
        splits = f["splits"](262160)
        print(f"{out_dir / schedule.HEADER}: {rev}'s layout, {splits} splits at 262,160 positions")
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
