"""The proven acceptor on the GPU: the generated C of `make build`, compiled by nvcc as device code.

`ext/accept_device.cu` includes build/accept/acceptors.c (every function there is `ELPIS_FN`, i.e.
`__host__ __device__` under nvcc) behind the checked entries the CPU glue runs (`ext/accept_checks.h`, the
one definition of validation, poisoning and output checks, included by `ext/accept_device.cuh` and
`ext/elpis_glue.c`), and launches one thread per decision on packed int64 cells in the glue's layout
(`elpis.accept.abi`).

    device = DeviceAcceptor.load()                 # nvcc build for this GPU (cached), layout checked
    report = device.check_table(pack_table())      # every reference-table decision on the GPU
    out = device.decide("tree", cells)             # cells: int64 CUDA tensor (n, TREE_CELLS)
    admitted()                                     # the above once per process and GPU, for serving

Fail closed: `load` refuses a build whose generated C or table is not the one its identity records,
`check_table` raises `DeviceTableMismatch` with the number of differing decisions and the first few,
decoded, and `decide` refuses tensors that are not what the kernels read. The outputs equal the CPU
library's batch entries (`elpis.accept.batch`) byte for byte, codes included: invalid decisions get the
glue's negative codes, computed on the GPU, so a round pipeline can decide without a host round trip.

Stack: the generated C has no recursion (the code generator emits self tail calls as loops; see
elpis/bend/PROOF_BOUNDARY.md), so each kernel is one frame that ptxas sizes and nothing calls out:
608 bytes for the tree kernel, 576 for masks, 144 for chain (sm_86 and sm_90). Before the loops the
chain and tree kernels recursed once per row, the deepest chain was bounded at 3664 bytes and the
limit was raised to 4 KiB (about 1.1 GB reserved on an H200, 0.5 GB on an RTX 3090). Now everything
fits CUDA's 1 KiB default per-thread limit, so no limit is raised: the first decision on a GPU only
makes sure the context's limit is at least STACK_BYTES (raising it if something lowered it).
tests/accept/test_device_acceptor.py requires, from ptxas' frame sizes and the PTX call graph, that
no kernel recurses and that the deepest call chain fits STACK_BYTES.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elpis import nvcc
from elpis.accept import abi, identity, loader, tablefile
from elpis.accept.table import SECTIONS, Section
from elpis.paths import ACCEPT_BUILD_DIR, REPO_ROOT

SOURCE = REPO_ROOT / "ext" / "accept_device.cu"
KINDS = ("chain", "tree", "masks")
CELLS: dict[str, int] = {"chain": abi.CHAIN_CELLS, "tree": abi.TREE_CELLS, "masks": abi.MASKS_CELLS}
# Per-thread stack the kernels may use: CUDA's default limit (see the module docstring); the test
# derives the need from ptxas and requires it to fit.
STACK_BYTES = 1024
# What the library reports for elpis_accept_device_constant(i), i = 0..5.
DEVICE_CONSTANTS = (
    ("ELPIS_GLUE_ABI", abi.GLUE_ABI),
    ("ELPIS_CHAIN_CELLS", abi.CHAIN_CELLS),
    ("ELPIS_TREE_CELLS", abi.TREE_CELLS),
    ("ELPIS_MASKS_CELLS", abi.MASKS_CELLS),
    ("ELPIS_MAX_ROWS", abi.MAX_ROWS),
    ("ELPIS_BUDGET_MAX", abi.BUDGET_MAX),
)
EXAMPLES = 5  # mismatching decisions decoded in a DeviceTableMismatch message

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "elpis_accept_device_constant": (ctypes.c_int64, [ctypes.c_int32]),
    "elpis_accept_device_ensure_stack": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
    "elpis_accept_device_chain": (ctypes.c_int, [ctypes.c_int, _P, _I64, _P, _P]),
    "elpis_accept_device_tree": (ctypes.c_int, [ctypes.c_int, _P, _I64, _P, _P, _P]),
    "elpis_accept_device_masks": (ctypes.c_int, [ctypes.c_int, _P, _I64, _P, _P, _P, _P]),
    "elpis_accept_device_error": (ctypes.c_char_p, [ctypes.c_int]),
    "elpis_accept_host_chain": (None, [_P, _I64, _P]),
    "elpis_accept_host_tree": (None, [_P, _I64, _P, _P]),
    "elpis_accept_host_masks": (None, [_P, _I64, _P, _P, _P]),
}

Outputs = dict[str, np.ndarray]


class DeviceAcceptorError(RuntimeError):
    """The device acceptor cannot be built, loaded or launched, or was given unusable input."""


class DeviceTableMismatch(DeviceAcceptorError):
    """Decisions made on the GPU differ from the reference table."""

    def __init__(self, mismatches: int, total: int, examples: list[str]) -> None:
        lines = "\n  ".join(examples)
        super().__init__(
            f"{mismatches} of {total} decisions differ from the reference table; first:\n  {lines}"
        )
        self.mismatches = mismatches
        self.total = total
        self.examples = examples


# --- the build this library is compiled from ---------------------------------------------------------


def verify_build(build_dir: Path = ACCEPT_BUILD_DIR) -> dict[str, Any]:
    """The build's identity, after checking that the generated C and the table are the ones it records
    (and the table the pinned one). The full admission (sources, toolchain, CPU table re-run) is
    `elpis.accept.admitted()`; this is what the device build itself reads."""
    path = Path(build_dir) / identity.IDENTITY
    if not path.is_file():
        raise RuntimeError("acceptor not built: run make build")
    try:
        ident = json.loads(path.read_bytes())
    except ValueError as exc:
        raise DeviceAcceptorError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(ident, dict) or set(ident) != identity.KEYS:
        raise DeviceAcceptorError(f"{path}: not an acceptor identity")
    if identity.digest(ident) != ident["identity_sha256"]:
        raise DeviceAcceptorError(f"{path}: identity_sha256 does not recompute (the identity was edited)")
    for name in (identity.GENERATED_C, identity.GENERATED_H, identity.TABLE):
        actual = identity.sha256_file(Path(build_dir) / name)
        if actual != ident["artifacts"].get(name):
            raise DeviceAcceptorError(f"{name}: SHA-256 {actual} is not the one the build's identity records")
    if ident["artifacts"][identity.TABLE] != loader.TABLE_SHA256:
        raise DeviceAcceptorError(f"{identity.TABLE} is not the pinned table {loader.TABLE_SHA256}")
    return ident


# --- the library -------------------------------------------------------------------------------------


class DeviceAcceptor:
    """A loaded ext/accept_device.cu library (one per generated C it was compiled from)."""

    def __init__(self, lib: ctypes.CDLL, generated_dir: Path) -> None:
        self.lib = lib
        self.generated_dir = Path(generated_dir)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        for index, (name, expected) in enumerate(DEVICE_CONSTANTS):
            actual = lib.elpis_accept_device_constant(index)
            if actual != expected:
                raise DeviceAcceptorError(f"device library reports {name} = {actual}, expected {expected}")
        self._stack_ready: set[int] = set()

    @classmethod
    def load(
        cls, generated_dir: Path = ACCEPT_BUILD_DIR, *, arch: str | None = None, out_dir: Path | None = None
    ) -> DeviceAcceptor:
        """Compile (cached) and load the library for `arch` (default: the current GPU).

        `generated_dir` is build/accept, whose identity is checked first; tests pass a directory holding a
        deliberately mutated acceptors.c/.h, which comes first on the include path."""
        generated_dir = Path(generated_dir).resolve()
        if generated_dir == ACCEPT_BUILD_DIR.resolve():
            verify_build(generated_dir)
        elif not (generated_dir / identity.GENERATED_C).is_file():
            raise DeviceAcceptorError(f"{generated_dir} holds no {identity.GENERATED_C}")
        kwargs: dict[str, Any] = {"include_dirs": (generated_dir,), "arch": arch}
        if out_dir is not None:
            kwargs["out_dir"] = Path(out_dir)
        try:
            lib = nvcc.load(SOURCE, **kwargs)  # `arch` None: the current GPU's
        except nvcc.NvccError as exc:
            raise DeviceAcceptorError(str(exc)) from exc
        return cls(lib, generated_dir)

    # ---------------------------------------------------------------- GPU
    def _check_error(self, code: int, what: str) -> None:
        if code != 0:
            message = self.lib.elpis_accept_device_error(code).decode(errors="replace")
            raise DeviceAcceptorError(f"{what}: CUDA error {code} ({message})")

    def _ensure_stack(self, device: int) -> None:
        if device not in self._stack_ready:
            self._check_error(
                self.lib.elpis_accept_device_ensure_stack(device, STACK_BYTES), "checking the stack limit"
            )
            self._stack_ready.add(device)

    def decide(self, kind: str, cells: Any, out: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Decide every row of `cells` (a contiguous int64 CUDA tensor of shape (n, CELLS[kind])) on its
        device, on the current stream, without synchronizing. Returns CUDA tensors: `codes` (int32), and
        `paths` (int64 holding the uint64 packing) for trees, `depth` (uint8, (n, 16)) and `ancestors`
        (int16 holding the uint16 masks, (n, 16)) for masks, zero rows where a masks decision is refused.
        `out` may hold preallocated outputs (any of them; the others are allocated)."""
        import torch

        if kind not in KINDS:
            raise ValueError(f"unknown decision kind {kind!r} (expected one of {', '.join(KINDS)})")
        if not isinstance(cells, torch.Tensor):
            raise ValueError(f"cells must be a torch tensor, got {type(cells).__name__}")
        if cells.dtype != torch.int64:
            raise ValueError(f"cells must be int64 (the glue's packed layout), got {cells.dtype}")
        if cells.dim() != 2 or cells.shape[1] != CELLS[kind]:
            raise ValueError(f"{kind} cells must have shape (n, {CELLS[kind]}), got {tuple(cells.shape)}")
        if not cells.is_contiguous():
            raise ValueError("cells must be contiguous")
        if cells.device.type != "cuda":
            raise ValueError(f"cells must be on a CUDA device, got {cells.device}")
        n, dev = cells.shape[0], cells.device
        wanted = {"codes": ((n,), torch.int32)}
        if kind == "tree":
            wanted["paths"] = ((n,), torch.int64)
        if kind == "masks":
            wanted["depth"] = ((n, abi.MAX_ROWS), torch.uint8)
            wanted["ancestors"] = ((n, abi.MAX_ROWS), torch.int16)
        result = {}
        for name, (shape, dtype) in wanted.items():
            given = None if out is None else out.get(name)
            if given is None:
                given = torch.empty(shape, dtype=dtype, device=dev)
            elif (
                given.shape != shape
                or given.dtype != dtype
                or given.device != dev
                or not given.is_contiguous()
            ):
                raise ValueError(
                    f"out[{name!r}] must be a contiguous {dtype} tensor of shape {shape} on {dev}"
                )
            result[name] = given
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        self._ensure_stack(index)
        stream = torch.cuda.current_stream(dev).cuda_stream
        ptrs = [result[name].data_ptr() for name in wanted]
        entry = getattr(self.lib, f"elpis_accept_device_{kind}")
        self._check_error(entry(index, cells.data_ptr(), n, *ptrs, stream), f"launching the {kind} kernel")
        return result

    def gpu_outputs(self, kind: str, cells: Any) -> Outputs:
        """`decide` on a CUDA tensor, copied back in the CPU library's dtypes (as tablefile compares)."""
        raw = self.decide(kind, cells)
        host = {name: t.cpu().numpy() for name, t in raw.items()}
        return _as_library_dtypes(kind, host)

    # ---------------------------------------------------------------- host (same code, no GPU)
    def host_outputs(self, kind: str, cells: np.ndarray) -> Outputs:
        """The same checked entries compiled for the host: lets CPU machines run the device code's logic."""
        if kind not in KINDS:
            raise ValueError(f"unknown decision kind {kind!r}")
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        if cells.ndim != 2 or cells.shape[1] != CELLS[kind]:
            raise ValueError(f"{kind} cells must have shape (n, {CELLS[kind]})")
        n = len(cells)
        out: Outputs = {"codes": np.empty(n, dtype=np.int32)}
        if kind == "tree":
            out["paths"] = np.empty(n, dtype=np.uint64)
        if kind == "masks":
            out["depth"] = np.empty((n, abi.MAX_ROWS), dtype=np.uint8)
            out["ancestors"] = np.empty((n, abi.MAX_ROWS), dtype=np.uint16)
        entry = getattr(self.lib, f"elpis_accept_host_{kind}")
        entry(cells.ctypes.data, n, *(a.ctypes.data for a in out.values()))
        return _as_library_dtypes(kind, out)

    # ---------------------------------------------------------------- the reference table
    def check_table(self, packed: PackedTable, *, on: str = "gpu") -> TableReport:
        """Run every packed decision (on the GPU, or `on="host"`) and compare with the table's expected
        outputs; raise DeviceTableMismatch naming how many differ and the first few, decoded."""
        if on not in ("gpu", "host"):
            raise ValueError("on must be 'gpu' or 'host'")
        report = TableReport(on=on)
        examples: list[str] = []
        mismatches = 0
        start = time.perf_counter()
        for section in packed.sections:
            if on == "gpu":
                got, seconds = self._timed_gpu(section)
            else:
                t0 = time.perf_counter()
                got = self.host_outputs(section.kind, section.cells)
                seconds = time.perf_counter() - t0
            bad = _differing_rows(section.expected, got)
            mismatches += len(bad)
            for row in bad[: max(0, EXAMPLES - len(examples))]:
                examples.append(describe(section, int(row), got))
            report.sections[section.name] = (len(section.cells), seconds)
        report.wall_seconds = time.perf_counter() - start
        if mismatches:
            raise DeviceTableMismatch(mismatches, report.decisions, examples)
        return report

    def _timed_gpu(self, section: PackedSection) -> tuple[Outputs, float]:
        import torch

        cells = section.device_cells
        if cells is None:
            raise DeviceAcceptorError("the table was packed without device tensors (pack_table(device=...))")
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        raw = self.decide(section.kind, cells)
        end.record()
        end.synchronize()
        host = {name: t.cpu().numpy() for name, t in raw.items()}
        return _as_library_dtypes(section.kind, host), begin.elapsed_time(end) / 1000.0


