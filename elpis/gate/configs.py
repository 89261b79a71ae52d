"""Configurations: named ways of turning a token sequence into next-token logits.

A configuration is written as a spec string `kind:key=value,key=value` (e.g. `reference:dtype=fp64`,
`reference:dtype=fp32,rows=8`, `exl3:patches=3032`). The kind picks a provider module
(`elpis.gate.providers`) whose `configuration(model, options)` returns a `LogitsModel`. The model's
`.spec` is the full canonical spec (options sorted, every applicable default written out): the
configuration's identity, which the measurement ledger records and rule files name, so it must capture
every switch that changes numerics.

`BackendLogits` adapts any `elpis.backend.Backend` (the served path: `begin` / `verify` / `commit`):
teacher forcing prefills the first `start` tokens (`begin`) and runs the rest through verify calls of `rows`
chained rows each, and greedy decoding is plain decoding (`verify([anchor], [-1])`, `commit([0])`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from elpis.backend import Backend
from elpis.gate.providers import load_provider


@runtime_checkable
class LogitsModel(Protocol):
    spec: str
    vocab_size: int  # width of the rows compared (a provider trims padding to the tokenizer's vocabulary)

    def teacher_forced(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        """`[len(tokens) - 1 - start, vocab_size]` logits; row i is the distribution of tokens[start + i + 1].
        A configuration with a prefill path runs tokens[:start] through it first (so the rows measure what
        follows a prefill of that length); the others compute every row and drop the first `start`."""
        ...

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        """`steps` greedy tokens after `prompt` (argmax, lowest id on ties; no stop tokens)."""
        ...


def check_start(tokens: int, start: int) -> None:
    """Teacher forcing from position `start` needs a token to predict after it."""
    if start < 0 or tokens < start + 2:
        raise ValueError(
            f"teacher forcing from position {start} needs at least {start + 2} tokens, got {tokens}"
        )


@dataclass(frozen=True)
class Spec:
    kind: str
    options: Mapping[str, str]

    @property
    def text(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.kind}:{opts}" if opts else self.kind


def parse_spec(text: str) -> Spec:
    kind, _, rest = text.strip().partition(":")
    if not kind or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"configuration {text!r} must look like kind:key=value,key=value")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise ValueError(f"configuration {text!r}: option {item!r} is not key=value")
        if key in options:
            raise ValueError(f"configuration {text!r}: option {key!r} given twice")
        options[key] = value
    return Spec(kind, options)


def canonical(text: str) -> str:
    return parse_spec(text).text


def make_configuration(text: str, model: Path) -> LogitsModel:
    """Build a configuration. Its `.spec` is the provider's full canonical spec: the options asked for
    plus every default that applies, so two ways of asking for the same thing share one identity.

    The option `model=PATH` (any kind) gives this configuration its own model instead of `model`, e.g.
    an EXL3 conversion compared with the original; it stays part of the spec.
    """
    spec = parse_spec(text)
    options = dict(spec.options)
    own_model = options.pop("model", None)
    made = load_provider(spec.kind).configuration(Path(own_model) if own_model else model, options)
    full = parse_spec(made.spec)
    if (
        made.spec != full.text
        or full.kind != spec.kind
        or any(full.options.get(k) != v for k, v in options.items())
    ):
        raise ValueError(f"provider {spec.kind} built {made.spec!r} for {spec.text!r}")
    if own_model:
        made.spec = Spec(full.kind, {**full.options, "model": own_model}).text
    return made


class BackendLogits:
    """A `LogitsModel` over the served path of any `Backend`."""

    def __init__(self, spec: str, backend: Backend, rows: int, vocab_size: int) -> None:
        if rows < 1:
            raise ValueError(f"rows must be at least 1, got {rows}")
        if vocab_size > backend.info.vocab_size:
            raise ValueError(f"vocabulary {vocab_size} is wider than the backend's logits")
        self.spec, self.backend, self.rows, self.vocab_size = spec, backend, rows, vocab_size

    def teacher_forced(self, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        tokens = list(tokens)
        check_start(len(tokens), start)
        self.backend.begin(tokens[: start + 1])  # prefills tokens[:start]; tokens[start] is the anchor
        out = []
        try:
            for first in range(start, len(tokens) - 1, self.rows):
                chunk = tokens[first : min(first + self.rows, len(tokens) - 1)]
                logits = self.backend.verify(chunk, [-1, *range(len(chunk) - 1)])
                out.append(logits[:, : self.vocab_size].to("cpu"))
                self.backend.commit(list(range(len(chunk))))
        finally:
            self.backend.finish()
        return torch.cat(out)

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        self.backend.begin(list(prompt))
        anchor, produced = prompt[-1], []
        try:
            for _ in range(steps):
                logits = self.backend.verify([anchor], [-1])
                anchor = int(torch.argmax(logits[0, : self.vocab_size]))
                produced.append(anchor)
                self.backend.commit([0])
        finally:
            self.backend.finish()
        return produced
