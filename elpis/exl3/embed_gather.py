"""Embedding rows gathered on the GPU from ExLlamaV3's host table (`patches/kernels/embed_gather.cu`; issue 9,
item 2; registry switch `exl3-embed-gather`).

ExLlamaV3 keeps the token embedding table in host memory (`Embedding`, `prefer_cpu`) and looks rows up on the
host. Before each replayed tree verify the host therefore gathered 16 rows, widened them to fp32 and uploaded
them (`TreeGraphs._fill`), and likewise the DFlash2 draft block's anchor row: ~0.3 ms of host time on the path
from the draft's read-back to the verify (bench/results/tree/README.md, session 26). With the switch on, the
table is registered once as mapped pinned memory (`HostTable`), the ids travel in the graph's integer upload,
and the captured graphs begin with the gather kernel, which writes exactly what `Embedding.forward` returns:
the table's fp16 (or bf16) value widened to fp32 (exact), times the DFlash2 input scale in fp32 where that is
not 1. So the verify's and the draft's inputs keep their bits (tests/kernels/test_embed_gather_emu.py on the
CPU; tests/exl3/test_embed_gather.py on the GPU, through whole verifies and draft blocks).

Only the plain table form is taken: an `nn.Embedding` in host memory with fp16 or bf16 rows, no normalisation
or multiplier, fp32 output. Anything else (ExLlamaV3's quantized or disk-streamed tables) is refused at load
with the reason, never gathered another way.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from elpis import nvcc
from elpis.paths import PATCHES_DIR

SOURCE = PATCHES_DIR / "kernels" / "embed_gather.cu"
PATCH = "exl3-embed-gather"
DTYPES = {torch.float16: 0, torch.bfloat16: 1}  # the kernel's dtype codes

_VP, _U32, _U64, _F32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "elpis_embed_gather": (_VP, _U32, _U32, _U32, _VP, _U32, _U32, _F32, _VP, _VP, _VP),
    "elpis_host_register": (_VP, _U64, _VP),
    "elpis_host_unregister": (_VP,),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the entries' argument and result types on a build (GPU or emulated)."""
    return nvcc.set_signatures(lib, ENTRY_ARGS)


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return bind(nvcc.load(SOURCE))


def check_embedding(module: Any) -> torch.Tensor:
    """The host table of ExLlamaV3 `Embedding` module `module`, if the gather computes its forward exactly;
    otherwise RuntimeError with the reason."""
    table = getattr(module, "embedding", None)
    if not isinstance(table, torch.nn.Embedding):
        kind = type(table).__name__
        raise RuntimeError(f"{PATCH}: the embedding is ExLlamaV3's {kind}, not a plain table in host memory "
                           f"(switch it off: ELPIS_PATCH_EMBED_GATHER=0)")  # fmt: skip
    weight = table.weight.data
    problems = []
    if weight.device.type != "cpu":
        problems.append(f"its table is on {weight.device}, not in host memory")
    if weight.dtype not in DTYPES:
        problems.append(f"its rows are {weight.dtype}, not fp16 or bf16")
    if weight.dim() != 2 or weight.shape[1] % 8:
        problems.append(f"its table is {list(weight.shape)}, not [vocab, hidden] with hidden a multiple of 8")
    if getattr(module, "normalize", False) or getattr(module, "multiplier", 1.0) != 1.0:
        problems.append("it scales its output")
    if getattr(module, "out_dtype", None) != torch.float:
        problems.append(f"its output is {getattr(module, 'out_dtype', None)}, not fp32")
    if problems:
        raise RuntimeError(f"{PATCH}: the embedding cannot be gathered on the GPU: {'; '.join(problems)} "
                           f"(switch it off: ELPIS_PATCH_EMBED_GATHER=0)")  # fmt: skip
    return table.weight


def check_ids(ids: Sequence[int], vocab: int) -> None:
    """Every id must name a row of the table (the kernel also refuses one that does not, on the device)."""
    if ids and not (min(ids) >= 0 and max(ids) < vocab):
        bad = next(i for i in ids if not 0 <= i < vocab)
        raise ValueError(f"token id {bad} is outside the {vocab}-row embedding table")


