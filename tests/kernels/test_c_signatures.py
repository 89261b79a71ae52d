"""The ctypes signatures the kernel bindings declare match the C entries in the kernel sources.

ctypes does not check a call against the C prototype: a missing or extra argument type shifts every later
argument (a pointer truncated to uint32, the stream passed as a plain int), and the kernel then runs on
garbage. The quantized tree attention's first GPU run failed exactly that way, so every binding's argtypes
are compared here, on the CPU, with the prototypes parsed from the .cu source.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from elpis.exl3 import (
    draft_candidates,
    embed_gather,
    gdn_ba,
    gdn_tree,
    round_adjust,
    round_plan,
    round_tail,
    rows_gemm,
    sample_draw,
    tree_attention,
    verify_epilogue,
    verify_gate,
    vocab_draw,
)

C_TYPES = {
    "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32,
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int": ctypes.c_int,
}
PROTOTYPE = re.compile(
    r"^\s*(?:int|unsigned|uint32_t|uint64_t)\s+(elpis_\w+)\s*\(([^)]*)\)\s*\{", re.MULTILINE
)


def c_parameter_types(source: Path, name: str) -> list[type]:
    """The ctypes type of each parameter of C function `name` in `source` (pointers: c_void_p)."""
    found = [m for m in PROTOTYPE.finditer(source.read_text()) if m.group(1) == name]
    assert len(found) == 1, f"{name}: {len(found)} definitions in {source.name}"
    params = " ".join(found[0].group(2).split())
    if params in ("", "void"):
        return []
    out = []
    for param in params.split(","):
        words = param.replace("*", " * ").split()
        if "*" in words:
            out.append(ctypes.c_void_p)
        else:
            ctype = next((C_TYPES[w] for w in words if w in C_TYPES), None)
            assert ctype is not None, f"{name}: unknown parameter type in {param!r}"
            out.append(ctype)
    return out


BINDINGS = [
    *((tree_attention.SOURCE, name, args) for name, args in tree_attention.ENTRY_ARGS.items()),
    *((tree_attention.SOURCE_MMA, name, args) for name, args in tree_attention.MMA_ENTRY_ARGS.items()),
    *((gdn_tree.SOURCE, name, args) for name, args in gdn_tree.ENTRY_ARGS.items()),
    *((gdn_ba.SOURCE, name, args) for name, args in gdn_ba.ENTRY_ARGS.items()),
    *((round_tail.SOURCE, name, args) for name, args in round_tail.ENTRY_ARGS.items()),
    *((round_plan.SOURCE, name, args) for name, args in round_plan.ENTRY_ARGS.items()),
    *((embed_gather.SOURCE, name, args) for name, args in embed_gather.ENTRY_ARGS.items()),
    *((verify_gate.SOURCE, name, args) for name, args in verify_gate.ENTRY_ARGS.items()),
    *((verify_epilogue.SOURCE, name, args) for name, args in verify_epilogue.ENTRY_ARGS.items()),
    *((draft_candidates.SOURCE, name, args) for name, args in draft_candidates.ENTRY_ARGS.items()),
    *((rows_gemm.SOURCE, name, args) for name, args in rows_gemm.ENTRY_ARGS.items()),
    *((rows_gemm.SOURCE, name, args) for name, (args, _) in rows_gemm.SIZE_ENTRIES.items()),
    *((sample_draw.SOURCE, name, args) for name, args in sample_draw.ENTRY_ARGS.items()),
    *((round_adjust.SOURCE, name, args) for name, args in round_adjust.ENTRY_ARGS.items()),
    *((vocab_draw.SOURCE, name, args) for name, args in vocab_draw.ENTRY_ARGS.items()),
]


@pytest.mark.parametrize(("source", "name", "argtypes"), BINDINGS, ids=[b[1] for b in BINDINGS])
def test_binding_matches_the_c_prototype(source: Path, name: str, argtypes: tuple[type, ...]) -> None:
    assert list(argtypes) == c_parameter_types(source, name)


def test_the_parser_sees_a_shifted_signature() -> None:
    """The check would have caught the bug: one pointer short is a different list."""
    shifted = (ctypes.c_void_p, *tree_attention.FP16_ARGS)
    assert list(shifted) != c_parameter_types(tree_attention.SOURCE, "elpis_tree_attention_qcache")
