"""Patch `exl3-prefill-groups`: a long prompt is prefilled layer by layer over groups of up to sixteen
2048-token chunks, so each EXL3 weight is rebuilt to fp16 once per group instead of once per chunk (issue 10).

Why: a prefill chunk of more than 144 rows runs every EXL3 linear as "rebuild the whole fp16 weight, then one
dense GEMM" (ExLlamaV3's `LinearEXL3.reconstruct_hgemm`). At 2048-token chunks the rebuilds are about 23 of
157 µs of kernels per token of a 32K prefill on the H200 (bench/results/profile/). Bigger chunks rebuild less
often, but change the GEMMs' row counts and with them the arithmetic (bench/results/prefill/README.md).

How, without changing a bit: the chunks stay ExLlamaV3's 2048-token chunks, and every module runs on each
chunk exactly as `Model.prefill` runs it; only the order changes. `Model.prefill` runs chunk 1 through every
layer, then chunk 2; here layer 1 runs chunks 1..16, then layer 2 runs them. A chunk at a layer needs that
layer's K/V and recurrent state after the chunks before it, which the layer-major order has computed just
before, so every kernel sees the same inputs. While one module runs its chunks, `weight_store()` keeps the
fp16 weight each of its EXL3 linears rebuilt for the first chunk, and the later chunks' GEMMs read it: the
same rebuild kernel on the same packed weight gives the same bits, and the GEMM of each chunk is the one
`reconstruct_hgemm` runs (same shapes, same call). Chunks of fewer than `FUSED_MIN_ROWS` rows (the
page-aligned tail of a prompt), and every call outside a store, go to ExLlamaV3's own function untouched.

Cost: the rebuilt weights of one module stay alive while it runs its chunks (at most ~0.8 GB for a
Qwen3.8 block: q/k/v/o or qkv/z/out plus the MLP's three), and a group's chunks keep their activations and
tap exports (~0.25 GB per 2048-token chunk): with four chunks the prefill's peak grew by ~1.05 GiB on the
H200 (bench/results/prefill/README.md, session 15).

Snapshots: the prefix cache snapshots the recurrent state at multiples of 8192 tokens, at the last whole
chunk and at the end. A snapshot on a page boundary inside a group is taken layer by layer: after a block has
run the chunk ending there, its Gated DeltaNet layer holds the state at that position, and the backend copies
it then (`after_chunk`; the K/V pages below the position are final once written). The prompt's end, off a
page boundary, ends its group, since that snapshot also reads the partial page the whole model writes.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

PATCH = "exl3-prefill-groups"
# ExLlamaV3 1.6.5's `reconstruct_hgemm` takes its fused path (weights rebuilt in the original basis, no
# Hadamard launches on the activations) from this many rows on; the stored weights are that path's
FUSED_MIN_ROWS = 1024

_original: list[Callable[..., Any]] = []
_store: list[dict[int, Any]] = []  # the active store (at most one)
# process-wide counts (tests check the reuse happened)
counts = {"rebuilt": 0, "reused": 0}


def install() -> None:
    """The registry entry: wrap `LinearEXL3.reconstruct_hgemm` so that, inside `weight_store()`, a linear's
    fused-path rebuild is kept and reused; outside one the wrapper calls the original."""
    from exllamav3.modules.quant import exl3 as exl3_linear

    if _original:
        return
    cls = exl3_linear.LinearEXL3
    original = cls.reconstruct_hgemm

    def reconstruct_hgemm(self: Any, x: Any, out_dtype: Any) -> Any:
        store = _store[-1] if _store else None
        if store is None or not _reusable(self, x):
            return original(self, x, out_dtype)
        return _stored_hgemm(self, x, out_dtype, store)

    cls.reconstruct_hgemm = reconstruct_hgemm
    _original.append(original)


def installed() -> bool:
    return bool(_original)


def require_patch() -> None:
    """Refuse grouped prefills in a process where the registry patch is not applied."""
    from elpis.exl3 import patches

    patches.require_installed(PATCH, installed(), "grouped prefills")


def _reusable(linear: Any, x: Any) -> bool:
    """Would ExLlamaV3 take the fused path with one whole-width rebuild for this call?"""
    from exllamav3.modules.quant import exl3 as exl3_linear

    rows = x.numel() // x.shape[-1]
    fused = (
        linear.in_features % 128 == 0
        and linear.out_features % 128 == 0
        and not exl3_linear.no_fused_reconstruct
    )
    return fused and rows >= FUSED_MIN_ROWS and linear.out_features <= exl3_linear.MAX_RECONSTRUCT_SLICE_N


def _stored_hgemm(linear: Any, x: Any, out_dtype: Any, store: dict[int, Any]) -> Any:
    """ExLlamaV3's fused path (one rebuild of the whole weight in the original basis, one `hgemm_recon`, the
    bias), with the rebuilt weight taken from `store` when this linear already rebuilt it."""
    import torch
    from exllamav3.modules.quant import exl3 as exl3_linear

    ext = exl3_linear.ext  # the extension ExLlamaV3's own function calls
    rows = x.numel() // x.shape[-1]
    y = torch.empty(
        (*x.shape[:-1], linear.out_features),
        dtype=out_dtype or linear.default_out_dtype,
        device=x.device,
    )
    w = store.get(id(linear))
    if w is None:
        shape = (linear.in_features, linear.out_features)
        w = torch.empty(shape, dtype=torch.half, device=linear.trellis.device)
        ext.reconstruct_had_slice(
            w, linear.trellis, linear.suh, linear.svh, linear.K, linear.mcg, linear.mul1, 0
        )
        store[id(linear)] = w
        counts["rebuilt"] += 1
    else:
        counts["reused"] += 1
    ext.hgemm_recon(x.view(rows, linear.in_features), w, y.view(rows, linear.out_features))
    if linear.bias is not None:
        y += linear.bias
    return y


@contextlib.contextmanager
def weight_store() -> Iterator[dict[int, Any]]:
    """Within the block, rebuilt EXL3 weights are kept per linear and reused; they are freed at its end."""
    require_patch()
    if _store:
        raise RuntimeError(f"patch {PATCH}: weight stores do not nest")
    store: dict[int, Any] = {}
    _store.append(store)
    try:
        yield store
    finally:
        _store.clear()
        store.clear()


def plan_groups(stops: Sequence[int], snapshot_at: Callable[[int], bool], size: int) -> list[list[int]]:
    """Split a prefill's chunk ends `stops` (ascending) into groups of at most `size` chunks. A group also
    ends after a snapshot point (`snapshot_at(stop)`) off a page boundary, the prompt's end: that snapshot
    reads the partial page, which the whole model must have written first. Snapshots on page boundaries are
    taken inside groups, each layer's state copied as the layer passes them (`prefill_layer_major`'s
    `after_chunk`)."""
    from elpis.exl3.prefix import PAGE

    if size < 1:
        raise ValueError(f"a prefill group holds at least one chunk, got {size}")
    if any(b <= a for a, b in itertools.pairwise(stops)):
        raise ValueError(f"prefill chunk ends must ascend: {list(stops)}")
    groups: list[list[int]] = []
    current: list[int] = []
    for stop in stops:
        current.append(stop)
        if len(current) == size or (stop % PAGE and snapshot_at(stop)):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


# What a Qwen3.5-family model prefills through (exllamav3 1.6.5 class names). Other module kinds may read the
# recurrent state's position, which the layer-major order advances only after the whole group
TOP_MODULES = {"Embedding", "TransformerBlock", "RMSNorm", "Linear", "DeepstackEmbed"}
BLOCK_PARTS = {"attn": {"Attention", "GatedDeltaNet", "NoneType"}, "mlp": {"GatedMLP", "NoneType"}}


def check_model(model: Any) -> None:
    """Refuse models whose prefill is not shown equal in layer-major order: tensor-parallel, offloaded layers,
    CPU-hosted experts, or modules other than the Qwen3.5 family's (which read no recurrent position)."""
    if getattr(model, "loaded_tp", False):
        raise RuntimeError(f"patch {PATCH}: tensor-parallel models prefill through their workers")
    if list(getattr(model, "_get_prefetch_layers", []) or []):
        raise RuntimeError(f"patch {PATCH}: models with prefetched (offloaded) layers are not supported")
    if getattr(getattr(model, "config", None), "moe_cpu_hosts", None):
        raise RuntimeError(f"patch {PATCH}: models with CPU-hosted experts are not supported")
    unknown: set[str] = set()
    for module, _, _ in model.fwd_modules:
        kind = type(module).__name__
        if kind not in TOP_MODULES:
            unknown.add(kind)
        if kind != "TransformerBlock":
            continue
        for part, kinds in BLOCK_PARTS.items():
            sub = getattr(module, part, None)
            if type(sub).__name__ not in kinds or getattr(sub, "qsa_indexer", None) is not None:
                unknown.add(f"{part}: {type(sub).__name__}")
    if unknown:
        raise RuntimeError(f"patch {PATCH}: prefill in groups is not shown exact for {sorted(unknown)}")


