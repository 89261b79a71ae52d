"""Python entry to the tree-verify attention kernel (`patches/kernels/tree_attention.cu`).

`tree_attention(q, k_cache, v_cache, block_table, ctx, depth, ancestors)` attends every tree row to the
committed context plus exactly its ancestors and itself (depth and ancestor bitmasks from
`elpis.accept.tree_masks`), over a paged fp16 cache, with the proved split schedule compiled into the
kernel (build/kernels/verify_schedule.h, written by `make build`). A row's output is bit-identical to the
same call for that row alone at context ctx + depth (plain decoding); see the kernel's header comment.

The library is built by `elpis.nvcc.load` for the current GPU and called through ctypes with device
pointers on the current stream. Inputs are validated here, with messages naming the bad argument.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elpis.exl3.tensors import check_tensor
from elpis.paths import BUILD_DIR, PATCHES_DIR

if TYPE_CHECKING:
    import torch

SOURCE = PATCHES_DIR / "kernels" / "tree_attention.cu"
SOURCE_MMA = PATCHES_DIR / "kernels" / "tree_attention_mma.cu"
HEAD_DIM = 256
Q_HEADS = 24
KV_HEADS = 4
PAGE = 256
MAX_ROWS = 16
# The kernel's grid holds 65535 splits: positions below split_begin(65535) of bend/verify_schedule.bend (a
# test checks the figure); the schedule's laws hold up to 2^31.
MAX_SPAN = 65536 + (65535 - 176) * 2048
DEFAULT_SCALE = 1.0 / math.sqrt(HEAD_DIM)


_VP = ctypes.c_void_p
# After the cache pointers, both entries take: block_table, depth, ancestors, rows, ctx, max_depth, scale,
# out, lse, workspace, workspace_floats, stream.
_TAIL_ARGS = (
    _VP, _VP, _VP, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_float, _VP, _VP, _VP,
    ctypes.c_uint64, _VP,
)  # fmt: skip
# q, k_cache, v_cache (fp16 pages)
FP16_ARGS = (_VP, _VP, _VP, *_TAIL_ARGS)
# q, qk, sk, qv, sv (packed words and scales of K and V)
QCACHE_ARGS = (_VP, _VP, _VP, _VP, _VP, *_TAIL_ARGS)
# ctypes signatures of the launch entries (a CPU test checks them against the kernel source)
ENTRY_ARGS = {"elpis_tree_attention": FP16_ARGS, "elpis_tree_attention_qcache": QCACHE_ARGS}
# The graph form: q, qk, sk, qv, sv, block_table, depth, ancestors, rows, ctx_dev, max_ctx, scale, out, lse,
# workspace, workspace_floats, stream
MMA_DEV_ARGS = (
    _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, ctypes.c_uint32, _VP, ctypes.c_uint32, ctypes.c_float,
    _VP, _VP, _VP, ctypes.c_uint64, _VP,
)  # fmt: skip
MMA_ENTRY_ARGS = {"elpis_tree_attention_mma": QCACHE_ARGS, "elpis_tree_attention_mma_dev": MMA_DEV_ARGS}


def _load(defines: dict[str, int], source: Path = SOURCE, include_dirs: Sequence[Path] = ()) -> ctypes.CDLL:
    """`include_dirs` come before the build's own (a diagnostic's other schedule header)."""
    from elpis import nvcc

    header = BUILD_DIR / "kernels" / "verify_schedule.h"
    if not header.is_file():
        raise RuntimeError(f"tree attention schedule not built ({header} missing): run make build")
    lib = nvcc.load(source, defines=defines, include_dirs=tuple(include_dirs))
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    lib.elpis_tree_attention_workspace_floats.argtypes = [u32, u32, u32]
    lib.elpis_tree_attention_workspace_floats.restype = u64
    lib.elpis_tree_attention_max_splits.argtypes = [u32, u32]
    lib.elpis_tree_attention_max_splits.restype = u32
    return lib


@lru_cache(maxsize=2)
def _library(staged: bool = True) -> ctypes.CDLL:
    lib = _load({"ELPIS_TREE_ATTN_STAGED": int(staged)})
    lib.elpis_tree_attention.argtypes = list(FP16_ARGS)
    lib.elpis_tree_attention.restype = ctypes.c_int
    return lib


@lru_cache(maxsize=4)
def _qcache_library(k_bits: int, v_bits: int) -> ctypes.CDLL:
    lib = _load(
        {
            "ELPIS_TREE_ATTN_STAGED": 1,
            "ELPIS_TREE_ATTN_QCACHE": 1,
            "ELPIS_QCACHE_K_BITS": k_bits,
            "ELPIS_QCACHE_V_BITS": v_bits,
        }
    )
    lib.elpis_tree_attention_qcache.argtypes = list(QCACHE_ARGS)
    lib.elpis_tree_attention_qcache.restype = ctypes.c_int
    return _check_bits(lib, k_bits, v_bits)


# Registry switch of the fold build (kind switch, read here): see hadamard_fold_default.
FOLD_PATCH = "exl3-attn-hadamard-fold"


@lru_cache(maxsize=1)
def hadamard_fold_default() -> bool:
    """Whether the tensor-core attention folds the cache's Hadamard rotation into its queries and outputs
    (ELPIS_MMA_HADAMARD_FOLD, see the kernel) when the caller does not say: the registry switch
    exl3-attn-hadamard-fold, read once per process, so that every call of a process - a tree verify's rows
    and plain decoding's one row alike - runs the same build."""
    from elpis.exl3 import patches

    return patches.enabled(FOLD_PATCH)


