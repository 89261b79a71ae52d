"""Builds of elpis's 1-16-row EXL3 GEMM against a previous build, on one verify's calls (diagnostic, GPU).

Each variant is the current source with compile-time defines (for example `ELPIS_GEMM_STAGES`, k-tiles in
flight per warp). For every call of a Qwen3.8 tree verify (attention q/k/v and o, Gated DeltaNet qkv/z and
out, MLP gate/up and down, the 6-bit head) at 8 and 16 rows, with random trellises, each variant's outputs
are compared bit for bit with the previous build's (a variant with the same stream-K block count and the
same per-warp order must match it exactly), their error against the float64 linear is recorded (D from
elpis's decode, which tests hold bit for bit to the format), and each call is timed like
`rows_gemm_check.py` (CUDA graphs of 40 launches over 4 copies of the weights, so every launch reads DRAM;
median of 7). The verify's total weighs each call by how often a verify makes it (16 attention, 48 Gated
DeltaNet, 64 MLP layers, one head).
Writes one JSON object to OUT and prints a table.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/rows_gemm_variants.py PREVIOUS.cu OUT.json
NAME=DEFINE:VALUE[,DEFINE:VALUE...] ...   (NAME= alone: the current source as it is)
Session 20 ran it (device call 82) on a source with a warps-per-k-tile knob, since removed (commit f049d5e).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from elpis import nvcc
from elpis.bench.scripts.rows_gemm_check import (
    COPIES,
    blockwise,
    hadamard,
    parse_defines,
    random_linear,
    timed,
)
from elpis.exl3 import rows_gemm as rg

# (name, k, member widths, bits, calls per verify)
CALLS = (
    ("attn q/k/v", 5120, (12288, 1024, 1024), 4, 16),
    ("attn o", 6144, (5120,), 4, 16),
    ("gdn qkv/z", 5120, (10240, 6144), 4, 48),
    ("gdn out", 6144, (5120,), 4, 48),
    ("mlp gate/up", 5120, (17408, 17408), 4, 64),
    ("mlp down", 17408, (5120,), 4, 64),
    ("head", 5120, (248320,), 6, 1),
)
ROWS = (8, 16)


def build(source: Path, defines: dict[str, int]):
    return rg.bind(nvcc.load(source, defines=defines))


def exact(x: torch.Tensor, linear: tuple, h: torch.Tensor, lib) -> torch.Tensor:
    trellises, suh, svh = linear
    d = rg.decode(trellises[0], lib=lib).double()
    return blockwise(blockwise(x.double() * suh.double(), h) @ d, h) * svh.double()


def bitwise_equal(ys: list[torch.Tensor], base: list[torch.Tensor]) -> bool:
    return all(torch.equal(y.view(torch.int16), b.view(torch.int16)) for y, b in zip(ys, base, strict=True))


def measure_call(libs: dict, h: torch.Tensor, linears: list, xs: list[torch.Tensor]) -> dict:
    """Each build's time, block count, bitwise equality with the previous build and error on one call."""

    def members(c: int) -> list:
        return [rg.Member(t[c], suh, svh, torch.half) for t, suh, svh in linears]

    k, widths, bits = (
        xs[0].shape[1],
        [t[0].shape[1] * 16 for t, _, _ in linears],
        linears[0][0][0].shape[2] // 16,
    )
    refs = [exact(xs[0], lin, h, libs["previous"]) for lin in linears]
    scales = [r.pow(2).mean().sqrt().item() for r in refs]
    base = rg.rows_gemm_group(xs[0], members(0), lib=libs["previous"])
    out = {}
    for label, lib in libs.items():
        ys = rg.rows_gemm_group(xs[0], members(0), lib=lib)
        ms, mode = timed(lambda i, lib=lib: rg.rows_gemm_group(xs[i % COPIES], members(i % COPIES), lib=lib))
        errors = [
            (y.double() - r).pow(2).mean().sqrt().item() / s for y, r, s in zip(ys, refs, scales, strict=True)
        ]
        blocks = int(lib.elpis_rows_gemm_blocks(k, sum(widths), bits))
        out[label] = {"ms": ms, "timing": mode, "blocks": blocks, "bitwise_previous": bitwise_equal(ys, base),
                      "rms_rel": max(errors)}  # fmt: skip
    return out


def measure(libs: dict, h: torch.Tensor) -> list[dict]:
    entries = []
    for name, k, widths, bits, per_verify in CALLS:
        g = torch.Generator(device="cuda").manual_seed(k * 13 + sum(widths))
        linears = [random_linear(k, n, g, bits=bits) for n in widths]
        for rows in ROWS:
            xs = [torch.randn((rows, k), generator=g, device="cuda").half() for _ in range(COPIES)]
            builds = measure_call(libs, h, linears, xs)
            entries.append({"call": name, "k": k, "widths": list(widths), "bits": bits, "rows": rows,
                            "per_verify": per_verify, "builds": builds})  # fmt: skip
        linears.clear()
        torch.cuda.empty_cache()
    return entries


def main(previous: str, out_path: str, specs: list[str]) -> int:
    builds: dict[str, tuple[Path, dict[str, int]]] = {"previous": (Path(previous), {})}
    for spec in specs:
        label, _, values = spec.partition("=")
        builds[label] = (rg.SOURCE, parse_defines(values))
    arch = nvcc.device_arch()
    with ThreadPoolExecutor(len(builds)) as pool:  # nvcc runs as a process: the builds go in parallel
        list(pool.map(lambda b: nvcc.compile_shared(b[0], arch=arch, defines=b[1]), builds.values()))
    libs = {label: build(source, knobs) for label, (source, knobs) in builds.items()}
    h = hadamard("cuda")
    entries = measure(libs, h)
    totals = {rows: {label: 0.0 for label in libs} for rows in ROWS}
    for e in entries:
        for label in libs:
            totals[e["rows"]][label] += e["builds"][label]["ms"] * e["per_verify"]
    props = torch.cuda.get_device_properties(0)
    report = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "nvcc": nvcc.nvcc_version(), "variants": specs, "calls": entries,
              "verify_ms": {str(r): t for r, t in totals.items()}}  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    labels = list(libs)
    print(f"{'call':12} {'rows':>4} " + " ".join(f"{lab:>16}" for lab in labels))
    for e in entries:
        cells = [
            f"{b['ms'] * 1e3:7.1f}us {'=' if b['bitwise_previous'] else '~'} {b['rms_rel']:.1e}"
            for b in (e["builds"][lab] for lab in labels)
        ]
        print(f"{e['call']:12} {e['rows']:4d} " + " ".join(f"{c:>16}" for c in cells))
    for rows, t in totals.items():
        print(f"verify GEMMs, {rows} rows: " + ", ".join(f"{lab} {ms:.3f} ms" for lab, ms in t.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
