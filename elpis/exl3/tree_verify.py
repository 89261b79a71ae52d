"""Token-tree verify inside ExLlamaV3's forward pass (issue 8, items 2-4): our kernels, run-time patches.

A tree-mode verify runs the target's ordinary `Model.forward` over a fixed number of rows (one of
`TREE_RUNS`, chosen per backend; padding rows hang off the root as leaves, so no real row can see them) with
`position_ids = kvp + depth`. Inside `tree_forward(...)` (a context manager) and only there, four ExLlamaV3
functions behave differently:

- `Attention.bc_attn_step` declines (the graph-captured decode block bakes a causal mask), so the eager path
  of `Attention.decode_flash_attn` runs: stock projections, q/k norms and RoPE at the rows' position ids.
- `attn_dispatch`, as bound in `exllamav3.modules.attn`, becomes `_tree_attention`: the rows' K/V are
  quantized into the paged cache at slots kvp+row (stock `CacheLayer_quant.update_kv_direct`, node order),
  `elpis.exl3.tree_attention.tree_attention_mma` (tensor cores) reads the 3-bit pages directly
  (dequantising in registers, bit-identical to ExLlamaV3's own dequant) and attends each row to the
  committed context plus exactly its ancestors. The gate and o_proj stay stock.
- `GatedDeltaNet.forward` runs its torch path (the fused decode graph is switched off for the call), whose
  `causal_conv1d_update` and `gated_delta_rule_fn` (as bound in `exllamav3.modules.gated_delta_net`) become
  `_tree_conv` (hands the pre-conv inputs on, writes nothing) and `_tree_rule` (`elpis.exl3.gdn_tree`:
  conv + delta rule along each row's ancestors from the committed conv window and recurrent state, which it
  only reads). Projections, gates, gated norm and out_proj stay stock (the gate projections b and a become one
  kernel call on layers marked by the patch exl3-gdn-ba, `elpis.exl3.gdn_ba_patch`, off by default).

Each GDN layer's inputs are kept (`TreeCall.gdn`) for the commit: `commit_gdn` replays the accepted path
from the committed state in place (bitwise equal to one-token stepping), `commit_kv` moves the accepted
rows' quantized K/V from slot kvp+row to kvp+i (per-token rows, bitwise copies). Outside the context every
patched name calls the original. The pure planning functions (`layout_tree`, `check_path`, `kv_moves`,
`slot_pages`) need no GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from elpis.spec.run_choice import smallest_run

TREE_ROWS = 16  # the tree kernels' maximum rows
# Row counts a tree-mode backend may run every verify at: one shape for all GEMMs per backend, so that a row's
# bits cannot depend on it (whether they would is what tests/exl3/test_tree_graph.py's run-size test checks).
# Either runs the rows GEMM in the MLPs: tree verifies, eager or captured, run with ExLlamaV3's graph-captured
# MLP blocks (at most 8 rows) switched off (`capture.plain_module_path`).
TREE_RUNS = (8, TREE_ROWS)


def tree_run(budget: int) -> int:
    """The smallest run size that holds trees of `budget` rows."""
    run = smallest_run(TREE_RUNS, budget)
    if run is None:
        raise ValueError(f"tree budget {budget} is over the kernels' {TREE_ROWS} rows")
    return run


PAGE = 256


# --- planning (CPU) ------------------------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    """An integer index (Python or NumPy int), else None (bools and floats are not row numbers)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_parents(parents: Sequence[int], rows: int) -> list[int]:
    """The parent list of a verify of `rows` tokens, checked: parents[0] == -1, 0 <= parents[r] < r."""
    if len(parents) != rows:
        raise ValueError(f"verify got {rows} tokens but {len(parents)} parents")
    if not 1 <= rows <= TREE_ROWS:
        raise ValueError(f"verify takes 1..{TREE_ROWS} rows, got {rows}")
    out = []
    for r, value in enumerate(parents):
        p = _as_int(value)
        if p is None:
            raise ValueError(f"parents[{r}] = {value!r} is not an int")
        if (r == 0 and p != -1) or (r > 0 and not 0 <= p < r):
            raise ValueError(
                f"parents {list(parents)} are not a tree (parents[0] == -1, 0 <= parents[r] < r); "
                f"row {r} has parent {p}"
            )
        out.append(p)
    return out


