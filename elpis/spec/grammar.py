"""A request's grammar (structured output): which tokens a row may draw, from llguidance.

A `Grammar` is a checked llguidance grammar (from a JSON schema or Lark text) over the model's vocabulary,
optionally opening only after given tokens, each after the one before: with thinking on, Qwen3.8's answer
starts inside `<think>`, and the grammar then constrains what follows `</think>`, leaving the reasoning free;
a tool call's grammar opens after `</think>` and then `<tool_call>`. `Grammar.start()` gives one request's
`Constraint`, the matcher's state after the committed tokens.

Each row's draw is masked before sampling: a token the grammar does not allow at that row gets -inf, after
the penalties and logit_bias and before temperature and the filters; logprobs stay the model's own.

Speculation keeps it exact. A tree row draws after the committed tokens plus its own path (its ancestors after
the anchor, and itself), so `Constraint.masked` puts the matcher in that state (consume the path, read the
mask, roll back) for every row. The acceptor commits a row's target only when the row's path is what plain
decoding generated, and then the row's mask is plain decoding's: the same elementwise -inf on the same values,
the same bits. A row whose path the grammar rejects can never be reached (its parent's draw gave that token
probability zero), so it is left unmasked: nothing it draws is ever committed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# JSON is written as Python's json.dumps writes it (", " and ": ", no other whitespace): the model's own
# habit, and no room for the endless runs of spaces a free-whitespace grammar lets a model fall into.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Up to two spaces or newlines may come before a JSON answer (Qwen3.8 writes "\n\n" after </think>).
_LEADING_SPACE = "start: /[ \\n]{0,2}/ value\nvalue: %json "
MAX_GRAMMAR_BYTES = 256 * 1024  # a schema larger than this is refused rather than compiled


def json_options(lenient: bool) -> dict[str, Any]:
    """llguidance's options for a schema (its `x-guidance`): json.dumps's spacing, and with `lenient` the
    keywords it does not implement (uniqueItems, contains, ...) ignored instead of refused."""
    return {**_JSON_STYLE, "lenient": lenient}


class GrammarTokenizer:
    """The model's vocabulary as llguidance reads it. Building it walks every token (about 3 s for Qwen3.8's
    248,320 ids), so it is made once per loaded model and shared by its requests."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]) -> None:
        import llguidance

        if not eos_ids:
            raise ValueError("a grammar needs the model's end-of-sequence token ids")
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.llg = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(self.eos_ids))


class SharedGrammarTokenizer:
    """A `GrammarTokenizer` built at the first request that asks for one (thread-safe), so a server whose
    clients never ask for structured output does not pay for it. `tokenizer_json` gives the Hugging Face
    tokenizer's JSON text when called."""

    def __init__(self, tokenizer_json: Callable[[], str], vocab_size: int, eos_ids: Sequence[int]) -> None:
        self._source, self._shape = tokenizer_json, (vocab_size, tuple(eos_ids))
        self._lock = threading.Lock()
        self._built: GrammarTokenizer | None = None

    def get(self) -> GrammarTokenizer:
        with self._lock:
            if self._built is None:
                self._built = GrammarTokenizer(self._source(), *self._shape)
            return self._built


