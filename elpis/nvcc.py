"""Compile our CUDA sources with nvcc, for the RTX 3090 (sm_86) and the H200 (sm_90), from one source.

One way to build every kernel of the project: `compile_shared` builds a shared library loaded with ctypes
(no Python extension, so it does not depend on the Python or torch ABI, and a small kernel builds in
seconds), cached under `build/cuda/` by a hash of the source tree, the flags and the compiler version.
`check_ampere_only` is the rule the README states: the code compiles for sm_86 (so it uses only Ampere
instructions) and its sm_90 build contains none of Hopper's own instructions (wgmma, TMA bulk copies, ...),
so the H200 measures the same code the 3090 runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from elpis.paths import REPO_ROOT

ARCHS: tuple[str, ...] = ("sm_86", "sm_90")
BUILD_DIR = REPO_ROOT / "build" / "cuda"
# Include directories every kernel may use: hand-written headers and generated (proven) headers.
INCLUDE_DIRS: tuple[Path, ...] = (
    REPO_ROOT / "patches" / "kernels",
    REPO_ROOT / "ext",
    REPO_ROOT / "build" / "accept",
    REPO_ROOT / "build" / "kernels",
)
# No fast math: exactness against the op a kernel replaces is a requirement, and the flags are fixed so
# that a result never depends on who built the library.
BASE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-lineinfo", "--fmad=true", "-Xcompiler", "-fPIC")
# PTX instructions an RTX 3090 does not have (Hopper and later only).
HOPPER_ONLY_PTX: tuple[str, ...] = (
    "wgmma.",
    "cp.async.bulk",
    "cp.reduce.async.bulk",
    "setmaxnreg",
    "stmatrix",
    "multimem.",
    "elect.sync",
    "mbarrier.expect_tx",
    "mbarrier.try_wait",
    "barrier.cluster",
    "%cluster",
)


class NvccError(RuntimeError):
    """nvcc is missing or refused a source; the message carries the compiler's own output."""


def nvcc_path() -> Path | None:
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return home if home.exists() else None


def _require_nvcc() -> Path:
    path = nvcc_path()
    if path is None:
        raise NvccError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    return path


