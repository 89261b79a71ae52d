"""An interpreter of the PTX nvcc makes of a kernel, for one thread or every thread of a block: the code the
GPU would run, checked on a machine without one.

The CUDA emulation (cuda_emu.py) builds a kernel's *source* with the host compiler, so it cannot see what NVVM
does to it. That hid a real fault: on the H200 the round's decision (round_tail.cu) refused every round
(device calls 142-146), because nvcc compiled gdn_tree_plan.cuh's checks, in that context, into code that
refused row 0 of every chain, while g++, clang and the emulation of the same source were right. Run on
nvcc's PTX, this interpreter gave the same refusals the GPU gave, and found the construct (the header's note).

`PtxProgram(text)` parses the module's entries; `Machine` holds a flat little-endian byte memory (global
buffers, shared variables and each entry's local depot at disjoint addresses; generic addresses equal them).
`Machine.run` runs an entry for one thread (thread 0 of a one-thread block, any block index); `call` does such
a launch on numpy arrays: copied in, run, copied back.

`Machine.run_block` runs every thread of one 1-D block (%tid, %ntid, %ctaid, %nctaid, %laneid; %warpid and
other placement registers are refused): each thread runs until it exits or reaches a bar.sync or shfl.sync,
then the block resolves those. A shuffle runs once every non-exited lane its mask names waits at the same
instruction with the same mask, each lane reading its source lane's operand as it was at the shuffle (PTX's
lane arithmetic for up, down, bfly and idx); a barrier once every thread waits at the same one. Anything else
(a lane elsewhere, a source lane not at the shuffle, different barriers) raises `SyncFault`; a barrier after a
thread exited, barrier thread counts, guarded sync instructions are refused. A race detector records, a byte
at a time, the shared and global accesses between two barriers: a byte written by one thread and read or
written by another in the same interval is a race (`BlockReport.races`, with lines and threads), as is noted
a shared byte read before any thread wrote it. For race-free code the order the threads run in between sync
points does not matter, so the one order run here is exact. These are our reading of PTX's rules, not
NVIDIA's hardware.

ldmatrix.sync.aligned.m8n8.x1/x2/x4(.trans).shared.b16 and mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
are warp-collective too: they run once all 32 lanes of the warp wait at the same one (else SyncFault), with
the PTX ISA's fragment layouts; ldmatrix's row reads are each its lane's load for the race detector, the
unwritten-read check and the watches. mma runs only on an `approximate` machine: each element of D is its
exact value (16 products and C) rounded once to float32, one model PTX admits (it does not fix the tensor
cores' summation), not the GPU's bits. An `extern __shared__` array (dynamic shared memory) gets the
`dynamic_shared` bytes `run_block` is given.

Implemented: integer and predicate arithmetic (integer div rounded toward zero; a zero divisor and the signed
minimum over -1 refused), byte permutes, bit inserts, float64 add/sub/mul/min/max, abs and comparisons;
float32 add, sub, mul (correctly rounded), fma in every rounding mode (exact: in float64 where TwoSum shows
the sum exact, else in rationals), float64 fma.rn (exact, in rationals), div.rn and sqrt.rn (correctly
rounded), comparisons, widening cvt (fp16 and bf16 included), cvt.rn.bf16.f32, cvt.rn.f16.f32 (a NaN
refused), cvt from integers (to float64 by rn), a float to an integral value of its own type (rni, rzi, rmi,
rpi) and cvt.sat; loads and stores of every space, ld.param through a parameter's address (a struct
parameter indexed at run time), branches; inline asm's { } scopes, whose `.reg` names are renamed apart;
module-scope .shared variables (a device function's static __shared__, arrays and scalars), given to each
entry that names them.

`Machine.watch(addr, nbytes)` records every load and store touching a range (`Watch.touches`: thread, PTX
line, address, size, barriers passed, run order), so a test can check which places each thread reads and
writes, in its program order; `Machine.symbol` gives a shared variable's address. An
unrounded mul.f32 read by an unrounded add or sub (which ptxas may fuse into one fma) and approximate
instructions (ex2.approx) are refused unless the machine is `approximate=True`, where the add is rounded twice
and 2^x correctly rounded: results PTX allows, not necessarily the GPU's bits. Any other opcode or modifier
raises `PtxUnsupported` naming it, so a test fails loudly instead of interpreting it wrongly. Atomics:
atom.shared.add on u32 and u64 only (the race detector lets atomics meet atomics, not plain accesses). No
calls, vote, match or warp barriers.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np


class PtxUnsupported(NotImplementedError):
    """The PTX uses something this interpreter does not implement."""


_WIDTH = {"8": 8, "16": 16, "32": 32, "64": 64}
_REG_WIDTH = {"%p": 1, "%rs": 16, "%r": 32, "%rd": 64, "%f": 32, "%fd": 64, "%SP": 64, "%SPL": 64}
_ENTRY = re.compile(r"^(?:\.visible\s+)?\.entry\s+(\S+)\($")
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+([^\s\[,]+)(?:\[(\d+)\])?,?$")
_SPACE_DECL = re.compile(r"^\.(local|shared)\s+\.align\s+(\d+)\s+\.b8\s+(\S+)\[(\d+)\];$")
# a scalar variable (`static __shared__ unsigned long long x;`): (space, alignment, type, name)
_SCALAR_DECL = re.compile(r"^\.(local|shared)\s+\.align\s+(\d+)\s+\.([busf](?:8|16|32|64))\s+([^\s\[\]]+);$")


def _space_decl(line: str) -> tuple[str, str, int, int] | None:
    """(space, name, alignment, bytes) of a .local or .shared declaration: a .b8 array or a scalar."""
    if (m := _SPACE_DECL.match(line)) is not None:
        return m.group(1), m.group(3), int(m.group(2)), int(m.group(4))
    if (m := _SCALAR_DECL.match(line)) is not None:
        return m.group(1), m.group(4), int(m.group(2)), int(m.group(3)[1:]) // 8
    return None
_DYNAMIC_SHARED = re.compile(r"^\.extern\s+\.shared\s+\.align\s+(\d+)\s+\.b8\s+(\S+)\[\];$")
_ADDRESS = re.compile(r"\[([^+\]]+)(?:\+(-?(?:0x[0-9a-fA-F]+|\d+)))?\]")
_BLOCK_DIRECTIVE = re.compile(r"\.(maxntid|reqntid|minnctapersm|maxnreg)\s+([\d,\s]+)")
_HINTS = {"nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "volatile", "relaxed", "weak"}
_SPACES = {"global", "shared", "local", "param", "const"}


def _mask(width: int) -> int:
    return (1 << width) - 1


def _signed(value: int, width: int) -> int:
    value &= _mask(width)
    return value - (1 << width) if value >> (width - 1) else value


@functools.cache  # the interpreter's hot path: a suffix is parsed once (a refusal is not cached)
def _type_of(suffix: str) -> tuple[str, int]:
    """(kind: s, u, b, f or pred; width in bits) of a type suffix such as s32, f64, pred."""
    if suffix == "pred":
        return "pred", 1
    kind, width = suffix[:1], suffix[1:]
    if kind not in ("s", "u", "b", "f") or width not in _WIDTH:
        raise PtxUnsupported(f"type .{suffix}")
    return kind, _WIDTH[width]


def _little(value: int, nbytes: int) -> bytes:
    """`value`'s low `nbytes` bytes, little-endian (a parameter's or a store's bytes)."""
    return (value & _mask(8 * nbytes)).to_bytes(nbytes, "little")


_FLOAT_FORMATS = {16: struct.Struct("<e"), 32: struct.Struct("<f"), 64: struct.Struct("<d")}
_F32 = _FLOAT_FORMATS[32]


