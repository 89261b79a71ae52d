"""Final-answer extraction and exact scoring."""

from __future__ import annotations

import json

import pytest

from elpis.gate.answers import as_number, extract_answer, gsm8k_gold, normalize, same_answer
from elpis.paths import DATASETS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the total is \\boxed{70}.", "70"),
        ("first \\boxed{3} then corrected: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{2^{10}} ok", "2^{10}"),
        ("\\boxed{\\$1,250.50}", "1250.50"),
        ("\\boxed{\\text{18 dollars}}", "18"),
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("#### 1,000\nextra words 7", "1000"),
        ("Thus the answer is $42.", "42"),
        ("The final answer is: 3.5 cm", "3.5"),
        ("I think 12 apples and then 15 pears, so 27", "27"),
        ("costs $5.", "5"),
        ("an unclosed \\boxed{12 and then 99", "99"),
        ("no numbers at all", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_answer(text: str | None, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "gold", "same"),
    [
        ("1000", "1,000", True),
        ("18.00", "18", True),
        ("\\frac{1}{2}", "0.5", True),
        ("-\\dfrac{3}{4}", "-0.75", True),
        ("070", "70", True),
        ("71", "70", False),
        ("18.01", "18", False),
        ("x+1", "x+1", True),
        (None, "70", False),
    ],
)
def test_same_answer_is_exact(predicted: str | None, gold: str, same: bool) -> None:
    assert same_answer(predicted, gold) is same


def test_normalize_and_numbers() -> None:
    assert normalize(" $1,234. ") == "1234"
    assert as_number("\\frac{2}{0}") is None
    assert as_number("abc") is None


def test_gsm8k_gold_answers_all_parse_as_numbers() -> None:
    rows = [json.loads(line) for line in (DATASETS / "gsm8k_test.jsonl").read_text().splitlines()]
    assert len(rows) == 1319
    golds = [gsm8k_gold(row["answer"]) for row in rows]
    assert golds[0] == "18"
    assert all(as_number(g) is not None for g in golds)
    # Scoring a reference solution against its own gold answer is correct for every row.
    assert all(same_answer(extract_answer(row["answer"]), g) for row, g in zip(rows, golds, strict=True))
    with pytest.raises(ValueError):
        gsm8k_gold("no final line")


def test_aime_answers_are_integers() -> None:
    rows = [json.loads(line) for line in (DATASETS / "aime25.jsonl").read_text().splitlines()]
    assert len(rows) == 30
    assert all(as_number(r["answer"]) is not None and as_number(r["answer"]).denominator == 1 for r in rows)
