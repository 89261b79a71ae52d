"""The CPU reference backend's patchable ops, with candidates, for `elpis gate op`.

Operands are real activations: one WikiText-2 prefill through the fp32 reference model with the layer
functions recorded (`elpis.gate.patching.recorded`), one operand set per layer. Stock is the reference
backend's own fp32 function; the fp64 evaluation is the same function on float64 copies of the very same
operands. Candidates are alternative implementations a kernel author might propose:

  attention, attention.cq3  qk-bf16 (Q and K rounded to bf16 for the scores), qk-int8 (Q and K quantised
                            per token and head to int8, integer dot products, as an int8 Q·Kᵀ kernel
                            does), fp64-accumulate (computed in fp64, rounded once: never less precise).
                            `attention.cq3` runs over a simulated 3-bit K/V cache (symmetric, 7 levels,
                            one scale per 32 channels of a head; dequantised values are the operands).
  gdn.prefill / gdn.verify  the chunked and the recurrent delta rule (stock: chunked for prefill,
                            recurrent for verify rows), start state = the exact state after `context`
                            tokens rounded to fp32.
  rmsnorm                   div-sqrt (divide by sqrt instead of multiplying by rsqrt).
  gemm                      bf16-inputs, fp16-inputs (operands rounded, fp32 accumulation), fp64-accumulate.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from elpis.gate.ops import GateOp, OpInputs
from elpis.gate.patching import recorded

CACHE_BITS = 3
CACHE_GROUP = 32


# --- attention -----------------------------------------------------------------------------------------


def _grouped_attention(q, keys, values, visible, scores_fn) -> torch.Tensor:
    """Grouped-head softmax attention; `scores_fn(q, k)` gives the raw dot products [kv, group, T, N]."""
    tokens, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(tokens, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3)  # [kv, group, T, d]
    k = keys.permute(1, 0, 2).unsqueeze(1)  # [kv, 1, N, d]
    scores = scores_fn(grouped, k) * dim**-0.5
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, values.permute(1, 0, 2).unsqueeze(1))
    return out.permute(2, 0, 1, 3).reshape(tokens, heads * dim)


def _dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.matmul(q, k.transpose(-1, -2))


def _int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-vector int8: integer values (as float64) and the scale of each vector."""
    scale = x.abs().amax(dim=-1, keepdim=True).to(torch.float64) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x.to(torch.float64) / scale).clamp(-127, 127), scale