@lru_cache(maxsize=8)
def _mma_library(k_bits: int, v_bits: int, pipelined: bool = True, fold: bool = False) -> ctypes.CDLL:
    """The tensor-core build; `pipelined` False builds the direct staging the pipelined one replaced (same
    bits, kept to prove that on the GPU and to time the two side by side); `fold` builds the kernel that
    folds the cache's rotation into the queries and outputs (other rounding: served only under its switch)."""
    defines = {"ELPIS_QCACHE_K_BITS": k_bits, "ELPIS_QCACHE_V_BITS": v_bits}
    defines["ELPIS_MMA_PREFETCH"] = int(pipelined)
    defines["ELPIS_MMA_HADAMARD_FOLD"] = int(fold)
    return _check_bits(load_mma(defines), k_bits, v_bits)


def load_mma(
    defines: dict[str, int], source: Path = SOURCE_MMA, include_dirs: Sequence[Path] = ()
) -> ctypes.CDLL:
    """A build of the tensor-core source (`source`: the served one, or another version of it) with its entry
    points bound; the served builds go through `_mma_library`, diagnostics call this directly. Unless
    `defines` says, the build folds the rotation as the served one does (`hadamard_fold_default`)."""
    defines = {"ELPIS_MMA_HADAMARD_FOLD": int(hadamard_fold_default()), **defines}
    lib = _load(defines, source, include_dirs)
    for name, argtypes in MMA_ENTRY_ARGS.items():
        getattr(lib, name).argtypes = list(argtypes)
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _check_bits(lib: ctypes.CDLL, k_bits: int, v_bits: int) -> ctypes.CDLL:
    lib.elpis_tree_attention_qcache_bits.argtypes = []
    lib.elpis_tree_attention_qcache_bits.restype = ctypes.c_uint32
    built = int(lib.elpis_tree_attention_qcache_bits())
    if built != k_bits * 16 + v_bits:
        raise RuntimeError(f"quantized tree attention build has bits {built:#x}, wanted {k_bits}/{v_bits}")
    return lib


