"""elpis's EXL3 GEMM for 1-16 rows (`patches/kernels/exl3_gemm_rows.cu`): the binding.

`rows_gemm(x, trellis, suh, svh)` is the EXL3 linear `((x * suh) H) D H * svh` of a 4- or 6-bit mul1
trellis (the body and the output head of the served model) for 1..16 rows, every weight decoded once and fed
to tensor cores; `rows_gemm_group(x, members)` runs up to four such linears that share the input x in one
call (one input-transform launch and one GEMM launch, the members' n-blocks in one stream-K grid);
`decode(trellis)` is the decoded D alone, for tests against `elpis.exl3.trellis_ref` and ExLlamaV3's own
decode. The work schedule is the proved one of
`build/kernels/gemm_schedule.h`: nothing in it depends on the row count. A member's result does depend on
the group it runs in (the group's total width sets the partition), so a caller keeps its groups fixed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from elpis import nvcc
from elpis.exl3.tensors import check_tensor
from elpis.paths import BUILD_DIR, REPO_ROOT

if TYPE_CHECKING:
    import torch

SOURCE = REPO_ROOT / "patches" / "kernels" / "exl3_gemm_rows.cu"
SCHEDULE_HEADER = BUILD_DIR / "kernels" / "gemm_schedule.h"
BITS = (4, 6)  # trellis widths the kernel decodes
MAX_ROWS = 16
MAX_MEMBERS = 4  # linears of one call
MAX_COUNTERS = 4096  # n-blocks of 128 columns, all members together: up to n = 524,288
MAX_GROUPS = 4096  # 128-groups of k: up to k = 524,288
BF16_SHIFT = 8  # out_modes: bit BF16_SHIFT + i asks member i for bf16 channel-major output (kBf16Shift)

_VP, _U32, _U64, _F32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float
# x, m, k, count, suh[], trellis[], svh[], out[], n[] (host arrays of `count`),
# out_modes (bit i: member i fp32, bit BF16_SHIFT + i: bf16 channel-major),
# bits, a_frag, frag_halves, workspace, workspace_floats, counters, counters_len, stream
GEMM_ARGS = (_VP, _U32, _U32, _U32, _VP, _VP, _VP, _VP, _VP, _U32, _U32, _VP, _U64, _VP, _U64, _VP, _U32, _VP)
DECODE_ARGS = (_VP, _VP, _U32, _U32, _U32, _VP)  # trellis, d, k, n, bits, stream
# ctypes signatures of the entries (a CPU test checks them against the kernel source); the SiLU-and-multiply
# entry takes g, u and act in place of x
# x, x_fp32, residual, weight, weight_bf16, y, eps, bias, scale, m, k, count, suh[], a_frag, frag_halves,
# stream
NORM_ARGS = (_VP, _U32, _VP, _VP, _U32, _VP, _F32, _F32, _F32, _U32, _U32, _U32, _VP, _VP, _U64, _VP)
ENTRY_ARGS = {
    "elpis_rows_gemm": GEMM_ARGS,
    "elpis_rows_gemm_silu_mul": (_VP, _VP, *GEMM_ARGS),
    "elpis_rows_gemm_frags": GEMM_ARGS[1:],
    "elpis_rows_gemm_norm_input": NORM_ARGS,
    "elpis_rows_gemm_decode": DECODE_ARGS,
}
SIZE_ENTRIES = {
    "elpis_rows_gemm_supported": ((_U32, _U32, _U32), _U32),
    "elpis_rows_gemm_bits_supported": ((_U32,), _U32),
    "elpis_rows_gemm_max_members": ((), _U32),
    "elpis_rows_gemm_max_nblocks": ((), _U32),
    "elpis_rows_gemm_blocks": ((_U32, _U32, _U32), _U32),
    "elpis_rows_gemm_resident_blocks": ((_U32,), _U32),
    "elpis_rows_gemm_frag_halves": ((_U32, _U32), _U64),
    "elpis_rows_gemm_workspace_floats": ((_U32, _U32, _U32, _U32), _U64),
    "elpis_rows_gemm_counters": ((_U32,), _U32),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every entry of a build (GPU or emulated)."""
    nvcc.set_signatures(lib, ENTRY_ARGS)
    sizes = {name: argtypes for name, (argtypes, _) in SIZE_ENTRIES.items()}
    return nvcc.set_signatures(lib, sizes, {name: restype for name, (_, restype) in SIZE_ENTRIES.items()})


