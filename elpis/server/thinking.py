"""A chat request's thinking budget (`thinking_token_budget`, as vLLM names it): the generator's
`ThinkingBudget` (`elpis.spec.thinking`) with this model's closing tokens, for a prompt that opens the
reasoning block; a prompt that does not (thinking off) has nothing to budget, and the field is then moot."""

from __future__ import annotations

from elpis.server.channels import THINK_CLOSE
from elpis.server.errors import bad_request
from elpis.server.service import ModelService
from elpis.spec.thinking import ThinkingBudget

# What closes the reasoning at the budget: the form Qwen3.8's template renders a finished reasoning block in
# ("<think>\n" + reasoning + "\n</think>\n\n"); the model writes the blank line after it itself.
CLOSING_TEXT = "\n" + THINK_CLOSE


def thinking_budget(service: ModelService, limit: int | None, reasoning: bool,
                    field: str = "thinking_token_budget") -> ThinkingBudget | None:
    """The budget of `limit` reasoning tokens, or None without one or without reasoning. A vocabulary in
    which the end of the block is not one token (so the generator could not see the model close it) is a
    400 naming `field`."""
    if limit is None or not reasoning:
        return None
    end = service.single_token(THINK_CLOSE)
    close = tuple(service.tokenizer.encode(CLOSING_TEXT, special=True))
    if end is None or not close or close[-1] != end:
        raise bad_request(f"a thinking budget needs {THINK_CLOSE} as one token, which this vocabulary does "
                          "not have", field)
    return ThinkingBudget(limit, close)