_admit_lock = threading.Lock()
_admitted: dict[int, DeviceAcceptor] = {}
_failures: dict[int, BaseException] = {}


def admitted(device_index: int | None = None) -> DeviceAcceptor:
    """The device acceptor for a GPU, admitted once per process: built from build/accept (identity
    checked), then every reference-table decision re-run on that GPU. A failure is raised again on every
    later call (no fallback), like `elpis.accept.admitted()` on the CPU."""
    import torch

    index = torch.cuda.current_device() if device_index is None else device_index
    found = _admitted.get(index)
    if found is not None:
        return found
    with _admit_lock:
        if index in _failures:
            raise _failures[index]
        if index not in _admitted:
            try:
                with torch.cuda.device(index):
                    acceptor = DeviceAcceptor.load()
                    acceptor.check_table(pack_table(device=torch.device("cuda", index)))
            except (DeviceAcceptorError, nvcc.NvccError) as exc:
                _failures[index] = exc
                raise
            _admitted[index] = acceptor
    return _admitted[index]


def _as_library_dtypes(kind: str, out: Outputs) -> Outputs:
    """codes as int32 (full range, so a wild code is reported, not wrapped), paths as uint64, ancestors
    as uint16: the dtypes of tablefile.library_outputs but without narrowing the codes."""
    result: Outputs = {"codes": np.asarray(out["codes"], dtype=np.int32)}
    if kind == "tree":
        result["paths"] = np.ascontiguousarray(out["paths"]).view(np.uint64)
    if kind == "masks":
        result["depth"] = np.ascontiguousarray(out["depth"]).view(np.uint8)
        result["ancestors"] = np.ascontiguousarray(out["ancestors"]).view(np.uint16)
    return result


