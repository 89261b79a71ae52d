"""Teacher-forced model comparison through real reference-backend configurations, and the whole
measure -> ledger -> verdict pipeline through the CLI with the repository's committed rule file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from elpis.cli import main as elpis_main
from elpis.gate.compare import (
    CorpusPlan,
    build_corpus,
    compare_models,
    first_divergence,
    model_text,
    random_corpus,
)
from elpis.gate.configs import BackendLogits, canonical, make_configuration, parse_spec
from elpis.gate.ledger import first_measured
from elpis.gate.measurement import Measurement
from elpis.gate.rules import RULES_DIR, load_rules
from elpis.gate.verdicts import latest

PLAN = CorpusPlan(wikitext_chunks=2, wikitext_tokens=20, gsm8k=0, aime=0, greedy_prompts=1, greedy_tokens=4)


def test_spec_parsing_and_canonical_form() -> None:
    assert canonical("reference:rows=8,dtype=fp32") == "reference:dtype=fp32,rows=8"
    assert parse_spec("exl3").options == {}
    for bad in ("", ":x=1", "reference:rows", "reference:a=1,a=2"):
        with pytest.raises(ValueError):
            parse_spec(bad)
    with pytest.raises(ValueError, match="unknown backend"):
        make_configuration("tpu:x=1", Path("."))


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1


def test_random_corpus_mirrors_the_plan_below_the_vocabulary() -> None:
    plan = CorpusPlan(wikitext_chunks=3, wikitext_tokens=50, gsm8k=2, aime=1, greedy_prompts=2)
    docs, prompts = random_corpus(plan, 97)
    assert [len(d.tokens) for d in docs] == [50] * 6 and {d.stratum for d in docs} == {"random"}
    assert len(prompts) == 2 and all(len(p.tokens) == 64 for p in prompts)
    assert max(t for d in docs + prompts for t in d.tokens) < 97
    assert len({tuple(d.tokens) for d in docs}) == 6  # distinct documents
    assert random_corpus(plan, 97) == (docs, prompts)  # seeded: the same corpus every run
    with pytest.raises(ValueError, match="at least 2"):
        random_corpus(plan, 1)


@pytest.fixture(scope="module")
def configs(tiny_model: Path):
    specs = {
        "ref": "reference:dtype=fp64,path=prefill",
        "decode": "reference:dtype=fp32,mode=exact,path=verify,rows=16",
        "prefill": "reference:dtype=fp32,path=prefill",
        "bf16w": "reference:dtype=fp32,path=prefill,weights=bf16",
    }
    return {name: make_configuration(spec, tiny_model) for name, spec in specs.items()}


def test_reference_options_are_validated(tiny_model: Path) -> None:
    for bad in ("reference:dtype=fp16", "reference:path=prefill,rows=8", "reference:rows=0", "reference:x=1",
                "reference:attention=flash"):  # fmt: skip
        with pytest.raises(ValueError):
            make_configuration(bad, tiny_model)
    assert make_configuration("reference:dtype=fp32", tiny_model).spec == (
        "reference:dtype=fp32,mode=exact,path=verify,rows=16"
    )
    # model=PATH gives one configuration its own model (an EXL3 conversion next to the original)
    own = make_configuration(f"reference:model={tiny_model},path=prefill", Path("/nonexistent"))
    assert own.spec == f"reference:dtype=fp32,model={tiny_model},path=prefill"


def test_verify_chunking_is_row_invariant_and_matches_prefill(configs) -> None:
    tokens = list(range(1000, 1023))
    decode = configs["decode"]
    by16 = decode.teacher_forced(tokens)
    by5 = BackendLogits(decode.spec, decode.backend, 5, decode.vocab_size).teacher_forced(tokens)
    assert by16.shape == (22, decode.vocab_size)
    assert torch.equal(by16, by5)  # exact rows: every row is a decode step, whatever the call size
    prefill = configs["prefill"].teacher_forced(tokens)
    assert (by16 - prefill.float()).abs().max() < 1e-3  # same positions, fp32 rounding apart


def test_teacher_forcing_from_a_prefilled_start(configs) -> None:
    """start=N: the first N tokens are prefilled (the served path's `begin`), rows cover positions N.. only;
    the prefill path computes every row and drops the first N. Too short a sequence is refused."""
    tokens = list(range(1000, 1023))
    decode, prefill = configs["decode"], configs["prefill"]
    whole = decode.teacher_forced(tokens)
    after = decode.teacher_forced(tokens, 7)
    assert after.shape == (22 - 7, decode.vocab_size)
    assert (after - whole[7:]).abs().max() < 1e-3  # a prefill then decode steps: the same positions
    assert torch.equal(prefill.teacher_forced(tokens, 7), prefill.teacher_forced(tokens)[7:])
    for config in (decode, prefill):
        with pytest.raises(ValueError, match="needs at least 23 tokens"):
            config.teacher_forced(tokens[:22], 21)


def test_comparison_scores_from_a_position(configs, tmp_path: Path) -> None:
    docs, prompts = random_corpus(PLAN, 64)
    arms = {"decode": configs["decode"]}
    m = compare_models("unit", "tiny", configs["ref"], arms, docs, prompts[:0], 1, score_from=5)
    assert m.score_from == 5
    assert [d.positions for d in m.documents] == [len(d.tokens) - 1 - 5 for d in docs]
    assert len(m.nll_ref) == sum(d.positions for d in m.documents)
    assert Measurement.load(m.save(tmp_path, "scored")).score_from == 5  # recorded with the arrays
    with pytest.raises(ValueError, match="fewer than 21 tokens"):
        compare_models("unit", "tiny", configs["ref"], arms, docs, prompts[:0], 1, score_from=19)
    with pytest.raises(ValueError, match="must be >= 0"):
        compare_models("unit", "tiny", configs["ref"], arms, docs, prompts[:0], 1, score_from=-1)


@pytest.mark.slow
def test_comparison_of_configurations(configs, tiny_model: Path) -> None:
    encode, render = model_text(tiny_model)
    docs, prompts = build_corpus(encode, render, PLAN)
    assert [d.stratum for d in docs] == ["wikitext", "wikitext"] and len(prompts) == 1
    arms = {name: configs[name] for name in ("decode", "prefill", "bf16w")}
    arms["same"] = make_configuration("reference:dtype=fp64,path=prefill", tiny_model)
    arms["attn64"] = make_configuration(
        "reference:attention=fp64-accumulate,dtype=fp32,path=prefill", tiny_model
    )
    arms["qk8"] = make_configuration("reference:attention=qk-int8,dtype=fp32,path=prefill", tiny_model)
    m = compare_models("unit", str(tiny_model), configs["ref"], arms, docs, prompts, PLAN.greedy_tokens)
    summary = m.summary()
    assert summary["same"]["all"]["mean_kl"] == 0.0 and summary["same"]["all"]["top1"] == 1.0
    assert summary["same"]["all"]["dnll"] == 0.0
    for name in ("decode", "prefill"):
        assert 0.0 < summary[name]["all"]["mean_kl"] < 1e-8
    assert summary["bf16w"]["all"]["mean_kl"] > 100 * summary["prefill"]["all"]["mean_kl"]
    assert summary["qk8"]["all"]["mean_kl"] > 100 * summary["prefill"]["all"]["mean_kl"]
    assert 0.0 < summary["attn64"]["all"]["mean_kl"] < 1e-8  # the patch ran (and was undone after)
    assert summary["attn64"]["all"]["mean_kl"] != summary["prefill"]["all"]["mean_kl"]
    assert m.arms["same"].first_divergence == [None]
    assert len(m.nll_ref) == sum(d.positions for d in m.documents) == 38


@pytest.mark.slow
def test_measure_then_judge_with_the_committed_rule(tiny_model: Path, tmp_path: Path) -> None:
    """`elpis gate model` then `elpis gate verdict` with `cpu-reference-r1` (committed before this runs)."""
    rule_path = RULES_DIR / "cpu-reference-r1.toml"
    rules = load_rules(rule_path).spec
    results = tmp_path / "results"
    arms = {"decode": rules.floors[0], "prefill": rules.floors[1],
            "bf16w": "reference:dtype=fp32,path=prefill,weights=bf16",
            "batched": "reference:dtype=fp32,mode=batched,path=verify,rows=8"}  # fmt: skip
    argv = ["gate", "model", "--model", str(tiny_model), "--reference", rules.reference, "--label", "unit",
            "--wikitext-chunks", "2", "--wikitext-tokens", "24", "--gsm8k", "0", "--aime", "1",
            "--greedy-prompts", "1", "--greedy-tokens", "3", "--results", str(results)]  # fmt: skip
    for name, spec in arms.items():
        argv += ["--arm", f"{name}={spec}"]
    assert elpis_main(argv) == 0
    [measurement] = sorted(results.glob("model-unit-*.json"))
    record = json.loads(measurement.read_text())
    assert record["arms"] == arms and record["identity"]["versions"]["torch"]
    assert first_measured(results, arms["bf16w"]) == record["measured_at"]

    def verdict(candidate: str) -> int:
        return elpis_main(["gate", "verdict", "--rules", str(rule_path), "--measurement", str(measurement),
                           "--candidate", candidate, "--patch", f"unit-{candidate}",
                           "--results", str(results)])  # fmt: skip

    assert verdict("bf16w") == 1  # rounded weights: far outside the fp32 noise
    found = latest("unit-bf16w", results)
    assert found is not None and found.verdict == "FAIL" and not found.ships
    assert found.record["rule"]["sha256"] == load_rules(rule_path).sha256
    code = verdict("batched")
    found = latest("unit-batched", results)
    assert found is not None and code == (0 if found.verdict == "PASS" else 1)
    # a floor is not a candidate
    assert verdict("decode") == 2
    checks = {(c["scope"], c["metric"]) for c in found.record["checks"]}
    assert ("all", "mean_kl") in checks and ("aime", "top1") in checks
    assert np.isfinite([c["lower_margin"] for c in found.record["checks"]]).all()
