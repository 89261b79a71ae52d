"""Per-sequence state: a K/V cache per attention layer, conv window + recurrent matrix per DeltaNet layer.

K/V caches are position-major buffers `[capacity, kv_heads, head_dim]`: the view `[:n]` has the same strides
whatever the capacity, so attention over n positions runs the same arithmetic however the cache grew.
DeltaNet states are replaced, never modified in place, so snapshots may share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVCache:
    keys: torch.Tensor  # [capacity, kv_heads, head_dim]
    values: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device) -> KVCache:
        shape = (capacity, kv_heads, head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )

    def reserve(self, slots: int) -> None:
        """Make room for `slots` positions in total (doubling), keeping the contents."""
        capacity = self.keys.shape[0]
        if slots <= capacity:
            return
        grown = max(slots, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = torch.zeros((grown, *old.shape[1:]), dtype=old.dtype, device=old.device)
            new[: self.length] = old[: self.length]
            setattr(self, name, new)

    def snapshot(self) -> KVCache:
        return KVCache(self.keys[: self.length].clone(), self.values[: self.length].clone(), self.length)

    def nbytes(self) -> int:
        return 2 * self.length * self.keys[0].numel() * self.keys.element_size()


@dataclass
class DeltaNetState:
    window: torch.Tensor  # [kernel - 1, conv_dim]: the last inputs of the causal convolution
    recurrent: torch.Tensor  # [value_heads, key_head_dim, value_head_dim]

    def nbytes(self) -> int:
        return (self.window.numel() + self.recurrent.numel()) * self.recurrent.element_size()


LayerState = KVCache | DeltaNetState


@dataclass
class SequenceState:
    layers: list[LayerState]
    tokens: list[int] = field(default_factory=list)  # every token whose effect is in the state

    def snapshot(self) -> SequenceState:
        """An independent copy (K/V copied to exact size; DeltaNet tensors shared, they are immutable)."""
        return SequenceState(
            [s.snapshot() if isinstance(s, KVCache) else s for s in self.layers], list(self.tokens)
        )

    def restore(self, headroom: int) -> SequenceState:
        """A working copy of this snapshot with room for `headroom` more positions."""
        layers: list[LayerState] = []
        for s in self.layers:
            if isinstance(s, KVCache):
                work = KVCache(s.keys[: s.length].clone(), s.values[: s.length].clone(), s.length)
                work.reserve(s.length + headroom)
                layers.append(work)
            else:
                layers.append(s)
        return SequenceState(layers, list(self.tokens))

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.layers) + 8 * len(self.tokens)