def check_masks(depth: Sequence[int], ancestors: Sequence[int]) -> None:
    """Refuse depth/ancestor lists that are not tree_masks output for a legal tree (row r's mask holds r and
    rows below it only, and as many rows as depth + 1; row 0 is the root)."""
    rows = len(depth)
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"tree attention takes 1..{MAX_ROWS} rows, got {rows}")
    if len(ancestors) != rows:
        raise ValueError(f"depth has {rows} rows but ancestors has {len(ancestors)}")
    if depth[0] != 0 or ancestors[0] != 1:
        raise ValueError(
            f"row 0 must be the root (depth 0, ancestors 0b1), got depth {depth[0]}, "
            f"ancestors {ancestors[0]:#x}"
        )
    for r, (d, a) in enumerate(zip(depth, ancestors, strict=True)):
        if not (isinstance(d, int) and isinstance(a, int)):
            raise ValueError(f"row {r}: depth and ancestors must be ints")
        if not (a >> r) & 1 or a >> (r + 1) or a < 0:
            raise ValueError(f"row {r}: ancestors {a:#x} must contain row {r} and only rows below it")
        if bin(a).count("1") != d + 1:
            raise ValueError(f"row {r}: depth {d} but {bin(a).count('1')} rows in its ancestor mask")


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx: int,
    depth: Sequence[int],
    ancestors: Sequence[int],
    *,
    scale: float = DEFAULT_SCALE,
    return_lse: bool = False,
    staged: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of R tree rows (q [R, 24, 256] fp16) over a paged fp16 cache [pages, 256, 4, 256].

    `block_table` (int32 [n]) maps cache page i (slots 256i .. 256i+255) to a page of the caches; it must
    cover slots 0 .. ctx+R-1. Committed positions are slots 0 .. ctx-1; tree row r's own K/V is at slot
    ctx + r. `depth`/`ancestors`: `elpis.accept.tree_masks(parents)`. Returns fp16 [R, 24, 256] (and the
    log-sum-exp fp32 [R, 24] of the scaled scores with `return_lse`). `staged=False` selects the build
    that reads K/V straight from global memory instead of through shared-memory tiles (same arithmetic,
    same bits; kept as the cross-check of the staged build).
    """
    import torch

    rows = len(depth)
    check_masks(depth, ancestors)
    check_tensor("q", q, torch.half, (rows, Q_HEADS, HEAD_DIM), align=16)
    check_tensor("k_cache", k_cache, torch.half, (None, PAGE, KV_HEADS, HEAD_DIM), align=16)
    check_tensor("v_cache", v_cache, torch.half, tuple(k_cache.shape), align=16)
    block_table = _check_call(q, (k_cache, v_cache), block_table, ctx, rows, scale)
    lib = _library(bool(staged))
    return _run(lib.elpis_tree_attention, lib, q, (k_cache, v_cache), block_table, ctx, depth, ancestors,
                scale, return_lse)  # fmt: skip


def _check_call(
    q: torch.Tensor,
    caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    ctx: int,
    rows: int,
    scale: float,
) -> torch.Tensor:
    """Checks shared by both builds; returns the block table as one row."""
    import torch

    if isinstance(block_table, torch.Tensor) and block_table.dim() == 2 and block_table.shape[0] == 1:
        block_table = block_table[0]
    check_tensor("block_table", block_table, torch.int32, (None,), align=16)
    if any(t.device != q.device for t in (*caches, block_table)):
        raise ValueError("q, the cache tensors and block_table must be on the same device")
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0 or ctx + rows > MAX_SPAN:
        raise ValueError(f"ctx must be an int in 0..{MAX_SPAN - rows}, got {ctx!r}")
    if block_table.shape[0] * PAGE < ctx + rows:
        raise ValueError(
            f"block_table covers {block_table.shape[0] * PAGE} slots; "
            f"ctx {ctx} + {rows} rows need {ctx + rows}"
        )
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    return block_table


@lru_cache(maxsize=256)
def _device_masks(depth: tuple[int, ...], ancestors: tuple[int, ...], device: str) -> torch.Tensor:
    """depth then ancestors as int32 on `device`, uploaded once per tree shape in stream order: every
    attention layer of a verify reads the same masks, and a synchronising upload per layer would stall the
    host 16 times per forward. The cached tensors are never written."""
    import torch

    from elpis.exl3.upload import upload

    return upload([*depth, *ancestors], torch.int32, device)


def _run(
    entry: Any,
    lib: ctypes.CDLL,
    q: torch.Tensor,
    caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    ctx: int,
    depth: Sequence[int],
    ancestors: Sequence[int],
    scale: float,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    import torch

    rows, device = len(depth), q.device
    max_depth = max(depth)
    masks = _device_masks(tuple(depth), tuple(ancestors), str(device))
    floats = int(lib.elpis_tree_attention_workspace_floats(rows, ctx, max_depth))
    workspace = torch.empty(floats, dtype=torch.float32, device=device)
    out = torch.empty((rows, Q_HEADS, HEAD_DIM), dtype=torch.half, device=device)
    lse = torch.empty((rows, Q_HEADS), dtype=torch.float32, device=device) if return_lse else None
    stream = torch.cuda.current_stream(device).cuda_stream
    err = entry(
        q.data_ptr(), *(t.data_ptr() for t in caches), block_table.data_ptr(),
        masks.data_ptr(), masks.data_ptr() + 4 * rows, rows, ctx, max_depth, float(scale),
        out.data_ptr(), lse.data_ptr() if lse is not None else None, workspace.data_ptr(), floats, stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"tree attention kernel failed: CUDA error {err}")
    return (out, lse) if lse is not None else out


def qcache_bits(name: str, packed: torch.Tensor) -> int:
    """Bits per value of a packed quantized cache tensor [pages, 256, 32 * bits] (int32)."""
    from elpis.exl3 import qcache_ref

    groups = KV_HEADS * HEAD_DIM // qcache_ref.GROUP
    width = packed.shape[-1] if packed.dim() == 3 else -1
    if width % groups or not qcache_ref.MIN_BITS <= width // groups <= qcache_ref.MAX_BITS:
        raise ValueError(
            f"{name} must have shape [pages, {PAGE}, {groups} * bits] with bits "
            f"{qcache_ref.MIN_BITS}..{qcache_ref.MAX_BITS}, got {list(packed.shape)}"
        )
    return width // groups


def tree_attention_qcache(
    q: torch.Tensor,
    qk: torch.Tensor,
    sk: torch.Tensor,
    qv: torch.Tensor,
    sv: torch.Tensor,
    block_table: torch.Tensor,
    ctx: int,
    depth: Sequence[int],
    ancestors: Sequence[int],
    *,
    scale: float = DEFAULT_SCALE,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`tree_attention` reading ExLlamaV3's quantized paged cache directly (`CacheLayer_quant` with
    compand_a 0: `layer.qk, layer.sk, layer.qv, layer.sv`), dequantising in registers. Its output is
    bit-identical to `tree_attention` over the fp16 pages `layer.get_kv` returns, with no fp16 window.

    qk [pages, 256, 32 * k_bits] and qv [pages, 256, 32 * v_bits] int32 (bits 2..8, read from the
    shapes), sk and sv [pages, 256, 32] fp16; block table, ctx, depth, ancestors as in `tree_attention`.
    Passing a cache made with compand_a > 0 gives wrong values: the caller must refuse it (the tensors do
    not record it).
    """
    caches = (qk, sk, qv, sv)
    return _quantized_call(
        _qcache_library, "elpis_tree_attention_qcache", q, caches, block_table, ctx, depth, ancestors, scale,
        return_lse,
    )  # fmt: skip


