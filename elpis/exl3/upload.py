"""Small host-to-GPU uploads that never stall the host.

`torch.tensor(values, device="cuda")` and `.to("cuda")` from ordinary (pageable) host memory synchronise
the stream after the copy: the host waits for every queued kernel, then the GPU idles while the host queues
the next ones. Inside a verify round that serialises host and GPU time. A pinned source copied with
`non_blocking=True` is ordered on the stream instead; PyTorch's pinned allocator keeps the source block
alive until the copy has run, so the host tensor may be dropped at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pinned(values: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A pinned host tensor of `values` (ExLlamaV3's `get_for_device` uploads these asynchronously)."""
    return torch.tensor(list(values), dtype=dtype).pin_memory()


def upload(values: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` on `device`, copied in stream order (no synchronisation)."""
    return pinned(values, dtype).to(device, non_blocking=True)
