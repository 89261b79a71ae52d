"""`elpis bench engine` with the tree systems (issue 8): the tree table and its targets from synthetic result
documents shaped like the workers' output, argument validation, worker grouping and the worker's own
refusals; the worker plumbing for real on this (GPU-less) machine."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from elpis.bench import cli, report, worker, workload
from elpis.exl3 import geometry


@pytest.fixture(scope="module")
def arith():
    return workload.arithmetic(
        geometry.load_facts("text_config.json"), geometry.load_facts("draft_config.json")
    )


def spec(ms: float, *, spread: float = 0.1, scratch: float | None = None, tokens: int = 1) -> dict:
    """A checkpoint's speculative measurement: 8 round times around `ms` (MAD = spread ms)."""
    seconds = [(ms + d) / 1000 for d in (-spread, -spread, -spread, 0.0, 0.0, spread, spread, spread)]
    out = {
        "ttft_seconds": 0.5,
        "round_seconds": seconds,
        "round_median_ms": ms,
        "tokens_per_round": [tokens] * 8,
        "cached": 0,
    }
    if scratch is not None:
        out["round_scratch_mb"] = scratch
        out["resident_mb"] = 19000.0
    return out


def system(points: dict[int, dict]) -> dict:
    return {
        "checkpoints": [{"context": c, "label": workload.label(c), "spec": s} for c, s in points.items()],
        "fresh_ttft": [],
        "errors": [],
        "complete": True,
        "peak": {"max_allocated_gib": 19.5},
    }


def tree_doc() -> dict:
    """1K: every target met; 8K: tree-8 slower than stock beyond the noise; 32K: tree-16 too slow and the
    scratch over the limit; 128K: tree-16 not measured."""
    return {
        "title": "tree test",
        "facts": {"gpu": "X"},
        "model_note": "synthetic",
        "ceilings": {"copy": {"bytes_per_s": 4.3e12}, "matmul": {"flop_per_s": 7.9e14}},
        "systems": {
            "stock": system({1024: spec(24.0), 8192: spec(25.0), 32768: spec(28.0), 131072: spec(38.0)}),
            "elpis": system({1024: spec(24.5), 8192: spec(25.5), 32768: spec(28.5), 131072: spec(37.0)}),
            "elpis-tree8": system(
                {
                    1024: spec(24.1, spread=0.2, scratch=120.0),  # 0.1 ms slower: inside 2 MADs (0.4 ms)
                    8192: spec(27.0, scratch=150.0),  # 2 ms slower, noise 0.2 ms
                    32768: spec(28.0, scratch=180.0),
                    131072: spec(37.5, scratch=250.0),
                }
            ),
            "elpis-tree16": system(
                {
                    1024: spec(26.0, scratch=140.0),  # 1.079 x tree-8
                    8192: spec(27.5, scratch=160.0),
                    32768: spec(33.0, scratch=310.0),  # 1.18 x tree-8, 310 MB
                }
            ),
        },
    }


def test_tree_targets_are_computed_from_the_numbers():
    rows = {r["context"]: r for r in report.tree_rows(tree_doc())}
    assert sorted(rows) == [1024, 8192, 32768, 131072]
    one = rows[1024]["checks"]
    assert one["tree8_vs_stock"]["verdict"] == "PASS"
    assert one["tree8_vs_stock"]["noise_ms"] == pytest.approx(2 * 0.2)
    assert one["tree8_vs_stock"]["ratio"] == pytest.approx(24.1 / 24.0)
    assert one["tree16_vs_tree8"]["ratio"] == pytest.approx(26.0 / 24.1)
    assert one["tree16_vs_tree8"]["verdict"] == one["scratch"]["verdict"] == one["row"]["verdict"] == "PASS"
    eight = rows[8192]["checks"]
    assert eight["tree8_vs_stock"]["verdict"] == "MISS" and eight["row"]["verdict"] == "MISS"
    assert eight["tree16_vs_tree8"]["verdict"] == "PASS"
    big = rows[32768]["checks"]
    assert big["tree8_vs_stock"]["verdict"] == "PASS"  # equal medians
    assert big["tree16_vs_tree8"]["verdict"] == "MISS" and big["scratch"]["verdict"] == "MISS"
    assert big["scratch"]["max_mb"] == 310.0
    last = rows[131072]
    assert last["checks"]["tree16_vs_tree8"]["verdict"] == "n/a"
    assert last["checks"]["scratch"]["verdict"] == "PASS"  # tree-8's 250 MB is the only figure
    assert last["checks"]["row"]["verdict"] == "n/a"  # a missing figure never counts as met
    assert last["chain8_ms"] == 37.0 and "tree16_ms" not in last


