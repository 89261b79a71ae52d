"""`elpis download`: fetch the two pinned revisions from Hugging Face and verify them.

Only the files the manifest names are fetched (at the pinned commit), into plain directories (no symlinks
into a cache); huggingface_hub's download bookkeeping folder is removed afterwards, then `elpis.manifest`
checks every file. A failed check exits 1 and leaves the files for inspection.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from elpis.manifest import MANIFEST, ROLES, ManifestError, load_manifest, verify


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, required=True, help="directory for the target model")
    parser.add_argument("--draft", type=Path, required=True, help="directory for the DFlash2 draft")
    parser.add_argument("--token-file", type=Path, default=None, help="file holding a Hugging Face token")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help=argparse.SUPPRESS)


def fetch(role: str, repo: str, revision: str, files: list[str], out: Path, token: str | None) -> None:
    from huggingface_hub import snapshot_download

    out.mkdir(parents=True, exist_ok=True)
    print(f"elpis download: {role} {repo}@{revision} -> {out}")
    snapshot_download(repo_id=repo, revision=revision, local_dir=str(out), allow_patterns=files, token=token)
    shutil.rmtree(out / ".cache", ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    try:
        pinned = load_manifest(args.manifest)
    except ManifestError as exc:
        print(f"elpis download: {exc}", file=sys.stderr)
        return 2
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            print(f"elpis download: cannot read token file: {exc}", file=sys.stderr)
            return 2
    dirs = {"target": args.target, "draft": args.draft}
    try:
        for role in ROLES:
            p = pinned[role]
            if not p.repo or not p.revision:
                raise ManifestError(f"manifest has no repo/revision for {role}")
            fetch(role, p.repo, p.revision, sorted(p.files), dirs[role], token)
    except Exception as exc:  # network, auth, disk: one clear line, non-zero exit
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"elpis download: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        verify(args.target, args.draft, args.manifest, show_progress=True)
    except ManifestError as exc:
        print(f"elpis download: verification FAILED: {exc}", file=sys.stderr)
        return 1
    print("elpis download: OK (both revisions fetched and verified)")
    return 0
