"""The arithmetic and bookkeeping of the in-process round A/Bs (`elpis.bench.rounds_ab`, used by
`device_round_ab.py` and `switch_ab.py`), on toy arms and profiles."""

from __future__ import annotations

import gc
import os
import types

import pytest

import elpis.exl3
from elpis.bench import rounds_ab as ab
from elpis.bench.scripts import switch_ab


def arm(span: float, busy: float, by_name: dict[str, float]) -> dict:
    return {"span_ms": span, "busy_ms": busy, "idle_ms": span - busy, "kernels": 900.0, "by_name": by_name}


def test_the_difference_lists_the_kernels_an_arm_adds_or_drops_largest_first() -> None:
    host = arm(17.2, 15.5, {"rows_gemm_kernel": 11.3, "topk": 0.1, "argmax": 0.04})
    names = {f"k{i}": 0.001 * i for i in range(20)}
    device = arm(17.2, 16.9, {"rows_gemm_kernel": 11.3, "topk": 0.1, "round_tail_kernel": 0.03,
                              "gdn_tree_kernel": 0.5, **names})  # fmt: skip
    got = ab.profile_difference({"host": host, "device": device}, "host", "device")
    assert got["host"]["idle_ms"] == pytest.approx(1.7) and got["device"]["idle_ms"] == pytest.approx(0.3)
    diff = got["kernel_ms_device_minus_host"]
    assert len(diff) == ab.DIFF_KERNELS
    assert list(diff)[:3] == ["gdn_tree_kernel", "argmax", "round_tail_kernel"]
    assert diff["argmax"] == pytest.approx(-0.04) and "rows_gemm_kernel" not in diff


def test_pairs_alternate_the_arms_and_leave_the_warm_up_pair_out() -> None:
    served: list[str] = []

    def run(name: str) -> tuple[list[int], list[float]]:
        served.append(name)
        return [1, 2, 3], [0.010 if name == "off" else 0.008] * 2

    seconds = ab.alternate(("off", "on"), 3, run, "toy")
    assert served == ["on", "off", "off", "on", "on", "off", "off", "on"]
    assert seconds == {"off": [0.010] * 6, "on": [0.008] * 6}


def test_arms_that_disagree_on_tokens_stop_the_ab() -> None:
    with pytest.raises(SystemExit, match="arm on gave other tokens than arm off"):
        ab.alternate(("off", "on"), 1, lambda name: ([1] if name == "off" else [2], [0.01]), "toy")
    calls = iter(range(10))
    with pytest.raises(SystemExit, match="arm on: two requests gave different tokens"):
        ab.alternate(("off", "on"), 2, lambda name: ([next(calls)] if name == "on" else [0], [0.01]), "toy")


def test_the_verdict_follows_the_noise_rule() -> None:
    steady = [0.0100, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098]
    faster = [s - 0.002 for s in steady]
    doc = ab.compare({"off": steady, "on": faster}, "off", "on")
    assert doc["gain_ms"] == pytest.approx(2.0) and doc["verdict"] == "faster"
    assert doc["rounds_per_arm"] == {"off": 6, "on": 6}
    assert ab.compare({"off": steady, "on": steady}, "off", "on")["verdict"] == "within noise"
    assert ab.compare({"off": faster, "on": steady}, "off", "on")["verdict"] == "slower"


def test_switch_ab_names_registry_switches_only() -> None:
    env = switch_ab.switch_env(["exl3-norm-input", "exl3-draft-candidates"])
    assert env == {
        "exl3-norm-input": "ELPIS_PATCH_NORM_INPUT",
        "exl3-draft-candidates": "ELPIS_PATCH_DRAFT_CANDIDATES",
    }
    with pytest.raises(SystemExit, match="not registry patches: exl3-no-such"):
        switch_ab.switch_env(["exl3-norm-input", "exl3-no-such"])


