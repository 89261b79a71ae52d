"""The CPU reference backend as a gate provider (`elpis.gate.providers`): configurations and ops.

Configuration options (spec `reference:key=value,...`; the canonical spec lists every option that
applies, defaults included):
  dtype      fp32 | fp64                       compute dtype (default fp32)
  path       verify | prefill                  how teacher forcing runs: verify calls of `rows` chained
                                               rows (the served decode path), or one batched prefill with
                                               logits for every position (default verify)
  rows       1..                               verify rows per call (verify path; default 16)
  mode       exact | batched                   exact: every row is a decode step; batched: one matmul per
                                               weight for all rows (verify path; default exact)
  weights    bf16 | fp16                       candidate: weights rounded to that format, computed in dtype
  device     cpu | cuda:0 | ...                where the reference runs (written only when not cpu)
  attention  qk-bf16 | qk-int8 | fp64-accumulate
                                               candidate: the attention op replaced by that implementation
                                               (`elpis.gate.reference_ops`) inside this configuration only
Greedy continuations always run the served path: prefill the prompt, then one verify row per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from elpis.gate.compare import resolve_model
from elpis.gate.configs import BackendLogits, Spec, check_start
from elpis.gate.ops import GateOp, OpInputs

ATTENTION_CANDIDATES = ("qk-bf16", "qk-int8", "fp64-accumulate")


def _options(options: dict[str, str]) -> dict[str, str]:
    known = {"dtype", "path", "rows", "mode", "weights", "attention", "device"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown reference option(s) {unknown}: known {sorted(known)}")
    full = {"dtype": options.get("dtype", "fp32"), "path": options.get("path", "verify")}
    if full["dtype"] not in ("fp32", "fp64"):
        raise ValueError(f"dtype must be fp32 or fp64, got {full['dtype']!r}")
    if full["path"] == "verify":
        full["rows"] = options.get("rows", "16")
        full["mode"] = options.get("mode", "exact")
        if not full["rows"].isdigit() or int(full["rows"]) < 1:
            raise ValueError(f"rows must be a positive integer, got {full['rows']!r}")
        if full["mode"] not in ("exact", "batched"):
            raise ValueError(f"mode must be exact or batched, got {full['mode']!r}")
    elif full["path"] == "prefill":
        if "rows" in options or "mode" in options:
            raise ValueError("rows and mode apply to the verify path only")
    else:
        raise ValueError(f"path must be verify or prefill, got {full['path']!r}")
    if "weights" in options:
        if options["weights"] not in ("bf16", "fp16"):
            raise ValueError(f"weights must be bf16 or fp16, got {options['weights']!r}")
        full["weights"] = options["weights"]
    if options.get("device", "cpu") != "cpu":
        full["device"] = options["device"]
    if "attention" in options:
        if options["attention"] not in ATTENTION_CANDIDATES:
            raise ValueError(f"attention must be one of {ATTENTION_CANDIDATES}, got {options['attention']!r}")
        full["attention"] = options["attention"]
    return full


def _round_weights(obj: object, dtype: torch.dtype) -> None:
    """Round every floating-point weight tensor in place to `dtype` (kept in the compute dtype)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            obj.copy_(obj.to(dtype).to(obj.dtype))
    elif isinstance(obj, list | tuple):
        for item in obj:
            _round_weights(item, dtype)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            _round_weights(getattr(obj, name), dtype)


def _attention_patch(name: str):
    from elpis.gate import reference_ops
    from elpis.gate.patching import replaced
    from elpis.reference import layers

    stock = layers.attend  # the original: the patch below replaces every module's reference to it

    def fp64_accumulate(o: OpInputs) -> torch.Tensor:
        t = o.tensors
        wide = [x.to(torch.float64) if x is not None and x.is_floating_point() else x
                for x in (t["q"], t["keys"], t["values"], t["visible"])]  # fmt: skip
        return stock(*wide).to(t["q"].dtype)

    impl = {
        "qk-bf16": reference_ops.attention_qk_bf16,
        "qk-int8": reference_ops.attention_qk_int8,
        "fp64-accumulate": fp64_accumulate,
    }[name]

    def attend(q, keys, values, visible):
        return impl(OpInputs({"q": q, "keys": keys, "values": values, "visible": visible}))

    return replaced("elpis.reference", {stock: attend})


class ReferenceConfiguration:
    """A `LogitsModel` over the reference backend, with its spec's numerics switches applied."""

    def __init__(self, model: Path, options: dict[str, str]) -> None:
        from elpis.reference.loader import load_backend

        full = _options(options)
        self.spec = Spec("reference", full).text
        self.options = full
        path = resolve_model(model)
        self.backend = load_backend(
            path,
            dtype=torch.float64 if full["dtype"] == "fp64" else torch.float32,
            device=full.get("device", "cpu"),
            prefix_cache_bytes=0,  # no reuse across documents: every sequence runs from scratch
            exact_rows=full.get("mode", "exact") == "exact",
        )
        if "weights" in full:
            _round_weights(
                self.backend.model.weights, {"bf16": torch.bfloat16, "fp16": torch.float16}[full["weights"]]
            )
        self.vocab_size = self.backend.info.vocab_size
        self._served = BackendLogits(self.spec, self.backend, int(full.get("rows", "16")), self.vocab_size)

    @contextmanager
    def _patched(self) -> Iterator[None]:
        with _attention_patch(self.options["attention"]) if "attention" in self.options else nullcontext():
            yield

    def teacher_forced(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        with self._patched(), torch.inference_mode():
            if self.options["path"] == "verify":
                return self._served.teacher_forced(tokens, start)
            model = self.backend.model
            tokens = list(tokens)
            check_start(len(tokens), start)
            return model.prefill(model.new_state(len(tokens)), tokens[:-1], logits="all")[start:]

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        with self._patched():
            return self._served.greedy(prompt, steps)


def configuration(model: Path, options: dict[str, str]) -> ReferenceConfiguration:
    return ReferenceConfiguration(model, options)


def gate_ops(model: Path | None, options: dict[str, str]) -> list[GateOp]:
    from elpis.gate.reference_ops import reference_ops

    if model is None:
        raise ValueError("the reference ops need --model (activations come from a real forward pass)")
    return reference_ops(resolve_model(model), options)
