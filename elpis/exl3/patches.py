"""Run-time patches to exllamav3, listed in `patches/registry.json` (table in `patches/README.md`).

Every patch has an id, a purpose, an environment switch ('1' on, '0' off, unset: its default) and the
evidence for its default. Kinds: `env` sets exllamav3's own environment switches before it is imported;
`wrap` calls a function (`module:function`) that replaces an exllamav3 function at run time; `switch` installs
nothing: the elpis code it names reads the switch where it acts (`enabled(id)`). Nothing of ExLlamaV3's code
is copied. `apply_all()` is idempotent and records what it applied (`applied()`), which the
benchmark writes into its results.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from elpis.paths import PATCHES_DIR

REGISTRY = PATCHES_DIR / "registry.json"
KINDS = ("env", "wrap", "switch")


@dataclass(frozen=True)
class Patch:
    id: str
    purpose: str
    switch: str
    default: bool
    kind: str
    evidence: str
    env: dict[str, str]
    module: str | None

    def enabled(self) -> bool:
        value = os.environ.get(self.switch)
        if value is None or value == "":
            return self.default
        if value not in ("0", "1"):
            raise ValueError(f"{self.switch}={value!r}: patch switches take '0' or '1'")
        return value == "1"


def load_registry(path: Path = REGISTRY) -> list[Patch]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    patches: list[Patch] = []
    seen: set[str] = set()
    for entry in data["patches"]:
        for key in ("id", "purpose", "switch", "default", "kind", "evidence"):
            if key not in entry:
                raise ValueError(f"{path}: patch {entry.get('id', '?')} has no {key!r}")
        if entry["id"] in seen:
            raise ValueError(f"{path}: duplicate patch id {entry['id']}")
        seen.add(entry["id"])
        if entry["kind"] not in KINDS:
            raise ValueError(f"{path}: patch {entry['id']}: kind must be one of {KINDS}")
        if not entry["switch"].startswith("ELPIS_PATCH_"):
            raise ValueError(f"{path}: patch {entry['id']}: switch must start with ELPIS_PATCH_")
        if entry["kind"] == "env" and not entry.get("env"):
            raise ValueError(f"{path}: env patch {entry['id']} sets no variables")
        if entry["kind"] == "wrap" and ":" not in entry.get("module", ""):
            raise ValueError(f"{path}: wrap patch {entry['id']} needs module 'package.module:function'")
        patches.append(
            Patch(
                entry["id"],
                entry["purpose"],
                entry["switch"],
                bool(entry["default"]),
                entry["kind"],
                entry["evidence"],
                dict(entry.get("env", {})),
                entry.get("module"),
            )
        )
    return patches


_applied: dict[str, bool] = {}


def apply_all(path: Path = REGISTRY) -> dict[str, bool]:
    """Apply every enabled patch once per process. Env patches must run before exllamav3 is imported."""
    if _applied:
        return dict(_applied)
    for patch in load_registry(path):
        on = patch.enabled()
        if on and patch.kind == "env":
            if "exllamav3" in sys.modules:
                raise RuntimeError(
                    f"patch {patch.id} sets environment switches but exllamav3 is already imported"
                )
            os.environ.update(patch.env)
        elif on and patch.kind == "wrap":
            module_name, _, func = (patch.module or "").partition(":")
            getattr(importlib.import_module(module_name), func)()
        _applied[patch.id] = on
    return dict(_applied)


def applied() -> dict[str, bool]:
    return dict(_applied)


def require_installed(patch_id: str, installed: bool, asked: str) -> None:
    """Refuse `asked` (what the caller wants, e.g. "rows_gemm=True") in a process where registry patch
    `patch_id` is not installed, saying whether it is switched off or was never applied."""
    if installed:
        return
    patch = next((p for p in load_registry() if p.id == patch_id), None)
    if patch is None:
        raise KeyError(f"no patch {patch_id!r} in {REGISTRY}")
    why = f"switched off ({patch.switch}=0)" if not patch.enabled() else "not applied (patches.apply_all)"
    raise RuntimeError(f"{asked} needs the registry patch {patch_id}, which is {why}")


def enabled(patch_id: str, path: Path = REGISTRY) -> bool:
    """Whether registry patch `patch_id` is switched on in this process (its switch, else its default)."""
    for patch in load_registry(path):
        if patch.id == patch_id:
            return patch.enabled()
    raise KeyError(f"no patch {patch_id!r} in {path}")
