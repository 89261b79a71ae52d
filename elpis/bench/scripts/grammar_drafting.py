"""Tokens per round under a grammar, with and without drafting what it forces.

What the grammar forces is drafted by `Constraint.forced_tokens` and `elpis.spec.tree.with_forced`. The
model is the embedded SmolLM2-135M (CPU, reference backend, prompt lookup beside it, trees of 8 rows,
greedy). Tokens per round do not depend on the hardware; a round's time does, and on the GPU a tree's rows
cost little more than one (bench/results/tree). Both runs must give the same text (checked). Writes one
JSON document to --out and prints it.
Usage (repo root): python3 elpis/bench/scripts/grammar_drafting.py --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import torch

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 30},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"}},
        "required": ["city", "unit", "days"],
    }
}
CASES = {  # name: (user message, grammar kind)
    "json_schema": ("Invent a person and describe them as JSON with name, age, city and hobbies.", "json"),
    "tool_call": ("What will the weather be in Paris for the next three days?", "tool"),
}


def main() -> None:
    from elpis.reference.assets import ensure_smollm2
    from elpis.reference.loader import load_backend
    from elpis.server.toolgrammar import tool_call_lark
    from elpis.spec import GenerationRequest, SamplingParams, SpeculativeGenerator
    from elpis.spec.drafters import NgramDrafter
    from elpis.spec.grammar import Constraint, Grammar, GrammarTokenizer
    from elpis.text import load_chat_template, load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--budget", type=int, default=8)
    args = parser.parse_args()
    path = ensure_smollm2()
    backend = load_backend(path, max_context=4096, model_id="smollm2")
    tokenizer, template = load_tokenizer(path), load_chat_template(path)
    info = backend.info
    vocabulary = GrammarTokenizer(tokenizer.backend.to_str(), info.vocab_size, info.stop_token_ids)
    calls = tool_call_lark(WEATHER_TOOL, only=None, parallel=False, calls_only=True, special_markers=False)
    grammars = {"json": Grammar.json_schema(vocabulary, PERSON), "tool": Grammar.lark(vocabulary, calls)}
    drafting = Constraint.forced_tokens

    def run(prompt: list[int], grammar: Grammar, forced: bool) -> tuple[list[int], int]:
        Constraint.forced_tokens = drafting if forced else (lambda self, limit: [])  # type: ignore[method-assign]
        try:
            gen = SpeculativeGenerator(backend, tokenizer, drafter=NgramDrafter(), tree_budget=args.budget)
            request = GenerationRequest(tuple(prompt), args.max_tokens, SamplingParams(), grammar=grammar)
            steps = list(gen.generate(request))
        finally:
            Constraint.forced_tokens = drafting  # type: ignore[method-assign]
        stats = steps[-1].stats
        assert stats is not None
        return [t for s in steps for t in s.token_ids], stats.rounds

    cases: dict[str, Any] = {}
    for name, (message, kind) in CASES.items():
        text = template.render([{"role": "user", "content": message}], add_generation_prompt=True)
        prompt = tokenizer.encode(text, special=True)
        plain_ids, rounds_lookup = run(prompt, grammars[kind], forced=False)
        ids, rounds_forced = run(prompt, grammars[kind], forced=True)
        if ids != plain_ids:
            raise SystemExit(f"{name}: drafting the forced tokens changed the text")
        cases[name] = {
            "tokens": len(ids), "text": tokenizer.decode(ids),
            "rounds": {"lookup": rounds_lookup, "lookup+forced": rounds_forced},
            "tokens_per_round": {"lookup": round(len(ids) / rounds_lookup, 3),
                                 "lookup+forced": round(len(ids) / rounds_forced, 3)},
        }  # fmt: skip
    document = {
        "what": __doc__.splitlines()[0], "model": "SmolLM2-135M-Instruct (GGUF Q4_1, reference backend)",
        "budget": args.budget, "max_tokens": args.max_tokens, "torch": torch.__version__,
        "python": platform.python_version(), "cases": cases,
    }  # fmt: skip
    args.out.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(document, ensure_ascii=False))


if __name__ == "__main__":
    main()
