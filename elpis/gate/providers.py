"""Where the gates find a backend's ops and configurations: one provider module per backend.

A provider module exposes two functions (either may raise `ValueError` naming a bad option):

    def gate_ops(model: Path | None, options: dict[str, str]) -> list[elpis.gate.ops.GateOp]
    def configuration(model: Path, options: dict[str, str]) -> elpis.gate.configs.LogitsModel

`elpis.gate.reference_provider` serves the CPU reference backend; the GPU backend adds
`elpis.exl3.gate` (written by the GPU engine's owner). Adding a backend is one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

PROVIDERS: dict[str, str] = {
    "reference": "elpis.gate.reference_provider",
    "exl3": "elpis.exl3.gate",
}


def load_provider(kind: str) -> ModuleType:
    if kind not in PROVIDERS:
        raise ValueError(f"unknown backend {kind!r}: choose from {sorted(PROVIDERS)}")
    try:
        return importlib.import_module(PROVIDERS[kind])
    except ImportError as exc:
        raise ValueError(f"the {kind} gate provider {PROVIDERS[kind]} cannot be loaded: {exc}") from exc