# --- packing the reference table ---------------------------------------------------------------------


@dataclass
class PackedSection:
    name: str
    kind: str
    cells: np.ndarray  # (n, CELLS[kind]) int64, the table's inputs
    expected: Outputs  # the table's stored outputs (codes int8, paths/depth/ancestors)
    device_cells: Any = None  # the same cells as a CUDA tensor, when packed for a device


@dataclass
class PackedTable:
    sections: list[PackedSection]

    @property
    def decisions(self) -> int:
        return sum(len(s.cells) for s in self.sections)


@dataclass
class TableReport:
    on: str
    sections: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (decisions, seconds)
    wall_seconds: float = 0.0

    @property
    def decisions(self) -> int:
        return sum(n for n, _ in self.sections.values())

    @property
    def run_seconds(self) -> float:
        """Time deciding (GPU: kernel time between CUDA events; host: the calls)."""
        return sum(s for _, s in self.sections.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": f"accept_table_check_{self.on}",
            "decisions": self.decisions,
            "run_seconds": round(self.run_seconds, 6),
            "decisions_per_second": round(self.decisions / self.run_seconds) if self.run_seconds else None,
            "wall_seconds": round(self.wall_seconds, 3),
            "sections": {k: n for k, (n, _) in self.sections.items()},
        }


