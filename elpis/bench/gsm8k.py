"""`elpis bench gsm8k`: the common GSM8K speed workload against any OpenAI-compatible server.

The first N (default 40) GSM8K test questions, each sent as the raw ChatML prompt
`<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n` to `/v1/completions`, greedy
(temperature 0), at most M (default 512) output tokens, one request at a time, no retries. Reported:
tokens per second of each request (completion tokens / wall time from send to full response: prefill
and HTTP included) as median and spread, pooled tok/s, tokens per speculation round when the server
reports rounds in `usage`, and the answers (saved whole, so two runs can be compared byte for byte with
`--compare A.json B.json`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

FORMAT = "elpis-bench-gsm8k/1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="server root or its /v1 URL, e.g. http://127.0.0.1:18020")
    parser.add_argument("--api-key-file", type=Path, help="file holding the server's API key")
    parser.add_argument("--model", help="model id to request (default: the server's only model)")
    parser.add_argument("--questions", type=int, default=40, help="first N GSM8K test questions (default 40)")
    parser.add_argument("--max-tokens", type=int, default=512, help="output tokens per request (default 512)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request before giving up")
    parser.add_argument(
        "--out", type=Path, help="where to save the run (default: gsm8k-<UTC time>.json here)"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A.json", "B.json"),
        help="compare two saved runs byte for byte instead of running (exit 0 identical, 1 different)",
    )


def run(args: argparse.Namespace) -> int:
    from elpis.gate.client import ClientError

    try:
        if args.compare:
            return _compare_files(*args.compare)
        if not args.url:
            raise ClientError("--url is required (or --compare A.json B.json)")
        return _run_workload(args)
    except (ClientError, ValueError) as exc:
        print(f"elpis bench gsm8k: {exc}", file=sys.stderr)
        return 2


def _run_workload(args: argparse.Namespace) -> int:
    from elpis.gate.client import connect, served_model

    if args.questions < 1 or args.max_tokens < 1:
        raise ValueError("--questions and --max-tokens must be at least 1")
    client = connect(args.url, args.api_key_file, args.timeout)
    model = served_model(client, args.model)
    record = workload(client, model, args.questions, args.max_tokens)
    record["url"] = args.url
    out = args.out or Path(time.strftime("gsm8k-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    _print_summary(record)
    print(f"saved {out}")
    return 0


def workload(client: Any, model: str, questions: int, max_tokens: int) -> dict[str, Any]:
    """Run the workload through an `openai.OpenAI` client; return the record that `--out` saves."""
    import openai
    from rich.progress import track

    from elpis.gate.answers import extract_answer, same_answer
    from elpis.gate.client import request_error, speculation_stats
    from elpis.gate.corpus import chatml_prompt, gsm8k_tasks
    from elpis.gate.identity import identity

    rows: list[dict[str, Any]] = []
    started = time.time()
    for index, task in enumerate(track(gsm8k_tasks(questions), description="gsm8k", transient=True)):
        prompt = chatml_prompt(task.question)
        begin = time.perf_counter()
        try:
            response = client.completions.create(
                model=model, prompt=prompt, max_tokens=max_tokens, temperature=0
            )
        except openai.APIError as exc:
            raise request_error(exc) from exc
        seconds = time.perf_counter() - begin
        choice, usage = response.choices[0], response.usage
        if usage is None:
            raise ValueError(f"question {index}: the response has no usage block")
        tokens = usage.completion_tokens
        if not 0 <= tokens <= max_tokens:
            raise ValueError(f"question {index}: {tokens} completion tokens for a budget of {max_tokens}")
        spec = speculation_stats(usage)
        answer = extract_answer(choice.text)
        rows.append(
            {
                "index": index,
                "id": task.id,
                "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
                "text": choice.text,
                "text_sha256": hashlib.sha256(choice.text.encode()).hexdigest(),
                "finish_reason": choice.finish_reason,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": tokens,
                "seconds": seconds,
                "tok_s": tokens / seconds if seconds > 0 else None,
                "rounds": spec["rounds"] if spec else None,
                "committed": spec["committed"] if spec else None,
                "answer": answer,
                "gold": task.gold,
                "correct": same_answer(answer, task.gold),
            }
        )
    return {
        "format": FORMAT,
        "model": model,
        "questions": questions,
        "max_tokens": max_tokens,
        "prompt_format": "chatml-raw /v1/completions temperature=0",
        "started_at": started,
        "rows": rows,
        "summary": summarize(rows),
        "identity": identity(),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rates = sorted(r["tok_s"] for r in rows if r["tok_s"] is not None)
    tokens = sum(r["completion_tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    summary: dict[str, Any] = {
        "requests": len(rows),
        "completion_tokens": tokens,
        "tok_s_median": statistics.median(rates) if rates else None,
        "tok_s_min": rates[0] if rates else None,
        "tok_s_max": rates[-1] if rates else None,
        "tok_s_quartiles": statistics.quantiles(rates, n=4) if len(rates) >= 2 else None,
        "pooled_tok_s": tokens / seconds if seconds > 0 else None,
        "capped": sum(1 for r in rows if r["finish_reason"] == "length"),
        "correct": sum(1 for r in rows if r["correct"]),
        "tokens_per_round": None,
    }
    with_rounds = [r for r in rows if r["rounds"]]
    if with_rounds:
        rounds = sum(r["rounds"] for r in with_rounds)
        summary["tokens_per_round"] = sum(r["committed"] for r in with_rounds) / rounds
        summary["rounds"] = rounds
    return summary


def _print_summary(record: dict[str, Any]) -> None:
    s = record["summary"]

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    quart = s["tok_s_quartiles"]
    print(
        f"{record['model']}: {s['requests']} requests, {s['completion_tokens']} tokens, "
        f"tok/s median {fmt(s['tok_s_median'])} (min {fmt(s['tok_s_min'])}, max {fmt(s['tok_s_max'])}"
        + (f", IQR {quart[0]:.2f}-{quart[2]:.2f}" if quart else "")
        + f"), pooled {fmt(s['pooled_tok_s'])}, tokens/round {fmt(s['tokens_per_round'])}, "
        f"capped {s['capped']}, correct {s['correct']}/{s['requests']}"
    )


def _load(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved elpis bench gsm8k run")
    return record


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Row-by-row byte comparison of two runs of the same workload."""
    for key in ("questions", "max_tokens", "prompt_format"):
        if a[key] != b[key]:
            raise ValueError(f"the runs used different workloads: {key} {a[key]!r} vs {b[key]!r}")
    if [r["prompt_sha256"] for r in a["rows"]] != [r["prompt_sha256"] for r in b["rows"]]:
        raise ValueError("the runs sent different prompts")
    differing = []
    for ra, rb in zip(a["rows"], b["rows"], strict=True):
        if ra["text"] != rb["text"]:
            ta, tb = ra["text"].encode(), rb["text"].encode()
            offset = next(
                (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb))
            )
            differing.append({"index": ra["index"], "first_differing_byte": offset})
    return {"rows": len(a["rows"]), "identical": len(a["rows"]) - len(differing), "differing": differing}


def _compare_files(path_a: Path, path_b: Path) -> int:
    result = compare(_load(path_a), _load(path_b))
    print(f"{result['identical']}/{result['rows']} answers byte-identical")
    for row in result["differing"]:
        print(f"  question {row['index']}: first difference at byte {row['first_differing_byte']}")
    return 0 if not result["differing"] else 1