@lru_cache(maxsize=8)
def library(source: Path = SOURCE, stages: int | None = None) -> ctypes.CDLL:
    """The build (`stages`: k-tiles of weights in flight per warp, ELPIS_GEMM_STAGES; None: the source's
    default), bound."""
    if not SCHEDULE_HEADER.is_file():
        raise RuntimeError(f"GEMM schedule not built ({SCHEDULE_HEADER} missing): run make build")
    return bind(nvcc.load(source, defines={} if stages is None else {"ELPIS_GEMM_STAGES": stages}))


@lru_cache(maxsize=8)
def sync_words(device: str) -> torch.Tensor:
    """The zero words the kernel's last block per n-block counts on (each launch leaves them zero)."""
    import torch

    return torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)


def supported(rows: int, k: int, n: int, bits: int = 4) -> bool:
    """Whether the kernel takes this shape: 1..16 rows, k and n multiples of 128 (up to 524,288), a 4- or
    6-bit trellis (the C entry `elpis_rows_gemm_supported` says the same)."""
    return (
        bits in BITS
        and 1 <= rows <= MAX_ROWS
        and k % 128 == 0
        and n % 128 == 0
        and 1 <= k // 128 <= MAX_GROUPS
        and 1 <= n // 128 <= MAX_COUNTERS
    )


def norm_supported(rows: int, k: int) -> bool:
    """Whether `norm_input` takes this shape: 1..16 rows of 4096 < k <= 8192 values, k a multiple of 128 (the
    rows ExLlamaV3 norms in two passes of 1,024 threads, at most two float4 columns a thread; the C entry
    `elpis_rows_gemm_norm_input` refuses the same)."""
    return 1 <= rows <= MAX_ROWS and k % 128 == 0 and 4096 < k <= 8192


class Member(NamedTuple):
    """One EXL3 linear of a call: trellis [k/16, n/16, 16 * bits] int16, suh [k], svh [n] fp16, and the
    output's dtype: fp16 or fp32 [m, n], or bf16, which the kernel writes channel-major ([n, m] in memory, the
    fp16 output's bits cast to bf16) and the call returns as its [m, n] transposed view."""

    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    out_dtype: torch.dtype


def void_ptrs(*pointers: int | None) -> ctypes.Array:
    return (ctypes.c_void_p * len(pointers))(*pointers)


def trellis_bits(trellis: torch.Tensor) -> int:
    """The width of a trellis [k/16, n/16, 16 * bits] the kernel decodes (ValueError for any other)."""
    if trellis.dim() != 3 or trellis.shape[2] not in tuple(16 * b for b in BITS):
        widths = " or ".join(str(16 * b) for b in BITS)
        raise ValueError(f"rows_gemm: trellis must be [k/16, n/16, {widths}], got {tuple(trellis.shape)}")
    return int(trellis.shape[2]) // 16


def rows_gemm_group(
    x: torch.Tensor, members: Sequence[Member], lib: ctypes.CDLL | None = None
) -> list[torch.Tensor]:
    """y_i [m, n_i] of x [m, k] fp16 through each member's EXL3 linear, in one call (all members of one
    trellis width)."""
    import torch

    if x.dim() != 2:
        raise ValueError(f"rows_gemm: x must be [rows, k], got shape {tuple(x.shape)}")
    check_tensor("rows_gemm: x", x, torch.half, tuple(x.shape))
    lib = lib or library()
    return _call(lib, lib.elpis_rows_gemm, (x.data_ptr(),), x.shape[0], x.shape[1], x.device, members)


