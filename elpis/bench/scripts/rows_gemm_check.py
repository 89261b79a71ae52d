"""elpis's 1-16-row EXL3 GEMM against ExLlamaV3's on every Qwen3.8 linear shape (diagnostic, GPU).

Per shape, with random 4-bit mul1 trellises (speed does not depend on the values):
- the decode: elpis's decoded D against `ext.reconstruct`, bit for bit;
- the error of both GEMMs against the float64 linear (D from `ext.reconstruct`, Sylvester H, suh, svh), max
  and RMS relative to the RMS of y, at 1, 8 and 16 rows;
- row invariance: every row of a 16-row and an 8-row call is bit-identical to the same row computed alone;
- time: CUDA-event median of 7 repetitions of 40 launches each, cycling over 4 copies of the weights (178 MB
  or more, past the 50 MB L2) so every launch reads its weights from DRAM, for both kernels in the same
  process; with the fraction of the bandwidth floor (trellis bytes / 4.29 TB/s, the H200's measured copy
  rate).
And per group of linears that share an input (attention Q/K/V, Gated DeltaNet qkv/z, MLP gate/up) at 8 and 16
rows: one group call against the members' single calls and against ExLlamaV3's single GEMMs (time, as above),
each member's error against float64, row invariance inside the group.
Writes one JSON object to argv[1] and prints a table.
Usage (repo root, after `make build`): python3 elpis/bench/scripts/rows_gemm_check.py OUT.json [STAGES|-]
[groups]  (`groups`: the groups alone)
"""

from __future__ import annotations

import json
import math
import statistics
import sys

import torch

from elpis.exl3 import rows_gemm as rg

LIB = None  # the build under test (main's argument)

SHAPES = (
    ("mlp.gate, mlp.up", 5120, 17408),
    ("mlp.down", 17408, 5120),
    ("gdn.qkv", 5120, 10240),
    ("gdn.z", 5120, 6144),
    ("gdn.out, attn.o", 6144, 5120),
    ("attn.q", 5120, 12288),
    ("attn.k, attn.v", 5120, 1024),
    ("head (6-bit)", 5120, 248320, 6),
)
GROUPS = (
    ("attn q/k/v", 5120, (12288, 1024, 1024)),
    ("gdn qkv/z", 5120, (10240, 6144)),
    ("mlp gate/up", 5120, (17408, 17408)),
)
ROWS = (1, 8, 16)
COPIES = 4
BANDWIDTH = 4.29e12  # bytes/s, H200 copy rate measured in ../shared/notes/baseline-2026-11-30.md


def _ext():
    from exllamav3.ext import exllamav3_ext

    return exllamav3_ext


def hadamard(device: str) -> torch.Tensor:
    i = torch.arange(128)
    bits = (i[:, None] & i[None, :]).to(torch.int64)
    parity = torch.zeros_like(bits)
    for b in range(7):
        parity ^= (bits >> b) & 1
    return ((1 - 2 * parity).to(torch.float64) / math.sqrt(128)).to(device)