def _to_float(bits: int, width: int) -> float:
    return _FLOAT_FORMATS[width].unpack((bits & _mask(width)).to_bytes(width // 8, "little"))[0]


def _from_float(value: float, width: int) -> int:
    """The bits of `value` at `width`, rounded to nearest even (float32: the C cast struct makes; a value past
    the largest float32 by half an ulp or more rounds to infinity, as IEEE says, where struct refuses)."""
    if width == 32:
        try:
            return int.from_bytes(_F32.pack(value), "little")
        except OverflowError:
            return 0x7F800000 | (0x80000000 if value < 0 else 0)
    return int.from_bytes(_FLOAT_FORMATS[64].pack(value), "little")


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@functools.cache
def _vector(op: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in op[1:-1].split(",")) if op.startswith("{") else (op,)


@functools.cache
def _immediate(op: str) -> int:
    """An immediate operand's value (a float's as its bits); a refusal is not cached."""
    if re.fullmatch(r"0[dD][0-9a-fA-F]{16}", op) or re.fullmatch(r"0[fF][0-9a-fA-F]{8}", op):
        return int(op[2:], 16)
    try:
        return int(op, 0)
    except ValueError:
        raise PtxUnsupported(f"operand {op!r}") from None


@functools.cache
def _register_mask(reg: str) -> int:
    """The bits a register of `reg`'s class holds; a refusal is not cached."""
    head = re.match(r"%[A-Za-z]+", reg)
    if head is None or head.group(0) not in _REG_WIDTH:
        raise PtxUnsupported(f"destination {reg!r}")
    return _mask(_REG_WIDTH[head.group(0)])


@functools.cache
def _address_parts(op: str) -> tuple[str, int] | None:
    """An address operand's base and offset ([%rd4+16]: ("%rd4", 16)), or None."""
    m = _ADDRESS.fullmatch(op.replace(" ", ""))
    return None if m is None else (m.group(1), int(m.group(2) or "0", 0))


@dataclass
class Instruction:
    opcode: str
    mods: list[str]  # the dot-separated parts after the opcode
    ops: list[str]
    guard: str | None  # the predicate register, or None
    negated: bool
    line: int = 0  # 1-based line in the PTX text, for reports


@dataclass
class Entry:
    name: str
    params: list[tuple[str, int]]  # (name, bytes)
    decls: list[tuple[str, str, int, int]]  # (space, name, alignment, bytes)
    code: list[Instruction]
    labels: dict[str, int]
    max_threads: int = 1024  # the block size .maxntid or .reqntid allows
    dynamic: list[tuple[str, int]] = field(default_factory=list)  # extern .shared arrays: (name, alignment)


class PtxProgram:
    """The entries of one PTX module."""

    def __init__(self, text: str) -> None:
        self.entries: dict[str, Entry] = {}
        # module-scope .shared variables (a function's `static __shared__`, nvcc declares them outside the
        # entries): each entry that names one gets it among its own declarations
        self.module_shared: list[tuple[str, str, int, int]] = []
        # `extern __shared__` arrays (dynamic shared memory): (name, alignment); a block run sizes them
        self.module_dynamic: list[tuple[str, int]] = []
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            if ".func" in lines[i].split("//", 1)[0]:
                raise PtxUnsupported(f"device functions ({lines[i].strip()})")
            dm = _space_decl(lines[i].strip())
            if dm is not None and dm[0] == "shared":
                self.module_shared.append(dm)
            if (xm := _DYNAMIC_SHARED.match(lines[i].strip())) is not None:
                self.module_dynamic.append((xm.group(2), int(xm.group(1))))
            m = _ENTRY.match(lines[i])
            i += 1
            if m is not None:
                i = self._entry(m.group(1), lines, i)

    def _entry(self, name: str, lines: list[str], i: int) -> int:
        params = []
        while lines[i].strip() != ")":
            pm = _PARAM.search(lines[i].strip())
            if pm is None:
                raise PtxUnsupported(f"parameter {lines[i].strip()!r}")
            params.append((pm.group(2), _type_of(pm.group(1))[1] // 8 * int(pm.group(3) or 1)))
            i += 1
        i += 1
        max_threads = 1024
        while lines[i].strip() != "{":  # performance directives between the parameters and the body
            dm = _BLOCK_DIRECTIVE.fullmatch(lines[i].strip())
            if dm is None:
                raise PtxUnsupported(f"entry {name}: {lines[i].strip()!r} before its body")
            if dm.group(1) in ("maxntid", "reqntid"):
                max_threads = math.prod(int(x) for x in dm.group(2).split(","))
            i += 1
        i += 1
        decls, code, labels = [], [], {}
        scope: dict[str, str] | None = None  # inside a { } scope (nvcc's inline asm): its registers' names
        scopes = 0
        while lines[i] != "}":
            line = lines[i].split("//", 1)[0].strip()
            i += 1
            if line.startswith("{"):
                if scope is not None:
                    raise PtxUnsupported(f"nested scope at line {i}")
                scope, scopes, line = {}, scopes + 1, line[1:].strip()
            closes = scope is not None and line.endswith("}")
            if closes:
                line = line[:-1].strip()
            if scope is not None and line.startswith(".reg"):
                scope.update(_scoped_registers(line, scopes))
                line = ""
            elif scope:
                line = _renamed(line, scope)
            if closes:
                scope = None
            if not line or line.split(None, 1)[0] in (".reg", ".pragma", ".loc"):
                continue
            if line.endswith(":"):
                labels[line[:-1]] = len(code)
                continue
            dm = _space_decl(line)
            if dm:
                decls.append(dm)
                continue
            if line.startswith(".") or not line.endswith(";"):
                raise PtxUnsupported(f"{line!r}")
            line = line[:-1].strip()
            guard, negated = None, False
            if line.startswith("@"):
                g, line = line.split(None, 1)
                negated = g.startswith("@!")
                guard = g[2:] if negated else g[1:]
            parts = line.split(None, 1)
            opcode, *mods = parts[0].split(".")
            operands = _split_operands(parts[1]) if len(parts) > 1 else []
            code.append(Instruction(opcode, mods, operands, guard, negated, i))
        named = {op for ins in code for o in ins.ops for op in re.findall(r"[\w$.]+", o)}
        decls += [d for d in self.module_shared if d[1] in named]
        dynamic = [d for d in self.module_dynamic if d[0] in named]
        self.entries[name] = Entry(name, params, decls, code, labels, max_threads, dynamic)
        return i + 1

    def entry(self, contains: str) -> Entry:
        """The one entry whose (mangled) name contains `contains`."""
        found = [e for n, e in self.entries.items() if contains in n]
        if len(found) != 1:
            raise KeyError(f"{len(found)} entries match {contains!r}: {sorted(self.entries)}")
        return found[0]


_SCOPED_PREFIX = {1: "%p", 16: "%rs", 32: "%r", 64: "%rd"}  # a register's width is its name's prefix's


def entry_lines(text: str, entry: str) -> range:
    """The 0-based lines of PTX `text` from the header of its one entry whose name contains `entry` up to, not
    including, the entry's closing brace (for tests that read or edit one entry's code)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if (m := _ENTRY.match(line)) and entry in m.group(1)]
    if len(starts) != 1:
        raise KeyError(f"{len(starts)} entries named like {entry!r}")
    return range(starts[0], next(i for i in range(starts[0], len(lines)) if lines[i] == "}"))


def barrier_lines(text: str, entry: str) -> list[int]:
    """The 0-based lines of the bar.sync instructions in the body of the one entry of PTX `text` whose name
    contains `entry` (for tests that delete a barrier and expect the detector to object)."""
    lines = text.splitlines()
    return [i for i in entry_lines(text, entry) if re.match(r"^\s*bar\.sync\s", lines[i])]


def _scoped_registers(line: str, scope: int) -> dict[str, str]:
    """The registers a scope declares (`.reg .f16 low, high;`), each renamed to one no other scope or the
    entry uses, whose prefix gives its width (registers hold bits; the type only sets the width)."""
    m = re.fullmatch(r"\.reg\s+\.(\w+)\s+([^;<>]+);", line)
    if m is None:
        raise PtxUnsupported(f"scoped register declaration {line!r}")
    _, width = _type_of(m.group(1))
    if width not in _SCOPED_PREFIX:
        raise PtxUnsupported(f"scoped register declaration {line!r}")
    names = [n.strip() for n in m.group(2).split(",")]
    return {n: f"{_SCOPED_PREFIX[width]}_scope{scope}_{n.lstrip('%')}" for n in names}


def _renamed(line: str, scope: dict[str, str]) -> str:
    """`line` with every whole name a scope declared replaced by its unique name."""
    names = "|".join(re.escape(n) for n in sorted(scope, key=len, reverse=True))
    return re.sub(rf"(?<![\w$%.])({names})(?![\w$])", lambda m: scope[m.group(1)], line)


def _extent(frame: dict[str, int], decls: list[tuple[str, str, int, int]]) -> tuple[int, int]:
    """[low, high) of a frame's variables (allocated one after another), empty for none."""
    if not decls:
        return (0, 0)
    return (min(frame[d[1]] for d in decls), max(frame[d[1]] + d[3] for d in decls))


def _extent_all(frames: list[dict[str, int]], decls: list[tuple[str, str, int, int]]) -> tuple[int, int]:
    spans = [_extent(f, decls) for f in frames if decls]
    return (min(lo for lo, _ in spans), max(hi for _, hi in spans)) if spans else (0, 0)


@dataclass(frozen=True)
class Touch:
    """One load or store a `Watch` saw: its place among every access any watch of the machine saw (`seq`,
    to merge watches in run order), which thread, the PTX line, the address and size, and how many barriers
    its block had passed (0 in a one-thread launch)."""

    seq: int
    thread: int
    line: int
    addr: int
    nbytes: int
    write: bool
    barriers: int


@dataclass
class Watch:
    """The loads and stores (ld/st of any space but .param) that overlap [low, high), in the order the
    interpreter ran them; within one thread that is the thread's program order."""

    low: int
    high: int
    touches: list[Touch] = field(default_factory=list)

    def of_thread(self, thread: int) -> list[Touch]:
        return [x for x in self.touches if x.thread == thread]


@dataclass
class Machine:
    """A flat little-endian byte memory and the runs of entries on it."""

    size: int = 1 << 22
    mem: bytearray = field(init=False)
    top: int = 0x1000  # nothing lives below: a null pointer's access fails
    approximate: bool = False  # whether approximate instructions (ex2.approx, ...) run, approximately
    steps: int = 0  # instructions run, all launches
    watches: list[Watch] = field(default_factory=list)  # address ranges whose accesses are recorded
    touches: int = 0  # accesses the watches recorded, all watches
    _frames: dict[str, dict[str, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.mem = bytearray(self.size)

    def watch(self, addr: int, nbytes: int) -> Watch:
        """Record, from now on, every load and store that touches bytes [addr, addr + nbytes) (`unwatch`
        stops it)."""
        w = Watch(addr, addr + nbytes)
        self.watches.append(w)
        return w

    def unwatch(self, w: Watch) -> None:
        self.watches.remove(w)

    def symbol(self, entry: Entry, contains: str, dynamic_shared: int = 0) -> tuple[int, int]:
        """(address, bytes) of the shared variable of `entry` whose name contains `contains` (exactly one),
        where every block run of the entry with `dynamic_shared` bytes of dynamic shared memory places it."""
        frame, decls = self._shared_frame(entry, dynamic_shared)
        found = [d for d in decls if contains in d[1]]
        if len(found) != 1:
            raise KeyError(f"{entry.name}: {len(found)} shared variables named like {contains!r}")
        return frame[found[0][1]], found[0][3]

    def _shared_frame(
        self, entry: Entry, dynamic_shared: int = 0
    ) -> tuple[dict[str, int], list[tuple[str, str, int, int]]]:
        """The shared variables' addresses every block run of `entry` uses (refilled, see `_frame`), and their
        declarations; an `extern .shared` array gets `dynamic_shared` bytes (the launch's dynamic size)."""
        if entry.dynamic and dynamic_shared <= 0:
            raise ValueError(f"{entry.name} uses dynamic shared memory: give its size (dynamic_shared)")
        decls = [d for d in entry.decls if d[0] == "shared"]
        decls += [("shared", name, align, dynamic_shared) for name, align in entry.dynamic]
        return self._frame(f"{entry.name}/shared/{dynamic_shared}", decls), decls

    def alloc(self, nbytes: int, align: int = 256) -> int:
        self.top = (self.top + align - 1) // align * align
        addr = self.top
        self.top += max(nbytes, 1)
        if self.top > self.size:
            raise MemoryError("interpreter memory exhausted")
        return addr

    def put(self, array: np.ndarray) -> int:
        """A copy of `array` in memory; its address."""
        data = np.ascontiguousarray(array).tobytes()
        addr = self.alloc(len(data))
        self.mem[addr : addr + len(data)] = data
        return addr

    def get(self, addr: int, like: np.ndarray) -> np.ndarray:
        """The bytes at `addr` as an array of `like`'s dtype and shape."""
        data = bytes(self.mem[addr : addr + like.nbytes])
        return np.frombuffer(data, dtype=like.dtype).reshape(like.shape).copy()

    # An access outside every allocation fails; one that strays into a neighbouring allocation does not (each
    # allocation is 256-byte aligned, so small overruns mostly land in padding, which holds zeros).
    def load(self, addr: int, nbytes: int) -> int:
        if addr < 0x1000 or addr + nbytes > self.top:
            raise MemoryError(f"load of {nbytes} bytes at {addr:#x}, outside allocated memory")
        return int.from_bytes(self.mem[addr : addr + nbytes], "little")

    def store(self, addr: int, nbytes: int, value: int) -> None:
        if addr < 0x1000 or addr + nbytes > self.top:
            raise MemoryError(f"store of {nbytes} bytes at {addr:#x}, outside allocated memory")
        self.mem[addr : addr + nbytes] = _little(value, nbytes)

    def _params(self, entry: Entry, args: Sequence[int | bytes]) -> dict[str, bytes]:
        if len(args) != len(entry.params):
            raise ValueError(f"{entry.name}: {len(entry.params)} parameters, {len(args)} given")
        params = {}
        for (name, nbytes), value in zip(entry.params, args, strict=True):
            data = value if isinstance(value, bytes) else _little(value, nbytes)
            if len(data) != nbytes:
                raise ValueError(f"{entry.name}: parameter {name} takes {nbytes} bytes, got {len(data)}")
            params[name] = data
        return params

    def _param_space(self, entry: Entry, params: dict[str, bytes]) -> dict[str, int]:
        """Addresses for the launch's parameters, holding their bytes: a kernel may take a parameter's address
        (mov.b64 %rd, param) and read it with ld.param through that register (nvcc does so to index an
        array inside a struct passed by value). Only ld.param may read there (`_ld` checks)."""
        frame = self._frame(f"{entry.name}/param", [("param", n, 8, b) for n, b in entry.params])
        for name, data in params.items():
            self.mem[frame[name] : frame[name] + len(data)] = data
        return frame

    def _frame(self, key: str, decls: list[tuple[str, str, int, int]]) -> dict[str, int]:
        """The variables' addresses (one place per key, reused by every launch), each refilled with 0xCD
        bytes: on a GPU nothing initialises shared variables or the local depot."""
        if key not in self._frames:
            self._frames[key] = {name: self.alloc(n, max(a, 16)) for _, name, a, n in decls}
        frame = self._frames[key]
        for _, name, _, nbytes in decls:
            self.mem[frame[name] : frame[name] + nbytes] = b"\xcd" * nbytes
        return frame

    def run(
        self, entry: Entry, args: Sequence[int | bytes], *, block: int = 0, blocks: int = 1,
        max_steps: int = 20_000_000,
    ) -> None:  # fmt: skip
        """Run `entry` for one thread, thread 0 of one-thread block `block` of `blocks` (so a kernel that
        indexes by blockIdx.x * blockDim.x + threadIdx.x runs its element `block`). `args`: integers (values,
        or addresses from `put`) for scalar parameters, the bytes of a struct passed by value for the others.
        Shared variables and the local depot hold 0xCD bytes at every launch."""
        params = self._params(entry, args)
        symbols = self._frame(entry.name, entry.decls) | self._param_space(entry, params)
        special = {"%tid.x": 0, "%ntid.x": 1, "%ctaid.x": block, "%nctaid.x": blocks}
        for axis in "yz":
            special |= {f"%tid.{axis}": 0, f"%ntid.{axis}": 1, f"%ctaid.{axis}": 0, f"%nctaid.{axis}": 1}
        self.steps += _Thread(self, entry, symbols, params, special).run(max_steps)

    def run_block(
        self, entry: Entry, args: Sequence[int | bytes], *, threads: int, block: tuple[int, int] = (0, 0),
        grid: tuple[int, int] = (1, 1), max_steps: int = 2_000_000, dynamic_shared: int = 0,
    ) -> BlockReport:  # fmt: skip
        """Run every thread of block `block` (x, y) of a `grid` of blocks of `threads` threads (a 1-D block):
        barriers, warp shuffles, ldmatrix and mma (warp-collective) and the race detector (`_Block`,
        `_Scheduler`). `args` as for `run`; each thread has its own local depot; an `extern __shared__` array
        gets `dynamic_shared` bytes. Raises SyncFault where the threads do not meet as PTX requires;
        `max_steps` bounds each thread."""
        if not 1 <= threads <= entry.max_threads:
            raise ValueError(f"{entry.name}: a block of {threads} threads (at most {entry.max_threads})")
        params = self._params(entry, args)
        shared, shared_decls = self._shared_frame(entry, dynamic_shared)
        local_decls = [d for d in entry.decls if d[0] == "local"]
        param_space = self._param_space(entry, params)
        frames = [self._frame(f"{entry.name}/local/{t}", local_decls) for t in range(threads)]
        block_state = _Block(threads, _extent(shared, shared_decls), _extent_all(frames, local_decls))
        special = {"%ntid.x": threads, "%ctaid.x": block[0], "%nctaid.x": grid[0], "%ctaid.y": block[1],
                   "%nctaid.y": grid[1], "%tid.y": 0, "%ntid.y": 1, "%tid.z": 0, "%ntid.z": 1, "%ctaid.z": 0,
                   "%nctaid.z": 1}  # fmt: skip
        threads_ = [
            _Thread(
                self,
                entry,
                shared | frames[t] | param_space,
                params,
                special | {"%tid.x": t, "%laneid": t % 32},
                block_state,
            )
            for t in range(threads)
        ]
        report = _Scheduler(threads_, block_state, max_steps).run()
        self.steps += report.steps
        return report

    def call(self, entry: Entry, *args: int | bytes | np.ndarray) -> None:
        """A launch on arrays: each numpy array argument is copied in, passed as its address and, after the
        run, overwritten with what the kernel left there."""
        placed = [(a, self.put(a)) if isinstance(a, np.ndarray) else (a, None) for a in args]
        self.run(entry, [addr if addr is not None else a for a, addr in placed])
        for a, addr in placed:
            if addr is not None:
                a[...] = self.get(addr, a)


_WARP_COLLECTIVE = frozenset({"shfl", "ldmatrix", "mma"})  # resolved across the lanes of one warp
_SYNC = frozenset({"bar", "barrier"}) | _WARP_COLLECTIVE  # instructions a block resolves across its threads
# Special registers whose value is the hardware's placement, not the program's: refused, never guessed.
_PLACEMENT = ("%warpid", "%nwarpid", "%smid", "%nsmid", "%gridid", "%clock", "%globaltimer", "%lanemask")


class _Thread:
    def __init__(
        self, machine: Machine, entry: Entry, symbols: dict[str, int], params: dict[str, bytes],
        special: dict[str, int], block: _Block | None = None,
    ) -> None:  # fmt: skip
        self.m, self.entry, self.symbols, self.params = machine, entry, symbols, params
        self.regs: dict[str, int] = dict(special)  # read-only by convention: nothing writes %tid etc.
        self.tid = special.get("%tid.x", 0)
        self.block = block  # None: a one-thread launch, which refuses every instruction of _SYNC
        self.pc = self.steps = 0
        self.unrounded_products: dict[str, int] = {}  # register: the bits an unrounded mul.f32 left there

    def value(self, op: str) -> int:
        if op[0] == "%":
            found = self.regs.get(op)
            if found is None:
                if op.startswith(_PLACEMENT):
                    raise PtxUnsupported(f"special register {op}")
                raise RuntimeError(f"{self.entry.name}: {op} read before any write")
            return found
        if op in self.symbols:
            return self.symbols[op]
        return _immediate(op)

    def set(self, reg: str, value: int) -> None:
        self.regs[reg] = value & _register_mask(reg)

    def address(self, op: str) -> int:
        parts = _address_parts(op)
        if parts is None or parts[0] in self.params:
            raise PtxUnsupported(f"address {op!r}")
        return (self.value(parts[0]) + parts[1]) & _mask(64)

    def note(self, addr: int, nbytes: int, write: bool, atomic: bool = False) -> None:
        """A load's or store's bytes (or an atomic's, `atomic`), for the block's race detector (a one-thread
        launch has none) and the machine's watches."""
        for w in self.m.watches:
            if addr < w.high and w.low < addr + nbytes:
                barriers = self.block.report.barriers if self.block is not None else 0
                line = self.entry.code[self.pc - 1].line
                w.touches.append(Touch(self.m.touches, self.tid, line, addr, nbytes, write, barriers))
                self.m.touches += 1
        if self.block is not None:
            self.block.note(self.tid, self.entry.code[self.pc - 1].line, addr, nbytes, write, atomic)

    def run(self, max_steps: int) -> int:
        """Run a one-thread launch to its end; the instructions run."""
        self.advance(max_steps)
        return self.steps

    def advance(self, max_steps: int) -> Instruction | None:
        """Run until the thread exits (None) or, in a block, until its next instruction synchronises with
        other threads (returned, not run: the block runs it for all of them at once)."""
        code, labels, regs = self.entry.code, self.entry.labels, self.regs
        end, in_block, handlers = len(code), self.block is not None, _HANDLERS  # locals: the hot loop
        while True:
            pc = self.pc
            if pc >= end:
                raise RuntimeError(f"{self.entry.name}: ran past its end")
            ins = code[pc]
            opcode = ins.opcode
            if in_block and opcode in _SYNC:
                return ins
            self.steps += 1
            if self.steps > max_steps:
                raise RuntimeError(f"{self.entry.name}: over {max_steps} instructions")
            self.pc = pc + 1
            if ins.guard is not None and bool(regs[ins.guard]) == ins.negated:
                continue
            handler = handlers.get(opcode)
            if handler is not None:
                handler(self, ins.mods, ins.ops)
            elif opcode == "bra":
                self.pc = labels[ins.ops[0]]
            elif opcode in ("ret", "exit"):
                return None
            elif opcode not in ("membar", "fence"):  # those: accesses run in program order here
                raise PtxUnsupported(f"opcode {opcode}.{'.'.join(ins.mods)}")


# ---- a block of threads: barriers, warp shuffles and the race detector -------------------------------------


class SyncFault(RuntimeError):
    """A block's threads do not meet at a barrier or a shuffle as PTX requires (diverged or deadlocked)."""


@dataclass(frozen=True)
class Access:
    thread: int  # threadIdx.x
    line: int  # the PTX line of the load or store
    write: bool


@dataclass(frozen=True)
class Race:
    """Two threads' accesses to one byte, at least one a write, with no barrier between them."""

    address: int
    space: str  # "shared" or "global"
    first: Access
    second: Access

    def __str__(self) -> str:
        kinds = "/".join("write" if a.write else "read" for a in (self.first, self.second))
        return (f"{kinds} race on {self.space} byte {self.address:#x}: thread {self.first.thread} at line "
                f"{self.first.line}, thread {self.second.thread} at line {self.second.line}")  # fmt: skip


@dataclass
class BlockReport:
    """What the detector saw in one block's run."""

    threads: int
    steps: int = 0  # instructions run, all threads
    barriers: int = 0  # barriers every thread of the block reached
    shuffles: int = 0  # warp shuffles resolved (one a warp's group of lanes)
    collectives: int = 0  # ldmatrix and mma.sync resolved (one a warp)
    races: list[Race] = field(default_factory=list)  # one example per pair of lines
    racing_bytes: int = 0  # every racing access, counted once a byte and access
    unwritten_reads: list[tuple[Access, int]] = field(
        default_factory=list
    )  # shared bytes read before any write


class _Block:
    """The accesses of the current barrier interval, a byte at a time. Within one interval a byte written by
    one thread and read or written by another is a race: with no barrier between them nothing orders the two,
    so the result would depend on the warps' schedule (the scheduler here runs one order only)."""

    def __init__(self, threads: int, shared: tuple[int, int], private: tuple[int, int]) -> None:
        self.report = BlockReport(threads)
        self.shared, self.private = (
            shared,
            private,
        )  # [low, high) of the shared variables and the local depots
        self.writer: dict[int, Access] = {}
        self.reader: dict[int, Access] = {}  # the interval's first reader of a byte
        self.other_reader: dict[int, Access] = {}  # a reader other than the first, if any
        self.atomic: dict[int, Access] = {}  # the interval's first atomic on a byte
        self.written: set[int] = set()  # shared bytes written this launch
        self._seen: set[tuple[int, int]] = set()  # (line, line) pairs already reported
        self._unwritten_lines: set[int] = set()

    def space(self, addr: int) -> str | None:
        if self.shared[0] <= addr < self.shared[1]:
            return "shared"
        return None if self.private[0] <= addr < self.private[1] else "global"

    def note(self, thread: int, line: int, addr: int, nbytes: int, write: bool, atomic: bool = False) -> None:
        """An access's bytes. Atomics on a byte do not race with each other (each is one indivisible
        read-modify-write, in whatever order), but do with any plain load or store of it in the interval."""
        space = self.space(addr)
        if space is None:  # a thread's own local depot: no other thread can reach it
            return
        me = Access(thread, line, write)
        if atomic:
            for b in range(addr, addr + nbytes):
                for other in (self.writer.get(b), self.reader.get(b), self.other_reader.get(b)):
                    if other is not None and other.thread != thread:
                        self._race(b, space, other, me)
                self.atomic.setdefault(b, me)
                if space == "shared" and b not in self.written and line not in self._unwritten_lines:
                    self._unwritten_lines.add(line)
                    self.report.unwritten_reads.append((me, b))
            return
        for b in range(addr, addr + nbytes):
            a = self.atomic.get(b)
            if a is not None and a.thread != thread:
                self._race(b, space, a, me)
            w = self.writer.get(b)
            if w is not None and w.thread != thread:
                self._race(b, space, w, me)
            if write:
                r = self.reader.get(b)
                if r is not None and r.thread != thread:
                    self._race(b, space, r, me)
                elif b in self.other_reader:
                    self._race(b, space, self.other_reader[b], me)
                self.writer[b] = me
                if space == "shared":
                    self.written.add(b)
            else:
                r = self.reader.setdefault(b, me)
                if r.thread != thread:
                    self.other_reader.setdefault(b, me)
                if space == "shared" and b not in self.written and line not in self._unwritten_lines:
                    self._unwritten_lines.add(line)
                    self.report.unwritten_reads.append((me, b))

    def _race(self, addr: int, space: str, first: Access, second: Access) -> None:
        self.report.racing_bytes += 1
        if (first.line, second.line) not in self._seen:
            self._seen.add((first.line, second.line))
            self.report.races.append(Race(addr, space, first, second))

    def barrier(self) -> None:
        """Every thread passed a barrier: the accesses before it are ordered before those after it."""
        self.writer.clear()
        self.reader.clear()
        self.other_reader.clear()
        self.atomic.clear()
        self.report.barriers += 1


_SHUFFLE_MODES = ("up", "down", "bfly", "idx")


def _shuffle_source(mode: str, lane: int, b: int, c: int) -> tuple[int, bool]:
    """(source lane, in range) of a lane's shfl.sync, as the PTX ISA's pseudocode computes them."""
    bval, cval, segmask = b & 31, c & 31, (c >> 8) & 31
    max_lane, min_lane = (lane & segmask) | (cval & ~segmask & 31), lane & segmask
    if mode == "up":
        j = lane - bval
        ok = j >= max_lane
    elif mode == "down":
        j = lane + bval
        ok = j <= max_lane
    elif mode == "bfly":
        j = lane ^ bval
        ok = j <= max_lane
    else:
        j = min_lane | (bval & ~segmask & 31)
        ok = j <= max_lane
    return (j if ok else lane), ok


def _where(ins: Instruction | None) -> str:
    return "its exit" if ins is None else f"line {ins.line} ({ins.opcode}.{'.'.join(ins.mods)})"


class _Scheduler:
    """Runs every thread of a block until it exits or stops at a barrier, shuffle, ldmatrix or mma, then
    resolves those: a shuffle once every lane its mask names is at it, ldmatrix and mma once the whole warp
    is, a barrier once every thread is. For code without races (which the block's detector checks) any
    order of the threads between these points gives the same result, so running them one after another in
    thread order is exact."""

    def __init__(self, threads: list[_Thread], block: _Block, max_steps: int) -> None:
        self.threads, self.block, self.max_steps = threads, block, max_steps
        self.at: list[Instruction | None] = [None] * len(threads)  # where a stopped thread waits
        self.exited = [False] * len(threads)

    def run(self) -> BlockReport:
        pending = list(range(len(self.threads)))
        while True:
            for t in pending:
                self.at[t] = self.threads[t].advance(self.max_steps)
                self.exited[t] = self.at[t] is None
            pending = self._shuffles()
            if pending:
                continue
            if all(self.exited):
                break
            pending = self._barrier()
        self.block.report.steps = sum(th.steps for th in self.threads)
        return self.block.report

    def _shuffles(self) -> list[int]:
        resumed: list[int] = []
        done: set[int] = set()
        for t, ins in enumerate(self.at):
            if ins is not None and ins.opcode in _WARP_COLLECTIVE and t not in done:
                group = self._shuffle(t, ins) if ins.opcode == "shfl" else self._whole_warp(t, ins)
                done.update(group)
                resumed += group
        for t in resumed:
            self.at[t] = None
        return resumed

    def _shuffle(self, t: int, ins: Instruction) -> list[int]:
        """Run the shuffle thread t waits at for every lane of its mask: each lane reads its source lane's
        operand as it is at the shuffle, before any lane's destination is written."""
        if ins.guard is not None or len(ins.mods) != 3 or ins.mods[0] != "sync" or ins.mods[2] != "b32":
            raise PtxUnsupported(f"line {ins.line}: {'@' if ins.guard else ''}shfl.{'.'.join(ins.mods)}")
        mode = ins.mods[1]
        if mode not in _SHUFFLE_MODES or len(ins.ops) != 5:
            raise PtxUnsupported(f"line {ins.line}: shfl.{'.'.join(ins.mods)}")
        dest, a, b, c, mask_op = ins.ops
        base = t - t % 32
        mask = self.threads[t].value(mask_op) & 0xFFFFFFFF
        lanes = [base + lane for lane in range(32) if mask >> lane & 1]
        if t not in lanes:
            raise SyncFault(f"line {ins.line}: thread {t} runs a shuffle whose mask {mask:#x} leaves it out")
        for u in lanes:
            if u >= len(self.threads):
                raise SyncFault(f"line {ins.line}: mask {mask:#x} names thread {u}, past the block")
            if self.exited[u]:
                continue  # PTX waits for the mask's threads that have not exited
            if self.at[u] is not ins:
                where = _where(self.at[u])
                why = f"thread {t} shuffles with mask {mask:#x}, thread {u} of its warp is at {where}"
                raise SyncFault(f"line {ins.line}: {why}")
            if self.threads[u].value(mask_op) & 0xFFFFFFFF != mask:
                raise SyncFault(f"line {ins.line}: threads {t} and {u} shuffle with different masks")
        group = [u for u in lanes if not self.exited[u]]
        sources = {u: self.threads[u].value(a) for u in group}
        results = {}
        for u in group:
            th = self.threads[u]
            j, ok = _shuffle_source(mode, u - base, th.value(b), th.value(c))
            if base + j not in sources:
                raise SyncFault(f"line {ins.line}: thread {u} reads lane {j}, which is not at the shuffle")
            results[u] = (sources[base + j], ok)
        value_reg, _, pred_reg = dest.partition("|")
        for u in group:
            th = self.threads[u]
            th.set(value_reg, results[u][0])
            if pred_reg:
                th.set(pred_reg, int(results[u][1]))
            th.pc += 1
            th.steps += 1
        self.block.report.shuffles += 1
        return group

    def _whole_warp(self, t: int, ins: Instruction) -> list[int]:
        """Run the ldmatrix or mma thread t waits at for its whole warp: .aligned instructions every lane of
        the warp must run together (here: all 32 present and at this instruction, none exited or guarded)."""
        if ins.guard is not None:
            raise PtxUnsupported(f"line {ins.line}: a guarded {ins.opcode}.{'.'.join(ins.mods)}")
        base = t - t % 32
        lanes = list(range(base, base + 32))
        for u in lanes:
            if u >= len(self.threads):
                raise SyncFault(f"line {ins.line}: {ins.opcode} in warp {base // 32}, which lacks thread {u}")
            if self.exited[u] or self.at[u] is not ins:
                where = "its exit" if self.exited[u] else _where(self.at[u])
                why = f"thread {t} runs {ins.opcode}, thread {u} of its warp is at {where}"
                raise SyncFault(f"line {ins.line}: {why}")
        warp = [self.threads[u] for u in lanes]
        for th in warp:  # before the accesses, so the race detector notes this instruction's line
            th.pc += 1
            th.steps += 1
        (_ldmatrix if ins.opcode == "ldmatrix" else _mma)(warp, ins)
        self.block.report.collectives += 1
        return lanes

    def _barrier(self) -> list[int]:
        live = [t for t in range(len(self.threads)) if not self.exited[t]]
        first = self.at[live[0]]
        assert first is not None
        if first.opcode not in ("bar", "barrier"):  # a shuffle would have resolved or faulted
            raise SyncFault(f"thread {live[0]} waits at {_where(first)}")
        form_ok = first.mods in (["sync"], ["sync", "aligned"]) and len(first.ops) == 1
        if first.guard is not None or not form_ok:  # arrive, red, a thread count: not modelled
            raise PtxUnsupported(f"line {first.line}: {first.opcode}.{'.'.join(first.mods)} {first.ops}")
        apart = [t for t in live if self.at[t] is not first]
        if apart:
            raise SyncFault(f"thread {live[0]} waits at {_where(first)}, thread {apart[0]} at "
                            f"{_where(self.at[apart[0]])}")  # fmt: skip
        if len(live) != len(self.threads):
            gone = self.exited.index(True)
            why = "whether an exited thread counts as arrived is not modelled"
            raise PtxUnsupported(f"line {first.line}: a barrier after thread {gone} exited ({why})")
        if len({self.threads[t].value(first.ops[0]) for t in live}) != 1:
            raise SyncFault(f"line {first.line}: threads name different barriers")
        self.block.barrier()
        for t in live:
            self.threads[t].pc += 1
            self.threads[t].steps += 1
            self.at[t] = None
        return live


# ---- warp-collective matrix instructions (PTX ISA 9.0, "Warp-level matrix instructions") -----------------


def _ldmatrix(warp: list[_Thread], ins: Instruction) -> None:
    """ldmatrix.sync.aligned.m8n8.x1/x2/x4(.trans).shared.b16: matrix i's 8 rows of 8 b16 (16 bytes each)
    are at the addresses lanes 8i..8i+7 give; lane l receives into destination i the pair of row l/4,
    columns 2(l%4) and 2(l%4)+1 (the first in the low half), or with .trans of column l/4, rows 2(l%4) and
    2(l%4)+1. Each row is read as a load of the lane that named it, for the race detector and the watches."""
    mods = [m for m in ins.mods if m not in ("sync", "aligned")]
    count = {"x1": 1, "x2": 2, "x4": 4}.get(mods[1] if len(mods) > 1 else "")
    trans = "trans" in mods
    if count is None or [m for m in mods if m != "trans"] != ["m8n8", f"x{count}", "shared", "b16"]:
        raise PtxUnsupported(f"line {ins.line}: ldmatrix.{'.'.join(ins.mods)}")
    dests = _vector(ins.ops[0])
    if len(dests) != count or len(ins.ops) != 2:
        raise PtxUnsupported(f"line {ins.line}: ldmatrix into {ins.ops[0]}")
    rows: list[list[list[int]]] = []  # [matrix][row][column]: b16 values
    for i in range(count):
        matrix = []
        for r in range(8):
            th = warp[8 * i + r]
            addr = th.address(ins.ops[1])
            if addr % 16:
                raise RuntimeError(f"line {ins.line}: ldmatrix row at {addr:#x}, not 16-byte aligned")
            th.note(addr, 16, write=False)
            word = th.m.load(addr, 16)
            matrix.append([(word >> (16 * c)) & 0xFFFF for c in range(8)])
        rows.append(matrix)
    for lane, th in enumerate(warp):
        for i, dest in enumerate(dests):
            m = rows[i]
            if trans:
                low, high = m[2 * (lane % 4)][lane // 4], m[2 * (lane % 4) + 1][lane // 4]
            else:
                low, high = m[lane // 4][2 * (lane % 4)], m[lane // 4][2 * (lane % 4) + 1]
            th.set(dest, low | high << 16)


def mma_fragment_places(lane: int) -> dict[str, list[tuple[int, int]]]:
    """(row, column) of each element lane `lane` holds of mma.m16n8k16's A (16 x 16, 8 halves in 4
    registers), B (16 x 8, k by n: 4 halves in 2 registers) and C/D (16 x 8 floats in 4 registers), in
    register order, the low half first (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
    type")."""
    g, c = lane // 4, 2 * (lane % 4)
    a = [(g, c), (g, c + 1), (g + 8, c), (g + 8, c + 1)]
    a += [(i, j + 8) for i, j in a]
    b = [(c, g), (c + 1, g), (c + 8, g), (c + 9, g)]
    d = [(g, c), (g, c + 1), (g + 8, c), (g + 8, c + 1)]
    return {"a": a, "b": b, "d": d}


# products of two halves are multiples of 2^-48, floats of 2^-149: their sums are exact in units of 2^-149
_F32_SCALE = 149


def _scaled(x: float) -> int:
    """A finite float (half, float or a product of halves) as an integer count of 2^-149."""
    n, d = x.as_integer_ratio()
    return n * (1 << _F32_SCALE) // d  # exact: d is a power of two <= 2^149


def _round_scaled(n: int) -> int:
    """The float32 bits of n * 2^-149 (n nonzero) rounded to nearest even (subnormals, overflow included)."""
    a = abs(n)
    shift = max(a.bit_length() - 24, 0)  # below 2^24 units the value is a subnormal or the smallest normals
    if shift:
        rest, a = a & _mask(shift), a >> shift
        half = 1 << (shift - 1)
        a += rest > half or (rest == half and a & 1)
    value = math.ldexp(a, shift - _F32_SCALE)  # exact in float64
    return _from_float(value, 32) | (0x80000000 if n < 0 else 0)


def _mma(warp: list[_Thread], ins: Instruction) -> None:
    """mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, D = A B + C, each element of D the exact sum of
    its 16 products and C's element rounded once to float32 (nearest even). That is one model PTX admits,
    not the tensor cores' bits (their summation order and intermediate precision are not specified), so
    only an `approximate` machine runs it. A non-finite operand: the float64 sum in k order (IEEE's
    infinities and NaN), rounded to float32."""
    if ins.mods != ["sync", "aligned", "m16n8k16", "row", "col", "f32", "f16", "f16", "f32"]:
        raise PtxUnsupported(f"line {ins.line}: mma.{'.'.join(ins.mods)}")
    if not warp[0].m.approximate:
        raise PtxUnsupported(f"line {ins.line}: mma.sync's summation is unspecified (Machine(approximate="
                             "True) opts in)")  # fmt: skip
    d_ops, a_ops, b_ops, c_ops = (_vector(op) for op in ins.ops)
    if (len(d_ops), len(a_ops), len(b_ops), len(c_ops)) != (4, 4, 2, 4):
        raise PtxUnsupported(f"line {ins.line}: mma operands {ins.ops}")
    a = np.zeros((16, 16))
    b = np.zeros((16, 8))
    c = np.zeros((16, 8))
    places_of = [mma_fragment_places(lane) for lane in range(32)]
    for th, places in zip(warp, places_of, strict=True):
        halves = [(th.value(r) >> (16 * h)) & 0xFFFF for r in a_ops for h in (0, 1)]
        for (i, j), bits in zip(places["a"], halves, strict=True):
            a[i, j] = _to_float(bits, 16)
        halves = [(th.value(r) >> (16 * h)) & 0xFFFF for r in b_ops for h in (0, 1)]
        for (i, j), bits in zip(places["b"], halves, strict=True):
            b[i, j] = _to_float(bits, 16)
        for (i, j), r in zip(places["d"], c_ops, strict=True):
            c[i, j] = _to_float(th.value(r), 32)
    d = mma_reference(a, b, c)
    for th, places in zip(warp, places_of, strict=True):
        for (i, j), r in zip(places["d"], d_ops, strict=True):
            th.set(r, d[i][j])


def mma_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[list[int]]:
    """The float32 bits of A B + C (A 16 x k halves, B k x 8 halves, C 16 x 8 floats, as float64 arrays),
    each element its exact value rounded once to nearest even (the `_mma` model)."""
    out = []
    for i in range(a.shape[0]):
        row = []
        for j in range(b.shape[1]):
            terms = [float(a[i, k]) * float(b[k, j]) for k in range(a.shape[1])] + [float(c[i, j])]
            if not all(math.isfinite(x) for x in terms):
                row.append(_from_float(math.fsum(terms) if not any(map(math.isnan, terms)) else math.nan, 32))
                continue
            n = sum(_scaled(x) for x in terms)
            if n:
                row.append(_round_scaled(n))
            else:  # an exact zero: -0 only where every term is -0 (IEEE's sum of zeros, nearest even)
                row.append(0x80000000 if all(math.copysign(1.0, x) < 0 and x == 0 for x in terms) else 0)
        out.append(row)
    return out


# ---- instruction semantics (PTX ISA 9.0) -------------------------------------------------------------------

_Handler = Callable[[_Thread, list[str], list[str]], None]


def _float_binary(op: str, a: float, b: float) -> float:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op in ("min", "max"):  # a NaN operand gives the other; -0 counts below +0
        if math.isnan(a) or math.isnan(b):
            return b if math.isnan(a) else a
        if a == b:
            first = math.copysign(1.0, a) < 0 if op == "min" else math.copysign(1.0, a) > 0
            return a if first else b
        return min(a, b) if op == "min" else max(a, b)
    raise PtxUnsupported(f"{op} on floats")


def _binary(name: str, fn: Callable[[int, int, str, int], int]) -> _Handler:
    def run(t: _Thread, mods: list[str], ops: list[str]) -> None:
        kind, width = _type_of(mods[-1])
        a, b = t.value(ops[1]) & _mask(width), t.value(ops[2]) & _mask(width)
        if kind == "f":
            _float_op(t, name, mods, ops, a, b, width)
        elif kind == "pred":
            t.set(ops[0], fn(int(bool(a)), int(bool(b)), kind, 1))
        else:
            if len(mods) != 1:
                raise PtxUnsupported(f"{name}.{'.'.join(mods)}")
            t.set(ops[0], fn(a, b, kind, width))

    return run


def _float_op(t: _Thread, name: str, mods: list[str], ops: list[str], a: int, b: int, width: int) -> None:
    """add, sub, mul, min, max on floats, rounded to nearest even: float32 is rounded once from float64,
    which holds over 2 x 24 + 2 bits, so correctly rounded. Without a rounding modifier ptxas may fuse a mul
    into the add or sub that reads it (an fma, rounded once): such an add is refused unless the machine is
    `approximate`, as its bits are not the PTX's to fix."""
    if any(m not in ("rn", mods[-1]) for m in mods):  # the default rounding only: no ftz, sat
        raise PtxUnsupported(f"{name}.{'.'.join(mods)}")
    unrounded = mods == [mods[-1]]
    if unrounded and name in ("add", "sub") and not t.m.approximate:
        products = t.unrounded_products
        fused = [op for op in ops[1:3] if op in products and products[op] == t.regs[op]]
        if fused:
            why = f"of the unrounded product {fused[0]}: ptxas may fuse them"
            raise PtxUnsupported(f"{name}.{mods[-1]} {why}")
    out = _from_float(_float_binary(name, _to_float(a, width), _to_float(b, width)), width)
    t.set(ops[0], out)
    if unrounded and name == "mul":
        t.unrounded_products[ops[0]] = t.regs[ops[0]]


def _shift_left(a: int, b: int, kind: str, width: int) -> int:
    return 0 if b >= width else a << b


def _shift_right(a: int, b: int, kind: str, width: int) -> int:
    if kind == "s":
        return _signed(a, width) >> min(b, width - 1)
    return 0 if b >= width else a >> b


def _extreme(pick: Callable[[int, int], int]) -> Callable[[int, int, str, int], int]:
    def fn(a: int, b: int, kind: str, width: int) -> int:
        return pick(_signed(a, width), _signed(b, width)) if kind == "s" else pick(a, b)

    return fn


def _integer_operands(t: _Thread, ops: list[str], kind: str, width: int) -> tuple[int, int]:
    """Operands 1 and 2 at `width` bits, as signed integers for kind s."""
    a, b = t.value(ops[1]) & _mask(width), t.value(ops[2]) & _mask(width)
    return (_signed(a, width), _signed(b, width)) if kind == "s" else (a, b)


def _mul(t: _Thread, mods: list[str], ops: list[str]) -> None:
    kind, width = _type_of(mods[-1])
    if kind == "f":
        _float_op(t, "mul", mods, ops, t.value(ops[1]) & _mask(width), t.value(ops[2]) & _mask(width), width)
        return
    if kind not in ("s", "u") or len(mods) != 2:
        raise PtxUnsupported(f"mul.{'.'.join(mods)}")
    a, b = _integer_operands(t, ops, kind, width)
    shifts = {"wide": 0, "lo": 0, "hi": width}
    if mods[0] not in shifts:
        raise PtxUnsupported(f"mul.{'.'.join(mods)}")
    t.set(ops[0], (a * b) >> shifts[mods[0]])


def _mad(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """mad.lo / .hi / .wide on integers: the product's part, plus c (at the destination's width)."""
    kind, width = _type_of(mods[-1])
    if kind not in ("s", "u") or len(mods) != 2 or mods[0] not in ("lo", "hi", "wide"):
        raise PtxUnsupported(f"mad.{'.'.join(mods)}")
    a, b = _integer_operands(t, ops, kind, width)
    product = (a * b) >> (width if mods[0] == "hi" else 0)
    t.set(ops[0], product + t.value(ops[3]))


def _div(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """div.s / div.u on integers: the quotient rounded toward zero, as C's. A zero divisor and the signed
    minimum over -1 (machine-specific values) are refused. div.rn.f32 is correctly rounded
    (`_float_quotient_or_root`); every other floating-point division is refused."""
    kind, width = _type_of(mods[-1])
    if mods == ["rn", "f32"]:
        _float_quotient_or_root(t, ops, _to_float(t.value(ops[1]), 32), _to_float(t.value(ops[2]), 32))
        return
    if kind not in ("s", "u") or len(mods) != 1:
        raise PtxUnsupported(f"div.{'.'.join(mods)}")
    a, b = _integer_operands(t, ops, kind, width)
    if b == 0 or (kind == "s" and a == -(1 << (width - 1)) and b == -1):
        raise PtxUnsupported(f"div.{mods[-1]} of {a} by {b}: the result is machine-specific")
    quotient = abs(a) // abs(b)
    t.set(ops[0], -quotient if (a < 0) != (b < 0) else quotient)


def _float_quotient_or_root(t: _Thread, ops: list[str], a: float, b: float | None) -> None:
    """div.rn.f32 (b given) or sqrt.rn.f32 (b None), correctly rounded: computed in float64, then rounded to
    float32. The double rounding is innocuous: a quotient's or square root's float64 rounding cannot move it
    across a float32 rounding boundary when 53 >= 2 * 24 + 2 (Figueroa, 1995), subnormal results included.
    Zero divisors, infinities and NaN take numpy's float64 IEEE results."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        x = np.float64(a)
        y = x / np.float64(b) if b is not None else np.sqrt(x)
    t.set(ops[0], _from_float(float(y), 32))


def _sqrt(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """sqrt.rn.f32 only (sqrt.approx is refused)."""
    if mods != ["rn", "f32"]:
        raise PtxUnsupported(f"sqrt.{'.'.join(mods)}")
    _float_quotient_or_root(t, ops, _to_float(t.value(ops[1]), 32), None)


def _not(t: _Thread, mods: list[str], ops: list[str]) -> None:
    _, width = _type_of(mods[-1])
    t.set(ops[0], ~t.value(ops[1]) & _mask(width))


def _neg(t: _Thread, mods: list[str], ops: list[str]) -> None:
    kind, width = _type_of(mods[-1])
    a = t.value(ops[1]) & _mask(width)
    t.set(ops[0], a ^ (1 << (width - 1)) if kind == "f" else -a)  # a float's sign bit, NaN or not


def _mov(t: _Thread, mods: list[str], ops: list[str]) -> None:
    _, width = _type_of(mods[-1])
    if ops[0][0] != "{" and ops[1][0] != "{":  # register to register, the common case
        t.set(ops[0], t.value(ops[1]))
        return
    dests, srcs = _vector(ops[0]), _vector(ops[1])
    if len(dests) > 1:  # a word into its parts, least significant first
        word = t.value(ops[1])
        for i, dest in enumerate(dests):
            t.set(dest, word >> (i * width // len(dests)))
    elif len(srcs) > 1:  # parts into a word
        part, word = width // len(srcs), 0
        for i, src in enumerate(srcs):
            word |= (t.value(src) & _mask(part)) << (i * part)
        t.set(ops[0], word)
    else:
        t.set(ops[0], t.value(ops[1]))


def _cvta(t: _Thread, mods: list[str], ops: list[str]) -> None:
    t.set(ops[0], t.value(ops[1]))  # generic and space addresses coincide here


_TO_INTEGER = {"rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil, "rni": round}  # round: ties to even


def _float_to_integer(x: float, rounding: str, signed: bool, width: int) -> int:
    """cvt from a float to an integer: NaN gives 0, values out of range (infinities too) saturate."""
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, _mask(width))
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return high if x > 0 else low
    return max(low, min(high, _TO_INTEGER[rounding](x)))


def _cvt(t: _Thread, mods: list[str], ops: list[str]) -> None:
    if mods == ["f32", "bf16"]:  # bf16 is float32's upper half: widening is a shift, exact (NaN included)
        t.set(ops[0], (t.value(ops[1]) & 0xFFFF) << 16)
        return
    if mods == ["rn", "bf16", "f32"]:  # nearest even on the dropped half; a NaN: the canonical 0x7FFF
        x = t.value(ops[1]) & _mask(32)
        if math.isnan(_to_float(x, 32)):
            t.set(ops[0], 0x7FFF)
            return
        t.set(ops[0], ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF)  # a carry into the exponent is right
        return
    if mods == ["rn", "f16", "f32"]:  # nearest even, subnormals and overflow to infinity (numpy's IEEE cast)
        x = _to_float(t.value(ops[1]), 32)
        if math.isnan(x):  # which NaN PTX gives is not the interpreter's to fix
            raise PtxUnsupported("cvt.rn.f16.f32 of a NaN")
        with np.errstate(over="ignore"):
            t.set(ops[0], int(np.array([x], dtype=np.float32).astype(np.float16).view(np.uint16)[0]))
        return
    rounding = mods[0] if len(mods) == 3 else None
    if len(mods) not in (2, 3):
        raise PtxUnsupported(f"cvt.{'.'.join(mods)}")
    (dk, dw), (sk, sw) = _type_of(mods[-2]), _type_of(mods[-1])
    a = t.value(ops[1]) & _mask(sw)
    if (dk, dw) == ("f", 32) and sk in ("s", "u") and rounding in ("rn", "rz", "rm", "rp"):
        _float_from_integer(t, mods, ops)
        return
    if mods == ["sat", "f32", "f32"]:
        _saturate(t, mods, ops)
        return
    if (dk, sk, rounding) == ("f", "f", None) and dw > sw:  # widening is exact (a NaN's payload: numpy's)
        t.set(ops[0], _from_float(_to_float(a, sw), dw))
    elif (dk, sk) == ("f", "f") and dw == sw and rounding in _TO_INTEGER:  # to an integral value, same type
        x = _to_float(a, sw)
        r = x if not math.isfinite(x) else float(_TO_INTEGER[rounding](x))
        t.set(ops[0], _from_float(math.copysign(r, x) if r == 0 else r, dw))  # floor(-0.5) is -1, trunc -0
    elif (dk, dw) == ("f", 64) and sk in ("s", "u") and rounding == "rn":  # Python's float(int) rounds so
        t.set(ops[0], _from_float(float(_signed(a, sw) if sk == "s" else a), 64))
    elif sk == "f" and dk in ("s", "u") and rounding in _TO_INTEGER:
        t.set(ops[0], _float_to_integer(_to_float(a, sw), rounding, dk == "s", dw))
    elif "f" in (dk, sk) or rounding is not None:
        raise PtxUnsupported(f"cvt.{'.'.join(mods)}")
    else:  # to the destination type (a narrower one truncates), extended by its signedness to the register
        value = (_signed(a, sw) if sk == "s" else a) & _mask(dw)
        t.set(ops[0], _signed(value, dw) if dk == "s" else value)


_F32_MAX = Fraction(2**24 - 1) * 2**104


def _round_f32(q: Fraction, mode: str) -> int:
    """The float32 bits of the exact nonzero rational q rounded by `mode` (rn: to nearest even; rz, rm, rp:
    toward zero, minus and plus infinity), subnormals included."""
    negative, a = q < 0, abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e + 1), after the correction
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)  # a subnormal's is the smallest normal's
    n = a / quantum
    whole, rest = n.numerator // n.denominator, n - n.numerator // n.denominator
    away = {"rn": rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1), "rz": False,
            "rm": negative and rest > 0, "rp": not negative and rest > 0}[mode]  # fmt: skip
    value = (whole + away) * quantum
    if value > _F32_MAX:  # past the largest float: infinity, or the largest where rounding goes toward it
        to_inf = mode == "rn" or (mode == "rm" and negative) or (mode == "rp" and not negative)
        bits = 0x7F800000 if to_inf else 0x7F7FFFFF
    else:
        bits = _from_float(float(value), 32)  # exact: value is a float32
    return bits | (0x80000000 if negative else 0)


def _fma_f64(t: _Thread, ops: list[str]) -> None:
    """fma.rn.f64: a * b + c rounded once to nearest even from its exact value (a rational; Python's float of
    a Fraction rounds correctly, subnormals included). Infinities and NaNs as IEEE gives them; an overflow is
    refused."""
    a, b, c = (_to_float(t.value(op), 64) for op in ops[1:4])
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        t.set(ops[0], _from_float(a * b + c, 64))
        return
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # two zeros of one sign keep it; an exact cancellation is +0
        product_negative = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
        negative = a * b == 0 and c == 0 and product_negative and math.copysign(1.0, c) < 0
        t.set(ops[0], _from_float(-0.0 if negative else 0.0, 64))
        return
    try:
        t.set(ops[0], _from_float(float(exact), 64))
    except OverflowError as e:
        raise PtxUnsupported("fma.rn.f64 past the largest double") from e


def _fma(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """fma.rn/rz/rm/rp.f32: a * b + c rounded once from its exact value (in float64 where TwoSum shows the
    sum exact there, else in rationals); fma.rn.f64 (`_fma_f64`)."""
    if mods == ["rn", "f64"]:
        _fma_f64(t, ops)
        return
    if len(mods) != 2 or mods[0] not in ("rn", "rz", "rm", "rp") or mods[1] != "f32":
        raise PtxUnsupported(f"fma.{'.'.join(mods)}")
    a, b, c = _to_float(t.value(ops[1]), 32), _to_float(t.value(ops[2]), 32), _to_float(t.value(ops[3]), 32)
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):  # float64 gives IEEE's result
        t.set(ops[0], _from_float(a * b + c, 32))
        return
    if mods[0] == "rn":  # float64 holds a * b exactly; where a * b + c is exact too, one rounding remains
        product = a * b
        total = product + c
        back = total - product
        if total != 0 and (product - (total - back)) + (c - back) == 0:  # TwoSum: the sum's error is 0
            t.set(ops[0], _from_float(total, 32))
            return
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        t.set(ops[0], _round_f32(exact, mods[0]))
        return
    product_negative = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    c_negative = math.copysign(1.0, c) < 0
    # two zeros of one sign keep it; an exact cancellation is +0, -0 rounding toward minus infinity
    same_zeros = a * b == 0 and c == 0 and product_negative == c_negative
    negative = c_negative if same_zeros else mods[0] == "rm"
    t.set(ops[0], 0x80000000 if negative else 0)


def _ex2(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """ex2.approx(.ftz).f32, only on an `approximate` machine: 2^x correctly rounded, which is one of the
    results PTX allows (its maximum error is 2 ulp), not necessarily the GPU's."""
    if not t.m.approximate:
        raise PtxUnsupported(f"ex2.{'.'.join(mods)}: approximate (Machine(approximate=True) opts in)")
    if mods not in (["approx", "ftz", "f32"], ["approx", "f32"]):
        raise PtxUnsupported(f"ex2.{'.'.join(mods)}")
    x = _to_float(t.value(ops[1]), 32)
    if "ftz" in mods and x != 0 and abs(x) < 2.0**-126:
        x = 0.0
    y = x if math.isnan(x) else 2.0**x if x < 1024 else math.inf
    bits = _from_float(y, 32)
    if "ftz" in mods and (bits & 0x7F800000) == 0:  # a subnormal result flushes to zero
        bits &= 0x80000000
    t.set(ops[0], bits)


def _float_from_integer(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """cvt.rn/rz/rm/rp.f32 from an integer register, rounded exactly."""
    (sk, sw), value = _type_of(mods[-1]), t.value(ops[1]) & _mask(_type_of(mods[-1])[1])
    if sk == "s":
        value = _signed(value, sw)
    t.set(ops[0], _round_f32(Fraction(value), mods[0]) if value else 0)


def _saturate(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """cvt.sat.f32.f32: clamped to [0, 1], NaN to 0 (exact)."""
    x = _to_float(t.value(ops[1]), 32)
    t.set(ops[0], _from_float(0.0 if math.isnan(x) else min(max(x, 0.0), 1.0), 32))


_CMP: dict[str, Callable[[float, float], bool]] = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "lo": lambda a, b: a < b, "ls": lambda a, b: a <= b, "hi": lambda a, b: a > b, "hs": lambda a, b: a >= b,
}  # fmt: skip


def _setp(t: _Thread, mods: list[str], ops: list[str]) -> None:
    if len(mods) != 2 or "|" in ops[0]:
        raise PtxUnsupported(f"setp.{'.'.join(mods)} {ops[0]}")
    cmp, (kind, width) = mods[0], _type_of(mods[1])
    a, b = t.value(ops[1]) & _mask(width), t.value(ops[2]) & _mask(width)
    if kind == "f" and cmp in ("nan", "num"):  # whether either operand is a NaN; whether neither is
        either = math.isnan(_to_float(a, width)) or math.isnan(_to_float(b, width))
        t.set(ops[0], int(either == (cmp == "nan")))
        return
    if kind == "f":  # an ordered test is false on a NaN, an unordered one (suffix u) true
        unordered = cmp.endswith("u")
        test = _CMP.get(cmp[:-1] if unordered else cmp)
        if test is None:
            raise PtxUnsupported(f"setp.{'.'.join(mods)}")
        fa, fb = _to_float(a, width), _to_float(b, width)
        t.set(ops[0], int(unordered if math.isnan(fa) or math.isnan(fb) else test(fa, fb)))
        return
    if cmp not in _CMP:
        raise PtxUnsupported(f"setp.{'.'.join(mods)}")
    if kind == "s":
        a, b = _signed(a, width), _signed(b, width)
    t.set(ops[0], int(_CMP[cmp](a, b)))


def _selp(t: _Thread, mods: list[str], ops: list[str]) -> None:
    t.set(ops[0], t.value(ops[1]) if t.value(ops[3]) else t.value(ops[2]))


def _prmt(t: _Thread, mods: list[str], ops: list[str]) -> None:
    if mods != ["b32"]:
        raise PtxUnsupported(f"prmt.{'.'.join(mods)}")
    source = (t.value(ops[2]) & 0xFFFFFFFF) << 32 | (t.value(ops[1]) & 0xFFFFFFFF)
    selector, out = t.value(ops[3]), 0
    for i in range(4):
        s = (selector >> (4 * i)) & 0xF
        byte = (source >> (8 * (s & 7))) & 0xFF
        if s & 8:  # replicate the byte's sign
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    t.set(ops[0], out)


def _bfi(t: _Thread, mods: list[str], ops: list[str]) -> None:
    _, width = _type_of(mods[-1])
    a, b = t.value(ops[1]), t.value(ops[2])
    pos, length = t.value(ops[3]) & 0xFF, t.value(ops[4]) & 0xFF
    if length == 0 or pos >= width:
        t.set(ops[0], b)
        return
    field_mask = _mask(min(length, width - pos)) << pos
    t.set(ops[0], (b & ~field_mask) | ((a << pos) & field_mask))


def _popc(t: _Thread, mods: list[str], ops: list[str]) -> None:
    _, width = _type_of(mods[-1])
    t.set(ops[0], bin(t.value(ops[1]) & _mask(width)).count("1"))


def _memory_type(mods: list[str]) -> tuple[str, int, int, str]:
    """(kind, bits, lanes, space) of a load's or store's modifiers."""
    space, lanes, rest = "generic", 1, []
    for m in mods:
        if m in _SPACES:
            space = m
        elif m in ("v2", "v4"):
            lanes = int(m[1])
        elif m not in _HINTS:
            rest.append(m)
    if len(rest) != 1:
        raise PtxUnsupported(f"ld/st .{'.'.join(mods)}")
    kind, bits = _type_of(rest[0])
    return kind, bits, lanes, space


def _ld(t: _Thread, mods: list[str], ops: list[str]) -> None:
    kind, bits, lanes, space = _memory_type(mods)
    dests, nbytes = _vector(ops[0]), bits // 8
    if len(dests) != lanes:
        raise PtxUnsupported(f"ld into {len(dests)} registers as v{lanes}")
    if space == "param":
        m = _ADDRESS.fullmatch(ops[1].replace(" ", ""))
        if m is None:
            raise PtxUnsupported(f"ld.param {ops[1]}")
        if m.group(1) in t.params:
            data, at = t.params[m.group(1)], int(m.group(2) or "0", 0)
        else:  # through a register holding a parameter's address (Machine._param_space)
            addr = t.address(ops[1])
            found = [n for n in t.params if t.symbols[n] <= addr < t.symbols[n] + len(t.params[n])]
            if not found:
                raise RuntimeError(f"ld.param at {addr:#x}, outside every parameter")
            data, at = t.params[found[0]], addr - t.symbols[found[0]]
        if at < 0 or at + lanes * nbytes > len(data):
            raise RuntimeError(f"ld.param {ops[1]} past its parameter's {len(data)} bytes")
        chunks = [data[at + i * nbytes : at + (i + 1) * nbytes] for i in range(lanes)]
        words = [int.from_bytes(c, "little") for c in chunks]
    else:
        addr = t.address(ops[1])
        if addr % nbytes:
            raise RuntimeError(f"misaligned {bits}-bit load at {addr:#x}")
        t.note(addr, lanes * nbytes, write=False)
        words = [t.m.load(addr + i * nbytes, nbytes) for i in range(lanes)]
    for dest, word in zip(dests, words, strict=True):
        t.set(dest, _signed(word, bits) if kind == "s" else word)


def _st(t: _Thread, mods: list[str], ops: list[str]) -> None:
    _, bits, lanes, space = _memory_type(mods)
    values, nbytes = _vector(ops[1]), bits // 8
    if space == "param" or len(values) != lanes:
        raise PtxUnsupported(f"st.{'.'.join(mods)} {ops[1]}")
    addr = t.address(ops[0])
    if addr % nbytes:
        raise RuntimeError(f"misaligned {bits}-bit store at {addr:#x}")
    t.note(addr, lanes * nbytes, write=True)
    for i, v in enumerate(values):
        t.m.store(addr + i * nbytes, nbytes, t.value(v))


def _atom(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """atom.shared.add.u32 / .u64 (d = the old value, the sum stored): one indivisible read-modify-write, so
    the race detector lets atomics on a byte meet each other, not plain accesses."""
    if len(mods) != 3 or mods[0] != "shared" or mods[1] != "add" or mods[2] not in ("u32", "u64"):
        raise PtxUnsupported(f"atom.{'.'.join(mods)}")
    bits = int(mods[2][1:])
    addr, nbytes = t.address(ops[1]), bits // 8
    if addr % nbytes:
        raise RuntimeError(f"misaligned {bits}-bit atomic at {addr:#x}")
    t.note(addr, nbytes, write=True, atomic=True)
    old = t.m.load(addr, nbytes)
    t.m.store(addr, nbytes, (old + t.value(ops[2])) & _mask(bits))
    t.set(ops[0], old)


def _abs(t: _Thread, mods: list[str], ops: list[str]) -> None:
    """abs.f32 / .f64 (the sign bit cleared, NaN or not; no ftz) and abs.s32 / .s64."""
    kind, width = _type_of(mods[-1])
    if len(mods) != 1:
        raise PtxUnsupported(f"abs.{'.'.join(mods)}")
    a = t.value(ops[1]) & _mask(width)
    t.set(ops[0], a & ~(1 << (width - 1)) if kind == "f" else abs(_signed(a, width)))


_HANDLERS: dict[str, _Handler] = {
    "add": _binary("add", lambda a, b, k, w: a + b),
    "sub": _binary("sub", lambda a, b, k, w: a - b),
    "and": _binary("and", lambda a, b, k, w: a & b),
    "or": _binary("or", lambda a, b, k, w: a | b),
    "xor": _binary("xor", lambda a, b, k, w: a ^ b),
    "shl": _binary("shl", _shift_left),
    "shr": _binary("shr", _shift_right),
    "max": _binary("max", _extreme(max)),
    "min": _binary("min", _extreme(min)),
    "mul": _mul,
    "mad": _mad,
    "div": _div,
    "sqrt": _sqrt,
    "fma": _fma,
    "ex2": _ex2,
    "not": _not,
    "neg": _neg,
    "mov": _mov,
    "cvta": _cvta,
    "cvt": _cvt,
    "setp": _setp,
    "selp": _selp,
    "prmt": _prmt,
    "bfi": _bfi,
    "popc": _popc,
    "ld": _ld,
    "st": _st,
    "atom": _atom,
    "abs": _abs,
}
