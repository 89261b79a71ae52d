"""Admission: the only way the compiled acceptor gets into a process.

`admit(build_dir, root)` refuses (AdmissionError, with the reason) unless all of this holds:
  1. the build directory holds exactly the expected regular files (no extra, none missing, no symlinks);
  2. identity.json has exactly the expected keys and schema, and its identity_sha256 recomputes;
  3. every artifact (generated C, cffi wrapper, library, table, certificates) hashes to its recorded value,
     and the table's hash equals TABLE_SHA256 pinned below;
  4. every source (Bend, proofs, templates, glue, generator, build script, this loader) still hashes to
     its recorded value, the set of sources is unchanged, and the running loader file is the one recorded
     (a build older than its sources is stale);
  5. the interpreter, cffi and numpy are the ones the library was built with;
  6. the loaded library reports the expected ABI constants;
  7. the whole stored table re-runs through the loaded library's batch entries byte for byte;
  8. edge probes succeed and out-of-domain probes return the expected error codes, in the documented
     checking order.
There is no fallback: nothing else in elpis decides acceptance.

Trust boundary. The Bend implementation is proved equal to its spec by `elpis prove`. What runs is C
generated from it, compiled by gcc, wrapped by hand-written glue (ext/) and called through cffi; none of
that is proved. It is checked: the generated C by two token scans (the generator's, by type; the build's,
by taint from the ABI's token parameters), and the compiled whole (generator, compiler, glue, ABI) by
the finite differential above: the library must reproduce, byte for byte, an independent numpy oracle
on every chain pattern for k <= 7, every 8-row tree shape with every match mask, their budget and
stop-slot classes, and a seeded random sample up to k = 15 / 16 rows, at build time and at every start.
Inputs outside those sets (larger k or rows with other id patterns) are covered by the proof of the Bend
source and by the random sample, not exhaustively by the differential.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from elpis.accept import abi, identity, tablefile
from elpis.paths import ACCEPT_BUILD_DIR, REPO_ROOT

# SHA-256 of build/accept/table.bin. It changes only when the table's definition (elpis/accept/table.py)
# or the oracle changes; update it deliberately, after reviewing why.
TABLE_SHA256 = "ef96a0c5f6bc6f3c00115e14134e5216f89d4fab3f625457b54aa76c592a865d"

MODULE_NAME = "_elpis_accept"
LIBRARY = MODULE_NAME + sysconfig.get_config_var("EXT_SUFFIX")
BUILD_FILES = frozenset(
    {
        identity.IDENTITY,
        identity.GENERATED_H,
        identity.GENERATED_C,
        identity.WRAPPER_C,
        LIBRARY,
        identity.TABLE,
        identity.CERTIFICATES,
    }
)
ARTIFACTS = BUILD_FILES - {identity.IDENTITY}


class AdmissionError(RuntimeError):
    """The build directory, its identity, the library or its behaviour failed a check."""


@dataclass(frozen=True)
class Acceptor:
    """An admitted library: its cffi `ffi` and `lib`, and the identity it was admitted under."""

    ffi: Any
    lib: Any
    identity: dict[str, Any]
    build_dir: Path


def load_library(path: Path) -> tuple[Any, Any]:
    """Import a compiled cffi module from an explicit path (not via sys.path, not cached in sys.modules)."""
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise AdmissionError(f"cannot load {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ffi, module.lib


def admit(build_dir: Path = ACCEPT_BUILD_DIR, root: Path = REPO_ROOT) -> Acceptor:
    build_dir = Path(build_dir)
    _check_file_set(build_dir)
    ident = _read_identity(build_dir / identity.IDENTITY)
    _check_artifacts(build_dir, ident)
    _check_sources(Path(root), ident)
    problems = identity.runtime_mismatches(ident["toolchain"])
    if problems:
        raise AdmissionError("toolchain differs from the build's: " + "; ".join(problems))
    ffi, lib = load_library(build_dir / LIBRARY)
    _check_constants(lib)
    try:
        tablefile.recheck(build_dir / identity.TABLE, ffi, lib)
    except tablefile.TableMismatch as exc:
        raise AdmissionError(f"table re-check failed: {exc}") from exc
    _probe(ffi, lib)
    return Acceptor(ffi, lib, ident, build_dir)


def _check_file_set(build_dir: Path) -> None:
    try:
        info = os.lstat(build_dir)
    except FileNotFoundError:
        raise AdmissionError(f"{build_dir} does not exist") from None
    if not stat.S_ISDIR(info.st_mode):
        raise AdmissionError(f"{build_dir} is not a directory (or is a symlink)")
    present = set(os.listdir(build_dir))
    extra, missing = sorted(present - BUILD_FILES), sorted(BUILD_FILES - present)
    if extra or missing:
        raise AdmissionError(f"{build_dir}: unexpected files {extra}, missing files {missing}")
    for name in sorted(present):
        if not stat.S_ISREG(os.lstat(build_dir / name).st_mode):
            raise AdmissionError(f"{build_dir / name} is not a regular file (symlinks are refused)")


def _read_identity(path: Path) -> dict[str, Any]:
    try:
        ident = json.loads(path.read_bytes())
    except ValueError as exc:
        raise AdmissionError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(ident, dict) or set(ident) != identity.KEYS:
        got = sorted(ident) if isinstance(ident, dict) else type(ident).__name__
        raise AdmissionError(f"{path}: keys {got}, expected {sorted(identity.KEYS)}")
    if ident["schema"] != identity.SCHEMA:
        raise AdmissionError(f"{path}: schema {ident['schema']!r}, expected {identity.SCHEMA!r}")
    if identity.digest(ident) != ident["identity_sha256"]:
        raise AdmissionError(f"{path}: identity_sha256 does not recompute (the identity was edited)")
    if ident["table_sha256"] != TABLE_SHA256:
        raise AdmissionError(f"{path}: table_sha256 {ident['table_sha256']} is not the pinned {TABLE_SHA256}")
    return ident


def _check_artifacts(build_dir: Path, ident: dict[str, Any]) -> None:
    recorded = ident["artifacts"]
    if set(recorded) != ARTIFACTS:
        raise AdmissionError(f"identity artifacts {sorted(recorded)}, expected {sorted(ARTIFACTS)}")
    for name in sorted(ARTIFACTS):
        actual = identity.sha256_file(build_dir / name)
        if actual != recorded[name]:
            raise AdmissionError(f"{name}: SHA-256 {actual} differs from the identity's {recorded[name]}")
    if recorded[identity.TABLE] != TABLE_SHA256 or ident["table_sha256"] != TABLE_SHA256:
        raise AdmissionError(f"{identity.TABLE}: hash is not the pinned TABLE_SHA256 {TABLE_SHA256}")


def _check_sources(root: Path, ident: dict[str, Any]) -> None:
    recorded: dict[str, str] = ident["sources"]
    own_name = Path(__file__).resolve().relative_to(Path(identity.PACKAGE_DIR).parent).as_posix()
    own_hash = identity.sha256_file(Path(__file__).resolve())
    if recorded.get(own_name) != own_hash:
        raise AdmissionError(f"the running loader {own_name} ({own_hash}) is not the one the build recorded")
    current = identity.source_hashes(root)
    added, removed = sorted(set(current) - set(recorded)), sorted(set(recorded) - set(current))
    changed = sorted(name for name in set(current) & set(recorded) if current[name] != recorded[name])
    if added or removed or changed:
        raise AdmissionError(
            f"stale build (run make build): sources added {added}, removed {removed}, changed {changed}"
        )


def _check_constants(lib: Any) -> None:
    for name, expected in abi.LIBRARY_CONSTANTS.items():
        actual = getattr(lib, name, None)
        if actual != expected:
            raise AdmissionError(f"library constant {name} = {actual}, expected {expected}")


# --- probes -----------------------------------------------------------------------------------------

_TOP = abi.ID_MAX


def _chain_cells(k=15, budget=abi.BUDGET_MAX, nstops=4, stop=_TOP, draft=_TOP, target=_TOP) -> np.ndarray:
    cells = np.zeros(abi.CHAIN_CELLS, dtype=np.int64)
    cells[[abi.CHAIN_K, abi.CHAIN_BUDGET, abi.CHAIN_NSTOPS]] = k, budget, nstops
    cells[abi.CHAIN_STOPS : abi.CHAIN_STOPS + abi.MAX_STOPS] = stop
    cells[abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + abi.MAX_DRAFT] = draft
    cells[abi.CHAIN_TARGET : abi.CHAIN_TARGET + abi.MAX_ROWS] = target
    return cells


def _tree_cells(rows=16, budget=abi.BUDGET_MAX, nstops=4, stop=_TOP, draft=_TOP, target=_TOP) -> np.ndarray:
    cells = np.zeros(abi.TREE_CELLS, dtype=np.int64)
    cells[[abi.TREE_ROWS, abi.TREE_BUDGET, abi.TREE_NSTOPS]] = rows, budget, nstops
    cells[abi.TREE_STOPS : abi.TREE_STOPS + abi.MAX_STOPS] = stop
    cells[abi.TREE_PARENTS : abi.TREE_PARENTS + abi.MAX_ROWS] = np.arange(-1, abi.MAX_ROWS - 1)
    cells[abi.TREE_DRAFT : abi.TREE_DRAFT + abi.MAX_ROWS] = draft
    cells[abi.TREE_TARGET : abi.TREE_TARGET + abi.MAX_ROWS] = target
    return cells


def _masks_cells(rows=16) -> np.ndarray:
    cells = np.zeros(abi.MASKS_CELLS, dtype=np.int64)
    cells[abi.MASKS_ROWS] = rows
    cells[abi.MASKS_PARENTS : abi.MASKS_PARENTS + abi.MAX_ROWS] = np.arange(-1, abi.MAX_ROWS - 1)
    return cells


def _set(cells: np.ndarray, index: int, value: int) -> np.ndarray:
    out = cells.copy()
    out[index] = value
    return out


def probe_cases() -> list[tuple[str, str, np.ndarray, int | None]]:
    """(name, kind, cells, expected code or None for 'any success') for the admission probes."""
    E = abi
    ch, tr, mk = _chain_cells(), _tree_cells(), _masks_cells()
    no_stop_top = _chain_cells(nstops=0)
    cases: list[tuple[str, str, np.ndarray, int | None]] = [
        # Upper edges of the domain are accepted.
        ("chain upper edge", "chain", ch, None),
        ("chain no stops, top ids, max budget", "chain", no_stop_top, None),
        ("tree upper edge", "tree", tr, None),
        ("tree no stops, top ids", "tree", _tree_cells(nstops=0), None),
        ("masks 16 rows", "masks", mk, 0),
        ("masks 1 row", "masks", _masks_cells(rows=1), 0),
        # A budget of one always commits exactly one token and ends.
        ("chain budget 1", "chain", _chain_cells(budget=1, nstops=0), 1 << 1 | 1),
        ("tree budget 1", "tree", _tree_cells(budget=1, nstops=0), 1 << 1 | 1),
        # Out of domain, one field at a time.
        ("chain k = -1", "chain", _set(ch, E.CHAIN_K, -1), E.ERR_SIZE),
        ("chain k = 16", "chain", _set(ch, E.CHAIN_K, 16), E.ERR_SIZE),
        ("chain 5 stops", "chain", _set(ch, E.CHAIN_NSTOPS, 5), E.ERR_STOPS),
        ("chain -1 stops", "chain", _set(ch, E.CHAIN_NSTOPS, -1), E.ERR_STOPS),
        ("chain budget 0", "chain", _set(ch, E.CHAIN_BUDGET, 0), E.ERR_BUDGET),
        ("chain budget 2^48", "chain", _set(ch, E.CHAIN_BUDGET, 2**48), E.ERR_BUDGET),
        ("chain budget -1", "chain", _set(ch, E.CHAIN_BUDGET, -1), E.ERR_BUDGET),
        ("chain budget 2^63-1", "chain", _set(ch, E.CHAIN_BUDGET, 2**63 - 1), E.ERR_BUDGET),
        ("chain stop id -1", "chain", _set(ch, E.CHAIN_STOPS + 3, -1), E.ERR_ID),
        ("chain draft id 2^32", "chain", _set(ch, E.CHAIN_DRAFT + 14, 2**32), E.ERR_ID),
        ("chain target id -2^63", "chain", _set(ch, E.CHAIN_TARGET + 15, -(2**63)), E.ERR_ID),
        ("chain target id 2^32 (first row)", "chain", _set(ch, E.CHAIN_TARGET, 2**32), E.ERR_ID),
        ("tree 0 rows", "tree", _set(tr, E.TREE_ROWS, 0), E.ERR_SIZE),
        ("tree 17 rows", "tree", _set(tr, E.TREE_ROWS, 17), E.ERR_SIZE),
        ("tree root parent 0", "tree", _set(tr, E.TREE_PARENTS, 0), E.ERR_PARENT),
        ("tree parent == row", "tree", _set(tr, E.TREE_PARENTS + 15, 15), E.ERR_PARENT),
        ("tree parent -1", "tree", _set(tr, E.TREE_PARENTS + 1, -1), E.ERR_PARENT),
        ("tree 5 stops", "tree", _set(tr, E.TREE_NSTOPS, 5), E.ERR_STOPS),
        ("tree budget 0", "tree", _set(tr, E.TREE_BUDGET, 0), E.ERR_BUDGET),
        ("tree budget 2^48", "tree", _set(tr, E.TREE_BUDGET, 2**48), E.ERR_BUDGET),
        ("tree draft id 2^32", "tree", _set(tr, E.TREE_DRAFT + 15, 2**32), E.ERR_ID),
        ("tree anchor draft id -1", "tree", _set(tr, E.TREE_DRAFT, -1), E.ERR_ID),
        ("tree target id -1", "tree", _set(tr, E.TREE_TARGET + 7, -1), E.ERR_ID),
        ("tree stop id 2^32", "tree", _set(tr, E.TREE_STOPS, 2**32), E.ERR_ID),
        ("masks 0 rows", "masks", _set(mk, E.MASKS_ROWS, 0), E.ERR_SIZE),
        ("masks 17 rows", "masks", _set(mk, E.MASKS_ROWS, 17), E.ERR_SIZE),
        ("masks parent == row", "masks", _set(mk, E.MASKS_PARENTS + 3, 3), E.ERR_PARENT),
        # The first failing check wins: size, parent, stop count, budget, id.
        ("chain order size<stops", "chain", _set(_set(ch, E.CHAIN_K, 16), E.CHAIN_NSTOPS, 5), E.ERR_SIZE),
        (
            "chain order stops<budget",
            "chain",
            _set(_set(ch, E.CHAIN_NSTOPS, 5), E.CHAIN_BUDGET, 0),
            E.ERR_STOPS,
        ),
        (
            "chain order budget<id",
            "chain",
            _set(_set(ch, E.CHAIN_BUDGET, 0), E.CHAIN_DRAFT, -1),
            E.ERR_BUDGET,
        ),
        ("tree order size<parent", "tree", _set(_set(tr, E.TREE_ROWS, 17), E.TREE_PARENTS, 0), E.ERR_SIZE),
        (
            "tree order parent<stops",
            "tree",
            _set(_set(tr, E.TREE_PARENTS, 0), E.TREE_NSTOPS, 5),
            E.ERR_PARENT,
        ),
        # Unused slots are never validated (nor read): garbage there is fine.
        (
            "chain garbage past k",
            "chain",
            _set(_set(_chain_cells(k=3), E.CHAIN_DRAFT + 3, -7), E.CHAIN_TARGET + 4, 2**40),
            None,
        ),
        ("chain garbage past stop count", "chain", _set(_chain_cells(nstops=1), E.CHAIN_STOPS + 1, -1), None),
        (
            "tree garbage past rows",
            "tree",
            _set(_set(_tree_cells(rows=2), E.TREE_PARENTS + 2, 99), E.TREE_TARGET + 2, -1),
            None,
        ),
    ]
    return cases


def _probe(ffi: Any, lib: Any) -> None:
    for name, kind, cells, expected in probe_cases():
        outputs = tablefile.library_outputs(ffi, lib, kind, cells[None, :])
        code = int(outputs["codes"][0])
        ok = code >= 0 if expected is None else code == expected
        if not ok:
            raise AdmissionError(f"probe {name!r}: library returned {code}, expected {expected or 'success'}")
