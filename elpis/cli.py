"""The one `elpis` entry point. Each subcommand lives in the module that owns the work.

A command module exposes `add_arguments(parser)` and `run(args) -> int`. Modules are imported only when
their command runs, so `elpis --help` stays fast and a CPU machine never imports GPU code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "prove": ("elpis.bend.cli", "parse, check and prove every Bend module; print ALL PROOFS CHECK"),
    "build": ("elpis.accept.build", "prove, generate C, compile the acceptor, check tables, write identity"),
    "serve": ("elpis.server.cli", "start the OpenAI-compatible server"),
    "bench": ("elpis.bench.cli", "benchmarks: engine speed (GPU) and served workloads (any server)"),
    "synth": ("elpis.synth", "write synthetic checkpoints (--tiny on CPU; --full/--draft/--small on GPU)"),
    "verify-models": ("elpis.manifest", "check model files against the pinned manifest"),
    "download": ("elpis.manifest_download", "fetch the pinned target and draft revisions and verify them"),
    "gate": ("elpis.gate.cli", "quality gates: per-op error against fp64, model comparison, verdicts"),
    "eval": ("elpis.gate.eval", "AIME 2025 / GSM8K evaluation lanes against an OpenAI-compatible server"),
    "export-hf": ("elpis.reference.export", "write a Llama GGUF as a Hugging Face directory (exact weights)"),
    "quantize": (
        "elpis.exl3.quantize",
        "convert a Hugging Face directory to EXL3 with ExLlamaV3's converter (GPU)",
    ),
    "dequantize": (
        "elpis.exl3.dequant",
        "an EXL3 model's exact dequantised weights as a Hugging Face dir (GPU)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elpis", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints help or the error, exits
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"elpis {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