def prefill_layer_major(
    model: Any,
    passes: Sequence[tuple[Any, dict[str, Any]]],
    after_chunk: Callable[[Any, int], None] | None = None,
) -> None:
    """Prefill `passes` (each the input ids [1, n] and params of one `Model.prefill` call, in position order)
    module by module: every module runs each pass's chunk in order, with its EXL3 weights rebuilt once. The
    same effect on cache and recurrent state as `model.prefill(ids, params)` for each pass in order.
    `after_chunk(module, j)` runs (on the host, in stream order) after each module has run pass j: that
    module's recurrent state is then the state at pass j's end."""
    from exllamav3.cache.recurrent_util import advance_recurrent_states

    check_model(model)
    xs = [model.prepare_inputs(ids, params) for ids, params in passes]
    last = model.last_kv_module_idx_instance
    modules = list(model.fwd_modules)
    # the embedding runs chunk by chunk just before the first block's chunk (see _embed_chunk)
    embedding = modules.pop(0) if OVERLAP_EMBEDDING and _host_embedding(modules) else None
    for module, instance, idx in modules:
        final = (idx, instance) == last
        with weight_store():
            for j, (_, params) in enumerate(passes):
                if embedding is not None:
                    xs[j] = _embed_chunk(embedding, xs[j], params)
                    if after_chunk is not None:
                        after_chunk(embedding[0], j)
                params["layer_instance"] = instance
                params["prefill"] = final
                xs[j] = module.forward(module.prepare_for_device(xs[j], params), params)
                if after_chunk is not None:
                    after_chunk(module, j)
        embedding = None
        if final:
            break
    for ids, params in passes:
        del params["prefill"]
        advance_recurrent_states(ids, params, model)


