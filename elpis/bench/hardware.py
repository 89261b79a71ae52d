"""What the benchmark records about the machine, and the two ceilings it measures in the same run.

- copy bandwidth: a device-to-device copy of a buffer far larger than L2, counting bytes read plus bytes
  written (the rate a kernel that streams its inputs once can reach);
- bf16 matmul rate: 8192^3 products through torch (cuBLAS), the dense tensor-core ceiling;
- board power: NVML sampled every 50 ms on a thread during each measurement (energy by integration).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from elpis.paths import REPO_ROOT


def git_revision() -> str:
    """HEAD (with -dirty), or ELPIS_GIT_REVISION where the tree travelled without .git (the GPU machine)."""
    if os.environ.get("ELPIS_GIT_REVISION"):
        return os.environ["ELPIS_GIT_REVISION"]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # NVML missing: power and clocks are reported as unavailable, never invented
        return None


def cpu_facts(cpuinfo: str, cpus: int | None, usable: int | None, load: float | None) -> dict[str, Any]:
    """The host CPU as /proc/cpuinfo's text describes it (its first model name, the mean of its current
    clocks), with the logical CPUs, those this process may run on and the 1-minute load average: the host's
    time per round follows the host CPU, which differs between lent machines and within a run."""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    clocks = [float(line.split(":", 1)[1]) for line in cpuinfo.splitlines() if line.startswith("cpu MHz")]
    return {
        "cpu": models[0] if models else platform.processor() or None,
        "cpu_count": cpus, "cpu_usable": usable,
        "cpu_mhz_mean_now": round(sum(clocks) / len(clocks), 1) if clocks else None,
        "load_avg_1m": load,
    }  # fmt: skip


def python_loop_us(reps: int = 5, calls: int = 20_000) -> float:
    """Median microseconds of a fixed pure-Python workload (`calls` small function calls with an attribute and
    a dict lookup each, like a round's host path): host times measured on two machines compare through it,
    since /proc/cpuinfo's model and clock do not show a shared or throttled core."""

    class Holder:
        value = 1

    def step(holder: Holder, table: dict[int, int], i: int) -> int:
        return holder.value + table.get(i & 7, 0)

    table = {i: i for i in range(8)}
    holder = Holder()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for i in range(calls):
            step(holder, table, i)
        times.append((time.perf_counter() - start) * 1e6)
    return round(sorted(times)[reps // 2], 1)


def host_facts() -> dict[str, Any]:
    """`cpu_facts` of this machine, now, with `python_loop_us`."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    return cpu_facts(cpuinfo, os.cpu_count(), usable, load) | {"python_loop_us": python_loop_us()}


def machine_facts(device: int = 0) -> dict[str, Any]:
    """Software versions, the GPU (name, SMs, memory, driver, clocks, power limit) and the host CPU."""
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_revision": git_revision(),
    }
    try:
        from importlib.metadata import version

        facts["exllamav3"] = version("exllamav3")
    except Exception:
        facts["exllamav3"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        facts.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 2),
        )
    nvml = _nvml()
    if nvml is not None:
        h = nvml.nvmlDeviceGetHandleByIndex(device)
        facts["driver"] = nvml.nvmlSystemGetDriverVersion()
        for name, clock in (("sm", nvml.NVML_CLOCK_SM), ("mem", nvml.NVML_CLOCK_MEM)):
            with contextlib.suppress(Exception):
                facts[f"clock_{name}_max_mhz"] = nvml.nvmlDeviceGetMaxClockInfo(h, clock)
                facts[f"clock_{name}_now_mhz"] = nvml.nvmlDeviceGetClockInfo(h, clock)
        with contextlib.suppress(Exception):
            facts["power_limit_w"] = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
    return facts | host_facts()


def measure_copy_bandwidth(gib: float = 4.0, reps: int = 10) -> dict[str, float]:
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / reps
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_moved": 2 * n, "seconds": seconds, "bytes_per_s": 2 * n / seconds}


def measure_bf16_matmul(size: int = 8192, reps: int = 10) -> dict[str, float]:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / reps
    del a, b
    torch.cuda.empty_cache()
    return {"flop": 2 * size**3, "seconds": seconds, "flop_per_s": 2 * size**3 / seconds}


@dataclass
class PowerTrace:
    label: str
    seconds: float = 0.0
    samples: list[float] = field(default_factory=list)

    @property
    def mean_w(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None

    @property
    def joules(self) -> float | None:
        mean = self.mean_w
        return mean * self.seconds if mean is not None else None

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "mean_w": self.mean_w,
            "joules": self.joules,
            "samples": len(self.samples),
        }


class PowerSampler:
    """`with sampler.measure("label") as trace:` samples board power until the block ends."""

    def __init__(self, device: int = 0, period: float = 0.05) -> None:
        self.nvml = _nvml()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(device) if self.nvml else None
        self.period = period

    def read_w(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000
        except Exception:
            return None

    @contextmanager
    def measure(self, label: str):
        trace = PowerTrace(label)
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                value = self.read_w()
                if value is not None:
                    trace.samples.append(value)
                stop.wait(self.period)

        thread = threading.Thread(target=loop, daemon=True) if self.handle is not None else None
        start = time.perf_counter()
        if thread:
            thread.start()
        try:
            yield trace
        finally:
            trace.seconds = time.perf_counter() - start
            stop.set()
            if thread:
                thread.join()