def tree_attention_mma(
    q: torch.Tensor,
    qk: torch.Tensor,
    sk: torch.Tensor,
    qv: torch.Tensor,
    sv: torch.Tensor,
    block_table: torch.Tensor,
    ctx: int,
    depth: Sequence[int],
    ancestors: Sequence[int],
    *,
    scale: float = DEFAULT_SCALE,
    return_lse: bool = False,
    pipelined: bool = True,
    fold: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The tensor-core build (`patches/kernels/tree_attention_mma.cu`) of `tree_attention_qcache`: same
    arguments, same schedule and row invariance, one block per (split, K/V head) serving every row. P enters
    the tensor cores in fp16, so its values differ from the fp32 SIMT build in the last bits (measured
    against fp64 by the GPU tests); a row's bits still never depend on the other rows. `pipelined` False
    runs the direct staging (tests and timings only: same bits, slower). `fold` picks the build that folds
    the cache's rotation into the queries and outputs (None: the registry switch, `hadamard_fold_default`)."""
    caches = (qk, sk, qv, sv)
    fold = hadamard_fold_default() if fold is None else fold
    library = partial(_mma_library, pipelined=pipelined, fold=fold)
    return _quantized_call(
        library, "elpis_tree_attention_mma", q, caches, block_table, ctx, depth, ancestors, scale,
        return_lse,
    )  # fmt: skip


def tree_attention_mma_graph(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    block_table: torch.Tensor,
    ctx_dev: torch.Tensor,
    max_ctx: int,
    masks: torch.Tensor,
    *,
    scale: float = DEFAULT_SCALE,
    fold: bool | None = None,
) -> torch.Tensor:
    """`tree_attention_mma` in the form a CUDA graph can capture: the context length (`ctx_dev`, int32 [1])
    and the masks (`masks`, int32 [2 * rows]: depth then ancestors, as `tree_masks` gives them) are read
    from device memory when the kernels run, so one captured launch serves every tree of `rows` rows at
    every context up to `max_ctx`. Nothing here reads device memory: the caller fills `ctx_dev` and `masks`
    with a checked tree (`check_masks`) and a context with ctx + rows <= max_ctx, and `block_table` (int32
    [pages]) must cover max_ctx positions. The arithmetic is `tree_attention_mma`'s at the same context."""
    import torch

    qk, sk, qv, sv = caches
    rows = q.shape[0]
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"tree attention takes 1..{MAX_ROWS} rows, got {rows}")
    check_tensor("q", q, torch.half, (rows, Q_HEADS, HEAD_DIM), align=16)
    check_tensor("ctx_dev", ctx_dev, torch.int32, (1,), align=16)
    check_tensor("masks", masks, torch.int32, (2 * rows,), align=16)
    check_tensor("block_table", block_table, torch.int32, (None,), align=16)
    if not 1 <= max_ctx <= MAX_SPAN or block_table.shape[0] * PAGE < max_ctx:
        raise ValueError(
            f"max_ctx {max_ctx}: must be in 1..{MAX_SPAN} and covered by the block table "
            f"({block_table.shape[0]} pages)"
        )
    if any(t.device != q.device for t in (*caches, block_table, ctx_dev, masks)):
        raise ValueError("every tensor of a tree attention call must be on q's device")
    if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    fold = hadamard_fold_default() if fold is None else fold
    lib = _mma_library(qcache_bits("qk", qk), qcache_bits("qv", qv), fold=fold)
    floats = int(lib.elpis_tree_attention_workspace_floats(rows, max_ctx, rows - 1))
    workspace = torch.empty(floats, dtype=torch.float32, device=q.device)
    out = torch.empty((rows, Q_HEADS, HEAD_DIM), dtype=torch.half, device=q.device)
    err = lib.elpis_tree_attention_mma_dev(
        q.data_ptr(), qk.data_ptr(), sk.data_ptr(), qv.data_ptr(), sv.data_ptr(), block_table.data_ptr(),
        masks.data_ptr(), masks.data_ptr() + 4 * rows, rows, ctx_dev.data_ptr(), max_ctx, float(scale),
        out.data_ptr(), None, workspace.data_ptr(), floats, torch.cuda.current_stream(q.device).cuda_stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"tree attention kernel (graph form) failed: CUDA error {err}")
    return out


def _quantized_call(
    library: Any,
    entry: str,
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    block_table: torch.Tensor,
    ctx: int,
    depth: Sequence[int],
    ancestors: Sequence[int],
    scale: float,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Checks shared by the quantized-cache builds, then the call."""
    import torch

    qk, sk, qv, sv = caches
    rows = len(depth)
    check_masks(depth, ancestors)
    check_tensor("q", q, torch.half, (rows, Q_HEADS, HEAD_DIM), align=16)
    check_tensor("qk", qk, torch.int32, (None, PAGE, None), align=16)
    pages, groups = qk.shape[0], KV_HEADS * HEAD_DIM // 32
    check_tensor("qv", qv, torch.int32, (pages, PAGE, None), align=16)
    k_bits, v_bits = qcache_bits("qk", qk), qcache_bits("qv", qv)
    check_tensor("sk", sk, torch.half, (pages, PAGE, groups), align=16)
    check_tensor("sv", sv, torch.half, (pages, PAGE, groups), align=16)
    block_table = _check_call(q, caches, block_table, ctx, rows, scale)
    lib = library(k_bits, v_bits)
    return _run(getattr(lib, entry), lib, q, caches, block_table, ctx, depth, ancestors, scale, return_lse)
