"""Storing the reference table, running a library over it, and comparing byte for byte.

File layout (little-endian, deterministic): MAGIC, an 8-byte header length, the header as canonical
JSON (schema, the sections with their descriptors and row counts, the arrays with dtype and shape), then
every array's raw bytes in header order. Expected outputs per section: `codes` (int8, the glue's code
per decision), plus `paths` (uint64) for trees and `depth` (uint8) / `ancestors` (uint16) for masks.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from elpis.accept import abi, oracle
from elpis.accept.table import MAGIC, SECTIONS, TABLE_SCHEMA, Section

OUTPUTS: dict[str, tuple[tuple[str, str, tuple[int, ...]], ...]] = {
    # kind -> (array name, dtype, per-decision shape)
    "chain": (("codes", "<i1", ()),),
    "tree": (("codes", "<i1", ()), ("paths", "<u8", ())),
    "masks": (("codes", "<i1", ()), ("depth", "|u1", (abi.MAX_ROWS,)), ("ancestors", "<u2", (abi.MAX_ROWS,))),
}
_CELLS = {"chain": abi.CHAIN_CELLS, "tree": abi.TREE_CELLS, "masks": abi.MASKS_CELLS}

THREADS = 2  # the CI machine has two cores
Outputs = dict[str, np.ndarray]
Progress = Callable[[int], None]  # called with the number of decisions just checked


class TableMismatch(Exception):
    """The library disagrees with the table (or the table file is malformed)."""


def header() -> dict[str, Any]:
    sections = [{"name": s.name, "kind": s.kind, "rows": s.rows, "params": s.params} for s in SECTIONS]
    arrays = [
        {"section": s.name, "name": name, "dtype": dtype, "shape": [s.rows, *shape]}
        for s in SECTIONS
        for name, dtype, shape in OUTPUTS[s.kind]
    ]
    return {"schema": TABLE_SCHEMA, "sections": sections, "arrays": arrays}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def total_decisions() -> int:
    return sum(s.rows for s in SECTIONS)


# --- computing outputs ------------------------------------------------------------------------------


def oracle_outputs(kind: str, cells: np.ndarray) -> Outputs:
    if kind == "chain":
        return {"codes": oracle.chain(cells)}
    if kind == "tree":
        codes, paths = oracle.tree(cells)
        return {"codes": codes, "paths": paths}
    depth, ancestors = oracle.masks(cells)
    return {"codes": np.zeros(len(cells), dtype=np.int8), "depth": depth, "ancestors": ancestors}


def library_outputs(ffi: Any, lib: Any, kind: str, cells: np.ndarray) -> Outputs:
    """Run one block of cells through the library's batch entry."""
    cells = np.ascontiguousarray(cells, dtype=np.int64)
    if cells.ndim != 2 or cells.shape[1] != _CELLS[kind]:
        raise ValueError(f"{kind} cells must have shape (n, {_CELLS[kind]})")
    n = len(cells)
    codes = np.empty(n, dtype=np.int32)
    c_cells = ffi.from_buffer("int64_t[]", cells)
    c_codes = ffi.from_buffer("int32_t[]", codes)
    out: Outputs = {}
    if kind == "chain":
        lib.elpis_chain_batch(c_cells, n, c_codes)
    elif kind == "tree":
        paths = np.empty(n, dtype=np.uint64)
        lib.elpis_tree_batch(c_cells, n, c_codes, ffi.from_buffer("uint64_t[]", paths))
        out["paths"] = paths
    else:
        depth = np.empty((n, abi.MAX_ROWS), dtype=np.uint8)
        ancestors = np.empty((n, abi.MAX_ROWS), dtype=np.uint16)
        lib.elpis_masks_batch(
            c_cells, n, c_codes, ffi.from_buffer("uint8_t[]", depth), ffi.from_buffer("uint16_t[]", ancestors)
        )
        out["depth"], out["ancestors"] = depth, ancestors
    if codes.size and (codes.min() < -128 or codes.max() > 127):
        raise TableMismatch(f"{kind}: library returned a code outside int8")
    out["codes"] = codes.astype(np.int8)
    return out


def _first_difference(expected: Outputs, actual: Outputs) -> tuple[int, str] | None:
    for name, want in expected.items():
        got = actual[name]
        if got.dtype != want.dtype or got.shape != want.shape:
            return 0, name
        if got.tobytes() != want.tobytes():
            diff = (got != want).reshape(len(want), -1).any(axis=1)
            return int(np.argmax(diff)), name
    return None