def test_an_arm_loads_with_its_switches_and_leaves_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []

    def fake_load(*args: object, **kwargs: object) -> types.SimpleNamespace:
        seen.append((os.environ.get("ELPIS_PATCH_NORM_INPUT"), os.environ.get("ELPIS_PATCH_MLP_ACT_INPUT")))
        return types.SimpleNamespace(prefix=types.SimpleNamespace(enabled=True))

    monkeypatch.setattr(elpis.exl3, "load_backend", fake_load)
    monkeypatch.setenv("ELPIS_PATCH_NORM_INPUT", "0")
    monkeypatch.delenv("ELPIS_PATCH_MLP_ACT_INPUT", raising=False)
    env = switch_ab.switch_env(["exl3-norm-input", "exl3-mlp-act-input"])
    backend = switch_ab.load_arm("model", "draft", env, "1")
    assert seen == [("1", "1")] and backend.prefix.enabled is False
    assert os.environ["ELPIS_PATCH_NORM_INPUT"] == "0" and "ELPIS_PATCH_MLP_ACT_INPUT" not in os.environ


def test_both_scripts_take_the_shared_arguments() -> None:
    args = ab.arguments("toy").parse_args(["m", "d", "--out", "o.json", "--contexts", "1024", "--pairs", "2"])
    got = (args.contexts, args.pairs, args.tokens, args.budget, args.profile_rounds)
    assert got == ("1024", 2, 40, 16, 0)
    with pytest.raises(SystemExit):
        ab.arguments("toy").parse_args(["m", "d"])  # --out is required


def test_host_time_is_each_rounds_wall_less_its_waits_after_the_warm_up() -> None:
    # step i takes 10 + i ms of wall clock, of which the host waited on the GPU 9.8 ms (9.5 in the last)
    clock = {"now": 0.0, "waited": 0.0}
    walls = [0.5] + [0.010 + 0.001 * i for i in range(10)]  # the first step holds the prefill
    waits = [0.4] + [0.0098] * 9 + [0.0095]

    def steps():
        for wall, wait in zip(walls, waits, strict=True):
            clock["now"] += wall
            clock["waited"] += wait
            yield object()

    got = ab.host_time(steps(), lambda: clock["waited"], clock=lambda: clock["now"])
    timed = slice(1 + ab.WARMUP_ROUNDS, None)
    host = sorted(w - x for w, x in zip(walls[timed], waits[timed], strict=True))
    assert got["rounds"] == 10 - ab.WARMUP_ROUNDS
    assert got["host_ms_median"] == pytest.approx(1000 * (host[2] + host[3]) / 2)
    assert got["host_ms_p90"] == pytest.approx(1000 * host[-1])
    assert got["wait_ms_median"] == pytest.approx(9.8)
    with pytest.raises(ValueError, match="no rounds after the warm-up"):
        ab.host_time(iter(range(ab.WARMUP_ROUNDS)), lambda: 0.0)


def test_host_time_is_measured_only_on_rounds_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    host_rounds = types.SimpleNamespace(device_rounds=None)
    assert ab.device_host_time(host_rounds, None, [1], 40, 16) is None
    device = types.SimpleNamespace(wait_seconds=0.0)

    def steps(backend, decoder, prompt, tokens, budget):  # each round: the host waits 9 ms of it
        assert (backend.device_rounds, prompt, tokens, budget) == (device, [1], 40, 16)
        for _ in range(tokens):
            device.wait_seconds += 0.009
            yield object()

    monkeypatch.setattr(ab, "greedy_steps", steps)
    got = ab.device_host_time(types.SimpleNamespace(device_rounds=device), None, [1], 40, 16)
    assert got is not None and got["rounds"] == 40 - 1 - ab.WARMUP_ROUNDS
    assert got["wait_ms_median"] == pytest.approx(9.0)
    assert got["host_ms_median"] == pytest.approx(got["round_ms_median"] - 9.0)


def test_the_staged_uploads_waits_are_reported_apart_and_stay_in_the_host_time() -> None:
    """Waits of the staged uploads for their previous copies block the host on the GPU too; they are on the
    round's path, so they stay in the host time, and are reported apart so a host time they make up shows."""
    clock = {"now": 0.0, "waited": 0.0, "uploads": 0.0}

    def steps():
        for i in range(12):
            clock["now"] += 0.018
            clock["waited"] += 0.016
            clock["uploads"] += 0.003 if i == 9 else 0.001
            yield object()

    got = ab.host_time(steps(), lambda: clock["waited"], clock=lambda: clock["now"],
                       uploads=lambda: clock["uploads"])  # fmt: skip
    assert got["host_ms_median"] == pytest.approx(2.0)
    assert got["upload_wait_ms_median"] == pytest.approx(1.0)
    assert got["upload_wait_ms_max"] == pytest.approx(3.0)


