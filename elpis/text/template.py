"""Chat prompts rendered with the model's own jinja2 template, as Hugging Face `apply_chat_template` does.

The environment matches Hugging Face's: a sandbox, `trim_blocks` and `lstrip_blocks`, loop controls, a
`tojson` that keeps non-ASCII text and does not HTML-escape, `raise_exception(message)` and `strftime_now`.
Messages are passed as plain data: keys whose value is None are dropped (APIs send `content: null`), and a
message's reasoning given as `reasoning` or `thinking` is also offered as `reasoning_content`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from elpis.text.gguf_meta import gguf_value, is_gguf, open_gguf
from elpis.text.model_files import read_json

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class _TemplateRaised(jinja2.TemplateError):
    """The template called raise_exception(message)."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _plain(value: Any) -> Any:
    """JSON-like data only: pydantic models and mappings become dicts, tuples lists; None-valued keys go."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"chat data must be JSON-like, got {type(value).__name__}")


def _message(message: Any) -> dict[str, Any]:
    data = _plain(message)
    if not isinstance(data, dict):
        raise ValueError(f"a chat message must be an object, got {type(message).__name__}")
    data = {k: v for k, v in data.items() if v is not None}
    reasoning = next((data[k] for k in _REASONING_KEYS if k in data), None)
    if reasoning is not None:
        data = {"thinking": reasoning, **data, "reasoning_content": reasoning}
    return data


class ChatTemplate:
    """A compiled chat template; `render` returns the prompt text (tokenize it with special=True)."""

    def __init__(
        self, source: str, *, special_tokens: Mapping[str, str] | None = None, origin: str = ""
    ) -> None:
        self.source = source
        self.origin = origin
        self._special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template {origin or ''} does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt for `messages` (+ `tools`); kwargs (enable_thinking, reasoning_effort) pass through.

        Raises ValueError carrying the template's own message when it rejects the input.
        """
        context = {**self._special_tokens, **_plain(kwargs)}
        try:
            return self._template.render(
                messages=[_message(m) for m in messages],
                tools=None if tools is None else _plain(list(tools)),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except _TemplateRaised as exc:
            raise ValueError(exc.message) from None
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc


def _template_from_tokenizer_config(path: Path) -> str | None:
    if not path.is_file():
        return None
    template = read_json(path).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _special_tokens(model_dir: Path) -> dict[str, str]:
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = read_json(path)
    found = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


def load_chat_template(model_path: Path | str) -> ChatTemplate:
    """The model's chat template: `chat_template.jinja`, else tokenizer_config.json's; GGUF: its metadata."""
    model_path = Path(model_path)
    if is_gguf(model_path):
        reader = open_gguf(model_path)
        source = gguf_value(reader, "tokenizer.chat_template", None)
        if not isinstance(source, str):
            raise ValueError(f"{model_path}: the GGUF file has no chat template")
        tokens = gguf_value(reader, "tokenizer.ggml.tokens")
        special = {}
        for key in ("bos", "eos"):
            index = gguf_value(reader, f"tokenizer.ggml.{key}_token_id", None)
            if index is not None and 0 <= int(index) < len(tokens):
                special[f"{key}_token"] = tokens[int(index)]
        return ChatTemplate(source, special_tokens=special, origin=str(model_path))
    if not model_path.is_dir():
        raise FileNotFoundError(f"no model directory or GGUF file at {model_path}")
    jinja_file = model_path / "chat_template.jinja"
    source = (
        jinja_file.read_text(encoding="utf-8")
        if jinja_file.is_file()
        else _template_from_tokenizer_config(model_path / "tokenizer_config.json")
    )
    if source is None:
        raise ValueError(
            f"{model_path}: no chat_template.jinja and no chat_template in tokenizer_config.json"
        )
    return ChatTemplate(source, special_tokens=_special_tokens(model_path), origin=str(jinja_file))
