"""What the HTTP layer needs from a loaded model: tokenizer, chat template, generator, limits, name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from elpis.server.prompting import ChatTemplateLike
from elpis.spec import SpeculativeGenerator


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

    def __post_init__(self) -> None:
        backend_limit = self.generator.backend.info.max_context
        if not 1 < self.max_context <= backend_limit:
            raise ValueError(
                f"max context must be in 2..{backend_limit} (the backend's), got {self.max_context}"
            )

    @property
    def vocab_size(self) -> int:
        return int(self.generator.backend.info.vocab_size)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special=False)

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
