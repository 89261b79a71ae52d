"""Base primitives: their signatures and their concrete semantics.

Nat is unbounded (Python int), U32 wraps modulo 2^32, `Nat.sub` saturates at 0 like Base.
The Nat and Bool primitives also have Bend definitions in `base.bend` (what the kernel unfolds);
`tests/bend/test_prims.py` checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elpis.bend.core import BOOL, NAT, U32, Ty

MASK32 = 0xFFFFFFFF
EQ_OPS = ("U32.is_eq", "U32.is_ne")  # the only operations allowed on token ids


@dataclass(frozen=True)
class PrimSig:
    params: tuple[Ty, ...]
    result: Ty
    fn: Callable[..., object]


def _shl(a: int, n: int) -> int:
    return (a << n) & MASK32 if n < 32 else 0


def _shr(a: int, n: int) -> int:
    return a >> n if n < 32 else 0


PRIMS: dict[str, PrimSig] = {
    "Bool.not": PrimSig((BOOL,), BOOL, lambda a: not a),
    "Bool.and": PrimSig((BOOL, BOOL), BOOL, lambda a, b: a and b),
    "Bool.or": PrimSig((BOOL, BOOL), BOOL, lambda a, b: a or b),
    "Nat.add": PrimSig((NAT, NAT), NAT, lambda a, b: a + b),
    "Nat.sub": PrimSig((NAT, NAT), NAT, lambda a, b: a - b if a > b else 0),
    "Nat.min": PrimSig((NAT, NAT), NAT, min),
    "Nat.max": PrimSig((NAT, NAT), NAT, max),
    "Nat.is_eq": PrimSig((NAT, NAT), BOOL, lambda a, b: a == b),
    "Nat.is_ne": PrimSig((NAT, NAT), BOOL, lambda a, b: a != b),
    "Nat.is_lt": PrimSig((NAT, NAT), BOOL, lambda a, b: a < b),
    "Nat.is_le": PrimSig((NAT, NAT), BOOL, lambda a, b: a <= b),
    "Nat.is_gt": PrimSig((NAT, NAT), BOOL, lambda a, b: a > b),
    "Nat.is_ge": PrimSig((NAT, NAT), BOOL, lambda a, b: a >= b),
    "U32.is_eq": PrimSig((U32, U32), BOOL, lambda a, b: a == b),
    "U32.is_ne": PrimSig((U32, U32), BOOL, lambda a, b: a != b),
    "U32.is_lt": PrimSig((U32, U32), BOOL, lambda a, b: a < b),
    "U32.is_le": PrimSig((U32, U32), BOOL, lambda a, b: a <= b),
    "U32.is_gt": PrimSig((U32, U32), BOOL, lambda a, b: a > b),
    "U32.is_ge": PrimSig((U32, U32), BOOL, lambda a, b: a >= b),
    "U32.add": PrimSig((U32, U32), U32, lambda a, b: (a + b) & MASK32),
    "U32.sub": PrimSig((U32, U32), U32, lambda a, b: (a - b) & MASK32),
    "U32.mul": PrimSig((U32, U32), U32, lambda a, b: (a * b) & MASK32),
    "U32.and": PrimSig((U32, U32), U32, lambda a, b: a & b),
    "U32.or": PrimSig((U32, U32), U32, lambda a, b: a | b),
    "U32.xor": PrimSig((U32, U32), U32, lambda a, b: a ^ b),
    "U32.shl": PrimSig((U32, NAT), U32, _shl),
    "U32.shr": PrimSig((U32, NAT), U32, _shr),
    "U32.to_nat": PrimSig((U32,), NAT, lambda a: a),
    "U32.from_nat": PrimSig((NAT,), U32, lambda a: a & MASK32),
}

# The operator form `(a op b : T)` is sugar for these (Bend's Base naming).
OPERATORS: dict[str, dict[str, str]] = {
    "U32": {
        "+": "U32.add", "-": "U32.sub", "*": "U32.mul",
        ".&.": "U32.and", ".|.": "U32.or", ".^.": "U32.xor", "<<": "U32.shl", ">>": "U32.shr",
        "<": "U32.is_lt", "<=": "U32.is_le", ">": "U32.is_gt", ">=": "U32.is_ge",
    },
    "Nat": {
        "+": "Nat.add", "-": "Nat.sub",
        "<": "Nat.is_lt", "<=": "Nat.is_le", ">": "Nat.is_gt", ">=": "Nat.is_ge",
    },
}  # fmt: skip


def apply(op: str, args: tuple) -> object:
    return PRIMS[op].fn(*args)
