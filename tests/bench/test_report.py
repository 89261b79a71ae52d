"""The benchmark's arithmetic and report, from a results document shaped like the workers' output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import pytest

from elpis.bench import hardware, report, workload
from elpis.exl3 import geometry


@pytest.fixture(scope="module")
def arith():
    return workload.arithmetic(
        geometry.load_facts("text_config.json"), geometry.load_facts("draft_config.json")
    )


def test_model_arithmetic_matches_published_sizes(arith):
    assert abs(arith.target_bytes / 1e9 - 13.18) < 0.01  # trellis body + 6 bpw head, as measured by stock
    assert abs(arith.linear_params / 1e9 - 24.35) < 0.01
    assert arith.kv_bytes_per_token == 16 * 896  # 16 attention layers, 3-bit K and V + fp16 scales
    assert arith.gdn_state_bytes == 48 * 48 * 128 * 128 * 2
    # 2 FLOPs per weight per token, plus attention growing with context
    assert abs(arith.prefill_flops(0, 1) / 1e9 - 2 * (24.35 + 0.18) - 48 * 6 * 48 * 128 * 128 / 1e9) < 0.1
    assert arith.prefill_flops(0, 262000) / 262000 > 1.9 * arith.prefill_flops(0, 1024) / 1024
    assert arith.round_bytes(1024, True) > arith.round_bytes(1024, False) + arith.head_bytes


def run_entry(c: int, cached: int, ttft: float, round_ms: float, plain_ms: float) -> dict:
    def part(ms: float, t: float) -> dict:
        return {
            "ttft_seconds": t,
            "round_median_ms": ms,
            "tokens_per_round": [1] * 20,
            "cached": cached,
            "decode_tokens_per_joule": 0.1,
            "power": {"mean_w": 500.0},
        }

    return {
        "context": c,
        "label": workload.label(c),
        "spec": part(round_ms, ttft),
        "plain": part(plain_ms, 0.01),
    }


def doc() -> dict:
    stock = [
        run_entry(1024, 0, 0.5, 26.0, 14.5),
        run_entry(8192, 0, 3.0, 27.0, 15.0),
        run_entry(32768, 8192, 9.0, 28.0, 15.5),
    ]
    elpis = [
        run_entry(1024, 0, 0.4, 20.0, 12.0),
        run_entry(8192, 0, 2.5, 21.0, 12.5),
        run_entry(32768, 7936, 8.0, 22.0, 13.0),
    ]
    return {
        "title": "test",
        "facts": {
            "gpu": "X",
            "cpu": "Test CPU 9000",
            "cpu_count": 32,
            "cpu_usable": 16,
            "cpu_mhz_mean_now": 2450.0,
        },
        "model_note": "synthetic",
        "ceilings": {"copy": {"bytes_per_s": 4.3e12}, "matmul": {"flop_per_s": 7.9e14}},
        "systems": {
            "stock": {
                "checkpoints": stock,
                "fresh_ttft": [{"context": 8192, "seconds": [3.0]}],
                "peak": {"max_allocated_gib": 19.0},
                "complete": True,
                "errors": [],
            },
            "elpis": {
                "checkpoints": elpis,
                "fresh_ttft": [],
                "peak": {"max_allocated_gib": 18.0},
                "cap_gib": 24.0,
                "complete": False,
                "errors": ["deadline reached"],
            },
        },
    }


def test_cumulative_ttft_only_from_matching_checkpoints():
    data = doc()
    stock = report.cumulative_ttft(data["systems"]["stock"]["checkpoints"])
    assert stock[32768] == {"seconds": 12.0, "cumulative": True}
    elpis = report.cumulative_ttft(data["systems"]["elpis"]["checkpoints"])
    assert elpis[32768]["cumulative"] is False  # 7936 cached tokens are no checkpoint: not summed


def test_report_files(arith, tmp_path):
    paths = report.write(doc(), arith, tmp_path, "t")
    assert [p.name for p in paths] == ["t.json", "t.md", "t.png"]
    data = json.loads(paths[0].read_text())
    ratio = {r["label"]: r for r in data["ratios"]}
    assert ratio["1K"]["round_ms"] == pytest.approx(26.0 / 20.0)
    frac = data["table"]["stock"][0]["round_frac_limit"]
    assert frac == pytest.approx(arith.round_bytes(1024, True) / 4.3e12 / 0.026)
    md = paths[1].read_text()
    assert "| stock | 1K |" in md and "under a 24.0 GiB cap" in md and "deadline reached" in md
    # no load and no Python loop recorded
    assert "Host CPU Test CPU 9000 (16 of 32 usable, 2450 MHz mean now, load -, Python loop - µs)" in md
    old = doc()
    old["facts"] = {"gpu": "X"}  # a JSON from before the host was recorded, rendered again
    assert "Host CPU: not recorded" in report.markdown(old)
    assert paths[2].stat().st_size > 1000


CPUINFO = """processor\t: 0
model name\t: Test CPU 9000 @ 2.0GHz
cpu MHz\t\t: 2000.000
processor\t: 1
model name\t: Test CPU 9000 @ 2.0GHz
cpu MHz\t\t: 3000.500
"""


def test_the_host_cpu_is_recorded_from_cpuinfo():
    got = hardware.cpu_facts(CPUINFO, 2, 1, 0.5)
    assert got == {"cpu": "Test CPU 9000 @ 2.0GHz", "cpu_count": 2, "cpu_usable": 1,
                   "cpu_mhz_mean_now": 2500.2, "load_avg_1m": 0.5}  # fmt: skip
    # no model line and no clocks (some VMs and arm hosts)
    bare = hardware.cpu_facts("processor\t: 0\n", None, None, None)
    assert bare["cpu_mhz_mean_now"] is None and bare["cpu_count"] is None
    here = hardware.host_facts()
    assert here["cpu_count"] == os.cpu_count() and 1 <= here["cpu_usable"] <= here["cpu_count"]
    assert here["python_loop_us"] > 0


def test_the_python_loop_time_grows_with_its_calls():
    short, long = hardware.python_loop_us(reps=3, calls=2_000), hardware.python_loop_us(reps=3, calls=200_000)
    assert 0 < short < long


def test_bench_cli_modes():
    from elpis.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["engine", "--model", "m", "--draft", "d"])
    assert args.mode == "engine" and args.cap_gib == 24.0
    with pytest.raises(SystemExit):
        parser.parse_args([])  # a mode is required


def test_profile_passes_its_prefill_window_to_the_workers(tmp_path):
    from elpis.bench import cli, worker

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["profile", "--model", "m", "--draft", "d", "--prefill-window", "0"])
    assert args.prefill_window == 0 and args.profile_prefill == "32768,262144"
    cmd = cli.worker_command(
        args, ["elpis-tree16"], tmp_path / "raw.json", 0.0, cli.profile_worker_args(args)
    )
    parsed = worker.parse_args(cmd[3:])
    assert parsed.profile and parsed.prefill_window == 0 and parsed.profile_prefill == [32768, 262144]
    default = parser.parse_args(["profile", "--model", "m", "--draft", "d"])
    cmd = cli.worker_command(default, ["stock"], tmp_path / "r", 0.0, cli.profile_worker_args(default))
    assert worker.parse_args(cmd[3:]).prefill_window == 4096


def test_report_mode_rerenders(arith, tmp_path):
    from elpis.bench import cli

    data = doc()
    data["arithmetic"] = dataclasses.asdict(arith)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert cli.run_report(path) == 0
    assert (tmp_path / "r.md").is_file() and (tmp_path / "r.png").is_file()


def test_gsm8k_mode_reaches_the_gates_module(tmp_path, capsys):
    """`elpis bench gsm8k` is parsed by elpis.bench.gsm8k's own arguments and run by its own run()."""
    from elpis.bench import gsm8k
    from elpis.cli import main

    parser = argparse.ArgumentParser()
    gsm8k.add_arguments(parser)
    own = {a.dest for a in parser._actions}
    from elpis.bench import cli

    outer = argparse.ArgumentParser()
    cli.add_arguments(outer)
    args = outer.parse_args(["gsm8k", "--url", "http://127.0.0.1:9"])
    assert args.mode == "gsm8k" and own <= set(vars(args)) | {"help"}
    # nothing listens on port 9: the gates module's own run() reports the failure with a non-zero code
    key = tmp_path / "key"
    key.write_text("k")
    code = main(
        [
            "bench",
            "gsm8k",
            "--url",
            "http://127.0.0.1:9",
            "--api-key-file",
            str(key),
            "--questions",
            "1",
            "--timeout",
            "2",
            "--out",
            str(tmp_path / "o.json"),
        ]
    )
    assert code != 0
