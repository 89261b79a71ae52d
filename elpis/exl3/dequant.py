"""`elpis dequantize`: an EXL3 model as a Hugging Face directory of its exact dequantised weights.

The fp64 evaluation of an EXL3 model is the same math on the weights that ExLlamaV3 computes with: every EXL3
linear becomes the dense matrix `LinearEXL3.get_weight_tensor` defines (decoded trellis, both 128-point
Hadamards, suh and svh; `elpis.exl3.gate.exact_weight`, evaluated in fp64), cropped to the unpadded shape and
stored HF-style `[out, in]`; every other tensor (embedding, norms, GDN conv/dt/A, unquantised b/a
projections) is copied bit for bit. The reference backend (`elpis.reference`) then loads the directory in
fp64 or fp32 (`elpis gate model --reference reference:dtype=fp64,model=DIR`), which makes stock ExLlamaV3's
model-level error against fp64 measurable. Needs a CUDA GPU (the trellis is decoded by ExLlamaV3's kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

EXL3_SUFFIXES = (".trellis", ".suh", ".svh", ".su", ".sv", ".mul1", ".mcg")
DTYPES = {"fp64": torch.float64, "fp32": torch.float32}


def _linears(model: Any) -> list[Any]:
    """Every module of `model` whose inner storage is an EXL3 trellis."""
    from elpis.exl3 import walk_modules

    return [
        m
        for m in walk_modules(model)
        if hasattr(getattr(m, "inner", None), "trellis") and hasattr(m.inner, "get_inner_weight_tensor")
    ]


def dequantise(model_dir: Path, out_dir: Path, *, dtype: torch.dtype = torch.float64) -> Path:
    """Write `out_dir` (refused if it exists) from the EXL3 model in `model_dir`; returns out_dir."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from elpis.exl3 import patches
    from elpis.exl3.gate import exact_weight, require_gpu

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if out_dir.exists():
        raise ValueError(f"{out_dir} exists: choose a new directory")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} is not a model directory (no config.json)")
    config = json.loads(config_path.read_text())
    if "quantization_config" not in config:
        raise ValueError(f"{model_dir}: config.json has no quantization_config (not an EXL3 model)")
    require_gpu()
    patches.apply_all()
    from exllamav3 import Config, Model
    from exllamav3.util.hadamard import get_hadamard

    model = Model.from_config(Config.from_directory(str(model_dir)))
    model.load(device="cuda:0", progressbar=False)
    hadamard = get_hadamard(128).to(torch.float64) / math.sqrt(128)
    tensors: dict[str, torch.Tensor] = {}
    quantised: set[str] = set()
    for module in _linears(model):
        inner = module.inner
        w = exact_weight(inner.get_inner_weight_tensor(), inner.suh, inner.svh, hadamard)
        # ExLlamaV3 zero-extends inputs to the padded width and drops padded outputs: crop both
        rows = int(getattr(module, "in_features_unpadded", w.shape[0]))
        cols = int(getattr(module, "out_features_unpadded", w.shape[1]))
        tensors[f"{module.key}.weight"] = w[:rows, :cols].T.contiguous().to(dtype).cpu()
        quantised.add(module.key)
    if hasattr(model, "unload"):
        model.unload()
    del model
    torch.cuda.empty_cache()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                if name.endswith(EXL3_SUFFIXES):
                    if name.rsplit(".", 1)[0] not in quantised:
                        raise ValueError(f"{path.name}: EXL3 tensor {name} belongs to no loaded linear")
                    continue
                if name in tensors:
                    raise ValueError(f"{path.name}: tensor {name} appears twice")
                tensors[name] = handle.get_tensor(name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        for f in model_dir.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
                shutil.copy2(f, tmp / f.name)
        plain = {k: v for k, v in config.items() if k != "quantization_config"}
        if "lm_head.weight" in tensors:  # a quantised head is its own tensor even where the original tied it
            plain["tie_word_embeddings"] = False
            if isinstance(plain.get("text_config"), dict):
                plain["text_config"] = {**plain["text_config"], "tie_word_embeddings": False}
        plain["elpis_dequantised_from"] = {
            "path": str(model_dir),
            "quantization": config["quantization_config"],
        }
        (tmp / "config.json").write_text(json.dumps(plain, indent=2))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="EXL3 model directory")
    parser.add_argument("--out", type=Path, required=True, help="new directory for the dense weights")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp64")


def run(args: argparse.Namespace) -> int:
    try:
        out = dequantise(args.model, args.out, dtype=DTYPES[args.dtype])
    except ValueError as exc:
        print(f"elpis dequantize: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