def test_tree_check_boundaries():
    at_limit = {"stock_ms": 20.0, "tree8_ms": 20.0, "tree16_ms": 23.0, "tree8_scratch_mb": 299.9}
    checks = report.tree_checks(at_limit)
    assert [checks[k]["verdict"] for k in ("tree8_vs_stock", "tree16_vs_tree8", "scratch", "row")] == [
        "PASS"
    ] * 4
    over = report.tree_checks({**at_limit, "tree8_ms": 20.01, "tree16_ms": 23.1, "tree16_scratch_mb": 300.0})
    assert over["tree8_vs_stock"]["verdict"] == "MISS"  # no round times: no noise allowance
    assert over["tree16_vs_tree8"]["verdict"] == "MISS"  # 23.1 / 20.01 > 1.15
    assert over["scratch"]["verdict"] == "MISS"  # 300 MB is not under 300 MB
    assert report.tree_checks({})["row"]["verdict"] == "n/a"


def test_tree_table_in_the_report(arith, tmp_path):
    paths = report.write(tree_doc(), arith, tmp_path, "t")
    data = json.loads(paths[0].read_text())
    assert [r["label"] for r in data["tree"]] == ["1K", "8K", "32K", "128K"]
    assert [r["label"] for r in data["ratios"]] == ["1K", "8K", "32K", "128K"]  # stock vs elpis as before
    md = paths[1].read_text()
    assert "Token trees (issue 8)" in md
    assert "Every measured round committed exactly 1 token" in md
    assert (
        "| 1K | 24.00 | 24.50 | 24.10 | 26.00 | 1.004 | 1.079 | 120 | 140 | PASS (noise 0.40 ms) | PASS |"
        in md
    )
    assert "| 32K |" in md and "| 310 | PASS (noise 0.20 ms) | MISS | MISS | MISS |" in md
    assert "Targets met at 1 of 4 contexts." in md
    assert "- elpis-tree16: " in md  # its peak memory line
    assert paths[2].stat().st_size > 1000


def test_tokens_per_round_note_follows_the_numbers(arith, tmp_path):
    doc = tree_doc()
    doc["systems"]["elpis-tree8"]["checkpoints"][0]["spec"]["tokens_per_round"] = [1, 3, 1, 1, 2, 1, 1, 1]
    md = report.markdown(report.build(doc, arith))
    assert "Every measured round committed exactly 1 token" not in md
    assert "| 1K |" in md and "| 1.00 / 1.00 / 1.38 / 1.00 |" in md