def test_rounds_the_collector_ran_in_are_marked_and_left_out_of_the_quiet_p90() -> None:
    """A collection inside a round stays in its host time; the rounds it ran in are counted, and the 90th
    percentile of the other rounds is reported beside the overall one."""
    clock = {"now": 0.0, "waited": 0.0, "collector": 0.0}
    slow = {7, 11}  # rounds (steps) in which the collector ran for 0.4 ms

    def steps():
        for i in range(20):
            clock["now"] += 0.0102 + (0.0004 if i in slow else 0.0)
            clock["waited"] += 0.010
            clock["collector"] += 0.0004 if i in slow else 0.0
            yield object()

    got = ab.host_time(steps(), lambda: clock["waited"], clock=lambda: clock["now"],
                       collector=lambda: clock["collector"])  # fmt: skip
    assert got["rounds"] == 19 - ab.WARMUP_ROUNDS == len(got["host_ms_rounds"])
    assert got["rounds_with_gc"] == 2
    assert got["gc_ms_total"] == pytest.approx(0.8)
    assert got["host_ms_p90"] == pytest.approx(0.6)
    assert got["host_ms_p90_without_gc"] == pytest.approx(0.2)
    # in order: step i is round i - 1 - WARMUP_ROUNDS
    slow_rounds = [i for i, h in enumerate(got["host_ms_rounds"]) if h > 0.5]
    assert slow_rounds == [step - 1 - ab.WARMUP_ROUNDS for step in sorted(slow)]


def test_every_round_with_a_collection_leaves_no_quiet_p90() -> None:
    clock = {"now": 0.0, "collector": 0.0}

    def steps():
        for _ in range(10):
            clock["now"] += 0.001
            clock["collector"] += 0.0001
            yield object()

    got = ab.host_time(steps(), lambda: 0.0, clock=lambda: clock["now"], collector=lambda: clock["collector"])
    assert got["rounds_with_gc"] == got["rounds"] and got["host_ms_p90_without_gc"] is None


def test_the_collector_time_counts_real_collections_only_while_installed() -> None:
    with ab.CollectorTime() as collector:
        assert collector.seconds == 0.0
        gc.collect()
        gc.collect(0)
    assert collector.collections[2] >= 1 and collector.collections[0] >= 1
    assert collector.seconds > 0.0
    seen = (collector.seconds, list(collector.collections))
    gc.collect()
    assert (collector.seconds, collector.collections) == seen  # uninstalled: no longer counted


def test_an_arm_is_attached_for_its_request_and_restored_after_even_when_it_fails() -> None:
    state = {"arm": "base"}
    seen = []

    def serve(backend, decoder, prompt, *more):
        seen.append((state["arm"], backend, decoder, prompt, more))
        if prompt == [0]:
            raise RuntimeError("the request failed")
        return "done"

    on = ab.arm_runner("B", "D", lambda arm: state.update(arm=arm), lambda: state.update(arm="base"))
    assert on("x", serve, [1], 40, 16) == "done" and state["arm"] == "base"
    with pytest.raises(RuntimeError):
        on("y", serve, [0])
    assert state["arm"] == "base"
    assert seen == [("x", "B", "D", [1], (40, 16)), ("y", "B", "D", [0], ())]


def test_compare_arms_alternates_both_arms_over_the_pairs() -> None:
    args = types.SimpleNamespace(pairs=2, tokens=5, budget=16)
    order = []

    def on(arm, serve, prompt, tokens, budget):
        assert serve is ab.rounds_of and (prompt, tokens, budget) == ([7], 5, 16)
        order.append(arm)
        return [1, 2, 3], [0.010 if arm == "a" else 0.008] * 4

    got = ab.compare_arms(on, ("a", "b"), [7], args, "test")
    assert order == ["b", "a", "a", "b", "b", "a"]  # one warm-up pair, then two timed pairs, alternating
    assert got["rounds_per_arm"] == {"a": 8, "b": 8}
    assert got["gain_ms"] == pytest.approx(2.0) and got["verdict"] == "faster"