def nvcc_version() -> str:
    out = subprocess.run([str(_require_nvcc()), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def device_arch() -> str:
    """The sm_XY of the current CUDA device (torch is imported only here)."""
    import torch

    if not torch.cuda.is_available():
        raise NvccError("no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _flags(arch: str, include_dirs: Iterable[Path], defines: Mapping[str, str | int]) -> list[str]:
    if not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise ValueError(f"bad CUDA architecture {arch!r} (expected sm_86, sm_90, ...)")
    flags = [*BASE_FLAGS, f"-arch={arch}"]
    flags += [f"-I{d}" for d in (*include_dirs, *INCLUDE_DIRS)]
    flags += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return flags


def _digest(source: Path, flags: Sequence[str], mode: str) -> str:
    h = hashlib.sha256()
    h.update(nvcc_version().encode())
    h.update(mode.encode())
    h.update("\0".join(flags).encode())
    h.update(source.read_bytes())
    # Headers are part of the input: hash every header in the include directories.
    for flag in flags:
        if flag.startswith("-I") and Path(flag[2:]).is_dir():
            for header in sorted(Path(flag[2:]).glob("*.h")) + sorted(Path(flag[2:]).glob("*.cuh")):
                h.update(header.name.encode())
                h.update(header.read_bytes())
            for cfile in sorted(Path(flag[2:]).glob("*.c")):
                h.update(cfile.name.encode())
                h.update(cfile.read_bytes())
    return h.hexdigest()[:20]


def _run(cmd: list[str], source: Path) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise NvccError(f"nvcc failed on {source}:\n{done.stderr.strip() or done.stdout.strip()}")


def compile_to(
    source: Path,
    mode: str,
    *,
    arch: str,
    include_dirs: Iterable[Path] = (),
    defines: Mapping[str, str | int] | None = None,
    out_dir: Path = BUILD_DIR,
) -> Path:
    """Compile `source` to a `shared` library, a `cubin` or `ptx`; cached by content. Returns the output."""
    suffix = {"shared": ".so", "cubin": ".cubin", "ptx": ".ptx"}.get(mode)
    if suffix is None:
        raise ValueError(f"unknown nvcc mode {mode!r}")
    source = Path(source).resolve()
    flags = _flags(arch, include_dirs, defines or {})
    out = out_dir / f"{source.stem}-{arch}-{_digest(source, flags, mode)}{suffix}"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    # per process and thread: two threads of one process may build the same output at once
    tmp = out.with_suffix(out.suffix + f".tmp{os.getpid()}-{threading.get_ident()}")
    kind = {"shared": ["-shared"], "cubin": ["-cubin"], "ptx": ["-ptx"]}[mode]
    _run([str(_require_nvcc()), *flags, *kind, str(source), "-o", str(tmp)], source)
    tmp.replace(out)  # atomic: a concurrent build never sees a half-written library
    return out


def compile_shared(source: Path, **kwargs: object) -> Path:
    return compile_to(source, "shared", **kwargs)  # type: ignore[arg-type]


def set_signatures(
    lib: ctypes.CDLL, entries: Mapping[str, Sequence[type]], restypes: Mapping[str, type] | None = None
) -> ctypes.CDLL:
    """Give each C entry of a kernel library (GPU or emulated build) its ctypes argument types, and its result
    type (int unless `restypes` names another): ctypes checks nothing against the C prototype, so every
    binding declares them (tests/kernels/test_c_signatures.py compares them with the sources)."""
    for name, argtypes in entries.items():
        entry = getattr(lib, name)
        entry.argtypes = list(argtypes)
        entry.restype = (restypes or {}).get(name, ctypes.c_int)
    return lib


def check_block(lib: ctypes.CDLL, entry: str, threads: int, who: str) -> ctypes.CDLL:
    """Refuse a build whose block (C entry `entry`, no arguments, returning its threads) is not `threads`: a
    test build may be made with another block, and the bindings size nothing by it but must know which."""
    got = getattr(lib, entry)()
    if got != threads:
        raise RuntimeError(f"{who} kernel: {got} threads a block, expected {threads}")
    return lib


def load(source: Path, **kwargs: object) -> ctypes.CDLL:
    """Build `source` for the current device and load it."""
    arch = kwargs.pop("arch", None) or device_arch()
    return ctypes.CDLL(str(compile_shared(source, arch=arch, **kwargs)))


def hopper_only_instructions(ptx: str) -> list[str]:
    """The Hopper-only instructions found in a PTX text (comments ignored)."""
    code = "\n".join(line.split("//", 1)[0] for line in ptx.splitlines())
    return sorted({ins for ins in HOPPER_ONLY_PTX if ins in code})


def check_ampere_only(
    source: Path, *, include_dirs: Iterable[Path] = (), defines: Mapping[str, str | int] | None = None
) -> None:
    """Raise NvccError unless `source` builds for sm_86 and sm_90 with Ampere instructions only."""
    dirs = tuple(include_dirs)
    # The first architecture builds the whole library: a cubin alone skips nvcc's host pass, which refuses
    # code the device pass accepts (a call no host declaration covers; device call 85 met one).
    for mode, arch in zip(("shared", "cubin"), ARCHS, strict=True):
        compile_to(source, mode, arch=arch, include_dirs=dirs, defines=defines)
    ptx = compile_to(source, "ptx", arch="sm_90", include_dirs=dirs, defines=defines).read_text()
    found = hopper_only_instructions(ptx)
    if found:
        raise NvccError(f"{source}: its sm_90 build uses instructions an RTX 3090 lacks: {', '.join(found)}")


# A kernel longer than this many PTX instructions does not fit the SM's instruction cache once compiled (about
# 16 bytes of machine code per instruction against ~128 KB of cache): every pass over its hot loop then
# fetches code from L2. The tree attention once inlined its slot map at every unrolled use and reached
# ~40,000 PTX instructions (~47,500 in SASS); at 5,400 it fits.
MAX_KERNEL_PTX_INSTRUCTIONS = 12_000

_PTX_ENTRY = re.compile(r"^(?:\.(?:visible|weak)\s+)?\.entry\s+([\w$]+)\s*\(", re.MULTILINE)
_PTX_INSTRUCTION = re.compile(r"^\s+(?:@!?%\w+\s+)?[a-z][\w.:]*(?:\s[^;]*)?;", re.MULTILINE)


def ptx_entry_instructions(ptx: str) -> dict[str, int]:
    """Instructions of each kernel entry (`.entry`) of a PTX text: the body's lines that end in `;` and
    start with an opcode (directives, labels and declarations are not counted)."""
    counts: dict[str, int] = {}
    for match in _PTX_ENTRY.finditer(ptx):
        start = ptx.index("{", match.end())
        end = ptx.find("\n}", start)
        body = ptx[start : end if end >= 0 else len(ptx)]
        counts[match.group(1)] = sum(
            1 for m in _PTX_INSTRUCTION.finditer(body) if not m.group(0).lstrip().startswith(".")
        )
    return counts


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([\w$]+)' for '(sm_\d+a?)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")


def ptxas_usage(ptx: Path, arch: str) -> dict[str, dict[str, int]]:
    """What `ptxas -v` reports for each kernel entry of a PTX file built for `arch`: registers, and bytes of
    spill stores and loads."""
    ptxas = _require_nvcc().parent / "ptxas"
    done = subprocess.run(
        [str(ptxas), f"-arch={arch}", "-v", str(ptx), "-o", os.devnull], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise NvccError(f"ptxas failed on {ptx}:\n{done.stderr.strip()}")
    usage: dict[str, dict[str, int]] = {}
    entry = None
    for line in (done.stderr + done.stdout).splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group(1)
            usage[entry] = {"registers": 0, "spill_stores": 0, "spill_loads": 0}
        elif entry and (m := _PTXAS_SPILL.search(line)):
            usage[entry]["spill_stores"], usage[entry]["spill_loads"] = int(m.group(1)), int(m.group(2))
        elif entry and (m := _PTXAS_REGISTERS.search(line)):
            usage[entry]["registers"] = int(m.group(1))
    return usage


def kernel_sources() -> list[Path]:
    """Every CUDA source of the project (kernels of patches and the device build of the acceptor)."""
    return sorted((REPO_ROOT / "patches" / "kernels").glob("*.cu")) + sorted((REPO_ROOT / "ext").glob("*.cu"))