def test_graph_captures_inside_timed_rounds_are_counted_and_reported(arith):
    from elpis.bench.worker import summarize

    # stamps 0..5: the first token, then five rounds; two warm-up rounds, so rounds 2..4 are timed
    run = {"start": 0.0, "stamps": [1.0, 2.0, 3.0, 4.0, 5.5, 6.0], "counts": [1] * 6, "cached": 0,
           "draft_seconds": [], "captures": [1, 2, 2, 2, 3, 3]}  # fmt: skip
    assert summarize(run, 2)["captures_in_timed_rounds"] == 1  # the one between stamps 3 and 4
    assert summarize({**run, "captures": [1, 2, 3, 3, 3, 3]}, 2)["captures_in_timed_rounds"] == 0
    assert "captures_in_timed_rounds" not in summarize({**run, "captures": []}, 2)  # stock: no graphs
    doc = tree_doc()
    assert "Graph captures inside timed rounds" not in report.markdown(report.build(doc, arith))
    doc["systems"]["elpis-tree16"]["checkpoints"][0]["spec"]["captures_in_timed_rounds"] = 3
    md = report.markdown(report.build(doc, arith))
    assert "Graph captures inside timed rounds" in md and "- elpis-tree16 at 1K: 3" in md


def test_disturbed_measurements_are_flagged_in_the_document_and_the_report(arith):
    doc = report.build(tree_doc(), arith)  # spreads of 0.1-0.2 ms around 24-38 ms: quiet
    assert doc["disturbed"] == [] and "Disturbed measurements" not in report.markdown(doc)
    doc = tree_doc()
    doc["systems"]["elpis-tree16"]["checkpoints"][1]["spec"] = spec(27.5, spread=1.2)  # 4.4 %: still quiet
    doc["systems"]["stock"]["checkpoints"][0]["spec"] = spec(24.0, spread=1.3)  # 5.4 %: disturbed
    doc = report.build(doc, arith)
    assert [(d["system"], d["context"], d["kind"]) for d in doc["disturbed"]] == [("stock", 1024, "spec")]
    assert doc["disturbed"][0]["mad_ms"] == pytest.approx(1.3)
    md = report.markdown(doc)
    assert "Disturbed measurements" in md and "- stock at 1K, spec: median 24.00 ms, MAD 1.30 ms" in md


def test_pooled_ab_pools_alternating_runs_and_applies_the_noise_rule():
    def run(ms_1k: list[float], ms_8k: list[float] | None = None) -> dict:
        checkpoints = [{"context": 1024, "spec": {"round_seconds": [m / 1000 for m in ms_1k]}}]
        if ms_8k is not None:
            checkpoints.append({"context": 8192, "spec": {"round_seconds": [m / 1000 for m in ms_8k]}})
        return {"systems": {"elpis-tree16": {"checkpoints": checkpoints}}}

    a = [run([20, 21, 22], [18, 20, 22]), run([21, 21, 40], [18, 20, 22])]
    b = [run([25, 26, 25], [21, 21, 21]), run([25, 25, 60], [21, 21, 21])]
    one_k, eight_k = report.pooled_ab(a, b, "elpis-tree16")
    # 1K: A pools 20,21,21,21,22,40 (median 21, MAD 0.5), B 25,25,25,25,26,60 (median 25, MAD 0): gain 4 > 1
    assert (one_k["a_rounds"], one_k["b_rounds"]) == (6, 6)
    assert one_k["a_ms"] == pytest.approx(21.0) and one_k["b_ms"] == pytest.approx(25.0)
    assert one_k["noise_ms"] == pytest.approx(1.0) and one_k["verdict"] == "PASS"
    # 8K: A 18,18,20,20,22,22 (median 20, MAD 2) against B's 21: gain 1 inside noise 4
    assert eight_k["gain_ms"] == pytest.approx(1.0) and eight_k["noise_ms"] == pytest.approx(4.0)
    assert eight_k["verdict"] == "MISS"
    # beside the verdict: run i of A against run i of B (1K medians 21, 21 against 25, 25; 8K 20, 20 against
    # 21, 21), and the sign test's chance of two of two with no difference
    for row in (one_k, eight_k):
        assert (row["pairs"], row["pairs_a_faster"], row["sign_p"]) == (2, 2, 0.25)
    three = report.pooled_ab([*a, run([30, 30, 30], [30, 30, 30])], [*b, run([25], [21])], "elpis-tree16")
    assert [(r["pairs"], r["pairs_a_faster"], r["sign_p"]) for r in three] == [(3, 2, 0.5), (3, 2, 0.5)]
    assert "pairs" not in report.pooled_ab(a, b[:1], "elpis-tree16")[0]  # unequal runs do not pair up
    with pytest.raises(ValueError, match="different contexts"):
        report.pooled_ab(a, [run([25])], "elpis-tree16")
    # Two systems of the same runs: arm B is stock in the very documents of arm A
    same_runs = [
        {"systems": {**a_doc["systems"], "stock": b_doc["systems"]["elpis-tree16"]}}
        for a_doc, b_doc in zip(a, b, strict=True)
    ]
    assert report.pooled_ab(same_runs, same_runs, "elpis-tree16", "stock") == [one_k, eight_k]