def section_cells(section: Section) -> np.ndarray:
    """Every input of a table section as one (n, CELLS) int64 array, in table order."""
    blocks = list(section.blocks())
    cells = np.concatenate(blocks) if blocks else np.zeros((0, CELLS[section.kind]), dtype=np.int64)
    if len(cells) != section.rows:
        raise DeviceAcceptorError(
            f"section {section.name}: made {len(cells)} decisions, expected {section.rows}"
        )
    return cells


def pack_table(
    device: Any = None,
    table_path: Path = ACCEPT_BUILD_DIR / identity.TABLE,
    sections: Callable[[Section], bool] | None = None,
) -> PackedTable:
    """The reference table's inputs and expected outputs (the pinned build/accept/table.bin), optionally
    also as CUDA tensors on `device`; `sections` may select a subset (tests)."""
    actual = identity.sha256_file(table_path)
    if actual != loader.TABLE_SHA256:
        raise DeviceAcceptorError(f"{table_path}: SHA-256 {actual} is not the pinned {loader.TABLE_SHA256}")
    try:
        arrays = tablefile.read(table_path)
    except tablefile.TableMismatch as exc:
        raise DeviceAcceptorError(str(exc)) from exc
    packed = []
    for section in SECTIONS:
        if sections is not None and not sections(section):
            continue
        cells = section_cells(section)
        expected = {
            name: np.asarray(arrays[section.name, name]) for name, _, _ in tablefile.OUTPUTS[section.kind]
        }
        on_device = None
        if device is not None:
            import torch

            on_device = torch.from_numpy(cells).to(device)
        packed.append(PackedSection(section.name, section.kind, cells, expected, on_device))
    return PackedTable(packed)