@dataclass(frozen=True)
class TreeLayout:
    """The rows that run: the caller's `rows` rows, then padding leaves under the root up to `run`."""

    rows: int
    run: int
    parents: tuple[int, ...]  # padded, length run
    depth: tuple[int, ...]
    ancestors: tuple[int, ...]  # bit j of ancestors[r]: j is r or an ancestor of r

    def position_ids(self, kvp: int) -> list[int]:
        return [kvp + d for d in self.depth]


def layout_tree(parents: Sequence[int], run: int = TREE_ROWS) -> TreeLayout:
    """Pad a checked tree to `run` rows (extra rows are leaves under row 0: no real row has them as
    ancestors, so they cannot change a real row) and take its masks from the proven acceptor library."""
    from elpis import accept

    rows = len(parents)
    parents = check_parents(list(parents), rows)
    if not rows <= run <= TREE_ROWS:
        raise ValueError(f"a tree of {rows} rows cannot run as {run} rows (1..{TREE_ROWS}, >= rows)")
    padded = tuple(parents) + (0,) * (run - rows)
    masks = accept.tree_masks(list(padded))
    return TreeLayout(rows, run, padded, tuple(masks.depth), tuple(masks.ancestors))


def check_path(path: Sequence[int], parents: Sequence[int], rows: int) -> list[int]:
    """Commit rows: a root-first path of the verified tree (row 0 first, each the previous row's child),
    among the caller's `rows` real rows."""
    given = list(path)
    if not given:
        raise ValueError("commit needs at least row 0")
    path = []
    for value in given:
        r = _as_int(value)
        if r is None or not 0 <= r < rows:
            raise ValueError(f"commit row {value!r} is not one of the {rows} verified rows")
        path.append(r)
    if path[0] != 0:
        raise ValueError(f"commit rows {path} must start at row 0 (the anchor)")
    for prev, row in itertools.pairwise(path):
        if parents[row] != prev:
            raise ValueError(
                f"commit rows {path} are not a root-first path: row {row}'s parent is {parents[row]}"
            )
    return path


def kv_moves(kvp: int, path: Sequence[int]) -> list[tuple[int, int]]:
    """(source slot, destination slot) for every accepted row not already at its sequential slot. Sources
    ascend and each is >= its destination, so copying in this order (or gathering first) is safe."""
    return [(kvp + r, kvp + i) for i, r in enumerate(path) if r != i]


def commit_moves(kvp: int, path: Sequence[int], run: int, pages: Sequence[int]) -> list[int]:
    """The K/V moves of committing `path` after a verify of `run` rows at kvp, as one fixed-size operand:
    source pages, source offsets, destination pages, destination offsets (run - 1 each), the moves of
    `kv_moves` padded with copies of the last slot onto itself (never the destination of a real move)."""
    pad = kvp + run - 1
    moves = kv_moves(kvp, path)
    moves += [(pad, pad)] * (run - 1 - len(moves))
    src_pages, src_offsets = slot_pages([s for s, _ in moves], pages)
    dst_pages, dst_offsets = slot_pages([d for _, d in moves], pages)
    return [*src_pages, *src_offsets, *dst_pages, *dst_offsets]