def test_pooled_ab_can_leave_out_disturbed_runs():
    """With skip_disturbed, a run's context whose rounds spread over DISTURBED_SPREAD is left out of the pool;
    in the same runs for both systems, so both arms keep the same runs. Every run disturbed: refused."""

    def doc(tree_1k: list[float], stock_1k: list[float], tree_8k: list[float], stock_8k: list[float]) -> dict:
        def checkpoints(one_k, eight_k):
            return [
                {"context": 1024, "spec": {"round_seconds": [m / 1000 for m in one_k]}},
                {"context": 8192, "spec": {"round_seconds": [m / 1000 for m in eight_k]}},
            ]

        return {"systems": {"elpis-tree16": {"checkpoints": checkpoints(tree_1k, tree_8k)},
                            "stock": {"checkpoints": checkpoints(stock_1k, stock_8k)}}}  # fmt: skip

    quiet = doc([20, 20, 20], [26, 26, 26], [21, 21, 21], [27, 27, 27])
    noisy = doc([22, 22, 22], [30, 36, 40], [21, 21, 21], [27, 27, 27])  # stock at 1K: MAD 4 of 36
    runs = [quiet, noisy]
    all_1k, all_8k = report.pooled_ab(runs, runs, "elpis-tree16", "stock")
    assert (all_1k["a_runs"], all_1k["b_runs"], all_1k["a_rounds"]) == (2, 2, 6)
    kept_1k, kept_8k = report.pooled_ab(runs, runs, "elpis-tree16", "stock", skip_disturbed=True)
    assert (kept_1k["a_runs"], kept_1k["b_runs"], kept_1k["a_rounds"]) == (1, 1, 3)  # the tree's run 2 too
    assert kept_1k["a_ms"] == pytest.approx(20.0) and kept_1k["b_ms"] == pytest.approx(26.0)
    assert kept_8k == all_8k  # nothing disturbed at 8K
    # separate runs per arm: only the arm whose own measurement is disturbed loses it
    own_1k, _ = report.pooled_ab(runs, runs[::-1], "elpis-tree16", "stock", skip_disturbed=True)
    assert (own_1k["a_runs"], own_1k["b_runs"]) == (2, 1)
    assert (own_1k["pairs"], kept_1k["pairs"], all_1k["pairs"]) == (1, 1, 2)  # a pair with a run left out
    with pytest.raises(ValueError, match="every run of an arm was disturbed"):
        report.pooled_ab([noisy], [noisy], "elpis-tree16", "stock", skip_disturbed=True)


def test_no_tree_table_without_tree_systems(arith):
    doc = tree_doc()
    for name in ("elpis-tree8", "elpis-tree16"):
        del doc["systems"][name]
    built = report.build(doc, arith)
    assert built["tree"] == [] and "Token trees" not in report.markdown(built)


# -- arguments --------------------------------------------------------------------------------------------
def engine_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["engine", "--model", "m", "--draft", "d", *extra])