def blockwise(v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    shape = v.shape
    return (v.reshape(*shape[:-1], shape[-1] // 128, 128) @ h).reshape(shape)


def _gemm(x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor) -> torch.Tensor:
    return rg.rows_gemm(x, trellis, suh, svh, lib=LIB)


def stock_gemm(x, trellis, suh, svh, out, a_had) -> None:
    # force_shape_idx 0 and force_num_sms 0: ExLlamaV3's own choice (its GEMV, int8 GEMV or autotuned kernel)
    _ext().exl3_gemm(x, trellis, out, suh, a_had, svh, 0, False, True, 0)


def timed(fn, reps: int = 7, inner: int = 40) -> tuple[float, str]:
    """Median ms per launch over `reps` replays of a CUDA graph of `inner` launches (the host out of the
    measurement, as in elpis's captured rounds), or of `inner` eager launches where capture fails; and
    which of the two."""
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(inner):
                fn(i)
        run, mode = graph.replay, "graph"
    except RuntimeError as exc:
        print(f"capture failed ({exc}); timing eager launches", file=sys.stderr)
        torch.cuda.synchronize()

        def run() -> None:
            for i in range(inner):
                fn(i)

        mode = "eager"
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times), mode


def time_both(xs: list, trellises: list, suh: torch.Tensor, svh: torch.Tensor) -> dict:
    """Median ms per launch of both kernels, each launch on the next copy of the weights."""
    rows, n = xs[0].shape[0], trellises[0].shape[1] * 16
    out, a_had = torch.empty((rows, n), dtype=torch.half, device="cuda"), torch.empty_like(xs[0])
    elpis_ms, elpis_mode = timed(lambda i: _gemm(xs[i % COPIES], trellises[i % COPIES], suh, svh))
    stock_ms, stock_mode = timed(
        lambda i: stock_gemm(xs[i % COPIES], trellises[i % COPIES], suh, svh, out, a_had)
    )
    return {
        "elpis_ms": elpis_ms,
        "stock_ms": stock_ms,
        "elpis_timing": elpis_mode,
        "stock_timing": stock_mode,
    }


def check_shape(name: str, k: int, n: int, bits: int, h: torch.Tensor) -> dict:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(k * 7 + n)
    trellises, suh, svh = random_linear(k, n, g, bits=bits)
    lib = LIB
    result: dict = {"shape": name, "k": k, "n": n, "bits": bits}
    result["blocks"] = int(lib.elpis_rows_gemm_blocks(k, n, bits))
    result["resident_blocks"] = int(lib.elpis_rows_gemm_resident_blocks(bits))

    d_stock = torch.empty((k, n), dtype=torch.half, device=dev)
    _ext().reconstruct(d_stock, trellises[0], bits, False, True)
    d_ours = rg.decode(trellises[0], lib=LIB)
    result["decode_mismatches"] = int((d_ours.view(torch.int16) != d_stock.view(torch.int16)).sum())
    d64 = d_stock.double()

    rows_out = []
    for rows in ROWS:
        x = torch.randn((rows, k), generator=g, device=dev).half()
        ref = blockwise(blockwise(x.double() * suh.double(), h) @ d64, h) * svh.double()
        ours = _gemm(x, trellises[0], suh, svh)
        stock = torch.empty((rows, n), dtype=torch.half, device=dev)
        a_had = torch.empty_like(x)
        stock_gemm(x, trellises[0], suh, svh, stock, a_had)
        torch.cuda.synchronize()
        scale = ref.pow(2).mean().sqrt().item()
        entry = {"rows": rows}
        for label, y in (("elpis", ours), ("stock", stock)):
            err = (y.double() - ref).abs()
            entry[f"{label}_max_rel"] = err.max().item() / scale
            entry[f"{label}_rms_rel"] = err.pow(2).mean().sqrt().item() / scale
        alone = torch.cat([_gemm(x[i : i + 1].contiguous(), trellises[0], suh, svh) for i in range(rows)])
        entry["rows_equal_alone"] = bool(torch.equal(alone.view(torch.int16), ours.view(torch.int16)))
        xs = [x] + [torch.randn((rows, k), generator=g, device=dev).half() for _ in range(COPIES - 1)]
        entry.update(time_both(xs, trellises, suh, svh))
        floor_ms = k * n * bits / 8 / BANDWIDTH * 1e3
        entry["floor_ms"] = floor_ms
        entry["elpis_of_floor"] = floor_ms / entry["elpis_ms"]
        entry["stock_of_floor"] = floor_ms / entry["stock_ms"]
        rows_out.append(entry)
    # 8 rows inside a 16-row call and alone give the same bits (the row count is no input of the schedule)
    x16 = torch.randn((16, k), generator=g, device=dev).half()
    y16 = _gemm(x16, trellises[0], suh, svh)
    y8 = _gemm(x16[:8].contiguous(), trellises[0], suh, svh)
    result["rows8_of_16_equal"] = bool(torch.equal(y16[:8].view(torch.int16), y8.view(torch.int16)))
    result["rows"] = rows_out
    return result


def parse_defines(text: str) -> dict[str, int]:
    """`DEFINE:VALUE,DEFINE:VALUE` (compile-time knobs of a kernel build) as a dict; empty text: none."""
    defines = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition(":")
        defines[name] = int(value)
    return defines


def random_linear(
    k: int, n: int, g: torch.Generator, copies: int = COPIES, bits: int = 4
) -> tuple[list, torch.Tensor, torch.Tensor]:
    """`copies` random trellises [k/16, n/16, 16 * bits] and one suh, svh (unit signs, svh ~ 1/sqrt(k))."""
    dev = "cuda"
    shape = (k // 16, n // 16, 16 * bits)
    trellises = [
        torch.randint(-32768, 32768, shape, dtype=torch.int16, device=dev, generator=g) for _ in range(copies)
    ]
    suh = (torch.randint(0, 2, (k,), device=dev, generator=g) * 2 - 1).half()
    svh = ((torch.rand(n, device=dev, generator=g) * 0.5 + 0.5) / math.sqrt(k)).half()
    return trellises, suh, svh


def group_rows(k: int, widths: tuple[int, ...], linears: list, rows: int, g, h: torch.Tensor) -> dict:
    dev = "cuda"
    xs = [torch.randn((rows, k), generator=g, device=dev).half() for _ in range(COPIES)]

    def members(c: int) -> list:
        return [rg.Member(t[c], suh, svh, torch.half) for t, suh, svh in linears]

    ys = rg.rows_gemm_group(xs[0], members(0), lib=LIB)
    entry: dict = {"rows": rows, "rms_rel": []}
    for (t, suh, svh), y in zip(linears, ys, strict=True):
        d = torch.empty((k, t[0].shape[1] * 16), dtype=torch.half, device=dev)
        _ext().reconstruct(d, t[0], 4, False, True)
        ref = blockwise(blockwise(xs[0].double() * suh.double(), h) @ d.double(), h) * svh.double()
        scale = ref.pow(2).mean().sqrt().item()
        entry["rms_rel"].append((y.double() - ref).pow(2).mean().sqrt().item() / scale)
    alone = [rg.rows_gemm_group(xs[0][i : i + 1].contiguous(), members(0), lib=LIB) for i in (0, rows - 1)]
    entry["rows_equal_alone"] = all(
        torch.equal(y[[i]].view(torch.int16), a[j].view(torch.int16))
        for i, a in zip((0, rows - 1), alone, strict=True)
        for j, y in enumerate(ys)
    )
    outs = [torch.empty((rows, n), dtype=torch.half, device=dev) for n in widths]
    a_had = torch.empty_like(xs[0])

    def stock_singles(i: int) -> None:
        for (t, suh, svh), o in zip(linears, outs, strict=True):
            stock_gemm(xs[i % COPIES], t[i % COPIES], suh, svh, o, a_had)

    entry["group_ms"], _ = timed(lambda i: rg.rows_gemm_group(xs[i % COPIES], members(i % COPIES), lib=LIB))
    entry["singles_ms"], _ = timed(
        lambda i: [_gemm(xs[i % COPIES], t[i % COPIES], suh, svh) for t, suh, svh in linears]
    )
    entry["stock_singles_ms"], _ = timed(stock_singles)
    entry["floor_ms"] = k * sum(widths) / 2 / BANDWIDTH * 1e3
    return entry


def check_group(name: str, k: int, widths: tuple[int, ...], h: torch.Tensor) -> dict:
    g = torch.Generator(device="cuda").manual_seed(k * 11 + sum(widths))
    linears = [random_linear(k, n, g) for n in widths]
    blocks = int(LIB.elpis_rows_gemm_blocks(k, sum(widths), 4))
    rows = [group_rows(k, widths, linears, r, g, h) for r in (8, 16)]
    return {"group": name, "k": k, "widths": list(widths), "blocks": blocks, "rows": rows}


def main(out_path: str, stages: int | None = None, groups_only: bool = False) -> None:
    global LIB
    LIB = rg.library(stages=stages)
    h = hadamard("cuda")
    props = torch.cuda.get_device_properties(0)
    report = {
        "gpu": props.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "stages": stages,
        "shapes": [] if groups_only else [check_shape(*s[:3], s[3] if len(s) > 3 else 4, h) for s in SHAPES],
        "groups": [check_group(*grp, h) for grp in GROUPS],
    }
    try:
        from importlib.metadata import version

        report["exllamav3"] = version("exllamav3")
    except Exception as exc:
        report["exllamav3"] = f"unknown ({exc})"
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    head = ("shape", "rows", "elpis ms", "stock ms", "x", "floor", "e.rms", "s.rms", "inv", "dec")
    print("{:18} {:>4} {:>9} {:>9} {:>6} {:>6} {:>9} {:>9} {} {}".format(*head))
    for s in report["shapes"]:
        for r in s["rows"]:
            print(
                f"{s['shape']:18} {r['rows']:4d} {r['elpis_ms']:9.4f} {r['stock_ms']:9.4f} "
                f"{r['stock_ms'] / r['elpis_ms']:6.2f} {r['elpis_of_floor']:6.2f} {r['elpis_rms_rel']:9.2e} "
                f"{r['stock_rms_rel']:9.2e} {int(r['rows_equal_alone'])} {s['decode_mismatches']}"
            )
    print(f"{'group':14} {'rows':>4} {'group ms':>9} {'singles':>9} {'stock':>9} {'floor':>6} inv rms")
    for grp in report["groups"]:
        for r in grp["rows"]:
            print(
                f"{grp['group']:14} {r['rows']:4d} {r['group_ms']:9.4f} {r['singles_ms']:9.4f} "
                f"{r['stock_singles_ms']:9.4f} {r['floor_ms'] / r['group_ms']:6.2f} "
                f"{int(r['rows_equal_alone'])} " + " ".join(f"{e:.2e}" for e in r["rms_rel"])
            )


if __name__ == "__main__":
    stages_arg = sys.argv[2] if len(sys.argv) > 2 else "-"
    main(sys.argv[1], None if stages_arg == "-" else int(stages_arg), "groups" in sys.argv[3:])
