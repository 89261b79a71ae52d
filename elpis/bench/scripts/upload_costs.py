"""Host time of the small uploads a round makes (issue 9's host path), on the GPU: each way of getting a few
hundred int32 values into a device buffer in stream order, timed on the host (median of many, the GPU idle in
between, as it is when a round fills its verify). Prints one UPLOADCOSTS JSON line."""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

from elpis.exl3.upload import pinned

N = 600


def timed(fn, reps: int = 400) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return round(statistics.median(out) * 1e3, 4)


def main() -> None:
    torch.set_num_threads(1)
    values = list(range(N))
    dst = torch.zeros(N, dtype=torch.int32, device="cuda")
    host = torch.tensor(values, dtype=torch.int32)
    persistent = torch.empty(N, dtype=torch.int32).pin_memory()
    view = persistent.numpy()
    event = torch.cuda.Event()
    arr = np.asarray(values, dtype=np.int32)

    def staged() -> None:
        event.synchronize()
        view[:] = values
        dst.copy_(persistent, non_blocking=True)
        event.record()

    report = {
        "torch_tensor_ms": timed(lambda: torch.tensor(values, dtype=torch.int32)),
        "pin_memory_ms": timed(lambda: host.pin_memory()),
        "pinned_ms": timed(lambda: pinned(values, torch.int32)),
        "pinned_and_copy_ms": timed(lambda: dst.copy_(pinned(values, torch.int32), non_blocking=True)),
        "copy_from_persistent_ms": timed(lambda: dst.copy_(persistent, non_blocking=True)),
        "numpy_write_ms": timed(lambda: view.__setitem__(slice(None), values)),
        "numpy_from_array_ms": timed(lambda: view.__setitem__(slice(None), arr)),
        "staged_ms": timed(staged),
        "event_record_ms": timed(lambda: event.record()),
        "event_sync_done_ms": timed(lambda: event.synchronize()),
        "torch": torch.__version__,
    }
    print("UPLOADCOSTS " + json.dumps(report))


if __name__ == "__main__":
    main()