def test_tree_systems_default_to_the_tree_checkpoints():
    args = engine_args("--systems", "stock,elpis,elpis-tree8,elpis-tree16")
    systems = cli._systems(args.systems)
    assert systems == ["stock", "elpis", "elpis-tree8", "elpis-tree16"]
    assert cli.check_engine_args(args, systems)
    assert args.checkpoints == "1024,8192,32768,131072"
    plain = engine_args()
    assert cli.check_engine_args(plain, cli._systems(plain.systems)) and plain.checkpoints is None
    given = engine_args("--systems", "elpis-tree8", "--checkpoints", "1024,4096")
    assert cli.check_engine_args(given, ["elpis-tree8"]) and given.checkpoints == "1024,4096"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--systems", "stock,elpis-tree32"], "unknown system"),
        (["--systems", "stock,stock"], "named twice"),
        (["--systems", "elpis-tree8", "--elpis-loop", "direct"], "need the speculation core"),
        (["--systems", "elpis-tree8", "--tree-top-k", "0"], "--tree-top-k must be >= 1"),
        (["--checkpoints", "8192,1024"], "increasing token counts"),
        (["--checkpoints", "1024,x"], "increasing token counts"),
        (["--checkpoints", "1024,300000"], "increasing token counts"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--final-tokens", "-1"], "--final-tokens must be >= 0"),
    ],
)
def test_engine_refusals(argv, message, capsys):
    """Refused before anything loads (and before the GPU check, so they hold on any machine)."""
    assert cli.run(engine_args(*argv)) == 2
    assert message in capsys.readouterr().err


