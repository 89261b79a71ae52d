"""`elpis build`: prove, generate C, scan it, compile it with the glue, check the table, write the identity,
admit the result with the server's own loader, and only then move it into place.

Fail closed: every step runs into a fresh staging directory next to the output; the first failing step
stops the build with a BuildError naming its layer ("prove", "generate", "c-scan", "compile", "table",
"identity", "admission"), and the previous build (if any) is left untouched. Admission later re-checks
everything against the sources, so a stale previous build still cannot be served. Three steps also write
kernel headers into the root's `build/kernels/` (the CUDA include directory): the tree-verify attention
schedule, the GDN tree plan and the EXL3 GEMM schedule, each only once a host build of it matches the Bend
interpreter (a failure is a "generate" or "table" error).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from elpis.accept import cscan, identity, loader, tablefile
from elpis.paths import ACCEPT_BUILD_DIR, REPO_ROOT

LAYERS = ("prove", "generate", "c-scan", "compile", "table", "identity", "admission")
CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden")
LDFLAGS = ("-shared",)


class BuildError(Exception):
    """A build step failed; `layer` names the check that caught it."""

    def __init__(self, layer: str, message: str) -> None:
        if layer not in LAYERS:
            raise ValueError(f"unknown build layer {layer!r}")
        super().__init__(f"[{layer}] {message}")
        self.layer = layer
        self.message = message


@dataclass
class BuildResult:
    out: Path
    identity: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)


class _Steps:
    """Progress display (rich bars on a terminal, one line per step in a log) and per-step timing;
    silent when no console is given."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.seconds: dict[str, float] = {}
        self.progress = (
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            if console is not None and console.is_terminal
            else None
        )

    @contextmanager
    def step(self, layer: str, description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        task = self.progress.add_task(description, total=total) if self.progress else None
        log = self.console if self.console is not None and self.progress is None else None
        if log is not None:
            log.print(f"[{layer}] {description} ...", markup=False, highlight=False)
        start = time.perf_counter()

        def advance(n: int) -> None:
            if self.progress is not None and task is not None:
                self.progress.advance(task, n)

        try:
            yield advance
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[layer] = self.seconds.get(layer, 0.0) + elapsed
            if self.progress is not None and task is not None:
                self.progress.update(task, total=total or 1, completed=total or 1)
            if log is not None:
                log.print(f"[{layer}] done in {elapsed:.1f}s", markup=False, highlight=False)

    def __enter__(self) -> _Steps:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def build(
    root: Path = REPO_ROOT,
    out: Path = ACCEPT_BUILD_DIR,
    *,
    console: Console | None = None,
    before_admission: Callable[[Path], None] | None = None,
    cc: str | None = None,
) -> BuildResult:
    """Build the acceptor from `root` into `out`. `before_admission` (tests only) may tamper with the
    staged directory just before admission, to show that admission catches it."""
    root, out = Path(root).resolve(), Path(out).resolve()
    cc = cc or os.environ.get("CC", "gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-staging-", dir=out.parent))
        work = Path(tempfile.mkdtemp(prefix="elpis-accept-build-"))
        try:
            with _Steps(console) as steps:
                ident = _build_into(root, staging, work, cc, steps, before_admission)
            _move_into_place(staging, out)
            return BuildResult(out, ident, steps.seconds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """One build of `out` at a time (several `make test` runs may start together). Holding the lock, any
    staging or old directory left next to `out` belongs to a build that was killed: remove it."""
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for leftover in out.parent.glob(f".{out.name}-*-*"):
                if leftover.is_dir() and leftover.name.split("-")[1] in ("staging", "old"):
                    shutil.rmtree(leftover, ignore_errors=True)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_into(
    root: Path,
    staging: Path,
    work: Path,
    cc: str,
    steps: _Steps,
    before_admission: Callable[[Path], None] | None,
) -> dict[str, Any]:
    sources = identity.source_hashes(root)  # what this build reads; re-checked before it is recorded
    with steps.step("prove", "prove every law (laws discharged)") as advance:
        certificates = _prove(root, advance)
        (staging / identity.CERTIFICATES).write_bytes(identity.canonical(certificates))

    for name, mismatch, label in KERNEL_HEADERS:
        with steps.step("generate", f"{label} (checked against the interpreter)"):
            _kernel_header(name, mismatch, label, root, root / "build" / "kernels", cc)

    with steps.step("generate", "generate C from the implementation modules"):
        generated = _generate(root, work / "generated")
        for name, path in generated.items():
            shutil.copyfile(path, staging / name)

    with steps.step("c-scan", "scan the generated C"):
        try:
            problems = cscan.scan(staging / identity.GENERATED_C, staging / identity.GENERATED_H, cc=cc)
        except cscan.ScanError as exc:
            raise BuildError("c-scan", str(exc)) from exc
        if problems:
            raise BuildError("c-scan", "generated C violates the token rules:\n  " + "\n  ".join(problems))

    with steps.step("compile", "compile acceptors + glue + cffi wrapper"):
        _compile(root, staging, work / "objects", cc)

    total = tablefile.total_decisions()
    with steps.step("table", "table check (oracle vs library)", total=total) as advance:
        try:
            ffi, lib = loader.load_library(staging / loader.LIBRARY)
        except Exception as exc:  # an unloadable library is a compile-layer failure
            raise BuildError("compile", f"the compiled library does not load: {exc}") from exc
        try:
            tablefile.write_checked(staging / identity.TABLE, ffi, lib, advance)
        except tablefile.TableMismatch as exc:
            raise BuildError("table", f"library disagrees with the oracle: {exc}") from exc
        table_hash = identity.sha256_file(staging / identity.TABLE)
        if table_hash != loader.TABLE_SHA256:
            raise BuildError(
                "table",
                f"table SHA-256 {table_hash} is not the pinned {loader.TABLE_SHA256} "
                "(elpis/accept/loader.py TABLE_SHA256): the table definition or the oracle changed",
            )

    with steps.step("identity", "write identity.json"):
        ident = _identity(root, staging, cc, certificates, table_hash)
        if ident["sources"] != sources:
            changed = sorted(
                set(sources) ^ set(ident["sources"])
                | {
                    name
                    for name in set(sources) & set(ident["sources"])
                    if sources[name] != ident["sources"][name]
                }
            )
            raise BuildError("identity", f"sources changed while building (build again): {changed}")
        (staging / identity.IDENTITY).write_text(json.dumps(ident, indent=2, sort_keys=True) + "\n")

    with steps.step("admission", "admit with the server's loader"):
        if before_admission is not None:
            before_admission(staging)
        try:
            loader.admit(staging, root)
        except loader.AdmissionError as exc:
            raise BuildError("admission", str(exc)) from exc
    return ident


def _prove(root: Path, advance: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    try:
        from elpis.bend.prove import prove_all
    except ImportError as exc:
        raise BuildError("prove", f"the prover is not available: {exc}") from exc
    # The contract is prove_all(root); a progress hook is used when the prover offers one.
    hook = (
        {"progress": lambda _: advance(1)}
        if advance and "progress" in signature(prove_all).parameters
        else {}
    )
    report = prove_all(root, **hook)
    if not report.ok:
        failures = "\n  ".join(report.failures) or "(no failure named)"
        raise BuildError("prove", f"laws that do not check:\n  {failures}")
    if report.failures:
        raise BuildError("prove", "report says ok but names failures: " + "; ".join(report.failures))
    try:
        identity.canonical(report.certificates)
    except TypeError as exc:
        raise BuildError("prove", f"certificates are not JSON-serialisable: {exc}") from exc
    return list(report.certificates)


# The kernel headers compiled from proved Bend programs: (module of elpis.bend, its mismatch error, label).
# Each `build` writes its header only once a host build of it matches the Bend interpreter on the module's
# whole table (and, for the GDN plan, every plan replays without breaking the kernel's walk; for the
# scalar schedules, the interpreter matches the closed forms inside the law domain).
KERNEL_HEADERS: tuple[tuple[str, str, str], ...] = (
    ("schedule", "ScheduleMismatch", "verify-attention schedule header"),
    ("gdn_plan", "PlanMismatch", "GDN tree plan header"),
    ("gemm_schedule", "ScheduleMismatch", "GEMM schedule header"),
    ("gdn_ba_schedule", "ScheduleMismatch", "GDN gate projections' schedule header"),
    ("row_spans", "ScheduleMismatch", "logit rows' span header"),
    ("row_scan_schedule", "ScheduleMismatch", "schedule inside a logit row's span header"),
)


def _kernel_header(name: str, mismatch: str, label: str, root: Path, kernels_dir: Path, cc: str) -> None:
    """Compile one kernel header (KERNEL_HEADERS) into build/kernels/: a table difference is a `table`
    failure, any other refusal of the generator a `generate` failure."""
    import importlib

    from elpis.bend.errors import BendError

    module = importlib.import_module(f"elpis.bend.{name}")
    try:
        module.build(kernels_dir, root, cc)
    except getattr(module, mismatch) as exc:
        raise BuildError("table", f"{label}: {exc}") from exc
    except BendError as exc:
        raise BuildError("generate", f"{label}: {exc}") from exc


def _generate(root: Path, out_dir: Path) -> dict[str, Path]:
    try:
        from elpis.bend.codegen import generate
    except ImportError as exc:
        raise BuildError("generate", f"the code generator is not available: {exc}") from exc
    from elpis.bend.errors import BendError

    out_dir.mkdir(parents=True)
    try:
        paths = [Path(p) for p in generate(out_dir, root)]
    except BendError as exc:
        # The generator runs its own token scan over the C it renders and refuses to write it; that
        # refusal is a C-scan verdict, so it is reported as that layer.
        layer = "c-scan" if "token discipline" in str(exc) else "generate"
        raise BuildError(layer, str(exc)) from exc
    names = {p.name: p for p in paths}
    expected = {identity.GENERATED_H, identity.GENERATED_C}
    if set(names) != expected or len(paths) != len(expected):
        raise BuildError("generate", f"generator wrote {sorted(names)}, expected {sorted(expected)}")
    return names


def _load_ffi_definition(root: Path) -> Any:
    path = root / "ext" / "build_ffi.py"
    spec = importlib.util.spec_from_file_location("elpis_accept_build_ffi", path)
    if spec is None or spec.loader is None:
        raise BuildError("compile", f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.MODULE_NAME != loader.MODULE_NAME:
        raise BuildError(
            "compile", f"{path} builds {module.MODULE_NAME!r}, the loader expects {loader.MODULE_NAME!r}"
        )
    return module.make_ffi()


def _compile(root: Path, staging: Path, objects: Path, cc: str) -> None:
    objects.mkdir(parents=True)
    try:
        ffi = _load_ffi_definition(root)
        with contextlib.redirect_stdout(io.StringIO()):  # cffi announces "generating ..." on stdout
            ffi.emit_c_code(str(staging / identity.WRAPPER_C))
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError("compile", f"cffi definition ext/build_ffi.py failed: {exc}") from exc
    includes = [f"-I{staging}", f"-I{root / 'ext'}", f"-I{sysconfig.get_paths()['include']}"]
    units = [staging / identity.GENERATED_C, root / "ext" / "elpis_glue.c", staging / identity.WRAPPER_C]
    built = []
    for unit in units:
        obj = objects / (unit.stem + ".o")
        # Compiled from its own directory by bare name, so no build path ends up in the library.
        _run_compiler([cc, *CFLAGS, *includes, "-c", unit.name, "-o", str(obj)], unit.name, cwd=unit.parent)
        built.append(obj.name)
    _run_compiler([cc, *LDFLAGS, "-o", str(staging / loader.LIBRARY), *built], loader.LIBRARY, cwd=objects)


def _run_compiler(command: list[str], what: str, cwd: Path) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        raise BuildError("compile", f"{what}: {' '.join(command)}\n{result.stderr.strip()}")


def _identity(
    root: Path, staging: Path, cc: str, certificates: list[dict[str, Any]], table_hash: str
) -> dict[str, Any]:
    try:
        ident: dict[str, Any] = {
            "schema": identity.SCHEMA,
            "toolchain": identity.toolchain(cc),
            "flags": {"compile": list(CFLAGS), "link": list(LDFLAGS)},
            "sources": identity.source_hashes(root),
            "artifacts": {name: identity.sha256_file(staging / name) for name in sorted(loader.ARTIFACTS)},
            "table_sha256": table_hash,
            "certificates": {
                "count": len(certificates),
                "sha256": identity.sha256_file(staging / identity.CERTIFICATES),
            },
        }
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError("identity", str(exc)) from exc
    ident["identity_sha256"] = identity.digest(ident)
    return ident


def _move_into_place(staging: Path, out: Path) -> None:
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
        os.rename(out, old / out.name)
    os.chmod(staging, 0o755)  # mkdtemp makes it private; the build is meant to be read by the server
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- command line -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root to build from")
    parser.add_argument(
        "--out", type=Path, default=ACCEPT_BUILD_DIR, help="output directory (replaced on success)"
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    start = time.perf_counter()
    try:
        result = build(args.root, args.out, console=console)
    except BuildError as exc:
        console.print(f"[bold red]build failed[/] at layer [bold]{exc.layer}[/]: {escape(exc.message)}")
        return 1
    elapsed = time.perf_counter() - start
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items())
    console.print(f"[bold green]acceptor built[/] in {elapsed:.1f}s ({steps}) -> {result.out}")
    console.print(f"identity_sha256 {result.identity['identity_sha256']}")
    return 0