def slot_pages(slots: Sequence[int], pages: Sequence[int]) -> tuple[list[int], list[int]]:
    """(cache page, offset in page) of each sequence slot, through the sequence's page list."""
    out_pages, offsets = [], []
    for s in slots:
        if not 0 <= s < len(pages) * PAGE:
            raise ValueError(f"slot {s} is outside the sequence's {len(pages)} pages")
        out_pages.append(int(pages[s // PAGE]))
        offsets.append(s % PAGE)
    return out_pages, offsets


# --- the patched forward (GPU) -------------------------------------------------------------------------


@dataclass
class GdnRecord:
    """One GDN layer's tree inputs and committed state (views into the cache's pools)."""

    qkv: Any  # bf16 [run, 10240], pre-conv
    beta: Any  # bf16 [run, 48]
    g: Any  # fp32 [run, 48]
    conv_weight: Any  # bf16 [10240, 4]
    conv_state: Any  # bf16 [10240, 4 + max_history]: the slot's conv ring row (columns 0..3 committed)
    state: Any  # fp32 [48, 128, 128]: the committed recurrent state (base row)


@dataclass
class GraphInputs:
    """Device buffers the graph forms of the tree kernels read when they run (`elpis.exl3.tree_graph` fills
    them before every replay): one captured forward then serves every tree of its row count at every
    context up to `max_ctx`."""

    ctx: Any  # int32 [1]: kvp
    masks: Any  # int32 [2 * run]: depth, then ancestors
    plan: Any  # uint8 [gdn_tree.PLAN_CAPACITY]: the GDN visiting plan
    max_ctx: int


@dataclass
class TreeCall:
    layout: TreeLayout
    kvp: int
    slot: int  # the sequence's cache slot (conv ring row)
    base_row: int  # its committed recurrent-state row
    gdn: dict[int, GdnRecord] = field(default_factory=dict)
    graph: GraphInputs | None = None  # set: the kernels' graph forms read the tree and kvp from these
    source: Any = None  # the captured forward (tree_graph.Captured) whose memory holds the GDN records
    attention_layers: int = 0
    _module: Any = None  # the GDN layer whose forward is running
    _conv: tuple[Any, Any, Any] | None = None  # (pre-conv qkv, conv weight, conv ring) handed to the rule


_lock = threading.Lock()
_active: TreeCall | None = None
_originals: dict[str, Any] = {}
_suspended = False  # within `suspended()`: ExLlamaV3's own functions are bound again


def _exl3_modules() -> tuple[Any, Any]:
    from exllamav3.modules import attn, gated_delta_net

    return attn, gated_delta_net


TREE_PATCH = "exl3-tree-verify"  # the registry entry (patches/registry.json) of the wrappers below


def require_tree_patch() -> None:
    """Refuse tree mode when its registry patch is switched off (ELPIS_PATCH_TREE_VERIFY=0)."""
    from elpis.exl3 import patches

    if not patches.enabled(TREE_PATCH):
        raise RuntimeError(
            f"tree mode needs the patch {TREE_PATCH}, switched off by ELPIS_PATCH_TREE_VERIFY=0: unset it, "
            "or verify chains (load_backend(tree=False), elpis serve --chain)"
        )


def _wrap_targets() -> list[tuple[str, Any, str, Any]]:
    """(key in _originals, owner, attribute, wrapper) of each ExLlamaV3 name tree mode wraps."""
    attn, gdn = _exl3_modules()
    return [
        ("attn_dispatch", attn, "attn_dispatch", _tree_attention),
        ("bc_attn_step", attn.Attention, "bc_attn_step", _bc_attn_step),
        ("gdn_forward", gdn.GatedDeltaNet, "forward", _gdn_forward),
        ("conv", gdn, "causal_conv1d_update", _tree_conv),
        ("rule", gdn, "gated_delta_rule_fn", _tree_rule),
    ]


def enable() -> None:
    """The registry patch exl3-tree-verify's entry point (`elpis.exl3.patches.apply_all`): the wrappers are
    installed by the first tree verify (`tree_forward`), so a process that never verifies a tree runs
    ExLlamaV3's functions untouched. Checks that ExLlamaV3 has the names the wrappers replace."""
    for _, owner, name, _ in _wrap_targets():
        if not callable(getattr(owner, name, None)):
            raise RuntimeError(f"patch {TREE_PATCH}: exllamav3 has no {owner.__name__}.{name} to wrap")


def install() -> None:
    """Wrap the five ExLlamaV3 names (idempotent; called by the first tree verify, which is refused when the
    registry patch is switched off). The wrappers call the originals unless a tree_forward context is
    active, so installing changes nothing on the stock paths."""
    with _lock:
        if _originals:
            return
        require_tree_patch()
        targets = _wrap_targets()
        for key, owner, name, _ in targets:
            _originals[key] = getattr(owner, name)
        for _, owner, name, wrapper in targets:
            setattr(owner, name, wrapper)


def installed() -> bool:
    return bool(_originals)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Within the block ExLlamaV3's five names are its own functions again, so code that observes them where
    they are bound (the quality gate's operand recorder, `elpis.gate.patching.replaced`) sees their calls
    after a tree verify has installed the wrappers. Refused while a tree verify runs; a tree verify asked for
    within the block is refused (it would run ExLlamaV3's kernels)."""
    global _suspended
    with _lock:
        if _active is not None or _suspended:
            raise RuntimeError("tree_verify.suspended: a tree verify is running, or it is already suspended")
        targets = _wrap_targets() if _originals else []
        for key, owner, name, _ in targets:
            setattr(owner, name, _originals[key])
        _suspended = True
    try:
        yield
    finally:
        with _lock:
            for _, owner, name, wrapper in targets:
                setattr(owner, name, wrapper)
            _suspended = False


@contextlib.contextmanager
def tree_forward(call: TreeCall) -> Iterator[TreeCall]:
    """Run the target's forward inside this to verify `call.layout`'s tree (one call at a time)."""
    global _active
    if _suspended:
        raise RuntimeError("tree_forward: tree mode's wrappers are suspended (tree_verify.suspended)")
    install()
    if _active is not None:
        raise RuntimeError("tree_forward: a tree verify is already running")
    _active = call
    try:
        yield call
    finally:
        _active = None


def _bc_attn_step(self, *args: Any, **kwargs: Any) -> Any:
    if _active is not None:
        return None  # the eager path: its attn_dispatch is the tree attention below
    return _originals["bc_attn_step"](self, *args, **kwargs)


def _cache_layer(cache: Any, cache_idx: int | None, cache_instance: int | None) -> Any:
    from exllamav3.cache import CacheLayer

    if isinstance(cache, CacheLayer):
        return cache
    return cache.layers[cache_idx, cache_instance or 0]


def _tree_attention(*args: Any, **kw: Any) -> Any:
    call = _active
    if call is None:
        return _originals["attn_dispatch"](*args, **kw)
    from exllamav3.cache import CacheLayer_quant

    from elpis.exl3.tree_attention import tree_attention_mma

    if args:
        raise RuntimeError(f"tree attention: attn_dispatch called with {len(args)} positional arguments")
    q, k, v = kw["q"], kw["k"], kw["v"]
    unsupported = {
        "non-causal": not kw.get("causal", True),
        "non_causal_spans": kw.get("non_causal_spans") is not None,
        "sliding window": (kw.get("window_size") or -1) > 0,
        "softcap": bool(kw.get("softcap") or 0.0),
        "sinks": kw.get("sinks") is not None,
    }
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise RuntimeError(f"tree attention supports plain causal attention only; this layer has {bad}")
    layer = _cache_layer(kw["cache"], kw.get("cache_idx"), kw.get("cache_instance"))
    if not isinstance(layer, CacheLayer_quant) or layer.compand_a != 0.0:
        raise RuntimeError(
            f"tree attention reads a linear quantized cache (CacheLayer_quant, compand_a 0); got "
            f"{type(layer).__name__} (compand_a {getattr(layer, 'compand_a', None)})"
        )
    bsz, rows = q.shape[0], q.shape[1]
    layout = call.layout
    if bsz != 1 or rows != layout.run:
        raise RuntimeError(
            f"tree attention: q has shape {list(q.shape)}, the tree runs 1 x {layout.run} rows"
        )
    block_table, cache_seqlens = kw["block_table"], kw["cache_seqlens"]
    # The rows' K/V go to slots kvp..kvp+run-1 in node order, quantized like every stock append; the
    # kernel then reads the 3-bit pages directly (no fp16 window of the context).
    layer.update_kv_direct(cache_seqlens, block_table, k, v, rows)
    scale = kw.get("sm_scale")
    if call.graph is not None:
        from elpis.exl3.tree_attention import tree_attention_mma_graph

        out = tree_attention_mma_graph(
            q[0].contiguous(), (layer.qk, layer.sk, layer.qv, layer.sv), block_table[0], call.graph.ctx,
            call.graph.max_ctx, call.graph.masks, **({"scale": float(scale)} if scale else {}),
        )  # fmt: skip
        call.attention_layers += 1
        return out.view(1, rows, out.shape[1], out.shape[2])
    pages = -(-(call.kvp + rows) // PAGE)
    if block_table.shape[1] < pages:
        raise RuntimeError(f"tree attention: block table has {block_table.shape[1]} pages, needs {pages}")
    out = tree_attention_mma(
        q[0].contiguous(), layer.qk, layer.sk, layer.qv, layer.sv, block_table[0, :pages].contiguous(),
        call.kvp, layout.depth, layout.ancestors, **({"scale": float(scale)} if scale else {}),
    )  # fmt: skip
    call.attention_layers += 1
    return out.view(1, rows, out.shape[1], out.shape[2])


def _check_gdn_module(module: Any) -> None:
    from elpis.exl3 import gdn_tree

    want = (gdn_tree.KEY_HEADS, gdn_tree.VALUE_HEADS, gdn_tree.HEAD_DIM, gdn_tree.HEAD_DIM, gdn_tree.TAPS)
    got = (
        module.num_k_heads,
        module.num_v_heads,
        module.k_head_dim,
        module.v_head_dim,
        module.conv_kernel_size,
    )
    if got != want:
        raise RuntimeError(
            f"gdn tree kernel geometry (k heads, v heads, k dim, v dim, taps) {want}, layer has {got}"
        )
    if getattr(module, "kda", False) or getattr(module, "qkvz_proj", None) is not None:
        raise RuntimeError(
            "gdn tree: only split-projection Gated DeltaNet layers (Qwen3.5 style) are supported"
        )
    if getattr(module, "tp_reduce", False):
        raise RuntimeError("gdn tree: tensor-parallel layers are not supported")


def _gdn_forward(self: Any, x: Any, params: dict, out_dtype: Any = None) -> Any:
    from elpis.exl3 import gdn_ba_patch, rows_gemm_patch

    call = _active
    if call is None:
        return _originals["gdn_forward"](self, x, params, out_dtype)
    _check_gdn_module(self)
    if params.get("recurrent_history") or params.get("recurrent_spec_step"):
        raise RuntimeError("gdn tree: a tree verify runs without recurrent history")
    call._module, call._conv = self, None
    fused = self.bc_split
    self.bc_split = False  # the fused decode graph runs its own conv and scan: take the torch path
    qkv = getattr(self, rows_gemm_patch.QKV_MARK, None)
    try:
        # the patches exl3-gdn-ba and exl3-gdn-qkv-channel-major, each on layers marked at load
        with gdn_ba_patch.projections(self), rows_gemm_patch.channel_major(qkv):
            out = _originals["gdn_forward"](self, x, params, out_dtype)
    finally:
        self.bc_split = fused
        call._module = None
    if self.layer_idx not in call.gdn:
        raise RuntimeError(f"gdn tree: layer {self.layer_idx} did not reach the tree conv and rule")
    return out


def _tree_conv(
    mixed_qkv: Any,
    conv_state: Any,
    recurrent_slots: Any,
    conv1d_weight: Any,
    conv1d_bias: Any,
    history: bool = False,
    params: dict | None = None,
    token_major: bool = False,
    incremental: bool = False,
) -> Any:
    call = _active
    if call is None:
        return _originals["conv"](
            mixed_qkv=mixed_qkv, conv_state=conv_state, recurrent_slots=recurrent_slots,
            conv1d_weight=conv1d_weight, conv1d_bias=conv1d_bias, history=history, params=params,
            token_major=token_major, incremental=incremental,
        )  # fmt: skip
    import torch

    if call._module is None or history or incremental:
        raise RuntimeError("gdn tree: conv called outside a tree-mode GDN forward, or with history")
    if conv1d_bias is not None:
        raise RuntimeError("gdn tree: the kernel has no conv bias")
    if conv_state is None:
        raise RuntimeError("gdn tree: no recurrent state for the sequence (pass recurrent_states)")
    # The projection as stock rounds it to bf16 for its conv, [rows, channels]: its channel-major buffer read
    # in place by the tree kernel (gdn_tree.channel_major), or a token-major bf16 copy of anything else.
    if conv1d_weight.dtype != torch.bfloat16:
        raise RuntimeError(f"gdn tree: conv weight must be bf16, got {conv1d_weight.dtype}")
    from elpis.exl3 import gdn_tree

    rows_major = mixed_qkv[0] if token_major else mixed_qkv[0].t()
    in_place = gdn_tree.channel_major(rows_major)
    pre_conv = rows_major if in_place else rows_major.to(torch.bfloat16).contiguous()
    call._conv = (pre_conv, conv1d_weight.contiguous(), conv_state)
    return pre_conv.unsqueeze(0)  # [1, rows, channels]: the rule below takes pre-conv inputs


def _tree_rule(
    mixed_qkv: Any,
    beta: Any,
    g: Any,
    recurrent_state: Any,
    recurrent_slots: Any,
    history: bool,
    save_state: bool,
    num_k_heads: int,
    num_v_heads: int,
    k_dim: int,
    v_dim: int,
    k_head_dim: int,
    v_head_dim: int,
    params: dict | None = None,
    channelwise_g: bool = False,
    slots_in: Any = None,
) -> Any:
    call = _active
    if call is None:
        return _originals["rule"](
            mixed_qkv=mixed_qkv, beta=beta, g=g, recurrent_state=recurrent_state,
            recurrent_slots=recurrent_slots, history=history, save_state=save_state, num_k_heads=num_k_heads,
            num_v_heads=num_v_heads, k_dim=k_dim, v_dim=v_dim, k_head_dim=k_head_dim, v_head_dim=v_head_dim,
            params=params, channelwise_g=channelwise_g, slots_in=slots_in,
        )  # fmt: skip
    import torch

    from elpis.exl3.gdn_tree import gdn_tree_verify

    module, conv = call._module, call._conv
    if module is None or conv is None or channelwise_g or history:
        raise RuntimeError("gdn tree: delta rule called without the tree conv before it, or with history")
    pre_conv, weight, ring = conv
    call._conv = None
    if mixed_qkv.data_ptr() != pre_conv.data_ptr():
        raise RuntimeError("gdn tree: the delta rule did not receive the tree conv's output")
    if recurrent_state is None or recurrent_state.dtype != torch.float:
        raise RuntimeError(
            "gdn tree: the recurrent state must be fp32 (load the backend with gdn_state_fp32=True), got "
            f"{None if recurrent_state is None else recurrent_state.dtype}"
        )
    layout = call.layout
    record = GdnRecord(
        qkv=pre_conv,
        beta=beta[0].contiguous(),
        g=g[0].float().contiguous(),
        conv_weight=weight,
        conv_state=ring[call.slot],
        state=recurrent_state[call.base_row, 0],
    )
    if call.graph is not None:
        from elpis.exl3.gdn_tree import gdn_tree_verify_graph

        _, out_bf16 = gdn_tree_verify_graph(
            record.qkv, record.beta, record.g, record.conv_weight, record.conv_state, record.state,
            call.graph.plan,
        )  # fmt: skip
    else:
        _, out_bf16 = gdn_tree_verify(
            record.qkv, record.beta, record.g, record.conv_weight, record.conv_state, record.state,
            layout.depth, layout.ancestors, bf16_out=True,
        )  # fmt: skip
    call.gdn[module.layer_idx] = record
    return out_bf16.unsqueeze(0)  # [1, rows, 48, 128] bf16, as the stock scan returns


# --- commit (GPU) --------------------------------------------------------------------------------------


def commit_gdn(call: TreeCall, path: Sequence[int]) -> None:
    """Advance every GDN layer's committed conv window and recurrent state by the accepted path, in place."""
    from elpis.exl3.gdn_tree import gdn_tree_commit

    for record in call.gdn.values():
        gdn_tree_commit(
            record.qkv, record.beta, record.g, record.conv_weight, record.conv_state, record.state, list(path)
        )


def commit_kv(cache: Any, pages: Sequence[int], kvp: int, path: Sequence[int]) -> int:
    """Move the accepted rows' K/V (every per-token row of every cache tensor: quantized values and scales)
    from slot kvp+row to kvp+i. Returns the number of rows moved."""
    import torch

    from elpis.exl3.upload import upload

    moves = kv_moves(kvp, path)
    if not moves:
        return 0
    src_pages, src_offsets = slot_pages([s for s, _ in moves], pages)
    dst_pages, dst_offsets = slot_pages([d for _, d in moves], pages)
    indices: dict[Any, tuple[Any, ...]] = {}  # per device, uploaded once for all layers
    for layer in cache.layers.values():
        tensors = [t for t in layer.get_tensors() if t is not None]
        if not tensors:
            continue
        device = tensors[0].device
        if device not in indices:
            indices[device] = tuple(
                upload(x, torch.long, device) for x in (src_pages, src_offsets, dst_pages, dst_offsets)
            )
        sp, so, dp, do = indices[device]
        for t in tensors:
            t[dp, do] = t[sp, so]  # the gather completes before the scatter: bitwise row copies
    return len(moves)