def attention_qk_int8(o: OpInputs) -> torch.Tensor:
    q, keys, values, visible = (
        o.tensors["q"],
        o.tensors["keys"],
        o.tensors["values"],
        o.tensors.get("visible"),
    )

    def scores(qg: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        qi, qs = _int8(qg)
        ki, ks = _int8(k)
        # integer dot products are exact in float64 (|sum| < 2^53); one rescale, then fp32 like the kernel
        return (torch.matmul(qi, ki.transpose(-1, -2)) * qs * ks.transpose(-1, -2)).to(q.dtype)

    return _grouped_attention(q, keys, values, visible, scores)


def attention_qk_bf16(o: OpInputs) -> torch.Tensor:
    t = o.tensors

    def scores(qg: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return _dot(qg.to(torch.bfloat16).to(qg.dtype), k.to(torch.bfloat16).to(k.dtype))

    return _grouped_attention(t["q"], t["keys"], t["values"], t.get("visible"), scores)


def quantize_cache(x: torch.Tensor, bits: int = CACHE_BITS, group: int = CACHE_GROUP) -> torch.Tensor:
    """Quantise-dequantise K or V [N, heads, d]: symmetric, 2^(bits-1)-1 levels each side, per group."""
    n, heads, dim = x.shape
    if dim % group:
        group = dim
    levels = 2 ** (bits - 1) - 1
    g = x.reshape(n, heads, dim // group, group)
    scale = g.abs().amax(dim=-1, keepdim=True) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(g / scale).clamp(-levels, levels) * scale).reshape(n, heads, dim)


# --- activation capture ----------------------------------------------------------------------------------


@dataclass
class Captured:
    attention: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per layer: q [L,H,d], keys, values
    deltanet: list[tuple[torch.Tensor, ...]]  # per layer: q, k, v, g, beta (state zero at the start)
    norm: list[tuple[torch.Tensor, torch.Tensor, float]]  # per layer: x [L, hidden], scale, eps
    gemm: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: MLP input x [L, hidden], gate weight


def capture(model_path: Path, tokens: int, max_layers: int) -> Captured:
    """Prefill `tokens` WikiText-2 tokens through the fp32 reference model, recording layer operands."""
    from elpis.gate.corpus import wikitext_chunks
    from elpis.reference import layers
    from elpis.reference import model as model_module
    from elpis.reference.loader import load_model
    from elpis.text import load_tokenizer

    if tokens > model_module.PREFILL_CHUNK:
        raise ValueError(f"capture length {tokens} exceeds one prefill chunk ({model_module.PREFILL_CHUNK})")
    model = load_model(model_path, dtype=torch.float32)
    tokenizer = load_tokenizer(model_path)
    ids = wikitext_chunks(lambda text: tokenizer.encode(text, special=False), 1, tokens)[0]
    functions = {
        "attend": layers.attend,
        "delta_rule_chunked": layers.delta_rule_chunked,
        "rms_norm": layers.rms_norm,
        "mlp": layers.mlp,
    }
    hidden = model.config.hidden_size
    with torch.inference_mode(), recorded("elpis.reference", functions) as calls:
        model.prefill(model.new_state(tokens), ids)
    return Captured(
        attention=[(q, k, v) for q, k, v, _ in calls["attend"]][:max_layers],
        deltanet=[args[:5] for args in calls["delta_rule_chunked"]][:max_layers],
        # the layer input norms: [L, hidden] activations (q/k head norms and the final norm excluded)
        norm=[(x, s, eps) for x, s, eps in calls["rms_norm"] if x.dim() == 2 and x.shape == (tokens, hidden)][
            :max_layers
        ],
        gemm=[(x, gate) for x, gate, _, _ in calls["mlp"]][:max_layers],
    )


# --- the ops -------------------------------------------------------------------------------------------


def _f64(o: OpInputs) -> dict[str, torch.Tensor]:
    return {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in o.tensors.items()}


def _fp64_rounded(exact):
    """Compute in float64 and round once to the stock fp32 output: no element can be less precise."""

    def impl(o: OpInputs) -> torch.Tensor:
        return exact(o).to(torch.float32)

    return impl


def _check_cell(context: int, rows: int, length: int) -> None:
    if rows < 1 or context + rows > length:
        raise ValueError(f"cell context {context} + rows {rows} needs more than the {length} captured tokens")


def attention_ops(captured: Captured, contexts: tuple[int, ...], rows: tuple[int, ...]) -> list[GateOp]:
    from elpis.reference.layers import attend

    def stock(o: OpInputs) -> torch.Tensor:
        return attend(o.tensors["q"], o.tensors["keys"], o.tensors["values"], o.tensors["visible"])

    def exact(o: OpInputs) -> torch.Tensor:
        t = _f64(o)
        return attend(t["q"], t["keys"], t["values"], t["visible"])

    def make_inputs(cache_bits: int | None):
        def inputs(context: int, count: int) -> Iterator[OpInputs]:
            for layer, (q, keys, values) in enumerate(captured.attention):
                _check_cell(context, count, q.shape[0])
                end = context + count
                k, v = keys[:end], values[:end]
                if cache_bits is not None:
                    k, v = quantize_cache(k, cache_bits), quantize_cache(v, cache_bits)
                visible = torch.arange(end)[None, :] <= torch.arange(context, end)[:, None]
                yield OpInputs(
                    {"q": q[context:end], "keys": k, "values": v, "visible": visible}, label=f"layer {layer}"
                )

        return inputs

    candidates = {
        "qk-bf16": attention_qk_bf16,
        "qk-int8": attention_qk_int8,
        "fp64-accumulate": _fp64_rounded(exact),
    }
    return [
        GateOp(
            "attention",
            "softmax attention over the fp32 K/V cache (verify rows / prefill chunk)",
            stock,
            exact,
            make_inputs(None),
            contexts,
            rows,
            candidates,
        ),
        GateOp(
            "attention.cq3",
            f"attention over a simulated {CACHE_BITS}-bit K/V cache (dequantised operands)",
            stock,
            exact,
            make_inputs(CACHE_BITS),
            contexts,
            rows,
            candidates,
        ),
    ]


def deltanet_ops(captured: Captured, contexts: tuple[int, ...], rows: tuple[int, ...]) -> list[GateOp]:
    from elpis.reference.layers import delta_rule_chunked, delta_rule_recurrent

    def run(rule, o: OpInputs, dtype=None) -> torch.Tensor:
        t = _f64(o) if dtype == torch.float64 else o.tensors
        return rule(t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"])[0]

    def chunked(o):
        return run(delta_rule_chunked, o)

    def recurrent(o):
        return run(delta_rule_recurrent, o)

    def exact(o):
        return run(delta_rule_recurrent, o, torch.float64)

    start_states: dict[tuple[int, int], torch.Tensor] = {}

    def inputs(context: int, count: int) -> Iterator[OpInputs]:
        for layer, (q, k, v, g, beta) in enumerate(captured.deltanet):
            _check_cell(context, count, q.shape[0])
            if (layer, context) not in start_states:
                zero = torch.zeros(q.shape[1], q.shape[2], v.shape[2], dtype=torch.float64)
                t = [x[:context].to(torch.float64) for x in (q, k, v, g, beta)]
                state = delta_rule_recurrent(*t, zero)[1] if context else zero
                start_states[(layer, context)] = state.to(q.dtype)
            window = slice(context, context + count)
            yield OpInputs(
                {
                    "q": q[window],
                    "k": k[window],
                    "v": v[window],
                    "g": g[window],
                    "beta": beta[window],
                    "state": start_states[(layer, context)],
                },
                label=f"layer {layer}",
            )

    return [
        GateOp(
            "gdn.prefill",
            "gated delta rule over a prefill chunk (stock: chunked form)",
            chunked,
            exact,
            inputs,
            contexts,
            rows,
            {"recurrent": recurrent},
        ),
        GateOp(
            "gdn.verify",
            "gated delta rule over verify rows (stock: recurrent form)",
            recurrent,
            exact,
            inputs,
            contexts,
            rows,
            {"chunked": chunked},
        ),
    ]


def norm_ops(captured: Captured, rows: tuple[int, ...]) -> list[GateOp]:
    from elpis.reference.layers import rms_norm

    def stock(o):
        return rms_norm(o.tensors["x"], o.tensors["scale"], o.params["eps"])

    def exact(o):
        t = _f64(o)
        return rms_norm(t["x"], t["scale"], o.params["eps"])

    def div_sqrt(o):
        x = o.tensors["x"]
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + o.params["eps"]) * o.tensors["scale"]

    def inputs(context: int, count: int) -> Iterator[OpInputs]:
        for layer, (x, scale, eps) in enumerate(captured.norm):
            _check_cell(context, count, x.shape[0])
            yield OpInputs(
                {"x": x[context : context + count], "scale": scale}, {"eps": eps}, f"layer {layer}"
            )

    return [
        GateOp(
            "rmsnorm", "RMSNorm of a layer input", stock, exact, inputs, (0,), rows, {"div-sqrt": div_sqrt}
        )
    ]


def gemm_ops(captured: Captured, rows: tuple[int, ...]) -> list[GateOp]:
    def stock(o):
        return F.linear(o.tensors["x"], o.tensors["w"])

    def exact(o):
        t = _f64(o)
        return F.linear(t["x"], t["w"])

    def rounded(dtype: torch.dtype):
        def impl(o):
            x, w = o.tensors["x"], o.tensors["w"]
            return F.linear(x.to(dtype).to(x.dtype), w.to(dtype).to(w.dtype))

        return impl

    def inputs(context: int, count: int) -> Iterator[OpInputs]:
        for layer, (x, w) in enumerate(captured.gemm):
            _check_cell(context, count, x.shape[0])
            yield OpInputs({"x": x[context : context + count], "w": w}, label=f"layer {layer}")

    candidates = {
        "bf16-inputs": rounded(torch.bfloat16),
        "fp16-inputs": rounded(torch.float16),
        "fp64-accumulate": _fp64_rounded(exact),
    }
    return [
        GateOp("gemm", "MLP gate projection x Wᵀ (rows = M)", stock, exact, inputs, (0,), rows, candidates)
    ]


DEFAULT_CONTEXTS = (32, 128, 384)
DEFAULT_ROWS = (1, 8, 64)


def reference_ops(model_path: Path, options: dict[str, str]) -> list[GateOp]:
    known = {"tokens", "layers"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown reference op option(s) {unknown}: known {sorted(known)}")
    tokens = int(options.get("tokens", max(DEFAULT_CONTEXTS) + max(DEFAULT_ROWS)))
    max_layers = int(options.get("layers", 4))
    if tokens < 2 or max_layers < 1:
        raise ValueError("tokens must be >= 2 and layers >= 1")
    captured = capture(model_path, tokens, max_layers)
    ops = attention_ops(captured, DEFAULT_CONTEXTS, DEFAULT_ROWS)
    if captured.deltanet:
        ops += deltanet_ops(captured, DEFAULT_CONTEXTS, DEFAULT_ROWS)
    return ops + norm_ops(captured, DEFAULT_ROWS) + gemm_ops(captured, DEFAULT_ROWS)