def test_profile_systems(capsys):
    """stock and any one elpis system can be profiled (elpis-tree8 is an 8-row tree round since tree runs
    of 8 exist); two elpis systems would share one worker whose backend has one mode."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    refusals = (("stock,elpis-tree9", "unknown system"), ("elpis,elpis-tree16", "one elpis system"),
                ("elpis-tree8,elpis-tree16", "one elpis system"))  # fmt: skip
    for systems, message in refusals:
        args = parser.parse_args(["profile", "--model", "m", "--draft", "d", "--systems", systems])
        assert cli.run(args) == 2
        assert message in capsys.readouterr().err


def test_worker_groups_give_each_tree_row_count_its_own_load():
    # a load captures one row count's graphs, which rounds on the GPU replay: tree-8 beside tree-16 on one
    # load evicted tree-16's keys (device call 172); chain elpis rides with the first tree system
    assert cli.worker_groups(["stock", "elpis", "elpis-tree8", "elpis-tree16"]) == [
        ["stock"],
        ["elpis", "elpis-tree8"],
        ["elpis-tree16"],
    ]
    # a group runs where its first system was named, chain elpis first (it pays the prefill)
    assert cli.worker_groups(["elpis-tree16", "stock", "elpis"]) == [["elpis", "elpis-tree16"], ["stock"]]
    assert cli.worker_groups(["elpis-tree16", "stock", "elpis-tree8"]) == [
        ["elpis-tree16"],
        ["stock"],
        ["elpis-tree8"],
    ]
    assert cli.worker_groups(["stock", "elpis"]) == [["stock"], ["elpis"]]


def test_one_elpis_load_refuses_two_tree_row_counts():
    from elpis.bench.worker import ElpisSystem, variant

    variants = [variant("elpis-tree8", 4), variant("elpis-tree16", 4)]
    with pytest.raises(ValueError, match="one tree row count"):
        ElpisSystem(argparse.Namespace(), variants)


def test_worker_commands(tmp_path):
    args = engine_args("--systems", "stock,elpis,elpis-tree8", "--tree-top-k", "2", "--spec-only")
    assert cli.check_engine_args(args, cli._systems(args.systems))
    stock = cli.worker_command(args, ["stock"], tmp_path / "s.json", 123.0)
    assert stock[stock.index("--system") + 1] == "stock" and "--spec-only" in stock
    assert "--tree-top-k" not in stock and "--cap-gib" not in stock
    assert stock[stock.index("--checkpoints") + 1] == "1024,8192,32768,131072"
    group = cli.worker_command(args, ["elpis", "elpis-tree8"], tmp_path / "e.json", 123.0)
    assert group[group.index("--system") + 1] == "elpis,elpis-tree8"
    assert group[group.index("--tree-top-k") + 1] == "2" and group[group.index("--cap-gib") + 1] == "24.0"
    parsed = worker.parse_args(group[3:])
    assert parsed.system == ["elpis", "elpis-tree8"] and parsed.tree_top_k == 2 and parsed.spec_only
    assert parsed.prefill_chunk == 2048 and "--prefill-chunk" not in stock  # stock prefills its own way
    chunked = engine_args("--systems", "stock,elpis", "--prefill-chunk", "8192")
    elpis = worker.parse_args(cli.worker_command(chunked, ["elpis"], tmp_path / "c.json", 123.0)[3:])
    assert elpis.prefill_chunk == 8192 and not elpis.draft_eager
    eager = engine_args("--systems", "stock,elpis", "--draft-eager")
    assert "--draft-eager" not in cli.worker_command(eager, ["stock"], tmp_path / "d.json", 123.0)
    elpis = worker.parse_args(cli.worker_command(eager, ["elpis"], tmp_path / "e2.json", 123.0)[3:])
    assert elpis.draft_eager and elpis.host_threads is None  # load_backend's default unless asked
    threads = engine_args("--systems", "stock,elpis", "--host-threads", "1")
    assert "--host-threads" not in cli.worker_command(threads, ["stock"], tmp_path / "t.json", 123.0)
    elpis = worker.parse_args(cli.worker_command(threads, ["elpis"], tmp_path / "t2.json", 123.0)[3:])
    assert elpis.host_threads == 1


def test_worker_refuses_mixed_or_unknown_systems(capsys):
    base = ["--model", "m", "--draft", "d", "--out", "o.json", "--deadline", "0"]
    for bad in ("stock,elpis", "elpis,elpis", "elpis-tree4", ""):
        with pytest.raises(SystemExit) as exc:
            worker.parse_args(["--system", bad, *base])
        assert exc.value.code == 2
        assert "give stock, or distinct elpis systems" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        worker.parse_args(["--system", "elpis-tree8", "--tree-top-k", "0", *base])
    assert "--tree-top-k must be >= 1" in capsys.readouterr().err


def test_variants():
    assert worker.variant("elpis", 4) == worker.Variant("elpis", False, 8, 1)
    assert worker.variant("elpis-tree8", 4) == worker.Variant("elpis-tree8", True, 8, 4)
    assert worker.variant("elpis-tree16", 2) == worker.Variant("elpis-tree16", True, 16, 2)
    with pytest.raises(ValueError, match="not an elpis system"):
        worker.variant("stock", 4)


def test_run_workers_reports_every_system_of_a_failed_group(tmp_path):
    """The real worker process on this machine: the backend cannot load without a GPU; both systems of the
    group come back with the reason (the first with the traceback) and the worker's exit code."""
    args = engine_args("--systems", "elpis,elpis-tree8", "--out-dir", str(tmp_path), "--cap-gib", "0")
    assert cli.check_engine_args(args, ["elpis", "elpis-tree8"])
    doc: dict = {"systems": {}}
    saves = []
    cli.run_workers(args, ["elpis", "elpis-tree8"], doc, time.time() + 300, "w", lambda: saves.append(1))
    assert saves == [1] and set(doc["systems"]) == {"elpis", "elpis-tree8"}
    first, second = doc["systems"]["elpis"], doc["systems"]["elpis-tree8"]
    assert first["returncode"] == second["returncode"] == 1
    assert "CUDA" in first["errors"][0] or "cuda" in first["errors"][0]
    assert second["errors"] == ["stopped by an error while elpis ran"]
    assert not list(tmp_path.glob("*.raw.json"))  # the raw file is consumed


