"""`elpis eval --url URL`: AIME 2025 and GSM8K evaluation lanes against any OpenAI-compatible server.

Each task is one chat request: the question plus "Please reason step by step, and put your final answer
within \\boxed{}.", thinking on (`chat_template_kwargs.enable_thinking`), greedy (temperature 0), a
per-lane output budget, one request at a time, no retries. The final answer is extracted from the
message content (never from the reasoning: an answer the model did not state is no answer) and scored
exactly (`elpis.gate.answers`). Every answer, its reasoning and its token counts are saved as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elpis.gate.client import ClientError

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
FORMAT = "elpis-eval/1"


@dataclass(frozen=True)
class Lane:
    name: str
    default_n: int | None  # None: every task
    default_budget: int


LANES = {
    "aime25": Lane("aime25", None, 32768),
    "gsm8k": Lane("gsm8k", 100, 4096),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server root or its /v1 URL")
    parser.add_argument("--api-key-file", type=Path, help="file holding the server's API key")
    parser.add_argument("--model", help="model id to request (default: the server's only model)")
    parser.add_argument("--lanes", default="aime25,gsm8k", help="comma-separated lanes (aime25, gsm8k)")
    parser.add_argument("--aime-n", type=int, help="first N AIME 2025 problems (default all 30)")
    parser.add_argument("--gsm8k-n", type=int, help="first N GSM8K test questions (default 100)")
    parser.add_argument("--aime-max-tokens", type=int, help="output budget per AIME problem (default 32768)")
    parser.add_argument(
        "--gsm8k-max-tokens", type=int, help="output budget per GSM8K question (default 4096)"
    )
    parser.add_argument("--no-thinking", action="store_true", help="turn thinking off (default: on)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per request before giving up")
    parser.add_argument("--out", type=Path, help="where to save (default: eval-<UTC time>.json here)")


def run(args: argparse.Namespace) -> int:
    try:
        lanes = _parse_lanes(args.lanes)
        settings = {
            "aime25": (args.aime_n, args.aime_max_tokens),
            "gsm8k": (args.gsm8k_n, args.gsm8k_max_tokens),
        }
        from elpis.gate.client import connect, served_model

        client = connect(args.url, args.api_key_file, args.timeout)
        model = served_model(client, args.model)
        plan = {}
        for lane in lanes:
            n, budget = settings[lane.name]
            n = lane.default_n if n is None else n
            budget = lane.default_budget if budget is None else budget
            if budget < 1:
                raise ValueError(f"{lane.name}: the output budget must be at least 1")
            plan[lane.name] = (n, budget)
        record = evaluate(client, model, plan, thinking=not args.no_thinking)
    except (ClientError, ValueError) as exc:
        print(f"elpis eval: {exc}", file=sys.stderr)
        return 2
    record["url"] = args.url
    out = args.out or Path(time.strftime("eval-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for name, lane in record["lanes"].items():
        s = lane["summary"]
        print(
            f"{name}: {s['correct']}/{s['tasks']} correct, {s['truncated']} truncated, "
            f"{s['completion_tokens']} completion tokens"
        )
    print(f"saved {out}")
    return 0


def _parse_lanes(text: str) -> list[Lane]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LANES]
    if unknown or not names:
        raise ValueError(f"unknown lane(s) {unknown or text!r}: choose from {sorted(LANES)}")
    return [LANES[n] for n in dict.fromkeys(names)]


def _tasks(lane: str, n: int | None):
    from elpis.gate.corpus import aime_tasks, gsm8k_tasks

    return aime_tasks(n) if lane == "aime25" else gsm8k_tasks(n)


def evaluate(
    client: Any, model: str, plan: dict[str, tuple[int | None, int]], *, thinking: bool
) -> dict[str, Any]:
    """Run each lane of `plan` (lane -> (first N or None, output budget)); return the saved record."""
    import openai
    from rich.progress import track

    from elpis.gate.answers import extract_answer, same_answer
    from elpis.gate.client import request_error
    from elpis.gate.identity import identity

    lanes: dict[str, Any] = {}
    for lane, (n, budget) in plan.items():
        rows = []
        for task in track(_tasks(lane, n), description=lane, transient=True):
            begin = time.perf_counter()
            try:
                response = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"{task.question}\n\n{INSTRUCTION}"}],
                    max_tokens=budget,
                    temperature=0,
                    extra_body={"chat_template_kwargs": {"enable_thinking": thinking}},
                )
            except openai.APIError as exc:
                raise request_error(exc) from exc
            seconds = time.perf_counter() - begin
            choice, usage = response.choices[0], response.usage
            if usage is None:
                raise ValueError(f"{task.id}: the response has no usage block")
            message = choice.message
            reasoning = getattr(message, "reasoning_content", None)
            if reasoning is None and message.model_extra:
                reasoning = message.model_extra.get("reasoning_content")
            answer = extract_answer(message.content)
            rows.append(
                {
                    "id": task.id,
                    "question": task.question,
                    "gold": task.gold,
                    "content": message.content,
                    "reasoning": reasoning,
                    "answer": answer,
                    "correct": same_answer(answer, task.gold),
                    "finish_reason": choice.finish_reason,
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "seconds": seconds,
                }
            )
        lanes[lane] = {
            "max_tokens": budget,
            "rows": rows,
            "summary": {
                "tasks": len(rows),
                "correct": sum(r["correct"] for r in rows),
                "accuracy": sum(r["correct"] for r in rows) / len(rows),
                "truncated": sum(r["finish_reason"] == "length" for r in rows),
                "completion_tokens": sum(r["completion_tokens"] for r in rows),
            },
        }
    return {
        "format": FORMAT,
        "model": model,
        "thinking": thinking,
        "sampling": {"temperature": 0},
        "instruction": INSTRUCTION,
        "lanes": lanes,
        "identity": identity(),
    }
