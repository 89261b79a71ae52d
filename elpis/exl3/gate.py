"""ExLlamaV3 as a gate provider (`elpis.gate.providers`): the GPU path's ops against fp64, and configurations.

Numerics-changing choices elpis makes on top of stock ExLlamaV3 1.6.5 (the `patches` option names them;
written `none`, or ids joined by `+` in sorted order, e.g. `fixed-rows-8+gdn-state-fp32`):

  exl3-int8-gemv-off  registry patch (`patches/registry.json`, off by default): 1- and 2-row EXL3 GEMMs on
                      the fp16-activation kernels instead of Hopper's int8-activation GEMV.
  fixed-rows-8        every verify runs 8 rows (`Exl3Backend(fixed_rows=8)`, elpis default): a 1..7-row
                      call is computed as rows of an 8-row call.
  gdn-state-fp32      the Gated DeltaNet recurrent state stored in fp32 (`load_backend(gdn_state_fp32=True)`,
                      elpis default; ExLlamaV3 stores fp16).
  prefill-chunk-8192  prefill in 8192-token chunks (`load_backend(prefill_chunk=8192)`, opt-in; PASS under
                      exl3-small-prefill-r1); without it a configuration prefills in ExLlamaV3's
                      2048-token chunks. The dense GEMMs run at another row count. It touches no
                      op of the op gate; a model comparison sees it only with `--score-from` past 2048.
  tree-verify         tree mode (`load_backend(tree=True, tree_rows=16)`; `elpis serve`'s default with a
                      DFlash2 draft): every verify a 16-row tree through elpis's tree attention and Gated
                      DeltaNet kernels. Needs gdn-state-fp32 and replaces fixed-rows-8 (a configuration
                      naming it must name the one and not the other). Judged by model comparisons
                      (rule exl3-small-tree-r1); the op gate has no tree-kernel candidate yet.
  exl3-attn-hadamard-fold  registry switch (process-wide, on by default): tree mode's attention folds the
                      cache's rotation into its queries and outputs (`tree_attention.hadamard_fold_default`).
                      Needs tree-verify; a configuration names it exactly when the process runs with it
                      (`ELPIS_PATCH_ATTN_HADAMARD_FOLD`). Judged by model comparisons (exl3-small-tree-r4).

Ops (`gate_ops`): operands are real activations, recorded during one forward pass of `tokens` tokens through
the loaded model (WikiText-2 through the model's tokenizer, or fixed pseudo-random ids when the tokenizer's
ids do not fit the model's vocabulary, as with the synthetic checkpoints). Stock is ExLlamaV3's own code on
those operands; the fp64 evaluation is the same math on the same (dequantised) operands; each patch that
touches an op is a candidate named by its id. `context` is where the rows start in the recorded sequence
(for attention and the delta rule: the tokens already in the cache / folded into the state).

  linear        EXL3 GEMM of recorded layer linears (`Linear.forward`): 1..16 rows (fused GEMV/GEMM
                kernels) and prefill sizes (reconstruct + cuBLAS). fp64: x times the weight that
                `LinearEXL3.get_weight_tensor` defines (decoded trellis, both 128-point Hadamards, suh, svh),
                evaluated in fp64. Candidates: exl3-int8-gemv-off, fixed-rows-8.
  head          the lm_head linear on the final-norm output, as float32 logits (what `verify` returns).
  head.logprobs the float64 log-softmax of those float32 logits (what elpis's sampler computes from them).
  rmsnorm       the layer norms as the model calls them (fused residual add where the model defers it).
  gdn.step      the gated delta rule over 1..16 rows (`gated_delta_rule_fn`: the CUDA recurrent kernel);
  gdn.chunked   ... and over prefill-sized rows (the vendored fla chunked kernels). Start state: the exact
                fp64 state after `context` tokens, stored in the state dtype (fp16 stock, fp32 with
                gdn-state-fp32). Output: the rows' outputs and the final state as stored. Candidate:
                gdn-state-fp32.
  attention     attention of the rows over a paged fp16 K/V cache (`attn_dispatch`, which writes the rows'
  attention.cq3 K/V first), and over the 3-bit cache elpis serves with; fp64 over the cache contents as
                ExLlamaV3 dequantises them. Candidate: fixed-rows-8. Rows <= 16 run the eager Triton decode
                kernels; the served verify launches the same kernels inside ExLlamaV3's graph-captured block
                (likewise its GDN block runs the same scan as gdn.step, reading the state's base row).

An op whose operands cannot be recorded, or whose stock or fp64 evaluation fails in any cell of its default
grid, is left out with the reason on stderr; a candidate that fails in any cell is left out the same way.

Configurations (`configuration`, spec `exl3:patches=...,rows=N`): the served backend
(`elpis.exl3.load_backend`, no draft, no prefix reuse) under the named patches; teacher forcing runs verify
calls of `rows` chained rows (default 8). A configuration naming a patch whose arithmetic is elpis's own
kernel (`KERNEL_SOURCES`: rows-gemm, gdn-ba, tree-verify) also carries `code`, the digest of those kernels'
sources, written out like any default (a `code` that differs from the checkout's is refused).
exl3-int8-gemv-off is a process-wide switch of ExLlamaV3: a configuration naming it (or not) must match the
process (`ELPIS_PATCH_INT8_GEMV_OFF`), else it is refused.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from elpis.exl3 import EXLLAMA_PREFILL_CHUNK
from elpis.exl3.tree_attention import FOLD_PATCH
from elpis.gate.configs import BackendLogits, Spec, check_start
from elpis.gate.ops import GateOp, OpInputs

PATCHES: dict[str, str] = {
    "exl3-int8-gemv-off": "1- and 2-row EXL3 GEMMs on fp16-activation kernels (registry patch, default off)",
    "fixed-rows-8": "every verify runs 8 rows (elpis default)",
    "gdn-state-fp32": "Gated DeltaNet recurrent state stored in fp32 (elpis default)",
    "prefill-chunk-8192": "prefill in 8192-token chunks instead of ExLlamaV3's 2048 (opt-in, gated)",
    "tree-verify": "verifies as 16-row trees through elpis's tree kernels (served default with a draft)",
    "rows-gemm": "EXL3 linears of 1-16 rows through elpis's GEMM (registry patch exl3-rows-gemm)",
    "gdn-ba": "tree verifies' Gated DeltaNet gate projections by elpis's kernel (registry patch exl3-gdn-ba)",
    FOLD_PATCH: "tree verifies' attention with the cache's Hadamard rotation folded into queries and outputs "
    "(registry switch, process-wide; on by default since session 33, PASS under exl3-small-tree-r4)",
}
# Patches judged only by model comparisons: no op of the op gate has a candidate for them.
MODEL_ONLY_PATCHES = ("gdn-ba", "prefill-chunk-8192", "tree-verify", FOLD_PATCH)
# Registry patches that are no gate candidate: always applied, and they change no arithmetic of Qwen3.8.
NEUTRAL_PATCHES: dict[str, str] = {
    "exl3-trim-padded-out": "trims padded linear outputs; no Qwen3.8 linear has one (SmolLM2's 576 does)",
    "exl3-async-slice-pointers": "uploads the sliced GEMM's output pointers in stream order; same pointers",
    "exl3-tree-verify": "tree mode's wrappers: outside a tree verify they call the originals (tree mode's "
    "own numerics are the configuration patch tree-verify)",
    "exl3-rows-gemm": "its wrappers act only on models loaded with rows_gemm=True (the configuration patch "
    "rows-gemm)",
    "exl3-gdn-ba": "acts only on models loaded with gdn_ba=True (the configuration patch gdn-ba)",
    "exl3-prefill-groups": "runs ExLlamaV3's 2048-token prefill chunks layer-major in groups: the same "
    "kernels on the same chunks, bitwise the same cache, state and logits (test_prefill_groups.py)",
    "exl3-verify-prelaunch": "queues a captured tree verify's replay behind a gate and copies its inputs "
    "into the same buffers; the replay and its values are unchanged (test_verify_gate.py)",
    "exl3-device-rounds": "greedy rounds decided on the GPU: the proven acceptor over the verify's own "
    "greedy targets, the verify's inputs the host's values for the same tree, rows row-invariant, so "
    "plain decoding's text (CPU emulation of both kernels; the GPU checks are test_round_plan.py's, "
    "test_round_tail.py's and test_device_round.py's)",
    "exl3-round-graph": "a round on the GPU as one launch of a graph composed of its pieces' graphs: the "
    "same kernels on the same addresses in the same order, so the pieces' bits (a GPU test compares every "
    "round's records: test_round_graph.py)",
    "exl3-run-choice": "chooses each round's verify row count, 8 or 16, at which every row's logits are the "
    "same (test_tree_graph.py's run-size test), so plain decoding's text (CPU driver tests; the GPU check is "
    "test_device_round.py's run-choice test)",
    "exl3-draft-candidates": "changes only the draft's candidates (their log-probabilities' last bits, the "
    "order of tied ones), which shape the tree: the acceptor commits the target's greedy tokens whatever the "
    "draft proposes, so no output of the target changes (CPU emulation; the GPU check is "
    "test_draft_candidates.py's)",
    "exl3-sample-draw": "draws a top_k request's rows from the weights torch computed, with the host's steps "
    "in integers and comparisons, so the host's tokens (CPU emulation; the GPU check is "
    "test_sample_draw.py's)",
    "exl3-round-adjust": "adjusts a penalised request's rows on the GPU with History.adjusted's operations, "
    "each correctly rounded, on the same values, so the host's adjusted rows and targets (CPU emulation; the "
    "GPU check is test_device_round.py's adjusted-rounds test)",
    "exl3-vocab-draw": "draws a sampled request without top_k with the host's operations on the same values "
    "(each rounded once, CUDA's exp as torch's, sums of integers), so the host's tokens (CPU emulation; the "
    "GPU checks are test_vocab_draw.py's and test_device_round.py's)",
    "exl3-vocab-draw-heads": "runs the head's draws of exl3-vocab-draw in rounds on the GPU: the same "
    "kernels, the same tokens (the GPU check is test_device_round.py's (p) top_p)",
    "exl3-vocab-draw-nucleus": "draws the rows the head's weights leave undecided over the whole row: "
    "top_p's prefix by an exact integer select, the boundary's ties cut by id as the host's stable sort, "
    "each weight checked against the boundary's by its key (a row out of order is the host's), so the host's "
    "tokens (CPU emulation, a non-monotone exp included; the GPU checks are test_vocab_draw.py's and "
    "test_device_round.py's (p))",
    "exl3-round-logprobs": "runs logprobs requests' rounds on the GPU: each round keeps its verify's logits "
    "and the host reads the committed rows' log-probabilities from them with the host's own function, so "
    "the same tokens and values (CPU: test_device_round_driver_cpu.py; the GPU check is "
    "test_device_round.py's (r))",
    "exl3-embed-gather": "the captured graphs gather the embedding rows ExLlamaV3's host lookup returns, "
    "widened to fp32 exactly (CPU emulation; the GPU checks are test_embed_gather.py's)",
    "exl3-gdn-qkv-channel-major": "the GDN qkv GEMM writes the bits ExLlamaV3's bf16 cast and copy of its "
    "fp16 output write (CPU emulation; the GPU check is test_rows_gemm_patch.py's channel-major test)",
    "exl3-mlp-act-input": "the down projection's input launch computes ExLlamaV3's fp16 SiLU-and-multiply "
    "with the same operations and writes its activation; the GEMM is the same (CPU emulation; the GPU checks "
    "are test_rows_gemm.py's and test_rows_gemm_patch.py's silu-mul tests)",
    "exl3-norm-input": "the group's input launch computes ExLlamaV3's RMSNorm with its operations in its "
    "order and writes its output; the GEMM is the same (CPU emulation; the GPU checks are "
    "test_rows_gemm.py's and test_rows_gemm_patch.py's norm-input tests)",
}
# Configuration patches whose arithmetic is elpis's own kernel: a configuration naming one carries `code`, the
# digest of these sources (repository paths), so a rebuilt kernel is a new configuration in the ledger and a
# rule written before its first measurement can judge it (elpis.gate.ledger). tree-verify joined when its
# attention's split layout changed (session 23, rule exl3-small-tree-r2); configurations measured before then
# name it without a code.
KERNEL_SOURCES: dict[str, tuple[str, ...]] = {
    "tree-verify": (
        "patches/kernels/tree_attention_mma.cu",
        "patches/kernels/tree_attention_common.cuh",
        "patches/kernels/gdn_tree.cu",
        "bend/verify_schedule.bend",
        "bend/gdn_plan.bend",
        "elpis/exl3/tree_attention.py",
        "elpis/exl3/gdn_tree.py",
        "elpis/exl3/tree_verify.py",
    ),
    "rows-gemm": (
        "patches/kernels/exl3_gemm_rows.cu",
        "bend/gemm_schedule.bend",
        "elpis/exl3/rows_gemm.py",
        "elpis/exl3/rows_gemm_patch.py",
    ),
    "gdn-ba": (
        "patches/kernels/gdn_ba_rows.cu",
        "bend/gdn_ba_schedule.bend",
        "elpis/exl3/gdn_ba.py",
        "elpis/exl3/gdn_ba_patch.py",
    ),
}
CODE_DIGEST_HEX = 12
ELPIS_DEFAULTS = ("fixed-rows-8", "gdn-state-fp32")
INT8_PATCH = "exl3-int8-gemv-off"
FIXED_ROWS = 8
MAX_VERIFY_ROWS = 16

LINEAR_ROWS = (*range(1, 17), 256, 1024)  # every verify size; prefill sizes (1024+: fused reconstruct)
HEAD_ROWS = (1, 2, 4, 8, 16, 256)
NORM_ROWS = (1, 8, 256)
GDN_STEP_ROWS = (1, 2, 4, 8, 16)
GDN_CHUNK_ROWS = (64, 256)
ATTENTION_ROWS = (1, 4, 8, 16, 256)
STATE_CONTEXTS = (256, 1024)  # attention and delta rule: tokens already in the cache / the state
DEFAULT_TOKENS = 1280  # covers the largest context plus the largest row count
OP_NAMES = (
    "linear",
    "head",
    "head.logprobs",
    "rmsnorm",
    "gdn.step",
    "gdn.chunked",
    "attention",
    "attention.cq3",
)
CACHE_BITS = 3  # the K/V cache elpis serves with (elpis.exl3.engine.KV_BITS)


# --- options ---------------------------------------------------------------------------------------------


def parse_patches(text: str) -> tuple[str, ...]:
    """`none`, `elpis` (the elpis defaults), `all`, or patch ids joined by `+`: the named patches, sorted."""
    if text == "none":
        return ()
    if text == "elpis":
        return ELPIS_DEFAULTS
    if text == "all":
        return tuple(sorted(PATCHES))
    names = text.split("+")
    unknown = [n for n in names if n not in PATCHES]
    if unknown or not all(names):
        raise ValueError(
            f"patches {text!r}: unknown patch(es) {unknown or ['']}; known {sorted(PATCHES)} "
            "(join several with '+', or use none / elpis / all)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"patches {text!r} names a patch twice")
    return tuple(sorted(names))


def patches_text(names: Sequence[str]) -> str:
    return "+".join(sorted(names)) if names else "none"


def code_digest(names: Sequence[str]) -> str | None:
    """Digest of the kernel sources of the named configuration patches (`KERNEL_SOURCES`), or None if none
    of them has any. A missing source is refused: the configuration's identity could not be known."""
    from elpis.paths import REPO_ROOT

    sources = [(n, rel) for n in sorted(names) for rel in KERNEL_SOURCES.get(n, ())]
    if not sources:
        return None
    digest = hashlib.sha256()
    for name, rel in sources:
        path = REPO_ROOT / rel
        if not path.is_file():
            raise ValueError(f"patch {name}: kernel source {rel} is missing: no configuration identity")
        digest.update(f"{name}\0{rel}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:CODE_DIGEST_HEX]


def _positive(options: dict[str, str], key: str, default: int, low: int = 1, high: int | None = None) -> int:
    text = options.get(key, str(default))
    if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{key} must be an integer {bound}, got {text!r}")
    return int(text)


def configuration_options(options: dict[str, str]) -> dict[str, str]:
    """Every option of an exl3 configuration, defaults written out (the spec is their sorted list).

    `path=served` (default): the served backend's verify calls of `rows` rows under `patches`.
    `path=forward`: one full-sequence forward of the whole document without a cache (ExLlamaV3's own
    no-cache attention, as its perplexity evaluation runs), for models the served backend does not load
    (any architecture ExLlamaV3 reads, e.g. a Llama conversion); no elpis patch applies to it.
    """
    path = options.get("path", "served")
    if path == "forward":
        unknown = sorted(set(options) - {"path", "patches"})
        if unknown:
            raise ValueError(f"exl3 path=forward takes no option(s) {unknown} (only patches=none)")
        if options.get("patches", "none") != "none":
            raise ValueError("exl3 path=forward runs stock ExLlamaV3 only: patches must be none")
        return {"path": "forward", "patches": "none"}
    if path != "served":
        raise ValueError(f"exl3 path must be served or forward, got {path!r}")
    if "path" in options:
        raise ValueError("exl3 path=served is the default: leave it out (one configuration, one spec)")
    known = {"code", "patches", "rows"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown exl3 option(s) {unknown}: known {sorted(known)}")
    text = options.get("patches", "none")
    names = parse_patches(text)
    canonical = patches_text(names)
    if text != canonical:
        raise ValueError(
            f"patches={text!r}: a configuration names its patches explicitly, sorted, joined by '+' "
            f"(write patches={canonical}) so that one configuration has one spec"
        )
    rows = _positive(options, "rows", FIXED_ROWS, 1, MAX_VERIFY_ROWS)
    full = {"patches": canonical, "rows": str(rows)}
    code = code_digest(names)
    if "code" in options and options["code"] != code:
        raise ValueError(
            f"code={options['code']}: this checkout's kernel sources of patches={canonical} are "
            f"{'code=' + code if code else 'none of elpis own (leave code out)'}; a configuration is "
            "measured from the code it names"
        )
    if code is not None:
        full["code"] = code
    return full


@dataclass(frozen=True)
class OpOptions:
    patches: tuple[str, ...]
    tokens: int
    layers: int

    @property
    def spec(self) -> str:
        return Spec(
            "exl3-ops",
            {"layers": str(self.layers), "patches": patches_text(self.patches), "tokens": str(self.tokens)},
        ).text


def op_options(options: dict[str, str]) -> OpOptions:
    """Options of `gate_ops`: `patches` (candidates; default all), `tokens` (length of the recorded
    forward pass, default 1280), `layers` (operand sets per op: layers recorded, default 2)."""
    known = {"patches", "tokens", "layers"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown exl3 op option(s) {unknown}: known {sorted(known)}")
    return OpOptions(
        parse_patches(options.get("patches", "all")),
        _positive(options, "tokens", DEFAULT_TOKENS, 32, 16384),
        _positive(options, "layers", 2, 1, 64),
    )


def require_gpu() -> None:
    """A clear refusal (ValueError, so `elpis gate` reports it and exits 2) where ExLlamaV3 cannot run."""
    if not torch.cuda.is_available():
        raise ValueError("the exl3 gate provider needs a CUDA GPU (on CPU use --backend reference)")
    # found, not imported: environment patches must be applied before exllamav3 is imported
    if importlib.util.find_spec("exllamav3") is None:
        raise ValueError("the exl3 gate provider needs exllamav3 (the gpu extra), which is not installed")


def _model_dir(model: Path | None) -> Path:
    if model is None:
        raise ValueError("the exl3 ops need --model (an EXL3 model directory; activations come from it)")
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not an EXL3 model directory (no config.json)")
    return path


# --- configurations ----------------------------------------------------------------------------------------


def _compared_width(model_dir: Path) -> int:
    """Width of the logits compared: the tokenizer's vocabulary where the logits are padded past it, the
    logits' own width where the tokenizer is wider (the synthetic checkpoints carry the full Qwen tokenizer
    over a narrower head: feed them ids below that width, e.g. `elpis gate model --random-ids`; a text id
    past it is refused by the backend's own range check, never read)."""
    from elpis.exl3.geometry import read_config
    from elpis.text import load_tokenizer

    width = int(read_config(model_dir)["vocab_size"])
    return min(width, load_tokenizer(model_dir).vocab_size)


def _require_process_switch(patch_id: str, on: bool, names: Sequence[str], of: str) -> None:
    """A process-wide registry switch (`patch_id`, on or off in this process): a configuration names the patch
    exactly when the process runs with it; otherwise say which setting of the switch would run it."""
    from elpis.exl3 import patches as registry

    if on == (patch_id in names):
        return
    patch = next(p for p in registry.load_registry() if p.id == patch_id)
    wanted = patch_id in names
    setting = ("1" if wanted else "0") + (" (or unset)" if wanted == patch.default else "")
    raise ValueError(
        f"{patch_id} is a process-wide switch of {of} and this process runs with it {'on' if on else 'off'}: "
        f"run a configuration that {'names' if wanted else 'omits'} it with {patch.switch}={setting}"
    )


def _check_int8_switch(names: Sequence[str]) -> None:
    from elpis.exl3 import patches as registry

    _require_process_switch(INT8_PATCH, registry.apply_all().get(INT8_PATCH, False), names, "ExLlamaV3")


def _check_fold_switch(names: Sequence[str]) -> None:
    """The fold is read once per process (`tree_attention.hadamard_fold_default`)."""
    from elpis.exl3 import tree_attention

    _require_process_switch(FOLD_PATCH, tree_attention.hadamard_fold_default(), names, "the tree attention")


def backend_options(names: Sequence[str]) -> dict[str, Any]:
    """`load_backend` keywords of a configuration's patches; refuses combinations the backend cannot run."""
    tree = "tree-verify" in names
    if FOLD_PATCH in names and not tree:
        raise ValueError(f"patch {FOLD_PATCH} acts inside tree verifies only: it needs tree-verify")
    if tree and "gdn-state-fp32" not in names:
        raise ValueError("patch tree-verify needs gdn-state-fp32 (the tree kernels keep a fp32 GDN state)")
    if tree and "fixed-rows-8" in names:
        raise ValueError("patch tree-verify replaces fixed-rows-8 (every verify is a 16-row tree): drop it")
    if "gdn-ba" in names and not tree:
        raise ValueError("patch gdn-ba acts inside tree verifies only: it needs tree-verify")
    options: dict[str, Any] = {
        "fixed_rows": FIXED_ROWS if "fixed-rows-8" in names else None,
        "gdn_state_fp32": "gdn-state-fp32" in names,
        "prefill_chunk": 8192 if "prefill-chunk-8192" in names else EXLLAMA_PREFILL_CHUNK,
        "rows_gemm": "rows-gemm" in names,  # explicit: a floor never follows the process's registry switch
        "gdn_ba": "gdn-ba" in names,
    }
    if tree:
        options.update(tree=True, tree_rows=16)
    return options


class Exl3Configuration:
    """A `LogitsModel` over the served exl3 backend (see the module docstring)."""

    def __init__(self, model: Path, options: dict[str, str]) -> None:
        full = configuration_options(options)
        self.spec = Spec("exl3", full).text
        self.options = full
        names = parse_patches(full["patches"])
        loader_options = backend_options(names)
        require_gpu()
        model_dir = _model_dir(model)
        self.vocab_size = _compared_width(model_dir)
        _check_int8_switch(names)
        if "tree-verify" in names:  # only tree verifies run the tree attention
            _check_fold_switch(names)
        from elpis.exl3 import load_backend

        self.backend = load_backend(
            model_dir,
            None,
            model_id=model_dir.name,
            host_cache_gib=0.0,
            prefix_cache=False,  # every sequence from scratch, like the reference configurations
            **loader_options,
        )
        self._served = BackendLogits(self.spec, self.backend, int(full["rows"]), self.vocab_size)

    def teacher_forced(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        return self._served.teacher_forced(tokens, start)

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        return self._served.greedy(prompt, steps)


class Exl3ForwardConfiguration:
    """`exl3:path=forward`: ExLlamaV3's full-sequence forward without a cache (see configuration_options)."""

    def __init__(self, model: Path, full: dict[str, str]) -> None:
        self.spec = Spec("exl3", full).text
        require_gpu()
        model_dir = _model_dir(model)
        self.vocab_size = _compared_width(model_dir)
        _check_int8_switch(())
        from exllamav3 import Config, Model

        config = Config.from_directory(str(model_dir))
        self.model = Model.from_config(config)
        self.model.load(device="cuda:0", progressbar=False)

    @torch.inference_mode()
    def _logits(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        out = self.model.forward(ids, {"attn_mode": "flash_attn_nc"})
        return out[0, :, : self.vocab_size].float()

    def teacher_forced(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        tokens = list(tokens)
        check_start(len(tokens), start)
        return self._logits(tokens[:-1])[start:].cpu()

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        sequence, produced = list(prompt), []
        for _ in range(steps):  # the whole sequence again per token: exact, and cheap for small models
            token = int(torch.argmax(self._logits(sequence)[-1]))
            produced.append(token)
            sequence.append(token)
        return produced


def configuration(model: Path, options: dict[str, str]) -> Exl3Configuration | Exl3ForwardConfiguration:
    full = configuration_options(options)
    if full.get("path") == "forward":
        return Exl3ForwardConfiguration(model, full)
    return Exl3Configuration(model, options)


# --- the int8 GEMV switch ----------------------------------------------------------------------------------


class Int8GemvSwitch:
    """Runs code with ExLlamaV3's int8-activation GEMV off, as the `exl3-int8-gemv-off` patch does.

    The extension reads `EXL3_INT8_GEMV` once and caches it behind the exported flag
    `_exl3_gemv_int8_mode_chk`; clearing the flag makes the next GEMM read the variable again. Both are put
    back afterwards, so stock and the patch run in one process on the same operands.
    """

    FLAG = "_exl3_gemv_int8_mode_chk"

    def __init__(self, library_path: str | None = None) -> None:
        if library_path is None:  # the extension this process has loaded
            from exllamav3.ext import exllamav3_ext

            library_path = exllamav3_ext.__file__
        library = ctypes.CDLL(library_path)
        try:
            self.checked = ctypes.c_bool.in_dll(library, self.FLAG)
        except ValueError as exc:
            raise ValueError(
                f"the loaded exllamav3 extension does not export {self.FLAG}: the {INT8_PATCH} candidate "
                "cannot be switched in-process"
            ) from exc

    @contextmanager
    def off(self) -> Iterator[None]:
        previous = os.environ.get("EXL3_INT8_GEMV")
        os.environ["EXL3_INT8_GEMV"] = "0"
        self.checked.value = False
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("EXL3_INT8_GEMV", None)
            else:
                os.environ["EXL3_INT8_GEMV"] = previous
            self.checked.value = False  # the next GEMM reads the restored setting

    def was_read(self) -> bool:
        return bool(self.checked.value)


# --- recording operands ------------------------------------------------------------------------------------


@dataclass
class Recorded:
    # (Linear, x [1, T, in], out_dtype) per recorded linear
    linears: list[tuple[Any, torch.Tensor, Any]] = field(default_factory=list)
    head: tuple[Any, torch.Tensor, Any] | None = None
    norms: list[tuple[Any, torch.Tensor, torch.Tensor | None, Any]] = field(default_factory=list)
    deltanet: list[dict[str, Any]] = field(default_factory=list)  # kwargs of gated_delta_rule_fn
    attention: list[dict[str, Any]] = field(default_factory=list)  # q, k, v, sm_scale, layer
    source: str = ""


def _sequence(model_dir: Path, config: dict[str, Any], tokens: int) -> tuple[list[int], str]:
    """WikiText-2 through the model's tokenizer, or fixed pseudo-random ids for a synthetic checkpoint or
    where the tokenizer's ids would not fit the vocabulary."""
    from elpis.bench.workload import prompt
    from elpis.gate.corpus import wikitext_chunks
    from elpis.text import load_tokenizer

    vocab = int(config["vocab_size"])
    if config.get("synthetic"):  # random weights: text means nothing to them
        return prompt(tokens, 0, vocab), "pseudo-random ids (seed 0; synthetic checkpoint)"
    try:
        tokenizer = load_tokenizer(model_dir)
        ids = wikitext_chunks(lambda text: tokenizer.encode(text, special=False), 1, tokens)[0]
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise ValueError(f"{model_dir}: cannot tokenize WikiText-2 for the operands: {exc}") from exc
    if max(ids) >= vocab:
        return prompt(tokens, 0, vocab), "pseudo-random ids (seed 0; the tokenizer's ids exceed the model's)"
    return ids, "WikiText-2"


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def record(engine: Any, ids: list[int], layers: int, hidden: int) -> Recorded:
    """One forward pass with the cache and recurrent state of the served path, recording operands."""
    from exllamav3.modules import Linear, RMSNorm
    from exllamav3.modules.attention_fn import attn_dispatch
    from exllamav3.modules.gated_delta_net_fn import gated_delta_rule_fn
    from exllamav3.modules.quant.exl3 import LinearEXL3

    from elpis.exl3 import tree_verify
    from elpis.exl3.backend import stock_table_width
    from elpis.gate.patching import replaced

    rec = Recorded()
    seen: set[str] = set()
    linear_forward, norm_forward = Linear.forward, RMSNorm.forward

    def on_linear(self, x, params, out_dtype=None):
        # fp16 inputs only: the kernels read fp16, so the fp64 evaluation sees exactly their operand
        if isinstance(self.inner, LinearEXL3) and x.dtype == torch.half and self.key not in seen:
            seen.add(self.key)
            entry = (self, _clone(x), out_dtype)
            if self.key == "lm_head":
                rec.head = entry
            elif len(rec.linears) < layers + 2:
                rec.linears.append(entry)
        return linear_forward(self, x, params, out_dtype)

    def on_norm(self, x, params, out_dtype=None, residual=None, residual_in=None):
        plain = (
            residual is None and getattr(self, "groups", 1) == 1 and not getattr(self, "span_heads", False)
            and not getattr(self, "unweighted", False) and x.shape[-1] == hidden and self.key not in seen
        )  # fmt: skip
        if plain and len(rec.norms) < layers:
            seen.add(self.key)
            rec.norms.append((self, _clone(x), _clone(residual_in), out_dtype))
        return norm_forward(self, x, params, out_dtype, residual=residual, residual_in=residual_in)

    def on_delta_rule(*args, **kwargs):
        if not args and len(rec.deltanet) < layers and not kwargs.get("channelwise_g", False):
            rec.deltanet.append({k: _clone(v) for k, v in kwargs.items() if k != "params"})
        return gated_delta_rule_fn(*args, **kwargs)

    def on_attention(*args, **kwargs):
        cache = kwargs.get("cache")
        if cache is not None and not args and len(rec.attention) < layers:
            layer = cache.layers[kwargs["cache_idx"], kwargs.get("cache_instance") or 0]
            rec.attention.append(
                {
                    "q": _clone(kwargs["q"]),
                    "k": _clone(kwargs["k"]),
                    "v": _clone(kwargs["v"]),
                    "sm_scale": kwargs.get("sm_scale"),
                    "attention": layer.attention,
                }
            )
        return attn_dispatch(*args, **kwargs)

    table = torch.zeros((1, stock_table_width(len(ids))), dtype=torch.int32)
    pages = -(-len(ids) // 256)
    table[0, :pages] = torch.arange(pages, dtype=torch.int32)
    Linear.forward, RMSNorm.forward = on_linear, on_norm
    state = None
    try:
        with (
            torch.inference_mode(),
            tree_verify.suspended(),  # a tree verify earlier in the process left its wrappers bound
            replaced("exllamav3", {gated_delta_rule_fn: on_delta_rule, attn_dispatch: on_attention}),
        ):
            params = {
                "attn_mode": "flash_attn",
                "block_table": table,
                "cache": engine.cache,
                "cache_seqlens": torch.tensor([0], dtype=torch.int32),
            }
            if engine.cache.recurrent_state_cls is not None:  # hybrid models (Qwen3.8); none for Llama
                state = engine.cache.get_new_state()
                params["recurrent_states"] = [state]
            engine.model.forward(torch.tensor([ids], dtype=torch.long), params)
            torch.cuda.synchronize(engine.device)
    finally:
        Linear.forward, RMSNorm.forward = linear_forward, norm_forward
        if state is not None:
            state.free()
    return rec


# --- shared pieces -----------------------------------------------------------------------------------------


def _rows(x: torch.Tensor, context: int, count: int, what: str) -> torch.Tensor:
    """Rows [context, context + count) of a recorded [1, T, ...] tensor (contiguous)."""
    if count < 1 or context < 0 or context + count > x.shape[1]:
        raise ValueError(
            f"{what}: context {context} + rows {count} needs more than the {x.shape[1]} recorded tokens "
            "(raise the tokens option)"
        )
    return x[:, context : context + count].contiguous()


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """[1, r, ...] padded to [1, rows, ...] with copies of the last row (what fixed-rows verify runs)."""
    if x.shape[1] >= rows:
        return x
    pad = x[:, -1:].expand(x.shape[0], rows - x.shape[1], *x.shape[2:])
    return torch.cat([x, pad], dim=1).contiguous()


def fitted_grid(
    contexts: tuple[int, ...], rows: tuple[int, ...], tokens: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The default grid cut to what `tokens` recorded tokens hold (every context + rows <= tokens)."""
    fit_rows = tuple(r for r in rows if min(contexts) + r <= tokens)
    if not fit_rows:
        return None
    fit_contexts = tuple(c for c in contexts if c + max(fit_rows) <= tokens)
    return fit_contexts, fit_rows


def _probe(op: GateOp) -> tuple[GateOp | None, list[str]]:
    """Run every cell of the op's grid once on its first operand set: stock and fp64 first (a failure
    leaves the op out), then each candidate (a failure leaves that candidate out). Returns the op with the
    candidates that ran everywhere (None if stock or fp64 failed) and the reasons for what was left out. One
    GPU run must not lose every op to one kernel path's failure."""
    cells = [(context, rows) for context in op.contexts for rows in op.rows]
    failed: dict[str, str] = {}
    for context, rows in cells:
        try:
            operands = next(iter(op.inputs(context, rows)))
            exact = op.exact(operands)
            impls = {"stock": op.stock, **{n: f for n, f in op.candidates.items() if n not in failed}}
        except Exception as exc:  # any failure leaves the op out, with its reason printed
            return None, [
                f"op {op.name} left out: context {context} rows {rows}: {type(exc).__name__}: {exc}"
            ]
        for name, impl in impls.items():
            try:
                out = impl(operands)
                if out.shape != exact.shape:
                    raise ValueError(
                        f"output {tuple(out.shape)} differs from the fp64 shape {tuple(exact.shape)}"
                    )
            except Exception as exc:
                reason = f"context {context} rows {rows}: {type(exc).__name__}: {exc}"
                if name == "stock":
                    return None, [f"op {op.name} left out: {reason}"]
                failed[name] = reason
    kept = {n: f for n, f in op.candidates.items() if n not in failed}
    notes = [f"candidate {n} of op {op.name} left out: {why}" for n, why in failed.items()]
    return GateOp(op.name, op.description, op.stock, op.exact, op.inputs, op.contexts, op.rows, kept), notes


# --- linear and head ---------------------------------------------------------------------------------------


def exact_weight(
    decoded: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, hadamard: torch.Tensor
) -> torch.Tensor:
    """The dense fp64 weight [in, out] of an EXL3 linear, as `LinearEXL3.get_weight_tensor` defines it:
    diag(suh) H decoded H diag(svh), H block-diagonal of the normalised 128-point Hadamard `hadamard`."""
    w = decoded.to(torch.float64)
    k, n = w.shape
    size = hadamard.shape[0]
    had = hadamard.to(device=w.device, dtype=torch.float64)
    w = (had @ w.view(-1, size, n)).view(k, n) * suh.to(torch.float64).unsqueeze(1)
    return (w.view(k, -1, size) @ had).view(k, n) * svh.to(torch.float64).unsqueeze(0)


class ExactWeights:
    """fp64 weights of the recorded EXL3 linears (decoded trellis by ExLlamaV3, the rest in fp64), cached."""

    def __init__(self) -> None:
        self._cache: dict[str, torch.Tensor] = {}

    def __call__(self, linear: Any) -> torch.Tensor:
        if linear.key not in self._cache:
            from exllamav3.util.hadamard import get_hadamard

            inner = linear.inner
            hadamard = get_hadamard(128).to(torch.float64) / math.sqrt(128)
            # the decoded trellis [in, out] is exact in fp16 (the kernels decode to the same values)
            self._cache[linear.key] = exact_weight(
                inner.get_inner_weight_tensor(), inner.suh, inner.svh, hadamard
            )
        return self._cache[linear.key]


def _linear_ops(rec: Recorded, names: Sequence[str], contexts: tuple[int, ...]) -> list[GateOp]:
    weights = ExactWeights()
    switch = None
    if INT8_PATCH in names:
        try:
            switch = Int8GemvSwitch()
        except (ValueError, OSError) as exc:  # the other ops and candidates can still be measured
            print(f"exl3 gate: candidate {INT8_PATCH} left out: {exc}", file=sys.stderr)

    def forward(o: OpInputs, rows: int | None = None) -> torch.Tensor:
        linear, x = o.params["linear"], o.tensors["x"]
        count = x.shape[1]
        run = _padded(x, rows) if rows else x
        with torch.inference_mode():
            return linear.forward(run, {}, o.params["out_dtype"])[:, :count]

    def exact_logits(o: OpInputs) -> torch.Tensor:
        linear = o.params["linear"]
        if (linear.pre_scale, linear.softcap, linear.post_scale) != (1.0, 0.0, 1.0):
            raise ValueError(f"{linear.key}: scaled or soft-capped output is not in the fp64 evaluation")
        y = o.tensors["x"].to(torch.float64) @ weights(linear)
        bias = linear.inner.bias
        return y + bias.to(torch.float64) if bias is not None else y

    def int8_off(o: OpInputs) -> torch.Tensor:
        assert switch is not None
        with switch.off():
            out = forward(o)
            torch.cuda.synchronize()
            read = switch.was_read()
        if o.tensors["x"].shape[1] <= 144 and not read:  # the reconstruct path (more rows) never asks
            raise RuntimeError("the int8 GEMV setting was not read again: the patch did not take effect")
        return out

    def rows_gemm_forward(o: OpInputs) -> torch.Tensor:
        """What the patch rows-gemm computes: elpis's GEMM where it takes the call, ExLlamaV3's elsewhere."""
        from elpis.exl3 import rows_gemm_patch

        inner, x, out_dtype = o.params["linear"].inner, o.tensors["x"], o.params["out_dtype"]
        if not rows_gemm_patch.eligible(inner, x, {}, out_dtype):
            return forward(o)
        with torch.inference_mode():
            return rows_gemm_patch.run(inner, x, out_dtype)

    def candidates(as_logits: bool) -> dict[str, Callable[[OpInputs], torch.Tensor]]:
        wrap = (lambda f: lambda o: f(o).float()) if as_logits else (lambda f: f)
        found: dict[str, Callable[[OpInputs], torch.Tensor]] = {}
        if switch is not None:
            found[INT8_PATCH] = wrap(int8_off)
        if "fixed-rows-8" in names:
            found["fixed-rows-8"] = wrap(lambda o: forward(o, FIXED_ROWS))
        if "rows-gemm" in names:
            found["rows-gemm"] = wrap(rows_gemm_forward)
        return found

    def make_inputs(entries: list[tuple[Any, torch.Tensor, Any]]):
        def inputs(context: int, count: int) -> Iterator[OpInputs]:
            for linear, x, out_dtype in entries:
                rows = _rows(x.reshape(1, -1, x.shape[-1]), context, count, linear.key)
                yield OpInputs({"x": rows}, {"linear": linear, "out_dtype": out_dtype}, label=linear.key)

        return inputs

    ops = []
    if rec.linears:
        ops.append(
            GateOp(
                "linear",
                "EXL3 GEMM of layer linears (Linear.forward; rows = M)",
                forward,
                exact_logits,
                make_inputs(rec.linears),
                contexts,
                LINEAR_ROWS,
                candidates(False),
            )
        )
    if rec.head is not None:

        def head_logprobs(impl: Callable[[OpInputs], torch.Tensor]) -> Callable[[OpInputs], torch.Tensor]:
            return lambda o: torch.log_softmax(impl(o).to(torch.float64), dim=-1)

        def stock_logits(o: OpInputs) -> torch.Tensor:
            return forward(o).float()

        logits_candidates = candidates(True)
        ops += [
            GateOp(
                "head",
                "lm_head on the final-norm output, float32 logits as verify returns them",
                stock_logits,
                exact_logits,
                make_inputs([rec.head]),
                contexts,
                HEAD_ROWS,
                logits_candidates,
            ),
            GateOp(
                "head.logprobs",
                "float64 log-softmax of the float32 logits (elpis's sampler)",
                head_logprobs(stock_logits),
                lambda o: torch.log_softmax(exact_logits(o), dim=-1),
                make_inputs([rec.head]),
                contexts,
                HEAD_ROWS,
                {name: head_logprobs(impl) for name, impl in logits_candidates.items()},
            ),
        ]
    return ops


# --- RMSNorm -----------------------------------------------------------------------------------------------


def exact_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    constant_scale: float,
    constant_bias: float,
) -> torch.Tensor:
    """RMSNorm of x (+ residual, the fused pre-norm add) in fp64: ExLlamaV3's weight is applied as
    weight + constant_bias (1 for the zero-centred norms of Qwen3.5-family models)."""
    from elpis.reference.layers import rms_norm

    h = x.to(torch.float64)
    if residual is not None:
        h = h + residual.to(torch.float64)
    return rms_norm(h, (weight.to(torch.float64) + constant_bias) * constant_scale, eps)


def _norm_ops(rec: Recorded, contexts: tuple[int, ...]) -> list[GateOp]:
    def stock(o: OpInputs) -> torch.Tensor:
        norm, x, residual = o.params["norm"], o.tensors["x"], o.tensors.get("residual")
        with torch.inference_mode():
            if residual is None:
                return norm.forward(x.clone(), {}, o.params["out_dtype"])
            return norm.forward(x.clone(), {}, o.params["out_dtype"], residual_in=residual.clone())

    def exact(o: OpInputs) -> torch.Tensor:
        norm = o.params["norm"]
        return exact_rmsnorm(
            o.tensors["x"], o.tensors.get("residual"), norm.weight, norm.rms_norm_eps,
            norm.constant_scale, norm.constant_bias,
        )  # fmt: skip

    def inputs(context: int, count: int) -> Iterator[OpInputs]:
        for norm, x, residual, out_dtype in rec.norms:
            tensors = {"x": _rows(x.reshape(1, -1, x.shape[-1]), context, count, norm.key)}
            if residual is not None:
                tensors["residual"] = _rows(residual.reshape(1, -1, x.shape[-1]), context, count, norm.key)
            yield OpInputs(tensors, {"norm": norm, "out_dtype": out_dtype}, label=norm.key)

    if not rec.norms:
        return []
    return [
        GateOp(
            "rmsnorm",
            "RMSNorm of the residual stream as the model calls it (fused residual add where deferred)",
            stock,
            exact,
            inputs,
            contexts,
            NORM_ROWS,
        )
    ]


# --- Gated DeltaNet ----------------------------------------------------------------------------------------


class ExactDeltaRule:
    """The gated delta rule of one recorded call in fp64 from a zero state (`elpis.reference.layers`'s
    recurrent form), with states kept at the positions asked for, so every cell's start state and final
    state come from one exact run. `mixed_qkv` [1, T, q | k | v] holds the convolved, unnormalised q/k/v
    (q and k are L2-normalised inside the kernels); v head h reads q/k head h // (v heads / k heads)."""

    def __init__(self, call: dict[str, Any]) -> None:
        from elpis.reference.layers import l2_normalize

        nk, nv = call["num_k_heads"], call["num_v_heads"]
        dk, dv = call["k_head_dim"], call["v_head_dim"]
        x = call["mixed_qkv"][0].to(torch.float64)
        steps = x.shape[0]
        q = l2_normalize(x[:, : nk * dk].reshape(steps, nk, dk)) * dk**-0.5
        k = l2_normalize(x[:, nk * dk : 2 * nk * dk].reshape(steps, nk, dk))
        self.q = q.repeat_interleave(nv // nk, dim=1)
        self.k = k.repeat_interleave(nv // nk, dim=1)
        self.v = x[:, 2 * nk * dk :].reshape(steps, nv, dv)
        self.g = call["g"][0].to(torch.float64)
        self.beta = call["beta"][0].to(torch.float64)
        self.states = {0: torch.zeros(nv, dk, dv, dtype=torch.float64, device=x.device)}
        self.outputs = torch.zeros(steps, nv, dv, dtype=torch.float64, device=x.device)

    def state(self, position: int) -> torch.Tensor:
        """The exact state after `position` tokens."""
        from elpis.reference.layers import delta_rule_recurrent

        if not 0 <= position <= self.q.shape[0]:
            raise ValueError(f"state after {position} tokens: {self.q.shape[0]} were recorded")
        if position not in self.states:
            start = max(p for p in self.states if p <= position)
            window = slice(start, position)
            out, state = delta_rule_recurrent(
                self.q[window], self.k[window], self.v[window], self.g[window], self.beta[window],
                self.states[start],
            )  # fmt: skip
            self.outputs[window] = out
            self.states[position] = state
        return self.states[position]

    def window(self, context: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs of rows [context, context + count) [count, v heads, dv] and the state after them."""
        final = self.state(context + count)  # states are reached from 0 in order: earlier outputs exist
        return self.outputs[context : context + count], final


def _deltanet_ops(rec: Recorded, names: Sequence[str]) -> list[GateOp]:
    from exllamav3.modules.gated_delta_net_fn import gated_delta_rule_fn

    exact_runs = [ExactDeltaRule(call) for call in rec.deltanet]

    def run(o: OpInputs, state_dtype: torch.dtype) -> torch.Tensor:
        call = o.params["call"]
        nv, dk, dv = call["num_v_heads"], call["k_head_dim"], call["v_head_dim"]
        pool = o.tensors["state"].to(state_dtype).reshape(1, 1, nv, dk, dv).contiguous()
        with torch.inference_mode():
            out = gated_delta_rule_fn(
                mixed_qkv=o.tensors["mixed_qkv"],
                beta=o.tensors["beta"],
                g=o.tensors["g"],
                recurrent_state=pool,
                recurrent_slots=None,
                history=False,
                save_state=True,
                num_k_heads=call["num_k_heads"],
                num_v_heads=nv,
                k_dim=call["k_dim"],
                v_dim=call["v_dim"],
                k_head_dim=dk,
                v_head_dim=dv,
                params={},
            )
        return torch.cat([out.reshape(-1, dv).to(torch.float64), pool.reshape(-1, dv).to(torch.float64)])

    def exact(o: OpInputs) -> torch.Tensor:
        outputs, final = o.params["exact"].window(o.params["context"], o.tensors["mixed_qkv"].shape[1])
        dv = outputs.shape[-1]
        return torch.cat([outputs.reshape(-1, dv), final.reshape(-1, dv)])

    def inputs(context: int, count: int) -> Iterator[OpInputs]:
        for layer, (call, exact_run) in enumerate(zip(rec.deltanet, exact_runs, strict=True)):
            tensors = {name: _rows(call[name], context, count, "gdn") for name in ("mixed_qkv", "beta", "g")}
            tensors["state"] = exact_run.state(context)
            yield OpInputs(
                tensors,
                {"call": call, "exact": exact_run, "context": context},
                label=f"deltanet call {layer}",
            )

    candidates = {}
    if "gdn-state-fp32" in names:
        candidates["gdn-state-fp32"] = lambda o: run(o, torch.float32)
    stock = lambda o: run(o, torch.float16)  # noqa: E731 - ExLlamaV3's default recurrent_dtype
    if not rec.deltanet:
        return []
    described = "rows' outputs then the final state as stored; start state = exact state after `context`"
    return [
        GateOp(
            "gdn.step",
            f"gated delta rule over verify rows (CUDA recurrent kernel); {described}",
            stock,
            exact,
            inputs,
            STATE_CONTEXTS,
            GDN_STEP_ROWS,
            candidates,
        ),
        GateOp(
            "gdn.chunked",
            f"gated delta rule over prefill rows (fla chunked kernels); {described}",
            stock,
            exact,
            inputs,
            STATE_CONTEXTS,
            GDN_CHUNK_ROWS,
            candidates,
        ),
    ]


# --- attention ---------------------------------------------------------------------------------------------


class PagedLayer:
    """A standalone paged K/V cache layer (fp16, or quantized like the served cache) for one attention
    module, pages in order (block table = 0, 1, 2, ...)."""

    def __init__(self, attention: Any, tokens: int, bits: int | None, device: torch.device) -> None:
        from exllamav3.cache import CacheLayer_fp16, CacheLayer_quant

        from elpis.exl3.backend import stock_table_width

        capacity = -(-tokens // 256) * 256
        if bits is None:
            self.layer = CacheLayer_fp16(None, attention, 0, capacity)
        else:
            self.layer = CacheLayer_quant(None, attention, 0, capacity, bits, bits)
        self.layer.alloc(device)
        width = max(stock_table_width(tokens), capacity // 256)
        self.table = torch.zeros((1, width), dtype=torch.int32, device=device)
        self.table[0, : capacity // 256] = torch.arange(capacity // 256, dtype=torch.int32, device=device)
        self.device = device

    def seqlens(self, n: int) -> torch.Tensor:
        return torch.tensor([n], dtype=torch.int32, device=self.device)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V rows at positions start.. as the attention path stores new rows."""
        if k.shape[1]:
            self.layer.update_kv_direct(
                self.seqlens(start), self.table, k.contiguous(), v.contiguous(), k.shape[1]
            )

    def contents(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions 0..n-1 as ExLlamaV3 dequantises them: [n, kv_heads, dim] each."""
        k, v = self.layer.get_kv(self.seqlens(n), self.table, -1)
        return k.flatten(0, 1)[:n], v.flatten(0, 1)[:n]


def exact_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context: int, sm_scale: float
) -> torch.Tensor:
    """Causal grouped-head attention in fp64 of rows q [1, r, heads, d] at positions context.. over
    keys/values [context + r, kv heads, d] (`elpis.reference.layers.attend`); returns [1, r, heads, d]."""
    from elpis.reference.layers import attend

    count, heads, dim = q.shape[1], q.shape[2], q.shape[3]
    if keys.shape[0] != context + count:
        raise ValueError(f"{keys.shape[0]} cached positions for rows {context}..{context + count - 1}")
    visible = torch.arange(context + count, device=q.device)[None, :] <= (
        context + torch.arange(count, device=q.device)[:, None]
    )
    rows = q[0].to(torch.float64) * (sm_scale / dim**-0.5)  # attend scales by dim^-0.5
    out = attend(rows, keys.to(torch.float64), values.to(torch.float64), visible)
    return out.reshape(1, count, heads, dim)


def _attention_ops(rec: Recorded, names: Sequence[str], tokens: int, device: torch.device) -> list[GateOp]:
    from exllamav3.modules.attention_fn import attn_dispatch

    def run(o: OpInputs, rows: int | None = None) -> torch.Tensor:
        cache: PagedLayer = o.params["cache"]
        q, k, v = o.tensors["q"], o.tensors["k"], o.tensors["v"]
        count, context = q.shape[1], o.params["context"]
        if rows:
            q, k, v = _padded(q, rows), _padded(k, rows), _padded(v, rows)
        with torch.inference_mode():
            out = attn_dispatch(
                q=q,
                k=k,
                v=v,
                cache=cache.layer,
                block_table=cache.table,
                cache_seqlens=cache.seqlens(context),
                causal=True,
                sm_scale=o.params["sm_scale"],
                max_kv_len=context if q.shape[1] > 16 else None,
            )
        return out.reshape(1, q.shape[1], q.shape[2], -1)[:, :count]

    def exact(o: OpInputs) -> torch.Tensor:
        cache: PagedLayer = o.params["cache"]
        q, context = o.tensors["q"], o.params["context"]
        cache.write(context, o.tensors["k"], o.tensors["v"])  # what the attention call writes first
        keys, values = cache.contents(context + q.shape[1])
        return exact_attention(q, keys, values, context, o.params["sm_scale"])

    caches: dict[tuple[int, int | None], PagedLayer] = {}

    def make_inputs(bits: int | None):
        def inputs(context: int, count: int) -> Iterator[OpInputs]:
            for index, call in enumerate(rec.attention):
                if (index, bits) not in caches:
                    caches[(index, bits)] = PagedLayer(call["attention"], tokens + FIXED_ROWS, bits, device)
                cache = caches[(index, bits)]
                q = _rows(call["q"], context, count, "attention")
                cache.write(0, call["k"][:, :context], call["v"][:, :context])  # the prefix, freshly stored
                yield OpInputs(
                    {"q": q, "k": _rows(call["k"], context, count, "attention"),
                     "v": _rows(call["v"], context, count, "attention")},
                    {"cache": cache, "context": context,
                     "sm_scale": call["sm_scale"] or call["q"].shape[-1] ** -0.5},
                    label=f"attention call {index}",
                )  # fmt: skip

        return inputs

    if not rec.attention:
        return []
    candidates = {"fixed-rows-8": lambda o: run(o, FIXED_ROWS)} if "fixed-rows-8" in names else {}
    return [
        GateOp(
            "attention",
            "attention of the rows over a paged fp16 K/V cache (attn_dispatch)",
            run,
            exact,
            make_inputs(None),
            STATE_CONTEXTS,
            ATTENTION_ROWS,
            candidates,
        ),
        GateOp(
            "attention.cq3",
            f"attention over the {CACHE_BITS}-bit K/V cache elpis serves with "
            "(fp64 over its dequantised contents)",
            run,
            exact,
            make_inputs(CACHE_BITS),
            STATE_CONTEXTS,
            ATTENTION_ROWS,
            candidates,
        ),
    ]


# --- the provider function ---------------------------------------------------------------------------------


def gate_ops(model: Path | None, options: dict[str, str]) -> list[GateOp]:
    chosen = op_options(options)
    model_dir = _model_dir(model)
    require_gpu()
    from elpis.exl3 import patches as registry

    applied = registry.apply_all().items()
    # the fold acts inside tree verifies, which no op of the op gate runs: it is judged by model comparisons
    neutral_here = {*NEUTRAL_PATCHES, FOLD_PATCH}
    on = sorted(name for name, enabled in applied if enabled and name not in neutral_here)
    if on or "EXL3_INT8_GEMV" in os.environ:
        raise ValueError(
            f"the exl3 ops measure stock ExLlamaV3 and each patch in one process; this process runs with "
            f"patches {on} / EXL3_INT8_GEMV={os.environ.get('EXL3_INT8_GEMV')}: unset them"
        )
    from elpis.exl3.engine import load_engine
    from elpis.exl3.geometry import read_config

    config = read_config(model_dir)
    tokens = chosen.tokens
    ids, source = _sequence(model_dir, config, tokens)  # before loading: a bad tokenizer fails fast
    engine = load_engine(
        model_dir,
        None,
        cache_tokens=-(-(tokens + 256) // 256) * 256,
        warmup=False,
        progress=False,
        recurrent_dtype=torch.float,
    )
    rec = record(engine, ids, chosen.layers, int(config["hidden_size"]))
    contexts = (0,)
    ops = (
        _linear_ops(rec, chosen.patches, contexts)
        + _norm_ops(rec, contexts)
        + _deltanet_ops(rec, chosen.patches)
        + _attention_ops(rec, chosen.patches, tokens, engine.device)
    )
    kept = []
    for op in ops:
        grid = fitted_grid(op.contexts, op.rows, tokens)
        if grid is None:
            print(
                f"exl3 gate: op {op.name} left out: its grid needs more than {tokens} tokens", file=sys.stderr
            )
            continue
        op = GateOp(
            op.name, f"{op.description} [operands: {source}; {chosen.spec}]", op.stock, op.exact, op.inputs,
            grid[0], grid[1], op.candidates,
        )  # fmt: skip
        probed, notes = _probe(op)
        for note in notes:
            print(f"exl3 gate: {note}", file=sys.stderr)
        if probed is not None:
            kept.append(probed)
    for name in sorted(set(OP_NAMES) - {op.name for op in ops}):
        print(f"exl3 gate: op {name} left out: no operands were recorded for it", file=sys.stderr)
    if not kept:
        raise ValueError("no exl3 op could be measured (reasons above)")
    return kept