def rows_gemm_silu_mul(
    g: torch.Tensor,
    u: torch.Tensor,
    members: Sequence[Member],
    lib: ctypes.CDLL | None = None,
    act: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`rows_gemm_group(act, members)` of act = silu(g) * u (g, u [m, k] fp16), computed in fp16 arithmetic as
    ExLlamaV3 1.6.5's SiLU-and-multiply does (`silu_mul`, act_limit 0) inside the input transform's launch;
    returns the outputs and act, which the kernel also writes (into `act` when given: [m, k] fp16, possibly u
    itself, as in ExLlamaV3's in-place call)."""
    import torch

    if g.dim() != 2 or g.shape != u.shape:
        raise ValueError(f"rows_gemm: g and u must share one [rows, k] shape, got {g.shape} and {u.shape}")
    check_tensor("rows_gemm: g", g, torch.half, tuple(g.shape), align=4)  # read as fp16 pairs
    check_tensor("rows_gemm: u", u, torch.half, tuple(u.shape), align=4)
    if u.device != g.device:
        raise ValueError("rows_gemm: g and u must be on one device")
    lib = lib or library()
    if act is None:
        act = torch.empty_like(g)
    else:
        check_tensor("rows_gemm: act", act, torch.half, tuple(g.shape), align=4)
        if act.device != g.device:
            raise ValueError("rows_gemm: act must be on g's device")
    lead = (g.data_ptr(), u.data_ptr(), act.data_ptr())
    return _call(lib, lib.elpis_rows_gemm_silu_mul, lead, g.shape[0], g.shape[1], g.device, members), act


def _call(
    lib: ctypes.CDLL,
    entry,
    lead: tuple[int, ...],
    m: int,
    k: int,
    device,
    members: Sequence[Member],
    a_frag: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Check the members, make the outputs and scratch, launch `entry` after the input arguments `lead`."""
    import torch

    if not 1 <= len(members) <= MAX_MEMBERS:
        raise ValueError(f"rows_gemm: a call takes 1..{MAX_MEMBERS} linears, got {len(members)}")
    widths = []
    bits = trellis_bits(members[0].trellis)
    for i, member in enumerate(members):
        trellis = member.trellis
        if trellis_bits(trellis) != bits:
            raise ValueError(
                f"rows_gemm: one call takes one trellis width, got {bits} and {trellis_bits(trellis)}"
            )
        n = trellis.shape[1] * 16
        if not supported(m, k, n, bits):
            raise ValueError(
                f"rows_gemm: {m} rows, k={k}, n={n} is outside the kernel (1..16 rows, k, n % 128 == 0)"
            )
        if member.out_dtype not in (torch.half, torch.float, torch.bfloat16):
            raise ValueError(
                "rows_gemm: out_dtype must be float16, float32 or bfloat16 (channel-major), "
                f"got {member.out_dtype}"
            )
        check_tensor(f"rows_gemm: trellis {i}", trellis, torch.int16, (k // 16, n // 16, 16 * bits))
        check_tensor(f"rows_gemm: suh {i}", member.suh, torch.half, (k,))
        check_tensor(f"rows_gemm: svh {i}", member.svh, torch.half, (n,))
        if member.svh.data_ptr() % 8:
            raise ValueError(f"rows_gemm: svh {i} must start on an 8-byte boundary (read 4 scales at a time)")
        widths.append(n)
    n_total = sum(widths)
    if n_total // 128 > MAX_COUNTERS:
        raise ValueError(
            f"rows_gemm: {n_total} output columns in one call, the kernel takes {MAX_COUNTERS * 128}"
        )
    frag_halves = int(lib.elpis_rows_gemm_frag_halves(m, k)) * len(members)
    floats = int(lib.elpis_rows_gemm_workspace_floats(m, k, n_total, bits))
    if a_frag is None:
        a_frag = torch.empty(frag_halves, dtype=torch.half, device=device)
    else:  # written by an earlier launch (norm_input) for exactly these members
        check_tensor("rows_gemm: a_frag", a_frag, torch.half, (frag_halves,))
    workspace = torch.empty(max(floats, 1), dtype=torch.float32, device=device)
    counters = sync_words(str(device))
    outs = [
        torch.empty((n, m), dtype=mb.out_dtype, device=device).t()
        if mb.out_dtype == torch.bfloat16
        else torch.empty((m, n), dtype=mb.out_dtype, device=device)
        for mb, n in zip(members, widths, strict=True)
    ]
    out_modes = sum(1 << i for i, mb in enumerate(members) if mb.out_dtype == torch.float)
    out_modes |= sum(1 << (BF16_SHIFT + i) for i, mb in enumerate(members) if mb.out_dtype == torch.bfloat16)
    stream = torch.cuda.current_stream(device).cuda_stream
    err = entry(
        *lead, m, k, len(members),
        void_ptrs(*(mb.suh.data_ptr() for mb in members)),
        void_ptrs(*(mb.trellis.data_ptr() for mb in members)),
        void_ptrs(*(mb.svh.data_ptr() for mb in members)), void_ptrs(*(y.data_ptr() for y in outs)),
        (ctypes.c_uint32 * len(widths))(*widths), out_modes, bits, a_frag.data_ptr(), frag_halves,
        workspace.data_ptr(), floats, counters.data_ptr(), MAX_COUNTERS, stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"rows_gemm kernel failed: CUDA error {err}")
    return outs


def norm_input(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    bias: float,
    scale: float,
    suhs: Sequence[torch.Tensor],
    residual: torch.Tensor | None = None,
    lib: ctypes.CDLL | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ExLlamaV3 1.6.5's RMSNorm (`rms_norm`, or `rms_norm_res_in` with `residual`) of x [m, k] into y
    [m, k] fp16, with the same operations in the same order, and in the same launch the input fragments of
    the linears whose input scales are `suhs` (one call's members, in order) for `rows_gemm_frags`. x is fp16
    or fp32; residual [m, k] fp32 becomes residual + x, and the norm is of that; weight [k]
    fp16 or bf16 (bias added to it when not 0). Takes 1..16 rows and 4096 < k <= 8192. Returns y and the
    fragments."""
    import torch

    lib = lib or library()
    if x.dim() != 2:
        raise ValueError(f"norm_input: x must be [rows, k], got shape {tuple(x.shape)}")
    m, k = x.shape
    if not norm_supported(m, k):
        raise ValueError(f"norm_input: {m} rows of {k} is outside the kernel (1..16 rows, 4096 < k <= 8192)")
    if x.dtype not in (torch.half, torch.float):
        raise ValueError(f"norm_input: x must be fp16 or fp32, got {x.dtype}")
    check_tensor("norm_input: x", x, x.dtype, (m, k))
    if residual is not None:
        check_tensor("norm_input: residual", residual, torch.float, (m, k))
    if weight.dtype not in (torch.half, torch.bfloat16):
        raise ValueError(f"norm_input: weight must be fp16 or bf16, got {weight.dtype}")
    check_tensor("norm_input: weight", weight, weight.dtype, (k,))
    if not 1 <= len(suhs) <= MAX_MEMBERS:
        raise ValueError(f"norm_input: 1..{MAX_MEMBERS} linears, got {len(suhs)}")
    for i, suh in enumerate(suhs):
        check_tensor(f"norm_input: suh {i}", suh, torch.half, (k,))
    y = torch.empty((m, k), dtype=torch.half, device=x.device)
    frag_halves = int(lib.elpis_rows_gemm_frag_halves(m, k)) * len(suhs)
    a_frag = torch.empty(frag_halves, dtype=torch.half, device=x.device)
    err = lib.elpis_rows_gemm_norm_input(
        x.data_ptr(), int(x.dtype == torch.float), residual.data_ptr() if residual is not None else None,
        weight.data_ptr(), int(weight.dtype == torch.bfloat16), y.data_ptr(), eps, bias, scale, m, k,
        len(suhs), void_ptrs(*(suh.data_ptr() for suh in suhs)), a_frag.data_ptr(), frag_halves,
        torch.cuda.current_stream(x.device).cuda_stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"norm_input kernel failed: CUDA error {err}")
    return y, a_frag


def rows_gemm_frags(
    a_frag: torch.Tensor, m: int, k: int, members: Sequence[Member], lib: ctypes.CDLL | None = None
) -> list[torch.Tensor]:
    """`rows_gemm_group` of an input whose fragments `norm_input` wrote for these members (their suh, in this
    order): the GEMM launch alone."""
    lib = lib or library()
    return _call(lib, lib.elpis_rows_gemm_frags, (), m, k, a_frag.device, members, a_frag)


def rows_gemm(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """y [m, n] of x [m, k] fp16 through one EXL3 linear (trellis [k/16, n/16, 16 * bits] int16, suh [k],
    svh [n] fp16); `out_dtype` fp16 (default), fp32, or bf16 (channel-major, see Member)."""
    import torch

    return rows_gemm_group(x, [Member(trellis, suh, svh, out_dtype or torch.half)], lib)[0]


def decode(trellis: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """D [k, n] fp16 of a 4- or 6-bit mul1 trellis [k/16, n/16, 16 * bits] (int16, CUDA)."""
    import torch

    lib = lib or library()
    bits = trellis_bits(trellis)
    kt, nt, _ = trellis.shape
    check_tensor("rows_gemm: trellis", trellis, torch.int16, (kt, nt, 16 * bits))
    d = torch.empty((kt * 16, nt * 16), dtype=torch.half, device=trellis.device)
    stream = torch.cuda.current_stream(trellis.device).cuda_stream
    err = lib.elpis_rows_gemm_decode(trellis.data_ptr(), d.data_ptr(), kt * 16, nt * 16, bits, stream)
    if err != 0:
        raise RuntimeError(f"rows_gemm decode failed: CUDA error {err}")
    return d