def _differing_rows(expected: Outputs, got: Outputs) -> np.ndarray:
    n = len(expected["codes"])
    differs = np.zeros(n, dtype=bool)
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape:
            return np.arange(n)
        if name == "codes":
            differs |= have.astype(np.int64) != want.astype(np.int64)
        else:
            differs |= (have != want).reshape(n, -1).any(axis=1)
    return np.flatnonzero(differs)


# --- decoding (messages) -----------------------------------------------------------------------------


def decode_inputs(kind: str, row: np.ndarray) -> str:
    row = [int(v) for v in row]
    if kind == "chain":
        k, ns = row[abi.CHAIN_K], row[abi.CHAIN_NSTOPS]
        draft = row[abi.CHAIN_DRAFT : abi.CHAIN_DRAFT + max(0, min(k, abi.MAX_DRAFT))]
        target = row[abi.CHAIN_TARGET : abi.CHAIN_TARGET + max(0, min(k + 1, abi.MAX_ROWS))]
        stops = row[abi.CHAIN_STOPS : abi.CHAIN_STOPS + max(0, min(ns, abi.MAX_STOPS))]
        return f"chain k={k} draft={draft} target={target} stops={stops} budget={row[abi.CHAIN_BUDGET]}"
    if kind == "tree":
        rows, ns = row[abi.TREE_ROWS], row[abi.TREE_NSTOPS]
        used = max(0, min(rows, abi.MAX_ROWS))
        return (
            f"tree rows={rows} parents={row[abi.TREE_PARENTS : abi.TREE_PARENTS + used]} "
            f"draft={row[abi.TREE_DRAFT : abi.TREE_DRAFT + used]} "
            f"target={row[abi.TREE_TARGET : abi.TREE_TARGET + used]} "
            f"stops={row[abi.TREE_STOPS : abi.TREE_STOPS + max(0, min(ns, abi.MAX_STOPS))]} "
            f"budget={row[abi.TREE_BUDGET]}"
        )
    rows = row[abi.MASKS_ROWS]
    used = max(0, min(rows, abi.MAX_ROWS))
    return f"masks rows={rows} parents={row[abi.MASKS_PARENTS : abi.MASKS_PARENTS + used]}"


def decode_outputs(kind: str, out: Outputs, i: int) -> str:
    code = int(out["codes"][i])
    if code < 0 or (kind != "masks" and code < 2):
        return f"error {code} ({abi.ERROR_REASONS.get(code, 'unknown code')})"
    if kind == "masks":
        ancestors = [hex(int(a)) for a in out["ancestors"][i].tolist()]
        return f"depth={out['depth'][i].tolist()} ancestors={ancestors}"
    count, ends = code >> 1, bool(code & 1)
    text = f"count={count} ends={ends}"
    if kind == "tree":
        packed = int(out["paths"][i])
        text += f" rows={[(packed >> (4 * j)) & 0xF for j in range(min(count, abi.MAX_ROWS))]}"
    return text


def describe(section: PackedSection, i: int, got: Outputs) -> str:
    return (
        f"{section.name} #{i}: {decode_inputs(section.kind, section.cells[i])}: "
        f"table {decode_outputs(section.kind, section.expected, i)}, "
        f"device {decode_outputs(section.kind, got, i)}"
    )