@dataclass(frozen=True)
class Grammar:
    """A checked grammar over one model's vocabulary. `opens_after`: the tokens after which it applies, met in
    this order (empty: from the first generated token). Build with `json_schema`, `lark`, `regex` or `choice`,
    which refuse a bad grammar."""

    tokenizer: GrammarTokenizer = field(compare=False, repr=False)
    source: str
    opens_after: tuple[int, ...] = ()

    @classmethod
    def json_schema(cls, tokenizer: GrammarTokenizer, schema: dict[str, Any],
                    opens_after: Sequence[int] = (), *, lenient: bool = False) -> Grammar:
        """A JSON value valid under `schema`, in json.dumps's spacing; ValueError naming the fault (with
        `lenient`, keywords llguidance does not implement are ignored instead)."""
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        styled = {**schema, "x-guidance": json_options(lenient)}  # ours replaces any options it carried
        text = json.dumps(styled, ensure_ascii=False, allow_nan=False)
        return cls.lark(tokenizer, _LEADING_SPACE + text, opens_after)

    @classmethod
    def lark(cls, tokenizer: GrammarTokenizer, lark: str, opens_after: Sequence[int] = ()) -> Grammar:
        """Text of a Lark grammar in llguidance's dialect; ValueError naming the fault."""
        import llguidance

        return cls._checked(tokenizer, lark, llguidance.LLMatcher.grammar_from_lark, opens_after)

    @classmethod
    def regex(cls, tokenizer: GrammarTokenizer, regex: str, opens_after: Sequence[int] = ()) -> Grammar:
        """Text matching `regex` (Rust `regex` syntax, the whole text), then the end of the sequence."""
        import llguidance

        return cls._checked(tokenizer, regex, llguidance.LLMatcher.grammar_from_regex, opens_after)

    @classmethod
    def choice(cls, tokenizer: GrammarTokenizer, choices: Sequence[str],
               opens_after: Sequence[int] = ()) -> Grammar:
        """Exactly one of `choices`, then the end of the sequence."""
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choices must be non-empty strings, at least one")
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
        return cls.lark(tokenizer, f"start: {alternatives}\n", opens_after)

    @classmethod
    def _checked(cls, tokenizer: GrammarTokenizer, text: str, compile_text: Callable[[str], str],
                 opens_after: Sequence[int]) -> Grammar:
        size = len(text.encode())
        if size > MAX_GRAMMAR_BYTES:
            raise ValueError(f"the grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES} are taken")
        openers = tuple(opens_after)
        if any(not 0 <= token < tokenizer.vocab_size for token in openers):
            raise ValueError(f"opening tokens {openers} are not all in the vocabulary")
        grammar = cls(tokenizer, compile_text(text), openers)
        grammar._matcher()  # compiled once here so that a bad grammar is refused before anything runs
        return grammar

    def _matcher(self) -> Any:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer.llg, self.source, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {matcher.get_error()}")
        return matcher

    def start(self) -> Constraint:
        """One request's constraint, before any token is generated."""
        return Constraint(self)