def test_group_budget_keeps_a_reserve_for_each_later_group():
    """Call 173: 387 s split evenly over stock, elpis+tree8 and tree16 gave stock 129 s, less than its first
    load (99.6 s) and warm-ups needed; now it gets all but the later groups' reserves, at least an even
    share."""
    reserve = cli.LATER_GROUP_RESERVE
    assert cli.group_budget(387.0, 2) == pytest.approx(387.0 - 2 * reserve)
    assert cli.group_budget(387.0, 0) == 387.0  # the last group takes what is left
    assert cli.group_budget(150.0, 2) == pytest.approx(50.0)  # too little for the reserves: an even share
    assert cli.group_budget(387.0, 2) > 387.0 / 3


def test_run_workers_out_of_time(tmp_path):
    args = engine_args("--out-dir", str(tmp_path))
    doc: dict = {"systems": {}}
    cli.run_workers(args, ["stock", "elpis"], doc, time.time() + 30, "w", lambda: None)
    assert doc["systems"]["stock"]["errors"][0].startswith("not run:")
    assert doc["systems"]["elpis"]["errors"][0].startswith("not run:")


def test_the_engine_prefill_time_is_kept_apart_from_ttft():
    from elpis.bench.worker import summarize

    run = {"start": 0.0, "stamps": [1.2, 2.0, 3.0], "counts": [1] * 3, "cached": 0, "draft_seconds": [],
           "prefill_seconds": 1.05}  # fmt: skip
    out = summarize(run, 0)
    assert out["ttft_seconds"] == 1.2 and out["prefill_seconds"] == 1.05  # TTFT adds the first round
    stock = {k: v for k, v in run.items() if k != "prefill_seconds"}
    assert "prefill_seconds" not in summarize(stock, 0)  # stock's generator has no separate figure


def test_a_tree_system_that_paid_its_prefill_shows_it_in_the_main_table(arith):
    doc = tree_doc()
    del doc["systems"]["elpis"]  # the served configuration alone beside stock
    for name in ("elpis-tree8", "elpis-tree16"):
        doc["systems"][name]["prefill_paid_by"] = "elpis-tree16"
    doc["systems"]["elpis-tree16"]["checkpoints"][0]["spec"]["ttft_seconds"] = 0.25
    built = report.build(doc, arith)
    assert "elpis-tree8" not in built["table"]  # served by the prefix cache: no prefill figure
    first = built["table"]["elpis-tree16"][0]
    assert first["ttft_s"] == 0.25 and first["prefill_tok_s"] == 1024 / 0.25
    assert "round_ms" not in first  # 16-row rounds belong to the tree table
    assert built["ratios_system"] == "elpis-tree16" and built["ratios"][0]["ttft_s"] == 0.5 / 0.25
    md = report.markdown(built)
    assert "its rounds are in the token-tree table below" in md
    chain_only = tree_doc()
    for name in ("elpis-tree8", "elpis-tree16"):
        del chain_only["systems"][name]
    assert "token-tree table" not in report.markdown(report.build(chain_only, arith))
    assert "| elpis-tree16 | 1K | 0.25 | 4096 |" in md and "Stock time / elpis-tree16 time" in md


def test_ttft_parts_are_reported_where_measured(arith):
    doc = tree_doc()
    assert "Where elpis's TTFT went" not in report.markdown(report.build(doc, arith))  # none measured
    spec = doc["systems"]["elpis-tree16"]["checkpoints"][1]["spec"]
    parts = {"snapshots": 0.074, "restore": 0.002}
    spec.update(ttft_seconds=1.15, prefill_seconds=0.992, prefill_parts=parts)
    md = report.markdown(report.build(doc, arith))
    assert "| elpis-tree16 | 8K | 1.150 | 0.992 | 0.074 | 0.002 | 0.158 |" in md
