"""What the HTTP layer needs from a loaded model: tokenizer, chat template, generator, limits, name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from elpis.server.prompting import ChatTemplateLike
from elpis.spec import SpeculativeGenerator
from elpis.spec.grammar import SharedGrammarTokenizer
from elpis.text import Tokenizer


class TokenizerLike(Protocol):
    vocab_size: int

    def encode(self, text: str, *, special: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str: ...


@dataclass
class ModelService:
    model_id: str
    tokenizer: TokenizerLike
    template: ChatTemplateLike | None  # None: the model has no chat template (chat endpoints answer 400)
    generator: SpeculativeGenerator
    max_context: int  # prompt + max_tokens must fit in this many tokens
    # Structured output's view of the vocabulary (built at its first use); None: the tokenizer is not a
    # Hugging Face one, and response_format json_object / json_schema answer 400.
    grammar_vocabulary: SharedGrammarTokenizer | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        info = self.generator.backend.info
        if not 1 < self.max_context <= info.max_context:
            raise ValueError(
                f"max context must be in 2..{info.max_context} (the backend's), got {self.max_context}"
            )
        tokenizer = self.tokenizer
        if isinstance(tokenizer, Tokenizer) and info.stop_token_ids:
            self.grammar_vocabulary = SharedGrammarTokenizer(
                tokenizer.backend.to_str, info.vocab_size, info.stop_token_ids
            )

    @property
    def vocab_size(self) -> int:
        return int(self.generator.backend.info.vocab_size)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special=False)

    def single_token(self, text: str) -> int | None:
        """The one token `text` encodes to (special tokens included), or None where it takes several."""
        ids = self.tokenizer.encode(text, special=True)
        return ids[0] if len(ids) == 1 else None

    def describe(self) -> dict[str, Any]:
        info = self.generator.backend.info
        return {
            "model": self.model_id,
            "backend": info.name,
            "device": info.device,
            "max_context": self.max_context,
            "drafter": type(self.generator.drafter).__name__ if self.generator.drafter else "none",
            "tree_budget": self.generator.tree_budget,
        }