class Constraint:
    """One request's grammar state after its committed tokens; `masked` gives every tree row its own."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.vocab_size = grammar.tokenizer.vocab_size
        self._words = (self.vocab_size + 31) // 32
        self._matcher = grammar._matcher()
        self._openers = grammar.opens_after
        self._met = 0  # opening tokens committed so far

    @property
    def open(self) -> bool:
        """Whether the grammar applies yet (its opening tokens have been committed, or it has none)."""
        return self._met == len(self._openers)

    @property
    def awaited(self) -> int | None:
        """The opening token the grammar waits for next (None once open). Until it is committed every row is
        unconstrained, so a round may run without masks if it ends there (`elpis.spec.generate`)."""
        return None if self.open else self._openers[self._met]

    def commit(self, tokens: Sequence[int]) -> None:
        """Tokens committed after those before. A committed token the grammar refuses is a broken invariant
        (every draw was masked), so it raises rather than let the output leave the grammar."""
        consumed, self._met = self._constrained(tokens, self._met)
        matcher = self._matcher
        for token in consumed:
            # A complete grammar stops before the end-of-sequence token it allows; that token needs no step.
            if matcher.is_stopped() and token in self.grammar.tokenizer.eos_ids:
                continue
            if not matcher.consume_token(token):
                raise RuntimeError(f"the grammar refused committed token {token}: {matcher.get_error()}")

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to `limit` tokens that spell what the grammar forces next (a JSON key, a tool call's markup), in
        the vocabulary's own tokenization; empty while the grammar is closed. A draft, never a decision: the
        model may spell the same bytes with other tokens, and the rows decide as always."""
        if limit < 1 or not self.open or self._matcher.is_stopped():
            return []
        return list(self._matcher.compute_ff_tokens())[:limit]

    def masked(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """`logits` [rows, vocab] with -inf wherever row r's grammar state (after the committed tokens and
        `paths[r]`) forbids the token; the other values are untouched, so each row depends on itself only."""
        if logits.dim() != 2 or logits.shape[0] != len(paths):
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(paths)} rows")
        return self.apply(logits, self.row_masks(paths))

    def row_masks(self, paths: Sequence[Sequence[int]]) -> np.ndarray | None:
        """int32 [rows, ceil(vocab / 32)]: row r's allowed tokens as packed bits (all set where the row is
        unconstrained or unreachable), or None when no row is constrained. Host work only, so a round computes
        it while the device verifies."""
        words = np.full((len(paths), self._words), -1, dtype=np.int32)
        any_masked = False
        for r, path in enumerate(paths):
            row = self._bitmask_after(path)
            if row is not None:
                words[r] = row
                any_masked = True
        return words if any_masked else None

    def apply(self, logits: torch.Tensor, masks: np.ndarray | None) -> torch.Tensor:
        """`logits` with -inf where `masks` (`row_masks`) clears a token's bit. The packed bits (1/32 of a
        bool row) travel to the logits' device and are unpacked there by exact integer shifts."""
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {tuple(logits.shape)} is not rows of {self.vocab_size} logits")
        if masks is None:
            return logits
        rows = logits.shape[0]
        if masks.shape != (rows, self._words):
            raise ValueError(f"masks of shape {masks.shape} for {rows} rows of {self._words} words")
        packed = torch.from_numpy(masks).to(logits.device)
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        keep = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, : self.vocab_size].bool()
        return logits.masked_fill(~keep, float("-inf"))

    def allowed_ids(self, path: Sequence[int] = ()) -> list[int] | None:
        """The ids allowed after the committed tokens and `path` (None: unconstrained there). For tests."""
        row = self._bitmask_after(path)
        if row is None:
            return None
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self.vocab_size]
        return np.flatnonzero(bits).tolist()

    def _constrained(self, tokens: Sequence[int], met: int) -> tuple[Sequence[int], int]:
        """The part of `tokens` the grammar reads, with `met` opening tokens met before them, and the count
        met after them. The part is empty while the grammar stays closed."""
        for i, token in enumerate(tokens):
            if met == len(self._openers):
                return tokens[i:], met
            met += token == self._openers[met]
        return (), met

    def _bitmask_after(self, path: Sequence[int]) -> np.ndarray | None:
        """int32 [ceil(vocab / 32)], bit t % 32 of word t // 32 set where token t is allowed after the
        committed tokens and `path`; None where the row is unconstrained (the grammar not open yet) or
        unreachable (the grammar refuses its path)."""
        tokens, met = self._constrained(path, self._met)
        if met < len(self._openers):
            return None
        matcher = self._matcher
        tokens = list(tokens)
        # try_consume_tokens, not validate_tokens: the latter stops short inside a lexeme ended by a stop
        # string (a tool call's parameter value), and would leave reachable rows unmasked.
        taken = matcher.try_consume_tokens(tokens) if tokens else 0
        if taken != len(tokens):
            if taken and not matcher.rollback(taken):
                raise RuntimeError(f"the grammar could not roll back a refused path: {matcher.get_error()}")
            return None
        try:
            words = np.frombuffer(matcher.compute_bitmask(), dtype="<i4")
            if matcher.is_error():
                raise RuntimeError(f"the grammar failed: {matcher.get_error()}")
        finally:
            if tokens and not matcher.rollback(len(tokens)):
                raise RuntimeError(f"the grammar could not roll back a row's path: {matcher.get_error()}")
        if words.size < self._words:  # llguidance may pad the mask past the vocabulary; never short of it
            raise RuntimeError(f"the grammar's mask has {words.size} words, fewer than {self._words}")
        words = words[: self._words]
        if not words.any():
            raise RuntimeError("the grammar allows no token here")
        return words
