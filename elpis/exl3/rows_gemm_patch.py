"""Patch `exl3-rows-gemm`: the EXL3 linears of a model loaded with it run elpis's GEMM for 1-16 rows
(`elpis.exl3.rows_gemm`).

The registry entry installs two wrappers (`install`); they act only on models loaded inside `loading(True)`
(`load_engine(..., rows_gemm=True)`), so other models in the same process, stock ExLlamaV3's among them, run
untouched:
- `InferParams.use_mgemm` answers False while such a model loads: ExLlamaV3 then builds no multi-projection
  bundles (attention Q/K/V(+gate), Gated DeltaNet qkv+z, MLP gate+up), whose fused GEMMs run in C++ where no
  wrapper reaches, so every projection is a Linear of its own;
- `LinearEXL3.forward` of a linear of such a model runs `rows_gemm` for a call the kernel takes
  (`eligible`: 1-16 rows of fp16, a 4- or 6-bit mul1 trellis, no bias, no reconstruct or override request)
  and the original for any other (prefill).
The projections a module computes from one input (`SHARED_INPUT`: attention Q(+gate)/K/V, Gated DeltaNet
qkv/z, MLP gate/up) form a `Group` at `mark`: the first of them called with an input runs the whole group in
one kernel call (one input-transform launch, one GEMM launch over all their n-blocks) and keeps the others'
outputs for their own calls with that same input tensor object. Inference tensors have no version counter,
so what makes a kept output current is the call structure: ExLlamaV3's forward code calls every member of a
group with the same tensor, untouched in between, before the module's next input exists; a compute drops
whatever an earlier one kept, and the GPU tests check that a verify leaves nothing kept. A member's result is
a function of its group, fixed at `mark`, so a verify and plain decoding still run the same arithmetic.
Where it reaches (device call 42, `elpis/bench/scripts/rows_gemm_reach.py`): in tree mode (elpis serve's
default with a draft) every EXL3 linear of a verify runs the kernel, the 6-bit head included, the 34 grouped
ones in 16 group calls on the small model; chain mode keeps ExLlamaV3's C++ block graphs (`bc` objects of
the MLP and Gated DeltaNet layers, whose GEMMs no Python wrapper reaches), so there the patch changes little.
Either way a verify and plain decoding of one backend run the same kernels.
Numerics change (fp32 transforms, one fp16 rounding of the activations and of the output; error against fp64
below ExLlamaV3's own GEMM's, `bench/results/rows_gemm/README.md`); the grouped build passed the quality gates
and the conditions written before its measurements, so it is on by default in tree mode since session 12.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from elpis.exl3 import rows_gemm

PATCH = "exl3-rows-gemm"
MARK = "_elpis_rows_gemm"
GROUP = "_elpis_rows_gemm_group"
# Patch exl3-gdn-qkv-channel-major (a switch, off by default): a Gated DeltaNet layer marked with its qkv
# linear (`mark_gdn_qkv`) has that linear write bf16 channel-major inside tree verifies (`channel_major`).
QKV_PATCH = "exl3-gdn-qkv-channel-major"
QKV_MARK = "_elpis_qkv_channel_major"
# Patch exl3-mlp-act-input (a switch, off by default): a GatedMLP marked by `mark_mlp_act` computes its SiLU-
# and-multiply inside its down projection's input-transform launch (`SiluMulThenDown`); the down linear keeps
# that output (ACT_KEPT) for its own call.
ACT_PATCH = "exl3-mlp-act-input"
ACT_KEPT = "_elpis_act_kept"
# Patch exl3-norm-input (a switch, off by default): an RMSNorm marked by `mark_norm_input` writes its output
# and the input fragments of the group that reads it in one launch (`NormThenGroup`); the group's call then
# runs its GEMM launch alone (`Group.ready`).
NORM_PATCH = "exl3-norm-input"
# Projections ExLlamaV3 1.6.5 computes from one input tensor, by exact module type: `Attention.project_qkv`
# (Q with its interleaved gate or a separate g_proj, K, V), the split-projection `GatedDeltaNet.forward`
# (qkv, z; b and a are too narrow for the kernel), `GatedMLP.forward` of its one slice (gate, up).
SHARED_INPUT = {
    "Attention": ("q_proj", "g_proj", "k_proj", "v_proj"),
    "GatedDeltaNet": ("qkv_proj", "z_proj"),
    "GatedMLP": ("gates", "ups"),
}
# A DFlash draft also projects the target's hidden states through K and V alone (architecture/dflash.py), so
# there Q stays out of the attention group: K and V always share their input, Q only sometimes.
SHARED_INPUT_DFLASH = {**SHARED_INPUT, "Attention": ("k_proj", "v_proj")}
_originals: dict[str, Any] = {}
_state = threading.local()
# linears served by the kernel, and kernel calls made for groups, in this process (tests check the patch took
# effect)
calls = {"rows_gemm": 0, "groups": 0, "channel_major": 0, "silu_mul": 0, "norm_input": 0}


def format_ok(linear: Any) -> bool:
    """Whether the kernel takes this EXL3 linear's weights (4- or 6-bit mul1, suh and svh, no bias)."""
    import torch

    shape = (linear.in_features // 16, linear.out_features // 16, 16 * linear.K)
    return (
        linear.bias is None
        and linear.mul1
        and not linear.mcg
        and linear.K in rows_gemm.BITS
        and linear.suh is not None
        and linear.svh is not None
        and linear.trellis.dtype == torch.int16
        and tuple(linear.trellis.shape) == shape
        and rows_gemm.supported(1, linear.in_features, linear.out_features, linear.K)
    )


def eligible(linear: Any, x: Any, params: dict, out_dtype: Any) -> bool:
    """Whether `rows_gemm` computes this `LinearEXL3.forward` call exactly as asked."""
    import torch

    if "ovr" in params or params.get("reconstruct"):
        return False
    if x.dtype != torch.half or x.dim() < 1 or x.shape[-1] != linear.in_features or not x.is_cuda:
        return False
    rows = x.numel() // max(x.shape[-1], 1)
    dtype = out_dtype or linear.default_out_dtype
    # the cheap shape test first: prefill-sized calls (every chunk, every linear) skip format_ok's checks
    return (
        dtype in (torch.half, torch.float)
        and rows_gemm.supported(rows, linear.in_features, linear.out_features, linear.K)
        and format_ok(linear)
    )


@dataclass
class _Kept:
    x: Any  # the input tensor itself (held, so its identity cannot pass to another tensor)
    version: int | None  # its version counter, where it has one (inference tensors do not)
    y: Any


def _version(x: Any) -> int | None:
    return None if x.is_inference() else x._version


def _same_data(kept: _Kept, x: Any) -> bool:
    """Whether x is the kept input or a view of all of it (same memory, size and type, unchanged since)."""
    k = kept.x
    if k is x:
        return kept.version == _version(x)
    return (
        x.data_ptr() == k.data_ptr()
        and x.numel() == k.numel()
        and x.dtype == k.dtype
        and x.is_contiguous()
        and kept.version == _version(x)
    )


@dataclass
class Group:
    """EXL3 linears a module computes from one input, run by one kernel call (see the module docstring).
    `run` computes a call (the kernel; the CPU tests pass the format's reference)."""

    members: list[Any]
    wanted: list[Any] = field(default_factory=list)  # each member's output dtype (its last call's)
    kept: dict[int, _Kept] = field(default_factory=dict)  # member index -> output not yet asked for
    run: Callable[[Any, list[rows_gemm.Member]], list[Any]] = rows_gemm.rows_gemm_group
    ready: _Kept | None = None  # NormThenGroup's output (x) and the fragments it wrote for it (y)
    run_frags: Callable[..., list[Any]] = rows_gemm.rows_gemm_frags

    def __post_init__(self) -> None:
        self.wanted = [m.default_out_dtype for m in self.members]

    def output(self, linear: Any, x: Any, out_dtype: Any) -> Any:
        import torch

        i = next(j for j, m in enumerate(self.members) if m is linear)
        dtype = out_dtype or linear.default_out_dtype
        self.wanted[i] = dtype
        kept = self.kept.pop(i, None)
        if kept is not None and kept.x is x and kept.version == _version(x):
            if kept.y.dtype == dtype:
                return kept.y
            if kept.y.dtype == torch.float and dtype == torch.half:
                return kept.y.to(torch.half)  # the kernel's own fp16 output is this rounding of its fp32 one
        flat = x.reshape(-1, linear.in_features).contiguous()
        members = [
            rows_gemm.Member(m.trellis, m.suh, m.svh, w)
            for m, w in zip(self.members, self.wanted, strict=True)
        ]
        ready, self.ready = self.ready, None
        if ready is not None and _same_data(ready, x):  # the norm before this group wrote its fragments
            ys = self.run_frags(ready.y, flat.shape[0], flat.shape[1], members)
        else:
            ys = self.run(flat, members)
        calls["groups"] += 1
        shaped = [y.view(*x.shape[:-1], y.shape[-1]) for y in ys]
        self.kept = {j: _Kept(x, _version(x), y) for j, y in enumerate(shaped) if j != i}
        return shaped[i]


def _forward(self: Any, x: Any, params: dict, out_dtype: Any = None) -> Any:
    # an output SiluMulThenDown computed from the MLP's gate and up outputs answers this input only, once, and
    # only a call the kernel takes (ExLlamaV3's own forward reads the activation it wrote)
    kept = getattr(self, ACT_KEPT, None)
    if kept is not None:
        setattr(self, ACT_KEPT, None)
    if not getattr(self, MARK, False) or not eligible(self, x, params, out_dtype):
        return _originals["forward"](self, x, params, out_dtype)
    dtype = out_dtype or self.default_out_dtype
    if kept is not None and kept.x is x and kept.version == _version(x) and kept.y.dtype == dtype:
        return kept.y
    calls["rows_gemm"] += 1
    if getattr(_state, "channel_major", None) is self:
        out_dtype = _channel_major_dtype(self, out_dtype)
    group = getattr(self, GROUP, None)
    if group is not None:
        return group.output(self, x, out_dtype)
    return run(self, x, out_dtype)


def _channel_major_dtype(linear: Any, out_dtype: Any) -> Any:
    """bf16 (channel-major, the fp16 output's bits cast) in place of the fp16 output ExLlamaV3's Gated
    DeltaNet asks for; any other request is refused, since the caller would get what it did not ask for."""
    import torch

    if (out_dtype or linear.default_out_dtype) != torch.half:
        raise RuntimeError(
            f"patch {QKV_PATCH}: qkv asked for {out_dtype}; the channel-major output replaces fp16"
        )
    calls["channel_major"] += 1
    return torch.bfloat16


@contextlib.contextmanager
def channel_major(linear: Any | None) -> Iterator[None]:
    """Within the block, a kernel call of `linear` (None: of no linear) asking for fp16 returns the bf16
    channel-major output instead: an [..., rows, n] view of a [n, rows] buffer, holding the fp16 output's
    bits cast to bf16. That is what ExLlamaV3's Gated DeltaNet forward makes of its qkv for the conv
    (`qkv.transpose(1, 2).to(torch.bfloat16).contiguous()`, two kernels); given this view, both calls return
    it unchanged, so the layer computes the same bits with two kernels fewer."""
    with _thread_setting("channel_major", linear, None):
        yield


def mark_gdn_qkv(model: Any) -> int:
    """Mark every Gated DeltaNet layer of `model` whose qkv linear the kernel serves (after `mark`) for
    `channel_major` inside tree verifies (`load_backend` does, in tree mode, where the switch is on);
    returns how many were marked."""
    from elpis.exl3 import walk_modules

    count = 0
    for module in walk_modules(model):
        if type(module).__name__ != "GatedDeltaNet":
            continue
        inner = getattr(getattr(module, "qkv_proj", None), "inner", None)
        if inner is not None and getattr(inner, MARK, False):
            setattr(module, QKV_MARK, inner)
            count += 1
    return count


class SiluMulThenDown:
    """`GatedMLP.activation_fn_call` of an MLP marked by `mark_mlp_act` (`down`: a linear `mark` marked, in a
    format the kernel takes). ExLlamaV3 1.6.5 calls it as (g, u, a, act_limit) right before
    `downs[0].forward(a)`. Where the down projection's kernel call is eligible, this runs that projection now,
    from g and u (`rows_gemm.rows_gemm_silu_mul`: the activation, written into `a` as ExLlamaV3's `silu_mul`
    writes it, and the input transform in one launch), and keeps the output on the down linear for its call
    with `a` itself; anything else goes to ExLlamaV3's function. `run` computes a call (the kernel; the CPU
    tests pass a reference)."""

    def __init__(self, original: Callable[..., Any], down: Any, run: Callable[..., Any] | None = None):
        self.original, self.down = original, down
        self.run = run or rows_gemm.rows_gemm_silu_mul

    def takes(self, g: Any, u: Any, a: Any, act_limit: float) -> bool:
        """Whether the fused call computes exactly what `original(g, u, a, act_limit)` and the down
        projection's kernel call would."""
        import torch

        down = self.down
        if act_limit != 0.0 or not getattr(down, MARK, False):
            return False
        if any(t.dtype != torch.half or not t.is_cuda or not t.is_contiguous() for t in (g, u, a)):
            return False
        if not (g.shape == u.shape == a.shape) or g.dim() < 1 or g.shape[-1] != down.in_features:
            return False
        rows = g.numel() // down.in_features
        # the down linear passed format_ok at `mark_mlp_act`: its format does not change
        return down.default_out_dtype in (torch.half, torch.float) and rows_gemm.supported(
            rows, down.in_features, down.out_features, down.K
        )

    def __call__(self, g: Any, u: Any, a: Any, act_limit: float) -> None:
        if not self.takes(g, u, a, act_limit):
            self.original(g, u, a, act_limit)
            return
        down, k = self.down, self.down.in_features
        member = rows_gemm.Member(down.trellis, down.suh, down.svh, down.default_out_dtype)
        (y,), _ = self.run(g.view(-1, k), u.view(-1, k), [member], act=a.view(-1, k))
        setattr(down, ACT_KEPT, _Kept(a, _version(a), y.view(*a.shape[:-1], down.out_features)))
        calls["silu_mul"] += 1


def mark_mlp_act(model: Any) -> int:
    """Give every GatedMLP of `model` whose one slice computes SiLU-and-multiply in fp16 without scaling, and
    whose down linear the kernel serves (after `mark`), a `SiluMulThenDown` (`load_backend` does in tree mode
    where the switch exl3-mlp-act-input is on); returns how many. `unmark_mlp_act` undoes it."""
    import torch

    from elpis.exl3 import walk_modules

    try:
        from exllamav3.ext import exllamav3_ext as ext
    except ImportError:  # no engine in this process: nothing of it to mark
        return 0
    count = 0
    for module in walk_modules(model):
        if type(module).__name__ != "GatedMLP" or len(getattr(module, "downs", ())) != 1:
            continue
        down = getattr(module.downs[0], "inner", None)
        if (
            getattr(module, "activation_fn_call", None) is ext.silu_mul
            and getattr(module, "interm_div", 1.0) == 1.0
            and getattr(module, "interm_dtype", None) in (None, torch.half)
            and down is not None
            and getattr(down, MARK, False)
            and format_ok(down)
        ):
            module.activation_fn_call = SiluMulThenDown(module.activation_fn_call, down)
            count += 1
    return count


def unmark_mlp_act(model: Any) -> int:
    """Give the MLPs `mark_mlp_act` marked their own activation function back; returns how many."""
    from elpis.exl3 import walk_modules

    count = 0
    for module in walk_modules(model):
        call = getattr(module, "activation_fn_call", None)
        if isinstance(call, SiluMulThenDown):
            module.activation_fn_call = call.original
            setattr(call.down, ACT_KEPT, None)
            count += 1
    return count


class NormThenGroup:
    """`RMSNorm.forward` of a norm marked by `mark_norm_input`, whose output is the input of `group` (and of
    nothing but that group and modules that read it as written). Where the kernel takes the call, it computes
    ExLlamaV3's norm (`rows_gemm.norm_input`: the same operations in the same order, the residual written back
    in the `residual_in` form) and in the same launch the group's input fragments, which the group's next call
    with this output uses (`Group.ready`); anything else goes to ExLlamaV3's forward. `run` computes a call
    (the kernel; the CPU tests pass a reference)."""

    def __init__(
        self, norm: Any, original: Callable[..., Any], group: Group, run: Callable[..., Any] | None = None
    ):
        self.norm, self.original, self.group = norm, original, group
        self.run = run or rows_gemm.norm_input

    def takes(self, x: Any, params: dict, out_dtype: Any, residual: Any, residual_in: Any) -> bool:
        import torch

        norm, k = self.norm, x.shape[-1] if x.dim() else 0
        weight = norm.weight
        if residual is not None or norm.span_heads or norm.groups != 1 or weight is None:
            return False
        if (out_dtype or norm.out_dtype) != torch.half or norm.key in params.get(
            "export_state_norm_keys", ()
        ):
            return False
        if not x.is_cuda or not x.is_contiguous() or weight.dtype not in (torch.half, torch.bfloat16):
            return False
        if x.dtype not in (torch.half, torch.float):
            return False
        if residual_in is not None and not (
            residual_in.dtype == torch.float
            and residual_in.is_contiguous()
            and residual_in.shape == x.shape
        ):
            return False
        rows = x.numel() // max(k, 1)
        if not (rows_gemm.norm_supported(rows, k) and weight.numel() == k):
            return False
        # the group's members passed format_ok when it was formed (`_group`): their format does not change
        return all(
            m.in_features == k and rows_gemm.supported(rows, k, m.out_features, m.K)
            for m in self.group.members
        )

    def __call__(
        self, x: Any, params: dict, out_dtype: Any = None, residual: Any = None, residual_in: Any = None
    ) -> Any:
        if not self.takes(x, params, out_dtype, residual, residual_in):
            return self.original(x, params, out_dtype, residual, residual_in)
        norm, k = self.norm, x.shape[-1]
        suhs = [m.suh for m in self.group.members]
        res = None if residual_in is None else residual_in.view(-1, k)
        y, frags = self.run(
            x.view(-1, k),
            norm.weight,
            norm.rms_norm_eps,
            norm.constant_bias,
            norm.constant_scale,
            suhs,
            residual=res,
        )
        y = y.view(x.shape)
        self.group.ready = _Kept(y, _version(y), frags)
        calls["norm_input"] += 1
        return y


# What reads a transformer block's norms: the attention's (or Gated DeltaNet's) projections of one input, and
# the MLP's gate and up.
NORM_READERS = {"attn_norm": ("attn", ("q_proj", "k_proj", "qkv_proj")), "mlp_norm": ("mlp", ("gates",))}


def _reader_group(block: Any, norm_name: str) -> Group | None:
    module_name, linear_names = NORM_READERS[norm_name]
    module = getattr(block, module_name, None)
    for name in linear_names:
        linear = getattr(module, name, None)
        if isinstance(linear, list):
            linear = linear[0] if len(linear) == 1 else None
        group = getattr(getattr(linear, "inner", None), GROUP, None)
        if group is not None:
            return group
    return None


def mark_norm_input(model: Any) -> int:
    """Give every RMSNorm of `model` that feeds a group of projections (a transformer block's attention or MLP
    norm) a `NormThenGroup` (`load_backend` does in tree mode where the switch exl3-norm-input is on); returns
    how many. `unmark_norm_input` undoes it."""
    from elpis.exl3 import walk_modules

    count = 0
    for block in walk_modules(model):
        for norm_name in NORM_READERS:
            norm = getattr(block, norm_name, None)
            if type(norm).__name__ != "RMSNorm" or isinstance(norm.__dict__.get("forward"), NormThenGroup):
                continue
            group = _reader_group(block, norm_name)
            if group is not None:
                norm.forward = NormThenGroup(norm, norm.forward, group)
                count += 1
    return count


def unmark_norm_input(model: Any) -> int:
    """Give the norms `mark_norm_input` marked their own forward back; returns how many."""
    from elpis.exl3 import walk_modules

    count = 0
    for module in walk_modules(model):
        wrapper = module.__dict__.get("forward")
        if isinstance(wrapper, NormThenGroup):
            del module.forward
            wrapper.group.ready = None
            count += 1
    return count


def run(linear: Any, x: Any, out_dtype: Any = None) -> Any:
    """`rows_gemm` of an `eligible` call of `LinearEXL3.forward`, shaped as that call returns it."""
    y = rows_gemm.rows_gemm(
        x.reshape(-1, linear.in_features).contiguous(), linear.trellis, linear.suh, linear.svh,
        out_dtype or linear.default_out_dtype,
    )  # fmt: skip
    return y.view(*x.shape[:-1], linear.out_features)


def _use_mgemm(self: Any, *args: Any, **kwargs: Any) -> bool:
    if getattr(_state, "loading", False):
        return False
    return _originals["use_mgemm"](self, *args, **kwargs)


def install() -> None:
    """Install the wrappers (idempotent). Refuses, with the reason, when the kernel's schedule header is not
    built or ExLlamaV3 lacks a name it wraps."""
    from exllamav3.model.config import InferParams
    from exllamav3.modules.quant.exl3 import LinearEXL3

    if _originals:
        return
    if not rows_gemm.SCHEDULE_HEADER.is_file():
        raise RuntimeError(f"patch {PATCH}: {rows_gemm.SCHEDULE_HEADER} missing: run make build")
    for owner, name in ((LinearEXL3, "forward"), (InferParams, "use_mgemm")):
        if not callable(getattr(owner, name, None)):
            raise RuntimeError(f"patch {PATCH}: exllamav3 has no {owner.__name__}.{name} to wrap")
    _originals["forward"] = LinearEXL3.forward
    _originals["use_mgemm"] = InferParams.use_mgemm
    LinearEXL3.forward = _forward
    InferParams.use_mgemm = _use_mgemm


def installed() -> bool:
    return bool(_originals)


def require_patch() -> None:
    """Refuse a model that asks for the kernel in a process where the registry patch is switched off."""
    from elpis.exl3 import patches

    patches.require_installed(PATCH, installed(), "rows_gemm=True")


@contextlib.contextmanager
def loading(enabled: bool) -> Iterator[None]:
    """Load models inside this: with `enabled`, ExLlamaV3 builds no multi-projection bundles for them."""
    if enabled:
        require_patch()
    with _thread_setting("loading", enabled, False):
        yield


@contextlib.contextmanager
def _thread_setting(name: str, value: Any, unset: Any) -> Iterator[None]:
    """This thread's `name` is `value` within the block, then what it was (`unset` if nothing)."""
    before = getattr(_state, name, unset)
    setattr(_state, name, value)
    try:
        yield
    finally:
        setattr(_state, name, before)


def _shared_input_linears(module: Any, table: dict[str, tuple[str, ...]]) -> list[Any]:
    """The EXL3 linears (inner objects) `module` computes from one input, per `table`."""
    names = table.get(type(module).__name__, ())
    if type(module).__name__ == "Attention" and getattr(module, "use_k_as_v", False):
        names = tuple(n for n in names if n != "v_proj")
    if type(module).__name__ == "GatedDeltaNet" and (
        getattr(module, "qkvz_proj", None) is not None or getattr(module, "kda", False)
    ):
        return []
    found = []
    for name in names:
        linear = getattr(module, name, None)
        if isinstance(linear, list):  # GatedMLP's slices: only a single slice shares the input whole
            if len(linear) != 1:
                return []
            linear = linear[0]
        inner = getattr(linear, "inner", None)
        if inner is not None and hasattr(inner, "trellis") and hasattr(inner, "svh"):
            found.append(inner)
    return found


def _group(linears: list[Any]) -> Group | None:
    """A group of these linears if the kernel can run them as one call."""
    if not 2 <= len(linears) <= rows_gemm.MAX_MEMBERS or not all(format_ok(m) for m in linears):
        return None
    if len({m.in_features for m in linears}) != 1 or len({m.K for m in linears}) != 1:
        return None
    if sum(m.out_features for m in linears) // 128 > rows_gemm.MAX_COUNTERS:
        return None
    return Group(linears)


def mark(model: Any) -> int:
    """Route every EXL3 linear of `model` through the kernel, the projections sharing an input as groups;
    returns how many linears were marked."""
    from elpis.exl3 import walk_modules

    require_patch()
    arch = str(getattr(getattr(model, "config", None), "arch_string", ""))
    table = SHARED_INPUT_DFLASH if arch.startswith("DFlash") else SHARED_INPUT
    count = 0
    for module in walk_modules(model):
        inner = getattr(module, "inner", None)
        if inner is not None and hasattr(inner, "trellis") and hasattr(inner, "svh"):
            setattr(inner, MARK, True)
            count += 1
        group = _group(_shared_input_linears(module, table))
        for linear in group.members if group is not None else ():
            setattr(linear, GROUP, group)
    return count


def groups(model: Any) -> list[Group]:
    """The groups `mark` formed in `model`, each once."""
    from elpis.exl3 import walk_modules

    seen: dict[int, Group] = {}
    for module in walk_modules(model):
        inner = getattr(module, "inner", None)
        group = getattr(inner, GROUP, None) if inner is not None else None
        if group is not None:
            seen.setdefault(id(group), group)
    return list(seen.values())
