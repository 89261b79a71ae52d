"""Final-answer extraction and exact scoring for math tasks (GSM8K, AIME).

Extraction order, first match wins (each looks for the *last* occurrence in the text):
  1. `\\boxed{...}` or `\\fbox{...}` with balanced braces;
  2. a `#### X` line (GSM8K's own format);
  3. "the (final) answer is X";
  4. the last number in the text.
Scoring is exact: both answers are normalised (dollar signs, thousands separators, `\\text{}`, trailing
period) and compared as exact rationals when both are numbers (`1,000` == `1000.00`, `\\frac{1}{2}` ==
`0.5`), otherwise as strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_HASHES_RE = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:)\s*:?\s*\$?\s*(" + _NUMBER + r")", re.IGNORECASE)
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...}, braces balanced (None if unclosed)."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def extract_answer(text: str | None) -> str | None:
    """The final answer stated in a model's text, or None if it states none."""
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return normalize(boxed)
    hashes = _HASHES_RE.findall(text)
    if hashes and hashes[-1].strip():
        return normalize(hashes[-1])
    stated = _ANSWER_IS_RE.findall(text)
    if stated:
        return normalize(stated[-1])
    numbers = _NUMBER_RE.findall(text)
    return normalize(numbers[-1]) if numbers else None


def normalize(answer: str) -> str:
    s = answer.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|,|!|;|quad)", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    # a lone number followed by units ("18 dollars", "5 cm") keeps only the number
    unit = re.fullmatch(r"(" + _NUMBER + r")\s*[A-Za-z][A-Za-z ]*", s)
    if unit:
        s = unit.group(1)
    if _NUMBER_RE.fullmatch(s):
        s = s.replace(",", "")
    return s


def as_number(answer: str) -> Fraction | None:
    s = normalize(answer)
    frac = _FRAC_RE.match(s.replace(" ", ""))
    if frac:
        sign, num, den = frac.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign else value
    if not _NUMBER_RE.fullmatch(s) and not re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return None
    try:
        return Fraction(Decimal(s))
    except (InvalidOperation, ValueError):
        return None


def same_answer(predicted: str | None, gold: str) -> bool:
    if predicted is None:
        return False
    a, b = as_number(predicted), as_number(gold)
    if a is not None and b is not None:
        return a == b
    return normalize(predicted) == normalize(gold)


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K reference solution (after `#### `)."""
    found = _HASHES_RE.findall(solution)
    if not found:
        raise ValueError("GSM8K solution has no '#### answer' line")
    return normalize(found[-1])
