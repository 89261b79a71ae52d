"""`elpis quantize`: a Hugging Face model directory to EXL3 with ExLlamaV3's own converter, checked.

Runs ExLlamaV3's `exllamav3.conversion.convert_model` command line in its own process (the converter parses
arguments and keeps state at import), after elpis's run-time patches (`python -m elpis.exl3.quantize ARGS`;
`exl3-trim-padded-out` lets models with a 576-wide hidden state convert), with the product's bitrate
(4.00 bpw, 6 bpw head), then refuses the result unless its config records the asked bitrate and ExLlamaV3
loads it. Needs a CUDA GPU. For the embedded SmolLM2 GGUF, write the input directory with `elpis export-hf`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def convert(
    model_dir: Path, out_dir: Path, *, bits: float = 4.0, head_bits: float = 6.0, work_dir: Path | None = None
) -> dict:
    """Convert; returns the output's quantization_config plus the wall seconds the converter took."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    if "quantization_config" in json.loads((model_dir / "config.json").read_text()):
        raise ValueError(f"{model_dir} is already quantized")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} is not empty")
    if not 1.0 <= bits <= 8.0 or not 1.0 <= head_bits <= 16.0:
        raise ValueError(f"bits {bits} / head bits {head_bits} out of range (1-8 / 1-16)")
    from elpis.exl3.gate import require_gpu

    require_gpu()
    work = Path(work_dir) if work_dir else out_dir.parent / (out_dir.name + ".work")
    cmd = [
        sys.executable, "-m", "elpis.exl3.quantize",
        "-i", str(model_dir), "-o", str(out_dir), "-w", str(work),
        "-b", str(bits), "-hb", str(head_bits),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the ExLlamaV3 converter failed (exit {done.returncode}): {' '.join(cmd)}")
    config = json.loads((out_dir / "config.json").read_text())
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "exl3":
        raise RuntimeError(f"{out_dir}/config.json records no EXL3 quantization: {quant!r}")
    if float(quant.get("bits", -1)) < bits - 0.01:
        raise RuntimeError(f"{out_dir}: converter reports {quant.get('bits')} bpw, asked for {bits}")
    from exllamav3 import Config, Model

    Model.from_config(Config.from_directory(str(out_dir)))  # refuses a directory it cannot read
    return {**quant, "convert_seconds": seconds}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model directory (fp16/fp32)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (new or empty)")
    parser.add_argument("--bits", type=float, default=4.0)
    parser.add_argument("--head-bits", type=float, default=6.0)
    parser.add_argument("--work", type=Path, default=None, help="converter working directory")


def run(args: argparse.Namespace) -> int:
    try:
        quant = convert(args.model, args.out, bits=args.bits, head_bits=args.head_bits, work_dir=args.work)
    except ValueError as exc:
        print(f"elpis quantize: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(quant))
    return 0


def converter_main(argv: list[str]) -> None:
    """ExLlamaV3's converter as its own `__main__`, after elpis's run-time patches."""
    import runpy

    from elpis.exl3 import patches

    patches.apply_all()
    sys.argv = ["convert_model", *argv]
    runpy.run_module("exllamav3.conversion.convert_model", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    converter_main(sys.argv[1:])