class HostTable:
    """ExLlamaV3's host embedding table, registered as mapped pinned memory, and the gather from it.

    Registration pins the table where it is. Where CUDA refuses that memory (a file mapping), or the table is
    not contiguous and 16-byte aligned, the rows are copied once into ordinary host memory, which ExLlamaV3's
    module then holds instead (same values), and that is pinned. It stays registered while this object
    lives."""

    def __init__(self, module: Any, device: torch.device, lib: ctypes.CDLL | None = None) -> None:
        param = check_embedding(module)
        self.lib = lib if lib is not None else _library()
        weight = param.data
        in_place = weight.is_contiguous() and weight.data_ptr() % 16 == 0  # the kernel reads 16-byte words
        dev, err = self._register(weight) if in_place else (0, -1)
        if err:
            weight = weight.clone(memory_format=torch.contiguous_format)  # anonymous memory CUDA can pin
            dev, err = self._register(weight)
            if err:
                size = f"{weight.nbytes >> 20} MiB"
                raise RuntimeError(f"{PATCH}: CUDA could not map the {size} embedding table (error {err})")
            param.data = weight
        self.weight = weight
        self.device_ptr = dev
        self.vocab, self.hidden = int(weight.shape[0]), int(weight.shape[1])
        self.dtype = DTYPES[weight.dtype]
        self.device = torch.device(device)
        self.error = torch.zeros((1,), dtype=torch.int32, device=self.device)
        self._finalizer = weakref.finalize(self, self.lib.elpis_host_unregister, weight.data_ptr())

    def _register(self, weight: torch.Tensor) -> tuple[int, int]:
        out = ctypes.c_void_p()
        err = self.lib.elpis_host_register(weight.data_ptr(), weight.nbytes, ctypes.addressof(out))
        return int(out.value or 0), int(err)

    def close(self) -> None:
        """Unregister the table now (also done when this object is collected)."""
        self._finalizer()

    def gather(self, out: torch.Tensor, ids: torch.Tensor, scale: float = 1.0) -> None:
        """Queue out[r] = fp32(table[ids[r]]) * scale on the current stream (graph capture records it). `out`:
        CUDA fp32, contiguous, [..., hidden] with one row per id; `ids`: CUDA int32 or int64, contiguous."""
        rows = ids.numel()
        if not (out.is_cuda and out.dtype == torch.float32 and out.is_contiguous()):
            raise ValueError("embedding gather: the output must be a contiguous CUDA fp32 tensor")
        if out.shape[-1] != self.hidden or out.numel() != rows * self.hidden:
            raise ValueError(f"embedding gather: {rows} ids into an output of shape {list(out.shape)}")
        if not (ids.is_cuda and ids.dtype in (torch.int32, torch.int64) and ids.is_contiguous()):
            raise ValueError("embedding gather: the ids must be a contiguous CUDA int32 or int64 tensor")
        stream = torch.cuda.current_stream(out.device).cuda_stream
        err = self.lib.elpis_embed_gather(
            self.device_ptr, self.dtype, self.vocab, self.hidden, ids.data_ptr(), ids.element_size(), rows,
            scale, out.data_ptr(), self.error.data_ptr(), stream,
        )  # fmt: skip
        if err:
            raise RuntimeError(f"embedding gather: {'arguments refused' if err < 0 else f'CUDA error {err}'}")


def host_table(engine: Any) -> HostTable:
    """The engine's registered table (one per engine: the target's embedding, which the DFlash2 draft's input
    layer also reads)."""
    table = getattr(engine, "embed_table", None)
    if table is None:
        from exllamav3.modules.embedding import Embedding

        first = engine.model.fwd_modules[0][0]
        if not isinstance(first, Embedding):
            raise RuntimeError(
                f"{PATCH}: the model's first module is {type(first).__name__}, not the embedding"
            )
        table = HostTable(first, engine.device)
        engine.embed_table = table
    return table