# Embeddings staged through pinned memory and run interleaved with the first block (a switch for A/B runs of
# the probe, bench/results/prefill/README.md session 18; on in the product)
OVERLAP_EMBEDDING = True


def _host_embedding(modules: Sequence[tuple[Any, Any, Any]]) -> bool:
    """Is the first module an embedding whose table ExLlamaV3 keeps in host memory (its rows are gathered on
    the CPU and the next module copies them to the GPU), with a CUDA module after it?"""
    if len(modules) < 2 or type(modules[0][0]).__name__ != "Embedding":
        return False
    table_device = getattr(modules[0][0], "device", None)
    next_device = getattr(modules[1][0], "device", None)
    return str(table_device).startswith("cpu") and str(next_device).startswith("cuda")


def _embed_chunk(entry: tuple[Any, Any, Any], x: Any, params: dict[str, Any]) -> Any:
    """One chunk's embedding, gathered on the CPU by ExLlamaV3's own module and staged in pinned memory.

    Why: the first block copies a chunk's rows to the GPU. From pageable memory that copy waits for all the
    GPU's earlier work, so in layer-major order the GPU idled through every chunk's gather and copy in turn
    before the first block could run on the next chunk. From pinned memory the block's own
    `prepare_for_device` copies without waiting, in stream order, and the CPU gathers chunk j+1 while the
    GPU runs the first block on chunk j. Same rows, same bytes: nothing downstream changes."""
    import torch

    module, instance, _ = entry
    params["layer_instance"] = instance
    params["prefill"] = False
    rows = module.forward(module.prepare_for_device(x, params), params)
    if rows.device.type != "cpu":
        return rows
    staged = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
    staged.copy_(rows)
    return staged
