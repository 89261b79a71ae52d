"""The packaged evaluation data (`elpis/assets/datasets/`) and the token sequences the gates feed models.

GSM8K and AIME rows come as `Task`s (question, gold answer). For teacher-forced comparisons the corpus
is a list of `TokenDocument`s in three strata: WikiText-2 chunks (plain text), and GSM8K / AIME questions
rendered with the model's own chat template (a user turn plus the generation prompt).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elpis.gate.answers import gsm8k_gold, normalize
from elpis.paths import DATASETS

GSM8K_FILE = DATASETS / "gsm8k_test.jsonl"
AIME_FILE = DATASETS / "aime25.jsonl"
WIKITEXT_FILE = DATASETS / "wikitext2_test.raw"


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    gold: str


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
    return rows


def _first(rows: list[Task], n: int | None, name: str) -> list[Task]:
    if n is None:
        return rows
    if not 1 <= n <= len(rows):
        raise ValueError(f"{name} has {len(rows)} tasks; asked for {n}")
    return rows[:n]


def gsm8k_tasks(n: int | None = None) -> list[Task]:
    rows = [
        Task(f"gsm8k-{i}", r["question"], gsm8k_gold(r["answer"])) for i, r in enumerate(_jsonl(GSM8K_FILE))
    ]
    return _first(rows, n, "GSM8K")


def aime_tasks(n: int | None = None) -> list[Task]:
    rows = [
        Task(f"aime25-{i}", r["question"], normalize(str(r["answer"])))
        for i, r in enumerate(_jsonl(AIME_FILE))
    ]
    return _first(rows, n, "AIME 2025")


def chatml_prompt(question: str) -> str:
    """The raw ChatML prompt of the common GSM8K speed workload (no system turn, no thinking switch)."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def wikitext_chunks(encode: Callable[[str], Sequence[int]], count: int, tokens: int) -> list[list[int]]:
    """`count` consecutive chunks of exactly `tokens` tokens from the start of the WikiText-2 test split.

    The text is tokenized line by line (each line keeps its newline) and the ids are concatenated, so a
    tokenizer never sees a cut in the middle of a word and the chunks do not depend on a long input.
    """
    if count < 1 or tokens < 2:
        raise ValueError("need at least one chunk of at least two tokens")
    ids: list[int] = []
    need = count * tokens
    for paragraph in WIKITEXT_FILE.read_text(encoding="utf-8").splitlines():
        if paragraph.strip():
            ids.extend(encode(paragraph + "\n"))
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise ValueError(f"WikiText-2 holds fewer than {need} tokens")
    return [ids[i * tokens : (i + 1) * tokens] for i in range(count)]
