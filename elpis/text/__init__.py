"""Text side of a model: tokenizer (Qwen3.5/3.8 built offline, tokenizer.json or GGUF) and chat template."""

from elpis.text.template import ChatTemplate, load_chat_template
from elpis.text.tokenizer import Tokenizer, load_tokenizer

__all__ = ["ChatTemplate", "Tokenizer", "load_chat_template", "load_tokenizer"]