def _describe(
    section: Section,
    first: int,
    offset: int,
    cells: np.ndarray,
    expected: Outputs,
    actual: Outputs,
    name: str,
) -> str:
    def at(outputs: Outputs) -> str:
        return ", ".join(f"{key}={np.asarray(v[offset]).tolist()}" for key, v in outputs.items())

    return (
        f"section {section.name} decision {first + offset}: {name} differs; cells={cells[offset].tolist()}; "
        f"table: {at(expected)}; library: {at(actual)}"
    )


def _tasks() -> list[tuple[Section, int, int, Callable[[], np.ndarray]]]:
    """(section, first decision, decisions, block maker) for every block of the table, in order."""
    tasks = []
    for section in SECTIONS:
        first = 0
        for rows, make in section.parts():
            tasks.append((section, first, rows, make))
            first += rows
        if first != section.rows:
            raise TableMismatch(
                f"section {section.name}: blocks hold {first} decisions, expected {section.rows}"
            )
    return tasks


def _in_parallel(work: Callable[[Any], Any], tasks: list[Any]) -> Iterator[Any]:
    """Run blocks on two threads, results in order: numpy and the cffi batch calls release the GIL."""
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        yield from pool.map(work, tasks)


# --- writing (build) and re-checking (admission) ----------------------------------------------------


def write_checked(path: Path, ffi: Any, lib: Any, progress: Progress | None = None) -> None:
    """Compute every expected output with the oracle, require the library to agree, write the file."""

    def check(task: tuple[Section, int, int, Callable[[], np.ndarray]]) -> Outputs:
        section, first, rows, make = task
        cells = make()
        if len(cells) != rows:
            raise TableMismatch(f"section {section.name}: a block made {len(cells)} decisions, not {rows}")
        expected = oracle_outputs(section.kind, cells)
        actual = library_outputs(ffi, lib, section.kind, cells)
        diff = _first_difference(expected, actual)
        if diff is not None:
            offset, name = diff
            raise TableMismatch(_describe(section, first, offset, cells, expected, actual, name))
        if progress:
            progress(rows)
        return expected

    tasks = _tasks()
    parts: dict[tuple[str, str], list[np.ndarray]] = {}
    for (section, _, _, _), expected in zip(tasks, _in_parallel(check, tasks), strict=True):
        for name, _, _ in OUTPUTS[section.kind]:
            parts.setdefault((section.name, name), []).append(expected[name])
    arrays = [
        np.concatenate(parts[s.name, name]).astype(dtype, copy=False)
        for s in SECTIONS
        for name, dtype, _ in OUTPUTS[s.kind]
    ]
    head = _canonical(header())
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for array in arrays:
            f.write(np.ascontiguousarray(array).tobytes())


def read(path: Path) -> dict[tuple[str, str], np.ndarray]:
    """Parse a table file; its header must equal the header this code would write."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise TableMismatch("table file: bad magic")
    at = len(MAGIC)
    (length,) = struct.unpack_from("<Q", data, at)
    at += 8
    head = data[at : at + length]
    at += length
    if head != _canonical(header()):
        raise TableMismatch("table file: header does not describe the sections this loader enumerates")
    arrays: dict[tuple[str, str], np.ndarray] = {}
    for spec in header()["arrays"]:
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"]))
        size = count * dtype.itemsize
        if at + size > len(data):
            raise TableMismatch("table file: truncated")
        array = np.frombuffer(data, dtype=dtype, count=count, offset=at)
        arrays[spec["section"], spec["name"]] = array.reshape(spec["shape"])
        at += size
    if at != len(data):
        raise TableMismatch("table file: trailing bytes")
    return arrays


def recheck(path: Path, ffi: Any, lib: Any) -> None:
    """Re-run every stored decision through the library; any difference raises TableMismatch."""
    arrays = read(path)

    def check(task: tuple[Section, int, int, Callable[[], np.ndarray]]) -> None:
        section, first, rows, make = task
        cells = make()
        stop = first + rows
        expected = {name: arrays[section.name, name][first:stop] for name, _, _ in OUTPUTS[section.kind]}
        actual = library_outputs(ffi, lib, section.kind, cells)
        diff = _first_difference(expected, actual)
        if diff is not None:
            offset, name = diff
            raise TableMismatch(_describe(section, first, offset, cells, expected, actual, name))

    for _ in _in_parallel(check, _tasks()):
        pass
